"""The vllm.general_plugins entry point, and the cheap import."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from speculators_compat import _env, _plugin, _process
from speculators_compat._adapter import Phase
from speculators_compat._report import Status


@pytest.fixture
def adapters(toy):
    return [toy("driver_side", phase=Phase.DRIVER), toy("worker_side", phase=Phase.BOTH),
            toy("both_sides", phase=Phase.BOTH)]


def test_register_does_nothing_when_not_active(toy_global, adapters):
    act = toy_global(*adapters)
    _plugin.register()
    assert act.report is None
    assert all(a.probe_calls == 0 and a.apply_calls == 0 for a in adapters)
    assert _env.ACTIVE not in os.environ
    assert _process.worker_report() is None


@pytest.mark.parametrize("value", ["0", "", "false"])
def test_register_does_nothing_when_flag_false(toy_global, adapters, monkeypatch, value):
    monkeypatch.setenv(_env.ACTIVE, value)
    act = toy_global(*adapters)
    _plugin.register()
    assert act.report is None


def test_register_activates_as_worker_when_active(toy_global, adapters, monkeypatch):
    monkeypatch.setenv(_env.ACTIVE, "1")
    act = toy_global(*adapters)
    assert _plugin.register() is None
    rep = act.report
    assert rep is not None and rep.active
    assert rep.process == "worker"
    assert rep["driver_side"].status is Status.NOT_NEEDED
    assert rep.applied == ["worker_side", "both_sides"]
    assert _process.worker_report() == rep.as_dict()
    assert _process.worker_report(object()) == rep.as_dict()  # collective_rpc passes a worker


def test_register_is_reentrant(toy_global, adapters, monkeypatch):
    monkeypatch.setenv(_env.ACTIVE, "1")
    act = toy_global(*adapters)
    _plugin.register()
    first = act.report
    _plugin.register()
    assert act.report is first
    assert [a.apply_calls for a in adapters] == [0, 1, 1]


def test_deactivate_in_worker_keeps_inherited_flag(toy_global, adapters, monkeypatch):
    monkeypatch.setenv(_env.ACTIVE, "1")
    act = toy_global(*adapters)
    _plugin.register()
    act.deactivate()
    assert os.environ[_env.ACTIVE] == "1"


def test_only_and_strict_travel_to_the_worker(toy_global, adapters, toy):
    """``activate(only=..., strict=...)`` in the driver: the environment its workers
    inherit carries both, the worker's activation honours them, and ``deactivate()``
    restores the environment."""
    from speculators_compat._adapter import Verdict
    from speculators_compat._errors import CompatError

    driver = toy_global(*adapters)
    _process.activate(only=["worker_side", "driver_side"], strict=True)
    assert os.environ[_env.ONLY] == "driver_side,worker_side"
    assert os.environ[_env.STRICT] == "1"
    inherited = dict(os.environ)
    driver.deactivate()
    assert _env.ONLY not in os.environ and _env.STRICT not in os.environ

    # the worker process: what it inherited, and the plugin's activation there
    os.environ.update({k: inherited[k] for k in (_env.ACTIVE, _env.ONLY, _env.STRICT)})
    worker = toy_global(*adapters)
    _plugin.register()
    rep = worker.report
    assert rep.process == "worker" and rep.strict
    assert rep.applied == ["worker_side"]
    assert rep["both_sides"].status is Status.DISABLED, rep["both_sides"]
    worker.deactivate()
    broken = toy_global(toy("driver_side"), toy("worker_side", phase=Phase.BOTH,
                                                verdict=Verdict.mismatch("unknown shape")))
    with pytest.raises(CompatError, match="strict"):  # refused there, with the reason
        _plugin.register()
    assert broken.report is None


def test_unknown_inherited_selection_names_the_variable(toy_global, adapters, monkeypatch):
    monkeypatch.setenv(_env.ACTIVE, "1")
    monkeypatch.setenv(_env.ONLY, "no_such_adapter")
    toy_global(*adapters)
    with pytest.raises(ValueError, match=_env.ONLY):
        _plugin.register()


def test_entry_point_declared():
    from importlib import metadata

    eps = metadata.entry_points(group="vllm.general_plugins")
    ours = [ep for ep in eps if ep.name == "speculators_compat"]
    if not ours:
        pytest.skip("speculators-compat is not installed (pip install -e .)")
    assert ours[0].value == "speculators_compat._plugin:register"
    assert ours[0].load() is _plugin.register


def test_import_does_not_import_heavy_modules():
    code = ("import speculators_compat, speculators_compat._plugin, sys; "
            "heavy = {'vllm', 'torch', 'transformers', 'speculators'} & "
            "{m.split('.')[0] for m in sys.modules}; "
            "assert not heavy, heavy")
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPECULATORS_COMPAT_")}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=env, timeout=60)
    assert proc.returncode == 0, proc.stderr


def test_import_changes_nothing():
    """Importing sets no env var and registers no activation."""
    code = ("import os, speculators_compat; "
            "assert speculators_compat.report() is None; "
            "assert not [k for k in os.environ if k.startswith('SPECULATORS_COMPAT_')]")
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPECULATORS_COMPAT_")}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=env, timeout=60)
    assert proc.returncode == 0, proc.stderr
