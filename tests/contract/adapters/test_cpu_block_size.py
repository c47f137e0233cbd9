"""Contract of the ``cpu_block_size`` adapter,
on the installed vLLM and speculators.

Speculators' legacy call shape fails (or is wrong) bare where the upstream note says
so and works through the adapter. The checks every adapter shares (the probe agrees with
the expectation table, apply/revert restores identity and changes only the declared
targets) run for every adapter in tests/contract/test_every_adapter.py.
"""

from __future__ import annotations

from ..expectations import applied_if
from ..support import (
    BY_NAME,
    build_vllm_config,
    one,
)

NAME = "cpu_block_size"


def cpu_block_size_expected(e):
    # The probe reads the CPU attention module's source (importing the backend at
    # activate() would cost ~1 s); here the imported backend answers instead:
    #  0.11-0.20: no declared kernel block sizes (any size, 16 kept);
    #  0.24/0.28: [MultipleOf(16)] (16 kept); 0.29+ nightlies, 0.32: [MultipleOf(32)].
    from speculators_compat.adapters.cpu_block_size import cpu_accepts_16

    return applied_if(e.cpu_platform and not cpu_accepts_16())


#: Its expected status on the installed release, and why (read by ``expectations.py``).
EXPECTED = (
    cpu_block_size_expected,
    "CPU attention kernels accept MultipleOf(32) only (0.29+); 16 worked before")


def test_legacy_call_shape(base, vllm_config):
    legacy_call_shape(base, base.gen, vllm_config, BY_NAME[NAME])


def legacy_call_shape(base, gen, cfg, adapter):
    from speculators_compat.adapters.cpu_block_size import cpu_accepts_16

    try:
        from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend
    except ImportError:  # 0.11: TorchSDPABackend, no kernel block sizes declared
        CPUAttentionBackend = None
    call = dict(block_size=16, gpu_memory_utilization=0.8, enable_prefix_caching=False)
    plain = build_vllm_config(cache_config=gen.CacheConfig(**call))
    assert plain.cache_config.block_size == 16  # speculators' 16 is kept by the platform
    accepts_16 = cpu_accepts_16()
    if CPUAttentionBackend is not None:
        assert accepts_16 == CPUAttentionBackend.supports_block_size(16)
    with one(base, adapter) as applied:
        # the probe reads the backend's source; the backend is asked again at call time
        assert applied == (not accepts_16)
        shimmed = build_vllm_config(cache_config=gen.CacheConfig(**call))
        final = shimmed.cache_config.block_size
        if not accepts_16:
            # The hard-coded 16 is dropped: the platform picks a size its attention
            # backend accepts (0.32: 128).
            assert getattr(shimmed.cache_config, "user_specified_block_size", False) is False
            assert final != 16
        else:
            assert final == 16
        if CPUAttentionBackend is not None:
            assert CPUAttentionBackend.supports_block_size(final), final
