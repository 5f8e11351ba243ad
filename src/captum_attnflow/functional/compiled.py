"""CPU kernels compiled by numba on their first call, so that importing the package does not import numba."""

from __future__ import annotations

import functools
import threading
from typing import Any, Callable


def njit_on_first_call(**options: Any) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """``numba.njit(**options)``, applied when the kernel is first called rather than at import.

    Importing numba (LLVM) adds about 50 MB to a process and a quarter of a second; a process
    that never runs one of these kernels (rollout and raw attention on the lean path, anything
    on a GPU) should not pay it. The kernel may only be called from Python, not from another
    numba function. With ``cache=True`` the compiled code is read from numba's on-disk cache
    as usual (:mod:`captum_attnflow.functional.precompile`).
    """

    def decorate(function: Callable[..., Any]) -> Callable[..., Any]:
        compiled: list[Callable[..., Any]] = []
        lock = threading.Lock()

        @functools.wraps(function)
        def kernel(*args: Any) -> Any:
            if not compiled:
                with lock:
                    if not compiled:
                        from numba import njit

                        compiled.append(njit(**options)(function))
            return compiled[0](*args)

        return kernel

    return decorate
