"""AttnLRP against the authors' implementation (LXT, efficient mode) on tiny random float64 models.

For each family a tiny random model is built from its transformers config (seeded), cast to
float64 and saved with safetensors beside its inputs (two sequences of 9 tokens, the second
right-padded to 6; pixel values for ViT). ``captum_attnflow.AttnLRP`` explains them in this
process; a subprocess in LXT's environment loads the same files, applies LXT's rules and takes
:math:`R_j = \\sum_d e_{jd} \\partial y_t / \\partial e_{jd}` at the token embeddings, as LXT's
README does. The script prints, per family, how LXT's rules were applied and
``max |R_ours - R_LXT| / max |R_LXT|`` over both sequences.

How LXT's rules are applied (LXT at its GitHub HEAD runs on transformers 5 only through its
efficient mode, whose patch maps cover Llama, Qwen2, Qwen3, Qwen3-MoE, Gemma 3 and GPT-2):

* **shipped**: ``lxt.efficient.monkey_patch(modeling_X)`` with LXT's own patch map, where its
  default map has the family's modeling module.
* **composed**: LXT ships no efficient patch for the family that runs on transformers 5 (its
  BERT patch and its explicit-mode Mixtral, Phi-3 and BERT are transformers 4 copies that no
  longer import; its ViT is torchvision's, under CP-LRP), so the script patches the family's
  classes with LXT's own rule functions the way its shipped maps do: ``patch_attention`` on the
  modeling module, ``layer_norm_forward`` / ``rms_norm_forward`` on the norms,
  ``non_linear_forward`` on the activation classes, ``dropout_forward``; Phi-3's fused gate-up
  feed-forward as LXT's ``gated_mlp_forward`` (identity rule on the activation, the product's
  gradient halved); Mixtral's experts by LXT's Qwen3-MoE ``experts_forward`` (the same loop).
* **router held**: the mixtures again with the routing weights detached inside LXT's
  ``experts_forward`` (its halving of the weighted expert output undone), which is the rule
  ``captum_attnflow`` chooses: LXT gives the routing weights half of each expert's relevance.

Build LXT's environment once, apart from the project's (LXT is not a dependency): the same
torch and transformers as the project's environment, LXT's PyPI release for its other
dependencies, and LXT's GitHub HEAD first on the path::

    python -m venv /work/lxt-venv
    /work/lxt-venv/bin/pip install <the CPU build of torch 2.13.0>
    /work/lxt-venv/bin/pip install lxt==2.1 transformers==5.24.0 safetensors
    # lxt pulls torchvision, open_clip_torch and a CUDA torch: remove them (and the nvidia-* and
    # triton packages), then reinstall the CPU torch with --no-deps
    /work/lxt-venv/bin/pip uninstall -y torch torchvision open_clip_torch
    /work/lxt-venv/bin/pip install --no-deps <the CPU build of torch 2.13.0>
    git clone https://github.com/rachtibat/LRP-eXplains-Transformers /work/lxt-head

LXT's PyPI release on transformers 4.57 runs too, with its own BERT patch (``--lxt-python`` at
that environment; its ``lxt/efficient/models/__init__.py`` imports torchvision for its ViT
patch, which a CPU torch without torchvision needs removed).

Run from the project's environment (not part of the test command)::

    python benchmarks/lxt_agreement.py [--lxt-python /work/lxt-venv/bin/python] [--lxt-path /work/lxt-head]
                                       [--families qwen3 gemma3_text ...]
"""

from __future__ import annotations

import argparse
import importlib
import os
import platform
import subprocess
import tempfile
from pathlib import Path

import torch
import transformers
from safetensors import safe_open
from safetensors.torch import load_file, save_file

_DECODER = dict(vocab_size=60, hidden_size=32, num_attention_heads=4, intermediate_size=64, num_hidden_layers=2,
                max_position_embeddings=64, initializer_range=0.2, pad_token_id=0, bos_token_id=0, eos_token_id=0)
_GROUPED = dict(num_key_value_heads=2, head_dim=8)
# model_type -> (config overrides, head)
FAMILIES: dict[str, tuple[dict, str]] = {
    "llama": (_GROUPED, "causal"),
    "qwen2": (dict(num_key_value_heads=2), "causal"),
    "qwen3": (dict(use_sliding_window=True, sliding_window=4, max_window_layers=1, **_GROUPED), "causal"),
    "qwen3_moe": (dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, norm_topk_prob=True,
                       mlp_only_layers=[0], **_GROUPED), "causal"),
    "gemma3_text": (dict(sliding_window=4, layer_types=["sliding_attention", "full_attention"], **_GROUPED), "causal"),
    "gpt2": (dict(n_embd=32, n_head=4, n_layer=2, n_positions=64), "causal"),
    "mixtral": (dict(num_key_value_heads=2, sliding_window=4, num_local_experts=4, num_experts_per_tok=2), "causal"),
    "phi3": (dict(num_key_value_heads=2, sliding_window=4), "causal"),
    "opt": (dict(ffn_dim=64, word_embed_proj_dim=32, init_std=0.2), "causal"),
    "bert": ({}, "classifier"),
    "vit": (dict(image_size=16, patch_size=8, num_channels=3), "vision"),
}
MIXTURES = {"qwen3_moe", "mixtral"}
_TARGETS = [7, 23]


def build(model_type: str, directory: Path) -> None:
    """The tiny float64 model of ``model_type`` and its inputs, saved in ``directory``."""
    overrides, head = FAMILIES[model_type]
    torch.manual_seed(0)
    if head == "vision":
        config = transformers.AutoConfig.for_model(model_type, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                                   intermediate_size=64, initializer_range=0.2, num_labels=3, **overrides)
        model = transformers.AutoModelForImageClassification.from_config(config)
        inputs = {"pixel_values": torch.randn(2, 3, 16, 16, generator=torch.Generator().manual_seed(0)).double()}
    else:
        config = transformers.AutoConfig.for_model(model_type, **{**_DECODER, **overrides})
        if head == "classifier":
            config.num_labels = 3
            model = transformers.AutoModelForSequenceClassification.from_config(config)
        else:
            model = transformers.AutoModelForCausalLM.from_config(config)
        ids = torch.randint(5, 60, (2, 9), generator=torch.Generator().manual_seed(0))
        mask = torch.ones_like(ids)
        mask[1, 6:] = 0
        inputs = {"input_ids": ids * mask, "attention_mask": mask}
    with torch.no_grad():  # nonzero biases (transformers initialises them to 0), so their share is exercised
        for name, parameter in model.named_parameters():
            if name.endswith("bias"):
                parameter.uniform_(-0.2, 0.2)
    model.double().save_pretrained(directory)
    save_file({name: tensor.contiguous() for name, tensor in inputs.items()}, directory / "inputs.safetensors")


def _load(model_type: str, directory: Path) -> torch.nn.Module:
    head = FAMILIES[model_type][1]
    auto = {"causal": transformers.AutoModelForCausalLM, "classifier": transformers.AutoModelForSequenceClassification,
            "vision": transformers.AutoModelForImageClassification}[head]
    extra = dict(experts_implementation="eager") if model_type in MIXTURES else {}  # the loop runs in float64
    return auto.from_pretrained(directory, dtype=torch.float64, **extra).eval()


def _explained(model_type: str, output: torch.Tensor, inputs: dict) -> torch.Tensor:
    """(B,) the explained logits: target 7 and 23, at each sequence's last real token for a decoder."""
    targets = torch.tensor(_TARGETS[: output.shape[0]]) % output.shape[-1]
    if output.dim() == 3:
        last = inputs["attention_mask"].sum(1) - 1
        output = output[torch.arange(output.shape[0]), last]
    return output[torch.arange(output.shape[0]), targets]


def ours(model_type: str, directory: Path) -> torch.Tensor:
    from captum_attnflow import AttnLRP

    model, inputs = _load(model_type, directory), load_file(directory / "inputs.safetensors")
    targets = torch.tensor(_TARGETS) % (model.config.num_labels if FAMILIES[model_type][1] != "causal" else 60)
    if "pixel_values" in inputs:
        return AttnLRP(model).attribute(inputs["pixel_values"], target=targets)
    return AttnLRP(model).attribute(inputs["input_ids"], target=targets, attention_mask=inputs["attention_mask"])


# ---------------------------------------------------------------- in LXT's environment


def _modeling(model_type: str):
    package = {"gemma3_text": "gemma3"}.get(model_type, model_type)
    return importlib.import_module(f"transformers.models.{package}.modeling_{package}")


class _Doubled(torch.autograd.Function):
    """``x``, its gradient doubled (undoes the halving of LXT's ``experts_forward`` once the
    routing weights are held)."""

    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, gradient):
        return 2 * gradient


def _patch_lxt(model_type: str, router_held: bool) -> str:
    """LXT's rules on the family's classes; returns "shipped" (LXT's own patch map) or "composed"."""
    from functools import partial

    from lxt.efficient import monkey_patch
    from lxt.efficient.models import DEFAULT_MAP
    from lxt.efficient.patches import (
        dropout_forward,
        layer_norm_forward,
        non_linear_forward,
        patch_attention,
        patch_method,
        rms_norm_forward,
    )
    from lxt.efficient.rules import divide_gradient, identity_rule_implicit

    modeling = _modeling(model_type)
    how = "shipped" if modeling in DEFAULT_MAP else "composed"
    if model_type in MIXTURES:
        from lxt.efficient.models.qwen3_moe import experts_forward
    if how == "shipped":
        monkey_patch(modeling)
    else:
        patch_map = {torch.nn.Dropout: partial(patch_method, dropout_forward), modeling: patch_attention}
        if model_type in ("bert", "vit", "opt"):
            patch_map[torch.nn.LayerNorm] = partial(patch_method, layer_norm_forward)
            for activation in (transformers.activations.GELUActivation, torch.nn.Tanh, torch.nn.ReLU):
                patch_map[activation] = partial(patch_method, non_linear_forward, keep_original=True)
        elif model_type == "phi3":

            def phi3_mlp_forward(self, x):  # LXT's gated_mlp_forward on the fused gate-up projection
                gate, up = self.gate_up_proj(x).chunk(2, dim=-1)
                return self.down_proj(divide_gradient(identity_rule_implicit(self.activation_fn, gate) * up, 2))

            patch_map[modeling.Phi3MLP] = partial(patch_method, phi3_mlp_forward)
            patch_map[modeling.Phi3RMSNorm] = partial(patch_method, rms_norm_forward)
        elif model_type == "mixtral":
            patch_map[modeling.MixtralExperts] = partial(patch_method, experts_forward)
            patch_map[modeling.MixtralRMSNorm] = partial(patch_method, rms_norm_forward)
        monkey_patch(modeling, patch_map)
    if router_held:
        experts = modeling.Qwen3MoeExperts if model_type == "qwen3_moe" else modeling.MixtralExperts

        def held(self, hidden_states, top_k_index, top_k_weights):
            return _Doubled.apply(experts_forward(self, hidden_states, top_k_index, top_k_weights.detach()))

        experts.forward = held
    return how


def lxt(model_type: str, directory: Path, router_held: bool) -> None:
    """LXT's relevance of every token, written to ``directory/lxt.safetensors``."""
    how = _patch_lxt(model_type, router_held)
    model, inputs = _load(model_type, directory), load_file(directory / "inputs.safetensors")
    for parameter in model.parameters():
        parameter.requires_grad_(False)
    if "pixel_values" in inputs:  # the embedded sequence as the leaf; each token: its class token or patch
        embeddings = model.vit.embeddings
        kept = {}

        def patches(module, args, output):
            kept["patches"] = output

        def leaf(module, args, output):
            kept["leaf"] = output.detach().requires_grad_()
            return kept["leaf"]

        handles = [embeddings.patch_embeddings.register_forward_hook(patches), embeddings.register_forward_hook(leaf)]
        output = model(inputs["pixel_values"]).logits
        for handle in handles:
            handle.remove()
        (gradient,) = torch.autograd.grad(_explained(model_type, output, inputs).sum(), kept["leaf"])
        tokens = torch.cat([embeddings.cls_token.expand(2, 1, -1), kept["patches"]], 1)
    else:  # LXT's README: the input embeddings as inputs_embeds, relevance = embedding x gradient
        tokens = model.get_input_embeddings()(inputs["input_ids"]).detach().requires_grad_()
        extra = dict(use_cache=False) if FAMILIES[model_type][1] == "causal" else {}
        output = model(inputs_embeds=tokens, attention_mask=inputs["attention_mask"], **extra).logits
        (gradient,) = torch.autograd.grad(_explained(model_type, output, inputs).sum(), tokens)
    relevance = (tokens * gradient).sum(-1).detach()
    if "attention_mask" in inputs:
        relevance = relevance * inputs["attention_mask"]
    save_file({"relevance": relevance.contiguous()}, directory / "lxt.safetensors", metadata={"rules": how})


# ---------------------------------------------------------------- driver


def _run_lxt(arguments, model_type: str, directory: Path, router_held: bool) -> tuple[torch.Tensor | None, str]:
    """LXT's relevance and how its rules were applied, or None and the error that stopped it."""
    environment = {**os.environ, "PYTHONPATH": arguments.lxt_path}
    command = [arguments.lxt_python, __file__, "--in-lxt", model_type, str(directory)] + (["--router-held"] if router_held else [])
    done = subprocess.run(command, env=environment, capture_output=True, text=True)
    if done.returncode != 0:
        return None, "fails: " + done.stderr.strip().splitlines()[-1]
    with safe_open(directory / "lxt.safetensors", "pt") as saved:
        return saved.get_tensor("relevance"), saved.metadata()["rules"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--lxt-python", default="/work/lxt-venv/bin/python")
    parser.add_argument("--lxt-path", default="/work/lxt-head")
    parser.add_argument("--families", nargs="*", default=list(FAMILIES))
    parser.add_argument("--in-lxt", nargs=2, metavar=("MODEL_TYPE", "DIRECTORY"), help=argparse.SUPPRESS)
    parser.add_argument("--router-held", action="store_true", help=argparse.SUPPRESS)
    arguments = parser.parse_args()
    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()
    if arguments.in_lxt:
        lxt(arguments.in_lxt[0], Path(arguments.in_lxt[1]), arguments.router_held)
        return
    version = subprocess.run([arguments.lxt_python, "-c", "import transformers, torch; print(transformers.__version__, torch.__version__)"],
                             capture_output=True, text=True).stdout.split()
    head = subprocess.run(["git", "-C", arguments.lxt_path, "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    print(f"ours: transformers {transformers.__version__}, torch {torch.__version__}; LXT {head or arguments.lxt_path}: "
          f"transformers {version[0]}, torch {version[1]}; {platform.processor() or platform.machine()}, float64")
    print("| family | LXT's rules | max abs diff / max abs relevance | max abs relevance | sum of relevance (ours) |")
    print("|---|---|---|---|---|")
    for model_type in arguments.families:
        with tempfile.TemporaryDirectory() as name:
            directory = Path(name)
            build(model_type, directory)
            relevance = ours(model_type, directory)
            for router_held in ([False, True] if model_type in MIXTURES else [False]):
                theirs, how = _run_lxt(arguments, model_type, directory, router_held)
                how += ", router held" if router_held else ""
                if theirs is None:
                    print(f"| {model_type} | {how} | | | |")
                    continue
                scale = float(theirs.abs().max())
                difference = float((relevance - theirs).abs().max())
                print(f"| {model_type} | {how} | {difference / scale:.1e} | {scale:.3f} | {float(relevance.sum()):.3f} |")


if __name__ == "__main__":
    main()
