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
Applies when: the platform is CPU and the CPU attention backend's source declares
kernel block sizes that exclude 16, or declares them in a form the probe cannot read
(0.29+ nightlies and 0.32: ``MultipleOf(32)``). Not needed where it declares none
(0.11-0.20) or multiples of 16 (0.24, 0.28). The backend's own answer is checked again
at call time.
Remove when: speculators 0.3/0.4 support is dropped.
"""

from __future__ import annotations

import re
from types import ModuleType

from .._adapter import Context, Verdict
from .._patcher import Patcher
from .._report import Kind
from . import _probes, _targets
from ._base import GeneratorAdapter

SPECULATORS_BLOCK_SIZE = 16
CPU_ATTENTION_MODULE = "vllm.v1.attention.backends.cpu_attn"


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


def declared_in_source(text: str | None) -> list[int] | None:
    """The ``MultipleOf(n)`` bases the CPU attention module declares as kernel block
    sizes, read from its source without importing it (``[]``: it declares none, so the
    backend inherits "any size"; ``None``: declared in a form this probe cannot read)."""
    if text is None:
        return None
    if "def get_supported_kernel_block_sizes" not in text:
        return []
    after = text.split("def get_supported_kernel_block_sizes", 1)[1]
    body = re.split(r"\n    \S", after, maxsplit=1)[0]
    bases = [int(b) for b in re.findall(r"MultipleOf\((\d+)\)", body)]
    returned = body.split("return", 1)[-1]
    plain_ints = re.search(r"\d", re.sub(r"MultipleOf\(\d+\)", "", returned))
    if not bases or plain_ints:
        return None
    return bases


class CPUBlockSize(GeneratorAdapter):
    name = "cpu_block_size"
    kind = Kind.PLATFORM
    summary = "let the CPU platform choose the KV block size instead of speculators' 16"
    upstream = ("vLLM CPU attention (0.29+): kernel block sizes MultipleOf(32); "
                "vllm/v1/attention/backends/cpu_attn.py")
    vllm_range = None
    remove_when = "speculators 0.3/0.4 support is dropped"
    targets = _targets.in_generator("CacheConfig")

    def check(self, ctx: Context, gen: ModuleType) -> Verdict:
        if not _probes.is_cpu_platform():
            return Verdict.not_needed("not the CPU platform")
        bases = declared_in_source(_probes.module_source(CPU_ATTENTION_MODULE))
        if bases == []:
            return Verdict.not_needed("CPU attention declares no kernel block sizes of its "
                                      "own: speculators' 16 is accepted")
        if bases and any(SPECULATORS_BLOCK_SIZE % b == 0 for b in bases):  # as _accepts
            return Verdict.not_needed(f"CPU attention accepts multiples of {bases}: "
                                      "speculators' 16 is accepted")
        declared = (f"CPU attention accepts multiples of {bases} only"
                    if bases else "CPU attention declares kernel block sizes")
        return Verdict.needed(f"{declared}: speculators' block size 16 is dropped when "
                              "CacheConfig is built if the backend does not accept it")

    def patch(self, patcher: Patcher, ctx: Context, gen: ModuleType) -> None:
        def wrapper(wrapped, instance, args, kwargs):
            if kwargs.get("block_size") == SPECULATORS_BLOCK_SIZE and not cpu_accepts_16():
                kwargs.pop("block_size")
            return wrapped(*args, **kwargs)

        patcher.wrap(gen, "CacheConfig", wrapper)
