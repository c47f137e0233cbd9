"""speculators 0.4.x hashes every prompt block of every request, for a prefix cache it
turned off.

Why: 0.4.x's generator builds ``get_request_block_hasher(...)`` and passes it to each
``Request``, which then hashes every full block of the prompt (sha256 by default) when
the request is made, in the driver, before the first step. The same generator builds
its engine with ``enable_prefix_caching=False`` and no KV connector, so nothing reads
those hashes; vLLM's own engine builds no hasher in that case (``EngineCore.__init__``:
``if cache_config.enable_prefix_caching or kv_connector is not None``). Measured with
``benchmarks/cpu/request_hash_cost.py`` on this project's CPU machine (quiet): making the
requests of a batch-32 call (768-1024 tokens each) took 4.4 ms (vLLM 0.32) and 7.1 ms
(vLLM 0.16) with the hasher, 0.4 ms without; on the H200 machine (vLLM 0.26) 4.5 ms
against 0.3 ms. Without this adapter, each batch-32 call of 0.4.0.1 on the H200 benchmark
(8B-shaped model) spent 0.016-0.023 s more in its steps than 0.3.0's, which passes no
hasher (two rounds, 2026-12-01); with it, 0.693 against 0.697 s per copied call (one
round, 2026-12-02; ``docs/performance.md``).
How: after speculators' ``__init__``, where the generator's config has prefix caching
off and no ``kv_transfer_config``, its ``block_hasher`` attribute (read by
``generate()`` for each ``Request``) is set to ``None``: requests are made as vLLM's own
engine makes them. A config with either on keeps the hasher.
Applies when: the installed generator passes ``block_hasher=`` to ``Request`` (probed in
its source) and the installed ``Request`` defaults ``block_hasher`` to ``None``.
Remove when: speculators 0.4.x support is dropped.
"""

from __future__ import annotations

from types import ModuleType

from .._adapter import Context, Verdict
from .._patcher import Patcher
from .._report import Kind
from . import _probes, _targets
from ._base import GeneratorAdapter


def hasher_unused(vllm_config) -> bool:
    """True where no prefix cache and no KV connector would read the block hashes."""
    cache = getattr(vllm_config, "cache_config", None)
    return (cache is not None and getattr(cache, "enable_prefix_caching", None) is False
            and getattr(vllm_config, "kv_transfer_config", None) is None)


class BlockHasherUnused(GeneratorAdapter):
    name = "block_hasher_unused"
    kind = Kind.PERFORMANCE
    summary = "no block hashes for requests where prefix caching is off (as vLLM's engine)"
    upstream = ("speculators 0.4.x passes a block_hasher to every Request although it turns "
                "prefix caching off; vLLM's EngineCore builds none in that case")
    vllm_range = None
    speculators_range = ">=0.4.0.dev0,<0.5.0.dev0"
    remove_when = "speculators 0.4.x support is dropped"
    targets = _targets.in_generator("VllmHiddenStatesGenerator.__init__")

    def check(self, ctx: Context, gen: ModuleType) -> Verdict:
        if "block_hasher=self.block_hasher" not in _probes.source(gen):
            return Verdict.not_needed("the generator passes no block_hasher to Request")
        params = _probes.parameters(gen.Request) or {}
        if "block_hasher" not in params or params["block_hasher"].default is not None:
            return Verdict.not_needed("the installed Request does not default block_hasher "
                                      "to None")
        return Verdict.needed("requests are made without block hashes where the generator's "
                              "engine has prefix caching off and no KV connector (nothing "
                              "reads them; vLLM's own engine makes none)")

    def patch(self, patcher: Patcher, ctx: Context, gen: ModuleType) -> None:
        def init(wrapped, instance, args, kwargs):
            out = wrapped(*args, **kwargs)
            if (getattr(instance, "block_hasher", None) is not None
                    and hasher_unused(getattr(instance, "vllm_config", None))):
                instance.block_hasher = None
            return out

        patcher.wrap(gen.VllmHiddenStatesGenerator, "__init__", init)
