"""A response's log-probability with some sources of its prompt ablated: what the context
attribution metrics (:mod:`captum_attnflow.evaluate.context`) run the model for.

The prompt is Captum's :class:`~captum.attr.TextTemplateInput`: its values are the sources
(documents, sentences), its ``mask`` may group them into features, its ``baselines`` (default
``""``) are what an ablated source is replaced by. An ablation is a keep mask over the
features, the interpretable representation Captum's ``to_model_input`` takes, in Captum's
order: with a ``mask``, value i belongs to feature ``prompt.formatted_mask[i]``.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from captum.attr import TextTemplateInput
from torch import Tensor, nn
from tqdm.auto import tqdm

from captum_attnflow.hf import check_token_ids, input_device, model_call, output_scores
from captum_attnflow.hf.scores import kept_in, kept_logits, logit_rows


def encode_prompt(tokenizer: Any, text: str, apply_chat_template: bool = True) -> list[int]:
    """The token ids of a prompt the response follows.

    With ``apply_chat_template`` and a tokenizer that has a chat template, the text is the
    user's message and the template's assistant turn is opened
    (``add_generation_prompt=True``); the templated text is encoded without adding special
    tokens again (the template writes them), as ContextCite does. Otherwise the text is
    encoded with the tokenizer's special tokens (e.g. a beginning-of-sequence token), as
    Captum's ``LLMAttribution`` encodes a prompt.

    Args:
        tokenizer: a Hugging Face tokenizer.
        text: the prompt.
        apply_chat_template: use the tokenizer's chat template when it has one.

    Returns:
        list[int]: the prompt's ids.

    Example::

        >>> from captum_attnflow.models.language_model import build_lm_tokenizer
        >>> tokenizer = build_lm_tokenizer()  # no chat template: the text with [CLS] first
        >>> tokenizer.convert_ids_to_tokens(encode_prompt(tokenizer, "the keys"))
        ['[CLS]', 'the', 'keys']
    """
    if apply_chat_template and getattr(tokenizer, "chat_template", None):
        text = tokenizer.apply_chat_template(
            [{"role": "user", "content": text}], tokenize=False, add_generation_prompt=True
        )
        return list(tokenizer.encode(text, add_special_tokens=False))
    return list(tokenizer.encode(text))


def ablation_masks(num_sources: int, count: int = 32, seed: int = 0, keep_probability: float = 0.5) -> Tensor:
    """Random ablations: each source kept independently with probability ``keep_probability``
    (ContextCite's, 0.5), drawn by ``numpy.random.default_rng(seed)``; the same seed gives the
    same masks.

    Args:
        num_sources: F, the number of features of the prompt.
        count: m, the number of ablations.
        seed: the seed of the draw.
        keep_probability: in (0, 1).

    Returns:
        Tensor: bool (m, F), True where a source is kept.

    Example::

        >>> masks = ablation_masks(5, count=3, seed=0)
        >>> masks.shape, bool((masks == ablation_masks(5, count=3, seed=0)).all())
        (torch.Size([3, 5]), True)
    """
    for name, value in (("num_sources", num_sources), ("count", count)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive int, got {value!r}.")
    if not 0 < keep_probability < 1:
        raise ValueError(f"keep_probability must be in (0, 1), got {keep_probability!r}.")
    draw = np.random.default_rng(seed).random((count, num_sources))
    return torch.from_numpy(draw < keep_probability)


def check_keep(keep: Any, num_sources: int) -> Tensor:
    """``keep`` as a bool (m, F) CPU tensor, F = ``num_sources``; a ValueError unless it is one
    mask per row over the F features, of booleans (or 0 and 1).

    Example::

        >>> check_keep([[1, 0, 1]], 3)
        tensor([[ True, False,  True]])
    """
    keep = torch.as_tensor(keep).detach().cpu()
    if keep.dim() != 2 or keep.shape[1] != num_sources:
        raise ValueError(f"keep must be (m, F) masks over the F = {num_sources} features, got shape {tuple(keep.shape)}.")
    if keep.dtype != torch.bool and bool(((keep != 0) & (keep != 1)).any()):
        raise ValueError("keep must hold booleans (or 0 and 1), True where a source is kept.")
    return keep.bool()


class ResponseLogProb:
    """The response's total log-probability given the prompt with some sources ablated.

    For a keep mask :math:`z \\in \\{0, 1\\}^F` over the prompt's features,

    :math:`f(z) = \\sum_{t=1}^{R} \\log p(r_t \\mid x(z), r_{<t})`,

    with :math:`x(z)` the prompt formatted with the features where :math:`z = 0` replaced by
    their baselines (``prompt.to_model_input(z)``), chat-templated and encoded by
    :func:`encode_prompt`, and :math:`r` the response's R tokens, all scored in one forward
    pass of prompt + response (teacher forcing, as Captum's ``forward_in_tokens=False``).
    Masks are run in batches of prompts of similar length, right-padded with an attention
    mask: a causal model reads no padding before a real token, so each value equals the
    prompt's own unbatched run up to float rounding. The model computes the logits at the
    response's positions alone where it takes ``logits_to_keep``. A mask scored once is kept
    and not run again (the full prompt and the top-k ablations of several methods are
    often the same), keyed by the mask.

    Args:
        model: a Hugging Face causal language model.
        tokenizer: its tokenizer.
        prompt: the prompt, its values the sources.
        response: the response's token ids (a 1-D tensor or a list), or its text (encoded
            without special tokens, as Captum encodes a target).
        apply_chat_template: format the prompt with the tokenizer's chat template when it has
            one (:func:`encode_prompt`).
        batch_size: the number of prompts per forward pass.
        progress: show a tqdm progress bar over the batches.

    Attributes:
        num_sources: F, ``prompt.n_itp_features``.
        response_ids: (R,) the response's ids.

    Example::

        >>> import torch
        >>> from captum.attr import TextTemplateInput
        >>> from captum_attnflow.models.language_model import load_agreement_lm
        >>> model, tokenizer = load_agreement_lm()
        >>> prompt = TextTemplateInput("{} {}", values=["the keys", "to the cabinet"])
        >>> log_prob = ResponseLogProb(model, tokenizer, prompt, "are")
        >>> full, without_keys = log_prob(torch.tensor([[True, True], [False, True]]))
        >>> bool(full > without_keys)  # "are" agrees with "keys"
        True
    """

    def __init__(
        self,
        model: nn.Module,
        tokenizer: Any,
        prompt: TextTemplateInput,
        response: Any,
        apply_chat_template: bool = True,
        batch_size: int = 16,
        progress: bool = False,
    ) -> None:
        if not isinstance(prompt, TextTemplateInput):
            raise TypeError(
                f"prompt must be a captum.attr.TextTemplateInput (the sources as its values), got {type(prompt).__name__}."
            )
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size must be a positive int, got {batch_size!r}.")
        self.model, self.tokenizer, self.prompt = model, tokenizer, prompt
        self.apply_chat_template, self.batch_size, self.progress = apply_chat_template, batch_size, progress
        self.num_sources = prompt.n_itp_features
        self.device = input_device(model) or torch.device("cpu")
        self.response_ids = _response_ids(tokenizer, response, model, self.device)
        self._scored: dict[bytes, float] = {}

    def __call__(self, keep: Any) -> Tensor:
        """(m,) float64 on the CPU: :math:`f(z)` for each row :math:`z` of ``keep``, a bool (m, F)
        (or 0/1) mask, True where a source is kept."""
        keep = check_keep(keep, self.num_sources)
        keys = [row.numpy().tobytes() for row in keep]
        missing = {key: row for key, row in zip(keys, keep) if key not in self._scored}
        if missing:
            self._scored.update(zip(missing, self._run(list(missing.values())).tolist()))
        return torch.tensor([self._scored[key] for key in keys], dtype=torch.float64)

    def prompt_ids(self, keep: Tensor) -> list[int]:
        """The prompt's ids with the sources where the (F,) ``keep`` is False ablated."""
        return encode_prompt(self.tokenizer, self.prompt.to_model_input(keep[None]), self.apply_chat_template)

    def _run(self, rows: list[Tensor]) -> Tensor:
        prompts = [self.prompt_ids(row) for row in rows]
        for row, ids in zip(rows, prompts):
            if not ids:
                raise ValueError(
                    f"the prompt with sources {torch.nonzero(~row).flatten().tolist()} ablated has no token to "
                    "read the response from; give the tokenizer a beginning-of-sequence token or the template text."
                )
        # Prompts of similar length share a batch: less padding.
        order = sorted(range(len(prompts)), key=lambda index: len(prompts[index]))
        batches = [order[start : start + self.batch_size] for start in range(0, len(order), self.batch_size)]
        values = torch.empty(len(prompts), dtype=torch.float64)
        with torch.no_grad(), model_call(self.model):
            for batch in tqdm(batches, desc="ablations", unit="batch", disable=not self.progress):
                values[batch] = self._batch([prompts[index] for index in batch])
        return values

    def _batch(self, prompts: list[list[int]]) -> Tensor:
        """(B,) the response's log-probability after each prompt, in one right-padded forward pass."""
        response = self.response_ids
        # The last response token is predicted, never read.
        sequences = [torch.tensor(ids, dtype=torch.long, device=self.device) for ids in prompts]
        sequences = [torch.cat([ids, response[:-1]]) for ids in sequences]
        width = max(sequence.numel() for sequence in sequences)
        ids = torch.zeros(len(sequences), width, dtype=torch.long, device=self.device)
        mask = torch.zeros_like(ids)
        for row, sequence in enumerate(sequences):
            ids[row, : sequence.numel()] = sequence
            mask[row, : sequence.numel()] = 1
        check_token_ids(ids, self.model)
        # Position p predicts token p + 1: the response's t-th token is predicted at len(prompt) - 1 + t.
        starts = torch.tensor([len(prompt) - 1 for prompt in prompts], device=self.device)
        positions = starts[:, None] + torch.arange(response.numel(), device=self.device)  # (B, R)
        kept = kept_logits(self.model, positions)
        output = self.model(input_ids=ids, attention_mask=mask, **({} if kept is None else {"logits_to_keep": kept}))
        logits = output_scores(output)
        rows = logit_rows(kept_in(output, kept), positions)
        logits = logits.gather(1, rows[..., None].expand(-1, -1, logits.shape[-1]))  # (B, R, V)
        log_probs = torch.log_softmax(logits.float(), -1).gather(-1, response.expand(len(prompts), -1)[..., None])
        return log_probs.squeeze(-1).double().sum(-1).cpu()


def response_log_probs(
    model: nn.Module,
    tokenizer: Any,
    prompt: TextTemplateInput,
    response: Any,
    keep: Any,
    apply_chat_template: bool = True,
    batch_size: int = 16,
    progress: bool = False,
) -> Tensor:
    """The response's total log-probability given the prompt under each ablation in ``keep``.

    A function form of :class:`ResponseLogProb` (see there for the definition, the chat
    template and the batching); build that once to score several sets of masks on one prompt
    without running a mask twice.

    Args:
        model, tokenizer, prompt, response, apply_chat_template, batch_size, progress: as
            :class:`ResponseLogProb` takes them.
        keep: bool (m, F), True where a feature of the prompt is kept.

    Returns:
        Tensor: float64 (m,) on the CPU.

    Example::

        >>> from captum.attr import TextTemplateInput
        >>> from captum_attnflow.models.language_model import load_agreement_lm
        >>> model, tokenizer = load_agreement_lm()
        >>> prompt = TextTemplateInput("{} {}", values=["the keys", "to the cabinet"])
        >>> response_log_probs(model, tokenizer, prompt, "are", ablation_masks(2, count=4)).shape
        torch.Size([4])
    """
    return ResponseLogProb(model, tokenizer, prompt, response, apply_chat_template, batch_size, progress)(keep)


def _response_ids(tokenizer: Any, response: Any, model: nn.Module, device: torch.device) -> Tensor:
    if isinstance(response, str):
        ids = torch.tensor(tokenizer.encode(response, add_special_tokens=False), dtype=torch.long)
    elif isinstance(response, (Tensor, list, tuple)):
        ids = torch.as_tensor(response)
        if ids.dtype == torch.bool or ids.dtype.is_floating_point or ids.dtype.is_complex:
            raise TypeError(f"response as ids must hold integer token ids, got dtype {ids.dtype}.")
        if ids.dim() != 1:
            raise ValueError(f"response as ids must be 1-D (R,), got shape {tuple(ids.shape)}.")
    else:
        raise TypeError(f"response must be its text or its token ids (a 1-D tensor or a list), got {type(response).__name__}.")
    if ids.numel() == 0:
        raise ValueError("the response has no tokens; pass the text (or ids) the model answered.")
    ids = ids.to(device, torch.long)
    check_token_ids(ids[None], model)
    return ids
