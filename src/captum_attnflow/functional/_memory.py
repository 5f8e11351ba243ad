"""Memory needed by :func:`~captum_attnflow.functional.flow`, checked before it starts.

A flow over a long input or many sources can need more memory than the machine has; failing
after minutes of max-flow work (or being killed by the operating system) helps nobody, so
:func:`flow` compares an estimate with the memory available first.
"""

from __future__ import annotations

# Bytes per edge of one example's graph while the kernel runs: its float32 capacities (4) and,
# per thread, float64 flows in the same packed layout (8).
_GRAPH_BYTES = 4
_THREAD_BYTES = 8
# Bytes per node of one example's graph: where each row starts and the spans of its row and column.
_NODE_BYTES = 40


def flow_bytes(
    layers: int, batch: int, n: int, num_sources: int, out_layers: int, threads: int, causal: bool = False
) -> int:
    """Bytes :func:`flow` allocates beyond its input, at most.

    Each example's graph of the ``layers`` layers up to the highest requested one keeps
    ``E = L n (n + 1) / 2`` edges when ``causal`` (the lower triangles), else ``E = L n^2``;
    the float32 capacities of all examples take ``4 B E``, the float64 flows of the ``T``
    kernel threads ``8 T E`` (the most they can touch), the row offsets and spans ``40 B L n``,
    the one (B, n, n) float32 layer the graph is built from ``4 B n^2``, and the float64 result
    with its float32 copy ``12 L_out B S n``: ``(4 B + 8 T) E`` dominates.

    Example::

        >>> flow_bytes(layers=12, batch=1, n=4096, num_sources=1, out_layers=1, threads=2, causal=True)
        2082881536
    """
    per_layer = n * (n + 1) // 2 if causal else n * n
    edges = layers * per_layer
    return (
        (_GRAPH_BYTES * batch + _THREAD_BYTES * threads) * edges
        + _NODE_BYTES * batch * layers * n
        + 4 * batch * n * n
        + 12 * out_layers * batch * num_sources * n
    )


def available_bytes() -> int | None:
    """Memory the system can still give this process (``MemAvailable``), None where unknown."""
    try:
        with open("/proc/meminfo") as info:
            for line in info:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        import psutil
    except ImportError:
        return None
    return int(psutil.virtual_memory().available)


def check_flow_fits(
    layers: int, batch: int, n: int, num_sources: int, out_layers: int, threads: int, causal: bool = False
) -> None:
    """Raise ValueError if :func:`flow_bytes` exceeds the memory available (when that is known)."""
    needed = flow_bytes(layers, batch, n, num_sources, out_layers, threads, causal)
    available = available_bytes()
    if available is None or needed <= available:
        return
    gib = 2.0**30
    raise ValueError(
        f"attention flow over {layers} layers, {batch} example(s) of {n} tokens and {num_sources} source(s) needs about "
        f"{needed / gib:.1f} GiB, but only {available / gib:.1f} GiB is available. Pass fewer sources, fewer layers "
        f"(a lower layer: the graph stops there), fewer examples per call, a shorter input (memory grows as "
        f"layers x n^2, half that for a decoder's causal attention), or use fewer threads (numba.set_num_threads; "
        f"each holds {_THREAD_BYTES} bytes per edge)."
    )
