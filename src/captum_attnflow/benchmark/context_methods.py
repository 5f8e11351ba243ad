"""Per-source scores of the context task's rows that are not this package's methods: Captum's
leave-one-out, AttnTrace's averaged attention (written from its paper), ContextCite's surrogate
(its PyPI package, where installed) and the random floor.

Each function maps ``(model, tokenizer, prompt, response, seed)`` to (F,) float scores, one per
feature of the prompt (a :class:`~captum.attr.TextTemplateInput` whose values are the sources), so
that every row of the task is scored by the same metrics on the same ablations.
"""

from __future__ import annotations

import copy
import importlib.util
from typing import Any, Callable

import numpy as np
import torch
from captum.attr import FeatureAblation, LLMAttribution, TextTemplateInput
from torch import Tensor, nn

from captum_attnflow.attr import RawAttention
from captum_attnflow.attr.llm_inputs import template_prompt

# AttnTrace's defaults (Wang et al., 2025, and its released code): each source scored by the mean
# of its 5 most attended tokens, averaged over 30 random subsets keeping 40 % of the sources.
ATTNTRACE_TOP_TOKENS = 5
ATTNTRACE_SUBSETS = 30
ATTNTRACE_KEEP = 0.4
# ContextCite always formats its prompt with the tokenizer's chat template and encodes it without
# special tokens; for a tokenizer that has no template, this one writes the prompt as it is after
# the tokens the tokenizer itself puts first (its beginning of sequence, which a tokenizer may add
# without naming it its bos_token), so that ContextCite reads what every other row reads.
PLAIN_CHAT_TEMPLATE = "{% for message in messages %}{{ message['content'] }}{% endfor %}"


def leave_one_out(model: nn.Module, tokenizer: Any, prompt: TextTemplateInput, response: str, seed: int) -> Tensor:
    """Captum's own per-source answer, ``LLMAttribution(FeatureAblation(model), tokenizer)`` on
    the template: the response's log-probability with all sources minus with source i removed
    (F + 1 forward passes)."""
    result = LLMAttribution(FeatureAblation(model), tokenizer).attribute(prompt, target=response)
    return torch.as_tensor(result.seq_attr).detach().float().cpu()


def attntrace(
    model: nn.Module,
    tokenizer: Any,
    prompt: TextTemplateInput,
    response: str,
    seed: int,
    subsets: int = ATTNTRACE_SUBSETS,
    keep: float = ATTNTRACE_KEEP,
    top_tokens: int = ATTNTRACE_TOP_TOKENS,
) -> Tensor:
    """AttnTrace (Wang et al., 2025, "AttnTrace: Attention-based Context Traceback for
    Long-Context LLMs"): the response tokens' attention to each prompt token averaged over layers,
    heads and response tokens, :math:`a_j = \\frac{1}{L H R} \\sum_{l, h, t} A^{l,h}_{t j}`; a source
    scores the mean of its ``top_tokens`` largest :math:`a_j`; the scores are averaged over
    ``subsets`` random subsets of the sources that keep ``round(keep * F)`` of them (the others
    removed from the prompt), each source over the subsets holding it (0 if none did).

    The attention rows are the response tokens' own, read on the lean path of
    :class:`~captum_attnflow.RawAttention` (every layer, heads averaged), one forward pass a subset.
    """
    count = prompt.n_itp_features
    groups = np.asarray(prompt.formatted_mask if prompt.mask is not None else range(count))
    generator = np.random.default_rng(seed)
    total, seen = torch.zeros(count), torch.zeros(count)
    response_ids = torch.tensor(tokenizer.encode(response, add_special_tokens=False), dtype=torch.long)
    method = RawAttention(model)
    kept_features = max(1, int(count * keep))
    for _ in range(subsets):
        chosen = np.sort(generator.permutation(count)[:kept_features])
        subset = copy.copy(prompt)  # the same template and groups, the sources left out emptied
        subset.values = [value if group in chosen else "" for value, group in zip(prompt.values, groups)]
        located = template_prompt(subset, tokenizer)
        ids = torch.cat([located.ids, response_ids])[None]
        start = located.ids.numel()
        rows = list(range(start, ids.shape[1]))
        attention = method.attribute(ids, position=rows, layer=None).mean(dim=(0, 2))[0]  # (n,)
        for feature in chosen.tolist():
            own = attention[:start][located.sources == feature]
            if own.numel():
                total[feature] += own.topk(min(top_tokens, own.numel())).values.mean()
                seen[feature] += 1
    return torch.where(seen > 0, total / seen.clamp(min=1), torch.zeros(count))


def contextcite(ablations: int) -> Callable[..., Tensor]:
    """ContextCite (Cohen-Wang et al., NeurIPS 2024) from its PyPI package ``context-cite``: a
    LASSO surrogate fitted to the response's log-probability under ``ablations`` random ablations
    (each source kept with probability 1/2), its weights as the scores. The package runs the
    prompt through the tokenizer's chat template (:data:`PLAIN_CHAT_TEMPLATE` where it has none);
    its partitioner here is the prompt's own
    sources, and the response is the one explained by every other row."""

    def scores(model: nn.Module, tokenizer: Any, prompt: TextTemplateInput, response: str, seed: int) -> Tensor:
        from context_cite import ContextCiter

        if not getattr(tokenizer, "chat_template", None):
            first_tokens = "".join(tokenizer.convert_ids_to_tokens(tokenizer("")["input_ids"]))
            tokenizer = copy.copy(tokenizer)  # the user's tokenizer keeps no template
            tokenizer.chat_template = first_tokens + PLAIN_CHAT_TEMPLATE
        partitioner = _partitioner(prompt)
        citer = ContextCiter(
            model, tokenizer, partitioner.context, "", num_ablations=ablations, partitioner=partitioner,
            prompt_template="{context}",
        )
        chat = tokenizer.apply_chat_template(
            [{"role": "user", "content": citer.partitioner.get_context()}], tokenize=False, add_generation_prompt=True
        )
        # The package explains what it generates itself; every row here explains the same
        # response, so its cache of the generation is filled with it instead.
        citer._cache["output"] = chat + response
        return torch.as_tensor(np.asarray(citer.get_attributions(verbose=False)), dtype=torch.float32)

    return scores


def _partitioner(prompt: TextTemplateInput) -> Any:
    """ContextCite's ``BaseContextPartitioner`` over the prompt's features: the context of a mask
    is the whole prompt with the features it drops replaced by their baselines."""
    from context_cite.context_partitioner import BaseContextPartitioner

    class Features(BaseContextPartitioner):
        def __init__(self) -> None:
            super().__init__(prompt.to_model_input())

        def split_context(self) -> None:
            return None

        @property
        def num_sources(self) -> int:
            return prompt.n_itp_features

        def get_source(self, index: int) -> str:
            groups = prompt.formatted_mask if prompt.mask is not None else range(len(prompt.values))
            return " ".join(value for value, group in zip(prompt.values, groups) if group == index)

        def get_context(self, mask: Any = None) -> str:
            if mask is None:
                return prompt.to_model_input()
            return prompt.to_model_input(torch.as_tensor(np.asarray(mask), dtype=torch.long)[None])

    return Features()


def random_scores(model: nn.Module, tokenizer: Any, prompt: TextTemplateInput, response: str, seed: int) -> Tensor:
    """The floor: standard normal scores, seeded (centred, so that its LDS is about 0)."""
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(prompt.n_itp_features, generator=generator)


def available_peers() -> dict[str, Callable[..., Tensor]]:
    """The rows besides this package's methods that run here, by name: ContextCite's only where
    its package is installed (it is not a dependency: install it in an environment of its own)."""
    peers: dict[str, Callable[..., Tensor]] = {"leave-one-out": leave_one_out, "attntrace": attntrace}
    if importlib.util.find_spec("context_cite") is not None:
        peers.update({"contextcite-64": contextcite(64), "contextcite-256": contextcite(256)})
    return peers
