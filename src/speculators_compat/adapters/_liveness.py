"""Whether a generator's vLLM worker processes are still alive.

Why: when a worker dies (OOM killer, SIGKILL, a crash in native code), vLLM's
``MultiprocExecutor`` notices it in a monitor thread, marks itself failed and shuts
down: the call in flight fails with ``RuntimeError: cancelled``, and every later RPC
with ``AssertionError('collective_rpc should not be called on follower node')``,
neither of which says that a process died or what to do.
How: the executor keeps a handle per worker (``executor.workers[i].proc``, a
``multiprocessing`` process) and sets ``is_failed``; :func:`dead_workers` reads those
(probed with ``getattr``: an executor without them has nothing to report) and
:func:`describe` names each dead worker with its pid and exit code.
"""

from __future__ import annotations

import signal


def dead_workers(executor) -> list[str]:
    """One description per worker process of ``executor`` that has exited."""
    found = []
    for rank, handle in enumerate(getattr(executor, "workers", None) or ()):
        proc = getattr(handle, "proc", None)
        try:
            code = None if proc is None else proc.exitcode
        except (AssertionError, ValueError, OSError):  # not our child / closed handle
            continue
        if code is None:
            continue
        how = f"exit code {code}"
        if code < 0:
            try:
                how += f", killed by {signal.Signals(-code).name}"
            except ValueError:
                pass
        found.append(f"worker {getattr(proc, 'name', rank)} (pid {proc.pid}, {how})")
    if not found and getattr(executor, "is_failed", False) is True:
        found.append("a worker (vLLM's executor marked itself failed)")
    return found


def describe(dead: list[str], rebuild: str) -> str:
    return (f"speculators-compat: vLLM's worker process died: {'; '.join(dead)}. vLLM shut "
            "this generator's executor down, so it cannot run any more (a call in flight "
            "returned nothing). Check the system log for the cause (e.g. the out-of-memory "
            f"killer). {rebuild}")
