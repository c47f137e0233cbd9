"""The engine core resolves one KV-cache layout before KV configs can be built (~0.29+).

Why: newer engine cores call ``resolve_kv_cache_layout`` over the workers'
``get_supported_kv_cache_layouts()`` and broadcast it with ``set_kv_cache_layout``
before ``get_kv_cache_config_from_groups`` (from 0.34 ``set_kv_cache_layout`` also
takes the context-parallel ``cp_kv_cache_interleave_size``, required); that function
now reads the resolved layout and raises ``ValueError: KV cache layout has not been
resolved yet`` (seen on 0.32) when speculators' generator, which bypasses the engine
core, calls it.
How: a hook of the generator's executor (``speculators_compat._executor``) replays the
engine core's sequence once vLLM's ``__init__`` has started the workers:
``register_all_kvcache_specs`` (where it exists), collect specs, resolve, broadcast (with
the config's ``cp_kv_cache_interleave_size`` where ``set_kv_cache_layout`` takes it; the
engine core's ``adjust_dcp_kv_cache_interleave_size`` only changes it for KV transfer with
decode context parallelism, which the generator never configures).
Applies when: ``resolve_kv_cache_layout`` exists and the executor has
``set_kv_cache_layout``.
Remove when: speculators 0.3/0.4 support is dropped.
"""

from __future__ import annotations

import importlib
from types import ModuleType

from .. import _executor
from .._adapter import Context, Verdict
from . import _probes
from ._base import ExecutorFeature

UTILS = "vllm.v1.attention.backends.utils"
#: ``Executor.set_kv_cache_layout``'s second (required) parameter from vLLM 0.34.
INTERLEAVE = "cp_kv_cache_interleave_size"


def _resolver():
    try:
        return getattr(importlib.import_module(UTILS), "resolve_kv_cache_layout", None)
    except ImportError:
        return None


class KVCacheLayoutResolution(ExecutorFeature):
    name = "kv_cache_layout_resolution"
    summary = "resolve and broadcast the KV-cache layout as the engine core does"
    upstream = ("vLLM ~0.29: EngineCore._initialize_kv_caches resolves the KV cache layout "
                "(vllm/v1/attention/backends/utils.py: resolve_kv_cache_layout)")
    vllm_range = ">=0.29.0.dev0"
    remove_when = "speculators < 0.5 support is dropped"

    def check(self, ctx: Context, gen: ModuleType) -> Verdict:
        resolve = _resolver()
        has_set = hasattr(self.executor_class(gen), "set_kv_cache_layout")
        if resolve is None and not has_set:
            return Verdict.not_needed("this vLLM has no engine-level KV cache layout")
        if resolve is None or not has_set:
            return Verdict.mismatch("resolve_kv_cache_layout and Executor.set_kv_cache_layout "
                                    "are not both present")
        params = _probes.parameters(resolve) or {}
        if list(params)[:2] != ["vllm_config", "supported_layouts"]:
            return Verdict.mismatch(f"unknown resolve_kv_cache_layout{tuple(params)}")
        return Verdict.needed("KV configs need a resolved layout; speculators bypasses the "
                              "engine core that resolves it")

    def hooks(self, ctx: Context, gen: ModuleType) -> _executor.ExecutorHooks:
        try:
            from vllm.v1.core.single_type_kv_cache_manager import register_all_kvcache_specs
        except ImportError:
            register_all_kvcache_specs = None
        interleave = INTERLEAVE in (_probes.parameters(
            self.executor_class(gen).set_kv_cache_layout) or {})
        return _ResolveLayout(_resolver(), register_all_kvcache_specs, interleave)


class _ResolveLayout(_executor.ExecutorHooks):
    """Once the workers are up: the engine core's layout sequence."""

    def __init__(self, resolve, register_all_kvcache_specs, interleave: bool) -> None:
        self.resolve = resolve
        self.register_all_kvcache_specs = register_all_kvcache_specs
        self.interleave = interleave

    def started(self, executor) -> None:
        vllm_config = executor.vllm_config
        if self.register_all_kvcache_specs is not None:
            self.register_all_kvcache_specs(vllm_config)
        specs = executor.get_kv_cache_specs()
        layout = self.resolve(vllm_config, executor.get_supported_kv_cache_layouts(),
                              [s for worker_specs in specs for s in worker_specs.values()])
        if self.interleave:  # 0.34: the CP interleave size travels with the layout
            executor.set_kv_cache_layout(
                layout.name, vllm_config.parallel_config.cp_kv_cache_interleave_size)
        else:
            executor.set_kv_cache_layout(layout.name)
