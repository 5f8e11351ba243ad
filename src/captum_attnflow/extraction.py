"""Getting attention maps out of Hugging Face models or user callables, leaving the model unchanged.

Transformers 5 loads models with ``sdpa`` attention, which returns an empty ``attentions``
tuple for ``output_attentions=True``. :func:`eager_attention` switches every Hugging Face
model inside a module to eager attention for one call and restores each one's own setting
afterwards, also when the call raises.
"""

from __future__ import annotations

import contextlib
import inspect
from typing import Any, Callable, Iterator

import torch
from torch import Tensor, nn

try:  # transformers is a dependency, but keep the callable path usable without it
    from transformers import PreTrainedModel
except ImportError:  # pragma: no cover
    PreTrainedModel = ()  # type: ignore[assignment,misc]


def extract_attentions(
    forward_func: Callable[..., Any],
    inputs: Tensor,
    additional_forward_args: Any = None,
    attention_mask: Tensor | None = None,
) -> tuple[Tensor, ...]:
    """Run ``forward_func`` once without gradients and return its attentions, L tensors (B, H, n, n).

    ``forward_func`` may be

    * a Hugging Face model: called as ``model(inputs, *additional_forward_args,
      attention_mask=attention_mask, output_attentions=True)`` with eager attention. With left
      padding it also gets ``position_ids`` counted over real tokens, as ``generate`` does, so a
      padded sentence is encoded exactly as it is alone (models whose position embedding has a
      ``padding_idx``, like RoBERTa, count positions from the pad token themselves). Of an
      encoder-decoder model (T5, BART, ...) only the encoder runs: its self-attentions are the
      ones over the input tokens;
    * any ``nn.Module`` (or bound method of one) that contains a Hugging Face model, e.g. a
      classifier or sentence-embedding wrapper: called as
      ``forward_func(inputs, *additional_forward_args)`` while the attentions of its outermost
      Hugging Face model are captured. With padding, the wrapper must pass the mask on to the
      model itself (e.g. through ``additional_forward_args``); it is an error if it does not.
      An encoder-decoder model called by the wrapper gives its encoder's attentions;
    * any other callable ``forward_func(inputs, *additional_forward_args)`` that returns the
      attentions: a sequence of (B, H, n, n) tensors, an (L, B, H, n, n) tensor, or an object
      with an ``attentions`` attribute.

    Modules run in eval mode for the call (attention dropout would make the maps random and
    their rows not sum to 1); each submodule's mode, the forward hooks and the attention
    implementation are restored afterwards, also when the call raises.

    Args:
        forward_func: a Hugging Face model, a module or bound method containing one, or a
            callable returning attentions (see above).
        inputs: token ids (B, n) (or whatever ``forward_func`` takes first).
        additional_forward_args: extra positional arguments passed after ``inputs``: one
            value, a tuple of them, or None.
        attention_mask: (B, n), 1 on real tokens, 0 on padding; passed to a Hugging Face
            model as ``attention_mask``. Optional.

    Returns:
        tuple[Tensor, ...]: L tensors (B, H, n, n), one per layer, row = query, detached.

    Raises:
        ValueError: the inputs are not on the model's device, no attentions come back, or a
            wrapper drops the attention mask of a padded batch.

    Example::

        >>> import torch
        >>> from transformers import BertConfig, BertModel
        >>> from captum_attnflow import extract_attentions
        >>> model = BertModel(BertConfig(num_hidden_layers=2, hidden_size=32,
        ...     num_attention_heads=2, intermediate_size=64)).eval()
        >>> attentions = extract_attentions(model, torch.tensor([[101, 7592, 102]]))
        >>> len(attentions), attentions[0].shape
        (2, torch.Size([1, 2, 3, 3]))
    """
    args = _as_tuple(additional_forward_args)
    module = _owning_module(forward_func)
    if module is not None:
        _check_device(module, inputs)
    if attention_mask is not None:
        attention_mask = torch.as_tensor(attention_mask).to(inputs.device)
    with torch.no_grad():
        if isinstance(forward_func, PreTrainedModel):
            model = _encoder_of(forward_func, args)
            with eager_attention(forward_func), _unchanged(forward_func):
                kwargs: dict[str, Any] = {"output_attentions": True}
                if attention_mask is not None:
                    kwargs["attention_mask"] = attention_mask
                    kwargs.update(_left_padding_positions(model, attention_mask, len(args)))
                output = model(inputs, *args, **kwargs)
        elif module is not None and _hf_models(module):
            with _unchanged(module):
                output = _captured_attentions(module, lambda: forward_func(inputs, *args), attention_mask)
        else:
            output = forward_func(inputs, *args)
    return _attentions_of(output)


@contextlib.contextmanager
def eager_attention(module: nn.Module) -> Iterator[None]:
    """Context manager: every Hugging Face model inside ``module`` uses eager attention.

    Transformers 5 defaults to ``sdpa`` attention, which computes no attention weights, so
    ``output_attentions=True`` gives an empty tuple. Each model's own attention implementation
    is restored on exit, also after an exception. :func:`extract_attentions` uses it; call it
    yourself to get attentions from a model you run directly.

    Args:
        module: a Hugging Face model, or any ``nn.Module`` containing some.

    Yields:
        None; inside the block the models compute eager attention.

    Example::

        >>> import torch
        >>> from transformers import BertConfig, BertModel
        >>> from captum_attnflow import eager_attention
        >>> model = BertModel(BertConfig(num_hidden_layers=2, hidden_size=32, num_attention_heads=2,
        ...     intermediate_size=64, attn_implementation="sdpa")).eval()
        >>> ids = torch.tensor([[101, 7592, 102]])
        >>> len(model(ids, output_attentions=True).attentions)  # sdpa computes no weights
        0
        >>> with eager_attention(model):
        ...     output = model(ids, output_attentions=True)
        >>> len(output.attentions), model.config._attn_implementation  # restored afterwards
        (2, 'sdpa')
    """
    configs = _configs(_hf_models(module))
    saved = {key: config._attn_implementation for key, config in configs.items()}
    try:
        for model in _outermost(_hf_models(module)):
            if model.config._attn_implementation != "eager":
                model.set_attn_implementation("eager")
        yield
    finally:
        # set_attn_implementation re-resolves sub-configs from the top-level request, which
        # could differ from what each sub-model had; writing back each config's own value
        # restores exactly what was there.
        for key, config in configs.items():
            config._attn_implementation_internal = saved[key]


_HOOK_DICTS = (
    "_forward_hooks",
    "_forward_hooks_with_kwargs",
    "_forward_hooks_always_called",
    "_forward_pre_hooks",
    "_forward_pre_hooks_with_kwargs",
)
_HOOKS_INSTALLED = "_output_capturing_hooks_installed"


@contextlib.contextmanager
def _unchanged(module: nn.Module) -> Iterator[None]:
    """Run the block with ``module`` in eval mode; restore modes and forward hooks on exit.

    The first time a transformers 5 model is asked for attentions it installs output-capturing
    hooks on its layers and keeps them (flagged by ``_output_capturing_hooks_installed``); the
    user's model must come back with exactly the hooks it had, also after an exception.
    """
    modules = list(module.modules())
    modes = [m.training for m in modules]
    hooks = [{name: set(getattr(m, name, {})) for name in _HOOK_DICTS} for m in modules]
    flags = [m.__dict__.get(_HOOKS_INSTALLED) for m in modules]
    module.eval()
    try:
        yield
    finally:
        for m, mode, before, flag in zip(modules, modes, hooks, flags):
            m.training = mode
            for name, keys in before.items():
                added = getattr(m, name, {})
                for key in [key for key in added if key not in keys]:
                    del added[key]
            if flag is None:
                m.__dict__.pop(_HOOKS_INSTALLED, None)
            else:
                m.__dict__[_HOOKS_INSTALLED] = flag


def _captured_attentions(
    module: nn.Module, call: Callable[[], Any], attention_mask: Tensor | None = None
) -> tuple[Tensor, ...]:
    """Call ``call()`` and return the attentions of the outermost Hugging Face model in ``module``.

    With a padded ``attention_mask``, raises if the model is called without a mask.
    """
    captured: list[Any] = []
    targets = _outermost(_hf_models(module))
    saved = [model.config.output_attentions for model in targets]
    padded = attention_mask is not None and not bool(attention_mask.bool().all())

    def check_mask(model: nn.Module, args: tuple, kwargs: dict) -> None:
        if padded and _call_argument(model, args, kwargs, "attention_mask") is None:
            raise ValueError(
                f"attention_mask marks padding, but {type(module).__name__} calls its "
                f"{type(model).__name__} without an attention_mask, so padding would influence real "
                "tokens; make the wrapper pass the mask on (e.g. through additional_forward_args)."
            )

    def keep_output(_module: nn.Module, _args: Any, output: Any) -> None:
        captured.append(output)

    handles = [model.register_forward_pre_hook(check_mask, with_kwargs=True) for model in targets]
    handles += [model.register_forward_hook(keep_output) for model in targets]
    try:
        with eager_attention(module):
            for model in targets:
                model.config.output_attentions = True
            call()
    finally:
        for handle in handles:
            handle.remove()
        for model, value in zip(targets, saved):
            model.config.output_attentions = value
    if not captured:
        raise ValueError(
            f"{type(module).__name__} never called its Hugging Face model, so no attentions were captured; "
            "pass the Hugging Face model itself as forward_func."
        )
    return _attentions_of(captured[0])


def _encoder_of(model: PreTrainedModel, args: tuple) -> nn.Module:
    """The module to run for the attentions over the input tokens: the encoder of an
    encoder-decoder model (T5, BART, ...), else the model itself."""
    if not getattr(model.config, "is_encoder_decoder", False):
        return model
    if args:
        raise ValueError(
            f"{type(model).__name__} is an encoder-decoder model: the attention methods explain its input "
            "tokens through the encoder's self-attention and run the encoder alone, which takes no "
            "additional_forward_args; drop them (decoder inputs do not change the encoder's attentions)."
        )
    return model.get_encoder()


def _left_padding_positions(model: nn.Module, attention_mask: Tensor, num_args: int) -> dict[str, Tensor]:
    """``position_ids`` counted over real tokens when ``attention_mask`` has left padding, else nothing.

    Without them absolute positions would start on the padding, and a left-padded sentence
    would be encoded differently from the same sentence alone.
    """
    mask = attention_mask.long()
    real_after = mask.flip(-1).cummax(-1).values.flip(-1)  # 1 where a real token is here or later
    left_padded = bool((real_after > mask).any())
    parameters = list(inspect.signature(model.forward).parameters)
    takes_positions = "position_ids" in parameters and parameters.index("position_ids") >= num_args + 1
    counts_from_pad_token = any(
        isinstance(m, nn.Embedding) and m.padding_idx is not None and name.endswith("position_embeddings")
        for name, m in model.named_modules()
    )
    if not left_padded or not takes_positions or counts_from_pad_token:
        return {}
    return {"position_ids": (mask.cumsum(-1) - 1).clamp_min(0)}


def _call_argument(model: nn.Module, args: tuple, kwargs: dict, name: str) -> Any:
    """The value ``model.forward`` receives for ``name`` from a call with ``args`` and ``kwargs``."""
    if name in kwargs:
        return kwargs[name]
    parameters = list(inspect.signature(model.forward).parameters)
    index = parameters.index(name) if name in parameters else len(args)
    return args[index] if index < len(args) else None


def _attentions_of(output: Any) -> tuple[Tensor, ...]:
    # An encoder-decoder output has no .attentions: its input tokens' are the encoder's.
    attentions = getattr(output, "attentions", getattr(output, "encoder_attentions", output))
    if isinstance(attentions, Tensor):
        attentions = tuple(attentions) if attentions.dim() == 5 else None
    if isinstance(attentions, (tuple, list)) and attentions and all(isinstance(a, Tensor) for a in attentions):
        return tuple(attentions)
    raise ValueError(
        "the model returned no attentions. A Hugging Face model must support output_attentions=True "
        "(eager attention is switched on automatically); a custom forward_func must return a sequence "
        f"of (B, H, n, n) attention tensors, an (L, B, H, n, n) tensor or an object with .attentions; got {type(output).__name__}."
    )


def _owning_module(forward_func: Any) -> nn.Module | None:
    if isinstance(forward_func, nn.Module):
        return forward_func
    owner = getattr(forward_func, "__self__", None)
    return owner if isinstance(owner, nn.Module) else None


def _hf_models(module: nn.Module) -> list[nn.Module]:
    return [m for m in module.modules() if isinstance(m, PreTrainedModel)] if PreTrainedModel else []


def _configs(models: list[nn.Module]) -> dict[int, Any]:
    """The configs of ``models`` and, recursively, their sub-configs (keyed by id: configs are not hashable).

    ``set_attn_implementation`` also rewrites sub-configs that no sub-model owns.
    """
    configs: dict[int, Any] = {}
    pending = [model.config for model in models]
    while pending:
        config = pending.pop()
        if id(config) not in configs:
            configs[id(config)] = config
            subs = (getattr(config, key, None) for key in getattr(config, "sub_configs", {}))
            pending.extend(sub for sub in subs if sub is not None)
    return configs


def _outermost(models: list[nn.Module]) -> list[nn.Module]:
    """Models not contained in another model of the list (``modules()`` lists parents first)."""
    inner: set[int] = set()
    outer = []
    for model in models:
        if id(model) not in inner:
            outer.append(model)
            inner.update(id(m) for m in model.modules() if m is not model)
    return outer


def _check_device(module: nn.Module, inputs: Tensor) -> None:
    parameter = next(module.parameters(), None)
    if parameter is not None and parameter.device != inputs.device:
        raise ValueError(
            f"inputs are on {inputs.device} but the model is on {parameter.device}; "
            f"move them with inputs.to({str(parameter.device)!r})."
        )


def _as_tuple(args: Any) -> tuple:
    if args is None:
        return ()
    return args if isinstance(args, tuple) else (args,)
