"""The paper's verb-number model: a non-causal encoder of GPT-2 blocks classifying from a CLS token.

Abnar & Zuidema (2020), section 2: "a Transformer encoder, with GPT-2 Transformer blocks
(without masking). The model has 6 layers, and 8 heads, with hidden/embedding size of 128.
Similar to Bert we add a CLS token and use its embedding in the final layer as the input to
the classifier." The blocks are transformers' own :class:`~transformers.models.gpt2.modeling_gpt2.GPT2Block`
with the causal flag of their attention switched off and a bidirectional padding mask, so
eager, sdpa and the other attention implementations all work, and ``output_attentions=True``
is recorded by transformers' own output-capturing hooks (eager attention returns the maps;
sdpa returns none, which :func:`captum_attnflow.extract_attentions` handles).
"""

from __future__ import annotations

import torch
from huggingface_hub.dataclasses import strict
from torch import Tensor, nn
from transformers import PreTrainedConfig, PreTrainedModel
from transformers.masking_utils import create_bidirectional_mask
from transformers.modeling_outputs import SequenceClassifierOutput
from transformers.models.gpt2.modeling_gpt2 import GPT2Attention, GPT2Block, GPT2MLP
from transformers.pytorch_utils import Conv1D
from transformers.utils.output_capturing import OutputRecorder, capture_outputs

from captum_attnflow.data.agreement import vocabulary
from captum_attnflow.data.tokenizer import SPECIAL_TOKENS
from captum_attnflow.docstrings import fill_docstring

# The inputs of the models' forward (this one's and the taggers'), documented once.
INPUTS_DOC = """input_ids: (B, n) token ids, ``[CLS]`` at position 0; or give ``inputs_embeds``.
            attention_mask: (B, n), 1 for real tokens and 0 for (right) padding.
            inputs_embeds: (B, n, hidden_size) token embeddings instead of ``input_ids``.
            position_ids: (B, n) or (1, n) positions, default ``0..n-1``."""


@strict
class AgreementConfig(PreTrainedConfig):
    """Configuration of :class:`AgreementModel`; the defaults are the paper's sizes.

    The field names are the ones transformers' GPT-2 blocks read (``n_inner``,
    ``activation_function``, ``attn_pdrop``, ...). ``num_labels`` is 2 (singular, plural).

    Args:
        vocab_size: token ids, default the 4 special tokens plus the generator's vocabulary.
        max_position_embeddings: longest input in tokens (64).
        hidden_size, num_hidden_layers, num_attention_heads: 128, 6 and 8, the paper's.
        n_inner: width of the MLPs; None means ``4 * hidden_size``.
        resid_pdrop, embd_pdrop, attn_pdrop, classifier_dropout: dropout rates (0.1).
        pad_token_id, cls_token_id: ids of ``[PAD]`` (0) and ``[CLS]`` (2).
        **kwargs: the other fields above and any :class:`~transformers.PreTrainedConfig`
            argument.

    Example::

        >>> config = AgreementConfig(num_hidden_layers=2)
        >>> config.num_hidden_layers, config.num_attention_heads, config.hidden_size, config.num_labels
        (2, 8, 128, 2)
    """

    model_type = "captum_attnflow_agreement"

    vocab_size: int = len(SPECIAL_TOKENS) + len(vocabulary())
    max_position_embeddings: int = 64
    hidden_size: int = 128
    num_hidden_layers: int = 6
    num_attention_heads: int = 8
    n_inner: int | None = None
    activation_function: str = "gelu_new"
    resid_pdrop: float | int = 0.1
    embd_pdrop: float | int = 0.1
    attn_pdrop: float | int = 0.1
    classifier_dropout: float | int = 0.1
    layer_norm_epsilon: float = 1e-5
    initializer_range: float = 0.02
    scale_attn_weights: bool = True
    scale_attn_by_inverse_layer_idx: bool = False
    reorder_and_upcast_attn: bool = False
    add_cross_attention: bool = False
    pad_token_id: int | None = SPECIAL_TOKENS.index("[PAD]")
    cls_token_id: int = SPECIAL_TOKENS.index("[CLS]")
    tie_word_embeddings: bool = False


class AgreementModel(PreTrainedModel):
    """Encoder of ``num_hidden_layers`` non-causal GPT-2 blocks; logits from the final CLS embedding.

    Forward: token + learned position embeddings -> L pre-norm GPT-2 blocks (full
    bidirectional self-attention over the non-padding tokens) -> final LayerNorm -> the
    embedding at position 0 (``[CLS]``) -> dropout -> linear classifier (B, num_labels).

    Args:
        config: an :class:`AgreementConfig`; weights are initialised as GPT-2's. The trained
            model is :func:`~captum_attnflow.load_agreement_model`.

    Example:
        >>> model = AgreementModel(AgreementConfig(num_hidden_layers=2)).eval()
        >>> out = model(torch.tensor([[2, 10, 11]]), output_attentions=True)
        >>> out.logits.shape
        torch.Size([1, 2])
    """

    config_class = AgreementConfig
    config: AgreementConfig
    base_model_prefix = "agreement"
    main_input_name = "input_ids"
    _no_split_modules = ["GPT2Block"]
    _supports_sdpa = True
    _supports_flash_attn = True
    _supports_flex_attn = True
    _supports_attention_backend = True
    _can_record_outputs = {"attentions": OutputRecorder(GPT2Attention, index=1)}

    def __init__(self, config: AgreementConfig):
        super().__init__(config)
        self.num_labels = config.num_labels
        self.wte = nn.Embedding(config.vocab_size, config.hidden_size, padding_idx=config.pad_token_id)
        self.wpe = nn.Embedding(config.max_position_embeddings, config.hidden_size)
        self.drop = nn.Dropout(config.embd_pdrop)
        self.h = nn.ModuleList(GPT2Block(config, layer_idx=i) for i in range(config.num_hidden_layers))
        for block in self.h:
            # The paper's encoder uses GPT-2 blocks "without masking": attention implementations
            # read this flag to decide on a causal mask when none is passed.
            block.attn.is_causal = False
        self.ln_f = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_epsilon)
        self.classifier_dropout = nn.Dropout(config.classifier_dropout)
        self.classifier = nn.Linear(config.hidden_size, config.num_labels)
        self.post_init()

    def get_input_embeddings(self) -> nn.Embedding:
        """The token embedding layer (vocab_size, hidden_size), which the gradient baselines explain."""
        return self.wte

    def set_input_embeddings(self, embeddings: nn.Embedding) -> None:
        """Replace the token embedding layer (transformers calls it to resize the vocabulary)."""
        self.wte = embeddings

    @torch.no_grad()
    def _init_weights(self, module: nn.Module) -> None:
        super()._init_weights(module)
        if isinstance(module, Conv1D):
            nn.init.normal_(module.weight, mean=0.0, std=self.config.initializer_range)
            nn.init.zeros_(module.bias)
        # GPT-2's scaled initialisation of the residual projections (1/sqrt(2 L)).
        if isinstance(module, (GPT2Attention, GPT2MLP)):
            std = self.config.initializer_range / (2 * self.config.num_hidden_layers) ** 0.5
            nn.init.normal_(module.c_proj.weight, mean=0.0, std=std)

    def encode(
        self,
        input_ids: Tensor | None = None,
        attention_mask: Tensor | None = None,
        inputs_embeds: Tensor | None = None,
        position_ids: Tensor | None = None,
        **kwargs,
    ) -> Tensor:
        """The final, layer-normalised hidden states (B, n, hidden_size) of ``[CLS] + words``,
        which the heads of this model and of the taggers read (arguments as in :meth:`forward`).

        Example::

            >>> model = AgreementModel(AgreementConfig(num_hidden_layers=2)).eval()
            >>> model.encode(torch.tensor([[2, 10, 11]])).shape
            torch.Size([1, 3, 128])
        """
        kwargs.pop("output_attentions", None)
        kwargs.pop("output_hidden_states", None)
        if (input_ids is None) == (inputs_embeds is None):
            raise ValueError("give exactly one of input_ids (B, n) and inputs_embeds (B, n, hidden_size).")
        if inputs_embeds is None:
            if input_ids.dim() != 2:
                raise ValueError(f"input_ids must be (B, n) token ids, got shape {tuple(input_ids.shape)}.")
            inputs_embeds = self.wte(input_ids)
        n = inputs_embeds.shape[1]
        if n > self.config.max_position_embeddings:
            raise ValueError(
                f"the input has {n} tokens but the model has {self.config.max_position_embeddings} positions; "
                "shorten the sentence."
            )
        if position_ids is None:
            position_ids = torch.arange(n, device=inputs_embeds.device).unsqueeze(0)
        hidden = self.drop(inputs_embeds + self.wpe(position_ids))
        mask = create_bidirectional_mask(config=self.config, inputs_embeds=hidden, attention_mask=attention_mask)
        for block in self.h:
            hidden = block(hidden, attention_mask=mask, **kwargs)
        return self.ln_f(hidden)

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
    ) -> SequenceClassifierOutput:
        """Classify the verb's number from ``[CLS] + words``.

        Args:
            {inputs}
            labels: (B,) 0 singular / 1 plural; the loss is their cross-entropy.
            output_attentions: return the L attention maps (B, H, n, n) (eager attention only;
                other implementations return an empty tuple).

        Returns:
            :class:`~transformers.modeling_outputs.SequenceClassifierOutput` with ``loss``
            (when ``labels`` is given), ``logits`` (B, 2) and ``attentions``.

        Example::

            >>> model = AgreementModel(AgreementConfig(num_hidden_layers=2)).eval()
            >>> ids = torch.tensor([[2, 10, 11, 12], [2, 13, 14, 0]])
            >>> output = model(ids, attention_mask=(ids != 0).long(), labels=torch.tensor([0, 1]),
            ...     output_attentions=True)  # sdpa by default: no attention maps
            >>> output.logits.shape, output.loss.shape, output.attentions
            (torch.Size([2, 2]), torch.Size([]), ())
        """
        cls = self.encode(input_ids, attention_mask, inputs_embeds, position_ids, **kwargs)[:, 0]
        logits = self.classifier(self.classifier_dropout(cls))
        loss = None
        if labels is not None:
            loss = nn.functional.cross_entropy(logits, labels.to(logits.device))
        return SequenceClassifierOutput(loss=loss, logits=logits)
