"""Reliability under real use: malformed batches get a clear error before anything is
added, silent truncation is reported (refused when strict), and a dead vLLM worker is
named with a rebuild hint, in the failing call and every later one."""

from __future__ import annotations

import pytest
from helpers import checkpoint, require_speculators, run_script

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def rel():
    require_speculators()
    return run_script("reliability.py", "--model", checkpoint("llama"))


def _section(rel, name):
    info = rel[name]
    assert "error" not in info, (info.get("error"), info.get("traceback"), rel.get("_stderr_tail"))
    return info


@pytest.mark.parametrize("case, says", [
    ("flat_list", "a list whose item 0 is an int"),
    ("tensor_1d", "a tensor with 1 dimension(s)"),
    ("dict", "got a dict"),
    ("none_token", "sequence 0 contains None (NoneType) at position 1"),
    ("numpy_2d", "a numpy.ndarray"),
    ("tuples", "sequence 0 is a tuple"),
])
def test_malformed_batch_is_refused_clearly_before_any_request(rel, case, says):
    info = _section(rel, "malformed")
    e = info[case]
    assert e["raised"] == "CompatError", e
    assert says in e["message"], e
    assert info["untouched"], "no request may be added (and no request id used)"


def test_what_upstream_accepts_gives_the_same_result(rel):
    info = _section(rel, "accepted")
    assert info == {"tensor_2d": True, "tensors_1d": True, "outer_tuple": True}, info


def test_truncation_is_reported_once_and_refused_when_strict(rel):
    info = _section(rel, "truncated")
    assert info["rows"] == [127, 20], info  # upstream behaviour kept
    assert len(info["warnings"]) == 1, info
    w = info["warnings"][0]
    assert "1 of 2 sequence(s) are longer than max_model_len - 1 = 127" in w, w
    assert "by 173 tokens" in w, w
    assert info["strict"]["raised"] == "CompatError", info
    assert "strict" in info["strict"]["message"], info
    assert info["strict_untouched"], info


def _names_dead_worker(e, pid):
    assert e["raised"] == "CompatError", e
    assert f"pid {pid}" in e["message"] and "SIGKILL" in e["message"], e
    assert "new VllmHiddenStatesGenerator" in e["message"], e


def test_worker_killed_during_a_call_is_named_then_and_later(rel):
    info = _section(rel, "killed_during_call")
    _names_dead_worker(info["failed"], info["pid"])
    _names_dead_worker(info["next_call"], info["pid"])


def test_worker_killed_while_idle_is_named(rel):
    info = _section(rel, "killed_while_idle")
    _names_dead_worker(info["next_call"], info["pid"])
    _names_dead_worker(info["again"], info["pid"])


def test_generator_alive_at_exit_stops_its_workers_cleanly():
    """A script ending with its generator alive exits 0 without an ignored exception or
    traceback, and leaves no vLLM worker behind."""
    require_speculators()
    r = run_script("exit_alive.py", "--model", checkpoint("llama"))
    assert r["child"].get("returned") == 2 and r["child"].get("applied"), r
    assert r["rc"] == 0, r["tail"]
    assert not r["ignored_exception"] and not r["traceback"], r["tail"]
    assert r["workers_left"] == [], r
