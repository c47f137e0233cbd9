"""Carry activation into every Python process an activated process starts.

Why: ``activate()`` patches only its own process. vLLM's workers are spawned, and with
``spawn`` Python re-runs the parent's main script in each worker before any vLLM code
(so before the ``vllm.general_plugins`` entry point) runs there. A script that imports
speculators at module level then fails in the worker on transformers 5.

How: :func:`install` (called by every activation, through its Patcher) prepends this
folder to ``PYTHONPATH``. Its ``sitecustomize.py`` runs at the start of every child
interpreter, after site processing and before the main script; when
``SPECULATORS_COMPAT_ACTIVE`` is set it arms a ``sys.meta_path`` finder that calls
:func:`speculators_compat._process.start` on the first import of ``speculators`` or
``vllm``, before that import runs (a child that imports neither pays nothing). This
module holds only what the folder and the command line tell (it imports no activation).
Nothing happens in processes that
never activated: the folder is on ``PYTHONPATH`` only below an activated process.
"""

from __future__ import annotations

import os
import sys

from .._patcher import ENVIRON

#: This folder: the one put on PYTHONPATH (it holds ``sitecustomize.py``).
DIRECTORY = os.path.dirname(os.path.abspath(__file__))

#: ``-c`` programs of multiprocessing helpers that never run user code: no activation.
_HELPERS = ("multiprocessing.resource_tracker", "multiprocessing.semaphore_tracker",
            "multiprocess.resource_tracker")
#: ``-c`` program of the forkserver, whose forked children are worker processes.
_FORKSERVERS = ("multiprocessing.forkserver", "multiprocess.forkserver")
#: ``-m`` modules of vLLM's own helper processes (e.g. ``vllm.model_executor.models.registry``,
#: which vLLM runs in a subprocess to inspect a model class): worker-phase adapters only.
_VLLM_MODULES = ("vllm.",)
#: ``-m`` modules of helpers that never import speculators (torch's compile workers).
_NO_ACTIVATION_MODULES = ("torch.", "triton.")


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
    """Prepend :data:`DIRECTORY` to ``PYTHONPATH`` (``deactivate()`` removes it again,
    and only it).

    Called by every activation. A no-op where the folder is already there (children
    of an activated process inherit it).
    """
    current = os.environ.get("PYTHONPATH")
    if on_pythonpath(current):
        return
    os.environ["PYTHONPATH"] = DIRECTORY + (os.pathsep + current if current else "")
    patcher.on_revert("os.environ['PYTHONPATH']", lambda: uninstall(current),
                      f"{ENVIRON}:PYTHONPATH")


def uninstall(previous: str | None) -> None:
    """Remove only :data:`DIRECTORY` from ``PYTHONPATH``: entries added since
    :func:`install` stay. ``previous``: the value before it, restored exactly when
    nothing else changed (an unset variable stays unset)."""
    value = os.environ.get("PYTHONPATH")
    if value is None:
        return
    kept = [entry for entry in value.split(os.pathsep) if not (entry and _same(entry))]
    rest = os.pathsep.join(kept)
    if value == DIRECTORY + (os.pathsep + previous if previous else ""):
        rest = previous
    if rest is None:
        os.environ.pop("PYTHONPATH", None)
    else:
        os.environ["PYTHONPATH"] = rest


def process_kind(argv: list[str] | None = None, orig_argv: list[str] | None = None) -> str | None:
    """What this freshly started interpreter is, from its command line.

    ``"worker"``: a ``multiprocessing`` spawn child (``--multiprocessing-fork``), which
    is what vLLM's worker and engine-core processes are (as are spawn children of any
    other library); it gets the worker-phase adapters, like the plugin gives them. So
    do a ``forkserver`` (its forked children are workers) and vLLM's own helper
    processes started as ``python -m vllm....`` (its model-registry inspection): they
    do not run speculators' generator, and a full activation would import it there.
    ``None`` too for ``python -m torch...`` / ``triton...`` helpers (compile workers).
    ``None``: a multiprocessing helper that never runs user code (resource tracker):
    nothing to do. ``"driver"``: any other Python (a script the user's code starts):
    it may run speculators' generator itself, so it gets the whole activation.
    """
    argv = sys.argv if argv is None else argv
    orig_argv = list(getattr(sys, "orig_argv", argv)) if orig_argv is None else orig_argv
    if "--multiprocessing-fork" in argv or "--multiprocessing-fork" in orig_argv:
        return "worker"
    how, what = _launch(orig_argv)
    if how == "-c" and any(h in what for h in _HELPERS):
        return None
    if how == "-c" and any(h in what for h in _FORKSERVERS):
        return "worker"
    if how == "-m" and what.startswith(_NO_ACTIVATION_MODULES):
        return None
    if how == "-m" and what.startswith(_VLLM_MODULES):
        return "worker"
    return "driver"


def _launch(orig_argv: list[str]) -> tuple[str, str]:
    """(``"-c"``, code) / (``"-m"``, module) / (``"script"``, path) from the interpreter's
    own command line; options before them are skipped (the script's arguments are not
    looked at)."""
    args = iter(orig_argv[1:])
    for a in args:
        if a in ("-c", "-m"):
            return a, next(args, "")
        if a in ("-W", "-X", "--check-hash-based-pycs"):
            next(args, None)
        elif not a.startswith("-") or a == "-":
            return "script", a
    return "script", ""
