"""Opt-in: hidden states that do not depend on the batch they were computed in.

Why: in bf16 the same sequence gives slightly different hidden states alone and inside a
batch (the kernels' reduction order follows the batch shape: split-K matmuls, attention
splits). Measured on an H100 with vLLM 0.34: cosine >= 0.9999 between the two, both as
close to transformers, yet above the 0.01 absolute threshold of speculators 0.4.0.1's own
``test_batch_vs_individual_consistency``; and a data-parallel run's files differ from a
single run's in the last bits. vLLM has a batch-invariant mode (``VLLM_BATCH_INVARIANT=1``:
its own matmul / softmax / norm overrides, attention without splits, cuBLAS without
split-K) that makes a sequence's result bit-identical whatever else is in the batch.

How: ``SPECULATORS_COMPAT_BATCH_INVARIANT=1`` makes ``activate()`` check that the installed
vLLM has that mode and the platform runs it, then set ``VLLM_BATCH_INVARIANT=1`` through
the patcher (so ``deactivate()`` restores it) before speculators builds its engine; vLLM's
worker processes inherit it and turn the mode on at start. Where the mode is missing the
activation raises, naming the cause: asking for invariance and silently not getting it
would be a wrong result.

Cost: measured by ``benchmarks`` on the GPU (docs/troubleshooting.md has the figures).
"""

from __future__ import annotations

import importlib.util
import os

from . import _env
from ._errors import CompatError
from ._patcher import Patcher

VLLM_FLAG = "VLLM_BATCH_INVARIANT"
#: Where vLLM keeps its batch-invariant mode (``init_batch_invariance``), newest first.
MODULES = ("vllm.model_executor.determinism.batch_invariant",
           "vllm.model_executor.layers.batch_invariant")


def requested() -> bool:
    return _env.flag(os.environ.get(_env.BATCH_INVARIANT))


def _module() -> str | None:
    for name in MODULES:
        try:
            if importlib.util.find_spec(name) is not None:
                return name
        except (ImportError, ValueError):  # a parent package missing
            continue
    return None


def why_not() -> str | None:
    """Why vLLM's batch-invariant mode cannot run here, or None when it can."""
    if _module() is None:
        return (f"this vLLM has no batch-invariant mode (none of {', '.join(MODULES)}); "
                "it came with vLLM 0.11's VLLM_BATCH_INVARIANT")
    try:
        from vllm.platforms import current_platform
    except Exception as exc:  # noqa: BLE001 - vLLM's platform detection failed
        return f"vLLM's platform detection failed ({type(exc).__name__}: {exc})"
    if not (current_platform.is_cuda_alike() or current_platform.is_xpu()):
        return (f"vLLM's batch-invariant kernels run on CUDA, ROCm and XPU GPUs; this "
                f"platform is {getattr(current_platform, 'device_name', None) or 'not a GPU'}")
    return None


def enable(patcher: Patcher) -> str:
    """Turn vLLM's batch-invariant mode on for the engines built from here on; raise
    :class:`CompatError` where it cannot run. Returns what was done (for the log)."""
    reason = why_not()
    if reason is not None:
        raise CompatError(
            f"speculators-compat: {_env.BATCH_INVARIANT}=1 asks for batch-invariant hidden "
            f"states, but {reason}. Unset {_env.BATCH_INVARIANT} to generate with the "
            "default kernels (bf16 batch-composition noise, docs/troubleshooting.md), or run "
            "on a GPU with a vLLM that has VLLM_BATCH_INVARIANT.")
    if os.environ.get(VLLM_FLAG) != "1":
        patcher.setenv(VLLM_FLAG, "1")
    return f"{VLLM_FLAG}=1 ({_module()})"
