"""``doctor`` and the report say whether the support matrix proved the installed vLLM.

The package ships a copy of the matrix's results (``_proven.json``, written by
``tools/matrix/matrix.py render``): it must be current with docs/support-matrix.json and the GPU
result files. What counts as proven (``tools/matrix/matrix_proven.py``) and what the package
says about it (``speculators_compat._matrix_proof``) are checked on made-up results.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from speculators_compat import _matrix_proof

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools" / "matrix"))
import matrix_proven  # noqa: E402
import matrix_render  # noqa: E402

SPECS = ("0.3.0", "0.4.0.1")


def test_shipped_copy_is_current():
    data = json.loads((ROOT / "docs" / "support-matrix.json").read_text())
    assert Path(_matrix_proof.FILE).read_text() == matrix_render.render_proven(data), (
        "src/speculators_compat/_proven.json is out of date: run python3 tools/matrix/matrix.py "
        "render")


def test_shipped_copy_is_package_data():
    text = (ROOT / "pyproject.toml").read_text()
    assert 'speculators_compat = ["_proven.json"]' in text


# --------------------------------------------------------------------------- what is proven

def row(contract_failed=0, llama="pass", deepseek="pass", supported=True):
    return {"doctor": {"supported": supported, "adapters": {"a": {"status": "applied"}}},
            "range_disagreements": [], "contract": {"failed": contract_failed},
            "e2e": {"llama": {"status": llama}, "deepseek_v3": {"status": deepseek}}}


def env(vllm, level="e2e", **specs):
    return {"level": level, "versions": {"vllm": vllm}, "recorded": "2026-12-03",
            "speculators": {s.replace("_", "."): r for s, r in specs.items()}}


def test_rows_that_hold(tmp_path):
    data = {"envs": {
        "a": env("0.32.0", **{"0_3_0": row(), "0_4_0_1": row(deepseek="not-run")}),
        "b": env("0.16.0+cpu", **{"0_3_0": row(contract_failed=1), "0_4_0_1": row()}),
        "c": env("0.20.0", **{"0_3_0": row(llama="fail"), "0_4_0_1": row(deepseek="fail")}),
        "d": env("0.34.0", level="contract", **{"0_3_0": row(llama="not-run"),
                                                "0_4_0_1": row(supported=False)}),
    }}
    out = matrix_proven.proven(data, tmp_path, SPECS)["releases"]
    assert out["0.32.0"]["cpu-e2e"]["speculators"] == ["0.3.0", "0.4.0.1"]
    assert out["0.16.0"]["cpu-e2e"]["speculators"] == ["0.4.0.1"]  # local part dropped
    assert "0.20.0" not in out  # an e2e failure proves nothing
    assert out["0.34.0"] == {"contract": {"speculators": ["0.3.0"], "recorded": "2026-12-03",
                                          "shim": None}}


def test_gpu_level_from_the_newest_file_per_release(tmp_path):
    def gpu(name, started, oks):
        runs = [{"spec": "0.4.0.1", "ok": ok} for ok in oks]
        (tmp_path / name).write_text(json.dumps({
            "meta": {"vllm": "0.34.0", "started": started, "shim": "abc1234 (note)"},
            "runs": runs}))

    gpu("gpu-h200-vllm-0.34.0-a.json", 1796140545, [True, True])
    (tmp_path / "gpu-models-h200-vllm-0.34.0.json").write_text("{}")  # another format
    out = matrix_proven.proven({"envs": {}}, tmp_path, SPECS)["releases"]
    assert out == {"0.34.0": {"gpu": {"speculators": ["0.4.0.1"], "recorded": "2026-12-01",
                                      "shim": "abc1234", "current": False}}}
    gpu("gpu-h200-vllm-0.34.0-b.json", 1796240545, [True, False])  # newer, one failed
    assert matrix_proven.proven({"envs": {}}, tmp_path, SPECS)["releases"] == {}


def test_gpu_entry_is_current_only_at_the_matrix_adapter_code(tmp_path):
    def gpu(src):
        meta = {"vllm": "0.34.0", "started": 1796140545, "shim": "abc1234"}
        if src:
            meta["shim_src"] = src
        (tmp_path / "gpu-h200-vllm-0.34.0.json").write_text(json.dumps({
            "meta": meta, "runs": [{"spec": "0.3.0", "ok": True}]}))
        return matrix_proven.proven(data, tmp_path, SPECS)["releases"]["0.34.0"]["gpu"]

    r = row()
    for part in (r["doctor"], r["contract"], *r["e2e"].values()):
        part["shim_src"] = "sha256:today"
    data = {"envs": {"a": env("0.32.0", **{"0_3_0": r})}}
    assert gpu("sha256:today")["current"] is True
    assert gpu("sha256:older")["current"] is False
    assert gpu(None)["current"] is False  # a file that recorded no digest proves no code
    r["contract"]["shim_src"] = "sha256:other"  # a matrix of two codes: nothing is current
    assert gpu("sha256:today")["current"] is False


# --------------------------------------------------------------------------- what it says

TABLE = {
    "0.26.0": {"gpu": {"speculators": ["0.3.0", "0.4.0.1"], "recorded": "d1", "shim": "g"},
               "cpu-e2e": {"speculators": ["0.3.0", "0.4.0.1"], "recorded": "d2", "shim": "c"}},
    "0.32.0": {"cpu-e2e": {"speculators": ["0.3.0", "0.4.0.1"], "recorded": "d3", "shim": "s"}},
    "0.11.0": {"cpu-e2e": {"speculators": ["0.3.0"], "recorded": "d4", "shim": "s"}},
    "0.34.0": {"contract": {"speculators": ["0.3.0", "0.4.0.1"], "recorded": "d5",
                            "shim": "s"}},
}


@pytest.fixture
def table(monkeypatch):
    monkeypatch.setattr(_matrix_proof, "releases", lambda: TABLE)


def test_best_level_wins(table):
    v = _matrix_proof.verdict("0.26.0", "0.4.0.1")
    assert v["proven"] and v["level"] == "gpu" and v["shim"] == "g"
    assert "GPU" in v["text"] and "newest_proven" not in v


def test_gpu_run_of_older_adapter_code_is_named_not_counted(monkeypatch):
    older = {"speculators": ["0.3.0", "0.4.0.1"], "recorded": "d1", "shim": "g",
             "current": False}
    monkeypatch.setattr(_matrix_proof, "releases", lambda: {
        **TABLE, "0.26.0": {**TABLE["0.26.0"], "gpu": older},
        "0.34.0": {**TABLE["0.34.0"], "gpu": older}, "0.33.0": {"gpu": older}})
    v = _matrix_proof.verdict("0.26.0", "0.4.0.1")
    assert v["level"] == "cpu-e2e" and v["shim"] == "c"
    assert v["older_gpu"] == {"speculators": ["0.3.0", "0.4.0.1"], "recorded": "d1",
                              "shim": "g"}
    assert v["text"].endswith("a GPU run passed on d1 at shim commit g, with older adapter "
                              "code than this release of speculators-compat (not counted)")
    assert _matrix_proof.short("0.26.0", "0.4.0.1") == "matrix: proven, CPU e2e"
    v = _matrix_proof.verdict("0.34.0", "0.3.0")
    assert v["level"] == "contract" and "older adapter code" in v["text"]
    v = _matrix_proof.verdict("0.33.0", "0.3.0")  # nothing current: not proven
    assert not v["proven"] and "other_speculators" not in v
    assert "not a release the support matrix proved" in v["text"]
    assert _matrix_proof.newest() == ("0.34.0", "contract")


def test_cpu_build_version_and_local_part(table):
    v = _matrix_proof.verdict("0.32.0+cpu", "0.3.0")
    assert v["vllm"] == "0.32.0" and v["level"] == "cpu-e2e"
    assert v["text"].startswith("vLLM 0.32.0 is proven by the support matrix: CPU e2e")
    assert _matrix_proof.short("0.32.0", "0.3.0") == "matrix: proven, CPU e2e"


def test_contract_level_names_the_newest_end_to_end(table):
    v = _matrix_proof.verdict("0.34.0", "0.4.0.1")
    assert v["level"] == "contract"
    assert "contract: probes only" in v["text"]
    assert "newest run end to end: 0.32.0 (CPU e2e)" in v["text"]


def test_unproven_release_names_the_newest(table):
    v = _matrix_proof.verdict("0.30.0", "0.4.0.1")
    assert not v["proven"] and v["level"] is None
    assert v["newest_proven"] == {"vllm": "0.34.0", "level": "contract"}
    assert v["newest_end_to_end"] == {"vllm": "0.32.0", "level": "cpu-e2e"}
    assert "not a release the support matrix proved" in v["text"]
    assert _matrix_proof.short("0.30.0", "0.4.0.1") == ("matrix: not proven (newest proven: "
                                                  "0.34.0, contract: probes only)")


def test_proven_with_another_speculators_only(table):
    v = _matrix_proof.verdict("0.11.0", "0.4.0.1")
    assert not v["proven"] and v["other_speculators"] == ["0.3.0"]
    assert "only with speculators 0.3.0, not 0.4.0.1" in v["text"]


def test_report_carries_the_verdict(make_activation, toy, table, monkeypatch):
    from speculators_compat import _env, _versions

    monkeypatch.setenv(_env.VLLM_VERSION, "0.32.0")
    _versions.clear_cache()
    try:
        rep = make_activation(toy("a")).activate()
    finally:
        _versions.clear_cache()
    assert rep.as_dict()["proven"]["vllm"] == rep.versions["vllm"] == "0.32.0"
    assert "; matrix: " in rep.summary_line()
