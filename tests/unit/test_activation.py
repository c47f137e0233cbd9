"""Activation: idempotence, thread safety, rollback, statuses, strict mode, selection,
phases and logging, with toy adapters only."""

from __future__ import annotations

import logging
import os
import threading
import time
import types

import pytest

from speculators_compat import _env
from speculators_compat._activation import Activation
from speculators_compat._adapter import Phase, Verdict
from speculators_compat._errors import CompatError
from speculators_compat._report import Kind, Report, Status

LOGGER = "speculators_compat"


@pytest.fixture
def mod():
    m = types.ModuleType("toy_target")
    m.one = "one-original"
    m.two = "two-original"
    m.three = "three-original"
    return m


def setter(mod, name, value):
    def change(p, ctx):
        p.setattr(mod, name, value)

    return change


# --------------------------------------------------------------------------- idempotence


def test_second_activate_returns_same_report_and_applies_once(make_activation, toy, mod):
    a = toy("a", change=setter(mod, "one", "patched"))
    act = make_activation(a)
    first = act.activate()
    second = act.activate()
    assert second is first
    assert a.apply_calls == 1 and a.probe_calls == 1
    assert act.active and first.active
    assert mod.one == "patched"


def test_second_activate_ignores_new_arguments(make_activation, toy):
    a = toy("a")
    act = make_activation(a)
    first = act.activate()
    assert act.activate(only=[], strict=True, process="worker") is first
    assert a.apply_calls == 1


def test_concurrent_activation_applies_exactly_once(make_activation, toy, mod):
    def slow_change(p, ctx):
        time.sleep(0.05)  # widen the window for a race
        p.setattr(mod, "one", "patched")

    a = toy("a", change=slow_change)
    act = make_activation(a)
    n = 8
    barrier = threading.Barrier(n)
    reports: list[Report] = []
    errors: list[BaseException] = []

    def run():
        try:
            barrier.wait()
            reports.append(act.activate())
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=run) for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert not errors
    assert len(reports) == n
    assert a.apply_calls == 1
    assert a.probe_calls == 1
    assert all(r is reports[0] for r in reports)
    assert mod.one == "patched"
    act.deactivate()
    assert mod.one == "one-original"


def test_activate_sets_active_env_and_deactivate_removes_it(make_activation, toy):
    act = make_activation(toy("a"))
    assert _env.ACTIVE not in os.environ
    act.activate()
    assert os.environ[_env.ACTIVE] == "1"
    act.deactivate()
    assert _env.ACTIVE not in os.environ
    assert act.report is None and not act.active


def test_deactivate_keeps_inherited_active_flag(make_activation, toy, monkeypatch):
    """In a spawned process the flag was inherited: deactivate restores it, not deletes."""
    monkeypatch.setenv(_env.ACTIVE, "1")
    act = make_activation(toy("a"))
    act.activate(process="worker")
    act.deactivate()
    assert os.environ[_env.ACTIVE] == "1"


def test_deactivate_when_never_activated_is_harmless(make_activation, toy):
    act = make_activation(toy("a"))
    act.deactivate()
    act.deactivate()
    assert act.report is None


def test_reactivate_after_deactivate_applies_again(make_activation, toy, mod):
    a = toy("a", change=setter(mod, "one", "patched"))
    act = make_activation(a)
    r1 = act.activate()
    act.deactivate()
    assert mod.one == "one-original"
    assert r1.active is False
    r2 = act.activate()
    assert r2 is not r1 and r2.active
    assert a.apply_calls == 2
    assert mod.one == "patched"


def test_adapters_callable_is_not_called_before_activate(toy):
    calls = []

    def registry():
        calls.append(1)
        return [toy("a")]

    act = Activation(registry)
    assert calls == [] and act.report is None and not act.active
    act.activate()
    try:
        assert calls == [1]
    finally:
        act.deactivate()


# --------------------------------------------------------------------------- rollback


def test_half_applied_adapter_is_rolled_back_others_stay(make_activation, toy, mod):
    def half(p, ctx):
        p.setattr(mod, "two", "half-1")
        p.setattr(mod, "new_attr", "half-2")
        raise ValueError("boom in apply")

    good_before = toy("good_before", change=setter(mod, "one", "patched-1"))
    bad = toy("bad", change=half)
    good_after = toy("good_after", change=setter(mod, "three", "patched-3"))
    act = make_activation(good_before, bad, good_after)
    rep = act.activate()

    assert rep["bad"].status is Status.FAILED
    assert "boom in apply" in rep["bad"].reason
    assert "ValueError" in rep["bad"].reason
    assert rep["bad"].changes == []
    assert mod.two == "two-original"
    assert not hasattr(mod, "new_attr")

    assert rep["good_before"].status is Status.APPLIED
    assert rep["good_after"].status is Status.APPLIED
    assert mod.one == "patched-1" and mod.three == "patched-3"
    assert rep.applied == ["good_before", "good_after"]
    assert [r.name for r in rep.problems] == ["bad"]

    act.deactivate()
    assert (mod.one, mod.two, mod.three) == ("one-original", "two-original", "three-original")


def test_rollback_failure_is_swallowed_and_adapter_failed(make_activation, toy, mod, caplog):
    def half(p, ctx):
        p.setattr(mod, "one", "half")
        p.on_revert("unrevertable", lambda: (_ for _ in ()).throw(RuntimeError("stuck")))
        raise ValueError("boom")

    act = make_activation(toy("bad", change=half), toy("good"))
    rep = act.activate()
    assert rep["bad"].status is Status.FAILED
    assert rep["good"].status is Status.APPLIED
    assert mod.one == "one-original", "other undo steps still ran"


# --------------------------------------------------------------------------- probe


def test_probe_raising_is_failed_and_nothing_applied(make_activation, toy, mod):
    a = toy("a", verdict=KeyError("no such attr"), change=setter(mod, "one", "patched"))
    b = toy("b")
    act = make_activation(a, b)
    rep = act.activate()
    assert rep["a"].status is Status.FAILED
    assert "probe raised" in rep["a"].reason and "no such attr" in rep["a"].reason
    assert a.apply_calls == 0
    assert mod.one == "one-original"
    assert rep["b"].status is Status.APPLIED


def test_probe_mismatch_is_reported_and_apply_not_called(make_activation, toy, mod):
    a = toy("a", verdict=Verdict.mismatch("unknown signature of Foo.bar"),
            change=setter(mod, "one", "patched"))
    act = make_activation(a)
    rep = act.activate()
    assert rep["a"].status is Status.MISMATCH
    assert rep["a"].reason == "unknown signature of Foo.bar"
    assert a.apply_calls == 0
    assert mod.one == "one-original"
    assert rep.problems == [rep["a"]]


def test_probe_not_needed_is_reported_and_apply_not_called(make_activation, toy):
    a = toy("a", verdict=Verdict.not_needed("already fixed upstream"))
    rep = make_activation(a).activate()
    assert rep["a"].status is Status.NOT_NEEDED
    assert rep["a"].reason == "already fixed upstream"
    assert a.apply_calls == 0
    assert rep.problems == []


def test_probes_share_one_context_with_memo(make_activation, toy):
    computed = []
    contexts = []

    def verdict(ctx):
        contexts.append(ctx)
        ctx.memo("expensive", lambda: computed.append(1) or "value")
        return Verdict.not_needed("x")

    act = make_activation(toy("a", verdict=verdict), toy("b", verdict=verdict))
    act.activate(process="driver")
    assert contexts[0] is contexts[1]
    assert contexts[0].process == "driver"
    assert computed == [1]
    assert set(contexts[0].versions) == {"speculators_compat", "vllm", "speculators", "torch",
                                         "transformers"}


# --------------------------------------------------------------------------- strict


def _strict_setup(toy, mod, problem):
    good = toy("good_one", change=setter(mod, "one", "patched"))
    if problem == "mismatch":
        bad = toy("bad_one", verdict=Verdict.mismatch("API changed shape"))
    elif problem == "probe":
        bad = toy("bad_one", verdict=RuntimeError("probe exploded"))
    else:
        def half(p, ctx):
            p.setattr(mod, "two", "half")
            raise RuntimeError("apply exploded")

        bad = toy("bad_one", change=half)
    later = toy("good_two", change=setter(mod, "three", "patched"))
    return [good, bad, later]


@pytest.mark.parametrize("problem", ["mismatch", "probe", "apply"])
@pytest.mark.parametrize("how", ["argument", "env"])
def test_strict_raises_names_adapter_and_reverts_everything(make_activation, toy, mod,
                                                            monkeypatch, problem, how):
    act = make_activation(*_strict_setup(toy, mod, problem))
    if how == "env":
        monkeypatch.setenv(_env.STRICT, "1")
        call = act.activate
    else:
        def call():
            return act.activate(strict=True)

    with pytest.raises(CompatError) as info:
        call()
    msg = str(info.value)
    assert "bad_one" in msg
    assert "good_one" not in msg
    assert (Status.MISMATCH.value if problem == "mismatch" else Status.FAILED.value) in msg
    assert _env.STRICT in msg and _env.DISABLE in msg
    # everything reverted, including the adapters that applied fine
    assert (mod.one, mod.two, mod.three) == ("one-original", "two-original", "three-original")
    assert _env.ACTIVE not in os.environ
    assert act.report is None and not act.active


@pytest.mark.parametrize("value", ["true", "YES", " on "])
def test_strict_env_accepts_true_values(make_activation, toy, mod, monkeypatch, value):
    monkeypatch.setenv(_env.STRICT, value)
    act = make_activation(*_strict_setup(toy, mod, "mismatch"))
    with pytest.raises(CompatError):
        act.activate()


def test_strict_argument_false_overrides_env(make_activation, toy, mod, monkeypatch):
    monkeypatch.setenv(_env.STRICT, "1")
    act = make_activation(*_strict_setup(toy, mod, "mismatch"))
    rep = act.activate(strict=False)
    assert rep.strict is False
    assert rep["bad_one"].status is Status.MISMATCH


def test_strict_without_problems_activates(make_activation, toy, mod):
    act = make_activation(toy("a", change=setter(mod, "one", "patched")),
                          toy("b", verdict=Verdict.not_needed("fine")))
    rep = act.activate(strict=True)
    assert rep.strict is True and rep.active
    assert mod.one == "patched"


def test_strict_failure_then_non_strict_activation_works(make_activation, toy, mod):
    adapters = _strict_setup(toy, mod, "mismatch")
    act = make_activation(*adapters)
    with pytest.raises(CompatError):
        act.activate(strict=True)
    rep = act.activate(strict=False)
    assert rep.active and rep.applied == ["good_one", "good_two"]
    assert mod.one == "patched"


@pytest.mark.parametrize("problem", ["mismatch", "probe", "apply"])
def test_non_strict_warns_and_continues(make_activation, toy, mod, caplog, problem):
    caplog.set_level(logging.DEBUG, logger=LOGGER)
    act = make_activation(*_strict_setup(toy, mod, problem))
    rep = act.activate()
    assert rep.active and rep.strict is False
    assert rep.applied == ["good_one", "good_two"]
    assert mod.one == "patched" and mod.three == "patched"
    assert mod.two == "two-original"
    warnings = [r for r in caplog.records
                if r.name == LOGGER and r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert "bad_one" in warnings[0].getMessage()


# --------------------------------------------------------------------------- selection


def test_disable_env_by_name(make_activation, toy, monkeypatch):
    monkeypatch.setenv(_env.DISABLE, " a , b,,")
    a, b, c = toy("a"), toy("b"), toy("c")
    rep = make_activation(a, b, c).activate()
    assert rep["a"].status is Status.DISABLED and rep["b"].status is Status.DISABLED
    assert _env.DISABLE in rep["a"].reason
    assert rep["c"].status is Status.APPLIED
    assert a.apply_calls == b.apply_calls == 0
    assert a.probe_calls == b.probe_calls == 0
    assert c.apply_calls == 1


def test_disable_env_by_kind(make_activation, toy, monkeypatch, caplog):
    caplog.set_level(logging.WARNING, logger=LOGGER)
    monkeypatch.setenv(_env.DISABLE, "safeguard")
    a, b = toy("a"), toy("b", kind=Kind.SAFEGUARD)
    rep = make_activation(a, b).activate()
    assert rep["b"].status is Status.DISABLED and b.probe_calls == 0
    assert rep["a"].status is Status.APPLIED
    assert rep["b"].kind == "safeguard" and rep.as_dict()["adapters"][1]["kind"] == "safeguard"
    assert not [r for r in caplog.records if r.levelno == logging.WARNING]


def test_scope_checks_cannot_be_disabled_by_kind(make_activation, toy, monkeypatch, caplog):
    caplog.set_level(logging.WARNING, logger=LOGGER)
    monkeypatch.setenv(_env.DISABLE, "scope")
    rep = make_activation(toy("s", kind=Kind.SCOPE)).activate()
    assert rep["s"].status is Status.APPLIED
    assert any("scope" in r.getMessage() for r in caplog.records
               if r.levelno == logging.WARNING)


def test_summary_groups_applied_by_kind(make_activation, toy):
    not_needed = Verdict.not_needed("no")
    rep = make_activation(toy("a"), toy("p", kind=Kind.PLATFORM),
                          toy("s", kind=Kind.SAFEGUARD),
                          toy("n", kind=Kind.SAFEGUARD, verdict=not_needed)).activate()
    assert rep.applied_of(Kind.SAFEGUARD) == ["s"]
    assert rep.summary_line().endswith(
        "applied: upstream-change: a; platform: p; safeguard: s")


def test_disable_env_with_unknown_name_warns(make_activation, toy, monkeypatch, caplog):
    caplog.set_level(logging.WARNING, logger=LOGGER)
    monkeypatch.setenv(_env.DISABLE, "a,nope")
    rep = make_activation(toy("a"), toy("b")).activate()
    assert rep["a"].status is Status.DISABLED
    assert rep["b"].status is Status.APPLIED
    msgs = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("nope" in m and _env.DISABLE in m for m in msgs)


def test_only_selects_and_disables_the_rest(make_activation, toy):
    a, b, c = toy("a"), toy("b"), toy("c")
    rep = make_activation(a, b, c).activate(only=["b"])
    assert rep.applied == ["b"]
    assert rep["a"].status is Status.DISABLED and rep["c"].status is Status.DISABLED
    assert "only" in rep["a"].reason
    assert a.probe_calls == c.probe_calls == 0
    assert a.apply_calls == c.apply_calls == 0


def test_only_empty_disables_everything(make_activation, toy):
    a = toy("a")
    rep = make_activation(a).activate(only=[])
    assert rep.by_status(Status.DISABLED) == ["a"]
    assert a.probe_calls == 0
    assert rep.active


def test_only_unknown_name_raises_value_error_listing_known(make_activation, toy):
    a, b = toy("alpha"), toy("beta")
    act = make_activation(a, b)
    with pytest.raises(ValueError) as info:
        act.activate(only=["alpha", "gamma"])
    msg = str(info.value)
    assert "gamma" in msg and "alpha" in msg and "beta" in msg
    assert a.probe_calls == 0 and b.probe_calls == 0
    assert not act.active
    assert _env.ACTIVE not in os.environ


# --------------------------------------------------------------------------- phase


def test_worker_process_skips_driver_phase_adapters(make_activation, toy, mod):
    d = toy("driver_only", phase=Phase.DRIVER, change=setter(mod, "one", "patched"))
    both = toy("both", phase=Phase.BOTH, change=setter(mod, "three", "patched"))
    rep = make_activation(d, both).activate(process="worker")
    assert rep.process == "worker"
    assert rep["driver_only"].status is Status.NOT_NEEDED
    assert "worker" in rep["driver_only"].reason
    assert d.probe_calls == 0 and d.apply_calls == 0
    assert mod.one == "one-original"
    assert rep["both"].status is Status.APPLIED and both.apply_calls == 1
    assert mod.three == "patched"
    assert rep["both"].phase == "both"


def test_driver_process_applies_every_phase(make_activation, toy):
    adapters = [toy("d", phase=Phase.DRIVER), toy("b", phase=Phase.BOTH)]
    rep = make_activation(*adapters).activate()
    assert rep.process == "driver"
    assert rep.applied == ["d", "b"]


# --------------------------------------------------------------------------- logging


def _records(caplog, level):
    return [r for r in caplog.records if r.name == LOGGER and r.levelno == level]


def test_one_info_line_per_activation_object(make_activation, toy, caplog):
    caplog.set_level(logging.DEBUG, logger=LOGGER)
    act = make_activation(toy("a"), toy("b", verdict=Verdict.not_needed("fine")))
    rep = act.activate()
    infos = _records(caplog, logging.INFO)
    assert len(infos) == 1
    assert infos[0].getMessage() == rep.summary_line()
    assert "applied: upstream-change: a" in infos[0].getMessage()

    caplog.clear()
    act.activate()
    assert _records(caplog, logging.INFO) == []
    debugs = [r.getMessage() for r in _records(caplog, logging.DEBUG)]
    assert any("already active" in m for m in debugs)

    caplog.clear()
    act.deactivate()
    act.activate()
    assert _records(caplog, logging.INFO) == []
    assert _records(caplog, logging.DEBUG), "repeat activation logs its summary at DEBUG"


def test_each_activation_object_logs_its_own_info(make_activation, toy, caplog):
    caplog.set_level(logging.DEBUG, logger=LOGGER)
    make_activation(toy("a")).activate()
    make_activation(toy("b")).activate()
    assert len(_records(caplog, logging.INFO)) == 2


def test_no_warnings_when_all_fine(make_activation, toy, caplog):
    caplog.set_level(logging.DEBUG, logger=LOGGER)
    make_activation(toy("a"), toy("b", verdict=Verdict.not_needed("ok"))).activate()
    assert _records(caplog, logging.WARNING) == []
