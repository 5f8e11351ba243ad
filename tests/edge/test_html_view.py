"""The HTML view in a real browser: headless Chromium renders the page the CLI writes; the test
reads the DOM after scripts ran and a screenshot."""

import re

import numpy as np
import pytest
import torch
from helpers import browser, needs_browser

from captum_attnflow.attr import LLMAttentionAttributionResult
from captum_attnflow.cli import main
from captum_attnflow.explanation import ExplanationResult
from captum_attnflow.visualize.html import NEGATIVE, PALETTES, POSITIVE, colour

def _cells(dom: str) -> list[dict]:
    pattern = re.compile(r'<td class="caf-cell" style="background-color:rgb\((\d+),(\d+),(\d+)\)[^"]*" '
                         r'data-score="([^"]+)" data-row="([^"]*)" data-token="([^"]*)" title="([^"]*)"')
    return [dict(rgb=tuple(map(int, m[:3])), score=float(m[3]), row=m[4], token=m[5], title=m[6]) for m in pattern.findall(dom)]


def test_colour_is_monotone_in_the_score_and_diverges_at_zero():
    values = np.linspace(-2, 2, 41)
    # red minus blue channel: rises with the score on both sides of 0
    key = [colour(v, 1.5)[0] - colour(v, 1.5)[2] for v in values]
    assert all(a <= b for a, b in zip(key, key[1:])) and key[0] < 0 < key[-1]
    assert colour(0.0, 1.0) == (255, 255, 255) and colour(5, 1) == POSITIVE and colour(-5, 1) == NEGATIVE


def _legends(page: str) -> list[tuple[float, list[tuple[int, ...]], float]]:
    """Each legend's low number, its gradient's colour stops and its high number."""
    pattern = re.compile(r'<div class="caf-legend"><span>([^<]+)</span><span class="caf-bar" '
                         r'style="background:linear-gradient\(to right, ([^"]+)\)"></span><span>([^<]+)</span>')
    stops = re.compile(r"rgb\((\d+), (\d+), (\d+)\)")
    return [(float(low), [tuple(map(int, stop)) for stop in stops.findall(bar)], float(high)) for low, bar, high in pattern.findall(page)]


def test_the_legend_starts_at_zero_unless_a_score_is_negative():
    weights = torch.tensor([[0.2, 0.1, 0.3], [0.1, 0.5, 0.4]])  # raw attention, rollout, flow: never below 0
    relevance = torch.tensor([0.1, -0.8, 0.4])
    page = ExplanationResult(["the", "keys", "are"], {"rollout": weights, "attnlrp": relevance}).to_html()
    white = (255, 255, 255)
    assert _legends(page) == [(0.0, [white, colour(0.5, 0.5)], 0.5), (-0.8, [NEGATIVE, white, POSITIVE], 0.8)]
    scores = {(cell["row"], cell["token"]): cell for cell in _cells(page)}
    assert scores[("L2", "keys")]["rgb"] == POSITIVE and scores[("attnlrp", "keys")]["rgb"] == NEGATIVE


@needs_browser
def test_explain_html_renders_in_chromium(tmp_path):
    page, shot = tmp_path / "view.html", tmp_path / "view.png"
    assert main(["explain", "the keys to the cabinet", "--method", "gradient_rollout", "--out", str(tmp_path / "x.png"),
                 "--html", str(page)]) == 0
    dom = browser("--dump-dom", page.as_uri())
    assert 'data-ready="1"' in dom  # the page's script ran in the browser
    cells = _cells(dom)
    tokens = ["[CLS]", "the", "keys", "to", "the", "cabinet"]
    rows = list(dict.fromkeys(cell["row"] for cell in cells))
    assert rows == [f"L{k}" for k in range(1, 7)]
    for row in rows:  # one cell per token per row, in order
        assert [cell["token"] for cell in cells if cell["row"] == row] == tokens
    scores = [cell["score"] for cell in cells]
    redness = [cell["rgb"][0] - cell["rgb"][2] for cell in cells]
    order = np.argsort(scores, kind="stable")
    assert all(redness[i] <= redness[j] for i, j in zip(order, order[1:]))  # colours ordered as the scores
    assert all(cell["title"] == f"{cell['token']}: {cell['score']:.4f}" for cell in cells)  # the hover text
    # the display convention: the explained [CLS] without the identity's 1 (R - I), so not the darkest
    assert max(c["score"] for c in cells if c["row"] == "L6") > next(c["score"] for c in cells if c["row"] == "L6")
    browser("--window-size=900,700", f"--screenshot={shot}", page.as_uri())
    from PIL import Image

    image = np.asarray(Image.open(shot).convert("RGB")).astype(int)
    reddish = (image[..., 0] - image[..., 2] > 60).sum()
    assert image.std() > 10 and reddish > 500  # not blank: text and coloured cells drawn


@needs_browser
def test_generated_text_view_has_a_row_per_output_token(tmp_path):
    result = LLMAttentionAttributionResult(
        input_tokens=["<s>", "▁the", "▁keys"], output_tokens=["▁are", "▁here"], seq_attr=torch.tensor([0.5, 0.1, 0.4]),
        token_attr=torch.tensor([[0.6, -0.1, 0.3], [0.2, 0.5, -0.3]]), output_attr=torch.zeros(2, 2), sink_attr=torch.tensor([0.6, 0.2]),
    )
    page = tmp_path / "generated.html"
    result.to_html(page)
    cells = _cells(browser("--dump-dom", page.as_uri()))
    assert [cell["row"] for cell in cells] == ["1: ▁are"] * 3 + ["2: ▁here"] * 3
    assert [cell["score"] for cell in cells] == pytest.approx([0.6, -0.1, 0.3, 0.2, 0.5, -0.3])
    negative = next(cell for cell in cells if cell["score"] == pytest.approx(-0.3))
    assert negative["rgb"][2] > negative["rgb"][0]  # below 0: blue


@needs_browser
def test_encoder_decoder_view_shows_source_and_target_prefix_in_two_colours_of_one_row(tmp_path):
    """An encoder-decoder's row: the source tokens on the red scale, a gap, then the start token and
    the earlier output tokens on the green one, one scale for both; the row labelled with its
    source share. Saved and loaded with its shares."""
    result = LLMAttentionAttributionResult(
        input_tokens=["▁die", "▁Katze", "</s>"], output_tokens=["▁the", "▁cat"], seq_attr=torch.tensor([0.3, 0.4, 0.1]),
        token_attr=torch.tensor([[0.5, 0.2, 0.1], [0.1, 0.6, 0.05]]), output_attr=torch.tensor([[0.0, 0.0], [0.15, 0.0]]),
        sink_attr=torch.tensor([0.5, 0.1]), decoder_start_attr=torch.tensor([0.2, 0.1]), method="ALTI",
        source_share=torch.tensor([0.8, 0.75]), target_share=torch.tensor([0.2, 0.25]), decoder_start_token="<pad>",
    )
    page = tmp_path / "translation.html"
    result.to_html(page)
    dom = browser("--dump-dom", page.as_uri())
    cells = _cells(dom)
    assert [cell["row"] for cell in cells] == ["1: ▁the (source 0.80)"] * 5 + ["2: ▁cat (source 0.75)"] * 5
    assert [cell["token"] for cell in cells[:5]] == ["▁die", "▁Katze", "&lt;/s&gt;", "&lt;pad&gt;", "▁the"]
    assert [cell["score"] for cell in cells[5:]] == pytest.approx([0.1, 0.6, 0.05, 0.1, 0.15])
    groups = re.findall(r'data-group="([^"]+)"', dom)
    assert groups == (["source"] * 3 + ["target prefix"] * 2) * 2 and dom.count('class="caf-gap"') == 2
    source, target = cells[6], cells[9]  # 0.6 on the source, 0.1 on the start token: red, and green
    assert source["rgb"][0] > source["rgb"][1] and target["rgb"][1] > target["rgb"][0]
    assert cells[1]["rgb"] == colour(0.2, 0.6) and cells[3]["rgb"] == colour(0.2, 0.6, PALETTES[1])  # one scale
    assert "source: ▁die ▁Katze" in dom
    files = result.save(tmp_path / "translation")
    loaded = LLMAttentionAttributionResult.load(files[0])
    assert loaded == result and torch.equal(loaded.source_share, result.source_share)
    assert loaded.decoder_start_token == "<pad>"


def test_repr_html_is_a_fragment_without_network():
    result = ExplanationResult(["a", "<b>"], {"raw": torch.tensor([[0.2, 0.8], [0.5, 0.5]])}, prediction="x")
    fragment = result._repr_html_()
    assert "<!DOCTYPE" not in fragment and "http" not in fragment and "&lt;b&gt;" in fragment
    assert len(_cells(fragment)) == 4
