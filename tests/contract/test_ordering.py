"""Import and activation order, each scenario in a fresh interpreter (dd-trace's style).

What a process has imported before ``activate()`` cannot be undone in that process, so
these run speculators' real generator module in new interpreters
(``tests/contract/scripts/ordering.py``), the two scenarios side by side:

* ``after``: ``activate()`` then ``import`` the generator; ``deactivate()`` restores
  every changed name; ``activate()`` again changes the same names again; a spawned
  child (how vLLM starts its workers) activates at interpreter start as a worker with
  the driver's ``only=``, and after ``deactivate()`` a spawned child inherits no
  activation flag and activates nothing;
* ``before``: ``import`` the generator, then ``activate()``: fine where no import-time
  adapter applies; where one does (transformers 5) that import fails on its own line and
  ``activate()`` refuses, naming the fix.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import threading
from pathlib import Path

import pytest
from helpers import ROOT
from sessions import run_in_own_session

from .expectations import APPLIED, expected_status
from .support import ADAPTER_NAMES, BY_NAME

SCRIPT = Path(__file__).resolve().parent / "scripts" / "ordering.py"
SCENARIOS = ("after", "before")


@pytest.fixture(scope="module")
def ordering(base) -> dict[str, dict]:
    """Both scenarios, run concurrently (each is mostly one cold vLLM import)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPECULATORS_COMPAT_")}
    env["PYTHONPATH"] = os.pathsep.join(
        os.path.abspath(p) for p in env.get("PYTHONPATH", "").split(os.pathsep) if p)
    results: dict[str, dict] = {}
    with tempfile.TemporaryDirectory() as tmp:
        def run(scenario: str) -> None:
            out = Path(tmp) / f"{scenario}.json"
            rc, output = run_in_own_session(
                [sys.executable, str(SCRIPT), scenario, "--out", str(out)], env,
                Path(tmp) / f"{scenario}.log", 600, ROOT)
            results[scenario] = (json.loads(out.read_text()) if out.exists()
                                 else {"_error": f"rc={rc}\n{output[-6000:]}"})

        threads = [threading.Thread(target=run, args=(s,)) for s in SCENARIOS]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    for s in SCENARIOS:
        assert "_error" not in results[s], f"{s}: {results[s].get('_error')}"
    return results


def test_import_after_activate_then_deactivate_and_activate_again(ordering):
    r = ordering["after"]
    assert r["applied"] and r["applied_again"] == r["applied"]
    assert r["targets"] and r["targets_again"] == r["targets"]
    # deactivate() restored every changed target; the second activation changed each again
    assert r["changed"] == r["targets"], sorted(set(r["targets"]) - set(r["changed"]))
    assert r["changed_again"] == r["targets"]
    declared = {t for n in r["applied"] for t in BY_NAME[n].targets}
    assert set(r["targets"]) <= declared, sorted(set(r["targets"]) - declared)


def test_spawned_worker_honours_only_and_the_activation_flag(ordering):
    r = ordering["after"]
    worker = r["with_flag"]
    assert worker is not None, "the spawned child did not activate"
    assert worker["process"] == "worker" and worker["active"]
    statuses = {a["name"]: a["status"] for a in worker["adapters"]}
    assert list(statuses) == ADAPTER_NAMES
    for name, status in statuses.items():
        assert (status == "disabled") == (name not in r["only"]), (name, status)
    assert r["without_flag"] is None, "a child of a deactivated process activated"


def test_import_before_activate(base, ordering):
    r = ordering["before"]
    import_time_fix = expected_status("transformers5_config_torch", base.env) is APPLIED
    if import_time_fix:  # transformers 5: speculators' own import fails first
        assert "torch" in (r["import_error"] or ""), r
        assert "activate() was called after speculators" in r["activate_error"], r
        assert "speculators-compat run" in r["activate_error"] and not r["active"]
    else:
        assert r["import_error"] is None and r["activate_error"] is None, r
        assert r["applied"] and not r["import_time_applied"], r
