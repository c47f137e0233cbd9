"""The KV-cache block sizes vLLM's engine core computes, which speculators' generator,
bypassing the engine core, does not.

Several adapters give speculators' objects the values vLLM's ``EngineCore`` would
have computed; the block-size arithmetic they share lives here (not in one of them).
"""

from __future__ import annotations

import importlib

UTILS = "vllm.v1.core.kv_cache_utils"


def block_sizes(kv_cache_config, vllm_config) -> tuple[int, int | None]:
    """(scheduler block size, hash block size) as this release's engine core computes them."""
    utils = importlib.import_module(UTILS)
    resolve = getattr(utils, "resolve_kv_cache_block_sizes", None)
    if resolve is not None and kv_cache_config.kv_cache_groups:
        return resolve(kv_cache_config, vllm_config)
    pc = vllm_config.parallel_config
    size = (vllm_config.cache_config.block_size
            * getattr(pc, "decode_context_parallel_size", 1)
            * getattr(pc, "prefill_context_parallel_size", 1))
    return size, None
