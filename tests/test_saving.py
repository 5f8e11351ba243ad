"""Save and load every result: JSON + safetensors beside it, or one zip; equal after the round
trip; a newer format version refused; no pickle anywhere in the files."""

import json
import zipfile

import numpy as np
import pytest
import safetensors.numpy
import torch

from captum_attnflow.attr import LLMAttentionAttributionResult
from captum_attnflow.evaluate import ComparisonResult, Leaderboard
from captum_attnflow.explanation import ExplanationResult
from captum_attnflow.saving import FORMAT_VERSION


def _results():
    generator = torch.Generator().manual_seed(0)
    llm = LLMAttentionAttributionResult(
        input_tokens=["<s>", "▁the", "▁keys"], output_tokens=["▁are"], seq_attr=torch.rand(3, generator=generator),
        token_attr=torch.rand(1, 3, generator=generator), output_attr=torch.zeros(1, 1), sink_attr=torch.rand(1, generator=generator),
        decoder_start_attr=torch.rand(1, generator=generator).to(torch.bfloat16), method="AttentionRollout", model_name="tiny",
    )
    explained = ExplanationResult(["[CLS]", "the", "keys"], {"rollout": torch.rand(6, 3, generator=generator, dtype=torch.float64),
                                                              "saliency": torch.rand(3, generator=generator)},
                                  prediction="plural (0.9)", model_name="bundled", units={"rollout": "rollout score"})
    comparison = ComparisonResult([4, 7], {("raw", "grad", 1): [0.2, np.nan]}, {("raw", "sufficiency", None): [0.1, 0.3]})
    board = Leaderboard({("raw", "log-odds", None): [-0.2, -0.4, np.nan], ("rollout", "log-odds", None): [-0.1, 0.2, 0.3]}, n_resamples=99)
    return [llm, explained, comparison, board]


@pytest.mark.parametrize("compress", [False, True])
def test_round_trip_gives_an_equal_object(tmp_path, compress):
    for index, result in enumerate(_results()):
        files = result.save(tmp_path / f"result{index}", compress=compress)
        assert [path.suffix for path in files] == ([".zip"] if compress else [".json", ".safetensors"])
        loaded = type(result).load(files[0])
        assert loaded == result and loaded is not result
        if compress:
            assert zipfile.is_zipfile(files[0])
        else:
            header = json.loads(files[0].read_text())
            assert header["format_version"] == FORMAT_VERSION and header["kind"] == type(result).__name__
            assert header["package_version"]
    llm = _results()[0]
    assert not llm == type(llm).load(llm.save(tmp_path / "other")[0]).aggregate_words()  # equality can fail


@pytest.mark.parametrize("compress", [False, True])
@pytest.mark.parametrize("name", ["run", "run.json", "run.zip", "run.v2"])
def test_load_takes_the_path_given_to_save_and_the_paths_it_returned(tmp_path, name, compress):
    for index, result in enumerate(_results()):
        folder = tmp_path / str(index)
        folder.mkdir()
        files = result.save(folder / name, compress=compress)
        for path in [folder / name, str(folder / name), *files]:
            assert type(result).load(path) == result, (path, files)


def test_load_names_what_it_looked_for_and_refuses_an_ambiguous_name(tmp_path):
    explained = _results()[1]
    with pytest.raises(FileNotFoundError, match=r"looked for .*run, .*run\.json and .*run\.zip"):
        ExplanationResult.load(tmp_path / "run")
    explained.save(tmp_path / "run")
    explained.save(tmp_path / "run", compress=True)
    with pytest.raises(ValueError, match="both .*run.json and .*run.zip were saved as"):
        ExplanationResult.load(tmp_path / "run")
    assert ExplanationResult.load(tmp_path / "run.zip") == ExplanationResult.load(tmp_path / "run.json") == explained


def test_npz_archive_of_a_comparison_loads_by_the_same_path(tmp_path):
    comparison = _results()[2]
    assert comparison.save(tmp_path / "scores.npz") == [tmp_path / "scores.npz"]
    assert ComparisonResult.load(tmp_path / "scores.npz").example_ids.tolist() == [4, 7]


def test_newer_format_and_other_kinds_are_refused(tmp_path):
    explained = _results()[1]
    path = explained.save(tmp_path / "explained.json")[0]
    with pytest.raises(ValueError, match="holds a ExplanationResult, not a Leaderboard"):
        Leaderboard.load(path)
    header = json.loads(path.read_text())
    header["format_version"] = FORMAT_VERSION + 1
    path.write_text(json.dumps(header))
    with pytest.raises(ValueError, match="newer than this captum_attnflow reads"):
        ExplanationResult.load(path)
    (tmp_path / "other.json").write_text("[1, 2]")
    with pytest.raises(ValueError, match="not a saved captum_attnflow result"):
        ExplanationResult.load(tmp_path / "other.json")


def _overwrite(path, data):
    path.write_bytes(data(path.read_bytes()))


def _rezip(path, members):
    with zipfile.ZipFile(path) as archive:
        kept = {name: archive.read(name) for name in archive.namelist()}
    with zipfile.ZipFile(path, "w") as archive:
        for name, data in members(kept).items():
            archive.writestr(name, data)


_OTHER_ARRAYS = safetensors.numpy.save({"other": np.ones(2)})
_DAMAGE = {  # how a saved pair or zip gets damaged -> (which file is named, what the message says)
    "overwritten": (lambda files: _overwrite(files[1], lambda data: b"x" * len(data)), 1, "is damaged"),
    "truncated": (lambda files: _overwrite(files[1], lambda data: data[: len(data) // 2]), 1, "is damaged"),
    "header only": (lambda files: _overwrite(files[1], lambda data: data[:5]), 1, "is damaged"),
    "empty": (lambda files: _overwrite(files[1], lambda data: b""), 1, "is damaged"),
    "other arrays": (lambda files: _overwrite(files[1], lambda data: _OTHER_ARRAYS), 1, r"holds the arrays \['other'\], not the"),
    "JSON overwritten": (lambda files: _overwrite(files[0], lambda data: b"\xff" * len(data)), 0, "not JSON"),
    "zip truncated": (lambda files: _overwrite(files[0], lambda data: data[: len(data) // 2]), 0, "damaged or truncated zip"),
    "zip without arrays": (lambda files: _rezip(files[0], lambda kept: {"result.json": kept["result.json"]}), 0, "damaged zip"),
    "zip arrays overwritten": (
        lambda files: _rezip(files[0], lambda kept: {**kept, "arrays.safetensors": b"x" * 100}), 0, r"\(arrays.safetensors\) is damaged",
    ),
    "zip arrays other": (
        lambda files: _rezip(files[0], lambda kept: {**kept, "arrays.safetensors": _OTHER_ARRAYS}), 0, "holds the arrays",
    ),
}


@pytest.mark.parametrize("damage", list(_DAMAGE))
def test_a_damaged_file_is_a_value_error_naming_it(tmp_path, damage):
    spoil, named, message = _DAMAGE[damage]
    for index, result in enumerate(_results()):
        files = result.save(tmp_path / f"result{index}", compress=damage.startswith("zip"))
        spoil(files)
        with pytest.raises(ValueError, match=message) as caught:
            type(result).load(files[0])
        assert type(caught.value) is ValueError, caught.value  # not a UnicodeDecodeError or a library's own error
        assert str(files[named]) in str(caught.value)
        assert damage == "JSON overwritten" or "save the result again" in str(caught.value)


@pytest.mark.parametrize("data", [b"x" * 100, b"PK\x03\x04" + b"x" * 100, b""], ids=["bytes", "zip start", "empty"])
def test_a_damaged_npz_archive_is_a_value_error_that_does_not_suggest_pickle(tmp_path, data):
    (tmp_path / "scores.npz").write_bytes(data)
    with pytest.raises(ValueError, match="scores.npz is not a numpy archive that ComparisonResult.save wrote") as caught:
        ComparisonResult.load(tmp_path / "scores.npz")
    assert "pickle" not in str(caught.value)
