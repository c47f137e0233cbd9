"""With the shim active, vLLM's own engine in the same process behaves exactly as before;
the plugin re-activates in vLLM's spawned processes only when the parent activated.

The two runs (without and with ``activate()``) are independent fresh interpreters, so
they run at the same time: each is a chain of three vLLM processes (driver, engine core,
worker) that spend most of their time importing vLLM on one core.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest
from helpers import checkpoint, require_vllm, run_script

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def runs():
    require_vllm()
    model = checkpoint("llama")
    with ThreadPoolExecutor(max_workers=2) as pool:
        plain = pool.submit(run_script, "llm_tokens.py", "--model", model)
        active = pool.submit(run_script, "llm_tokens.py", "--model", model, "--activate")
        return plain.result(), active.result()


def test_llm_generate_tokens_unchanged(runs):
    plain, active = runs
    assert plain["_rc"] == 0 and active["_rc"] == 0, (plain["_stderr_tail"],
                                                     active["_stderr_tail"])
    assert plain["tokens"] == active["tokens"]
    assert all(len(t) == 8 for t in plain["tokens"])


def test_plugin_activates_in_spawned_worker_only_when_activated(runs):
    plain, active = runs
    assert plain["worker_reports"] == [None], plain["worker_reports"]
    (rep,) = active["worker_reports"]
    assert rep is not None and rep["process"] == "worker" and rep["active"]
    assert rep["pid"] != active["driver_pid"]
    names = {a["name"]: a["status"] for a in rep["adapters"]}
    assert names["hook_capture"] == "not-needed"  # driver-side: never applied in workers
