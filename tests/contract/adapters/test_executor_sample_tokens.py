"""Contract of the ``executor_sample_tokens`` adapter,
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

NAME = "executor_sample_tokens"

#: Its expected status on the installed release, and why (read by ``expectations.py``).
EXPECTED = (
    lambda e: applied_if(e.vllm >= V("0.11.1.dev0") and e.speculators_03),
    "execute_model/sample_tokens two-phase split in 0.11.1 (0.4 calls sample_tokens)")


def test_legacy_call_shape(base, vllm_config):
    legacy_call_shape(base, base.gen, vllm_config, BY_NAME[NAME])


def legacy_call_shape(base, gen, cfg, adapter):
    from vllm.v1.executor.multiproc_executor import MultiprocExecutor

    if base.env.vllm < V("0.11.1.dev0"):
        # 0.11.0: one-phase execute_model, as speculators was written for.
        assert not hasattr(MultiprocExecutor, "sample_tokens")
        with one(base, adapter) as applied:
            _check_executor_shim(gen, MultiprocExecutor, applied, NAME, set())
        assert not applied
        return
    # Upstream shape this adapter was written for (0.11.1+): two phases.
    assert list(inspect.signature(MultiprocExecutor.execute_model).parameters)[:2] == [
        "self", "scheduler_output"]
    assert list(inspect.signature(MultiprocExecutor.sample_tokens).parameters)[:2] == [
        "self", "grammar_output"]
    src = inspect.getsource(gen)
    # 0.3.0 never completes a step; 0.4 calls sample_tokens itself.
    assert ("sample_tokens(" in src) == base.env.speculators_04
    with one(base, adapter) as applied:
        _check_executor_shim(gen, MultiprocExecutor, applied, NAME,
                             {"execute_model", "sample_tokens"})
