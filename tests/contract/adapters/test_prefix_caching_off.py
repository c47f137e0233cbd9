"""Contract of the ``prefix_caching_off`` adapter,
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
    one,
)

NAME = "prefix_caching_off"

#: Its expected status on the installed release, and why (read by ``expectations.py``).
EXPECTED = (
    lambda e: applied_if(e.vllm >= V("0.12.0.dev0") and e.speculators_03),
    "CacheConfig.enable_prefix_caching defaults to True from 0.12 (0.4 sets it off)")


def test_legacy_call_shape(base, vllm_config):
    legacy_call_shape(base, base.gen, vllm_config, BY_NAME[NAME])


def legacy_call_shape(base, gen, cfg, adapter):
    call = dict(block_size=16, gpu_memory_utilization=0.8)  # speculators 0.3.0's call
    if base.env.vllm < V("0.12.0.dev0"):
        # 0.11: unset (None) means off for speculators' own engine; nothing to do.
        assert not gen.CacheConfig(**call).enable_prefix_caching
        with one(base, adapter) as applied:
            assert not applied
        return
    assert gen.CacheConfig(**call).enable_prefix_caching is True  # 0.12+ default
    if base.env.speculators_04:
        # 0.4.x sets it off itself: nothing to do.
        assert "enable_prefix_caching=False" in inspect.getsource(gen)
        with one(base, adapter) as applied:
            assert not applied
        return
    with one(base, adapter) as applied:
        assert applied
        assert gen.CacheConfig(**call).enable_prefix_caching is False
        assert gen.CacheConfig(**call, enable_prefix_caching=True).enable_prefix_caching
    assert gen.CacheConfig(**call).enable_prefix_caching is True
