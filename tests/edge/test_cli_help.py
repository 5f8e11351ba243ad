"""``captum-attnflow --help`` is instant: building the parser imports no torch, transformers,
Captum or matplotlib, and the names it offers are those of the registries they mirror."""

from __future__ import annotations

import subprocess
import sys

from captum_attnflow.adversarial.study import DEFAULT_LAMBDAS, MODELS
from captum_attnflow.cli import _choices as choices
from captum_attnflow.hf import DEVICE_MAPS, DTYPES
from captum_attnflow.methods import EXTRA_METHODS, METHODS, attention_methods, paper_methods
from captum_attnflow.reproduce import DATA, PROTOCOLS, RANKINGS

HEAVY = ("torch", "transformers", "captum", "matplotlib", "numpy", "scipy", "huggingface_hub", "datasets")


def test_the_light_names_equal_the_registries_they_mirror():
    from captum_attnflow.benchmark import FLOOR, QUICK_EXAMPLES, QUICK_METHODS, TASKS
    from captum_attnflow.benchmark.context import CONTEXT, CONTEXT_PEERS

    assert choices.METHODS == tuple(METHODS) and choices.EXTRA_METHODS == tuple(EXTRA_METHODS)
    assert choices.ATTENTION_METHODS == attention_methods() and choices.PAPER_METHODS == paper_methods()
    assert choices.DTYPES == ("auto", *DTYPES) and choices.DEVICE_MAPS == DEVICE_MAPS
    assert (choices.BENCHMARK_TASKS, choices.FLOOR, choices.QUICK_EXAMPLES, choices.QUICK_METHODS) == (
        (*TASKS, CONTEXT), FLOOR, QUICK_EXAMPLES, QUICK_METHODS
    )
    assert choices.CONTEXT_PEERS == CONTEXT_PEERS
    assert (choices.PROTOCOLS, choices.REPRODUCE_DATA, choices.RANKINGS) == (PROTOCOLS, tuple(DATA), RANKINGS)
    assert (choices.ADVERSARIAL_MODELS, choices.DEFAULT_LAMBDAS) == (tuple(MODELS), DEFAULT_LAMBDAS)


def test_building_the_parser_and_every_help_imports_nothing_heavy():
    script = (
        "import sys\n"
        "from captum_attnflow.cli import COMMANDS, _parser\n"
        "parser = _parser()\n"
        "texts = [parser.format_help()] + [\n"
        "    action.choices[name].format_help() for action in parser._subparsers._group_actions for name in action.choices]\n"
        "assert len(texts) == len(COMMANDS) + 1 and all('--help' in text for text in texts)\n"
        f"print(sorted(name for name in {HEAVY!r} if name in sys.modules))\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def _subparsers():
    from captum_attnflow.cli import _parser

    parser = _parser()
    return parser, {name: sub for action in parser._subparsers._group_actions for name, sub in action.choices.items()}


def test_every_option_states_its_default_once_and_never_as_none():
    _, commands = _subparsers()
    for name, command in commands.items():
        for action in command._actions:
            text = action.help or ""
            assert text.count("(default:") <= 1, (name, action.option_strings, text)
            assert "(default: None)" not in text, (name, action.option_strings, text)


def test_top_level_help_offers_the_commands_for_any_model():
    parser, commands = _subparsers()
    text = " ".join(parser.format_help().split())
    assert "--model NAME_OR_DIR" in text and "on the bundled subject-verb agreement model." not in text
    takes_model = {name for name, command in commands.items() if any("--model" in a.option_strings for a in command._actions)}
    assert takes_model == set(commands) - {"adversarial"}  # the study trains its own models
