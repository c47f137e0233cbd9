"""The engine core sets fields on ``KVCacheConfig`` that speculators' generator does not.

Why: vLLM 0.29–0.32 added optional ``KVCacheConfig`` fields (``kv_cache_layout``,
``hash_block_size``, ``cache_hit_alignment_tokens``) that ``EngineCore`` fills after
``get_kv_cache_configs`` and before ``initialize_from_config``, and it aligns
``cache_config.block_size`` with the KV groups. Workers and the scheduler read them;
speculators' generator builds its config itself and leaves them unset.
How: rebind ``get_kv_cache_config_from_groups`` in speculators' module to a wrapper that
fills, on the config it returns, what this release's engine core fills (each field
only if the dataclass has it, computed with the release's own helpers).
Applies when: ``KVCacheConfig`` has any of those fields.
Remove when: speculators < 0.5 support is dropped.
"""

from __future__ import annotations

import dataclasses
import importlib
from types import ModuleType

from .._adapter import Context, Verdict
from .._patcher import Patcher
from . import _targets, _wrappers
from ._base import GeneratorAdapter
from ._block_sizes import UTILS, block_sizes  # noqa: F401 - block_sizes: importable from here too

FIELDS = ("kv_cache_layout", "hash_block_size", "cache_hit_alignment_tokens")


def _fields() -> set[str]:
    from vllm.v1.kv_cache_interface import KVCacheConfig

    return {f.name for f in dataclasses.fields(KVCacheConfig)} & set(FIELDS)


def fill_engine_fields(cfg, vllm_config) -> None:
    """What ``EngineCore._initialize_kv_caches`` does to a fresh KV config."""
    cache_config = vllm_config.cache_config
    groups = cfg.kv_cache_groups
    present = _fields()
    if groups:
        participating = [g.kv_cache_spec.block_size for g in groups
                         if getattr(g.kv_cache_spec, "prefix_cacheable", True)]
        cache_config.block_size = min(participating or
                                      [g.kv_cache_spec.block_size for g in groups])
    if "kv_cache_layout" in present and getattr(cache_config, "kv_cache_layout", None):
        cfg.kv_cache_layout = cache_config.kv_cache_layout
    if "hash_block_size" in present or "cache_hit_alignment_tokens" in present:
        scheduler_bs, hash_bs = block_sizes(cfg, vllm_config)
        if "hash_block_size" in present:
            cfg.hash_block_size = hash_bs
        align = getattr(importlib.import_module(UTILS), "resolve_cache_hit_alignment_tokens",
                        None)
        if "cache_hit_alignment_tokens" in present and align is not None and groups:
            cfg.cache_hit_alignment_tokens = align(cfg, vllm_config, scheduler_bs, hash_bs)


class KVCacheConfigFields(GeneratorAdapter):
    name = "kv_cache_config_fields"
    summary = "fill the KVCacheConfig fields the engine core fills (layout, hash block size)"
    upstream = ("vLLM 0.29-0.32: KVCacheConfig.kv_cache_layout / hash_block_size / "
                "cache_hit_alignment_tokens set in EngineCore._initialize_kv_caches")
    vllm_range = ">=0.29.0.dev0"
    remove_when = "speculators < 0.5 support is dropped"
    targets = _targets.in_generator("get_kv_cache_config_from_groups")

    def check(self, ctx: Context, gen: ModuleType) -> Verdict:
        present = _fields()
        if not present:
            return Verdict.not_needed("KVCacheConfig has none of " + ", ".join(FIELDS))
        return Verdict.needed("KVCacheConfig has engine-set fields " + ", ".join(sorted(present)))

    def patch(self, patcher: Patcher, ctx: Context, gen: ModuleType) -> None:
        def wrapper(wrapped, instance, args, kwargs):
            cfg = wrapped(*args, **kwargs)
            vllm_config = _wrappers.argument(args, kwargs, "vllm_config", 0)
            fill_engine_fields(cfg, vllm_config)
            return cfg

        patcher.wrap(gen, "get_kv_cache_config_from_groups", wrapper)
