"""Contract of the ``kv_cache_config_fields`` adapter,
on the installed vLLM and speculators.

Speculators' legacy call shape fails (or is wrong) bare where the upstream note says
so and works through the adapter. The checks every adapter shares (the probe agrees with
the expectation table, apply/revert restores identity and changes only the declared
targets) run for every adapter in tests/contract/test_every_adapter.py.
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util

from ..expectations import kv_engine_sets
from ..support import (
    BY_NAME,
    KV_UTILS,
    kv_call,
    kv_groups,
    one,
    resolved_config,
)

NAME = "kv_cache_config_fields"

#: Its expected status on the installed release, and why (read by ``expectations.py``).
EXPECTED = (
    kv_engine_sets,
    "KVCacheConfig gained engine-set kv_cache_layout/hash_block_size/... (0.29-0.32)")


def test_legacy_call_shape(base, vllm_config):
    legacy_call_shape(base, base.gen, vllm_config, BY_NAME[NAME])


def legacy_call_shape(base, gen, cfg, adapter):
    from vllm.v1.kv_cache_interface import KVCacheConfig

    from speculators_compat.adapters.kv_cache_config_fields import FIELDS

    present = {f.name for f in dataclasses.fields(KVCacheConfig)} & set(FIELDS)
    rcfg = resolved_config()
    groups = kv_groups(rcfg)
    call = dict(vllm_config=rcfg, kv_cache_groups=groups, available_memory=1 << 24)
    plain = kv_call(gen.get_kv_cache_config_from_groups, **call)
    with one(base, adapter) as applied:
        assert applied == bool(present)
        filled = kv_call(gen.get_kv_cache_config_from_groups, **call)
    assert filled.num_blocks == plain.num_blocks
    if not applied:
        return
    # What EngineCore._initialize_kv_caches sets (0.32: kv_cache_layout from the cache
    # config; hash_block_size / cache_hit_alignment_tokens from resolve_* helpers).
    # (each only where this release's KVCacheConfig has the field: early 0.29 nightlies
    # have kv_cache_layout alone).
    assert all(getattr(plain, f) is None for f in present), plain
    utils = importlib.import_module(KV_UTILS)
    if "kv_cache_layout" in present:
        assert filled.kv_cache_layout == rcfg.cache_config.kv_cache_layout is not None
    if "hash_block_size" in present:
        sched_bs, hash_bs = utils.resolve_kv_cache_block_sizes(filled, rcfg)
        assert filled.hash_block_size == hash_bs is not None
        if "cache_hit_alignment_tokens" in present:
            assert filled.cache_hit_alignment_tokens == (
                utils.resolve_cache_hit_alignment_tokens(filled, rcfg, sched_bs, hash_bs))
