"""The interpreter-start hook (``_bootstrap``): PYTHONPATH through the patcher, process
kinds, chaining to a shadowed sitecustomize, never crashing, and the import-order check."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import types

import pytest

import speculators_compat
from speculators_compat import _bootstrap, _env, _order, _process
from speculators_compat._activation import Activation
from speculators_compat._adapter import Phase
from speculators_compat._errors import CompatError
from speculators_compat._patcher import Patcher
from speculators_compat._report import Status
from speculators_compat.adapters import ADAPTERS

DIR = _bootstrap.DIRECTORY


def test_bootstrap_folder_ships_sitecustomize():
    assert os.path.isfile(os.path.join(DIR, "sitecustomize.py"))
    assert os.path.isfile(os.path.join(DIR, "__init__.py"))  # a package: in the wheel


@pytest.mark.parametrize("before", [None, "", "/a", f"/a{os.pathsep}/b"])
def test_install_prepends_and_revert_restores(monkeypatch, before):
    if before is None:
        monkeypatch.delenv("PYTHONPATH", raising=False)
    else:
        monkeypatch.setenv("PYTHONPATH", before)
    p = Patcher()
    _bootstrap.install(p, "driver")
    entries = os.environ["PYTHONPATH"].split(os.pathsep)
    assert entries[0] == DIR
    assert [e for e in entries[1:] if e] == [e for e in (before or "").split(os.pathsep) if e]
    _bootstrap.install(p, "driver")  # already there: no second entry, no second change
    assert os.environ["PYTHONPATH"].split(os.pathsep).count(DIR) == 1
    assert len(p) == 1
    p.revert()
    assert os.environ.get("PYTHONPATH") == before


def test_install_is_a_no_op_where_inherited(monkeypatch):
    monkeypatch.setenv("PYTHONPATH", f"/x{os.pathsep}{DIR}")
    p = Patcher()
    _bootstrap.install(p, "worker")
    assert len(p) == 0 and os.environ["PYTHONPATH"] == f"/x{os.pathsep}{DIR}"


def test_package_activation_sets_pythonpath_and_deactivate_restores(toy, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", "/keep")
    act = Activation(lambda: [toy("a")], on_activate=_process._bootstrap_hook)
    act.activate()
    assert os.environ["PYTHONPATH"] == f"{DIR}{os.pathsep}/keep"
    assert os.environ[_env.ACTIVE] == "1"
    act.deactivate()
    assert os.environ["PYTHONPATH"] == "/keep" and _env.ACTIVE not in os.environ


def test_write_report_false_writes_no_report_file(toy, monkeypatch, tmp_path):
    path = tmp_path / "r.json"
    monkeypatch.setenv(_env.REPORT_FILE, str(path))
    act = Activation(lambda: [toy("a")])
    act.activate(write_report=False)
    assert not path.exists()
    act.deactivate()
    act.activate()
    assert json.loads(path.read_text())["process"] == "driver"
    act.deactivate()


@pytest.mark.parametrize("argv, orig, kind", [
    (["-c", "--multiprocessing-fork"], ["py", "-c", "from multiprocessing.spawn import "
                                        "spawn_main; spawn_main(tracker_fd=5, pipe_handle=7)",
                                        "--multiprocessing-fork"], "worker"),
    (["-c"], ["py", "-c", "from multiprocessing.resource_tracker import main;main(5)"], None),
    (["-c"], ["py", "-c", "from multiprocessing.forkserver import main; main(5, 6, None)"],
     "worker"),
    (["script.py", "--x"], ["py", "script.py", "--x"], "driver"),
    (["-c"], ["py", "-c", "print(1)"], "driver"),
    (["-m"], ["py", "-m", "pip", "list"], "driver"),
    (["-m"], ["py", "-m", "vllm.model_executor.models.registry"], "worker"),
    (["-m"], ["py", "-m", "torch._inductor.compile_worker", "--x"], None),
    (["gen.py", "-m", "vllm.x"], ["py", "-B", "-X", "utf8", "gen.py", "-m", "vllm.x"], "driver"),
    (["-c"], ["py", "-W", "ignore", "-c", "from multiprocessing.resource_tracker import main"],
     None),
])
def test_process_kind(argv, orig, kind):
    assert _bootstrap.process_kind(argv, orig) == kind


# -- in fresh interpreters: what sitecustomize does at interpreter start ---------------------

def _all_adapters_disabled() -> str:
    from speculators_compat.adapters import ADAPTERS

    return ",".join(a.name for a in ADAPTERS)


SRC = os.path.dirname(os.path.dirname(os.path.abspath(speculators_compat.__file__)))


def _python(code: str, *args: str, flag: bool, pythonpath: list[str], extra_env=None):
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPECULATORS_COMPAT_")}
    # ...then the folder this package is imported from, so the child runs the code under
    # test (not another installed copy of it)
    env["PYTHONPATH"] = os.pathsep.join([*pythonpath, SRC])
    env[_env.DISABLE] = _all_adapters_disabled()  # keep it cheap: no vLLM import
    if flag:
        env[_env.ACTIVE] = "1"
    env.update(extra_env or {})
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True,
                          env=env, timeout=120)


def _fake_speculators(tmp_path, where=None) -> str:
    """A stand-in top-level ``speculators`` package (the bootstrap's trigger); its import
    prints EXEC each time its ``__init__`` runs."""
    where = where or tmp_path / "fake-speculators"
    (where / "speculators").mkdir(parents=True, exist_ok=True)
    (where / "speculators" / "__init__.py").write_text("print('EXEC', flush=True)\nX = 1\n")
    return str(where)


REPORT = ("import speculators, sys, speculators_compat as s; r = s.report(); "
          "print('KIND', r and r.process)")


def test_without_flag_nothing_is_imported():
    proc = _python("import sys; print('LOADED', 'speculators_compat' in sys.modules)",
                   flag=False, pythonpath=[DIR])
    assert proc.returncode == 0, proc.stderr
    assert "LOADED False" in proc.stdout


@pytest.mark.parametrize("args, kind", [((), "driver"), (("--multiprocessing-fork",), "worker")])
def test_with_flag_activates_at_start(args, kind, tmp_path):
    report_file = tmp_path / "r.json"
    proc = _python(REPORT, *args, flag=True, pythonpath=[DIR, _fake_speculators(tmp_path)],
                   extra_env={_env.REPORT_FILE: str(report_file)})
    assert proc.returncode == 0, proc.stderr
    assert f"KIND {kind}" in proc.stdout, (proc.stdout, proc.stderr)
    assert not report_file.exists()  # only an explicit activate() writes it


def test_chains_to_the_sitecustomize_it_shadows(tmp_path):
    other = tmp_path / "other"
    other.mkdir()
    (other / "sitecustomize.py").write_text("import os\nos.environ['OTHER_SITECUSTOMIZE'] = '1'\n")
    code = ("import os, sys; print('OTHER', os.environ.get('OTHER_SITECUSTOMIZE'), "
            "sys.modules['sitecustomize'].__file__)")
    for flag in (False, True):
        proc = _python(code, flag=flag, pythonpath=[DIR, str(other)])
        assert proc.returncode == 0, proc.stderr
        assert f"OTHER 1 {other / 'sitecustomize.py'}" in proc.stdout, proc.stdout


CHAINING_HOOK = """
import os, sys, importlib.machinery, importlib.util
here = os.path.dirname(os.path.abspath(__file__))
os.environ["OTHER_HOOK_RUNS"] = str(int(os.environ.get("OTHER_HOOK_RUNS", "0")) + 1)
idx = [i for i, p in enumerate(sys.path) if os.path.abspath(p or ".") == here][0]
spec = importlib.machinery.PathFinder.find_spec("sitecustomize", sys.path[idx + 1:])
if spec:
    m = importlib.util.module_from_spec(spec)
    sys.modules["sitecustomize"] = m
    spec.loader.exec_module(m)
"""


@pytest.mark.parametrize("order", ["ours-first", "theirs-first"])
def test_two_chaining_hooks_run_once_each(tmp_path, order):
    """Another tool's hook that chains like ours (ddtrace-style), before or after ours:
    each runs exactly once, no loop."""
    other = tmp_path / "other"
    other.mkdir()
    (other / "sitecustomize.py").write_text(CHAINING_HOOK)
    path = [DIR, str(other)] if order == "ours-first" else [str(other), DIR]
    proc = _python(REPORT + "; import os; print('RUNS', os.environ.get('OTHER_HOOK_RUNS'))",
                   flag=True, pythonpath=[*path, _fake_speculators(tmp_path)])
    assert proc.returncode == 0, proc.stderr
    assert "RUNS 1" in proc.stdout and "KIND driver" in proc.stdout, (proc.stdout, proc.stderr)
    assert "Error" not in proc.stderr, proc.stderr


def test_a_failing_shadowed_sitecustomize_does_not_stop_activation(tmp_path):
    other = tmp_path / "other"
    other.mkdir()
    (other / "sitecustomize.py").write_text("raise RuntimeError('boom')\n")
    proc = _python(REPORT, flag=True, pythonpath=[DIR, str(other), _fake_speculators(tmp_path)])
    assert proc.returncode == 0, proc.stderr
    assert "KIND driver" in proc.stdout
    assert "boom" in proc.stderr


def test_unimportable_package_is_quiet_until_speculators_is_imported(tmp_path):
    """An interpreter without the package (a system Python a tool starts) says nothing,
    unless it imports speculators or vLLM: then it warns once, and the import works."""
    fake = tmp_path / "fake"
    (fake / "speculators_compat").mkdir(parents=True)
    (fake / "speculators_compat" / "__init__.py").write_text("raise ImportError('broken')\n")
    proc = _python("print('STARTED')", flag=True, pythonpath=[DIR, str(fake)])
    assert proc.returncode == 0, proc.stderr
    assert "STARTED" in proc.stdout
    assert proc.stderr == "", proc.stderr
    proc = _python("import speculators; import speculators; print('X', speculators.X)",
                   flag=True, pythonpath=[DIR, str(fake), _fake_speculators(tmp_path)])
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["EXEC", "X", "1"], proc.stdout
    assert proc.stderr.count("speculators-compat: WARNING") == 1, proc.stderr
    assert "broken" in proc.stderr


FINDER = ("import sys; print('FINDER', [type(f).__name__ for f in sys.meta_path]"
          ".count('ActivateOnImport'), 'LOADED', 'speculators_compat' in sys.modules)")


def test_a_child_that_never_imports_speculators_or_vllm_activates_nothing():
    proc = _python(FINDER + "; import json, numbers; " + FINDER, flag=True, pythonpath=[DIR])
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["FINDER", "1", "LOADED", "False"] * 2, proc.stdout


def test_first_speculators_import_activates_once_and_returns_the_real_package(tmp_path):
    code = ("import speculators, speculators_compat as s, sys; r = s.report(); "
            "print('KIND', r and r.process, speculators.X, speculators.__spec__.origin); "
            "import speculators; " + FINDER)
    proc = _python(code, flag=True, pythonpath=[DIR, _fake_speculators(tmp_path)])
    assert proc.returncode == 0, proc.stderr
    origin = os.path.join(tmp_path, "fake-speculators", "speculators", "__init__.py")
    assert proc.stdout.split() == ["EXEC", "KIND", "driver", "1", origin,
                                   "FINDER", "0", "LOADED", "True"], proc.stdout


def test_a_missing_trigger_package_still_raises_module_not_found():
    code = ("try:\n    import speculators\n"
            "except ModuleNotFoundError as e:\n    print('MNF', e.name)\n" + FINDER)
    proc = _python(code, flag=True, pythonpath=[DIR])
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["MNF", "speculators", "FINDER", "1", "LOADED", "False"], (
        proc.stdout, proc.stderr)


# -- activate() after the speculators import it had to precede ------------------------------

@pytest.fixture
def tf5_toy(toy):
    return toy("transformers5_config_torch", phase=Phase.BOTH)


def test_late_activation_after_a_failed_speculators_import_is_refused(toy_global, toy, tf5_toy,
                                                                       monkeypatch):
    act = toy_global(tf5_toy, toy("other"))
    # What a failed `import speculators` on transformers 5 leaves behind.
    monkeypatch.setitem(sys.modules, "speculators.config", types.ModuleType("speculators.config"))
    with pytest.raises(CompatError, match="activate\\(\\) was called after speculators") as e:
        speculators_compat.activate()
    assert "speculators-compat run" in str(e.value)
    assert act.report is None and _env.ACTIVE not in os.environ  # nothing left patched


def test_activation_before_any_speculators_import_is_fine(toy_global, tf5_toy, monkeypatch):
    for m in [m for m in sys.modules if m == "speculators" or m.startswith("speculators.")]:
        monkeypatch.delitem(sys.modules, m)
    toy_global(tf5_toy)
    assert speculators_compat.activate().applied == ["transformers5_config_torch"]


def test_activate_deactivate_activate_after_importing_while_active(toy_global, tf5_toy,
                                                                  monkeypatch):
    """Modules imported while the shim was active were built with the fix: a later
    re-activation in the same process is not refused because of them (it was: found by
    the fresh-interpreter ordering suite); one imported after ``deactivate()`` still is."""
    for m in [m for m in sys.modules if m == "speculators" or m.startswith("speculators.")]:
        monkeypatch.delitem(sys.modules, m)
    monkeypatch.setattr(_order, "_BUILT_WITH_FIX", set())
    toy_global(tf5_toy)
    speculators_compat.activate()
    monkeypatch.setitem(sys.modules, "speculators", types.ModuleType("speculators"))
    speculators_compat.deactivate()
    assert speculators_compat.activate().applied == ["transformers5_config_torch"]
    speculators_compat.deactivate()
    monkeypatch.setitem(sys.modules, "speculators.config", types.ModuleType("speculators.config"))
    with pytest.raises(CompatError, match="speculators.config"):
        speculators_compat.activate()


def test_earlier_import_is_fine_when_no_import_time_adapter_applied(toy_global, toy,
                                                                    monkeypatch):
    from speculators_compat._adapter import Verdict

    toy_global(toy("transformers5_config_torch", verdict=Verdict.not_needed("tf 4")))
    monkeypatch.setitem(sys.modules, "speculators", types.ModuleType("speculators"))
    assert speculators_compat.activate().active


def test_order_check_names_only_the_modules_an_adapter_precedes():
    assert _order.import_time(ADAPTERS)["transformers5_config_torch"] == ("speculators",)
    assert (_order.import_time(ADAPTERS)["kv_cache_helpers_relocated"]
            == ("speculators.data_generation",))
    before = frozenset({"speculators.utils"})
    act = Activation(lambda: [])
    rep = act.activate()
    from speculators_compat._report import AdapterResult

    rep.results.append(AdapterResult("kv_cache_helpers_relocated", Status.APPLIED, "", "", "",
                                     "both", None))
    _order.check_import_order(rep, before, ADAPTERS)  # speculators.utils is not what it precedes
    with pytest.raises(CompatError):
        _order.check_import_order(rep, before | {"speculators.data_generation.custom_worker"},
                                  ADAPTERS)
    act.deactivate()


# -- `speculators-compat run`: the target's module level runs activated, in spawned children too

SCRIPT = '''
import os, sys
import speculators  # the first import of speculators activates (a stand-in package here)
import speculators_compat
_r = speculators_compat.report()
print("MODULE", __name__, _r and _r.process, sys.argv[1:], flush=True)

def child():
    pass

if __name__ == "__main__":
    import multiprocessing as mp
    p = mp.get_context("spawn").Process(target=child)
    p.start()
    p.join()
    sys.exit(p.exitcode)
'''


def _run_cli(args, cwd, extra_env=None):
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPECULATORS_COMPAT_")}
    env[_env.DISABLE] = _all_adapters_disabled()
    env.pop("PYTHONPATH", None)
    env.update(extra_env or {})
    return subprocess.run([sys.executable, "-m", "speculators_compat", "run", *args],
                          capture_output=True, text=True, env=env, timeout=180, cwd=cwd)


def test_run_script_spawned_children_activate_before_rerunning_it(tmp_path):
    (tmp_path / "gen.py").write_text(SCRIPT)
    _fake_speculators(tmp_path, tmp_path)
    proc = _run_cli([str(tmp_path / "gen.py"), "--a", "1"], tmp_path)
    assert proc.returncode == 0, proc.stderr
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("MODULE")]
    assert lines == ["MODULE __main__ driver ['--a', '1']",
                     "MODULE __mp_main__ worker ['--a', '1']"], proc.stdout


def test_run_module(tmp_path):
    (tmp_path / "mypkg").mkdir()
    (tmp_path / "mypkg" / "__init__.py").write_text("")
    (tmp_path / "mypkg" / "gen.py").write_text(SCRIPT)
    _fake_speculators(tmp_path, tmp_path)
    proc = _run_cli(["-m", "mypkg.gen", "x"], tmp_path)
    assert proc.returncode == 0, proc.stderr
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("MODULE")]
    assert lines == ["MODULE __main__ driver ['x']", "MODULE __mp_main__ worker ['x']"], proc.stdout


def test_run_missing_script_says_so(tmp_path):
    proc = _run_cli([str(tmp_path / "nope.py")], tmp_path)
    assert proc.returncode == 2 and "no such file" in proc.stderr


def test_doctor_reports_the_bootstrap():
    from speculators_compat.__main__ import bootstrap_status

    st = bootstrap_status()
    assert st["ships"] and st["directory"] == DIR
