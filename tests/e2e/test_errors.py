"""Clear, actionable errors before anything runs; a failed call leaks nothing; speculators
releases the shim cannot serve are refused at activate()."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import ROOT, checkpoint, require_speculators, run_script

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def errors():
    require_speculators()
    return run_script("errors.py", "--model", checkpoint("llama"))


def test_layer_ids_out_of_range_refused_before_engine_start(errors):
    e = errors["layer_out_of_range"]
    assert e["raised"] == "ValueError" and "99" in e["message"] and "out of bounds" in e["message"]
    assert e["seconds"] < 15, "must fail before vLLM starts workers or loads weights"


def test_empty_batch_and_sequence_and_bad_tokens(errors):
    assert errors["empty_batch"]["raised"] in ("ValueError", "CompatError")
    assert "empty" in errors["empty_batch"]["message"]
    e = errors["empty_sequence"]
    assert e["raised"] == "CompatError" and "sequence 1" in e["message"] and "empty" in e["message"]
    b = errors["bad_token"]
    assert b["raised"] == "CompatError" and "sequence 1" in b["message"] and "'x'" in b["message"]


def test_failed_calls_leak_nothing_and_truncation_matches_upstream(errors):
    after = errors["after_errors"]
    assert after["returned"] == 5
    assert after["input_ids_truncated"], "over-long sequences are cut to max_model_len - 1"
    assert max(after["rows"]) == 63
    assert after["compare_ok"], after


def test_speculators_without_generator_is_refused():
    require_speculators()
    target = ROOT / ".envs" / "speculators-0.5.0"
    if not (target / "speculators").is_dir():
        pytest.skip("speculators 0.5.0 target not built (tools/envs.py build)")
    env = dict(os.environ, PYTHONPATH=str(target))
    env.pop("SPECULATORS_COMPAT_ACTIVE", None)
    code = ("import speculators_compat, os\n"
            "try:\n    speculators_compat.activate()\n"
            "except speculators_compat.UnsupportedError as e:\n    print('REFUSED', e)\n"
            "assert speculators_compat.report() is None\n"
            "assert 'SPECULATORS_COMPAT_ACTIVE' not in os.environ\n")
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          timeout=300, check=False, cwd=str(Path(target).parent))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "REFUSED" in proc.stdout and "0.5.0" in proc.stdout
    assert "extract_hidden_states" in proc.stdout
