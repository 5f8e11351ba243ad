"""Models loaded in bfloat16 or float16, as large language models are: every method runs, returns
float32, and stays within a stated distance of the same model in float32.

The methods compute their maths in float32 from the half-precision model's attention, values
and weights; what differs is the model's own forward in half precision. Measured on these tiny
GPT-2 and Llama models (largest difference over all scores, divided by the largest score):
bfloat16 at most 2.2e-2 (AttnLRP on GPT-2; AttentionNorm 1.1e-2, the others 0.2e-2 to 0.8e-2),
float16 at most 2.0e-3: the rounding of the model's activations (8 and 11 significant bits).
"""

from __future__ import annotations

import copy

import pytest
import torch
import transformers

from captum_attnflow import AttnLRP, GradientWeightedRollout
from helpers import CONFIGS, TOKEN_METHODS, padded_batch

# Largest difference from float32, relative to the largest float32 score: over twice the measured one.
TOLERANCES = {torch.bfloat16: 5e-2, torch.float16: 5e-3}


@pytest.fixture(scope="module", params=["gpt2", "llama"])
def models(request):
    """The float32 model and its copies in bfloat16 and float16."""
    torch.manual_seed(0)
    config = CONFIGS[request.param]()
    config.initializer_range = 0.2
    model = transformers.AutoModelForCausalLM.from_config(config).eval()
    return model, {dtype: copy.deepcopy(model).to(dtype) for dtype in TOLERANCES}


@pytest.mark.parametrize("method", TOKEN_METHODS, ids=lambda method: method.__name__)
def test_half_precision_models_give_float32_scores_near_the_float32_model(models, method):
    model, halves = models
    ids, mask = padded_batch(seed=3, batch=3, n=7)
    options = {"position": mask.sum(1) - 1, "layer": None, "attention_mask": mask}
    if method in (GradientWeightedRollout, AttnLRP):
        options["target"] = 7
    expected = method(model).attribute(ids, **options)
    for dtype, half in halves.items():
        ours = method(half).attribute(ids, **options)
        assert ours.dtype == torch.float32 and half.dtype == dtype
        difference = float((ours - expected).abs().max() / expected.abs().max())
        assert 0 < difference < TOLERANCES[dtype], f"{method.__name__} in {dtype}: {difference:.2e}"
