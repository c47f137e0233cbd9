"""``get_kv_cache_config_from_groups`` lost its ``kv_cache_specs`` parameter in vLLM 0.12.

Why: speculators 0.3.0 (written for 0.11.0, where the argument is required) calls it
with ``kv_cache_specs=``: ``TypeError: get_kv_cache_config_from_groups() got an
unexpected keyword argument 'kv_cache_specs'``.
How: rebind the name in speculators' module to a wrapper that drops the argument when
the installed function does not accept it (the groups carry the same specs).
Applies when: the installed function has ``kv_cache_groups``/``available_memory`` but no
``kv_cache_specs``, and the installed speculators' generator passes it (0.3.x). Mismatch
when the function has neither shape.
Remove when: speculators 0.3.x support is dropped.
"""

from __future__ import annotations

from types import ModuleType

from .._adapter import Context, Verdict
from .._patcher import Patcher
from . import _probes, _targets, _wrappers
from ._base import GeneratorAdapter


class KVCacheSpecsKwarg(GeneratorAdapter):
    name = "kv_cache_specs_kwarg"
    summary = "drop kv_cache_specs= from get_kv_cache_config_from_groups calls"
    upstream = "vLLM 0.12.0: get_kv_cache_config_from_groups(kv_cache_specs=...) removed"
    vllm_range = ">=0.12.0.dev0"
    remove_when = "speculators 0.3.x support is dropped"
    targets = _targets.in_generator("get_kv_cache_config_from_groups")

    def check(self, ctx: Context, gen: ModuleType) -> Verdict:
        params = _probes.parameters(gen.get_kv_cache_config_from_groups)
        if params is None:
            return Verdict.mismatch("get_kv_cache_config_from_groups is not inspectable")
        if "kv_cache_specs" in params:
            return Verdict.not_needed("get_kv_cache_config_from_groups accepts kv_cache_specs")
        if {"vllm_config", "kv_cache_groups", "available_memory"} <= params.keys():
            if not _probes.consumer_passes(gen, "kv_cache_specs="):
                return Verdict.not_needed("get_kv_cache_config_from_groups no longer takes "
                                          "kv_cache_specs; this speculators does not pass it")
            return Verdict.needed("get_kv_cache_config_from_groups no longer takes "
                                  "kv_cache_specs")
        return Verdict.mismatch(f"unknown get_kv_cache_config_from_groups{tuple(params)}")

    def patch(self, patcher: Patcher, ctx: Context, gen: ModuleType) -> None:
        patcher.wrap(gen, "get_kv_cache_config_from_groups", _wrappers.drop_kwarg("kv_cache_specs"))
