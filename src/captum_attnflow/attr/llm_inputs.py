"""What :class:`~captum_attnflow.attr.llm.LLMAttentionAttribution` prepares before attributing: the
prompt's and the target's token ids, checked against the model's positions; a ``TextTemplateInput``'s
sources located in the text the model reads, and token scores summed over them; padding a batch of
them; the keywords the wrapped method takes."""

from __future__ import annotations

import contextlib
import inspect
import re
from dataclasses import dataclass
from typing import Any, Iterator, Sequence

import numpy as np
import torch
from captum.attr import Attribution, TextTemplateInput, TextTokenInput
from torch import Tensor, nn

from captum_attnflow.hf import check_token_ids


class TokenPreparation:
    """The token ids of prompts and targets for a wrapper holding ``model``, ``tokenizer`` and
    ``encoder_decoder``: a mixin of :class:`~captum_attnflow.attr.llm.LLMAttentionAttribution`."""

    model: nn.Module
    tokenizer: Any
    encoder_decoder: bool

    def _text_input(self, prompt: Any) -> TextTokenInput | TemplatePrompt:
        if isinstance(prompt, TextTokenInput):
            return prompt
        if isinstance(prompt, TextTemplateInput):
            return template_prompt(prompt, self.tokenizer)
        if not isinstance(prompt, str):
            raise TypeError(
                "inp must be a prompt string, captum.attr.TextTokenInput or captum.attr.TextTemplateInput, "
                f"got {type(prompt).__name__}."
            )
        return TextTokenInput(prompt, self.tokenizer)

    def _prompt_ids(self, text: TextTokenInput | TemplatePrompt, device: torch.device) -> Tensor:
        """The prompt's token ids (n_in,), checked: some text, in the vocabulary, within the positions."""
        ids = (text.ids if isinstance(text, TemplatePrompt) else text.inp_tensor[0]).to(device)
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


# Private-use characters around each value while the template is filled, to find where it lands.
_OPEN, _MIDDLE, _CLOSE = "\ue000", "\ue001", "\ue002"
_MARKED = re.compile(f"{_OPEN}(\\d+){_MIDDLE}(.*?){_CLOSE}", re.DOTALL)


@dataclass(frozen=True)
class TemplatePrompt:
    """A ``TextTemplateInput`` as the model reads it.

    Attributes:
        inp: the input itself.
        text: the prompt (in the chat template when the tokenizer has one).
        ids: (n,) its token ids.
        sources: (n,) each token's interpretable feature (the value's mask group, its index
            without a mask), -1 for a token in no value (the template's text, special tokens).
    """

    inp: TextTemplateInput
    text: str
    ids: Tensor
    sources: Tensor


def template_prompt(inp: TextTemplateInput, tokenizer: Any) -> TemplatePrompt:
    """Fill ``inp``'s template, put it in the tokenizer's chat template (if it has one: the
    prompt as the user's message, then the assistant's turn), tokenize it and give each token the
    source that holds most of its characters (:func:`token_sources`).

    Without a chat template the text is tokenized with special tokens, as Captum's
    ``LLMAttribution`` does; with one, the chat template writes them and none are added, as
    ``apply_chat_template`` does.

    Raises:
        TypeError: a slow tokenizer (no character offsets).
        ValueError: a template that changes its values (``{!r}``, ``{:.3}``) or a chat template
            that rewrites the prompt, so that the values cannot be found in the text.
    """
    if not getattr(tokenizer, "is_fast", False):
        raise TypeError(
            f"a TextTemplateInput needs a fast tokenizer, whose offsets locate each token in the text; "
            f"{type(tokenizer).__name__} is not one: load it with AutoTokenizer.from_pretrained(name) (fast by default)."
        )
    text, spans = _value_spans(inp)
    chat = bool(getattr(tokenizer, "chat_template", None))
    if chat:
        text, spans = _in_chat(tokenizer, text, spans)
    encoding = tokenizer(text, add_special_tokens=not chat, return_offsets_mapping=True)
    groups = inp.formatted_mask if inp.mask is not None else range(inp.n_features)
    owner = np.full(len(text), -1, dtype=np.int64)
    for group, value_spans in zip(groups, spans):
        for start, end in value_spans:
            owner[start:end] = group
    return TemplatePrompt(
        inp=inp,
        text=text,
        ids=torch.tensor(encoding["input_ids"], dtype=torch.long),
        sources=token_sources(encoding["offset_mapping"], owner),
    )


def _fill(inp: TextTemplateInput, values: list[str]) -> str:
    """The template filled with ``values``, as ``TextTemplateInput.to_model_input`` fills it."""
    return inp.format_fn(**dict(zip(inp.dict_keys, values))) if inp.dict_keys else inp.format_fn(*values)


def _value_spans(inp: TextTemplateInput) -> tuple[str, list[list[tuple[int, int]]]]:
    """The filled template and, per value, the (start, end) character spans it fills (one per
    field that takes it; a template string or a function alike): each value is filled in between
    markers, which are then read off and removed."""
    if any(mark in piece for piece in [*inp.values, *([inp.template] if isinstance(inp.template, str) else [])]
           for mark in (_OPEN, _MIDDLE, _CLOSE)):
        raise ValueError("the template or its values hold the private-use characters U+E000-U+E002; remove them.")
    marked = _fill(inp, [f"{_OPEN}{i}{_MIDDLE}{value}{_CLOSE}" for i, value in enumerate(inp.values)])
    spans: list[list[tuple[int, int]]] = [[] for _ in inp.values]
    pieces, length, position = [], 0, 0
    for match in _MARKED.finditer(marked):
        before, value = marked[position : match.start()], match.group(2)
        pieces += [before, value]
        length += len(before)
        spans[int(match.group(1))].append((length, length + len(value)))
        length += len(value)
        position = match.end()
    pieces.append(marked[position:])
    text = "".join(pieces)
    if text != _fill(inp, list(inp.values)):
        raise ValueError(
            "the values of the TextTemplateInput cannot be found in its text: its template changes them (a "
            "conversion such as {!r} or a format spec such as {:.3}); use plain fields ({} or {name})."
        )
    return text, spans


def _in_chat(tokenizer: Any, prompt: str, spans: list[list[tuple[int, int]]]) -> tuple[str, list[list[tuple[int, int]]]]:
    """The prompt as the user's message of the tokenizer's chat template, and the spans moved with it.

    Chat templates may trim the message: the prompt is looked up as it is, else without its
    surrounding whitespace (characters cut off belong to no source); the last occurrence is the message.
    """
    chat = tokenizer.apply_chat_template([{"role": "user", "content": prompt}], tokenize=False, add_generation_prompt=True)
    for shown in dict.fromkeys([prompt, prompt.strip()]):
        found = chat.rfind(shown) if shown else -1
        if found >= 0:
            lead = len(prompt) - len(prompt.lstrip()) if shown != prompt else 0
            clipped = [[(max(start, lead), min(end, lead + len(shown))) for start, end in value] for value in spans]
            shift = found - lead
            return chat, [[(start + shift, end + shift) for start, end in value if end > start] for value in clipped]
    raise ValueError(
        "the tokenizer's chat template rewrites the prompt, so its sources cannot be found in the chat text; "
        "set tokenizer.chat_template = None to explain the prompt without it."
    )


def token_sources(offsets: Sequence[tuple[int, int]], owner: np.ndarray) -> Tensor:
    """Each token's source, from its character offsets and each character's source.

    A token whose characters all lie in one source belongs to it; a token across a boundary
    belongs to the source (or to no source, -1) that holds most of its characters, a tie going to
    the one that comes first in the token (so ``" keys"`` of a byte-level tokenizer, its space in
    the template, belongs to the source holding ``keys``). Each token is counted once. A token
    without characters (a special token added by the tokenizer, offsets ``(0, 0)``) has no source.

    Args:
        offsets: n pairs, each token's ``(start, end)`` in the text (``return_offsets_mapping``).
        owner: (len(text),) integer, each character's source, -1 for none.

    Returns:
        Tensor: (n,) long, each token's source or -1.

    Example::

        >>> import numpy as np
        >>> owner = np.array([-1, 0, 0, 0, 0, 1, 1, -1])  # " keys" in source 0, "to" in source 1
        >>> token_sources([(0, 5), (4, 6), (5, 8), (3, 3)], owner).tolist()
        [0, 0, 1, -1]
    """
    result = []
    for start, end in offsets:
        counts: dict[int, int] = {}
        for source in owner[start:end].tolist():  # in the token's order: the first of a tie wins
            counts[source] = counts.get(source, 0) + 1
        result.append(max(counts, key=counts.__getitem__) if counts else -1)
    return torch.tensor(result, dtype=torch.long)


def sum_over_sources(scores: Tensor, sources: Tensor, count: int) -> Tensor:
    """Per-source scores: each token's score added to its source's.

    .. math:: S[..., f] = \\sum_{j \\,:\\, s_j = f} x[..., j]

    Tokens with source -1 (the template's text) count for none, so
    ``S.sum(-1) + x[..., sources < 0].sum(-1) == x.sum(-1)``.

    Args:
        scores: (..., n) token scores.
        sources: (n,) integer, each token's source in ``0..count - 1``, or -1.
        count: F, the number of sources (also those without a token).

    Returns:
        Tensor: (..., F), in ``scores``' dtype and device.

    Raises:
        ValueError: ``sources`` not (n,) integers in ``-1..count - 1``.

    Example::

        >>> import torch
        >>> sum_over_sources(torch.tensor([[0.1, 0.2, 0.3, 0.4]]), torch.tensor([-1, 0, 2, 0]), 3)
        tensor([[0.6000, 0.0000, 0.3000]])
    """
    integers = not (sources.dtype.is_floating_point or sources.dtype.is_complex or sources.dtype == torch.bool)
    if sources.dim() != 1 or sources.numel() != scores.shape[-1] or not integers:
        raise ValueError(
            f"sources must be one integer per token, shape ({scores.shape[-1]},), "
            f"got {tuple(sources.shape)} {sources.dtype}."
        )
    if sources.numel() and (int(sources.min()) < -1 or int(sources.max()) >= count):
        raise ValueError(f"sources must lie in -1..{count - 1} (-1: no source), got {sources.min()}..{sources.max()}.")
    kept = (sources >= 0).to(scores.device)
    totals = scores.new_zeros((*scores.shape[:-1], count))
    return totals.index_add_(-1, sources.to(scores.device)[kept], scores[..., kept])


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
