"""split_sources: sentences, paragraphs and lines by rules, offline, the text kept exactly; context_prompt:
the Captum TextTemplateInput of a context and a question, the sources its values."""

from __future__ import annotations

import socket

import pytest
from captum.attr import TextTemplateInput
from hypothesis import given, settings
from hypothesis import strategies as st

import captum_attnflow
from captum_attnflow import context_prompt, split_sources

# text, its sentences: every case read and split by hand
SENTENCES = [
    ("Dr. Smith arrived. Mr. Jones left.", ["Dr. Smith arrived. ", "Mr. Jones left."]),
    ("Fruit, e.g. Apples, i.e. Red ones. Next.", ["Fruit, e.g. Apples, i.e. Red ones. ", "Next."]),
    ("The U.S. Army is large. He moved to the U.S. Then he left.",
     ["The U.S. Army is large. ", "He moved to the U.S. ", "Then he left."]),
    ("J. R. R. Tolkien wrote it. It sold.", ["J. R. R. Tolkien wrote it. ", "It sold."]),
    ("Pi is 3.14 or so. It costs $2.50 today.", ["Pi is 3.14 or so. ", "It costs $2.50 today."]),
    ("Wait... What? He paused... then left.", ["Wait... ", "What? ", "He paused... then left."]),
    ("He said 'stop.' Then he left.", ["He said 'stop.' ", "Then he left."]),
    ('She wrote "done." The end.', ['She wrote "done." ', "The end."]),
    ('"Stop!" he said. Really?! Yes!', ['"Stop!" he said. ', "Really?! ", "Yes!"]),
    ("It works (see Fig. 2). Good.", ["It works (see Fig. 2). ", "Good."]),
    ("Tea, coffee, etc. The menu ends.", ["Tea, coffee, etc. ", "The menu ends."]),
    ("Tea, coffee, etc. Are served.", ["Tea, coffee, etc. Are served."]),  # "Are" does not usually start one
    ("One.\nstill one.\n\ntwo without a dot\n\nThree.", ["One.\nstill one.\n\n", "two without a dot\n\n", "Three."]),
    ("  Leading space. 2024 was long.  ", ["  Leading space. ", "2024 was long.  "]),
    ("No split.Here", ["No split.Here"]),
]


@pytest.mark.parametrize(("text", "sentences"), SENTENCES)
def test_sentences(text, sentences):
    assert split_sources(text) == sentences


def test_paragraphs_and_lines():
    text = "First line\nsecond line.\n \t\nNext paragraph.\n\n\nLast\n"
    assert split_sources(text, by="paragraph") == ["First line\nsecond line.\n \t\n", "Next paragraph.\n\n\n", "Last\n"]
    assert split_sources(text, by="line") == ["First line\n", "second line.\n \t\n", "Next paragraph.\n\n\n", "Last\n"]
    assert split_sources("a\r\nb", by="line") == ["a\r\n", "b"]
    assert split_sources("") == [] and split_sources(" \n ") == [" \n "]


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet="aB3 .!?\n'\"()\u2026", max_size=60), st.sampled_from(["sentence", "paragraph", "line"]))
def test_joining_the_sources_gives_the_text_back(text, by):
    sources = split_sources(text, by)
    assert "".join(sources) == text
    assert all(source for source in sources)
    assert len(sources) <= 1 or all(source.strip() for source in sources)  # no source of only whitespace


def test_offline_no_socket_no_nltk(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("split_sources reached for the network")

    monkeypatch.setattr(socket, "socket", refuse)
    assert split_sources("One. Two.") == ["One. ", "Two."]
    prompt = context_prompt("One. Two.", "Which?")
    assert prompt.values == ["One.", "Two."]
    assert "nltk" not in __import__("sys").modules


def test_context_prompt_keeps_the_context_exactly_and_puts_the_question_after():
    context = "First {braces} stay.  Second one!\n\nThird?"
    prompt = context_prompt(context, "What {is} it?", template="Context:\n{context}\n\nQ: {question}\nA:")
    assert isinstance(prompt, TextTemplateInput)
    assert prompt.values == ["First {braces} stay.", "Second one!", "Third?"]
    assert prompt.to_model_input() == f"Context:\n{context}\n\nQ: What {{is}} it?\nA:"
    lines = context_prompt("a\nb\n", "q", by="line")
    assert lines.values == ["a", "b"] and lines.to_model_input() == "Context: a\nb\n\n\nQuestion: q"
    documents = context_prompt(["  Doc one. ", "Doc {two}."], "Which?", separator=" | ")
    assert documents.values == ["Doc one.", "Doc {two}."]
    assert documents.to_model_input() == "Context:   Doc one.  | Doc {two}.\n\nQuestion: Which?"
    braces = context_prompt("Text.", "q", template="{{literal}} {context} {question}")
    assert braces.to_model_input() == "{literal} Text. q"


def test_context_prompt_errors():
    with pytest.raises(ValueError, match="no source"):
        context_prompt("  \n", "q")
    with pytest.raises(ValueError, match="no source"):
        context_prompt([], "q")
    with pytest.raises(TypeError, match="list of strings"):
        context_prompt([1, 2], "q")
    with pytest.raises(ValueError, match="once each"):
        context_prompt("Text.", "q", template="{context} only")
    with pytest.raises(ValueError, match="once each"):
        context_prompt("Text.", "q", template="{context} {context} {question}")
    with pytest.raises(ValueError, match="got {name}"):
        context_prompt("Text.", "q", template="{name} {context} {question}")
    with pytest.raises(ValueError, match="by must be one of"):
        split_sources("Text.", by="word")
    with pytest.raises(TypeError, match="text must be a string"):
        split_sources(["Text."])


def test_exported_at_the_package_root():
    assert captum_attnflow.split_sources is split_sources and "context_prompt" in dir(captum_attnflow)
