"""Contract of the ``cpu_block_size`` adapter,
on the installed vLLM and speculators.

The probe agrees with the expectation table, apply/revert restores identity and
changes only the declared targets, and speculators' legacy call shape fails (or is
wrong) bare where the upstream note says so and works through the adapter.
"""

from __future__ import annotations

from ..support import (
    BY_NAME,
    build_vllm_config,
    check_apply_then_revert,
    check_probe_agrees_with_release,
    one,
)

NAME = "cpu_block_size"


def test_probe_agrees_with_release(base):
    check_probe_agrees_with_release(base, NAME)


def test_apply_then_revert_restores_identity(base):
    check_apply_then_revert(base, NAME)


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
