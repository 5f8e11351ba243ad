"""Models dispatched by accelerate: every method gives the single-device result, and the model's
hooks and offloading are as before afterwards, also after an exception.

Tiny GPT-2 and Llama language models are saved and loaded back twice: with a ``device_map``
that keeps some modules on the CPU and offloads the others to disk (``offload_folder``), and
with ``accelerate.cpu_offload``, whose weights live in a CPU state dict and are moved in by the
hooks (what a ``"cpu"`` entry of a GPU device map does). Outside a forward their offloaded
weights are empty ``meta`` tensors. A two-GPU map runs in ``tests/test_gpu.py``.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import transformers

from captum_attnflow import ALTI, AttentionNorm, AttnLRP, GradientWeightedRollout, LLMAttentionAttribution, ValueZeroing
from captum_attnflow.evaluate import Evaluator
from captum_attnflow.hf import input_device
from captum_attnflow.hf.dispatch import onloaded
from captum_attnflow.methods import EXTRA_METHODS
from captum_attnflow.methods import METHODS as METHOD_REGISTRY
from captum_attnflow.models.language_model import build_lm_tokenizer
from helpers import CONFIGS, TOKEN_METHODS, padded_batch

accelerate = pytest.importorskip("accelerate")

EXPLAINING_A_SCORE = (GradientWeightedRollout, AttnLRP)
# Modules of each model and where the device map puts them: the first modules of GPT-2 (its
# position embedding) and Llama (its token embedding) on disk, so the inputs meet an offloaded module first.
DEVICE_MAPS = {
    "gpt2": {"transformer.wte": "cpu", "transformer.wpe": "disk", "transformer.drop": "cpu", "transformer.h.0": "cpu",
             "transformer.h.1": "disk", "transformer.h.2": "disk", "transformer.ln_f": "cpu", "lm_head": "cpu"},
    "llama": {"model.embed_tokens": "disk", "model.rotary_emb": "cpu", "model.layers.0": "disk", "model.layers.1": "cpu",
              "model.layers.2": "disk", "model.norm": "cpu", "lm_head": "cpu"},
}


@pytest.fixture(scope="module")
def tokenizer():
    return build_lm_tokenizer()


@pytest.fixture(scope="module", params=["gpt2", "llama"])
def models(request, tokenizer, tmp_path_factory):
    """``(arch, the model on one device, {"disk": dispatched with disk offload, "cpu": cpu_offload})``."""
    torch.manual_seed(0)
    config = CONFIGS[request.param]()
    config.vocab_size, config.bos_token_id, config.eos_token_id, config.pad_token_id = len(tokenizer), 2, 3, 0
    config.initializer_range = 0.2  # scores that move when attention changes
    model = transformers.AutoModelForCausalLM.from_config(config).eval()
    folder = tmp_path_factory.mktemp(request.param)
    model.save_pretrained(folder)
    on_disk = transformers.AutoModelForCausalLM.from_pretrained(
        folder, device_map=DEVICE_MAPS[request.param], offload_folder=folder / "offload"
    ).eval()
    on_cpu = accelerate.cpu_offload(transformers.AutoModelForCausalLM.from_pretrained(folder).eval(), torch.device("cpu"))
    return request.param, model, {"disk": on_disk, "cpu": on_cpu}


def offload_state(model: torch.nn.Module) -> dict:
    """Where every weight is and which hook every module has: what a call must leave as it was."""
    return {
        name: (
            [(key, p.device.type) for key, p in module.named_parameters(recurse=False)],
            id(getattr(module, "_hf_hook", None)),
            dict(module._forward_hooks), dict(module._forward_pre_hooks),
            module.training,
        )
        for name, module in model.named_modules()
    }


def left_padded(ids: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    shift = (mask == 0).sum(1, keepdim=True)
    where = (torch.arange(ids.shape[1])[None] + shift) % ids.shape[1]
    return ids.new_zeros(ids.shape).scatter(1, where, ids), mask.new_zeros(mask.shape).scatter(1, where, mask)


def test_offloaded_weights_are_meta_outside_a_forward(models):
    _, _, dispatched = models
    for model in dispatched.values():
        assert {p.device.type for p in model.parameters()} >= {"meta"}
        assert input_device(model) == torch.device("cpu")


# GPT-2 in a right-padded batch, Llama in a left-padded one (run with its real tokens first).
@pytest.mark.parametrize("models, side", [("gpt2", "right"), ("llama", "left")], indirect=["models"])
def test_every_method_gives_the_single_device_result(models, side):
    arch, model, dispatched = models
    ids, mask = padded_batch(seed=3, batch=3, n=7)
    last = mask.sum(1) - 1  # the last real token of each row
    if side == "left":
        ids, mask = left_padded(ids, mask)
        last = torch.full_like(last, ids.shape[1] - 1)
    for method in TOKEN_METHODS:
        options = {"target": 7, "position": last} if method in EXPLAINING_A_SCORE else {"position": last}
        expected = method(model).attribute(ids, attention_mask=mask, layer=None, **options)
        # CPU offload: the methods that read weights, and one reading gradients
        layouts = dispatched if method in (ALTI, AttentionNorm, ValueZeroing, *EXPLAINING_A_SCORE) else ["disk"]
        for layout in layouts:
            offloaded = dispatched[layout]
            before = offload_state(offloaded)
            ours = method(offloaded).attribute(ids, attention_mask=mask, layer=None, **options)
            torch.testing.assert_close(ours, expected, atol=1e-6, rtol=0, msg=f"{method.__name__}, {layout} offload")
            assert offload_state(offloaded) == before, f"{method.__name__} changed the {layout}-offloaded model"
    for offloaded in dispatched.values():  # and the model computes what it computed before
        torch.testing.assert_close(offloaded(ids, attention_mask=mask).logits, model(ids, attention_mask=mask).logits)


@pytest.mark.parametrize("models", ["gpt2"], indirect=True)
def test_a_forward_that_raises_leaves_the_weights_offloaded(models):
    _, model, dispatched = models
    offloaded = dispatched["disk"]
    ids, mask = padded_batch(seed=4, batch=2, n=6)
    before = offload_state(offloaded)
    # A module whose weights accelerate loads from disk raises inside its forward, after its hook
    # loaded them and before the hook would put them back.
    leaf = next(
        module for name, module in offloaded.named_modules()
        if "mlp." in name and isinstance(getattr(module, "weight", None), torch.Tensor) and module.weight.device.type == "meta"
    )
    forward = leaf._old_forward
    leaf._old_forward = lambda *args, **kwargs: (_ for _ in ()).throw(RuntimeError("out of memory"))
    try:
        for method in (ALTI, GradientWeightedRollout, AttnLRP):
            with pytest.raises(RuntimeError, match="out of memory"):
                method(offloaded).attribute(ids, attention_mask=mask, target=1)
            assert offload_state(offloaded) == before
    finally:
        leaf._old_forward = forward
    torch.testing.assert_close(offloaded(ids, attention_mask=mask).logits, model(ids, attention_mask=mask).logits)


@pytest.mark.parametrize("models", ["llama"], indirect=True)
def test_onloaded_weights_go_back_also_after_an_exception(models):
    _, model, dispatched = models
    offloaded = dispatched["cpu"]
    block = [m for m in offloaded.modules() if type(m).__name__.endswith(("Block", "DecoderLayer"))][1]
    expected = [m for m in model.modules() if type(m).__name__.endswith(("Block", "DecoderLayer"))][1]
    with pytest.raises(KeyError):
        with onloaded(offloaded, [block]):
            weights = [p for p in block.parameters()]
            raise KeyError("inside")
    assert [p.device.type for p in block.parameters()] == ["meta"] * len(weights)
    torch.testing.assert_close(weights, list(expected.parameters()))


@pytest.mark.parametrize("models", ["llama"], indirect=True)
def test_llm_attribution_of_an_offloaded_model(models, tokenizer):
    _, model, dispatched = models
    # generated on the offloaded model (its embedding on disk), then explained
    expected = LLMAttentionAttribution(ALTI(model), tokenizer).attribute("the keys to the cabinet", max_new_tokens=2)
    ours = LLMAttentionAttribution(ALTI(dispatched["disk"]), tokenizer).attribute("the keys to the cabinet", max_new_tokens=2)
    assert ours.output_tokens == expected.output_tokens
    torch.testing.assert_close(ours.token_attr, expected.token_attr, atol=1e-6, rtol=0)


@pytest.mark.parametrize("models", ["gpt2"], indirect=True)
def test_evaluator_runs_the_registered_methods_on_an_offloaded_model(models, tokenizer):
    # Built by name from the model, as the benchmark builds them (integrated gradients left out:
    # 50 passes of what input x gradient does once), compared with a fixed ranking; and one
    # method's faithfulness, measured by deleting tokens and running the offloaded model again.
    _, model, dispatched = models
    ids, mask = padded_batch(seed=5, batch=3, n=7)
    batches = [{"input_ids": ids, "attention_mask": mask, "labels": ids[:, 1], "position": mask.sum(1) - 1}]
    names = [name for name in (*METHOD_REGISTRY, *EXTRA_METHODS) if name != "integrated_gradients"]

    def evaluate(model: torch.nn.Module):
        later_first = {"position": lambda batch: torch.arange(7.0).expand(3, 7).clone()}
        scores = Evaluator(LastTokenLogits(model), names, later_first, show_progress=False, tokenizer=tokenizer).run(batches)
        metrics = Evaluator(
            LastTokenLogits(model), ["rollout"], {}, show_progress=False, faithfulness={"sufficiency": {"fractions": [0.5]}}
        ).run(batches)
        return scores.scores, metrics.metrics

    for expected, ours in zip(evaluate(model), evaluate(dispatched["disk"])):
        assert ours.keys() == expected.keys() and len(expected) >= 3
        for key, values in expected.items():
            torch.testing.assert_close(torch.as_tensor(ours[key]), torch.as_tensor(values), equal_nan=True, msg=str(key))


class LastTokenLogits(torch.nn.Module):
    """A language model's logits (B, V) at each row's last real token: the scores the Evaluator's
    faithfulness metrics delete tokens against."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        logits = self.model(input_ids, attention_mask=attention_mask).logits
        last = attention_mask.sum(1) - 1 if attention_mask is not None else torch.full_like(input_ids[:, 0], -1)
        return logits[torch.arange(len(logits)), last]


class Int8Linear(torch.nn.Linear):
    """A linear layer storing int8 weights and a scale, as quantized models do (bitsandbytes' are nn.Linear too)."""

    def __init__(self, linear: torch.nn.Linear) -> None:
        super().__init__(linear.in_features, linear.out_features, bias=linear.bias is not None)
        self.scale = float(linear.weight.detach().abs().max() / 127)
        self.weight = torch.nn.Parameter((linear.weight / self.scale).round().to(torch.int8), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.linear(x, self.weight.float() * self.scale, self.bias)


def test_quantized_output_projections_are_refused():
    model = transformers.LlamaModel(CONFIGS["llama"]()).eval()
    model.layers[0].self_attn.o_proj = Int8Linear(model.layers[0].self_attn.o_proj)
    with pytest.raises(TypeError, match="holds torch.int8 weights in a form this library cannot dequantize"):
        ALTI(model).attribute(torch.tensor([[5, 6, 7]]))


@pytest.mark.parametrize("models", ["llama"], indirect=True)
def test_benchmark_on_an_offloaded_language_model(models, tokenizer):
    datasets = pytest.importorskip("datasets")
    from captum_attnflow.benchmark import Columns, run_benchmark

    _, model, dispatched = models
    rows = datasets.Dataset.from_dict({"prompt": ["the keys to the cabinet", "the dog near the doors"], "target": ["are", "is"]})

    def leaderboard(model: torch.nn.Module) -> dict:
        return run_benchmark(
            model=model, tokenizer=tokenizer, dataset=rows, columns=Columns(target="target"), methods=["random"],
            n_resamples=9, show_progress=False,
        ).leaderboard.values

    # The benchmark's own path (rows, targets, deleting tokens, the metrics) on the offloaded
    # model, with its seeded floor: the methods on this model are tested above.
    expected, ours = leaderboard(model), leaderboard(dispatched["disk"])
    assert ours.keys() == expected.keys() and len(expected) >= 4
    for key, values in expected.items():
        np.testing.assert_allclose(ours[key], values, rtol=1e-5, atol=1e-6, err_msg=str(key))


@pytest.mark.parametrize("models", ["gpt2"], indirect=True)
def test_layerwise_recomputation_runs_the_offloaded_blocks_again(models):
    """Each recomputed block loads its weights again through accelerate's hooks (its own forward,
    which the recomputation wraps and puts back)."""
    _, model, dispatched = models
    ids, mask = padded_batch(seed=3, batch=3, n=7)
    for method in EXPLAINING_A_SCORE:
        expected = method(model, recompute=False).attribute(ids, attention_mask=mask, target=7)
        for layout, offloaded in dispatched.items():
            before = offload_state(offloaded)
            forwards = [vars(m).get("forward") for m in offloaded.modules()]
            ours = method(offloaded, recompute=True).attribute(ids, attention_mask=mask, target=7)
            torch.testing.assert_close(ours, expected, atol=1e-6, rtol=0, msg=f"{method.__name__}, {layout} offload")
            assert offload_state(offloaded) == before
            assert [vars(m).get("forward") for m in offloaded.modules()] == forwards
