"""Contract of the ``request_metadata_in_driver`` adapter,
on the installed vLLM and speculators.

Speculators 0.4's per-step call is answered in the
driver (what the workers answer: ``None`` from each) and every other call still goes to
the workers.

The checks every adapter shares (probe vs. expectation table, apply/revert identity,
declared targets only) are in tests/contract/test_every_adapter.py.
"""

from __future__ import annotations

import inspect

from ..expectations import V, applied_if
from ..support import (
    BY_NAME,
    _check_executor_shim,
    one,
)

NAME = "request_metadata_in_driver"

#: Its expected status on the installed release, and why (read by ``expectations.py``).
EXPECTED = (
    # Follows hook_capture (the shim's extension ignores the counts); only 0.4.x sends
    # them.
    lambda e: applied_if(e.speculators_04 and e.vllm >= V("0.12.0.dev0")),
    "speculators 0.4.x sends every step's token counts to the workers")


def test_legacy_call_shape(base, monkeypatch):
    from vllm.v1.executor.multiproc_executor import MultiprocExecutor

    from speculators_compat.adapters.request_metadata_in_driver import METADATA_RPC

    gen = base.gen
    src = inspect.getsource(gen)
    # The call it answers, as speculators 0.4 makes it (once per step).
    assert (f'"{METADATA_RPC}", args=(prefill_metadata,)' in src) == base.env.speculators_04
    with one(base, BY_NAME[NAME]) as applied:
        _check_executor_shim(gen, MultiprocExecutor, applied, NAME, {"collective_rpc"})
        if not applied:
            return
        sent = []
        monkeypatch.setattr(MultiprocExecutor, "collective_rpc",
                            lambda self, method, *a, **kw: sent.append((method, kw)) or ["w"])
        executor = object.__new__(gen.MultiprocExecutor)
        executor.world_size = 2
        rpc = gen.MultiprocExecutor.collective_rpc
        assert rpc(executor, METADATA_RPC, args=({"req_0_0": 3},)) == [None, None]
        assert sent == []  # answered in the driver
        # Any other shape of the call, and any other method, goes to the workers.
        assert rpc(executor, METADATA_RPC, args=({}, ), unique_reply_rank=0) == ["w"]
        assert rpc(executor, "_reset_capture") == ["w"]
        assert [m for m, _ in sent] == [METADATA_RPC, "_reset_capture"]
