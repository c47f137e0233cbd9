"""speculators hard-codes KV block size 16; vLLM's CPU attention wants other sizes.

Why: speculators sets ``CacheConfig(block_size=16)`` (tuned for GPU). vLLM's CPU
attention backend accepts only multiples of 32 (0.32: ``No common block size for 16
(CPU_ATTN: [MultipleOf(32)])``), while the CPU MLA backend wants exactly 16: only the
platform knows. The block size changes memory layout, never attention results.
How: on the CPU platform, the rebound ``CacheConfig`` in speculators' module drops the
hard-coded ``block_size`` when the CPU attention backend does not accept 16, so the
platform picks its own; the ``scheduler_block_size`` adapter then gives the scheduler the
size the KV cache really uses. The backend is asked when speculators builds its
``CacheConfig``, not at ``activate()``: importing the attention backend costs about a
second, which ``activate()`` must not.
Applies when: the platform is CPU (the backend's answer is checked at call time).
Remove when: speculators 0.3/0.4 support is dropped.
"""

from __future__ import annotations

from types import ModuleType

from .._core import Context, Patcher, Verdict
from . import _targets
from ._base import GeneratorAdapter

SPECULATORS_BLOCK_SIZE = 16


def _accepts(sizes, size: int) -> bool:
    for s in sizes:
        if isinstance(s, int):
            if s == size:
                return True
        else:
            base = getattr(s, "base", None)
            if isinstance(base, int) and base > 0 and size % base == 0:
                return True
    return False


def _describe(sizes) -> str:
    out = []
    for s in sizes:
        base = getattr(s, "base", None)
        out.append(str(s) if isinstance(s, int) else f"multiple of {base}" if base else repr(s))
    return "[" + ", ".join(out) + "]"


def cpu_attention_block_sizes():
    """Kernel block sizes of the CPU attention backend, or ``None`` if not declared."""
    try:
        from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend
    except ImportError:
        return None
    getter = getattr(CPUAttentionBackend, "get_supported_kernel_block_sizes", None)
    return None if getter is None else list(getter())


def cpu_accepts_16() -> bool:
    """Whether the CPU attention backend accepts speculators' block size 16."""
    sizes = cpu_attention_block_sizes()
    return sizes is None or _accepts(sizes, SPECULATORS_BLOCK_SIZE)


class CPUBlockSize(GeneratorAdapter):
    name = "cpu_block_size"
    summary = "let the CPU platform choose the KV block size instead of speculators' 16"
    upstream = ("vLLM CPU attention (0.2x): kernel block sizes MultipleOf(32); "
                "vllm/v1/attention/backends/cpu_attn.py")
    vllm_range = None
    remove_when = "speculators 0.3/0.4 support is dropped"

    def check(self, ctx: Context, gen: ModuleType) -> Verdict:
        if not _targets.is_cpu_platform():
            return Verdict.not_needed("not the CPU platform")
        return Verdict.needed("CPU platform: speculators' block size 16 is dropped when "
                              "CacheConfig is built if CPU attention does not accept it")

    def patch(self, patcher: Patcher, ctx: Context, gen: ModuleType) -> None:
        def wrapper(wrapped, instance, args, kwargs):
            if kwargs.get("block_size") == SPECULATORS_BLOCK_SIZE and not cpu_accepts_16():
                kwargs.pop("block_size")
            return wrapped(*args, **kwargs)

        patcher.wrap(gen, "CacheConfig", wrapper)
