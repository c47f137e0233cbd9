"""Where a path's calls spend their Python time: ``cProfile`` in the driver and in every
vLLM worker over a few calls after the timed passes (``gpu_bench.py --profile-calls N``).

Why: the timed passes say how long a call takes and the counters say which phase, but not
which functions: e.g. why speculators 0.4.0.1 runs 2-4 % behind 0.3.0 through the same
transport on the H200. The profiled calls are not timed (cProfile slows Python down) and
run after the passes, so the passes' figures are as without it.
How: the driver's profile covers the calls; each worker's covers the same calls on the
thread that runs vLLM's RPCs (``execute_model``, the shim's steps, the states' export):
``start`` and ``stop`` are sent through ``collective_rpc`` and run on that thread, where
``cProfile.Profile.enable`` takes effect. Each profile is kept as its top functions by
own time and by cumulative time.
"""

from __future__ import annotations

import cProfile
import pstats

#: How many functions each ranking keeps.
TOP = 30


def top(profile: cProfile.Profile, n: int = TOP) -> dict:
    """The ``n`` functions with the most own time and the most cumulative time."""
    stats = pstats.Stats(profile).stats  # {(file, line, name): (cc, nc, tt, ct, callers)}
    rows = [{"function": f"{file}:{line}({name})", "calls": nc, "own_s": round(tt, 6),
             "cumulative_s": round(ct, 6)}
            for (file, line, name), (_cc, nc, tt, ct, _callers) in stats.items()]
    return {"total_own_s": round(sum(r["own_s"] for r in rows), 6),
            "by_own": sorted(rows, key=lambda r: -r["own_s"])[:n],
            "by_cumulative": sorted(rows, key=lambda r: -r["cumulative_s"])[:n]}


def worker_start(worker) -> bool:
    """Runs in each vLLM worker, on its RPC thread: start profiling that thread."""
    profile = cProfile.Profile()
    worker._bench_profile = profile
    profile.enable()
    return True


def worker_stop(worker) -> dict | None:
    """Runs in each vLLM worker: stop and return the profile ``worker_start`` began."""
    profile = getattr(worker, "_bench_profile", None)
    if profile is None:
        return None
    profile.disable()
    del worker._bench_profile
    return top(profile)


def profile_calls(call, rpc, batch, calls: int) -> dict:
    """``calls`` calls of ``call(batch)`` (each result kept until the next call returns,
    as speculators' offline script does), profiled in the driver and, through ``rpc``
    (``collective_rpc``), in every worker."""
    started = rpc(worker_start)
    driver = cProfile.Profile()
    out = None
    driver.enable()
    try:
        for _ in range(calls):
            out = call(batch)
    finally:
        driver.disable()
        workers = rpc(worker_stop)
    del out
    return {"calls": calls, "batch": len(batch), "workers_started": started,
            "driver": top(driver), "workers": workers}
