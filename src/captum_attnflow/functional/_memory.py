"""Memory needed by :func:`~captum_attnflow.functional.flow`, checked before it starts.

A flow over a long input or many sources can need more memory than the machine has; failing
after minutes of max-flow work (or being killed by the operating system) helps nobody, so
:func:`flow` compares an estimate with the memory available first.
"""

from __future__ import annotations

# Bytes per edge of one example's graph (l layers of m^2 edges) while the kernel runs: the
# float32 capacities and their transpose (8), a nonzero mask (1), and per thread the float64
# flows and their transpose (16).
_GRAPH_BYTES = 9
_THREAD_BYTES = 16


def flow_bytes(layers: int, batch: int, n: int, num_sources: int, out_layers: int, threads: int) -> int:
    """Bytes :func:`flow` allocates beyond its input, at most.

    The float32 graph of the ``layers`` layers up to the highest requested one
    (``4 L B n^2``), one example's kernel arrays (``(9 + 16 T) L n^2`` for ``T`` threads) and the
    float64 result with its float32 copy (``12 L_out B S n``).

    Example::

        >>> flow_bytes(layers=12, batch=1, n=4096, num_sources=1, out_layers=1, threads=2)
        9059745792
    """
    edges = layers * n * n
    return 4 * batch * edges + (_GRAPH_BYTES + _THREAD_BYTES * threads) * edges + 12 * out_layers * batch * num_sources * n


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


def check_flow_fits(layers: int, batch: int, n: int, num_sources: int, out_layers: int, threads: int) -> None:
    """Raise ValueError if :func:`flow_bytes` exceeds the memory available (when that is known)."""
    needed = flow_bytes(layers, batch, n, num_sources, out_layers, threads)
    available = available_bytes()
    if available is None or needed <= available:
        return
    gib = 2.0**30
    raise ValueError(
        f"attention flow over {layers} layers, {batch} example(s) of {n} tokens and {num_sources} source(s) needs about "
        f"{needed / gib:.1f} GiB, but only {available / gib:.1f} GiB is available. Pass fewer sources, fewer layers "
        f"(a lower layer: the graph stops there), fewer examples per call, a shorter input (memory grows as "
        f"layers x n^2), or use fewer threads (numba.set_num_threads; each holds {_THREAD_BYTES} bytes per edge)."
    )
