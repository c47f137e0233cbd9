"""Adapter dependencies in the engine (toy adapters): a dependent of an adapter that did
not apply is reported not needed, naming it and its status, and is neither probed nor
applied; requirements must come earlier in the registry."""

from __future__ import annotations

import types

import pytest

from speculators_compat import _env
from speculators_compat._adapter import Verdict
from speculators_compat._report import Status


@pytest.fixture
def mod():
    m = types.ModuleType("toy_target")
    m.one, m.two = "orig-one", "orig-two"
    return m


def _set(mod, name, value):
    return lambda patcher, ctx: patcher.setattr(mod, name, value)


def test_dependent_of_an_applied_adapter_applies(make_activation, toy, mod):
    base = toy("base", change=_set(mod, "one", "base"))
    dep = toy("dep", requires=("base",), change=_set(mod, "two", "dep"))
    rep = make_activation(base, dep).activate()
    assert rep.applied == ["base", "dep"]
    assert (mod.one, mod.two) == ("base", "dep")


@pytest.mark.parametrize("case, status", [
    ("disabled", Status.DISABLED),
    ("not_needed", Status.NOT_NEEDED),
    ("mismatch", Status.MISMATCH),
    ("probe_raises", Status.FAILED),
    ("apply_raises", Status.FAILED),
])
def test_dependent_of_an_adapter_that_did_not_apply_is_not_needed(
        make_activation, toy, mod, monkeypatch, case, status):
    def boom(patcher, ctx):
        raise RuntimeError("apply failed")

    verdict = {"not_needed": Verdict.not_needed("fine as it is"),
               "mismatch": Verdict.mismatch("unknown shape"),
               "probe_raises": RuntimeError("probe failed")}.get(case)
    base = toy("base", verdict=verdict, change=boom if case == "apply_raises" else None)
    dep = toy("dep", requires=("base",), change=_set(mod, "two", "dep"))
    after = toy("after", requires=("dep",))
    if case == "disabled":
        monkeypatch.setenv(_env.DISABLE, "base")
    rep = make_activation(base, dep, after).activate()
    assert rep["base"].status is status
    r = rep["dep"]
    assert r.status is Status.NOT_NEEDED and r.changes == []
    assert r.reason.startswith(f"requires base, which is {status.value} here ("), r.reason
    assert rep["base"].reason in r.reason
    assert dep.probe_calls == 0 and dep.apply_calls == 0
    assert mod.two == "orig-two"
    # ...and so on down the chain: a dependent of the dependent names the dependent.
    assert rep["after"].status is Status.NOT_NEEDED
    assert rep["after"].reason.startswith("requires dep, which is not-needed here")
    assert after.probe_calls == 0
    assert rep.as_dict()["adapters"][1]["reason"] == r.reason


def test_only_without_the_requirement_leaves_the_dependent_not_needed(make_activation, toy):
    rep = make_activation(toy("base"), toy("dep", requires=("base",))).activate(only=["dep"])
    assert rep["base"].status is Status.DISABLED
    assert rep["dep"].status is Status.NOT_NEEDED
    assert "requires base, which is disabled" in rep["dep"].reason


def test_a_disabled_dependent_stays_disabled(make_activation, toy, monkeypatch):
    monkeypatch.setenv(_env.DISABLE, "base,dep")
    rep = make_activation(toy("base"), toy("dep", requires=("base",))).activate()
    assert rep["dep"].status is Status.DISABLED


def test_a_fail_closed_dependent_does_not_refuse(make_activation, toy, mod, monkeypatch):
    """Not needed is not a problem: the dependent's refusal is not installed."""
    dep = toy("dep", requires=("base",))
    dep.fail_closed = True
    refused = []
    dep.refuse = lambda patcher, ctx, message: refused.append(message)
    monkeypatch.setenv(_env.DISABLE, "base")
    rep = make_activation(toy("base"), dep).activate()
    assert rep["dep"].status is Status.NOT_NEEDED and not refused and not rep.problems


@pytest.mark.parametrize("order", [("dep", "base"), ("dep",)])
def test_a_requirement_must_come_earlier(make_activation, toy, order):
    adapters = {"dep": toy("dep", requires=("base",) if len(order) == 2 else ("dep",)),
                "base": toy("base")}
    act = make_activation(*(adapters[n] for n in order))
    with pytest.raises(ValueError, match="requires"):
        act.activate()
    assert not act.active


def test_a_requirement_the_registry_does_not_hold_constrains_nothing(make_activation, toy):
    rep = make_activation(toy("dep", requires=("elsewhere",))).activate()
    assert rep.applied == ["dep"]


def test_the_real_registry_declares_requirements_it_holds_earlier():
    from speculators_compat.adapters import ADAPTERS

    names = [a.name for a in ADAPTERS]
    for i, a in enumerate(ADAPTERS):
        for r in a.requires:
            assert r in names[:i], (a.name, r)
    requires = {a.name: a.requires for a in ADAPTERS if a.requires}
    assert requires == {"request_metadata_in_driver": ("hook_capture",),
                        "shm_transport": ("hook_capture",),
                        "step_overlap": ("hook_capture",)}
