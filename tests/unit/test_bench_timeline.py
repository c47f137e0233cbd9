"""benchmarks/gpu/bench_timeline.py summarises a chrome trace per call: time before the first
and after the last kernel, kernel time as the union over streams, idle time between
kernels and its largest gaps, and device-to-host copies; a synthetic trace whose figures
are known, and one where a wrong clock anchor shows in the figures. No GPU."""

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("bench_timeline_under_test",
                                               ROOT / "benchmarks" / "gpu" / "bench_timeline.py")
bench_timeline = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench_timeline)


def kernel(ts_us, dur_us, name="k", stream=7):
    return {"cat": "kernel", "ts": ts_us, "dur": dur_us, "name": name,
            "args": {"stream": stream}}


def d2h(ts_us, dur_us, nbytes):
    return {"cat": "gpu_memcpy", "ts": ts_us, "dur": dur_us,
            "name": "Memcpy DtoH (Device -> Pinned)", "args": {"bytes": nbytes}}


# trace clock: marker at 1000 us = wall 100.0 s
EVENTS = [
    kernel(1000, 5, "marker"),
    # call 1: wall 100.010 .. 100.030 s = trace 11000 .. 31000 us
    kernel(12000, 4000, "attn"),                 # 12..16 ms after anchor-relative 11
    kernel(15000, 3000, "mlp", stream=9),        # overlaps: union 12..18
    kernel(18100, 900, "norm"),                  # gap 0.1 ms: below GAP_MS
    kernel(25000, 2000, "lm_head"),              # gap 6 ms after norm
    d2h(26000, 2000, 64 << 20),                  # 1 ms after the last kernel (27..28)
    {"cat": "cpu_op", "ts": 13000, "dur": 50, "name": "aten::add"},  # not GPU
    # call 2: wall 100.040 .. 100.050 = trace 41000 .. 51000
    kernel(42000, 5000, "attn"),
]
WINDOWS = [(100.010, 100.030), (100.040, 100.050)]


def test_per_call_figures():
    out = bench_timeline.summarize(EVENTS, anchor=100.0, windows=WINDOWS)
    one, two = out["calls"]
    assert one["call_ms"] == 20.0
    assert one["lead_ms"] == 1.0          # first kernel 12 ms vs window start 11 ms
    assert one["tail_ms"] == 4.0          # last kernel ends 27 ms vs window end 31 ms
    assert one["busy_ms"] == 6.0 + 0.9 + 2.0
    assert one["idle_ms"] == round(15.0 - 8.9, 3)
    assert one["gaps_over"] == 1 and one["gaps_over_ms"] == 6.0
    assert one["top_gaps"][0]["after"] == "norm" and one["top_gaps"][0]["before"] == "lm_head"
    assert one["d2h"] == 1 and one["d2h_mb"] == 64.0 and one["d2h_ms"] == 2.0
    assert one["d2h_after_last_kernel_ms"] == 1.0
    assert two["lead_ms"] == 1.0 and two["tail_ms"] == 4.0 and two["busy_ms"] == 5.0
    assert out["mean"]["call_ms"] == 15.0


def test_wrong_anchor_moves_the_figures():
    """The check's own check: an anchor off by 5 ms gives other lead/tail figures (the
    anchor is what lines the two clocks up)."""
    out = bench_timeline.summarize(EVENTS, anchor=100.005, windows=WINDOWS)
    assert out["calls"][0]["lead_ms"] != 1.0


def test_no_kernels():
    assert "error" in bench_timeline.summarize([], anchor=0.0, windows=WINDOWS)


def test_run_stops_the_workers_when_the_pass_fails():
    sent = []

    def rpc(fn, args=()):
        sent.append((fn.__name__, args))
        return [None]

    def failing():
        raise RuntimeError("pass failed")

    try:
        bench_timeline.run(failing, rpc, lambda rec: [])
    except RuntimeError:
        pass
    assert [name for name, _ in sent] == ["worker_start", "worker_stop"]
