"""Tests of the ``captum-attnflow`` command, run in-process through ``main`` (one subprocess call
checks the installed entry point): help, explain's prediction, table and heatmap, reproduce's files,
clear errors."""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest
import torch
from matplotlib.figure import Figure

from transformers import BertConfig, BertForSequenceClassification, BertModel, BertTokenizerFast

from captum_attnflow import AttentionFlow, AttentionRollout
from captum_attnflow.cli import main
from captum_attnflow.data import build_tokenizer
from captum_attnflow.models import AgreementConfig, AgreementModel

SENTENCE = "the keys to the cabinet"
TOKENS = ["[CLS]", "the", "keys", "to", "the", "cabinet"]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    """An untrained agreement model saved like a trained one, for ``--model DIR``."""
    torch.manual_seed(0)
    directory = tmp_path_factory.mktemp("model")
    AgreementModel(AgreementConfig()).eval().save_pretrained(directory)
    build_tokenizer().save_pretrained(directory)
    return directory


def _table(output: str) -> dict[str, list[float]]:
    """The per-token score table printed by explain: token -> its row of numbers, in order."""
    lines = output.splitlines()
    start = next(index for index, line in enumerate(lines) if line.startswith("token "))
    rows = {}
    for line in lines[start + 2 :]:
        cells = line.split()
        if len(cells) < 2 or not re.fullmatch(r"-?\d+\.\d+", cells[-1]):
            break
        rows.setdefault(cells[0], []).append([float(cell) for cell in cells[1:]])
    return rows


@pytest.mark.parametrize("command", [[], ["explain"], ["reproduce"], ["figures"]])
def test_every_command_has_help(command, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main([*command, "--help"])
    assert exit_info.value.code == 0
    text = capsys.readouterr().out
    assert text.startswith("usage: captum-attnflow")
    expected = {(): ["explain", "reproduce", "figures"], ("explain",): ["--method", "--layer", "--out"],
                ("reproduce",): ["--samples", "--out", "--seed", "--protocol", "--data", "--ranking"],
                ("figures",): ["--out", "--model"]}[tuple(command)]
    assert all(option in text for option in expected)


def test_installed_entry_point_prints_help():
    executable = shutil.which("captum-attnflow")
    assert executable is not None, "the console script is missing: pip install -e ."
    completed = subprocess.run([executable, "--help"], capture_output=True, text=True, timeout=120)
    assert completed.returncode == 0, completed.stderr
    assert "explain" in completed.stdout and "reproduce" in completed.stdout


def test_explain_prints_the_models_prediction_and_rollout_per_layer(model_dir, tmp_path, capsys):
    out = tmp_path / "heatmap.png"
    status = main(["explain", SENTENCE, "--method", "rollout", "--layer", "all", "--out", str(out), "--model",
                   str(model_dir)])
    assert status == 0
    printed = capsys.readouterr().out

    model = AgreementModel.from_pretrained(model_dir).eval()
    ids = build_tokenizer()(SENTENCE, return_tensors="pt")["input_ids"]
    with torch.no_grad():
        probabilities = torch.softmax(model(ids).logits[0], -1)
    label = ["singular", "plural"][int(probabilities.argmax())]
    assert f"prediction: {label} (probability {probabilities.max():.3f})" in printed

    expected = AttentionRollout(model).attribute(ids, layer=None)[:, 0]  # (L, n)
    assert "rollout L1" in printed and "rollout L6" in printed
    rows = _table(printed)
    assert list(rows) == list(dict.fromkeys(TOKENS))
    measured = torch.tensor([rows[token].pop(0) for token in TOKENS])  # (n, L)
    torch.testing.assert_close(measured, expected.T, atol=1e-4, rtol=0)

    assert out.read_bytes().startswith(b"\x89PNG")
    assert f"heatmap written to {out}" in printed


def test_explain_all_methods_at_one_layer(model_dir, tmp_path, monkeypatch, capsys):
    out = tmp_path / "nested" / "all.png"
    drawn, savefig = [], Figure.savefig
    monkeypatch.setattr(Figure, "savefig", lambda figure, *args, **kwargs: drawn.append(figure) or savefig(figure, *args, **kwargs))
    assert main(["explain", SENTENCE, "--layer", "3", "--out", str(out), "--model", str(model_dir)]) == 0
    printed = capsys.readouterr().out
    header = next(line for line in printed.splitlines() if line.startswith("token "))
    assert header.split()[1:] == ["raw", "L3", "rollout", "L3", "flow", "L3", "gradient_rollout", "L3",
                                  "value_zeroing", "L3", "alti", "L3", "norm", "L3", "saliency", "blankout", "attnlrp"]
    assert all(len(values) == 10 for occurrences in _table(printed).values() for values in occurrences)
    assert out.read_bytes().startswith(b"\x89PNG")
    # AttnLRP and blank-out can score a token below 0: a diverging scale whose white is 0; the
    # others keep the sequential one from their smallest value.
    scales = {ax.get_title(): ax.images[0] for ax in drawn[0].axes if ax.images}
    assert len(scales) == 10
    for name, image in scales.items():
        (low, high), values = image.get_clim(), image.get_array()
        if name in ("attnlrp", "blankout"):
            assert image.get_cmap().name == "RdBu_r" and low == -high == -abs(values).max(), name
        else:
            assert image.get_cmap().name == "Reds" and (low, high) == (values.min(), values.max()), name


@pytest.mark.parametrize("method", ["rollout", "flow"])
def test_explain_per_head(method, model_dir, tmp_path, capsys):
    model = AgreementModel.from_pretrained(model_dir).eval()
    ids = build_tokenizer()(SENTENCE, return_tensors="pt")["input_ids"]
    explainer = {"rollout": AttentionRollout, "flow": AttentionFlow}[method](model)
    out = tmp_path / "head.png"
    assert main(["explain", SENTENCE, "--method", method, "--head", "2", "--out", str(out), "--model", str(model_dir)]) == 0
    printed = capsys.readouterr().out
    assert f"{method} L1 h2" in printed and f"{method} L6 h2" in printed
    rows = _table(printed)
    measured = torch.tensor([rows[token].pop(0) for token in TOKENS])  # (n, L)
    torch.testing.assert_close(measured, explainer.attribute(ids, layer=None, head=2)[:, 0].T, atol=1e-4, rtol=0)
    assert main(["explain", SENTENCE, "--method", method, "--layer", "4", "--head", "all", "--out", str(out),
                 "--model", str(model_dir)]) == 0
    assert out.read_bytes().startswith(b"\x89PNG")  # a heads x tokens heatmap of layer 4
    assert main(["explain", SENTENCE, "--head", "all", "--out", str(out), "--model", str(model_dir)]) == 1
    assert "--head all shows the heads of one layer: give it with --layer N" in capsys.readouterr().err
    assert main(["explain", SENTENCE, "--head", "8", "--out", str(out), "--model", str(model_dir)]) == 1
    assert "heads 0..7" in capsys.readouterr().err


def test_explain_warns_about_unknown_words(model_dir, tmp_path, capsys):
    status = main(["explain", "the keys to the xylophone", "--method", "raw", "--out", str(tmp_path / "x.png"),
                   "--model", str(model_dir)])
    assert status == 0
    captured = capsys.readouterr()
    assert "warning" in captured.err and "xylophone" in captured.err and "[UNK]" in captured.err
    assert "[UNK]" in _table(captured.out)


def test_explain_default_model_and_path(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(["explain", SENTENCE, "--method", "rollout"]) == 0
    printed = capsys.readouterr().out
    # The bundled model is trained (held-out accuracy >= 0.95): "keys" is the subject.
    assert "prediction: plural" in printed
    assert (tmp_path / "captum_attnflow_explain.png").read_bytes().startswith(b"\x89PNG")


@pytest.mark.parametrize(
    "arguments, message",
    [
        (["explain", SENTENCE, "--layer", "7"], "--layer 7 is out of range: the model has layers 1..6"),
        (["explain", "   "], "the sentence has no words"),
        (["explain", SENTENCE, "--model", "/nonexistent/model"], "no directory /nonexistent/model, and no model"),
    ],
)
def test_explain_errors_are_clear(arguments, message, model_dir, tmp_path, capsys):
    if "--model" not in arguments:
        arguments = [*arguments, "--model", str(model_dir)]
    assert main([*arguments, "--out", str(tmp_path / "x.png")]) == 1
    error = capsys.readouterr().err
    assert error.startswith("captum-attnflow explain: error:") and message in error
    assert not (tmp_path / "x.png").exists()


@pytest.mark.parametrize(
    "arguments, message",
    [
        (["explain", SENTENCE, "--layer", "0"], "layers are numbered from 1"),
        (["explain", SENTENCE, "--layer", "last"], "expected a layer number 1..L or 'all'"),
        (["explain", SENTENCE, "--method", "lime"], "invalid choice: 'lime'"),
        (["reproduce", "--samples", "0"], "expected a positive integer"),
        (["reproduce", "--samples", "many"], "expected a positive integer"),
    ],
)
def test_bad_arguments_exit_with_usage(arguments, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(arguments)
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


def test_reproduce_writes_both_tables(model_dir, tmp_path, capsys):
    out = tmp_path / "repro"
    assert main(["reproduce", "--samples", "6", "--seed", "1", "--batch-size", "4", "--out", str(out),
                 "--model", str(model_dir), "--no-progress"]) == 0
    printed = capsys.readouterr().out
    assert "Table 1, our protocol" in printed and "Spearman correlation with blank-out" in printed
    assert "Table 2, our protocol" in printed and "Spearman correlation with input gradients" in printed
    assert "| flow (ours) |" in printed and "| flow (paper) |" in printed
    assert "(6 examples)" in printed
    for name in ("reproduction.md", "table1_blank_out.csv", "table2_input_gradients.csv", "ground_truth.csv",
                 "reproduction.png"):
        assert (out / name).stat().st_size > 0, name
        assert str(out / name) in printed

@pytest.fixture(scope="module")
def bert_dirs(tmp_path_factory):
    """A BERT sequence classifier and a BERT without a classification head, each saved with its
    tokenizer: checkpoints that are not the agreement model."""
    torch.manual_seed(0)
    root = tmp_path_factory.mktemp("bert")
    words = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "keys", "to", "cabinet"]
    tokenizer = BertTokenizerFast(vocab={word: index for index, word in enumerate(words)})
    config = BertConfig(vocab_size=9, hidden_size=16, num_hidden_layers=2, num_attention_heads=2, intermediate_size=32,
                        num_labels=3, id2label={0: "negative", 1: "neutral", 2: "positive"})
    directories = {}
    for name, cls in (("classifier", BertForSequenceClassification), ("bare", BertModel)):
        directories[name] = root / name
        cls(config).eval().save_pretrained(directories[name])
        tokenizer.save_pretrained(directories[name])
    return directories


def test_explain_runs_any_saved_sequence_classifier_with_its_tokenizer(bert_dirs, tmp_path, capsys):
    out = tmp_path / "bert.png"
    assert main(["explain", SENTENCE, "--method", "flow", "--layer", "2", "--out", str(out),
                 "--model", str(bert_dirs["classifier"])]) == 0
    printed = capsys.readouterr().out
    model = BertForSequenceClassification.from_pretrained(bert_dirs["classifier"]).eval()
    ids = BertTokenizerFast.from_pretrained(bert_dirs["classifier"])(SENTENCE, return_tensors="pt")["input_ids"]
    with torch.no_grad():
        probabilities = torch.softmax(model(ids).logits[0], -1)
    label = model.config.id2label[int(probabilities.argmax())]
    assert f"prediction: {label} (probability {probabilities.max():.3f})" in printed
    rows = _table(printed)
    assert list(rows) == ["[CLS]", "the", "keys", "to", "cabinet", "[SEP]"]
    expected = AttentionFlow(model).attribute(ids, layer=2)[0]
    measured = torch.tensor([rows[token].pop(0)[0] for token in ["[CLS]", "the", "keys", "to", "the", "cabinet", "[SEP]"]])
    torch.testing.assert_close(measured, expected, atol=1e-4, rtol=0)
    assert out.read_bytes().startswith(b"\x89PNG")


@pytest.mark.parametrize("command", ["explain", "figures", "reproduce"])
def test_a_checkpoint_that_cannot_be_explained_is_refused(command, bert_dirs, tmp_path, capsys):
    model = bert_dirs["classifier" if command == "reproduce" else "bare"]
    arguments = [command] + ([SENTENCE] if command != "reproduce" else ["--samples", "2", "--no-progress"])
    out = tmp_path / ("out.png" if command == "explain" else "out")
    assert main([*arguments, "--model", str(model), "--out", str(out)]) == 1
    error = capsys.readouterr().err
    expected = "reproduce needs the verb-number agreement model" if command == "reproduce" else "without a sequence-classification head"
    assert f"captum-attnflow {command}: error:" in error and expected in error


def test_explain_out_directory_receives_the_heatmap(model_dir, tmp_path, capsys):
    assert main(["explain", SENTENCE, "--method", "raw", "--out", str(tmp_path), "--model", str(model_dir)]) == 0
    written = tmp_path / "captum_attnflow_explain.png"
    assert written.read_bytes().startswith(b"\x89PNG")
    assert f"heatmap written to {written}" in capsys.readouterr().out


@pytest.mark.parametrize(
    "command, out, message",
    [
        ("explain", "blocker/heatmap.png", "cannot create the directory"),
        ("explain", "heatmap", "neither an existing directory nor an image file name"),
        ("reproduce", "blocker", "is a file; reproduce writes several files"),
        ("figures", "blocker", "is a file; figures writes two images"),
    ],
)
def test_output_paths_are_checked_before_the_computation(command, out, message, tmp_path, monkeypatch, capsys):
    (tmp_path / "blocker").write_text("a file where a directory is expected")

    def no_model(*args, **kwargs):
        raise AssertionError("the model was loaded before the output path was checked")

    monkeypatch.setattr("captum_attnflow.cli._common.load", no_model)
    arguments = [command] + ([SENTENCE] if command != "reproduce" else ["--samples", "2"])
    assert main([*arguments, "--out", str(tmp_path / out)]) == 1
    assert message in capsys.readouterr().err


def test_figures_draw_every_position_at_every_layer_and_the_cls_token(model_dir, tmp_path, capsys):
    assert main(["figures", SENTENCE, "--out", str(tmp_path / "figs"), "--model", str(model_dir)]) == 0
    printed = capsys.readouterr().out
    for name in ("figure1.png", "figures2_3.png"):
        assert (tmp_path / "figs" / name).read_bytes().startswith(b"\x89PNG")
        assert str(tmp_path / "figs" / name) in printed


def test_reproduce_paper_protocol_prints_both_protocols(model_dir, tmp_path, capsys):
    assert main(["reproduce", "--samples", "3", "--protocol", "paper", "--data", "short", "--out", str(tmp_path),
                 "--model", str(model_dir), "--no-progress"]) == 0
    printed = capsys.readouterr().out
    assert printed.index("the authors' protocol") < printed.index("our protocol")
    assert "Spearman correlation with gradient sum, float64" in printed
    assert (tmp_path / "table1_abs_blank_out.csv").stat().st_size > 0


def test_figures_and_explain_take_the_newer_methods_by_name(model_dir, tmp_path, capsys):
    assert main(["figures", SENTENCE, "--out", str(tmp_path / "figs"), "--model", str(model_dir),
                 "--methods", "alti", "gradient_rollout"]) == 0
    assert (tmp_path / "figs" / "figure1.png").read_bytes().startswith(b"\x89PNG")
    assert main(["explain", SENTENCE, "--method", "value_zeroing", "--out", str(tmp_path / "x.png"),
                 "--model", str(model_dir)]) == 0
    assert "value_zeroing L" in capsys.readouterr().out
    assert main(["explain", SENTENCE, "--method", "alti", "--head", "1", "--out", str(tmp_path / "y.png"),
                 "--model", str(model_dir)]) == 1
    assert "--head is for the methods computed from attention weights" in capsys.readouterr().err


@pytest.mark.slow
def test_benchmark_writes_the_leaderboard(tmp_path, capsys):
    assert main(["benchmark", "--tasks", "agreement", "lm", "--methods", "rollout", "random", "--examples", "4",
                 "--out", str(tmp_path), "--no-progress"]) == 0
    printed = capsys.readouterr().out
    assert "agreement: comprehensiveness" in printed and "lm: subject-first" in printed
    assert "| random |" in printed and "s / example" in printed
    for name in ("leaderboard.md", "leaderboard.csv", "leaderboard.png"):
        assert (tmp_path / name).stat().st_size > 0
    with pytest.raises(SystemExit):
        main(["benchmark", "--methods", "lime"])
