"""Contract of the ``no_gpu_kv_sizing`` adapter,
on the installed vLLM and speculators.

Speculators' legacy call shape fails (or is wrong) bare where the upstream note says
so and works through the adapter. The checks every adapter shares (the probe agrees with
the expectation table, apply/revert restores identity and changes only the declared
targets) run for every adapter in tests/contract/test_every_adapter.py.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys

import pytest

from ..expectations import applied_if
from ..support import (
    BY_NAME,
    CONFIG_GEN,
    KV_UTILS,
    kv_call,
    kv_groups,
    one,
    resolved_config,
)

NAME = "no_gpu_kv_sizing"

#: Its expected status on the installed release, and why (read by ``expectations.py``).
EXPECTED = (
    lambda e: applied_if(not e.cuda and e.cpu_platform),
    "speculators sizes the KV cache from CUDA free memory; no CUDA here")


def test_legacy_call_shape(base, vllm_config):
    legacy_call_shape(base, base.gen, vllm_config, BY_NAME[NAME])


def legacy_call_shape(base, gen, cfg, adapter):
    import torch

    from speculators_compat.adapters.no_gpu_kv_sizing import cpu_kv_budget

    real_mem_get_info = torch.cuda.mem_get_info
    rcfg = resolved_config()
    groups = kv_groups(rcfg)
    utils = importlib.import_module(KV_UTILS)
    if base.env.speculators_03:
        # 0.3.0: free_memory, _ = torch.cuda.mem_get_info() -> no NVIDIA driver
        with pytest.raises((RuntimeError, AssertionError)):
            gen.torch.cuda.mem_get_info()
    elif torch.accelerator.current_accelerator() is None:
        assert gen.mem_get_info() == (0, 0)  # 0.4's own helper, CPU-only torch
    else:
        # 0.4's own helper on a CUDA build of torch without a driver (vllm 0.16 env):
        # it asks torch.cuda and fails, not (0, 0) as one might assume.
        with pytest.raises((RuntimeError, AssertionError)):
            gen.mem_get_info()
    # ...and with 0 free bytes the KV cache gets 0 blocks (then `num_gpu_blocks > 0`).
    call = dict(vllm_config=rcfg, kv_cache_groups=groups, available_memory=int(0 * 0.8 * 0.2))
    assert kv_call(gen.get_kv_cache_config_from_groups, **call).num_blocks == 0
    with one(base, adapter) as applied:
        assert applied
        if base.env.speculators_03:
            assert gen.torch.cuda.mem_get_info() == (0, 0)
            assert gen.torch.cuda.is_available() is torch.cuda.is_available()
            assert gen.torch.float32 is torch.float32 and gen.torch.tensor is torch.tensor
        else:
            assert gen.mem_get_info() == (0, 0)
        sized = kv_call(gen.get_kv_cache_config_from_groups, **call)
        direct = kv_call(utils.get_kv_cache_config_from_groups, vllm_config=rcfg,
                         kv_cache_groups=groups, available_memory=cpu_kv_budget(rcfg))
        assert sized.num_blocks == direct.num_blocks > 0
        # only speculators' module sees the proxy
        assert sys.modules["torch"] is torch and torch.cuda.mem_get_info is real_mem_get_info
    assert gen.torch is torch
    # 0.4's offline-script metadata: config_generator's get_device_name(0) asks a CUDA build
    # of torch for a GPU that is not there (0.3.0 checks torch.cuda.is_available() first).
    config = importlib.import_module(CONFIG_GEN)
    if not hasattr(config, "get_device_name"):
        assert config._get_gpu_info() == "CPU only"
        return
    real_get_device_name = config.get_device_name
    if torch.accelerator.current_accelerator() is None:
        assert config._get_gpu_info() == "CPU ONLY"  # CPU-only torch: upstream's own answer
    else:
        with pytest.raises((RuntimeError, AssertionError)):
            config._get_gpu_info()
    with one(base, adapter) as applied:
        assert applied
        assert config._get_gpu_info() == "CPU ONLY"
    assert config.get_device_name is real_get_device_name
