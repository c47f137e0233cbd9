"""How a dead vLLM worker is named (``adapters._liveness``), with toy process handles."""

from __future__ import annotations

import signal
from types import SimpleNamespace

from speculators_compat.adapters._liveness import SIGNAL_HINTS, dead_workers, describe


def executor(*exitcodes, failed=False):
    workers = [SimpleNamespace(proc=SimpleNamespace(exitcode=c, pid=100 + i, name=f"W{i}"))
               for i, c in enumerate(exitcodes)]
    return SimpleNamespace(workers=workers, is_failed=failed)


def test_live_workers_are_not_reported():
    assert dead_workers(executor(None, None)) == []
    assert dead_workers(SimpleNamespace()) == []


def test_signal_named_with_what_it_usually_means():
    found = dead_workers(executor(None, -signal.SIGILL, -signal.SIGKILL, 3))
    assert len(found) == 3
    ill, kill, code = found
    assert "W1 (pid 101, exit code -4, killed by SIGILL: " in ill and "AVX-512" in ill
    assert "killed by SIGKILL: " in kill and "out-of-memory" in kill
    assert code == "worker W3 (pid 103, exit code 3)"
    assert set(SIGNAL_HINTS) <= set(signal.Signals.__members__)


def test_failed_executor_without_a_dead_process():
    assert dead_workers(executor(None, failed=True)) == [
        "a worker (vLLM's executor marked itself failed)"]


def test_description_names_the_worker_and_the_rebuild():
    text = describe(["worker W0 (pid 1, exit code -9, killed by SIGKILL)"], "Rebuild.")
    assert "pid 1" in text and text.endswith("Rebuild.")
