"""Contract of the ``kv_cache_extensible_off`` adapter,
on the installed vLLM and speculators.

Speculators' call shape gets a CacheConfig whose
extensible KV cache is off through the adapter (and stays on by default for vLLM's own
engines, which build their own CacheConfig).

The checks every adapter shares (probe vs. expectation table, apply/revert identity,
declared targets only) are in tests/contract/test_every_adapter.py.
"""

from __future__ import annotations

from ..expectations import V, applied_if
from ..support import (
    BY_NAME,
    one,
)

NAME = "kv_cache_extensible_off"

#: Its expected status on the installed release, and why (read by ``expectations.py``).
EXPECTED = (
    # verified: absent in 0.16 and 0.32 (CacheConfig), present in 0.34.0.
    lambda e: applied_if(e.vllm >= V("0.34.0.dev0")),
    "CacheConfig.enable_extensible_kv_cache (on by default on CUDA) from 0.34")
FIELD = "enable_extensible_kv_cache"


def test_legacy_call_shape(base):
    gen = base.gen
    call = dict(block_size=16, gpu_memory_utilization=0.8)  # speculators' call
    bare = gen.CacheConfig(**call)
    if not hasattr(bare, FIELD):
        with one(base, BY_NAME[NAME]) as applied:
            assert not applied
        return
    assert getattr(bare, FIELD) is None  # unset: VllmConfig turns it on where supported
    with one(base, BY_NAME[NAME]) as applied:
        assert applied
        assert getattr(gen.CacheConfig(**call), FIELD) is False
        assert getattr(gen.CacheConfig(**call, **{FIELD: True}), FIELD) is True
        from vllm.config import CacheConfig  # vLLM's own name: untouched

        assert getattr(CacheConfig(**call), FIELD) is None
    assert getattr(gen.CacheConfig(**call), FIELD) is None
