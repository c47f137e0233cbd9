"""Whether a generator's vLLM worker processes are still alive.

Why: when a worker dies (OOM killer, SIGKILL, a crash in native code), vLLM's
``MultiprocExecutor`` notices it in a monitor thread, marks itself failed and shuts
down: the call in flight fails with ``RuntimeError: cancelled``, and every later RPC
with ``AssertionError('collective_rpc should not be called on follower node')``,
neither of which says that a process died or what to do.
How: the executor keeps a handle per worker (``executor.workers[i].proc``, a
``multiprocessing`` process) and sets ``is_failed``; :func:`dead_workers` reads those
(probed with ``getattr``: an executor without them has nothing to report) and
:func:`describe` names each dead worker with its pid and exit code, and what the signal
that killed it usually means.
"""

from __future__ import annotations

import signal

#: What a worker killed by these signals usually ran into.
SIGNAL_HINTS = {
    "SIGKILL": "often the out-of-memory killer: check the system log (dmesg)",
    "SIGILL": ("an illegal instruction: either the vLLM or PyTorch build needs CPU features "
               "(e.g. AVX-512) this machine does not have (install a build for this CPU), "
               "or a vLLM CPU kernel failed on this input (seen with vLLM 0.32's CPU build "
               "on a single short prompt; try another vLLM release or batch)"),
    "SIGSEGV": "a crash in native code (a CUDA/driver or vLLM kernel problem)",
    "SIGBUS": ("a bad memory access, often /dev/shm too small for vLLM's shared memory "
               "(containers: raise --shm-size)"),
}


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
                name = signal.Signals(-code).name
            except ValueError:
                pass
            else:
                how += f", killed by {name}"
                if name in SIGNAL_HINTS:
                    how += f": {SIGNAL_HINTS[name]}"
        found.append(f"worker {getattr(proc, 'name', rank)} (pid {proc.pid}, {how})")
    if not found and getattr(executor, "is_failed", False) is True:
        found.append("a worker (vLLM's executor marked itself failed)")
    return found


def describe(dead: list[str], rebuild: str) -> str:
    return (f"speculators-compat: vLLM's worker process died: {'; '.join(dead)}. vLLM shut "
            "this generator's executor down, so it cannot run any more (a call in flight "
            f"returned nothing). Check the system log for the cause. {rebuild}")
