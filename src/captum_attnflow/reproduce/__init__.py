"""Reproduce Tables 1 and 2 of Abnar & Zuidema (2020) on the bundled verb-number model.

Section 2 of the paper correlates, for 2000 held-out examples, the attention-based token
scores of the CLS embedding after each layer (raw attention, rollout, flow) with two
references computed on the model's output: blank-out (Table 1) and input gradients
(Table 2). :func:`reproduce` runs the same experiment with :class:`~captum_attnflow.evaluate.Evaluator`
on held-out generated data (:func:`captum_attnflow.data.generate_examples` with
``split="test"``) and adds a score with a ground truth no paper table has: how often a method
ranks the verb's subject above every agreement attractor.

Two protocols measure the correlations:

* ``"ours"`` (default): both references explain the correct class; blank-out replaces a
  token by ``[UNK]`` and takes the signed drop in that class's probability, input gradients
  are the L2 norm of the gradient of the class logit with respect to each token embedding
  (:class:`~captum_attnflow.baselines.TokenSaliency`); Spearman's rho (average ranks for
  ties) is taken over the words of the sentence, leaving out ``[CLS]`` (``include_cls=True``
  keeps it) and any end token; undefined correlations are left out of the means and counted.
* ``"paper"``: the definitions of the authors' released code, computed beside ours from the
  same forward passes. Blank-out is the absolute change :math:`|p_{gold} - p_{gold}(x_{i
  \\leftarrow [UNK]})|`; every token is ranked, ``[CLS]`` (blanked like any other) and an end
  token (for a model trained with one, see ``python -m captum_attnflow.models.train
  --end-token``) included, the end token never blanked (score 0); the gradient reference is
  :func:`gradient_sum`, :math:`|\\sum_d \\partial (p_{sg} - p_{pl}) / \\partial e_{i,d}|`, in
  float32 as theirs and in float64 beside it (it is 0 in exact arithmetic for this model:
  what float32 gives is rounding). ``ranking="dense"`` adds their Spearman formula,
  :func:`dense_rank_spearman`.

Raw attention is the head mean of the CLS row, rollout and flow use the paper's
:math:`A = 0.5 W + 0.5 I` graph with head-mean fusion. The methods come from the registry
:data:`captum_attnflow.methods.METHODS`, the one the command line uses.
"""

from captum_attnflow.reproduce.authors import dense_rank_spearman, gradient_sum
from captum_attnflow.reproduce.experiment import DATA, PROTOCOLS, RANKINGS, reproduce
from captum_attnflow.reproduce.paper import (
    BLANK_OUT,
    DENSE,
    GRADIENTS,
    OURS_REFERENCES,
    PAPER_REFERENCES,
    PAPER_TABLES,
    TABLE_NUMBERS,
    paper_table,
)
from captum_attnflow.reproduce.result import Reproduction
from captum_attnflow.reproduce.scoring import BLANK_OUT_SEQUENCES, TIE_ATOL

__all__ = [
    "BLANK_OUT",
    "BLANK_OUT_SEQUENCES",
    "DATA",
    "DENSE",
    "GRADIENTS",
    "OURS_REFERENCES",
    "PAPER_REFERENCES",
    "PAPER_TABLES",
    "PROTOCOLS",
    "RANKINGS",
    "TABLE_NUMBERS",
    "TIE_ATOL",
    "Reproduction",
    "dense_rank_spearman",
    "gradient_sum",
    "paper_table",
    "reproduce",
]
