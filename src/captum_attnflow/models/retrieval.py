"""The retrieval language model: a small Qwen3 meant to answer a question from the one fact of its prompt that holds the answer.

Its prompts are :func:`~captum_attnflow.data.retrieval_examples`: 4 to 64 facts (the sources),
most of them distractors sharing words with the question, then ``Question: ...`` and
``Answer:``; it continues with the answer copied from the gold source and ``</s>``. Which source
the answer came from is known, so context-attribution methods can be scored against it.

Train it with ``python -m captum_attnflow.models.train_retrieval --out DIR``
(:mod:`captum_attnflow.models.train_retrieval`); its held-out answer accuracy, overall and by
number of sources, is in ``DIR/eval_results.json``. No checkpoint is bundled yet: no training
run on two CPU cores has yet learnt to bind each value to its own fact's person (see
docs/retrieval-model.md), and a model that cannot is no known answer. It is a plain
:class:`~transformers.Qwen3ForCausalLM` (its first layer windowed, as Qwen3 configs allow), so
``AutoModelForCausalLM.from_pretrained(DIR)`` loads it as well.
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import torch
from transformers import PreTrainedTokenizerFast, Qwen3Config, Qwen3ForCausalLM

from captum_attnflow.data.retrieval import RetrievalExample
from captum_attnflow.models.bundled import load_checkpoint

ASSET_DIR = Path(__file__).resolve().parent.parent / "assets" / "retrieval"
MAX_POSITIONS = 512  # 64 sources of at most 10 tokens (7 but for a few values of two or three words) and the question
WINDOW = 8  # tokens the first layer reads: a value's own person (just before it) and no other fact's person (10 or more back)


def retrieval_config(tokenizer: PreTrainedTokenizerFast, **overrides: object) -> Qwen3Config:
    """The bundled model's sizes: 2 layers, 4 query heads sharing 2 key/value heads of 32, hidden
    size 128; the first layer attends to a sliding window of its last :data:`WINDOW` tokens, the
    others to the whole prompt.

    The window is what makes the lookup learnable on a CPU: a fact's value can only read its own
    person in the first layer (the token before it; the previous fact's person is 10 or more
    tokens back), so the person is bound to the value from the first steps, and the later layers
    learn to match the question's person and attribute (which the value's own word names)
    against those bindings. With full attention in every layer the same training stays at the
    accuracy of guessing among the facts of the asked attribute (measured: 50 % on two facts
    after 1500 steps, against 91 % with the window after 1200).
    ``num_hidden_layers`` in ``overrides`` keeps the first layer windowed and the rest full.

    Args:
        tokenizer: the retrieval tokenizer (:func:`~captum_attnflow.data.build_retrieval_tokenizer`),
            for the vocabulary size and the special tokens.
        **overrides: any :class:`~transformers.Qwen3Config` field.

    Example::

        >>> from captum_attnflow.data import build_retrieval_tokenizer
        >>> config = retrieval_config(build_retrieval_tokenizer())
        >>> config.num_hidden_layers, config.num_attention_heads, config.num_key_value_heads, config.hidden_size
        (2, 4, 2, 128)
        >>> config.layer_types, config.sliding_window
        (['sliding_attention', 'full_attention'], 8)
    """
    layers = int(overrides.pop("num_hidden_layers", 2))
    settings: dict = dict(
        vocab_size=len(tokenizer),
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        max_position_embeddings=MAX_POSITIONS,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        tie_word_embeddings=True,
        use_sliding_window=True,
        sliding_window=WINDOW,
        layer_types=["sliding_attention"] + ["full_attention"] * (layers - 1),
        attention_dropout=0.0,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    return Qwen3Config(**{**settings, **overrides})


def load_retrieval_model(
    directory: str | Path | None = None,
    device: str | torch.device | None = None,
    dtype: str | torch.dtype | None = None,
    device_map: str | dict | None = None,
) -> tuple[Qwen3ForCausalLM, PreTrainedTokenizerFast]:
    """A trained retrieval language model (eval mode, sdpa attention; CPU unless told) and its tokenizer.

    Loads offline, without transformers' "Loading weights" progress bar.

    Args:
        directory: a checkpoint written by ``python -m captum_attnflow.models.train_retrieval
            --out DIR``; None (default) the bundled one, where the package holds one (none yet:
            the error names the training command).
        device: where the model goes (``"cpu"``, ``"cuda"``, ``"cuda:N"``, ``"mps"``, ``"auto"``
            for the first CUDA device when there is one); None (default) the CPU.
        dtype: ``"float32"``, ``"bfloat16"``, ``"float16"`` (or the torch dtype); None (default)
            the checkpoint's float32.
        device_map: accelerate's device map instead of ``device`` (``"auto"``, ...); see
            :func:`~captum_attnflow.hf.placement.load_pretrained`.

    Returns:
        tuple: ``(model, tokenizer)``, a :class:`~transformers.Qwen3ForCausalLM` and the
        word-level tokenizer of :func:`~captum_attnflow.data.build_retrieval_tokenizer`.

    Raises:
        FileNotFoundError: no model files where they should be.
        ValueError: an unknown device or dtype, or a device this torch cannot use.

    Example::

        >>> import tempfile
        >>> from captum_attnflow.data import build_retrieval_tokenizer
        >>> with tempfile.TemporaryDirectory() as out:  # an untrained checkpoint, as the training command writes it
        ...     tokenizer = build_retrieval_tokenizer()
        ...     Qwen3ForCausalLM(retrieval_config(tokenizer, num_hidden_layers=1)).save_pretrained(out)
        ...     _ = tokenizer.save_pretrained(out)
        ...     model, tokenizer = load_retrieval_model(out)
        >>> model.config.layer_types, model.training
        (['sliding_attention'], False)
    """
    path = ASSET_DIR if directory is None else Path(directory)
    return load_checkpoint(Qwen3ForCausalLM, path, "retrieval model", "captum_attnflow.models.train_retrieval",
                           device=device, dtype=dtype, device_map=device_map)


def answer_ids(example: RetrievalExample, tokenizer: PreTrainedTokenizerFast) -> list[int]:
    """The ids the model should write after the prompt: the answer's tokens, then ``</s>``.

    Example::

        >>> from captum_attnflow.data import build_retrieval_tokenizer
        >>> tokenizer = build_retrieval_tokenizer()
        >>> example = RetrievalExample(("Bob: New York (home city).",), "What is Bob's home city?", "New York", 0)
        >>> tokenizer.convert_ids_to_tokens(answer_ids(example, tokenizer))
        ['New', 'York', '</s>']
    """
    return [*tokenizer(example.answer, add_special_tokens=False)["input_ids"], tokenizer.eos_token_id]


def answer_accuracy(
    model: Qwen3ForCausalLM,
    tokenizer: PreTrainedTokenizerFast,
    examples: Sequence[RetrievalExample],
    batch_size: int = 32,
) -> dict[str, float | int]:
    """How often greedy decoding writes each example's answer and then stops.

    Greedy decoding writes the answer and ``</s>`` exactly when, reading the prompt followed by
    them, the model's most likely next token is the right one at every one of their positions;
    so one forward pass per batch decides it (right padding; prompts sorted by length, so that a
    batch holds prompts of about one length).

    Returns:
        ``{"n", "accuracy"}``.

    Example::

        >>> from captum_attnflow.data import build_retrieval_tokenizer, retrieval_examples
        >>> tokenizer = build_retrieval_tokenizer()
        >>> model = Qwen3ForCausalLM(retrieval_config(tokenizer, num_hidden_layers=1)).eval()  # untrained
        >>> answer_accuracy(model, tokenizer, retrieval_examples(16, sources=8, seed=4))
        {'n': 16, 'accuracy': 0.0}
    """
    prompts = sorted(
        ((tokenizer(example.text)["input_ids"], answer_ids(example, tokenizer)) for example in examples),
        key=lambda pair: len(pair[0]),
    )
    correct = 0
    with torch.no_grad():
        for start in range(0, len(prompts), batch_size):
            chunk = prompts[start : start + batch_size]
            width = max(len(prompt) + len(target) for prompt, target in chunk)
            ids = torch.full((len(chunk), width), tokenizer.pad_token_id)
            mask = torch.zeros_like(ids)
            for row, (prompt, target) in enumerate(chunk):
                ids[row, : len(prompt) + len(target)] = torch.tensor(prompt + target)
                mask[row, : len(prompt) + len(target)] = 1
            predicted = model(input_ids=ids.to(model.device), attention_mask=mask.to(model.device)).logits.argmax(-1).cpu()
            for row, (prompt, target) in enumerate(chunk):
                correct += predicted[row, len(prompt) - 1 : len(prompt) + len(target) - 1].tolist() == target
    return {"n": len(prompts), "accuracy": correct / max(1, len(prompts))}
