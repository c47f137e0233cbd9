"""``bench.py --cpu-detail``: each process's system time and minor page faults are
recorded beside its CPU time and rendered as rows of their own (with their own units), and
the plain CPU rows keep their meaning. This process and a toy child; no vLLM."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks" / "cpu"))

import bench_timers  # noqa: E402
import perfreport  # noqa: E402


def test_detail_only_when_asked(monkeypatch):
    monkeypatch.delenv(bench_timers.CPU_DETAIL_ENV, raising=False)
    assert all(isinstance(k, int) for k in bench_timers.cpu_times())
    monkeypatch.setenv(bench_timers.CPU_DETAIL_ENV, "1")
    names = {name for name, _ in bench_timers.cpu_times().values()}
    assert {"driver", "driver/system", "driver/minor-faults-k"} <= names


def test_fresh_pages_show_as_faults(monkeypatch):
    monkeypatch.setenv(bench_timers.CPU_DETAIL_ENV, "1")
    child = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"],
                             stdin=subprocess.PIPE)
    try:
        before = bench_timers.cpu_times()
        pages = bytearray(64 << 20)  # 64 MiB touched: about 16,000 fresh 4 KiB pages
        pages[::4096] = b"\1" * len(pages[::4096])
        delta = bench_timers.cpu_delta(before, bench_timers.cpu_times())
    finally:
        child.communicate(b"")
    assert delta["driver/minor-faults-k"] > 10  # thousands
    # user + system against system alone (both differences of floats: a tolerance)
    assert delta["driver"] >= delta.get("driver/system", 0.0) - 1e-3


def test_rows_name_their_units():
    stat = {"median": 12.5, "min": 10.0, "max": 15.0, "n": 2}
    assert perfreport._cpu_row("d on", "VLLM::Worker/minor-faults-k", stat).startswith(
        "| minor page faults per call, (d on), process VLLM::Worker, thousands | 12.5 |")
    assert perfreport._cpu_row("b", "VLLM::Worker/system", stat).startswith(
        "| system CPU time per call, (b), process VLLM::Worker, s | 12.50 |")
    assert perfreport._cpu_row("a", "driver", stat).startswith(
        "| CPU time per call, (a), process driver, s | 12.50 |")
