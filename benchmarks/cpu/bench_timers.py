"""Timers of benchmarks/cpu/bench.py: where a call's wall and CPU time go, data untouched.

Driver side: :class:`Timers` wraps instance methods (the generator's scheduler and
executor) and totals their wall time; :func:`cpu_times` / :func:`cpu_delta` account the
CPU time of the benchmark child and its descendants (vLLM's engine core and workers).
Worker side (functions sent with ``collective_rpc``, which run in vLLM's workers):
:func:`time_worker_steps` / :func:`read_worker_steps` time the worker's
``execute_model`` + ``sample_tokens``, :func:`time_hooks` / :func:`read_hook_timers` the
shim's capture hooks. The ``median_*`` helpers summarise several calls. Nothing here
changes what is computed: every wrapper calls the original and returns its result.

The worker-side functions travel by value (:func:`pickle_by_value`), so vLLM's workers
need not import this module.
"""

from __future__ import annotations

import functools
import os
import statistics
import sys
import time
from collections.abc import Callable


def pickle_by_value() -> None:
    """Have cloudpickle (vLLM's serializer for callables) send this module's functions by
    value: the workers then need not find ``bench_timers`` on their ``sys.path``."""
    try:
        import cloudpickle
    except ImportError:
        return
    cloudpickle.register_pickle_by_value(sys.modules[__name__])


def process_tree_info() -> list[dict]:
    """Threads and CPU affinity of this process and its children (vLLM's workers)."""
    try:
        import psutil
    except ImportError:
        return []
    me = psutil.Process()
    out = []
    for proc in [me, *me.children(recursive=True)]:
        try:
            out.append({"pid": proc.pid, "name": proc.name(), "threads": proc.num_threads(),
                        "affinity": proc.cpu_affinity() if hasattr(proc, "cpu_affinity")
                        else None})
        except psutil.Error:
            pass
    return out


#: Set by ``bench.py --cpu-detail`` for its children: :func:`cpu_times` also records
#: each process's system time and minor page faults.
CPU_DETAIL_ENV = "BENCH_CPU_DETAIL"
#: Name suffixes of those records (``perfreport`` renders them as their own rows).
SYSTEM, MINOR_FAULTS = "/system", "/minor-faults-k"


def _minor_faults(pid: int) -> int:
    """Minor page faults of a process so far (``/proc/PID/stat``, field 10)."""
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[7])


def cpu_times() -> dict[int | str, tuple[str, float]]:
    """CPU seconds (user + system) of this process and its descendants, by pid.

    With :data:`CPU_DETAIL_ENV` set, also each one's system seconds and minor page faults
    (in thousands) under ``"PID/system"`` and ``"PID/minor-faults-k"``: where the
    capture's cost shows as system time rather than in the hooks' own CPU time, they say
    whether it is the kernel mapping fresh pages."""
    try:
        import psutil
    except ImportError:
        return {}
    me = psutil.Process()
    out = {}
    for proc in [me, *me.children(recursive=True)]:
        try:
            ct = proc.cpu_times()
            name = "driver" if proc.pid == me.pid else proc.name()
            out[proc.pid] = (name, ct.user + ct.system)
            if os.environ.get(CPU_DETAIL_ENV):
                out[f"{proc.pid}{SYSTEM}"] = (name + SYSTEM, ct.system)
                out[f"{proc.pid}{MINOR_FAULTS}"] = (name + MINOR_FAULTS,
                                                    _minor_faults(proc.pid) / 1e3)
        except (psutil.Error, OSError):
            pass
    return out


def cpu_delta(before: dict, after: dict) -> dict[str, float]:
    """CPU seconds spent between two snapshots, summed by process name."""
    out: dict[str, float] = {}
    for pid, (name, cpu) in after.items():
        out[name] = out.get(name, 0.0) + cpu - before.get(pid, (name, 0.0))[1]
    return {k: v for k, v in out.items() if v > 0.0005}


class Timers:
    """Wall-clock totals of wrapped instance methods (driver side). Data untouched.

    Only outermost calls count towards the breakdown; a wrapped call made inside another
    (``execute_model`` sends ``collective_rpc("execute_model")``) is recorded separately
    under ``nested`` as ``outer>inner``.
    """

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self.calls: dict[str, int] = {}
        self.nested: dict[str, float] = {}
        self._stack: list[str] = []

    def reset(self) -> None:
        self.seconds.clear()
        self.calls.clear()
        self.nested.clear()

    def wrap(self, obj, name: str, *, by_method: bool = False) -> None:
        orig = getattr(obj, name)
        timers = self

        def timed(*args, **kwargs):
            key = name
            if by_method:
                m = args[0] if args else kwargs.get("method")
                key = f"{name}:{m if isinstance(m, str) else getattr(m, '__name__', 'callable')}"
            outer = timers._stack[-1] if timers._stack else None
            timers._stack.append(key)
            t = time.perf_counter()
            try:
                return orig(*args, **kwargs)
            finally:
                dt = time.perf_counter() - t
                timers._stack.pop()
                if outer is None:
                    timers.seconds[key] = timers.seconds.get(key, 0.0) + dt
                    timers.calls[key] = timers.calls.get(key, 0) + 1
                else:
                    k = f"{outer}>{key}"
                    timers.nested[k] = timers.nested.get(k, 0.0) + dt

        setattr(obj, name, timed)

    def add_steps_in_flight(self, seconds: float) -> None:
        """The wait for steps still running before an RPC (:func:`wait_for_steps_first`)."""
        key = "steps in flight"
        self.seconds[key] = self.seconds.get(key, 0.0) + seconds
        self.calls[key] = self.calls.get(key, 0) + 1

    def snapshot(self, total: float) -> dict:
        rest = total - sum(self.seconds.values())
        return {"seconds": {**dict(self.seconds), "rest": rest}, "calls": dict(self.calls),
                "nested": dict(self.nested)}



def timed(fn, stats: dict, cpu_clock):
    """``fn`` wrapped to add its CPU time (``cpu_clock``) and wall time to ``stats``."""

    def timed(*args, **kwargs):
        c, w = cpu_clock(), time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            stats["cpu_s"] += cpu_clock() - c
            stats["wall_s"] += time.perf_counter() - w
            stats["calls"] += 1

    return timed


def take(stats: dict | None) -> dict | None:
    """A copy of timer ``stats``, which are then reset (``None`` if never installed)."""
    if stats is None:
        return None
    out = dict(stats)
    stats.update(cpu_s=0.0, wall_s=0.0, calls=0)
    return out


def time_hooks(worker) -> int:
    """Runs in the worker: wrap the capture's forward hooks with CPU-time (thread_time) and
    wall-clock counters, readable with ``read_hook_timers``. Benchmark-only; the hooks'
    behaviour and data are unchanged."""
    cap = getattr(worker, "_compat_capture", None)
    if cap is None:
        return 0
    stats = {"cpu_s": 0.0, "wall_s": 0.0, "calls": 0}
    worker._bench_hook_stats = stats
    n = 0
    for handle in cap._handles:
        hooks = handle.hooks_dict_ref()
        if hooks is None or handle.id not in hooks:
            continue
        hooks[handle.id] = timed(hooks[handle.id], stats, time.thread_time)
        n += 1
    return n


def read_hook_timers(worker) -> dict | None:
    return take(getattr(worker, "_bench_hook_stats", None))


def time_worker_steps(worker) -> bool:
    """Runs in the worker: time its ``execute_model`` and ``sample_tokens`` (wall clock and
    CPU time of the whole worker process), readable with ``read_worker_steps``. Sent to
    (a)'s and (b)'s workers alike, so the forward work of both paths is compared directly,
    without the orchestration around it. Benchmark-only; results unchanged."""
    inner = getattr(worker, "worker", worker)
    stats = {"wall_s": 0.0, "cpu_s": 0.0, "calls": 0}
    inner._bench_step_stats = stats
    for name in ("execute_model", "sample_tokens"):
        setattr(inner, name, timed(getattr(inner, name), stats, time.process_time))
    return True


def read_worker_steps(worker) -> dict | None:
    inner = getattr(worker, "worker", worker)
    return take(getattr(inner, "_bench_step_stats", None))


def read_transport(worker) -> dict | None:
    """Runs in the worker: the transport's own counters since the last read
    (``Sender.all_stats()``: seconds the layer hooks spent handing rows over inside the
    forward step, ``write_s``; calls streamed or exported; copy and staging timers).
    ``None`` where the worker has no sender (the transport is off, or this rank does not
    capture). Read-only."""
    inner = getattr(worker, "worker", worker)
    sender = getattr(inner, "_compat_sender", None)
    if sender is None:
        return None
    now = {k: v for k, v in sender.all_stats().items() if k != "time"}
    last = getattr(inner, "_bench_transport_last", None) or dict.fromkeys(now, 0)
    inner._bench_transport_last = now
    return {k: now[k] - last.get(k, 0) for k in now}



def median_breakdown(snaps: list[dict]) -> dict:
    keys = sorted({k for sn in snaps for k in sn["seconds"]})
    nested = sorted({k for sn in snaps for k in sn["nested"]})
    return {"seconds": {k: statistics.median([sn["seconds"].get(k, 0.0) for sn in snaps])
                        for k in keys},
            "nested": {k: statistics.median([sn["nested"].get(k, 0.0) for sn in snaps])
                       for k in nested},
            "calls": snaps[-1]["calls"], "per_call": snaps}



def median_steps(steps: list) -> dict | None:
    steps = [x for x in steps if x]
    if not steps:
        return None
    return {k: statistics.median([x[k] for x in steps]) for k in ("wall_s", "cpu_s", "calls")}


def median_cpu(cpus: list[dict]) -> dict[str, float]:
    keys = sorted({k for c in cpus for k in c})
    return {k: statistics.median([c.get(k, 0.0) for c in cpus]) for k in keys}


def wait_for_steps_first(executor, on_wait: Callable[[float], None]) -> None:
    """With ``step_overlap`` the generator's loop ends once it has sent its last step, and
    its request for the states (``_get_captured_states``) first waits for the steps still
    running, inside that RPC's timers. Wait for them before that RPC instead, in an
    instance attribute over the executor's ``collective_rpc``, and report the wait
    (seconds) to ``on_wait``: the RPC's time is then the take and transfer alone. Only
    that RPC: speculators 0.4 sends ``_set_request_metadata`` before every step, which the
    shim answers in the driver without waiting for anything, and waiting there would take
    the overlap away. What is computed is unchanged: the shim's own wait finds the steps
    done and reads each one's result (or error) as before."""
    rpc = executor.collective_rpc

    @functools.wraps(rpc)  # callers probe its signature (generate_guard: timeout=)
    def collective_rpc(method, *args, **kwargs):
        pending = (list(getattr(executor, "compat_steps", None) or ())
                   if method == "_get_captured_states" else ())
        if pending:
            t = time.perf_counter()
            for fut in pending:
                try:
                    fut.result()
                except Exception:  # noqa: BLE001, S110 - the shim raises it next
                    pass
            on_wait(time.perf_counter() - t)
        return rpc(method, *args, **kwargs)

    executor.collective_rpc = collective_rpc
