"""Where a call's time goes on the GPU: the kernel timeline of a few calls after the timed
passes (``gpu_bench.py --timeline-calls N``).

Why: the timed passes say that (b) runs a few per cent behind (a) at batch 32 and not at
batch 8, and the counters say which phase of a call the driver or the worker was in, but
neither says whether the GPU computes more slowly under the capture, idles between a
call's steps, or waits before the first and after the last kernel of a call. Those are
different causes with different fixes.
How: every worker runs ``torch.profiler`` with CUDA activity only (kernels and copies,
no Python) around the calls, which run in the pass's own loop (:func:`run`); the driver
records each call's wall-clock start and end, and sends them with the stop request. The
worker lines the profiler's clock up with the wall clock through one marker kernel
launched at a known time, and summarises each call: time before its first kernel
(``lead_ms``), after its last (``tail_ms``), kernel time (``busy_ms``, the union over
streams), idle time between its first and last kernel (``idle_ms``: the steps' gaps),
the largest gaps with the kernels on either side, and the device-to-host copies (their
time, bytes, and how much of it ran after the call's last kernel). The calls are not
timed figures (the profiler adds a little to every launch); their use is the comparison
of the paths measured the same way in one run.
"""

from __future__ import annotations

import json
import os
import tempfile
import time

#: Gaps between kernels shorter than this are launch spacing, not idle time of interest.
GAP_MS = 0.2
#: How many of a call's largest gaps are kept.
TOP_GAPS = 6


def worker_start(worker) -> dict:
    """Runs in each vLLM worker: start the CUDA timeline, then launch the marker kernel
    whose start is the wall-clock anchor (the GPU is idle between calls)."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    prof = profile(activities=[ProfilerActivity.CUDA])
    prof.start()
    torch.cuda.synchronize()
    marker = torch.empty(1 << 10, device="cuda")
    torch.cuda.synchronize()
    anchor = time.time()
    marker.fill_(1.0)
    torch.cuda.synchronize()
    worker._bench_timeline = (prof, anchor)
    return {"anchor": anchor}


def worker_stop(worker, windows: list) -> dict | None:
    """Runs in each vLLM worker: stop the timeline; summarise it per call ``windows``
    (wall-clock (start, end) pairs from the driver)."""
    import torch

    held = getattr(worker, "_bench_timeline", None)
    if held is None:
        return None
    prof, anchor = held
    del worker._bench_timeline
    torch.cuda.synchronize()
    prof.stop()
    fd, path = tempfile.mkstemp(suffix=".json", prefix="bench-timeline-")
    os.close(fd)
    try:
        prof.export_chrome_trace(path)
        with open(path) as f:
            events = json.load(f).get("traceEvents", [])
    finally:
        os.unlink(path)
    return summarize(events, anchor, windows)


def _gpu_events(events: list) -> tuple[list, list]:
    """(kernels, copies) as (start µs, end µs, name, bytes) sorted by start."""
    kernels, copies = [], []
    for e in events:
        cat = str(e.get("cat", "")).lower()
        if "ts" not in e or "dur" not in e:
            continue
        start = float(e["ts"])
        item = (start, start + float(e["dur"]), str(e.get("name", "")),
                int((e.get("args") or {}).get("bytes", 0) or 0))
        if cat == "kernel":
            kernels.append(item)
        elif cat in ("gpu_memcpy", "gpu_memset"):
            copies.append(item)
    return sorted(kernels), sorted(copies)


def _union(items: list) -> list:
    """Merged [start, end, first name, last name] intervals of sorted (start, end, name)."""
    out: list = []
    for start, end, name, _ in items:
        if out and start <= out[-1][1]:
            if end > out[-1][1]:
                out[-1][1], out[-1][3] = end, name
        else:
            out.append([start, end, name, name])
    return out


def _clip(a: float, b: float, lo: float, hi: float) -> float:
    return max(0.0, min(b, hi) - max(a, lo))


def summarize(events: list, anchor: float, windows: list) -> dict:
    """Per-call figures (see module) of a chrome trace's GPU events; ``anchor``: the wall
    time the first kernel of the trace (the marker) was launched."""
    kernels, copies = _gpu_events(events)
    if not kernels:
        return {"error": "no kernels in the trace"}
    zero = kernels[0][0]  # the marker

    def wall(us: float) -> float:  # ms after the anchor
        return (us - zero) / 1e3

    merged = [(wall(s), wall(e), a, b) for s, e, a, b in _union(kernels[1:])]
    d2h = [(wall(s), wall(e), n) + (nbytes,) for s, e, n, nbytes in copies
           if "dtoh" in n.lower() or "device -> pinned" in n.lower()
           or "device -> pageable" in n.lower()]
    calls = []
    for t0, t1 in windows:
        lo, hi = (t0 - anchor) * 1e3, (t1 - anchor) * 1e3
        inside = [m for m in merged if m[1] > lo and m[0] < hi]
        rec = {"call_ms": round(hi - lo, 3), "kernels": len(inside)}
        if inside:
            first, last = max(inside[0][0], lo), min(inside[-1][1], hi)
            busy = sum(_clip(s, e, lo, hi) for s, e, _, _ in inside)
            gaps = [(inside[i + 1][0] - inside[i][1], inside[i][3], inside[i + 1][2],
                     inside[i][1] - lo) for i in range(len(inside) - 1)]
            big = [g for g in gaps if g[0] >= GAP_MS]
            rec.update(lead_ms=round(first - lo, 3), tail_ms=round(hi - last, 3),
                       busy_ms=round(busy, 3), idle_ms=round(last - first - busy, 3),
                       gaps_over=len(big), gaps_over_ms=round(sum(g[0] for g in big), 3),
                       top_gaps=[{"ms": round(g, 3), "at_ms": round(at, 1),
                                  "after": a[:70], "before": b[:70]}
                                 for g, a, b, at in sorted(big, reverse=True)[:TOP_GAPS]])
            cps = [c for c in d2h if c[1] > lo and c[0] < hi]
            rec.update(d2h=len(cps), d2h_ms=round(sum(_clip(s, e, lo, hi)
                                                      for s, e, _, _ in cps), 3),
                       d2h_mb=round(sum(c[3] for c in cps) / 2**20, 1),
                       d2h_after_last_kernel_ms=round(sum(_clip(s, e, last, hi)
                                                          for s, e, _, _ in cps), 3))
        calls.append(rec)
    keys = ("call_ms", "lead_ms", "tail_ms", "busy_ms", "idle_ms", "gaps_over_ms",
            "d2h_ms", "d2h_after_last_kernel_ms")
    mean = {k: round(sum(c.get(k, 0.0) for c in calls) / len(calls), 3)
            for k in keys} if calls else {}
    return {"calls": calls, "mean": mean, "gap_ms": GAP_MS}


def run(run_pass, rpc, windows_of) -> dict:
    """Start the workers' timelines, run ``run_pass()`` (a pass of the path's own loop;
    returns its record), stop them with the calls' windows (``windows_of(record)``)."""
    started = rpc(worker_start)
    try:
        rec = run_pass()
    except BaseException:
        rpc(worker_stop, args=([],))
        raise
    windows = windows_of(rec)
    return {"started": started, "calls_s": rec.get("calls_s"),
            "tokens_per_s": rec.get("tokens_per_s"), "loop": rec.get("loop"),
            "batch": rec.get("batch"),
            "workers": rpc(worker_stop, args=(windows,))}
