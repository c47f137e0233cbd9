"""Report contents/serialisation, and the public activate/deactivate/report/save_report API
(over a toy global activation: the real registry probes vLLM)."""

from __future__ import annotations

import json
import os

import pytest

import speculators_compat
from speculators_compat import _env
from speculators_compat._adapter import Phase, Verdict
from speculators_compat._errors import CompatError
from speculators_compat._report import Status

VERSION_KEYS = {"speculators_compat", "vllm", "speculators", "torch", "transformers"}


@pytest.fixture
def mixed(toy):
    return [
        toy("applied_one", upstream="vllm PR #1", vllm_range=">=0.12.0.dev0"),
        toy("not_needed_one", verdict=Verdict.not_needed("fixed upstream")),
        toy("mismatch_one", verdict=Verdict.mismatch("unknown shape")),
        toy("failed_one", verdict=RuntimeError("probe boom")),
        toy("disabled_one", phase=Phase.BOTH),
    ]


@pytest.fixture
def report(make_activation, mixed, monkeypatch):
    monkeypatch.setenv(_env.DISABLE, "disabled_one")
    return make_activation(*mixed).activate()


def test_as_dict_is_json_serialisable_and_complete(report):
    d = report.as_dict()
    assert json.loads(json.dumps(d)) == d
    assert set(d["versions"]) == VERSION_KEYS
    assert d["speculators_compat"] == d["versions"]["speculators_compat"]
    assert d["pid"] == os.getpid()
    assert d["process"] == "driver"
    assert d["active"] is True
    assert d["strict"] is False
    adapters = {a["name"]: a for a in d["adapters"]}
    assert list(adapters) == ["applied_one", "not_needed_one", "mismatch_one", "failed_one",
                              "disabled_one"]
    assert {n: a["status"] for n, a in adapters.items()} == {
        "applied_one": "applied",
        "not_needed_one": "not-needed",
        "mismatch_one": "mismatch",
        "failed_one": "failed",
        "disabled_one": "disabled",
    }
    for a in adapters.values():
        assert type(a["status"]) is str
        assert {"name", "status", "reason", "upstream", "summary", "phase", "vllm_range",
                "changes"} <= set(a)
        assert isinstance(a["reason"], str) and a["reason"]
    assert adapters["applied_one"]["upstream"] == "vllm PR #1"
    assert adapters["applied_one"]["vllm_range"] == ">=0.12.0.dev0"
    assert adapters["not_needed_one"]["reason"] == "fixed upstream"
    assert "probe boom" in adapters["failed_one"]["reason"]
    assert adapters["disabled_one"]["phase"] == "both"


def test_versions_reflect_vllm_override(make_activation, toy, monkeypatch):
    monkeypatch.setenv(_env.VLLM_VERSION, "0.30.1.dev202609231158")
    rep = make_activation(toy("a")).activate()
    assert rep.versions["vllm"] == "0.30.1.dev202609231158"
    assert rep.as_dict()["versions"]["vllm"] == "0.30.1.dev202609231158"


def test_to_json_writes_file(report, tmp_path):
    path = tmp_path / "report.json"
    text = report.to_json(path)
    written = path.read_text(encoding="utf-8")
    assert written == text + "\n"
    assert json.loads(written) == report.as_dict()


def test_to_json_without_path_writes_nothing(report, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    text = report.to_json(indent=None)
    assert "\n" not in text
    assert json.loads(text) == report.as_dict()
    assert list(tmp_path.iterdir()) == []


def test_report_file_env_makes_activate_write_it(make_activation, toy, tmp_path, monkeypatch):
    path = tmp_path / "provenance.json"
    monkeypatch.setenv(_env.REPORT_FILE, str(path))
    rep = make_activation(toy("a")).activate()
    data = json.loads(path.read_text(encoding="utf-8"))
    assert data == rep.as_dict()
    assert data["adapters"][0]["name"] == "a"


def test_report_file_written_by_the_driver_only(make_activation, toy, tmp_path, monkeypatch):
    path = tmp_path / "provenance.json"
    monkeypatch.setenv(_env.REPORT_FILE, str(path))
    make_activation(toy("a")).activate(process="worker")
    assert not path.exists()


def test_report_file_not_written_on_strict_failure(make_activation, toy, tmp_path, monkeypatch):
    path = tmp_path / "provenance.json"
    monkeypatch.setenv(_env.REPORT_FILE, str(path))
    act = make_activation(toy("a", verdict=Verdict.mismatch("x")))
    with pytest.raises(CompatError):
        act.activate(strict=True)
    assert not path.exists()


def test_str_lists_every_adapter(report):
    text = str(report)
    lines = text.splitlines()
    assert lines[0] == report.summary_line()
    assert len(lines) == 1 + len(report.results)
    for r, line in zip(report.results, lines[1:]):
        assert r.name in line and r.status.value in line and r.reason in line


def test_summary_line_counts_and_applied(report):
    line = report.summary_line()
    assert f"pid {os.getpid()}" in line
    assert "in driver" in line
    for status in ("applied", "not-needed", "mismatch", "failed", "disabled"):
        assert f"1 {status}" in line
    assert line.endswith("applied: upstream-change: applied_one")


def test_getitem_by_status_and_problems(report):
    assert report["failed_one"].status is Status.FAILED
    with pytest.raises(KeyError):
        report["nope"]
    assert report.applied == ["applied_one"]
    assert report.by_status(Status.DISABLED) == ["disabled_one"]
    assert [r.name for r in report.problems] == ["mismatch_one", "failed_one"]


def test_str_with_no_adapters(make_activation):
    rep = make_activation().activate()
    assert str(rep) == rep.summary_line()
    assert "applied: none" in rep.summary_line()


def test_adapter_describe(toy):
    d = toy("a", upstream="u", vllm_range="<1").describe()
    assert d["name"] == "a" and d["upstream"] == "u" and d["vllm_range"] == "<1"
    assert d["phase"] == "driver"
    json.dumps(d)


# --------------------------------------------------------------------------- public API


def test_public_api_roundtrip(toy_global, toy, tmp_path):
    a, b = toy("a"), toy("b")
    act = toy_global(a, b)
    assert speculators_compat.report() is None
    rep = speculators_compat.activate(only=["a"])
    assert rep is act.report
    assert speculators_compat.report() is rep
    assert rep.process == "driver"
    assert rep.applied == ["a"] and rep["b"].status is Status.DISABLED
    assert speculators_compat.activate() is rep
    assert a.apply_calls == 1
    assert os.environ[_env.ACTIVE] == "1"

    path = tmp_path / "r.json"
    text = speculators_compat.save_report(path)
    assert json.loads(path.read_text(encoding="utf-8")) == json.loads(text) == rep.as_dict()

    speculators_compat.deactivate()
    assert speculators_compat.report() is None
    assert _env.ACTIVE not in os.environ
    with pytest.raises(CompatError, match="not active"):
        speculators_compat.save_report(tmp_path / "again.json")
    assert not (tmp_path / "again.json").exists()


def test_save_report_raises_when_never_active(toy_global, toy, tmp_path):
    toy_global(toy("a"))
    with pytest.raises(CompatError):
        speculators_compat.save_report(tmp_path / "r.json")


def test_public_activate_strict(toy_global, toy):
    toy_global(toy("a"), toy("bad", verdict=Verdict.mismatch("nope")))
    with pytest.raises(CompatError, match="bad"):
        speculators_compat.activate(strict=True)
    assert speculators_compat.report() is None
    assert _env.ACTIVE not in os.environ


def test_public_exports():
    for name in speculators_compat.__all__:
        assert hasattr(speculators_compat, name), name
    assert issubclass(speculators_compat.CompatError, RuntimeError)
