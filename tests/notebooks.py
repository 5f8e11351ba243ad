"""Runs a tutorial notebook top to bottom in a fresh process, as a Jupyter kernel would.

Each notebook gets a process of its own, forked from a server process (multiprocessing's
``forkserver``) that imported torch, transformers, Captum, matplotlib and the package once.
A kernel per notebook (nbmake) paid those imports, 8-9 s of CPU, eight times in every test
run; a fork shares them and still starts every notebook from a clean state. The server only
imports, it never runs torch, so forking from it is safe (forking a process whose OpenMP
threads are running is not). Where ``forkserver`` is missing (Windows), ``spawn`` runs each
notebook in a new interpreter, imports included.

In the child, the code cells run in order in an IPython shell (what ipykernel runs too),
magics included, with the notebook's folder as the working directory; every display is
formatted in all of IPython's formats, so figures are drawn as they would be in Jupyter.
The first cell that raises ends the run.
"""

from __future__ import annotations

import contextlib
import io
import json
import multiprocessing
import os
import traceback
from pathlib import Path

# What the tutorials import, loaded once by the server (a missing one is skipped there).
PRELOAD = [
    "torch",
    "transformers",
    "transformers.modeling_utils",
    "captum.attr",
    "captum_attnflow.attr",
    "captum_attnflow.evaluate",
    "captum_attnflow.benchmark",
    "matplotlib.pyplot",
    "matplotlib_inline.backend_inline",
    "scipy.stats",
    "IPython",
    "nbformat",
    "numba",
]
# Characters of a failing notebook's printed output shown with its error.
OUTPUT_TAIL = 3000


def _context():
    if "forkserver" in multiprocessing.get_all_start_methods():
        context = multiprocessing.get_context("forkserver")
        context.set_forkserver_preload(PRELOAD)
        return context
    return multiprocessing.get_context("spawn")


def run_notebook(path: Path, timeout: float = 600.0) -> str | None:
    """Execute the notebook at ``path``; None if every cell ran, else what failed (cell, traceback, output)."""
    context = _context()
    receiver, sender = context.Pipe(duplex=False)
    process = context.Process(target=_execute, args=(str(path), sender), daemon=True)
    process.start()
    sender.close()
    try:
        if not receiver.poll(timeout):
            return f"{path.name} still running after {timeout:.0f} s"
        report = json.loads(receiver.recv_bytes())
    except EOFError:  # the child ended without sending its report
        process.join(5)
        return f"{path.name}: the process running it died (exit code {process.exitcode})"
    finally:
        process.kill()
        process.join()
    return report["failure"]


def _execute(path: str, sender) -> None:
    """The child: run the code cells, send ``{"failure": None or text}`` as JSON."""
    import nbformat
    from IPython.core.interactiveshell import InteractiveShell

    class Shell(InteractiveShell):
        def enable_gui(self, gui=None):
            # ``%matplotlib inline`` asks for an event loop: the inline backend needs none,
            # as in ipykernel's shell.
            pass

    os.chdir(Path(path).parent)
    notebook = nbformat.read(path, as_version=4)
    shell = Shell.instance()
    shell.display_formatter.active_types = list(shell.display_formatter.formatters)
    printed = io.StringIO()
    failure = None
    with contextlib.redirect_stdout(printed), contextlib.redirect_stderr(printed):
        for index, cell in enumerate(notebook.cells):
            if cell.cell_type != "code":
                continue
            result = shell.run_cell(cell.source)
            if not result.success:
                error = result.error_in_exec or result.error_before_exec
                failure = (
                    f"{Path(path).name}, cell {index}:\n{cell.source}\n\n"
                    + "".join(traceback.format_exception(error))
                    + f"\nprinted output (end):\n{printed.getvalue()[-OUTPUT_TAIL:]}"
                )
                break
    sender.send_bytes(json.dumps({"failure": failure}).encode())
    sender.close()
