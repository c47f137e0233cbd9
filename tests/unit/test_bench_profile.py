"""benchmarks/gpu/bench_profile.py profiles what it is given: the driver's calls, and in each
"worker" what runs between ``worker_start`` and ``worker_stop`` on the worker's RPC
thread; the rankings name the function that did the work. A toy worker (one thread that
runs the RPCs and the steps, as vLLM's busy loop does in its process); no vLLM."""

import importlib.util
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("bench_profile_under_test",
                                               ROOT / "benchmarks" / "gpu" / "bench_profile.py")
bench_profile = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench_profile)


def busy_driver(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def busy_worker(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


class Worker:
    """Runs the RPCs and the steps sent to it on one thread of its own."""

    def __init__(self) -> None:
        self.thread = ThreadPoolExecutor(max_workers=1)

    def rpc(self, fn):
        return [self.thread.submit(fn, self).result()]

    def step(self, seconds: float) -> None:
        self.thread.submit(busy_worker, seconds).result()


def test_driver_and_worker_profiles_name_the_busy_functions():
    worker = Worker()

    def call(batch):
        busy_driver(0.02)
        worker.step(0.01)
        return list(batch)

    prof = bench_profile.profile_calls(call, worker.rpc, [1, 2, 3], calls=3)
    worker.thread.shutdown()
    assert prof["calls"] == 3 and prof["batch"] == 3 and prof["workers_started"] == [True]
    driver = [r["function"] for r in prof["driver"]["by_cumulative"]]
    assert any("busy_driver" in n for n in driver), driver
    assert not any("busy_worker" in n for n in driver), driver
    in_worker = [r["function"] for r in prof["workers"][0]["by_cumulative"]]
    assert any("busy_worker" in n for n in in_worker), in_worker
    assert not any("busy_driver" in n for n in in_worker), in_worker
    assert not hasattr(worker, "_bench_profile")  # stopped and removed


def test_stop_without_start_reports_nothing():
    assert bench_profile.worker_stop(object.__new__(Worker)) is None
