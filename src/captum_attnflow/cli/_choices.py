"""The names and defaults the commands' options offer, written out so that building the parser
(``captum-attnflow --help``) imports no torch, transformers or Captum: each is a copy of the
value where it is defined, kept equal to it by ``tests/edge/test_cli_help.py``."""

from __future__ import annotations

# captum_attnflow.methods: METHODS and EXTRA_METHODS, in registry order, and what
# attention_methods() and paper_methods() return.
METHODS = ("raw", "rollout", "flow", "gradient_rollout", "value_zeroing", "alti", "norm", "saliency", "blankout", "attnlrp")
EXTRA_METHODS = ("input_x_gradient", "integrated_gradients")
ATTENTION_METHODS = ("raw", "rollout", "flow", "gradient_rollout", "value_zeroing", "alti", "norm")
PAPER_METHODS = ("raw", "rollout", "flow")

# captum_attnflow.hf.placement: DTYPES (with "auto", the checkpoint's) and DEVICE_MAPS.
DTYPES = ("auto", "float32", "bfloat16", "float16")
DEVICE_MAPS = ("auto", "balanced", "balanced_low_0", "sequential")

# The benchmark: its tasks, the random floor's name, and --quick's examples and methods.
BENCHMARK_TASKS = ("agreement", "lm", "similarity", "chunking", "context")
CONTEXT_PEERS = ("leave-one-out", "attntrace", "contextcite-64", "contextcite-256")
FLOOR = "random"
QUICK_EXAMPLES = 16
QUICK_METHODS = ("rollout", "alti", "gradient_rollout", "saliency", FLOOR)

# captum_attnflow.reproduce: PROTOCOLS, DATA's names and RANKINGS.
PROTOCOLS = ("ours", "paper")
REPRODUCE_DATA = ("generated", "short")
RANKINGS = ("average", "dense")

# captum_attnflow.adversarial.study: MODELS' names and DEFAULT_LAMBDAS.
ADVERSARIAL_MODELS = ("yang", "deep", "agreement")
DEFAULT_LAMBDAS = (0.0, 0.2, 0.5, 1.0, 2.0, 3.0)
