"""The documentation's families x methods table is the one the code generates from its own tables."""

from __future__ import annotations

from pathlib import Path

from captum_attnflow.capture.attention_gradients import GRADIENT_MODEL_TYPES
from captum_attnflow.capture.support import FAMILIES, support_table
from captum_attnflow.hf.architectures import ARCHITECTURES

PAGE = Path(__file__).parents[2] / "docs" / "families.md"


def test_the_docs_page_holds_the_generated_table():
    assert support_table() in PAGE.read_text(), (
        "docs/families.md is out of date: paste captum_attnflow.capture.support.support_table() into it"
    )


def test_every_model_type_of_the_tables_is_a_family():
    listed = {t for types in FAMILIES.values() for t in types}
    assert GRADIENT_MODEL_TYPES <= listed and set(ARCHITECTURES) <= listed
