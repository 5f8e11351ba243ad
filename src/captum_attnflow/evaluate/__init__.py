"""Evaluation of token attributions: Spearman against references, layer by layer; faithfulness
(AOPC, log-odds, deletion curves, perturbation AUC, a ground truth) with bootstrap intervals and
paired tests."""

from captum_attnflow.evaluate.aopc import aopc_comprehensiveness, aopc_sufficiency
from captum_attnflow.evaluate.compare import compare
from captum_attnflow.evaluate.evaluator import Evaluator
from captum_attnflow.evaluate.faithfulness import deletion_area, log_odds
from captum_attnflow.evaluate.ground_truth import subject_first
from captum_attnflow.evaluate.leaderboard import Leaderboard
from captum_attnflow.evaluate.metrics import METRICS
from captum_attnflow.evaluate.results import ComparisonResult
from captum_attnflow.evaluate.spearman import spearman
from captum_attnflow.evaluate.statistics import Ranking, bootstrap_interval, paired_test, rank_methods
from captum_attnflow.evaluate.vision import perturbation_auc

__all__ = [
    "METRICS",
    "ComparisonResult",
    "Evaluator",
    "Leaderboard",
    "Ranking",
    "aopc_comprehensiveness",
    "aopc_sufficiency",
    "bootstrap_interval",
    "compare",
    "deletion_area",
    "log_odds",
    "paired_test",
    "perturbation_auc",
    "rank_methods",
    "spearman",
    "subject_first",
]
