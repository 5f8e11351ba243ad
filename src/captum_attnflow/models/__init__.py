"""The paper's verb-number agreement model (section 2) and the bundled trained checkpoint."""

from captum_attnflow.models.agreement import AgreementConfig, AgreementModel
from captum_attnflow.models.bundled import load_agreement_model

__all__ = ["AgreementConfig", "AgreementModel", "load_agreement_model"]
from captum_attnflow.models.language_model import load_agreement_lm  # noqa: E402

__all__ += ["load_agreement_lm"]
from captum_attnflow.models.tagger import load_chunk_tagger  # noqa: E402

__all__ += ["load_chunk_tagger"]
from captum_attnflow.models.retrieval import load_retrieval_model  # noqa: E402

__all__ += ["load_retrieval_model"]
