"""How benchmarks/gpu_bench.py decides its targets when files of several calls and
machines are merged: from ratios measured in the same run, not from medians pooled over
machines; files of different model depths are not merged; ``--model-layers`` builds its
own shallower model. Toy result files; no vLLM, no GPU."""

import argparse
import importlib.util
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("gpu_bench_under_test",
                                               ROOT / "benchmarks" / "gpu_bench.py")
gb = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(gb)

B = "b:0.4.0.1"


def _file(**tokens_per_s) -> dict:
    """One call's file: one round of each mode given, batch 32."""
    mode = {"a": "a", "c": "c", "b": B}
    return {"runs": [{"mode": mode[k], "round": 0, "ok": True,
                      "passes": [{"batch": 32, "tokens_per_s": v}]}
                     for k, v in tokens_per_s.items()]}


def test_b_against_c_is_judged_within_each_run():
    # (b) beat (c) in both runs; a third machine's faster (c) alone would make the pooled
    # medians say otherwise (101.5 / 110 = 0.92).
    docs = [_file(a=100, c=90, b=92), _file(a=120, c=110, b=111), _file(c=130)]
    ratio = gb.aggregate(docs)["ratios"][f"{B}@32/c@32"]
    assert round(ratio["medians"], 3) == round(101.5 / 110, 3)
    value, text = gb._target_ratio(ratio, " × (c)")
    assert abs(value - (92 / 90 + 111 / 110) / 2) < 1e-12 and value >= 1.0
    assert text == "1.016 × (c) (same run: 1.009–1.022, n 2)"
    # (b)/(a) the same way
    value, text = gb._target_ratio(gb.aggregate(docs)["ratios"][f"{B}@32/a@32"])
    assert abs(value - (0.92 + 111 / 120) / 2) < 1e-12
    assert text.endswith("(same run: 0.920–0.925, n 2)")


def test_without_a_common_run_the_value_says_so():
    docs = [_file(b=92), _file(c=110)]
    value, text = gb._target_ratio(gb.aggregate(docs)["ratios"][f"{B}@32/c@32"], " × (c)")
    assert round(value, 3) == round(92 / 110, 3)
    assert text.endswith("(medians of different runs)")


def test_render_refuses_to_merge_models_of_different_depths(tmp_path):
    # A --model-layers run (a shallower stand-in for a faster forward) keys its rows like
    # the full model's; merged, its tokens/s would be averaged into the 32-layer rows.
    full, half = _file(a=100, b=95), _file(a=200, b=150)
    full["params"] = {"model_config": {"num_hidden_layers": 32}}
    half["build"] = {"config": {"num_hidden_layers": 16}}
    files = []
    for name, doc in (("full", full), ("half", half)):
        (tmp_path / f"{name}.json").write_text(json.dumps(doc))
        files.append(str(tmp_path / f"{name}.json"))
    args = argparse.Namespace(files=files, plot=None, update_docs=False, docs=None)
    with pytest.raises(SystemExit, match=r"different depths \(\[16, 32\] layers\)"):
        gb.render_main(args)


def test_model_layers_builds_a_shallower_model_with_its_own_checkpoint():
    parse = gb.run_parser().parse_args
    full = parse([])
    assert gb.run_config(full)["layers"] == [2, 16, 29, 31]
    assert gb.run_config(full)["model"]["num_hidden_layers"] == 32
    assert gb.checkpoint_name(full) == "llama3-8b-shape"
    half = parse(["--model-layers", "16"])
    cfg = gb.run_config(half)
    assert cfg["model"]["num_hidden_layers"] == 16 and cfg["layers"] == [2, 8, 13, 15]
    assert cfg["model"]["hidden_size"] == 4096  # the same width: the same bytes per token
    assert gb.FULL["model"]["num_hidden_layers"] == 32  # the default left alone
    assert gb.checkpoint_name(half) == "llama3-8b-shape-16l"
    with pytest.raises(SystemExit, match="the model has 16 layers"):
        gb.run_config(parse(["--model-layers", "16", "--layers", "2,16"]))
    with pytest.raises(SystemExit, match="full-size model"):
        gb.run_config(parse(["--model-layers", "16", "--tiny"]))
