"""From vLLM 0.18 the attention backends choose the KV block size unless the user fixed it.

Why: speculators 0.3/0.4 build ``CacheConfig(block_size=16)`` (16 was vLLM's GPU default
when they were written). vLLM 0.18 added ``CacheConfig.user_specified_block_size``: a
block size passed explicitly is a user's choice that every attention backend must accept,
while an unset one lets the workers pick, after the model is built, the size every backend
of the model accepts (``Platform.update_block_size_for_backend``; 16 where it is accepted).
The sparse MLA backends of DeepSeek-V3.2 / GLM-5 (``FLASH_ATTN_MLA_SPARSE``, ``FLASHMLA_SPARSE``:
multiples of 64) reject 16, so speculators' fixed size fails while the model loads:
``No valid attention backend found ... block_size=16 ... use_sparse=True``.
How: the rebound ``CacheConfig`` in speculators' module drops ``block_size=16``, so the
config takes vLLM's default size (also 16) without marking it the user's: backends that
accept 16 (FLASH_ATTN, FLASH_ATTN_MLA on Hopper, the CPU backends that did before) keep
it; the others get their own. The KV cache config and the scheduler then follow the
workers' sizes (``kv_cache_config_fields``, ``scheduler_block_size``). The block size
changes memory layout only, never attention results.
Applies when: ``CacheConfig`` has the ``user_specified_block_size`` field.
Remove when: speculators 0.3/0.4 support is dropped.
"""

from __future__ import annotations

import dataclasses
from types import ModuleType

from .._adapter import Context, Verdict
from .._patcher import Patcher
from . import _targets
from ._base import GeneratorAdapter

SPECULATORS_BLOCK_SIZE = 16
FIELD = "user_specified_block_size"


def _has_field(cls: type) -> bool:
    try:
        return FIELD in {f.name for f in dataclasses.fields(cls)}
    except TypeError:  # not a dataclass: read the annotations
        return any(FIELD in getattr(k, "__annotations__", {}) for k in cls.__mro__)


class AttentionBlockSize(GeneratorAdapter):
    name = "attention_block_size"
    summary = "let vLLM's attention backends choose the KV block size (not a fixed 16)"
    upstream = ("vLLM 0.18.0: CacheConfig.user_specified_block_size; unset sizes are "
                "chosen per backend (Platform.update_block_size_for_backend)")
    vllm_range = ">=0.18.0.dev0"
    remove_when = "speculators 0.3/0.4 support is dropped"
    targets = _targets.in_generator("CacheConfig")

    def check(self, ctx: Context, gen: ModuleType) -> Verdict:
        if not _has_field(gen.CacheConfig):
            return Verdict.not_needed("CacheConfig has no user_specified_block_size: a "
                                      "block size is not a per-backend choice here")
        return Verdict.needed("speculators' block_size=16 would bind every attention "
                              "backend to 16; dropped so that each backend chooses")

    def patch(self, patcher: Patcher, ctx: Context, gen: ModuleType) -> None:
        def wrapper(wrapped, instance, args, kwargs):
            if kwargs.get("block_size") == SPECULATORS_BLOCK_SIZE:
                kwargs.pop("block_size")
            return wrapped(*args, **kwargs)

        patcher.wrap(gen, "CacheConfig", wrapper)
