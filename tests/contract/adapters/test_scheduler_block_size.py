"""Contract of the ``scheduler_block_size`` adapter,
on the installed vLLM and speculators.

Speculators' legacy call shape fails (or is wrong) bare where the upstream note says
so and works through the adapter. The checks every adapter shares (the probe agrees with
the expectation table, apply/revert restores identity and changes only the declared
targets) run for every adapter in tests/contract/test_every_adapter.py.
"""

from __future__ import annotations

import importlib
import importlib.util

import pytest

from ..expectations import V, applied_if
from ..support import (
    BY_NAME,
    KV_UTILS,
    kv_config_for,
    one,
    resolved_config,
)

NAME = "scheduler_block_size"

#: Its expected status on the installed release, and why (read by ``expectations.py``).
EXPECTED = (
    lambda e: applied_if(e.vllm >= V("0.11.1.dev0")),
    "Scheduler.__init__ requires block_size from 0.11.1")


def test_legacy_call_shape(base, vllm_config):
    legacy_call_shape(base, base.gen, vllm_config, BY_NAME[NAME])


def legacy_call_shape(base, gen, cfg, adapter):
    from vllm.v1.structured_output import StructuredOutputManager

    from speculators_compat.adapters.kv_cache_config_fields import block_sizes

    rcfg = resolved_config()
    kvc = kv_config_for(rcfg)
    som = StructuredOutputManager(vllm_config=rcfg)
    call_03 = dict(vllm_config=rcfg, kv_cache_config=kvc, structured_output_manager=som)
    if base.env.vllm < V("0.11.1.dev0"):
        # 0.11.0: the scheduler reads the block size from the config itself.
        s = gen.Scheduler(**call_03)
        assert s.block_size == rcfg.cache_config.block_size
        with one(base, adapter) as applied:
            assert not applied
        return
    # upstream error text: "Scheduler.__init__() missing 1 required positional argument:
    # 'block_size'" (0.3.0 on 0.11.1+).
    with pytest.raises(TypeError, match="missing 1 required positional argument: 'block_size'"):
        gen.Scheduler(**call_03)
    # What this release's engine core passes.
    utils = importlib.import_module(KV_UTILS)
    if hasattr(utils, "resolve_kv_cache_block_sizes"):
        engine_bs, engine_hash = utils.resolve_kv_cache_block_sizes(kvc, rcfg)
    else:
        pc = rcfg.parallel_config
        engine_bs = (rcfg.cache_config.block_size * pc.decode_context_parallel_size
                     * pc.prefill_context_parallel_size)
        engine_hash = None
    assert block_sizes(kvc, rcfg) == (engine_bs, engine_hash)
    with one(base, adapter) as applied:
        assert applied
        s03 = gen.Scheduler(**call_03)
        s04 = gen.Scheduler(**call_03, block_size=16)  # 0.4.x passes its hard-coded 16
    for s in (s03, s04):
        assert isinstance(s, importlib.import_module("vllm.v1.core.sched.scheduler").Scheduler)
        assert s.block_size == engine_bs
        if engine_hash is not None and "hash_block_size" in vars(s):  # stored from 0.29
            assert s.hash_block_size == engine_hash
