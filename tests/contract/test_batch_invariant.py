"""The batch-invariant opt-in on the real vLLM (``_batch_invariant``).

On the CPU builds CI runs, vLLM's batch-invariant mode exists as a module but has no
CPU kernels (vLLM 0.11.0 has no such mode at all, which is refused too):
``SPECULATORS_COMPAT_BATCH_INVARIANT=1`` must make ``activate()`` raise, naming the
platform and what to do, with nothing left patched; without the option the activation
leaves ``VLLM_BATCH_INVARIANT`` alone; where the option is honoured, ``deactivate()``
restores the variable. (The GPU run that shows speculators' own batch-vs-individual test
passing with it: docs/troubleshooting.md.)
"""

from __future__ import annotations

import os

import pytest
from packaging.version import Version

from speculators_compat import _batch_invariant, _env
from speculators_compat._activation import Activation
from speculators_compat._errors import CompatError
from speculators_compat.adapters import ADAPTERS

from .support import Base, _env_facts


def test_vllm_has_a_batch_invariant_mode_and_the_cpu_build_is_refused():
    reason = _batch_invariant.why_not()
    if _env_facts().vllm < Version("0.11.1"):
        # vLLM 0.11.0 (speculators 0.3.0's pin) had no such mode yet: refused for that
        assert _batch_invariant._module() is None
        assert reason is not None and "has no batch-invariant mode" in reason, reason
        return
    assert _batch_invariant._module() is not None
    assert reason is not None and "CUDA, ROCm and XPU" in reason, reason


def test_the_option_is_refused_before_anything_stays_patched(base: Base, monkeypatch):
    monkeypatch.delenv(_batch_invariant.VLLM_FLAG, raising=False)
    with base.suspended(), monkeypatch.context() as m:
        m.setenv(_env.BATCH_INVARIANT, "1")
        act = Activation(lambda: list(ADAPTERS))
        with pytest.raises(CompatError, match=f"{_env.BATCH_INVARIANT}=1 asks for "
                                              "batch-invariant hidden states, but .*Unset"):
            act.activate(process="driver")
        assert not act.active
        assert _env.ACTIVE not in os.environ
        assert _batch_invariant.VLLM_FLAG not in os.environ


def test_without_the_option_vllm_flag_is_untouched(base: Base, monkeypatch):
    monkeypatch.delenv(_env.BATCH_INVARIANT, raising=False)
    monkeypatch.delenv(_batch_invariant.VLLM_FLAG, raising=False)
    with base.suspended():
        act = Activation(lambda: list(ADAPTERS))
        try:
            act.activate(process="driver")
            assert _batch_invariant.VLLM_FLAG not in os.environ
        finally:
            act.deactivate()


def test_where_honoured_deactivate_restores_the_flag(base: Base, monkeypatch):
    monkeypatch.delenv(_batch_invariant.VLLM_FLAG, raising=False)
    with base.suspended(), monkeypatch.context() as m:
        m.setenv(_env.BATCH_INVARIANT, "1")
        m.setattr(_batch_invariant, "why_not", lambda: None)  # as on a GPU
        act = Activation(lambda: list(ADAPTERS))
        try:
            act.activate(process="driver")
            assert os.environ[_batch_invariant.VLLM_FLAG] == "1"
        finally:
            act.deactivate()
        assert _batch_invariant.VLLM_FLAG not in os.environ
