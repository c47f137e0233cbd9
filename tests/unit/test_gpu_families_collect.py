"""``gpu_families.py --collect``: the record of a call cut short, from its runs folder.

A finished run is recorded as the runner records it (architecture from the checkpoint,
per-layer cosines, the known-wrong verdicts, versions from the run's own report); a run
without its JSON is listed as unfinished, never as a failure; a failed run stays failed.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "tests" / "e2e" / "scripts" / "gpu_families.py"


def _run_json(ok: bool) -> dict:
    layer = {"min_cosine": 0.99995, "max_rel_abs_err": 0.01, "max_rel_l2_err": 0.01}
    return {"ok": ok, "batches": [{"size": 1, "returned": 1, "input_order": True,
                                   "compare": {"ok": ok, "per_layer": [layer, layer]}}],
            "known_wrong": {"correct": ok, "rows_one_late": False},
            "report": {"versions": {"vllm": "0.34.0", "torch": "2.14.0",
                                    "transformers": "5.20.2"}}}


def test_collect_records_finished_runs_and_lists_the_rest(tmp_path):
    ckpts, runs = tmp_path / "ckpts", tmp_path / "runs"
    for fam, arch in (("llama", "LlamaForCausalLM"), ("gemma4", "Gemma4ForCausalLM")):
        (ckpts / fam).mkdir(parents=True)
        (ckpts / fam / "config.json").write_text(json.dumps(
            {"architectures": [arch], "model_type": fam}))
    runs.mkdir()
    (runs / "llama-0.4.0.1.json").write_text(json.dumps(_run_json(True)))
    (runs / "llama-0.3.0.json").write_text(json.dumps(_run_json(False)))
    (runs / "llama-0.3.0.log").write_text("Traceback (most recent call last):\nValueError: x\n")
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--collect", "--ckpts", str(ckpts), "--out", str(runs),
         "--spec", "0.4.0.1=x", "--spec", "0.3.0=y", "--families", "llama,gemma4"],
        capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 1, proc.stderr  # a failed run makes the record fail
    record = json.loads((runs / "families.json").read_text())
    by = {(r["family"], r["release"]): r for r in record["runs"]}
    assert set(by) == {("llama", "0.4.0.1"), ("llama", "0.3.0")}
    ok = by["llama", "0.4.0.1"]
    assert ok["ok"] and ok["architecture"] == "LlamaForCausalLM"
    assert ok["batches"][0]["per_layer_min_cosine"] == [0.99995, 0.99995]
    assert not by["llama", "0.3.0"]["ok"] and "ValueError" in by["llama", "0.3.0"]["log_tail"]
    assert record["unfinished"] == ["gemma4-0.4.0.1", "gemma4-0.3.0"]
    assert record["meta"]["vllm"] == "0.34.0" and record["meta"]["shim_src"].startswith("sha256:")
    assert record["collected"] is True
