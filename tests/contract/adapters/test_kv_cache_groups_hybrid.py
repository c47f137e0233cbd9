"""Contract of the ``kv_cache_groups_hybrid`` adapter,
on the installed vLLM and speculators.

A spec whose layers cannot share one KV cache spec (here: full attention beside sliding
window of another head size, as in Gemma 4) fails speculators' one-group path bare and
gets vLLM's own groups through the adapter (on vLLM 0.11, whose own grouping cannot form
them either, the same error vLLM's engine raises); a spec speculators' path handles is
grouped exactly as before. The checks every adapter shares run in
tests/contract/test_every_adapter.py.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from packaging.version import Version

from ..expectations import APPLIED
from ..support import (
    BY_NAME,
    _env_facts,
    build_vllm_config,
    one,
    resolve_layout_like_engine_core,
)

NAME = "kv_cache_groups_hybrid"

#: Its expected status on the installed release, and why (read by ``expectations.py``).
EXPECTED = (
    # get_kv_cache_groups(vllm_config, kv_cache_spec) and is_kv_cache_spec_uniform exist
    # in every release the shim supports (0.11-0.34; kv_cache_planning from 0.33).
    lambda e: APPLIED,
    "speculators builds one KV cache group; hybrid models need vLLM's grouping")


def test_legacy_call_shape(base, vllm_config):
    legacy_call_shape(base, base.gen, vllm_config, BY_NAME[NAME])


def _specs(cfg):
    """Two full-attention layers (head 64) and two sliding-window layers (head 128)."""
    import torch
    from vllm.v1.kv_cache_interface import FullAttentionSpec, SlidingWindowSpec

    bs = cfg.cache_config.block_size
    full = FullAttentionSpec(block_size=bs, num_kv_heads=1, head_size=64, dtype=torch.bfloat16)
    sliding = SlidingWindowSpec(block_size=bs, num_kv_heads=1, head_size=128,
                                dtype=torch.bfloat16, sliding_window=64)
    return {"model.layers.0.attn": sliding, "model.layers.1.attn": full,
            "model.layers.2.attn": sliding, "model.layers.3.attn": full}


def _uniform(cfg):
    import torch
    from vllm.v1.kv_cache_interface import FullAttentionSpec

    spec = FullAttentionSpec(block_size=cfg.cache_config.block_size, num_kv_heads=1,
                             head_size=64, dtype=torch.bfloat16)
    return {f"model.layers.{i}.attn": spec for i in range(3)}


def _vllm_cannot_group(cfg, mod) -> Exception | None:
    """What vLLM's own grouping (the helper the engine core calls, as the adapter picks it)
    raises for the hybrid spec, or None where it groups it."""
    try:
        mod.vllm_grouping()(cfg, _specs(cfg))
    except (AssertionError, ValueError, NotImplementedError) as exc:
        return exc
    return None


def _speculators_path(gen, spec):
    gen.unify_hybrid_kv_cache_specs(spec)
    return gen._get_kv_cache_groups_uniform_spec(spec)


def legacy_call_shape(base, gen, cfg, adapter):
    cfg = build_vllm_config()  # a config of its own: the layout is resolved on it
    resolve_layout_like_engine_core(
        cfg, [SimpleNamespace(kv_cache_spec=s) for s in _specs(cfg).values()])
    bare_uniform = _speculators_path(gen, _uniform(cfg))
    with pytest.raises((AssertionError, ValueError, NotImplementedError)):
        _speculators_path(gen, _specs(cfg))  # one group of one spec cannot be formed
    remember = gen.VllmHiddenStatesGenerator._create_vllm_config
    with one(base, adapter) as applied:
        assert applied
        # speculators' method hands its config to the grouping (the body is speculators')
        assert gen.VllmHiddenStatesGenerator._create_vllm_config is not remember
        from speculators_compat.adapters import kv_cache_groups_hybrid as mod

        token = mod._config.set(cfg)
        try:
            vllm_cannot = _vllm_cannot_group(cfg, mod)
            if vllm_cannot is not None:
                # vLLM's own engine core cannot group these layers either (0.11: no
                # unification of page sizes): the adapter raises what vLLM raises
                assert _env_facts().vllm < Version("0.12"), vllm_cannot
                with pytest.raises(type(vllm_cannot)):
                    _speculators_path(gen, _specs(cfg))
                groups = None
            else:
                groups = _speculators_path(gen, _specs(cfg))
            uniform = _speculators_path(gen, _uniform(cfg))
        finally:
            mod._config.reset(token)
    assert [g.layer_names for g in uniform] == [g.layer_names for g in bare_uniform]
    assert [g.kv_cache_spec for g in uniform] == [g.kv_cache_spec for g in bare_uniform]
    if groups is None:
        return
    assert len(groups) >= 2, groups  # vLLM's grouping: one group per kind at least
    names = sorted(n for g in groups for n in g.layer_names)
    assert names == sorted(_specs(cfg))  # every layer in exactly one group
    kinds = {type(g.kv_cache_spec).__name__ for g in groups}
    assert "SlidingWindowSpec" in kinds, kinds
