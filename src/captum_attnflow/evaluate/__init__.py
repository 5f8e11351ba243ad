"""Evaluation of token attributions: Spearman against references, layer by layer; faithfulness
(AOPC, log-odds, deletion curves, perturbation AUC, a ground truth) with bootstrap intervals and
paired tests; average ranks across tasks with Friedman's and Nemenyi's tests; context attribution over
a prompt's sources (top-k drop, LDS, gold precision and recall)."""

from captum_attnflow.evaluate.aopc import aopc_comprehensiveness, aopc_sufficiency
from captum_attnflow.evaluate.compare import compare
from captum_attnflow.evaluate.context import (
    context_leaderboard,
    context_metrics,
    lds,
    precision_at_1,
    recall_at_k,
    source_scores,
    top_k_drop,
)
from captum_attnflow.evaluate.context_ablation import ResponseLogProb, ablation_masks, response_log_probs
from captum_attnflow.evaluate.evaluator import Evaluator
from captum_attnflow.evaluate.faithfulness import deletion_area, log_odds
from captum_attnflow.evaluate.friedman import CriticalDifference, critical_difference
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
    "CriticalDifference",
    "Evaluator",
    "Leaderboard",
    "Ranking",
    "ResponseLogProb",
    "ablation_masks",
    "aopc_comprehensiveness",
    "aopc_sufficiency",
    "bootstrap_interval",
    "compare",
    "context_leaderboard",
    "context_metrics",
    "critical_difference",
    "deletion_area",
    "lds",
    "log_odds",
    "paired_test",
    "perturbation_auc",
    "precision_at_1",
    "rank_methods",
    "recall_at_k",
    "response_log_probs",
    "source_scores",
    "spearman",
    "subject_first",
    "top_k_drop",
]
