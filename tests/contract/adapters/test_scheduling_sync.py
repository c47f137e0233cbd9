"""Contract of the ``scheduling_sync`` adapter,
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
    SCHEDULER_CONFIG_03,
    one,
)

NAME = "scheduling_sync"

#: Its expected status on the installed release, and why (read by ``expectations.py``).
EXPECTED = (
    lambda e: applied_if(e.vllm >= V("0.14.0.dev0")),
    "async_scheduling resolves to True for mp/uni executors from 0.14")


def test_legacy_call_shape(base, vllm_config):
    legacy_call_shape(base, base.gen, vllm_config, BY_NAME[NAME])


def legacy_call_shape(base, gen, cfg, adapter):
    params = inspect.signature(gen.SchedulerConfig).parameters
    assert "async_scheduling" in params
    call = dict(SCHEDULER_CONFIG_03)
    if "is_encoder_decoder" in params:
        call["is_encoder_decoder"] = False
    if base.env.vllm < V("0.14.0.dev0"):
        # 0.11-0.13: synchronous unless asked; nothing to do.
        assert params["async_scheduling"].default is False
        assert gen.SchedulerConfig(**call).async_scheduling is False
        with one(base, adapter) as applied:
            assert not applied
        return
    # 0.14+: the field is unresolved (None -> True for mp/uni executors) by default.
    assert params["async_scheduling"].default in (None, True)
    assert gen.SchedulerConfig(**call).async_scheduling is not False
    with one(base, adapter) as applied:
        assert applied
        assert gen.SchedulerConfig(**call).async_scheduling is False
        # a caller's explicit choice wins
        assert gen.SchedulerConfig(**call, async_scheduling=True).async_scheduling is True
