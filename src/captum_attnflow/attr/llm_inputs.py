"""What :class:`~captum_attnflow.attr.llm.LLMAttentionAttribution` prepares before attributing: the
prompt's and the target's token ids, checked against the model's positions; padding a batch of
them; the keywords the wrapped method takes."""

from __future__ import annotations

import contextlib
import inspect
from typing import Any, Iterator

import torch
from captum.attr import Attribution, TextTokenInput
from torch import Tensor, nn

from captum_attnflow.hf import check_token_ids


class TokenPreparation:
    """The token ids of prompts and targets for a wrapper holding ``model``, ``tokenizer`` and
    ``encoder_decoder``: a mixin of :class:`~captum_attnflow.attr.llm.LLMAttentionAttribution`."""

    model: nn.Module
    tokenizer: Any
    encoder_decoder: bool

    def _text_input(self, prompt: Any) -> TextTokenInput:
        if not isinstance(prompt, str):
            raise TypeError(f"inp must be a prompt string or captum.attr.TextTokenInput, got {type(prompt).__name__}.")
        return TextTokenInput(prompt, self.tokenizer)

    def _prompt_ids(self, text: TextTokenInput, device: torch.device) -> Tensor:
        """The prompt's token ids (n_in,), checked: some text, in the vocabulary, within the positions."""
        ids = text.inp_tensor[0].to(device)
        special = set(getattr(self.tokenizer, "all_special_ids", ()))
        if all(token in special for token in ids.tolist()):
            raise ValueError(
                f"the prompt is empty: it holds no token besides the tokenizer's special ones "
                f"({self.tokenizer.convert_ids_to_tokens(ids.tolist())}); pass the text to continue."
            )
        check_token_ids(ids[None], self.model)
        room = self._room(ids)
        if room is not None and room < 1:
            raise ValueError(
                f"the prompt has {ids.numel()} tokens but {type(self.model).__name__} has {self._positions()} "
                f"positions{'' if self.encoder_decoder else ', one of them for the first output token'}; "
                "shorten the prompt."
            )
        return ids

    def _positions(self) -> int | None:
        """The longest input the model's position embeddings allow, None when unbounded (relative positions)."""
        config = self.model.config
        for name in ("n_positions", "max_position_embeddings"):
            if isinstance(getattr(config, name, None), int):
                return getattr(config, name)
        return None

    def _room(self, prompt: Tensor) -> int | None:
        """How many output tokens fit in the positions after ``prompt`` (n_in,), None if unbounded.

        A decoder-only model reads prompt + target; an encoder-decoder's encoder reads the prompt
        (room 0 if it does not fit) and its decoder the start token and all output tokens but the last.
        """
        positions = self._positions()
        if positions is None:
            return None
        if self.encoder_decoder:
            return positions if prompt.numel() <= positions else 0
        return positions - prompt.numel()

    def _target_ids(self, prompt: Tensor, target: Any, max_new_tokens: int, device: torch.device) -> Tensor:
        """The output token ids (n_out,): the target's, or the greedy continuation of ``prompt``
        (at most ``max_new_tokens``, and no more than the model's positions leave)."""
        room = self._room(prompt)
        if isinstance(target, str):
            ids = torch.tensor(self.tokenizer.encode(target, add_special_tokens=False), dtype=torch.long, device=device)
        elif isinstance(target, Tensor):
            if target.dtype == torch.bool or target.dtype.is_floating_point or target.dtype.is_complex:
                raise TypeError(
                    f"target as a tensor must hold integer token ids, got dtype {target.dtype}; pass e.g. "
                    "torch.tensor(tokenizer.encode(text, add_special_tokens=False)), or the text itself."
                )
            if target.dim() != 1:
                raise ValueError(f"target as a tensor must be 1-D token ids (n_out,), got shape {tuple(target.shape)}.")
            ids = target.to(device, torch.long)
        elif target is None:
            with eval_mode(self.model):
                generated = self.model.generate(
                    input_ids=prompt[None],
                    attention_mask=torch.ones_like(prompt)[None],
                    max_new_tokens=max_new_tokens if room is None else min(max_new_tokens, room),
                    do_sample=False,
                    num_beams=1,
                    pad_token_id=pad_id(self.tokenizer, self.model),
                )[0]
            # a causal LM returns the prompt and the continuation; an encoder-decoder its start token first
            ids = generated[1:] if self.encoder_decoder else generated[prompt.numel() :]
        else:
            raise TypeError(f"target must be a string, a 1-D tensor of token ids or None, got {type(target).__name__}.")
        if ids.numel() == 0:
            raise ValueError("the target has no tokens: pass a non-empty target, or None to generate one.")
        try:
            check_token_ids(ids[None], self.model)
        except ValueError as error:
            raise ValueError(f"target: {error}") from None
        if room is not None and ids.numel() > room:
            lengths = f"{ids.numel()}" if self.encoder_decoder else f"{prompt.numel()} + {ids.numel()}"
            raise ValueError(
                f"{'the target has' if self.encoder_decoder else 'prompt and target have'} {lengths} tokens but "
                f"{type(self.model).__name__} has {self._positions()} positions; shorten the "
                f"{'target' if self.encoder_decoder else 'prompt or the target'}."
            )
        return ids


def pad(sequences: list[Tensor], pad_id: int, side: str) -> tuple[Tensor, Tensor, list[int]]:
    """Stack 1-D id tensors into (B, N) ids and mask, padded on ``side``; each one's offset."""
    width = max(s.numel() for s in sequences)
    ids = sequences[0].new_full((len(sequences), width), pad_id)
    mask = torch.zeros_like(ids)
    offsets = []
    for row, sequence in enumerate(sequences):
        offset = width - sequence.numel() if side == "left" else 0
        ids[row, offset : offset + sequence.numel()] = sequence
        mask[row, offset : offset + sequence.numel()] = 1
        offsets.append(offset)
    return ids, mask, offsets


def pad_id(tokenizer: Any, model: nn.Module) -> int:
    """The id padding is written with: the tokenizer's pad token, else the model's pad or end token, else 0."""
    for value in (getattr(tokenizer, "pad_token_id", None), model.config.pad_token_id, model.config.eos_token_id):
        if isinstance(value, int):
            return value
    return 0  # any id will do: padding is masked out


# Set by the wrapper itself for each call.
_WRAPPER_ARGUMENTS = ("inputs", "additional_forward_args", "position", "layer", "attention_mask")


def check_options(method: Attribution, kwargs: dict) -> None:
    """Refuse keywords ``method.attribute`` does not take, or that the wrapper sets, naming those it takes."""
    taken = [name for name in inspect.signature(type(method).attribute).parameters if name not in ("self", *_WRAPPER_ARGUMENTS)]
    unknown = sorted(set(kwargs) - set(taken))
    if unknown:
        raise TypeError(
            f"{type(method).__name__} through LLMAttentionAttribution takes no {', '.join(unknown)}: layer is the "
            f"wrapper's own argument, positions and masks come from the prompt; it takes {', '.join(taken)}."
        )


def default(method: Attribution, name: str) -> Any:
    """The default value of the keyword ``name`` of ``method.attribute``."""
    return inspect.signature(type(method).attribute).parameters[name].default


@contextlib.contextmanager
def eval_mode(model: nn.Module) -> Iterator[None]:
    """Generate without dropout; every submodule's own mode comes back afterwards."""
    modes = [(module, module.training) for module in model.modules()]
    model.eval()
    try:
        yield
    finally:
        for module, mode in modes:
            module.training = mode
