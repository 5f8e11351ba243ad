"""The bundled agreement language model: a small GPT-2 that writes the verb after a subject phrase.

The language-model variant of the verb-number task (Linzen et al. 2016, section 5): instead of
classifying the number of the verb that follows ``the keys to the cabinet``, a causal language
model trained on whole sentences continues it, and it agrees if it prefers ``are`` to ``is``.
The sentences are the generator's (:func:`~captum_attnflow.data.generate_examples`) followed by
the copula of the subject's number and a full stop: ``[CLS] the keys to the cabinet are .``
(``[CLS]`` serves as the beginning-of-sequence token, ``.`` as the end of sequence).

Train it with ``python -m captum_attnflow.models.train_lm --out DIR``
(:mod:`captum_attnflow.models.train_lm`); the bundled checkpoint (``assets/agreement_lm/``)
was made with the defaults, and its held-out results are in
``assets/agreement_lm/eval_results.json``. It is a plain :class:`~transformers.GPT2LMHeadModel`,
so ``AutoModelForCausalLM.from_pretrained(DIR)`` loads it as well.
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import torch
from transformers import GPT2Config, GPT2LMHeadModel, PreTrainedTokenizerFast

from captum_attnflow.data import AgreementExample, build_tokenizer, vocabulary
from captum_attnflow.data.agreement import accuracy_by_attractors
from captum_attnflow.models.bundled import load_checkpoint

COPULAS = ("is", "are")  # index = the number: SINGULAR, PLURAL
END = "."
ASSET_DIR = Path(__file__).resolve().parent.parent / "assets" / "agreement_lm"


def build_lm_tokenizer() -> PreTrainedTokenizerFast:
    """The agreement tokenizer with the copulas and the full stop added, ``.`` as end of sequence.

    Returns:
        PreTrainedTokenizerFast: word-level, ``[CLS]`` prepended (the beginning of sequence),
        ``[PAD]`` (id 0) for padding, ``eos_token`` ``"."``.

    Example::

        >>> tokenizer = build_lm_tokenizer()
        >>> tokenizer.convert_ids_to_tokens(tokenizer("the keys are .")["input_ids"])
        ['[CLS]', 'the', 'keys', 'are', '.']
    """
    tokenizer = build_tokenizer([*vocabulary(), *COPULAS, END])
    tokenizer.eos_token = END
    return tokenizer


def lm_config(tokenizer: PreTrainedTokenizerFast) -> GPT2Config:
    """The bundled model's sizes: 4 layers, 4 heads, hidden size 64, no dropout.

    Example::

        >>> config = lm_config(build_lm_tokenizer())
        >>> config.n_layer, config.n_head, config.n_embd
        (4, 4, 64)
    """
    return GPT2Config(
        vocab_size=len(tokenizer),
        n_positions=64,
        n_embd=64,
        n_layer=4,
        n_head=4,
        n_inner=256,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        bos_token_id=tokenizer.cls_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )


def lm_sentence(example: AgreementExample) -> list[str]:
    """The training sentence of an example: its words, the agreeing copula, the full stop.

    Example::

        >>> example = AgreementExample(["the", "keys", "to", "the", "cabinet"], 1, 1, (4,))  # plural
        >>> " ".join(lm_sentence(example))
        'the keys to the cabinet are .'
    """
    return [*example.words, COPULAS[example.label], END]


def load_agreement_lm(
    directory: str | Path | None = None,
    device: str | torch.device | None = None,
    dtype: str | torch.dtype | None = None,
    device_map: str | dict | None = None,
) -> tuple[GPT2LMHeadModel, PreTrainedTokenizerFast]:
    """The bundled agreement language model (eval mode, sdpa attention; CPU unless told) and its tokenizer.

    Loads offline, without transformers' "Loading weights" progress bar.

    Args:
        directory: a checkpoint written by ``python -m captum_attnflow.models.train_lm
            --out DIR`` to load instead; None (default) loads the bundled one.
        device: where the model goes (``"cpu"``, ``"cuda"``, ``"cuda:N"``, ``"mps"``, ``"auto"``
            for the first CUDA device when there is one); None (default) the CPU.
        dtype: ``"float32"``, ``"bfloat16"``, ``"float16"`` (or the torch dtype); None (default)
            the checkpoint's float32.
        device_map: accelerate's device map instead of ``device`` (``"auto"``, ...); see
            :func:`~captum_attnflow.hf.placement.load_pretrained`.

    Returns:
        tuple: ``(model, tokenizer)``, a :class:`~transformers.GPT2LMHeadModel` and the
        tokenizer of :func:`build_lm_tokenizer`.

    Raises:
        FileNotFoundError: no model files where they should be.
        ValueError: an unknown device or dtype, or a device this torch cannot use.

    Example::

        >>> model, tokenizer = load_agreement_lm()
        >>> ids = tokenizer("the keys to the cabinet", return_tensors="pt")["input_ids"]
        >>> singular, plural = tokenizer.convert_tokens_to_ids(list(COPULAS))
        >>> logits = model(ids).logits[0, -1]  # the next word after "cabinet"
        >>> bool(logits[plural] > logits[singular])  # "are", agreeing with "keys"
        True
    """
    path = ASSET_DIR if directory is None else Path(directory)
    return load_checkpoint(GPT2LMHeadModel, path, "language model", "captum_attnflow.models.train_lm",
                           device=device, dtype=dtype, device_map=device_map)


def verb_number_accuracy(
    model: GPT2LMHeadModel,
    tokenizer: PreTrainedTokenizerFast,
    examples: Sequence[AgreementExample],
    batch_size: int = 256,
) -> dict[str, float | int]:
    """How often the model prefers the copula of the subject's number after each example's words.

    The Linzen et al. (2016) language-model measure: after ``[CLS] + words``, is the logit of
    the agreeing copula (``is`` / ``are``) above the other one?

    Returns:
        ``{"n", "accuracy", "n_with_attractors", "accuracy_with_attractors", "n_<k>_attractors",
        "accuracy_<k>_attractors"}``.

    Example::

        >>> from captum_attnflow.data import generate_examples
        >>> model, tokenizer = load_agreement_lm()
        >>> verb_number_accuracy(model, tokenizer, generate_examples(64, seed=1, split="test"))["accuracy"] > 0.9
        True
    """
    copulas = tokenizer.convert_tokens_to_ids(list(COPULAS))
    correct: list[bool] = []
    with torch.no_grad():
        for start in range(0, len(examples), batch_size):
            chunk = examples[start : start + batch_size]
            batch = tokenizer([list(e.words) for e in chunk], is_split_into_words=True, padding=True, return_tensors="pt")
            logits = model(**batch).logits
            last = batch["attention_mask"].sum(1) - 1
            scores = logits[torch.arange(len(chunk)), last][:, copulas]
            correct += (scores.argmax(-1) == torch.tensor([e.label for e in chunk])).tolist()
    return accuracy_by_attractors(correct, examples)


def subject_attractor_rates(
    model: GPT2LMHeadModel,
    tokenizer: PreTrainedTokenizerFast,
    examples: Sequence[AgreementExample],
    batch_size: int = 100,
) -> dict[str, list[float]]:
    """How often raw attention, rollout and flow put the subject above every attractor when the model writes the verb.

    For each example with at least one attractor, the position that writes the verb (the
    last token of the prompt ``[CLS] + words``; the causal model reads nothing after it) is
    explained after every layer, as :class:`~captum_attnflow.attr.llm.LLMAttentionAttribution`
    explains it with the copula as target; the subject counts as above when its score exceeds
    every attractor's by more than 1e-6 (ties do not count).

    Returns:
        ``{"raw": [rate after layer 1, ...], "rollout": [...], "flow": [...], "n": [count]}``.

    Example::

        >>> from captum_attnflow.data import generate_examples
        >>> model, tokenizer = load_agreement_lm()
        >>> rates = subject_attractor_rates(model, tokenizer, generate_examples(8, seed=1, split="test"))
        >>> sorted(rates), len(rates["flow"]) == model.config.n_layer
        (['flow', 'n', 'raw', 'rollout'], True)
    """
    from captum_attnflow.attr import AttentionFlow, AttentionRollout, RawAttention

    chosen = [e for e in examples if e.num_attractors > 0]
    methods = {"raw": RawAttention(model), "rollout": AttentionRollout(model), "flow": AttentionFlow(model)}
    above = {name: torch.zeros(model.config.n_layer, dtype=torch.float64) for name in methods}
    for start in range(0, len(chosen), batch_size):
        chunk = chosen[start : start + batch_size]
        batch = tokenizer([list(e.words) for e in chunk], is_split_into_words=True, padding=True, return_tensors="pt")
        verb = batch["attention_mask"].sum(1) - 1  # right padding: the last real token writes the verb
        for name, method in methods.items():
            scores = method.attribute(batch["input_ids"], position=verb, layer=None, attention_mask=batch["attention_mask"])
            for row, example in enumerate(chunk):
                subject = scores[:, row, example.subject_index + 1, None]  # (L, 1)
                attractors = scores[:, row, [i + 1 for i in example.attractor_indices]]  # (L, k)
                above[name] += (subject > attractors + 1e-6).all(1).float()
    rates = {name: (counts / max(1, len(chosen))).tolist() for name, counts in above.items()}
    rates["n"] = [len(chosen)]
    return rates
