"""Contract of the ``executor_warmup_split`` adapter,
on the installed vLLM and speculators.

Speculators' legacy call shape fails (or is wrong) bare where the upstream note says
so and works through the adapter. The checks every adapter shares (the probe agrees with
the expectation table, apply/revert restores identity and changes only the declared
targets) run for every adapter in tests/contract/test_every_adapter.py.
"""

from __future__ import annotations

import inspect

from ..expectations import V, applied_if
from ..support import (
    BY_NAME,
    _check_executor_shim,
    one,
)

NAME = "executor_warmup_split"

#: Its expected status on the installed release, and why (read by ``expectations.py``).
EXPECTED = (
    lambda e: applied_if(e.vllm >= V("0.27.0.dev0")),
    "initialize_from_config no longer warms up from 0.27")


def test_legacy_call_shape(base, vllm_config):
    legacy_call_shape(base, base.gen, vllm_config, BY_NAME[NAME])


def legacy_call_shape(base, gen, cfg, adapter):
    from vllm.v1.engine.core import EngineCore
    from vllm.v1.executor.multiproc_executor import MultiprocExecutor

    split = base.env.vllm >= V("0.27.0.dev0")
    init_src = inspect.getsource(MultiprocExecutor.initialize_from_config)
    engine_src = inspect.getsource(EngineCore._initialize_kv_caches)
    if split:
        assert hasattr(MultiprocExecutor, "compile_or_warm_up_model")
        assert "compile_or_warm_up_model" not in init_src
        # the engine core warms up separately, after initialize_from_config
        assert (engine_src.index("initialize_from_config(")
                < engine_src.index("compile_or_warm_up_model("))
    else:
        assert "compile_or_warm_up_model" in init_src
    assert "compile_or_warm_up_model" not in inspect.getsource(gen)
    with one(base, adapter) as applied:
        assert applied == split
        _check_executor_shim(gen, MultiprocExecutor, applied, NAME,
                             {"initialize_from_config"})
