"""``--model NAME_OR_DIR``, ``--device``, ``--dtype``: a directory or a Hub name found in the local
Hugging Face cache (offline), the model placed as asked, and one clear error otherwise."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import huggingface_hub
import pytest
import torch

from captum_attnflow.cli import main
from captum_attnflow.data import build_tokenizer
from captum_attnflow.models import AgreementConfig, AgreementModel

SENTENCE = "the keys to the cabinet"
COMMIT = "0123456789abcdef0123456789abcdef01234567"


def hub_cache(cache: Path, repo_id: str, saved: Path) -> Path:
    """Lay the files of ``saved`` out in ``cache`` as huggingface_hub's downloads do: content in
    ``blobs/<sha256>``, ``snapshots/<commit>/<name>`` links to it, ``refs/main`` naming the
    commit. Returns the snapshot folder."""
    repo = cache / f"models--{repo_id.replace('/', '--')}"
    snapshot = repo / "snapshots" / COMMIT
    (repo / "blobs").mkdir(parents=True)
    snapshot.mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(COMMIT)
    for file in saved.iterdir():
        digest = hashlib.sha256(file.read_bytes()).hexdigest()
        (repo / "blobs" / digest).write_bytes(file.read_bytes())
        (snapshot / file.name).symlink_to(Path("..", "..", "blobs", digest))
    return snapshot


@pytest.fixture(scope="module")
def saved_model(tmp_path_factory):
    torch.manual_seed(0)
    directory = tmp_path_factory.mktemp("saved")
    AgreementModel(AgreementConfig(num_hidden_layers=2)).eval().save_pretrained(directory)
    build_tokenizer().save_pretrained(directory)
    return directory


def _table(printed: str) -> list[str]:
    return [line for line in printed.splitlines() if not line.startswith("heatmap written")]


def test_a_hub_name_in_the_local_cache_explains_as_its_directory(saved_model, tmp_path, monkeypatch, capsys):
    snapshot = hub_cache(tmp_path / "hub", "someone/tiny-agreement", saved_model)
    # huggingface_hub reads HF_HUB_CACHE when it is imported; a new process sees the variable alone.
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    common = ["explain", SENTENCE, "--method", "rollout", "--out", str(tmp_path / "x.png"), "--device", "cpu"]
    assert main([*common, "--model", str(saved_model)]) == 0
    from_directory = _table(capsys.readouterr().out)
    assert main([*common, "--model", "someone/tiny-agreement"]) == 0
    assert _table(capsys.readouterr().out) == from_directory
    assert main([*common, "--model", str(snapshot)]) == 0  # the snapshot folder is a directory like any other
    assert _table(capsys.readouterr().out) == from_directory
    assert main([*common, "--model", "someone/elsewhere"]) == 1
    error = capsys.readouterr().err
    assert f"no directory {Path('someone/elsewhere').absolute()}," in error
    assert f"no model 'someone/elsewhere' with a config.json in the local Hugging Face cache ({tmp_path / 'hub'}" in error


@pytest.mark.parametrize("variable", ["HF_HUB_CACHE", "HF_HOME"])
def test_the_cache_is_found_where_the_environment_puts_it_offline(saved_model, tmp_path, variable):
    """In a fresh process (as the command runs), the cache named by HF_HUB_CACHE, or HF_HOME/hub,
    with HF_HUB_OFFLINE=1: found without the network; nothing there names both places."""
    cache = tmp_path / "hub" if variable == "HF_HUB_CACHE" else tmp_path / "home" / "hub"
    snapshot = hub_cache(cache, "someone/tiny-agreement", saved_model)
    env = {key: value for key, value in os.environ.items() if not key.startswith(("HF_", "HUGGINGFACE_"))}
    env.update({variable: str(tmp_path / ("hub" if variable == "HF_HUB_CACHE" else "home")), "HF_HUB_OFFLINE": "1"})
    script = (
        "import sys; from captum_attnflow.cli._common import model_directory\n"
        "print(model_directory(sys.argv[1]))\n"
    )
    found = subprocess.run([sys.executable, "-c", script, "someone/tiny-agreement"], env=env, cwd=tmp_path,
                           capture_output=True, text=True, timeout=120)
    assert found.returncode == 0, found.stderr
    assert Path(found.stdout.strip()) == snapshot
    missing = subprocess.run([sys.executable, "-c", script, "gpt2"], env=env, cwd=tmp_path,
                             capture_output=True, text=True, timeout=120)
    assert f"--model gpt2: no directory {tmp_path / 'gpt2'}, and no model 'gpt2'" in missing.stderr
    assert f"local Hugging Face cache ({cache}, looked up offline)" in missing.stderr


def test_device_and_dtype_reach_the_model(saved_model, tmp_path, monkeypatch, capsys):
    """The table of explain in bfloat16 on the CPU is the float32 table to bfloat16's precision,
    and a model argument placed elsewhere shows in the loaded model."""
    loaded = []
    import captum_attnflow.cli._common as common

    original = common.load
    monkeypatch.setattr(common, "load", lambda *args, **kwargs: loaded.append(original(*args, **kwargs)) or loaded[-1])
    arguments = ["explain", SENTENCE, "--method", "rollout", "--layer", "2", "--out", str(tmp_path / "x.png"),
                 "--model", str(saved_model)]
    assert main([*arguments, "--device", "cpu", "--dtype", "bfloat16"]) == 0
    half = capsys.readouterr().out
    assert main(arguments) == 0
    full = capsys.readouterr().out
    assert [loaded[0][0].dtype, loaded[1][0].dtype] == [torch.bfloat16, torch.float32]
    assert loaded[1][0].device == (torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu"))  # auto
    rows = [[[float(cell) for cell in line.split()[1:]] for line in printed.splitlines()[3:9]] for printed in (half, full)]
    torch.testing.assert_close(torch.tensor(rows[0]), torch.tensor(rows[1]), atol=2e-2, rtol=0)
    assert not torch.equal(torch.tensor(rows[0]), torch.tensor(rows[1]))  # bfloat16 did change the sums


@pytest.mark.parametrize(
    "arguments, message",
    [
        (["--device", "gpu"], "unknown device 'gpu'; use auto, cpu, cuda, cuda:N or mps"),
        (["--device", "cpu", "--device-map", "auto"], "both place the model: give one"),
    ]
    + ([(["--device", "cuda"], "torch sees no CUDA device")] if not torch.cuda.is_available() else []),
)
def test_placement_errors_are_clear(arguments, message, tmp_path, capsys):
    assert main(["explain", SENTENCE, "--out", str(tmp_path / "x.png"), *arguments]) == 1
    error = capsys.readouterr().err
    assert error.startswith("captum-attnflow explain: error:") and message in error


def test_a_device_this_torch_cannot_use_is_refused_before_the_heavy_imports():
    """A misspelt name before torch is imported, a CUDA device with torch alone (CUDA hidden, so
    also on a GPU machine): transformers, Captum and matplotlib are never loaded."""
    script = (
        "import sys\n"
        "from captum_attnflow.cli import main\n"
        "heavy = ('torch', 'transformers', 'captum', 'matplotlib', 'captum_attnflow.hf')\n"
        "for device in ('gpu', 'cuda:1'):\n"
        f"    code = main(['explain', {SENTENCE!r}, '--device', device])\n"
        "    print(code, [name for name in heavy if name in sys.modules])\n"
    )
    environment = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, env=environment)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["1 []", "1 ['torch']"]
    assert "unknown device 'gpu'" in done.stderr and "device 'cuda:1': torch sees no CUDA device" in done.stderr


def test_a_bad_dtype_name_is_an_argument_error(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["generate", SENTENCE, "--dtype", "fp16"])
    assert exit_info.value.code == 2
    assert "argument --dtype: invalid choice: 'fp16' (choose from 'auto', 'float32', 'bfloat16', 'float16')" in capsys.readouterr().err
