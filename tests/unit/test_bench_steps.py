"""benchmarks/cpu/bench.py counts a call's steps as ``execute_model`` plus the wait for the
steps sent ahead: with ``step_overlap`` ``execute_model`` returns at once and the step's
time shows up as "steps in flight" before the states' RPC, so the capture on/off rows (d)
would otherwise read 0 s. Toy breakdowns; no vLLM."""

import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks" / "cpu"))
_spec = importlib.util.spec_from_file_location("bench_under_test",
                                               ROOT / "benchmarks" / "cpu" / "bench.py")
bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench)


def breakdown(execute: float, in_flight: float | None) -> dict:
    seconds = {"execute_model": execute, "collective_rpc:_get_captured_states": 0.01,
               "rest": 0.002}
    if in_flight is not None:
        seconds["steps in flight"] = in_flight
    return {"seconds": seconds}


def test_steps_sent_ahead_are_counted():
    assert bench._steps_s(breakdown(0.0004, 7.1)) == 7.1004
    assert bench._steps_s(breakdown(7.1, None)) == 7.1  # steps one at a time


def test_capture_overhead_from_the_steps():
    on, off = breakdown(0.0004, 7.28), breakdown(0.0003, 7.13)
    frac = (bench._steps_s(on) - bench._steps_s(off)) / bench._steps_s(off)
    assert 0.02 < frac < 0.022
    # the known-wrong reading (execute_model alone) is the sending, not the step
    wrong = (on["seconds"]["execute_model"] - off["seconds"]["execute_model"]) \
        / off["seconds"]["execute_model"]
    assert wrong > 0.3
