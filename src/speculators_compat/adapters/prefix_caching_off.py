"""Prefix caching became the default (``enable_prefix_caching=True``) in vLLM 0.12.

Why: with prefix caching on, a prompt prefix seen before is not recomputed, so its
tokens produce no hidden states (missing rows), KV state can leak between calls
(speculators issue #279), and without a ``block_hasher`` on each ``Request`` (0.3.0
builds none) the block pool asserts. speculators 0.4 already disables it.
How: the rebound ``CacheConfig`` in speculators' module passes
``enable_prefix_caching=False`` unless the caller chose a value.
Applies when: the installed ``CacheConfig`` defaults ``enable_prefix_caching`` to ``True``
and the installed speculators' generator does not set it (0.3.x).
Remove when: speculators 0.3.x support is dropped.
"""

from __future__ import annotations

from types import ModuleType

from .._adapter import Context, Verdict
from .._patcher import Patcher
from . import _probes, _targets, _wrappers
from ._base import GeneratorAdapter


class PrefixCachingOff(GeneratorAdapter):
    name = "prefix_caching_off"
    summary = "build speculators' CacheConfig with enable_prefix_caching=False"
    upstream = "vLLM 0.12.0: CacheConfig.enable_prefix_caching defaults to True"
    vllm_range = ">=0.12.0.dev0"
    remove_when = "speculators 0.3.x support is dropped"
    targets = _targets.in_generator("CacheConfig")

    def check(self, ctx: Context, gen: ModuleType) -> Verdict:
        params = _probes.parameters(gen.CacheConfig)
        if params is None or "enable_prefix_caching" not in params:
            return Verdict.mismatch("CacheConfig has no enable_prefix_caching parameter")
        default = params["enable_prefix_caching"].default
        if default is not True:
            # 0.11.x: None (resolved per engine; speculators 0.3.0 was written for it)
            return Verdict.not_needed(
                f"CacheConfig.enable_prefix_caching defaults to {default!r}, not True")
        if _probes.consumer_passes(gen, "enable_prefix_caching="):
            return Verdict.not_needed("CacheConfig.enable_prefix_caching defaults to True; "
                                      "this speculators sets it itself")
        return Verdict.needed(f"CacheConfig.enable_prefix_caching defaults to {default!r}; "
                              "prefix hits would skip rows and need a block hasher")

    def patch(self, patcher: Patcher, ctx: Context, gen: ModuleType) -> None:
        patcher.wrap(gen, "CacheConfig", _wrappers.default_kwarg("enable_prefix_caching", False))
