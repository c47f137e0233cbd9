"""The architecture page's real-shape lines (tools/matrix/matrix_families.real_shapes): the
newest generator run per (family model, speculators release), its lowest cosine or error."""

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tools" / "matrix"))

import matrix_families as mf  # noqa: E402


def _record(path: Path, runs: list[dict]) -> None:
    path.write_text(json.dumps({"meta": {}, "runs": runs}))


def _gen(model: str, ok: bool, cos: float | None = None, error: str | None = None) -> dict:
    run = {"id": f"gen:{model}:0.4.0.1", "kind": "gen", "model": model, "spec": "0.4.0.1",
           "tp": 1, "ok": ok}
    if cos is not None:
        run["checks"] = {"transformers": {"ok": ok, "min_cosine": cos}}
    if error is not None:
        run["error"] = error + "\ntraceback line"
    return run


def test_newest_run_of_each_family_model_wins(tmp_path):
    _record(tmp_path / "gpu-models-h200-vllm-0.34.0-2026-12-04.json",
            [_gen("gemma4", False, error="RuntimeError: old"), _gen("qwen3_moe", True, 0.9)])
    _record(tmp_path / "gpu-models-h100-vllm-0.34.0-2026-12-06.json",
            [_gen("gemma4", True, 0.99991), _gen("qwen3_5_moe", False, error="ImportError: x"),
             {"id": "build:gemma4", "kind": "build", "model": "gemma4", "ok": True}])
    lines = mf.real_shapes(tmp_path)
    assert len(lines) == 2  # qwen3_moe is not one of this page's families; builds are not runs
    gemma, qwen = lines
    assert "`gemma4`" in gemma and "pass, lowest cosine 0.99991 against transformers" in gemma
    assert "2026-12-06" in gemma and "H100" in gemma
    assert "`qwen3_5_moe`" in qwen and "**did not pass**: `ImportError: x`" in qwen
    assert "traceback" not in qwen
