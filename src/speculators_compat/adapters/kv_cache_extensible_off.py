"""vLLM 0.34 turns on an extensible KV cache on CUDA (``CacheConfig.enable_extensible_kv_cache``).

Why: with the extensible KV cache, ``Executor.initialize_from_config`` only reserves
address space and backs a block or two; vLLM's engine core then warms up, measures and
calls ``executor.extend_kv_cache(num_blocks)`` (``EngineCore._initialize_kv_caches``,
``vllm/v1/worker/extensible_kv_cache.py``). speculators' generator builds its
``VllmConfig`` and KV cache itself and never extends it: the scheduler hands out blocks
the workers have not backed.
How: the rebound ``CacheConfig`` in speculators' module passes
``enable_extensible_kv_cache=False`` unless the caller chose a value, so the generator's
engine allocates its KV cache whole at ``initialize_from_config``, sized by speculators'
own ``get_kv_cache_config_from_groups`` call, as on earlier releases. vLLM's own engines
(``LLM``, ``EngineCore``) build their own ``CacheConfig`` and keep the default.
Applies when: the installed ``CacheConfig`` has ``enable_extensible_kv_cache`` and
speculators' generator does not set it (0.3.x and 0.4.x never do).
Remove when: speculators < 0.5 support is dropped.
"""

from __future__ import annotations

from types import ModuleType

from .._adapter import Context, Verdict
from .._patcher import Patcher
from . import _probes, _targets, _wrappers
from ._base import GeneratorAdapter

FIELD = "enable_extensible_kv_cache"


class KVCacheExtensibleOff(GeneratorAdapter):
    name = "kv_cache_extensible_off"
    summary = "build speculators' CacheConfig with enable_extensible_kv_cache=False"
    upstream = ("vLLM 0.34.0: CacheConfig.enable_extensible_kv_cache, on by default on CUDA "
                "(VllmConfig._resolve_extensible_kv_cache; EngineCore extends the cache "
                "after warm-up)")
    vllm_range = ">=0.34.0.dev0"
    remove_when = "speculators < 0.5 support is dropped"
    targets = _targets.in_generator("CacheConfig")

    def check(self, ctx: Context, gen: ModuleType) -> Verdict:
        params = _probes.parameters(gen.CacheConfig)
        if params is None:
            return Verdict.mismatch("CacheConfig's parameters cannot be read")
        if FIELD not in params:
            return Verdict.not_needed(f"CacheConfig has no {FIELD} (the KV cache is "
                                      "allocated whole)")
        if _probes.consumer_passes(gen, f"{FIELD}="):
            return Verdict.not_needed(f"this speculators sets {FIELD} itself")
        return Verdict.needed(f"CacheConfig.{FIELD} defaults to on where supported (CUDA); "
                              "speculators never extends the KV cache it builds")

    def patch(self, patcher: Patcher, ctx: Context, gen: ModuleType) -> None:
        patcher.wrap(gen, "CacheConfig", _wrappers.default_kwarg(FIELD, False))
