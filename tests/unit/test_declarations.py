"""Every adapter declares its stage and its targets; the registry is ordered by stage.

The contract suite (tests/contract) checks the targets against what ``apply()`` really
changes on each installed release; these checks need no vLLM.
"""

from __future__ import annotations

import re

from speculators_compat._adapter import Phase, Stage
from speculators_compat.adapters import ADAPTERS, _targets

TARGET = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_][\w.]*(\(\))?(\.[A-Za-z_]\w*)?$")
ORDER = list(Stage)


def test_registry_is_ordered_by_stage():
    stages = [a.stage for a in ADAPTERS]
    assert all(isinstance(s, Stage) for s in stages)
    positions = [ORDER.index(s) for s in stages]
    assert positions == sorted(positions), [(a.name, a.stage.value) for a in ADAPTERS]


def test_stage_agrees_with_phase():
    """What must precede ``import speculators`` acts in workers too (a spawned worker
    re-runs the main script's imports)."""
    for a in ADAPTERS:
        if a.stage is Stage.BEFORE_SPECULATORS_IMPORT:
            assert a.phase is Phase.BOTH, a.name


def test_targets_are_declared_in_module_colon_name_form():
    for a in ADAPTERS:
        assert isinstance(a.targets, tuple), a.name
        for t in (*a.targets, *a.refusal_targets):
            assert TARGET.match(t), (a.name, t)
        assert len(set(a.targets)) == len(a.targets), a.name
        if a.name != "speculators_supported":  # a probe only
            assert a.targets, f"{a.name} declares no targets"
        if a.stage is Stage.GENERATOR and a.targets:
            assert any(t.startswith(_targets.GENERATOR_MODULE + ":") for t in a.targets), a.name


def test_fail_closed_adapters_declare_what_their_refusal_wraps():
    for a in ADAPTERS:
        assert bool(a.refusal_targets) == a.fail_closed, a.name
        if a.fail_closed:
            assert set(a.refusal_targets) == set(_targets.REFUSAL_TARGETS), a.name


def test_import_order_check_follows_the_declared_stages():
    from speculators_compat import _order

    declared = {a.name: a.stage.precedes for a in ADAPTERS if a.stage.precedes}
    assert {n: p[0] for n, p in _order.import_time(ADAPTERS).items()} == declared
    assert declared["transformers5_config_torch"] == "speculators"
    assert declared["kv_cache_helpers_relocated"] == "speculators.data_generation"


def test_stage_precedes():
    assert Stage.BEFORE_SPECULATORS_IMPORT.precedes == "speculators"
    assert Stage.BEFORE_GENERATOR_IMPORT.precedes == "speculators.data_generation"
    assert Stage.GENERATOR.precedes is None


def test_registry_respects_every_declared_order():
    """The order that matters is declared on the adapters (``after``, ``requires``) and
    checked here and at every activation, not implied by list position."""
    from speculators_compat._activation import check_order

    check_order(ADAPTERS)
    names = [a.name for a in ADAPTERS]
    for a in ADAPTERS:
        for other in (*a.after, *a.requires):
            assert other in names, f"{a.name} names {other}, which the registry lacks"


def test_a_registry_against_a_declared_order_is_refused():
    """Known-wrong lists: an adapter above one it must come after, and a stage out of
    order, each fail naming the adapters."""
    import pytest

    from speculators_compat._activation import check_order

    by_name = {a.name: a for a in ADAPTERS}
    swapped = [by_name["request_metadata_in_driver"], by_name["step_overlap"]]
    with pytest.raises(ValueError, match=r"request_metadata_in_driver declares "
                                         r"after=\['step_overlap'\]"):
        check_order(swapped)
    with pytest.raises(ValueError, match="ordered by stage"):
        check_order([by_name["hook_capture"], by_name["transformers5_config_torch"]])
    check_order(list(reversed(swapped)))  # the declared order passes


def test_every_adapter_module_is_registered_once():
    """An adapter is registered by its module's name in ``ORDER``: a module left out
    would never run, a name listed twice would run twice."""
    from pathlib import Path

    from speculators_compat import adapters

    here = Path(adapters.__file__).parent
    modules = {p.stem for p in here.glob("*.py") if not p.stem.startswith("_")}
    assert sorted(adapters.ORDER) == sorted(modules)
    assert [a.name for a in ADAPTERS] == list(adapters.ORDER)


def test_a_module_without_its_adapter_is_refused_naming_it():
    """Known-wrong modules: no adapter named after the module, and two of them."""
    import types

    import pytest

    from speculators_compat._adapter import Adapter
    from speculators_compat.adapters import adapter_in

    module = types.ModuleType("speculators_compat.adapters.made_up")

    class Other(Adapter):
        name = "other"

    Other.__module__ = module.__name__
    module.Other = Other
    with pytest.raises(ImportError, match=r"made_up must define exactly one Adapter "
                                          r"subclass with name = 'made_up'"):
        adapter_in(module)

    class MadeUp(Adapter):
        name = "made_up"

    MadeUp.__module__ = module.__name__
    module.MadeUp = MadeUp
    assert type(adapter_in(module)) is MadeUp
    module.Again = type("Again", (MadeUp,), {"__module__": module.__name__})
    with pytest.raises(ImportError, match="exactly one"):
        adapter_in(module)
