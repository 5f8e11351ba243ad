"""Loading the agreement model and tokenizer that ship inside the package (no network needed)."""

from __future__ import annotations

from pathlib import Path

from transformers import PreTrainedTokenizerFast

from captum_attnflow.models.agreement import AgreementModel

ASSET_DIR = Path(__file__).resolve().parent.parent / "assets" / "agreement"


def load_agreement_model() -> tuple[AgreementModel, PreTrainedTokenizerFast]:
    """The bundled trained verb-number model (eval mode, CPU, sdpa attention) and its tokenizer.

    Trained with ``python -m captum_attnflow.models.train`` (defaults); the held-out accuracy
    measured then is in ``assets/agreement/eval_results.json``.

    Returns:
        tuple: ``(model, tokenizer)``, an :class:`~captum_attnflow.models.AgreementModel`
        (6 layers, 8 heads, hidden size 128) and the word-level
        :class:`~transformers.PreTrainedTokenizerFast` that prepends ``[CLS]``.

    Raises:
        FileNotFoundError: the package was installed without its model files.

    Example:
        >>> model, tokenizer = load_agreement_model()
        >>> batch = tokenizer(["the keys to the cabinet"], return_tensors="pt")
        >>> model(**batch).logits.argmax(-1).item()  # 1: plural
        1
    """
    if not (ASSET_DIR / "model.safetensors").is_file():
        raise FileNotFoundError(
            f"the bundled agreement model is missing from {ASSET_DIR}; reinstall captum-attnflow, "
            "or train one with `python -m captum_attnflow.models.train --out DIR` and load it with "
            "AgreementModel.from_pretrained(DIR)."
        )
    model = AgreementModel.from_pretrained(ASSET_DIR, local_files_only=True).eval()
    tokenizer = PreTrainedTokenizerFast.from_pretrained(ASSET_DIR, local_files_only=True)
    return model, tokenizer
