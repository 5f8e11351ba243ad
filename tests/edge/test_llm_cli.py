"""``captum-attnflow generate``: continuation, prompt x output table and heatmap, bundled LM or a local directory."""

from __future__ import annotations

import re

import pytest
import torch
import transformers

from captum_attnflow import ALTI, AttentionFlow, AttentionRollout, LLMAttentionAttribution, load_agreement_lm
from captum_attnflow.cli import main
from captum_attnflow.models.language_model import build_lm_tokenizer

PROMPT = "the keys to the cabinet"


def _table(printed: str, label: str = "prompt") -> tuple[list[str], list[str], torch.Tensor]:
    """(output column names, row tokens, scores (n_rows, n_out)) of the printed table whose header starts with ``label``."""
    lines = printed.splitlines()
    start = next(index for index, line in enumerate(lines) if line.startswith(label + " "))
    columns = lines[start][len(label):].split()
    tokens, rows = [], []
    for line in lines[start + 2 :]:
        cells = line.split()
        if len(cells) != len(columns) + 1 or not all(re.fullmatch(r"-?\d+\.\d+", cell) for cell in cells[1:]):
            break
        tokens.append(cells[0])
        rows.append([float(cell) for cell in cells[1:]])
    return columns, tokens, torch.tensor(rows)


def test_generate_explains_the_bundled_language_model(tmp_path, capsys):
    out = tmp_path / "verb.png"
    page = tmp_path / "verb.html"
    assert main(["generate", PROMPT, "--target", "are .", "--method", "flow", "--layer", "3", "--out", str(out),
                 "--html", str(page), "--words"]) == 0
    printed = capsys.readouterr().out
    assert "continuation: are ." in printed
    model, tokenizer = load_agreement_lm()
    expected = LLMAttentionAttribution(AttentionFlow(model), tokenizer).attribute(PROMPT, target="are .", layer=3)
    columns, tokens, scores = _table(printed)
    assert columns == ["1:are", "2:."] and tokens == expected.input_tokens
    torch.testing.assert_close(scores, expected.token_attr.T, atol=1e-4, rtol=0)
    assert out.read_bytes().startswith(b"\x89PNG") and f"heatmap written to {out}" in printed
    assert page.read_text().count('class="caf-cell"') == expected.token_attr.numel()  # a word-level tokenizer: words = tokens


def test_generate_continues_with_a_local_encoder_decoder(tmp_path, capsys):
    tokenizer = build_lm_tokenizer()
    torch.manual_seed(0)
    model = transformers.T5ForConditionalGeneration(transformers.T5Config(
        vocab_size=len(tokenizer), d_model=16, d_kv=4, d_ff=32, num_layers=2, num_heads=2,
        decoder_start_token_id=0, pad_token_id=0, eos_token_id=tokenizer.eos_token_id,
    )).eval()
    model.save_pretrained(tmp_path / "t5")
    tokenizer.save_pretrained(tmp_path / "t5")
    out = tmp_path / "t5.png"
    status = main(["generate", PROMPT, "--model", str(tmp_path / "t5"), "--max-new-tokens", "3", "--drop-sink",
                   "--out", str(out)])
    assert status == 0
    printed = capsys.readouterr().out
    expected = LLMAttentionAttribution(AttentionRollout(model), tokenizer).attribute(
        PROMPT, max_new_tokens=3, drop_sink=True
    )
    columns, tokens, scores = _table(printed, "source")
    assert [column.split(":", 1)[1] for column in columns] == expected.output_tokens
    assert tokens == ["the", "keys", "to", "the", "cabinet"]
    torch.testing.assert_close(scores, expected.token_attr.T, atol=1e-4, rtol=0)
    assert out.read_bytes().startswith(b"\x89PNG")
    # ALTI+: the target prefix's scores below the source's, the shares under them, the HTML in two colours
    page = tmp_path / "alti.html"
    assert main(["generate", PROMPT, "--model", str(tmp_path / "t5"), "--target", "are . that", "--method", "alti",
                 "--out", str(out), "--html", str(page)]) == 0
    printed = capsys.readouterr().out
    expected = LLMAttentionAttribution(ALTI(model), tokenizer).attribute(PROMPT, target="are . that")
    _, tokens, scores = _table(printed, "target prefix")
    assert tokens == [expected.decoder_start_token, "are", "."]
    torch.testing.assert_close(scores, torch.cat([expected.decoder_start_attr[:, None], expected.output_attr[:, :2]], 1).T,
                               atol=1e-4, rtol=0)
    shares = re.findall(r"\d:\S+ (\d\.\d+)", next(line for line in printed.splitlines() if line.startswith("source share:")))
    torch.testing.assert_close(torch.tensor([float(share) for share in shares]), expected.source_share, atol=1e-4, rtol=0)
    view = page.read_text()
    assert view.count('data-group="source"') == 3 * 6 and view.count('data-group="target prefix"') == 3 * 3


def test_generate_errors_are_clear(tmp_path, capsys):
    assert main(["generate", PROMPT, "--model", str(tmp_path / "missing"), "--out", str(tmp_path / "x.png")]) == 1
    error = capsys.readouterr().err
    assert error.startswith("captum-attnflow generate: error:") and "no directory" in error
    (tmp_path / "empty").mkdir()
    assert main(["generate", PROMPT, "--model", str(tmp_path / "empty"), "--out", str(tmp_path / "x.png")]) == 1
    assert "is a directory without config.json" in capsys.readouterr().err
    for empty in ["", "[CLS]"]:
        assert main(["generate", empty, "--out", str(tmp_path / "x.png")]) == 1
        error = capsys.readouterr().err
        assert error.startswith("captum-attnflow generate: error: the prompt is empty")
    assert not (tmp_path / "x.png").exists()
    with pytest.raises(SystemExit) as exit_info:
        main(["generate", PROMPT, "--method", "saliency"])
    assert exit_info.value.code == 2


def test_generate_has_help(capsys):
    with pytest.raises(SystemExit):
        main(["generate", "--help"])
    text = capsys.readouterr().out
    assert all(option in text for option in ("--target", "--method", "--model", "--receptive-field", "--drop-sink"))
