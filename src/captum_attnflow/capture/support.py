"""Which method runs how on which model family, read from the tables the code itself dispatches on.

Raw attention, rollout and flow recompute each layer's maps from its queries and keys (lean) on
the model types of :data:`~captum_attnflow.capture.lean.LEAN_MODEL_TYPES`, and otherwise read the maps
eager attention stores; gradient-weighted rollout does the same on
:data:`~captum_attnflow.capture.attention_gradients.GRADIENT_MODEL_TYPES`; value zeroing, ALTI, the
attention norms and AttnLRP need the block internals of
:data:`~captum_attnflow.hf.architectures.ARCHITECTURES` (an encoder-decoder's on the joint graph of
its encoder, decoder and cross-attention, through the methods' ``encoder_decoder_rows``).
:func:`support_table` writes that out as the documentation's table (``docs/families.md``, which a
test keeps equal to it).
"""

from __future__ import annotations

from typing import Collection

from captum_attnflow.capture.attention_gradients import GRADIENT_MODEL_TYPES
from captum_attnflow.capture.lean import LEAN_MODEL_TYPES
from captum_attnflow.hf.architectures import ARCHITECTURES

# Each family's name and ``config.model_type`` values, encoders, then decoders, then the rest.
FAMILIES: dict[str, tuple[str, ...]] = {
    "BERT": ("bert",),
    "RoBERTa, XLM-R": ("roberta", "xlm-roberta"),
    "DistilBERT": ("distilbert",),
    "ELECTRA": ("electra",),
    "ALBERT": ("albert",),
    "ModernBERT": ("modernbert",),
    "DeBERTa-v2/v3": ("deberta-v2",),
    "MPNet": ("mpnet",),
    "GPT-2": ("gpt2",),
    "GPT-NeoX (Pythia)": ("gpt_neox",),
    "GPT-J": ("gptj",),
    "OPT": ("opt",),
    "Llama": ("llama",),
    "Mistral": ("mistral",),
    "Mixtral": ("mixtral",),
    "Qwen2, Qwen2.5": ("qwen2",),
    "Qwen3": ("qwen3",),
    "Qwen3-MoE": ("qwen3_moe",),
    "OLMo 2": ("olmo2",),
    "Phi-3": ("phi3",),
    "Gemma 2": ("gemma2",),
    "Gemma 3 (text)": ("gemma3_text",),
    "Falcon": ("falcon",),
    "BLOOM": ("bloom",),
    "ViT, DeiT": ("vit", "deit"),
    "DINOv2": ("dinov2",),
    "CLIP, SigLIP text towers": ("clip_text_model", "siglip_text_model"),
    "CLIP, SigLIP vision towers": ("clip_vision_model", "siglip_vision_model"),
    "BART, mBART, Marian": ("bart", "mbart", "marian"),
    "M2M-100, NLLB": ("m2m_100",),
    "T5, Flan-T5": ("t5",),
    "bundled agreement classifier": ("captum_attnflow_agreement",),
    "bundled tagger": ("captum_attnflow_tagger",),
}

# How a family's attention reaches the methods, where it is not transformers' interface; why it
# lacks the block internals.
_NOTES = {
    "deberta-v2": "attention in its own modules: relative-position terms, AttnLRP's score biases; "
                  "AttnLRP not with v2-xlarge's convolution layer",
    "mpnet": "attention in its own modules: relative position bias, AttnLRP's score bias",
    "falcon": "attention in its own modules: ALiBi (once, as sdpa adds it), AttnLRP's score bias; or rotary positions",
    "bloom": "attention in its own modules: ALiBi, AttnLRP's score bias",
    "gemma2": "AttnLRP: soft-capping by the identity rule",
}

_HEADER = (
    "| family | `model_type` | raw attention, rollout, flow | gradient-weighted rollout "
    "| value zeroing, ALTI, attention norm | AttnLRP | note |\n"
    "|---|---|---|---|---|---|---|\n"
)


def _one(types: tuple[str, ...], members: Collection[str], yes: str, no: str) -> str:
    """``yes`` if every type of one family is in ``members``, ``no`` if none is."""
    found = {t in members for t in types}
    if len(found) != 1:
        raise ValueError(f"the model types {types} of one family are not all treated alike; list them as two families.")
    return yes if found.pop() else no


def support_table() -> str:
    """The families x methods table as markdown: for each family of :data:`FAMILIES`, how each
    method captures its attention, **lean** (recomputed from the queries and keys, no (H, n, n)
    map stored) or **stored** (eager attention's maps, or those a family's own attention modules
    return), or **no** for the methods that read the block internals where the table has no
    row, and whether AttnLRP runs (**yes** / **no**), with a note.

    Example::

        >>> from captum_attnflow.capture.support import support_table
        >>> [row for row in support_table().splitlines() if row.startswith("| Qwen3 ")]
        ['| Qwen3 | qwen3 | lean | lean | lean | yes |  |']
    """
    rows = []
    for family, types in FAMILIES.items():
        maps = _one(types, LEAN_MODEL_TYPES, "lean", "stored")
        gradients = _one(types, GRADIENT_MODEL_TYPES, "lean", "stored")
        internals = _one(types, ARCHITECTURES, maps, "no")  # the per-head maps as raw attention reads them
        rules = _one(types, ARCHITECTURES, "yes", "no")
        note = _NOTES.get(types[0], "")
        rows.append(f"| {family} | {', '.join(types)} | {maps} | {gradients} | {internals} | {rules} | {note} |\n")
    return _HEADER + "".join(rows)
