"""``Scheduler.__init__`` requires ``block_size`` (0.11.1) and takes ``hash_block_size`` (0.20).

Why: speculators 0.3.0 does not pass ``block_size``: ``TypeError: Scheduler.__init__()
missing 1 required positional argument: 'block_size'``; 0.4 passes its hard-coded 16,
which is wrong wherever the KV cache uses another block size (CPU platform, MLA).
A scheduler whose block size differs from the KV cache's hands workers wrong block
tables: silently wrong attention. The engine core passes the block size the KV groups
resolved to (and ``hash_block_size`` from 0.20).
How: rebind ``Scheduler`` in speculators' module to a subclass whose ``__init__`` passes
the block size(s) this release's engine core would compute for the given KV config.
Applies when: ``Scheduler.__init__`` has a ``block_size`` parameter.
Remove when: speculators < 0.5 support is dropped.
"""

from __future__ import annotations

from types import ModuleType

from .._adapter import Context, Verdict
from .._patcher import Patcher
from . import _probes, _targets, _wrappers
from ._base import GeneratorAdapter
from ._block_sizes import block_sizes


class SchedulerBlockSize(GeneratorAdapter):
    name = "scheduler_block_size"
    summary = "give the Scheduler the KV cache's real block_size (and hash_block_size)"
    upstream = ("vLLM 0.11.1: Scheduler(block_size) required; 0.20.0: optional "
                "hash_block_size (vllm/v1/core/sched/scheduler.py)")
    vllm_range = ">=0.11.1.dev0"
    remove_when = "speculators < 0.5 support is dropped"
    targets = _targets.in_generator("Scheduler")
    #: Outside kv_cache_groups_hybrid's Scheduler subclass: the block sizes come from the
    #: KV config speculators passes (the one the engine core resolves them from), not from
    #: the one-spec-per-group view that subclass hands vLLM's Scheduler.
    after = ("kv_cache_groups_hybrid",)

    def check(self, ctx: Context, gen: ModuleType) -> Verdict:
        params = _probes.parameters(gen.Scheduler)
        if params is None or "kv_cache_config" not in params:
            return Verdict.mismatch("Scheduler.__init__ has no kv_cache_config parameter")
        if "block_size" not in params:
            return Verdict.not_needed("Scheduler.__init__ takes no block_size")
        extra = " and hash_block_size" if "hash_block_size" in params else ""
        return Verdict.needed(f"Scheduler.__init__ takes block_size{extra}; pass the KV "
                              "cache's resolved value")

    def patch(self, patcher: Patcher, ctx: Context, gen: ModuleType) -> None:
        base = gen.Scheduler
        params = _probes.parameters(base) or {}

        def __init__(self, *args, **kwargs):
            vllm_config = _wrappers.argument(args, kwargs, "vllm_config", 0)
            kv_cache_config = _wrappers.argument(args, kwargs, "kv_cache_config", 1)
            if vllm_config is not None and kv_cache_config is not None and len(args) <= 3:
                block_size, hash_block_size = block_sizes(kv_cache_config, vllm_config)
                kwargs["block_size"] = block_size
                if "hash_block_size" in params and hash_block_size is not None:
                    kwargs.setdefault("hash_block_size", hash_block_size)
            base.__init__(self, *args, **kwargs)

        patcher.setattr(gen, "Scheduler", _wrappers.subclass(base, self.name,
                                                            {"__init__": __init__}))
