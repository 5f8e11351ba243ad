"""Models dispatched by accelerate (``from_pretrained(..., device_map=...)``): layers on several
devices, weights offloaded to the CPU or to disk.

Accelerate wraps each module's forward with a hook (``module._hf_hook``): an ``AlignDevicesHook``
moves the module's inputs to its execution device and, for an offloaded module, loads its
weights there in ``pre_forward`` and puts them back on the ``meta`` device in ``post_forward``.
Outside its forward an offloaded module's weights are therefore empty ``meta`` tensors. The
methods that read weights directly (ALTI's and value zeroing's output projection, the
LayerNorms) read them inside :func:`onloaded`, which calls the same two hook methods
accelerate's own ``align_module_device`` calls; every other module is simply called, and its
hook does the rest. :func:`offloading_kept` puts weights back where a forward that raised left
them loaded. Nothing here imports accelerate: a model that has its hooks has it installed.
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterable, Iterator

from torch import nn

from captum_attnflow.hf.models import accelerate_hooks


def _offloading_hooks(module: nn.Module) -> list[Any]:
    """The hooks on ``module`` that load its weights at each forward (``AlignDevicesHook(offload=True)``)."""
    return [hook for hook in accelerate_hooks(module) if getattr(hook, "offload", False) and hasattr(hook, "weights_map")]


@contextlib.contextmanager
def onloaded(model: nn.Module, modules: Iterable[nn.Module]) -> Iterator[None]:
    """Context manager: inside the block the parameters of ``modules`` (inside ``model``) and of
    their submodules are real tensors on their execution devices, also where accelerate
    offloaded them to the CPU or disk; on exit they are offloaded again, also after an exception.

    Each offloading hook that places them (on the module, below it, or above it with
    ``place_submodules``) runs its ``pre_forward`` on entry and ``post_forward`` on exit, as
    ``accelerate.utils.align_module_device`` does. Tensors read inside the block stay valid
    after it (offloading replaces the module's parameters by ``meta`` ones, it frees no tensor
    still referenced). A model without offloaded weights is left alone.

    Example::

        >>> import torch
        >>> from accelerate import cpu_offload
        >>> from captum_attnflow.hf.dispatch import onloaded
        >>> model = cpu_offload(torch.nn.Sequential(torch.nn.Linear(2, 2)), torch.device("cpu"))
        >>> model[0].weight.device.type
        'meta'
        >>> with onloaded(model, [model[0]]):
        ...     weight = model[0].weight
        >>> weight.device.type, model[0].weight.device.type
        ('cpu', 'meta')
    """
    wanted = {id(m) for m in modules}
    names = {id(m): name for name, m in model.named_modules()}
    targets = [names[key] for key in wanted if key in names]

    def covers(name: str, hook: Any) -> bool:
        spreads = bool(getattr(hook, "place_submodules", False))
        return any(
            not target or name == target or name.startswith(f"{target}.")  # the module or below it
            or (spreads and (not name or target.startswith(f"{name}.")))  # above it, placing its submodules
            for target in targets
        )

    with contextlib.ExitStack() as stack:
        for name, module in model.named_modules():
            for hook in _offloading_hooks(module):
                if covers(name, hook):
                    hook.pre_forward(module)
                    stack.callback(hook.post_forward, module, None)
        yield


def _offloaded(module: nn.Module) -> list[tuple[nn.Module, Any]]:
    """``(module, hook)`` for every offloading hook in ``module`` whose weights are on ``meta`` now."""
    found = []
    for submodule in module.modules():
        for hook in _offloading_hooks(submodule):
            tensors = list(submodule.parameters(recurse=bool(getattr(hook, "place_submodules", False))))
            if tensors and all(t.device.type == "meta" for t in tensors):
                found.append((submodule, hook))
    return found


@contextlib.contextmanager
def offloading_kept(module: nn.Module) -> Iterator[None]:
    """Context manager: every module of ``module`` whose weights accelerate offloaded on entry has
    them offloaded again on exit. Accelerate's hooks put weights back in ``post_forward``, which a
    forward that raises never reaches; this runs it for them."""
    offloaded = _offloaded(module)
    try:
        yield
    finally:
        for submodule, hook in offloaded:
            tensors = list(submodule.parameters(recurse=bool(getattr(hook, "place_submodules", False))))
            if any(t.device.type != "meta" for t in tensors):
                hook.post_forward(submodule, None)
