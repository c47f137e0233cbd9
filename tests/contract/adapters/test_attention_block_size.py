"""Contract of the ``attention_block_size`` adapter,
on the installed vLLM and speculators.

speculators' ``CacheConfig(block_size=16)`` makes 16 the user's choice, which every
attention backend must accept; through the adapter the config holds vLLM's default size
without that mark, so the backends choose. The checks every adapter shares run in
tests/contract/test_every_adapter.py.
"""

from __future__ import annotations

from ..expectations import V, applied_if
from ..support import BY_NAME, one

NAME = "attention_block_size"

#: Its expected status on the installed release, and why (read by ``expectations.py``).
EXPECTED = (
    # upstream: CacheConfig.user_specified_block_size appeared in 0.18.0 (absent in
    # 0.17.0's vllm/config/cache.py, present in 0.18-0.34).
    lambda e: applied_if(e.vllm >= V("0.18.0.dev0")),
    "an explicit block_size binds every attention backend from 0.18 (sparse MLA: 64)")


def test_legacy_call_shape(base, vllm_config):
    legacy_call_shape(base, base.gen, vllm_config, BY_NAME[NAME])


def legacy_call_shape(base, gen, cfg, adapter):
    call = dict(block_size=16, gpu_memory_utilization=0.8, enable_prefix_caching=False)
    bare = gen.CacheConfig(**call)
    marked = getattr(bare, "user_specified_block_size", None)
    with one(base, adapter) as applied:
        ours = gen.CacheConfig(**call)
        other = gen.CacheConfig(**{**call, "block_size": 32})
    if not applied:
        assert marked is None  # no such field: a block size is no per-backend choice here
        return
    assert marked is True  # speculators' 16 binds every backend
    assert ours.user_specified_block_size is False  # the backends choose ...
    assert ours.block_size == type(ours).DEFAULT_BLOCK_SIZE  # ... from vLLM's default
    # another size is not speculators' constant: passed on as given
    assert other.block_size == 32 and other.user_specified_block_size is True
