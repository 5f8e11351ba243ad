"""Transformer chunk taggers: the bundled model's encoder with a per-token head.

Yang ("Is attention points out the only path?", section 4.1) tags chunks with a one-layer,
four-head transformer encoder without a causal mask, its per-token outputs going through a
linear layer and a softmax. :func:`yang_tagger_config` is that setting at hidden size 64;
:class:`TaggerConfig`'s defaults are the bundled agreement model's architecture (6 layers,
8 heads, 128 wide, paper section 2). Both run the same non-causal GPT-2 blocks as
:class:`~captum_attnflow.models.AgreementModel`, so every attention implementation, the
attention-capturing helpers and :func:`captum_attnflow.capture.attention_injection.inject_attention`
work on them unchanged.
"""

from __future__ import annotations

from pathlib import Path

import torch
from huggingface_hub.dataclasses import strict
from torch import Tensor, nn
from transformers import PreTrainedTokenizerFast
from transformers.modeling_outputs import TokenClassifierOutput
from transformers.utils.output_capturing import capture_outputs

from captum_attnflow.data.chunking import CHUNK_TAGS, IGNORE_INDEX
from captum_attnflow.docstrings import fill_docstring
from captum_attnflow.models.agreement import INPUTS_DOC, AgreementConfig, AgreementModel
from captum_attnflow.models.bundled import load_checkpoint


@strict
class TaggerConfig(AgreementConfig):
    """Configuration of :class:`TaggerModel`: :class:`~captum_attnflow.models.AgreementConfig`'s
    fields, with ``num_labels`` the number of chunk tags.

    Args:
        num_labels: tags per token, default ``len(CHUNK_TAGS)`` (8).
        **kwargs: any :class:`~captum_attnflow.models.AgreementConfig` field (``num_hidden_layers``,
            ``num_attention_heads``, ``hidden_size``, dropout rates, ...).

    Example::

        >>> config = TaggerConfig()
        >>> config.num_hidden_layers, config.num_attention_heads, config.hidden_size, config.num_labels
        (6, 8, 128, 8)
    """

    model_type = "captum_attnflow_tagger"

    num_labels: int = len(CHUNK_TAGS)


# The arguments and result of the two configurations below.
_OVERRIDES_DOC = """Args:
        **kwargs: overrides of any :class:`TaggerConfig` field.

    Returns:
        TaggerConfig"""


@fill_docstring(overrides=_OVERRIDES_DOC)
def yang_tagger_config(**kwargs) -> TaggerConfig:
    """Yang's tagger (section 4.1): one layer, four heads, here 64 wide with 256-wide MLP.

    {overrides}

    Example::

        >>> config = yang_tagger_config()
        >>> config.num_hidden_layers, config.num_attention_heads, config.hidden_size
        (1, 4, 64)
    """
    return TaggerConfig(**{"num_hidden_layers": 1, "num_attention_heads": 4, "hidden_size": 64, **kwargs})


@fill_docstring(overrides=_OVERRIDES_DOC)
def bundled_tagger_config(**kwargs) -> TaggerConfig:
    """The bundled chunk tagger's setting (:func:`load_chunk_tagger`): Yang's tagger with 4 layers
    (4 heads, 64 wide with 256-wide MLP); deep enough that per-layer methods differ from raw attention.

    {overrides}

    Example::

        >>> config = bundled_tagger_config()
        >>> config.num_hidden_layers, config.num_attention_heads, config.hidden_size
        (4, 4, 64)
    """
    return yang_tagger_config(**{"num_hidden_layers": 4, **kwargs})


class TaggerModel(AgreementModel):
    """:class:`~captum_attnflow.models.AgreementModel`'s encoder with the classifier applied to every token.

    Forward: token + position embeddings -> L non-causal GPT-2 blocks -> final LayerNorm ->
    dropout -> linear layer, logits (B, n, num_labels) for every position.

    Args:
        config: a :class:`TaggerConfig`.

    Example::

        >>> model = TaggerModel(yang_tagger_config()).eval()
        >>> model(torch.tensor([[2, 10, 11]])).logits.shape
        torch.Size([1, 3, 8])
    """

    config_class = TaggerConfig
    config: TaggerConfig
    base_model_prefix = "tagger"

    @capture_outputs
    @fill_docstring(inputs=INPUTS_DOC)
    def forward(
        self,
        input_ids: Tensor | None = None,
        attention_mask: Tensor | None = None,
        inputs_embeds: Tensor | None = None,
        position_ids: Tensor | None = None,
        labels: Tensor | None = None,
        **kwargs,
    ) -> TokenClassifierOutput:
        """Tag every token of ``[CLS] + words``.

        Args:
            {inputs}
            labels: (B, n) tag ids, ``-100`` where not scored ([CLS], padding); the loss is
                their mean cross-entropy.
            output_attentions: return the L attention maps (B, H, n, n) (eager attention only).

        Returns:
            :class:`~transformers.modeling_outputs.TokenClassifierOutput` with ``loss`` (when
            ``labels`` is given), ``logits`` (B, n, num_labels) and ``attentions``.

        Example::

            >>> model = TaggerModel(yang_tagger_config(attn_implementation="eager")).eval()
            >>> output = model(torch.tensor([[2, 10, 11]]), labels=torch.tensor([[-100, 1, 2]]),
            ...     output_attentions=True)
            >>> output.loss.shape, output.attentions[0].shape
            (torch.Size([]), torch.Size([1, 4, 3, 3]))
        """
        hidden = self.encode(input_ids, attention_mask, inputs_embeds, position_ids, **kwargs)
        logits = self.classifier(self.classifier_dropout(hidden))
        loss = None
        if labels is not None:
            loss = nn.functional.cross_entropy(
                logits.flatten(0, 1), labels.to(logits.device).flatten(), ignore_index=IGNORE_INDEX
            )
        return TokenClassifierOutput(loss=loss, logits=logits)


TAGGER_DIR = Path(__file__).resolve().parent.parent / "assets" / "tagger"


def load_chunk_tagger(
    directory: str | Path | None = None,
    device: str | torch.device | None = None,
    dtype: str | torch.dtype | None = None,
    device_map: str | dict | None = None,
) -> tuple[TaggerModel, PreTrainedTokenizerFast]:
    """The bundled trained chunk tagger (eval mode, sdpa attention; CPU unless told) and its tokenizer.

    Trained with ``python -m captum_attnflow.adversarial.train_tagger`` (defaults) on the generated
    sentences' gold chunk tags; its held-out chunk F1 is in ``assets/tagger/eval_results.json``.

    Args:
        directory: a checkpoint written by the training command to load instead; None
            (default) loads the bundled one.
        device: where the model goes (``"cpu"``, ``"cuda"``, ``"cuda:N"``, ``"mps"``, ``"auto"``
            for the first CUDA device when there is one); None (default) the CPU.
        dtype: ``"float32"``, ``"bfloat16"``, ``"float16"`` (or the torch dtype); None (default)
            the checkpoint's float32.
        device_map: accelerate's device map instead of ``device`` (``"auto"``, ...); see
            :func:`~captum_attnflow.hf.placement.load_pretrained`.

    Returns:
        tuple: ``(model, tokenizer)``, a :class:`TaggerModel` (:func:`bundled_tagger_config`)
        returning logits (B, n, 8) over :data:`~captum_attnflow.data.CHUNK_TAGS`, and the
        agreement model's word-level tokenizer (``[CLS]`` first).

    Raises:
        FileNotFoundError: no model files where they should be.
        ValueError: an unknown device or dtype, or a device this torch cannot use.

    Example::

        >>> from captum_attnflow.data import CHUNK_TAGS
        >>> model, tokenizer = load_chunk_tagger()
        >>> batch = tokenizer(["the keys to the cabinet"], return_tensors="pt")
        >>> [CHUNK_TAGS[i] for i in model(**batch).logits[0, 1:].argmax(-1)]
        ['B-NP', 'I-NP', 'B-PP', 'B-NP', 'I-NP']
    """
    path = TAGGER_DIR if directory is None else Path(directory)
    return load_checkpoint(TaggerModel, path, "tagger", "captum_attnflow.adversarial.train_tagger",
                           device=device, dtype=dtype, device_map=device_map)
