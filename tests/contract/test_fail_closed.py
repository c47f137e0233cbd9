"""Data-guarding adapters fail closed on the real generator: when one cannot act,
speculators' generator refuses (naming the adapter and the opt-out), and the refusal
changes only what the adapter declares for it."""

from __future__ import annotations

import pytest
from helpers import checkpoint

from speculators_compat import _env
from speculators_compat._activation import Activation
from speculators_compat._errors import CompatError
from speculators_compat._report import Status

from .support import (
    BY_NAME,
    GEN,
    Base,
    _consumer_owned,
    activated,
    diff,
    snapshot,
)


def _break_probe(name: str, monkeypatch, gen) -> str:
    """Make ``name``'s probe meet an unknown shape or raise; returns the expected status."""
    if name == "result_order_natural":  # speculators' source unreadable (e.g. .pyc only)
        from speculators_compat.adapters import _probes

        real = _probes.source
        monkeypatch.setattr(_probes, "source", lambda obj: "" if obj is gen else real(obj))
        return "mismatch"
    if name == "scheduler_prefill_only":  # a scheduler of an unknown shape
        monkeypatch.setattr(gen, "Scheduler", type("Scheduler", (), {}))
        return "mismatch"

    def check(self, ctx, gen):
        raise RuntimeError(f"{name} probe broke")

    monkeypatch.setattr(type(BY_NAME[name]), "check", check)
    return "failed"

@pytest.mark.parametrize("name", ["hook_capture", "result_order_natural",
                                  "scheduler_prefill_only", "generate_guard"])
def test_data_guards_fail_closed(base: Base, monkeypatch, name: str):
    """Without these adapters the data is silently wrong (reordered, truncated, or from
    the broken upstream forward): when one cannot act, speculators' generator refuses
    (before any engine starts), naming the adapter and the opt-out, unless the user
    disabled it by name."""
    gen = base.gen
    adapter = BY_NAME[name]
    spaces = _consumer_owned(gen)
    before = snapshot(spaces)
    with monkeypatch.context() as m:
        status = _break_probe(name, m, gen)
        with activated(adapter) as report:
            r = report[name]
            assert r.status.value == status, r
            assert "fail closed" in r.reason, r
            for call in (lambda: gen.VllmHiddenStatesGenerator(
                             model_path=checkpoint("llama"), layer_ids=[10**6]),
                         lambda: object.__new__(gen.VllmHiddenStatesGenerator).generate([[1]])):
                with pytest.raises(CompatError) as exc:
                    call()
                msg = str(exc.value)
                assert f"adapter {name} could not be applied ({status}" in msg, msg
                assert f"{_env.DISABLE}={name}" in msg, msg
        assert diff(before, snapshot(spaces)) <= {f"{GEN}.Scheduler"}
        act = Activation(lambda: [adapter])
        act.activate(process="driver")
        try:  # the refusal changes only what the adapter declares for it
            assert set(act.touched[name]) == set(adapter.refusal_targets), act.touched
        finally:
            act.deactivate()
        m.setenv(_env.DISABLE, name)
        with activated(adapter) as report:
            assert report[name].status is Status.DISABLED
            with pytest.raises(ValueError, match="out of bounds"):  # speculators' own check
                gen.VllmHiddenStatesGenerator(model_path=checkpoint("llama"), layer_ids=[10**6])
    assert diff(before, snapshot(spaces)) == set()
