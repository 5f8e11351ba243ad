"""Evaluation of token attributions: Spearman against references, layer by layer, and AOPC."""

from captum_attnflow.evaluate.aopc import aopc_comprehensiveness, aopc_sufficiency
from captum_attnflow.evaluate.compare import compare
from captum_attnflow.evaluate.evaluator import Evaluator
from captum_attnflow.evaluate.results import ComparisonResult
from captum_attnflow.evaluate.spearman import spearman

__all__ = ["ComparisonResult", "Evaluator", "aopc_comprehensiveness", "aopc_sufficiency", "compare", "spearman"]
