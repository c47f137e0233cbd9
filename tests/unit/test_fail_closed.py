"""Failure handling of the activation core, with toy adapters only: an interrupted
activate() leaves nothing behind; data-guarding adapters fail closed."""

from __future__ import annotations

import os
import types

import pytest
import wrapt

from speculators_compat import _env
from speculators_compat._adapter import Phase, Verdict
from speculators_compat._errors import CompatError
from speculators_compat._report import Status


@pytest.fixture
def mod():
    m = types.ModuleType("toy_target")
    m.one = "one-original"
    m.two = "two-original"
    m.fn = lambda: []
    return m


@pytest.fixture
def Guard(toy):  # noqa: N802 - a class
    class Guard(toy):
        """A toy data guard: ``refuse`` rebinds ``mod.fn`` to a function raising it."""

        fail_closed = True

        def __init__(self, name, mod, **kw):
            super().__init__(name, **kw)
            self.mod = mod
            self.messages: list[str] = []

        def refuse(self, patcher, ctx, message):
            self.messages.append(message)

            def refused():
                raise CompatError(message)

            patcher.setattr(self.mod, "fn", refused)

    return Guard


def marker_wrap(mod):
    """Wrap ``mod.fn`` so each layer of wrapping appends one marker to its result."""

    def change(p, ctx):
        def wrapper(wrapped, instance, args, kwargs):
            return [*wrapped(*args, **kwargs), "wrapped"]

        p.wrap(mod, "fn", wrapper)

    return change


# ------------------------------------------------------------ interrupted activate()


@pytest.mark.parametrize("where", ["apply", "probe"])
def test_interrupted_activate_leaves_nothing_and_a_second_one_wraps_once(
        make_activation, toy, mod, where):
    interrupts = [KeyboardInterrupt()]

    def interrupted_change(p, ctx):
        p.setattr(mod, "two", "half-done")
        if interrupts:
            raise interrupts.pop()

    def interrupted_verdict(ctx):
        if interrupts:
            raise interrupts.pop()
        return Verdict.needed("ok")

    original_fn = mod.fn
    a = toy("a", change=marker_wrap(mod))
    b = (toy("b", change=interrupted_change) if where == "apply"
         else toy("b", verdict=interrupted_verdict))
    act = make_activation(a, b)
    with pytest.raises(KeyboardInterrupt):
        act.activate()
    # nothing half-patched: a's wrapper and b's partial change are undone
    assert mod.fn is original_fn and mod.two == "two-original"
    assert not act.active and act.report is None
    assert _env.ACTIVE not in os.environ
    # a second activate() starts from scratch: one wrapper layer, not two
    report = act.activate()
    assert report.active and report["a"].status is Status.APPLIED
    assert mod.fn() == ["wrapped"]
    act.deactivate()
    assert mod.fn is original_fn and mod.two == "two-original"


def test_interrupt_inside_an_undo_of_the_rollback_still_undoes_the_rest(make_activation, toy,
                                                                        mod):
    def change(p, ctx):
        p.setattr(mod, "one", "patched")
        p.on_revert("boom", lambda: (_ for _ in ()).throw(RuntimeError("undo failed")))
        raise KeyboardInterrupt

    act = make_activation(toy("a", change=change))
    with pytest.raises((KeyboardInterrupt, RuntimeError)):
        act.activate()
    assert mod.one == "one-original"
    assert act.report is None


# ------------------------------------------------------------------------ fail closed


@pytest.mark.parametrize("verdict, status", [
    (Verdict.mismatch("unknown shape of Thing"), Status.MISMATCH),
    (RuntimeError("probe blew up"), Status.FAILED),
])
def test_guard_that_cannot_act_refuses(Guard, make_activation, mod, verdict, status):
    g = Guard("guard", mod, verdict=verdict)
    act = make_activation(g)
    report = act.activate()
    r = report["guard"]
    assert r.status is status
    assert "fail closed" in r.reason and r.changes == ["toy_target.fn"]
    with pytest.raises(CompatError) as exc:
        mod.fn()
    msg = str(exc.value)
    assert "adapter guard" in msg and status.value in msg
    assert f"{_env.DISABLE}=guard" in msg
    assert ("unknown shape of Thing" in msg) or ("probe blew up" in msg)
    act.deactivate()
    assert mod.fn() == []  # the refusal is reverted like any change


def test_guard_whose_apply_fails_is_rolled_back_then_refuses(Guard, make_activation, mod):
    def change(p, ctx):
        p.setattr(mod, "one", "half")
        raise ValueError("apply blew up")

    g = Guard("guard", mod, change=change)
    act = make_activation(g)
    r = act.activate()["guard"]
    assert r.status is Status.FAILED and "apply blew up" in r.reason
    assert mod.one == "one-original"
    with pytest.raises(CompatError, match="apply blew up"):
        mod.fn()


def test_guard_not_needed_or_applied_does_not_refuse(Guard, make_activation, mod):
    g1 = Guard("g1", mod, verdict=Verdict.not_needed("old shape"))
    g2 = Guard("g2", mod)
    act = make_activation(g1, g2)
    report = act.activate()
    assert report["g1"].status is Status.NOT_NEEDED and report["g2"].status is Status.APPLIED
    assert g1.messages == g2.messages == []
    assert mod.fn() == []


@pytest.mark.parametrize("disable", ["guard", "safeguard"])
def test_guard_disabled_by_the_user_does_not_refuse(Guard, make_activation, mod, monkeypatch,
                                                   disable):
    from speculators_compat._report import Kind

    monkeypatch.setenv(_env.DISABLE, disable)
    g = Guard("guard", mod, verdict=Verdict.mismatch("unknown"), kind=Kind.SAFEGUARD)
    report = make_activation(g).activate()
    assert report["guard"].status is Status.DISABLED
    assert g.messages == [] and mod.fn() == []


def test_ordinary_adapter_mismatch_does_not_refuse(make_activation, toy, mod):
    a = toy("a", verdict=Verdict.mismatch("unknown"))
    a.refuse = lambda *args: pytest.fail("refuse called for a non-guard")
    report = make_activation(a).activate()
    assert report["a"].status is Status.MISMATCH
    assert mod.fn() == []


def test_guard_is_not_refused_in_worker_processes(Guard, make_activation, mod):
    g = Guard("guard", mod, verdict=Verdict.mismatch("unknown"), phase=Phase.BOTH)
    report = make_activation(g).activate(process="worker")
    assert report["guard"].status is Status.MISMATCH
    assert g.messages == []


def test_refusal_that_cannot_be_installed_is_reported_and_rolled_back(Guard, make_activation,
                                                                        mod):
    class Broken(Guard):
        def refuse(self, patcher, ctx, message):
            patcher.setattr(self.mod, "one", "half")
            raise LookupError("nothing to guard")

    g = Broken("guard", mod, verdict=Verdict.mismatch("unknown"))
    r = make_activation(g).activate()["guard"]
    assert r.status is Status.MISMATCH and "could not install the refusal" in r.reason
    assert mod.one == "one-original" and r.changes == []


def test_strict_mode_reverts_the_refusal_too(Guard, make_activation, mod):
    g = Guard("guard", mod, verdict=Verdict.mismatch("unknown"))
    act = make_activation(g)
    original = mod.fn
    with pytest.raises(CompatError, match="strict"):
        act.activate(strict=True)
    assert mod.fn is original
    assert isinstance(original, types.FunctionType) and not isinstance(original,
                                                                        wrapt.ObjectProxy)
