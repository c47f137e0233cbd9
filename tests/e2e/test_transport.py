"""The shared-memory transport (adapter ``shm_transport``) inside real vLLM workers.

A 1 MiB pool makes both of its paths run: batches of 12 and 5 sequences stream into
shared memory during the forward, a batch of 64 is larger than the pool and comes in
pieces; speculators' clone() of the results takes the memory over (zero copy). Every
batch is compared with transformers after all three calls ran, so a held
result that a later call overwrote would fail. With tensor parallelism (vLLM 0.32's CPU
build, speculators 0.4.0.1) only rank 0 exports. The tensor-parallel sizes run side by
side (independent fresh interpreters; start-up is most of their time, on one core each).
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest
from helpers import checkpoint, installed, require_speculators, run_script, vllm_version
from packaging.version import Version

pytestmark = pytest.mark.e2e


def _tp_sizes() -> list[int]:
    try:
        tp2 = (vllm_version() >= Version("0.32.0")
               and (installed("speculators") or "").startswith("0.4"))
    except Exception:  # noqa: BLE001 - no vLLM here: the test fails in require_speculators
        tp2 = False
    return [1, 2] if tp2 else [1]


@pytest.fixture(scope="module")
def runs():
    """tp -> future of that run's result, all started together."""
    require_speculators()
    model = checkpoint("llama")
    sizes = _tp_sizes()
    with ThreadPoolExecutor(max_workers=len(sizes)) as pool:
        yield {tp: pool.submit(run_script, "transport.py", "--model", model, "--tp", str(tp))
               for tp in sizes}


@pytest.mark.parametrize("tp", _tp_sizes())
def test_transport_streams_pieces_and_keeps_held_results(tp, runs):
    result = runs[tp].result()
    assert "failed_step" not in result, (result.get("failed_step"), result.get("error"),
                                         result.get("_stderr_tail"))
    statuses = {a["name"]: a["status"] for a in result["report"]["adapters"]}
    assert statuses["shm_transport"] == "applied", statuses
    sizes = [b["size"] for b in result["batches"]]
    assert sizes == [12, 64, 5]
    for b in result["batches"]:
        assert b["returned"] == b["size"] and b["input_order"], b
        assert b["dtypes"] == ["torch.bfloat16"], b
        assert b["compare"]["ok"], b["compare"]
    extra = result["extra"]
    assert extra["has_importer"] and extra["driver_fallback"] is None, extra
    stats = extra["worker_stats"]
    assert len(stats) == tp, stats
    assert (stats[0]["streamed"], stats[0]["copied"]) == (2, 0), stats
    assert stats[0]["pieces"] >= 2, stats  # the 64-sequence batch did not fit
    assert all(s is None for s in stats[1:]), stats  # other ranks export nothing
    # Zero copy: the first call's rows fill their segments (an eighth of the pool each),
    # so speculators' clone() took the shared memory over; the pieces are copied into the
    # driver's own memory, which clone() takes over; the last call is copied by the
    # transport too, because the held results of the first hold more than a call's worth
    # of segments (kept results would make every call need fresh ones). The comparison
    # above ran after all three calls: a held result a later call overwrote would fail
    # it.
    driver = extra["driver_stats"]
    assert (driver["handed_over"], driver["copied_ahead"]) == (1, 2), driver
    # Early copy (rows copied while the model ran): the pieces call dropped its early
    # copy (its rows did not stream), the last call used it; what the thread reached
    # before the end depends on timing, the comparison above checks every row.
    assert (driver["early_calls"], driver["early_dropped"]) == (1, 1), driver
    from speculators_compat.adapters.shm_transport import transport_copy_threads

    assert driver["copy_pool_threads"] == transport_copy_threads(), driver  # the adapter's
    assert all(b["plain_owned"] for b in result["batches"]), result["batches"]
    assert result["shm_left"] == [], result["shm_left"]
