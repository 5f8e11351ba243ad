"""``captum-attnflow cite``: the sources of a context ranked by how much the answer drew on each."""

from __future__ import annotations

import re

import pytest

from captum_attnflow.cli import main
from captum_attnflow.data import retrieval_examples

FACTS = (
    "Alice: Paris (home city). Bob: tennis (favourite sport). Carol: golf (favourite sport). "
    "Bob: Lima (home city). Alice: sushi (favourite food). Dan: Oslo (home city)."
)


def _ranking(printed: str) -> list[tuple[int, float, int, str]]:
    """(rank, score, source index, text) of each row of the printed ranking."""
    rows = re.findall(r"^\s*(\d+)\s+(-?\d+\.\d+)\s+(\d+)\s+(.+)$", printed, flags=re.MULTILINE)
    return [(int(rank), float(score), int(index), text) for rank, score, index, text in rows]


@pytest.mark.parametrize("method", ["rollout", "attnlrp"])
def test_cite_answers_with_the_bundled_model_and_ranks_the_fact_that_holds_the_answer_first(tmp_path, capsys, method):
    context = tmp_path / "facts.txt"
    context.write_text(FACTS, encoding="utf-8")
    page = tmp_path / "cite.html"
    assert main(["cite", "--context", str(context), "--question", "What is Bob's home city?", "--method", method,
                 "--html", str(page)]) == 0
    printed = capsys.readouterr().out
    assert "answer: Lima" in printed
    ranking = _ranking(printed)
    assert [row[0] for row in ranking] == list(range(1, 7))  # every sentence is a source, ranked once
    assert sorted(row[2] for row in ranking) == list(range(6))
    assert [row[1] for row in ranking] == sorted((row[1] for row in ranking), reverse=True)
    assert ranking[0][3] == "Bob: Lima (home city)."
    shown = page.read_text(encoding="utf-8")
    assert "Bob: Lima (home city)." in shown
    # the input line holds the question too; the bundled model is named, not its path
    assert "What is Bob&#x27;s home city? Answer:" in shown or "What is Bob's home city? Answer:" in shown
    assert "assets/retrieval" not in shown and " retrieval" in shown


def test_cite_by_line_top_k_and_a_given_answer(tmp_path, capsys):
    example = retrieval_examples(1, sources=12, seed=5)[0]
    context = tmp_path / "facts.txt"
    context.write_text("\n".join(example.sources), encoding="utf-8")
    assert main(["cite", "--context", str(context), "--question", example.question,
                 "--by", "line", "--top", "3", "--answer", example.answer]) == 0
    printed = capsys.readouterr().out
    assert f"answer: {example.answer}" in printed and len(_ranking(printed)) == 3


def test_cite_errors_are_clear(tmp_path, capsys):
    assert main(["cite", "--context", str(tmp_path / "missing.txt"), "--question", "Who?"]) == 1
    error = capsys.readouterr().err
    assert error.startswith("captum-attnflow cite: error:") and "is not a file" in error
    with pytest.raises(SystemExit) as exit_info:
        main(["cite", "--context", str(tmp_path / "missing.txt")])
    assert exit_info.value.code == 2


def test_cite_names_the_words_the_bundled_model_does_not_know(tmp_path, capsys):
    context = tmp_path / "report.txt"
    context.write_text("Alice: Paris (home city). The weather was sunny.", encoding="utf-8")
    assert main(["cite", "--context", str(context), "--question", "What is Alice's home city?"]) == 0
    captured = capsys.readouterr()
    assert "does not know 4 word(s)" in captured.err and "(The, weather, was, sunny)" in captured.err
    assert "answer: Paris\n" in captured.out  # the end-of-sequence token it wrote is not printed
