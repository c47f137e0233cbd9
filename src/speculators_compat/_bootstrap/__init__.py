"""Carry activation into every Python process an activated process starts.

Why: ``activate()`` patches only its own process. vLLM's workers are spawned, and with
``spawn`` Python re-runs the parent's main script in each worker before any vLLM code
(so before the ``vllm.general_plugins`` entry point) runs there. A script that imports
speculators at module level then fails in the worker on transformers 5.

How: :func:`install` (called by every activation, through its Patcher) prepends this
folder to ``PYTHONPATH``. Its ``sitecustomize.py`` runs at the start of every child
interpreter, after site processing and before the main script, and calls :func:`start`
when ``SPECULATORS_COMPAT_ACTIVE`` is set. Nothing happens in processes that never
activated: the folder is on ``PYTHONPATH`` only below an activated process.
"""

from __future__ import annotations

import os
import sys

from .. import _env

#: This folder: the one put on PYTHONPATH (it holds ``sitecustomize.py``).
DIRECTORY = os.path.dirname(os.path.abspath(__file__))

#: ``-c`` programs of multiprocessing helpers that never run user code: no activation.
_HELPERS = ("multiprocessing.resource_tracker", "multiprocessing.semaphore_tracker",
            "multiprocess.resource_tracker")
#: ``-c`` program of the forkserver, whose forked children are worker processes.
_FORKSERVERS = ("multiprocessing.forkserver", "multiprocess.forkserver")


def on_pythonpath(value: str | None = None) -> bool:
    """Whether :data:`DIRECTORY` is an entry of ``PYTHONPATH`` (of ``value`` if given)."""
    value = os.environ.get("PYTHONPATH", "") if value is None else value
    return any(_same(entry) for entry in value.split(os.pathsep) if entry)


def _same(entry: str) -> bool:
    try:
        return os.path.samefile(entry, DIRECTORY)
    except OSError:
        return False


def install(patcher, process: str) -> None:
    """Prepend :data:`DIRECTORY` to ``PYTHONPATH`` (undone by ``deactivate()``).

    Called by every activation. A no-op where the folder is already there (children
    of an activated process inherit it).
    """
    current = os.environ.get("PYTHONPATH")
    if on_pythonpath(current):
        return
    patcher.setenv("PYTHONPATH", DIRECTORY + (os.pathsep + current if current else ""))


def process_kind(argv: list[str] | None = None, orig_argv: list[str] | None = None) -> str | None:
    """What this freshly started interpreter is, from its command line.

    ``"worker"``: a ``multiprocessing`` spawn child (``--multiprocessing-fork``), which
    is what vLLM's worker and engine-core processes are (as are spawn children of any
    other library); it gets the worker-phase adapters, like the plugin gives them. So
    does a ``forkserver`` (its forked children are workers).
    ``None``: a multiprocessing helper that never runs user code (resource tracker):
    nothing to do. ``"driver"``: any other Python (a script the user's code starts):
    it may run speculators' generator itself, so it gets the whole activation.
    """
    argv = sys.argv if argv is None else argv
    orig_argv = list(getattr(sys, "orig_argv", argv)) if orig_argv is None else orig_argv
    if "--multiprocessing-fork" in argv or "--multiprocessing-fork" in orig_argv:
        return "worker"
    if "-c" in orig_argv:
        code = orig_argv[orig_argv.index("-c") + 1:][:1]
        if code and any(h in code[0] for h in _HELPERS):
            return None
        if code and any(h in code[0] for h in _FORKSERVERS):
            return "worker"
    return "driver"


def start() -> None:
    """Activate in a freshly started interpreter (called by ``sitecustomize``).

    Never raises: the interpreter must start whatever happens here. A child that
    activates as driver does not write ``SPECULATORS_COMPAT_REPORT_FILE``: that file
    is the explicitly activated process's report.
    """
    if not _env.flag(os.environ.get(_env.ACTIVE)):
        return
    kind = process_kind()
    if kind is None:
        return
    try:
        from .. import _ACTIVATION

        _ACTIVATION.activate(process=kind, write_report=False)
    except Exception as exc:  # noqa: BLE001 - never take the interpreter down
        sys.stderr.write(
            f"speculators-compat: WARNING: activation at interpreter start failed in pid "
            f"{os.getpid()} ({kind}): {type(exc).__name__}: {exc}\n")
