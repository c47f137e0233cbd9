"""Models that mix attention kinds need vLLM's hybrid KV cache groups, not one group.

Why: speculators 0.3/0.4 put every layer in one KV cache group of one spec
(``unify_hybrid_kv_cache_specs`` then ``_get_kv_cache_groups_uniform_spec``). That holds
where all layers can share one spec (Llama, DeepSeek-V3, and sliding window + full with
equal head sizes: GPT-OSS, Gemma 3, which the unify step turns into full attention). It
fails, after the weights have loaded, for the models EAGLE-3 drafts are trained for now:
Gemma 4 (sliding and full layers of different head sizes: ``All attention layers in the
same KV cache group must have the same attention spec``), Qwen3-Next / Qwen3.5 (linear
attention state beside full attention: ``Failed to promote local KV cache specs to one
unified type``), DeepSeek-V3.2 / GLM-5 (a sparse-MLA indexer cache beside the MLA cache).
vLLM's own engine groups such layers itself (``get_kv_cache_groups``: one group per kind,
page sizes unified, per-request state groups for linear attention) and its scheduler runs
a hybrid KV cache coordinator over them.
How: in speculators' module, ``unify_hybrid_kv_cache_specs`` applies speculators' unify
only where it yields one spec for all layers (so every model that ran before runs exactly
as before), and ``_get_kv_cache_groups_uniform_spec`` hands any other spec to vLLM's
grouping, as the engine core does (``get_global_kv_cache_groups`` where it exists, else
``get_kv_cache_groups``). That grouping needs the generator's ``VllmConfig``, which
speculators' call does not pass: ``VllmHiddenStatesGenerator._create_vllm_config`` is
wrapped to hand its result on (per thread: a context variable). The KV config, the
scheduler's block sizes and its coordinator then follow the groups
(``kv_cache_config_fields``, ``scheduler_block_size``). Where a group holds layers of one
kind with different shapes (``UniformTypeKVCacheSpecs``: DeepSeek-V3.2's MLA and indexer
caches), the engine core gives the scheduler a view of the workers' config with one spec
per group (``generate_scheduler_kv_cache_config``); the rebound ``Scheduler`` does the same,
while the workers get speculators' config unchanged.
Applies when: vLLM has ``get_kv_cache_groups(vllm_config, kv_cache_spec)`` and
``is_kv_cache_spec_uniform`` in ``kv_cache_utils`` or ``kv_cache_planning``. That includes
vLLM 0.11, the release speculators 0.3.0 pins: unlike the other ``upstream-change``
adapters it answers a limit of speculators' own code rather than a change in vLLM, so it
acts there too (the support matrix allows it there by name), and for a model whose layers
share one spec it changes nothing.
Remove when: speculators 0.3/0.4 support is dropped.
"""

from __future__ import annotations

import contextvars
import functools
import importlib
from types import ModuleType

from .._adapter import Context, Verdict
from .._patcher import Patcher
from . import _probes, _targets, _wrappers
from ._base import GeneratorAdapter

#: Where vLLM keeps its KV-cache planning helpers (0.33 moved them to the second).
MODULES = ("vllm.v1.core.kv_cache_planning", "vllm.v1.core.kv_cache_utils")

#: The generator config being set up in this thread (set by ``_create_vllm_config``).
_config: contextvars.ContextVar = contextvars.ContextVar("speculators_compat_kv_groups_config",
                                                         default=None)


def _find(name: str):
    for module in MODULES:
        try:
            found = getattr(importlib.import_module(module), name, None)
        except ImportError:
            continue
        if found is not None:
            return found
    return None


def vllm_grouping():
    """``(vllm_config, spec) -> groups`` as this release's engine core groups one
    worker's layers, or ``None`` where vLLM has no grouping helper of a known shape."""
    global_groups = _find("get_global_kv_cache_groups")
    if global_groups is not None and list(_probes.parameters(global_groups) or {})[:2] == [
            "vllm_config", "kv_cache_specs"]:
        return lambda vllm_config, spec: global_groups(vllm_config, [spec])
    groups = _find("get_kv_cache_groups")
    if groups is not None and list(_probes.parameters(groups) or {})[:2] == [
            "vllm_config", "kv_cache_spec"]:
        return groups
    return None


class KVCacheGroupsHybrid(GeneratorAdapter):
    name = "kv_cache_groups_hybrid"
    summary = "group a hybrid model's KV cache as vLLM's engine does (not one group)"
    upstream = ("vLLM hybrid KV cache manager: get_kv_cache_groups "
                "(vllm/v1/core/kv_cache_utils.py; kv_cache_planning.py from 0.33)")
    vllm_range = None
    remove_when = "speculators 0.3/0.4 support is dropped"
    targets = _targets.in_generator("unify_hybrid_kv_cache_specs",
                                    "_get_kv_cache_groups_uniform_spec", "Scheduler",
                                    "VllmHiddenStatesGenerator._create_vllm_config")

    def check(self, ctx: Context, gen: ModuleType) -> Verdict:
        if vllm_grouping() is None or _find("is_kv_cache_spec_uniform") is None:
            return Verdict.mismatch("vLLM has neither get_global_kv_cache_groups("
                                    "vllm_config, kv_cache_specs) nor get_kv_cache_groups("
                                    "vllm_config, kv_cache_spec) with is_kv_cache_spec_uniform")
        missing = [n for n in ("unify_hybrid_kv_cache_specs", "_get_kv_cache_groups_uniform_spec")
                   if not hasattr(gen, n)]
        if missing or not hasattr(gen.VllmHiddenStatesGenerator, "_create_vllm_config"):
            lacks = missing or "_create_vllm_config"
            return Verdict.mismatch(f"speculators' generator lacks {lacks}")
        return Verdict.needed("models whose layers cannot share one KV spec get vLLM's "
                              "grouping; the others keep speculators' one group")

    def patch(self, patcher: Patcher, ctx: Context, gen: ModuleType) -> None:
        grouping = vllm_grouping()
        uniform = _find("is_kv_cache_spec_uniform")
        unify_one = gen.unify_hybrid_kv_cache_specs
        groups_one = gen._get_kv_cache_groups_uniform_spec

        def unify_hybrid_kv_cache_specs(kv_cache_spec):
            trial = dict(kv_cache_spec)
            try:
                unify_one(trial)
            except (ValueError, AssertionError, NotImplementedError):
                return  # no single spec: left whole for vLLM's grouping
            if uniform(trial):
                kv_cache_spec.update(trial)

        def _get_kv_cache_groups_uniform_spec(kv_cache_spec):
            vllm_config = _config.get()
            if uniform(kv_cache_spec) or vllm_config is None:
                return groups_one(kv_cache_spec)
            return grouping(vllm_config, kv_cache_spec)

        def remember_config(wrapped, instance, args, kwargs):
            vllm_config = wrapped(*args, **kwargs)
            _config.set(vllm_config)
            return vllm_config

        scheduler_view = _find("generate_scheduler_kv_cache_config")
        base = gen.Scheduler

        @functools.wraps(base.__init__)  # adapters after this one probe its parameters
        def __init__(self, *args, **kwargs):
            kv_cache_config = _wrappers.argument(args, kwargs, "kv_cache_config", 1)
            if scheduler_view is not None and kv_cache_config is not None and any(
                    type(g.kv_cache_spec).__name__ == "UniformTypeKVCacheSpecs"
                    for g in kv_cache_config.kv_cache_groups):
                view = scheduler_view([kv_cache_config])
                if "kv_cache_config" in kwargs or len(args) < 2:
                    kwargs["kv_cache_config"] = view
                else:
                    args = (*args[:1], view, *args[2:])
            base.__init__(self, *args, **kwargs)

        patcher.setattr(gen, "Scheduler", _wrappers.subclass(base, self.name,
                                                            {"__init__": __init__}))
        patcher.setattr(gen, "unify_hybrid_kv_cache_specs", unify_hybrid_kv_cache_specs)
        patcher.setattr(gen, "_get_kv_cache_groups_uniform_spec",
                        _get_kv_cache_groups_uniform_spec)
        patcher.wrap(gen.VllmHiddenStatesGenerator, "_create_vllm_config", remember_config)
