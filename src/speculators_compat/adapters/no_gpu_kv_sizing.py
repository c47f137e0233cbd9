"""KV-cache sizing and device queries without a GPU (vLLM's CPU builds; laptops; CI).

Why: speculators sizes the KV cache in the driver from free accelerator memory:
0.3.0 calls ``torch.cuda.mem_get_info()`` (``RuntimeError: Found no NVIDIA driver``),
0.4 calls its own ``mem_get_info()``, which yields ``(0, 0)`` and then zero blocks
(``assert num_gpu_blocks > 0``) — or raises the same "no NVIDIA driver" error where the
installed torch is a CUDA build. vLLM's CPU platform budgets the KV cache itself
(``VLLM_CPU_KVCACHE_SPACE`` / ``kv_cache_memory_bytes``). speculators 0.4's offline
script also records the device: ``config_generator`` calls ``get_device_name(0)``, which
on a CUDA build of torch without a GPU (PyPI's torch, vLLM <= 0.19 CPU envs) asks
``torch.cuda.get_device_name`` and raises the same "no NVIDIA driver" error after every
sample was generated (0.3.0 checks ``torch.cuda.is_available()`` first).
How: in speculators' module only, ``torch`` (0.3.0) becomes a proxy whose
``cuda.mem_get_info`` answers ``(0, 0)`` when CUDA is unavailable, ``mem_get_info`` (0.4)
likewise; and ``get_kv_cache_config_from_groups`` gets the CPU platform's KV budget as
``available_memory`` instead of speculators' GPU-derived number: ``VLLM_CPU_KVCACHE_SPACE``
(GiB) or the config's KV bytes when set, else 4 GiB capped at a quarter of free memory.
In ``speculators.data_generation.config_generator`` only (0.4), ``get_device_name``
answers ``"NO ACCELERATOR"`` (speculators' own answer when torch has no accelerator,
recorded as ``"CPU ONLY"``) while CUDA is unavailable. torch itself is not touched.
Applies when: CUDA is not available in the driver.
Remove when: speculators < 0.5 support is dropped.
"""

from __future__ import annotations

import importlib
import os
from types import ModuleType

import wrapt

from .._adapter import Context, Verdict
from .._patcher import Patcher
from .._report import Kind
from . import _probes, _targets, _wrappers
from ._base import GeneratorAdapter

GiB = 1 << 30
DEFAULT_CPU_KV_GIB = 4


def cpu_kv_budget(vllm_config) -> int:
    """The KV-cache bytes vLLM's CPU platform would use for this config."""
    cc = vllm_config.cache_config
    for attr in ("kv_cache_memory_bytes", "cpu_kvcache_space_bytes"):
        value = getattr(cc, attr, None)
        if value:
            return int(value)
    env = os.environ.get("VLLM_CPU_KVCACHE_SPACE")
    if env:
        return int(float(env) * GiB)
    budget = DEFAULT_CPU_KV_GIB * GiB
    try:  # never more than a quarter of what is free now (psutil ships with vLLM)
        import psutil

        budget = min(budget, psutil.virtual_memory().available // 4)
    except ImportError:
        pass
    return budget


def _no_gpu_mem_get_info(*args, **kwargs):
    return (0, 0)


#: What speculators' ``get_device_name`` returns when torch has no accelerator.
NO_ACCELERATOR = "NO ACCELERATOR"
CONFIG_MODULE = _targets.CONFIG_MODULE


def _device_name_without_device(wrapped, instance, args, kwargs):
    import torch

    if torch.cuda.is_available():
        return wrapped(*args, **kwargs)
    return NO_ACCELERATOR


def _config_module() -> ModuleType | None:
    try:
        return importlib.import_module(CONFIG_MODULE)
    except ModuleNotFoundError:
        return None


class _CudaWithoutDevice(wrapt.ObjectProxy):
    def mem_get_info(self, *args, **kwargs):
        if self.__wrapped__.is_available():
            return self.__wrapped__.mem_get_info(*args, **kwargs)
        return (0, 0)


class _TorchWithoutDevice(wrapt.ObjectProxy):
    """``torch`` as seen by speculators' module: only ``cuda.mem_get_info`` differs."""

    @property
    def cuda(self):
        return _CudaWithoutDevice(self.__wrapped__.cuda)


class NoGpuKVSizing(GeneratorAdapter):
    name = "no_gpu_kv_sizing"
    kind = Kind.PLATFORM
    summary = "size the KV cache from the CPU platform's budget when there is no GPU"
    upstream = ("speculators 0.3.0 torch.cuda.mem_get_info() / 0.4 mem_get_info() assume an "
                "accelerator; vLLM CPU builds budget KV via VLLM_CPU_KVCACHE_SPACE")
    vllm_range = None
    remove_when = "speculators < 0.5 support is dropped"
    targets = (*_targets.in_generator("mem_get_info", "torch",
                                           "get_kv_cache_config_from_groups"),
               f"{CONFIG_MODULE}:get_device_name")

    def check(self, ctx: Context, gen: ModuleType) -> Verdict:
        if _probes.has_cuda():
            return Verdict.not_needed("CUDA is available: speculators' own sizing works")
        if not _probes.is_cpu_platform():
            return Verdict.not_needed("no CUDA, but the platform is not CPU; leaving sizing as is")
        return Verdict.needed("no CUDA device: KV cache sized from the CPU platform's budget")

    def patch(self, patcher: Patcher, ctx: Context, gen: ModuleType) -> None:
        if hasattr(gen, "mem_get_info"):
            patcher.setattr(gen, "mem_get_info", _no_gpu_mem_get_info)
        if "torch.cuda.mem_get_info" in _probes.source(gen):
            patcher.setattr(gen, "torch", _TorchWithoutDevice(gen.torch))

        def wrapper(wrapped, instance, args, kwargs):
            vllm_config = _wrappers.argument(args, kwargs, "vllm_config", 0)
            if "available_memory" in kwargs:
                kwargs["available_memory"] = cpu_kv_budget(vllm_config)
            return wrapped(*args, **kwargs)

        patcher.wrap(gen, "get_kv_cache_config_from_groups", wrapper)
        config = _config_module()
        if config is not None and callable(getattr(config, "get_device_name", None)):
            patcher.wrap(config, "get_device_name", _device_name_without_device)
