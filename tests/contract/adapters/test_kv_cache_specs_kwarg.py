"""Contract of the ``kv_cache_specs_kwarg`` adapter,
on the installed vLLM and speculators.

Speculators' legacy call shape fails (or is wrong) bare where the upstream note says
so and works through the adapter. The checks every adapter shares (the probe agrees with
the expectation table, apply/revert restores identity and changes only the declared
targets) run for every adapter in tests/contract/test_every_adapter.py.
"""

from __future__ import annotations

import inspect

import pytest

from ..expectations import V, applied_if
from ..support import (
    BY_NAME,
    one,
    require_platform,
)

NAME = "kv_cache_specs_kwarg"

#: Its expected status on the installed release, and why (read by ``expectations.py``).
EXPECTED = (
    lambda e: applied_if(e.vllm >= V("0.12.0.dev0") and e.speculators_03),
    "get_kv_cache_config_from_groups lost kv_cache_specs= in 0.12 (0.4 does not pass it)")


def test_legacy_call_shape(base, vllm_config):
    legacy_call_shape(base, base.gen, vllm_config, BY_NAME[NAME])


def legacy_call_shape(base, gen, cfg, adapter):
    if cfg is None:
        require_platform()
    call = dict(vllm_config=cfg, kv_cache_groups=[], kv_cache_specs={}, available_memory=0)
    needed = base.env.vllm >= V("0.12.0.dev0")
    if needed:
        with pytest.raises(TypeError, match="unexpected keyword argument 'kv_cache_specs'"):
            gen.get_kv_cache_config_from_groups(**call)
    passes = "kv_cache_specs=" in inspect.getsource(gen)
    assert passes == base.env.speculators_03
    with one(base, adapter) as applied:
        if passes or not needed:
            kvc = gen.get_kv_cache_config_from_groups(**call)
        else:  # 0.4.x's own call, without kv_cache_specs
            kvc = gen.get_kv_cache_config_from_groups(
                **{k: v for k, v in call.items() if k != "kv_cache_specs"})
        assert kvc.num_blocks == 1 and kvc.kv_cache_groups == []  # attention-free result
    assert applied == (needed and passes)
