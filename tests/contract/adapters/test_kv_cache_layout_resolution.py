"""Contract of the ``kv_cache_layout_resolution`` adapter,
on the installed vLLM and speculators.

Speculators' legacy call shape fails (or is wrong) bare where the upstream note says
so and works through the adapter. The checks every adapter shares (the probe agrees with
the expectation table, apply/revert restores identity and changes only the declared
targets) run for every adapter in tests/contract/test_every_adapter.py.
"""

from __future__ import annotations

import inspect

import pytest

from ..expectations import kv_engine_sets
from ..support import (
    BY_NAME,
    _check_executor_shim,
    build_vllm_config,
    has_engine_level_layout,
    kv_call,
    kv_groups,
    one,
    resolve_layout_like_engine_core,
)

NAME = "kv_cache_layout_resolution"

#: Its expected status on the installed release, and why (read by ``expectations.py``).
EXPECTED = (
    kv_engine_sets,
    "the engine core resolves one KV cache layout before KV configs (~0.29+)")


def test_legacy_call_shape(base, vllm_config):
    legacy_call_shape(base, base.gen, vllm_config, BY_NAME[NAME])


def legacy_call_shape(base, gen, cfg, adapter):
    from vllm.v1.executor.multiproc_executor import MultiprocExecutor

    fresh = build_vllm_config()  # layout not resolved, as speculators leaves it
    groups = kv_groups(fresh)
    call = dict(vllm_config=fresh, kv_cache_groups=groups, available_memory=1 << 24)
    needed = has_engine_level_layout()
    if needed:
        # upstream error text: "ValueError: KV cache layout has not been resolved yet" (0.32).
        with pytest.raises(ValueError, match="KV cache layout has not been resolved yet"):
            kv_call(gen.get_kv_cache_config_from_groups, **call)
        # The sequence the adapter replays (what EngineCore does) exists as it expects.
        from vllm.v1.attention.backends.utils import resolve_kv_cache_layout

        assert list(inspect.signature(resolve_kv_cache_layout).parameters)[:3] == [
            "vllm_config", "supported_layouts", "kv_cache_specs"]
        for meth in ("get_kv_cache_specs", "get_supported_kv_cache_layouts",
                     "set_kv_cache_layout"):
            assert callable(getattr(MultiprocExecutor, meth)), meth
        from vllm.v1.core.single_type_kv_cache_manager import (  # noqa: F401
            register_all_kvcache_specs,
        )
        # ...and, replayed in this process, makes speculators' call work.
        resolve_layout_like_engine_core(fresh, groups)
        assert kv_call(gen.get_kv_cache_config_from_groups, **call).num_blocks > 0
    else:
        assert kv_call(gen.get_kv_cache_config_from_groups, **call).num_blocks > 0
    with one(base, adapter) as applied:
        assert applied == needed
        # its hook runs in GeneratorExecutor.__init__, once vLLM's has started the workers
        _check_executor_shim(gen, MultiprocExecutor, applied, NAME, set())
