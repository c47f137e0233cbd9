"""Contract of the ``collective_rpc_unique_reply`` adapter,
on the installed vLLM and speculators.

Speculators' legacy call shape fails (or is wrong) bare where the upstream note says
so and works through the adapter. The checks every adapter shares (the probe agrees with
the expectation table, apply/revert restores identity and changes only the declared
targets) run for every adapter in tests/contract/test_every_adapter.py.
"""

from __future__ import annotations

import inspect

from ..expectations import V, applied_if
from ..support import (
    BY_NAME,
    _check_executor_shim,
    one,
)

NAME = "collective_rpc_unique_reply"

#: Its expected status on the installed release, and why (read by ``expectations.py``).
EXPECTED = (
    lambda e: applied_if(e.vllm >= V("0.11.1.dev0") and e.speculators_03),
    "unique_reply_rank returns a single result from 0.11.1; only 0.3.x indexes [0]")


def test_legacy_call_shape(base, vllm_config):
    legacy_call_shape(base, base.gen, vllm_config, BY_NAME[NAME])


def legacy_call_shape(base, gen, cfg, adapter):
    from vllm.v1.executor.multiproc_executor import MultiprocExecutor

    from speculators_compat.adapters.collective_rpc_unique_reply import (
        SPECULATORS_LIST_REPLY_METHODS,
        returns_single_result,
    )

    single = base.env.vllm >= V("0.11.1.dev0")  # 0.11.0: a list, one entry per rank
    assert returns_single_result(MultiprocExecutor) is single
    assert "unique_reply_rank" in inspect.signature(MultiprocExecutor.collective_rpc).parameters
    src = inspect.getsource(gen)
    assert '"_get_captured_states",\n            unique_reply_rank=0' in src
    # 0.3.0 indexes the reply ([0]); 0.4 uses it as the dict it is.
    assert ("captured_states_list[0]" in src) == base.env.speculators_03
    assert SPECULATORS_LIST_REPLY_METHODS == {"_get_captured_states"}
    with one(base, adapter) as applied:
        _check_executor_shim(gen, MultiprocExecutor, applied, NAME, {"collective_rpc"})
        # vLLM's own executor keeps its convention.
        assert returns_single_result(MultiprocExecutor) is single
