"""The architecture matrix: records -> the package's ``families`` -> doctor's verdict.

Made-up records in a temporary results folder: the newest record per architecture,
release, level and speculators release counts; a run of other adapter code is marked
not current and not counted; a failure keeps its reason; doctor's text names what was
recorded where the installed release was not proven.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from speculators_compat import _matrix_proof

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools" / "matrix"))
import matrix_families  # noqa: E402


def _write(folder: Path, name: str, digest: str, runs: list[dict]) -> None:
    (folder / name).write_text(json.dumps({"meta": {"shim_src": digest}, "runs": runs}))


def _run(arch: str, release: str, ok: bool, why: str | None = None) -> dict:
    return {"architecture": arch, "release": release, "ok": ok, "why": why}


@pytest.fixture
def results(tmp_path):
    _write(tmp_path, "families-gpu-h100-vllm-0.34.0-2026-12-05.json", "sha256:old",
           [_run("Gemma4ForCausalLM", "0.4.0.1", False, "KV groups"),
            _run("Qwen3NextForCausalLM", "0.4.0.1", True)])
    _write(tmp_path, "families-gpu-h100-vllm-0.34.0-2026-12-06.json", "sha256:now",
           [_run("Gemma4ForCausalLM", "0.4.0.1", True),
            _run("Gemma4ForCausalLM", "0.3.0", True),
            _run("KimiLinearForCausalLM", "0.4.0.1", False, "differs at layer 0")])
    _write(tmp_path, "families-cpu-vllm-0.32.0-2026-12-06.json", "sha256:now",
           [_run("Gemma4ForCausalLM", "0.4.0.1", True)])
    return tmp_path


def test_newest_record_counts_and_currency_follows_the_digest(results):
    fams = matrix_families.families(results, "sha256:now")
    gemma = fams["Gemma4ForCausalLM"]
    assert gemma["0.34.0"]["gpu"] == {"passed": ["0.3.0", "0.4.0.1"], "failed": {},
                                      "recorded": "2026-12-06", "current": True,
                                      "older": []}
    assert gemma["0.32.0"]["cpu-e2e"]["passed"] == ["0.4.0.1"]
    assert fams["Qwen3NextForCausalLM"]["0.34.0"]["gpu"]["current"] is False  # old digest
    assert fams["KimiLinearForCausalLM"]["0.34.0"]["gpu"]["failed"] == {
        "0.4.0.1": "differs at layer 0"}


def test_page_shows_results_reasons_and_age(results):
    page = matrix_families.render_page(results, "sha256:now")
    assert "| `Gemma4ForCausalLM` | pass 0.3.0, 0.4.0.1 (2026-12-06) |" in page
    assert "(earlier adapter code)" in page.split("`Qwen3NextForCausalLM`")[1].split("\n")[0]
    assert "speculators 0.4.0.1: differs at layer 0" in page


def test_a_run_vllm_stopped_before_the_shim_is_not_called_a_failure(tmp_path):
    _write(tmp_path, "families-cpu-vllm-0.32.0-2026-12-06.json", "sha256:now",
           [_run("DeepseekV32ForCausalLM", "0.3.0", False,
                 "could not start: vLLM's CPU build has no sparse attention"),
            _run("DeepseekV32ForCausalLM", "0.4.0.1", False, "differs at layer 2")])
    row = matrix_families.render_page(tmp_path, "sha256:now").split(
        "| `DeepseekV32ForCausalLM` |")[1].split("\n")[0]
    assert "**fail** 0.4.0.1; could not start 0.3.0 (2026-12-06)" in row


def test_doctor_verdict(results, monkeypatch):
    fams = matrix_families.families(results, "sha256:now")
    monkeypatch.setattr(_matrix_proof, "families", lambda: fams)
    ok = _matrix_proof.family_verdict(["Gemma4ForConditionalGeneration", "Gemma4ForCausalLM"],
                                "0.34.0+cu130", "0.4.0.1")
    assert ok["proven"] and ok["level"] == "gpu" and ok["architecture"] == "Gemma4ForCausalLM"
    old = _matrix_proof.family_verdict(["Qwen3NextForCausalLM"], "0.34.0", "0.4.0.1")
    assert not old["proven"] and "earlier adapter code" in old["text"]
    failed = _matrix_proof.family_verdict(["KimiLinearForCausalLM"], "0.34.0", "0.4.0.1")
    assert not failed["proven"] and "differs at layer 0" in failed["text"]
    unknown = _matrix_proof.family_verdict(["FooForCausalLM"], "0.34.0", "0.4.0.1")
    assert not unknown["proven"] and "not in the architecture matrix" in unknown["text"]
    elsewhere = _matrix_proof.family_verdict(["Gemma4ForCausalLM"], "0.33.0", "0.4.0.1")
    assert not elsewhere["proven"] and "vLLM 0.34.0 GPU" in elsewhere["text"]


def test_a_wrong_verdict_fails_these_checks(results, monkeypatch):
    """Shown once: were a failed run counted, the verdict test above would fail."""
    fams = matrix_families.families(results, "sha256:now")
    fams["KimiLinearForCausalLM"]["0.34.0"]["gpu"]["passed"] = ["0.4.0.1"]
    monkeypatch.setattr(_matrix_proof, "families", lambda: fams)
    assert _matrix_proof.family_verdict(["KimiLinearForCausalLM"], "0.34.0", "0.4.0.1")["proven"]


def test_doctor_names_a_refused_model(tmp_path):
    """``doctor --model`` on a config the generator refuses (DeepSeek-V4's hyper-connection
    streams, read as JSON: nothing loaded) gives the refusal, not a matrix verdict."""
    import json

    from speculators_compat.__main__ import _model_family

    (tmp_path / "config.json").write_text(json.dumps(
        {"architectures": ["DeepseekV4ForCausalLM"], "model_type": "deepseek_v4",
         "hc_mult": 4}))
    v = _model_family(str(tmp_path), {"vllm": "0.34.0", "speculators": "0.4.0.1"})
    assert v["refused"] and not v["proven"] and "4 residual streams" in v["text"], v
    (tmp_path / "config.json").write_text(json.dumps(
        {"architectures": ["LlamaForCausalLM"], "model_type": "llama"}))
    assert "refused" not in _model_family(str(tmp_path), {"vllm": "0.34.0",
                                                          "speculators": "0.4.0.1"})


def test_currency_is_per_speculators_release(results, monkeypatch):
    """A record that re-ran one release at today's code makes that release current; the
    other release's older record stays counted as older (page and doctor)."""
    _write(results, "families-gpu-h100-vllm-0.34.0-2026-12-07.json", "sha256:new",
           [_run("Gemma4ForCausalLM", "0.4.0.1", True)])
    fams = matrix_families.families(results, "sha256:new")
    e = fams["Gemma4ForCausalLM"]["0.34.0"]["gpu"]
    assert e["older"] == ["0.3.0"] and e["current"] is False
    page = matrix_families.render_page(results, "sha256:new")
    assert ("| `Gemma4ForCausalLM` | pass 0.4.0.1; pass 0.3.0 (earlier adapter code) "
            "(2026-12-07) |") in page
    monkeypatch.setattr(_matrix_proof, "families", lambda: fams)
    assert _matrix_proof.family_verdict(["Gemma4ForCausalLM"], "0.34.0", "0.4.0.1")["proven"]
    old = _matrix_proof.family_verdict(["Gemma4ForCausalLM"], "0.34.0", "0.3.0")
    assert not old["proven"] and "earlier adapter code" in old["text"]
