"""How benchmarks/gpu/gpu_bench_render.py decides the GPU benchmark's targets when files of
several calls and machines are merged: from ratios measured in the same run and round, not
from medians pooled over machines; per loop; the rounds of one run within 3%; (b)'s peak
RSS against (c)'s; files of different model depths are not merged. And how
benchmarks/gpu/gpu_bench.py plans a call (``--model-layers``, the passes of a child, the
children). Toy result files; no vLLM, no GPU."""

import argparse
import importlib.util
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _load(name: str):
    spec = importlib.util.spec_from_file_location(f"{name}_under_test",
                                                  ROOT / "benchmarks" / "gpu" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


gb = _load("gpu_bench")
gr = _load("gpu_bench_render")

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
    ratio = gr.aggregate(docs)["ratios"][((B, "held", 32), "c")]
    assert round(ratio["medians"], 3) == round(101.5 / 110, 3)
    value, text = gr._target_ratio(ratio, " × (c)")
    assert abs(value - (92 / 90 + 111 / 110) / 2) < 1e-12 and value >= 1.0
    assert text == "1.016 × (c) (same run: 1.009–1.022, n 2)"
    # (b)/(a) the same way
    value, text = gr._target_ratio(gr.aggregate(docs)["ratios"][((B, "held", 32), "a")])
    assert abs(value - (0.92 + 111 / 120) / 2) < 1e-12
    assert text.endswith("(same run: 0.920–0.925, n 2)")


def test_without_a_common_run_the_value_says_so():
    docs = [_file(b=92), _file(c=110)]
    value, text = gr._target_ratio(gr.aggregate(docs)["ratios"][((B, "held", 32), "c")],
                                   " × (c)")
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
        gr.render_main(args)


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


def _pass(loop, batch, rnd, tps, peak_kib=None, calls=None):
    ps = {"loop": loop, "batch": batch, "round": rnd, "tokens_per_s": tps}
    if peak_kib is not None:
        ps.update(peak_reset=True, peak_rss={"vmhwm_kib": peak_kib})
    if calls is not None:
        ps.update(calls_s=[1.0] * len(calls), calls_tokens=calls)
    return ps


def _loops_file(b_r0=96.0, b_r1=97.0, b_peak=2**20, c_peak=2**20) -> dict:
    """One call of the current layout: (a), (c) and (b), two rounds in shared processes,
    the offline loop at batch 32."""
    return {"params": {"rounds": 2, "round_procs": "shared"}, "runs": [
        {"mode": "a", "rounds": [0, 1], "ok": True,
         "passes": [_pass(None, 32, 0, 100.0, calls=[100, 100, 100]),
                    _pass(None, 32, 1, 100.0, calls=[100, 101, 99])]},
        {"mode": "c", "rounds": [0, 1], "ok": True,
         "passes": [_pass("offline", 32, r, 95.0, c_peak) for r in (0, 1)]},
        {"mode": B, "rounds": [0, 1], "ok": True, "skipped": [
            {"round": 1, "batch": 8, "loop": "held", "why": "deadline: 3s left"}],
         "passes": [_pass("offline", 32, 0, b_r0, b_peak, calls=[96, 97, 95]),
                    _pass("offline", 32, 1, b_r1, b_peak)]}]}


def _target_lines(doc) -> dict[str, str]:
    """The target cells of (b)'s offline row at batch 32, by target."""
    lines = gr.render_markdown([doc]).splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("| (b) path |"))
    head = lines[at]
    row = next(line for line in lines[at:] if line.startswith(f"| (b) speculators {B[2:]}")
               and "| offline script's loop | 32 |" in line)
    names = ["(b)/(a) ≥ 0.95", "(b) ≥ (c)", "rounds agree within 3%",
             "(b) driver peak RSS ≤ (c)'s"]
    assert head.split("|")[4].strip() == names[0] and "rounds within 3%" in head
    return dict(zip(names, [c.strip() for c in row.split("|")[4:8]]))


def test_targets_per_loop_from_the_same_round():
    agg = gr.aggregate([_loops_file()])
    r = agg["ratios"][((B, "offline", 32), "a")]
    assert r["by_round"] == {(0, 0): 0.96, (0, 1): 0.97}
    assert r["noise"]["n"] == 1  # round 1 of (b) recorded no per-call tokens: no noise
    lines = _target_lines(_loops_file())
    assert "0.965 ± 0.0" in lines["(b)/(a) ≥ 0.95"] and "✅" in lines["(b)/(a) ≥ 0.95"]
    assert "× (c)" in lines["(b) ≥ (c)"] and "✅" in lines["(b) ≥ (c)"]
    assert "✅" in lines["(b) driver peak RSS ≤ (c)'s"]
    assert "✅" in lines["rounds agree within 3%"]
    md = gr.render_markdown([_loops_file()])
    assert "every result held" not in md  # only the loop that ran


def test_targets_fail_where_the_run_says_so():
    lines = _target_lines(_loops_file(b_r0=92.0, b_r1=96.0, b_peak=2**20 + 1))
    assert "0.940 ± " in lines["(b)/(a) ≥ 0.95"]  # the median of 0.92 and 0.96
    assert "❌" in lines["(b)/(a) ≥ 0.95"]
    assert "❌" in lines["rounds agree within 3%"]  # 92 vs 96: 4.3 %
    assert "❌" in lines["(b) driver peak RSS ≤ (c)'s"]
    lines = _target_lines(_loops_file(b_r0=94.0, b_r1=94.0))
    assert "❌" in lines["(b)/(a) ≥ 0.95"] and "❌" in lines["(b) ≥ (c)"]


def test_skipped_passes_and_legacy_hold_are_reported():
    md = gr.render_markdown([_loops_file()])
    assert "held, batch 8: not run (deadline: 3s left)" in md
    legacy = {"runs": [{"mode": B, "hold": "call", "ok": True,
                        "passes": [{"batch": 32, "tokens_per_s": 1.0}]},
                       {"mode": "c", "hold": "call", "ok": True,
                        "passes": [{"batch": 32, "tokens_per_s": 1.0}]}]}
    rows = set(gr.aggregate([legacy])["tokens_per_s"])
    # --hold call dropped (b)'s results; (c) held every result whatever --hold said
    assert rows == {(B, "dropped", 32), ("c", "held", 32)}


def test_a_child_runs_every_round_batch_and_loop_in_order():
    p = {"mode": B, "batches": "32,8", "rounds": [0, 1], "loops": ["offline", "held"]}
    assert gb.pass_plan(p) == [(0, 32, "offline"), (0, 32, "held"), (0, 8, "offline"),
                               (0, 8, "held"), (1, 8, "offline"), (1, 8, "held"),
                               (1, 32, "offline"), (1, 32, "held")]
    assert gb.pass_plan({**p, "mode": "a"}) == [(0, 32, None), (0, 8, None), (1, 8, None),
                                                (1, 32, None)]
    modes = ["a", "c", B]
    assert gb.child_jobs(modes, 2, "shared") == [(m, [0, 1]) for m in modes]
    assert gb.child_jobs(modes, 2, "fresh") == [("a", [0]), ("c", [0]), (B, [0]),
                                                ("c", [1]), (B, [1]), ("a", [1])]
    with pytest.raises(SystemExit, match="--loops"):
        gb.loops_arg("offline,kept")


def test_the_offline_script_table_renders_beside_and_its_file_is_named():
    script = {"kind": "offline_script", "machine": {"gpu": "NVIDIA H200"}, "runs": [
        {"release": "0.4.0.1", "batch_size": 8, "wall_s": 95.0, "ok": True,
         "versions": {"vllm": "0.34.0"},
         "timing": {"loop_s": 6.0, "samples_per_s": 42.7, "tokens_per_s": 38000.0},
         "check": {"ok": True, "files": 256, "tokens": 228000}}]}
    md = gr.render_markdown([_loops_file(), script], ["docs/results/g.json",
                                                      "docs/results/o.json"])
    files = next(line for line in md.splitlines() if line.startswith("Files: "))
    assert files == "Files: `docs/results/g.json`, `docs/results/o.json`."  # re-renderable
    row = next(line for line in md.splitlines() if line.startswith("| 0.4.0.1 |"))
    assert "| 256 | 228,000 | 8 | 6.00 | 42.7 | 38,000 |" in row and row.endswith("| yes |")


def test_the_worker_counters_are_shown_per_call_from_one_pass_to_the_next():
    def counters(hook, wait, tail, populate, copies=None):
        c = {"hook_s": hook, "staging_wait_s": wait, "tail_s": tail,
             "populate_s": populate, "streamed": 1}
        return [c if copies is None else {**c, "copies": copies}]

    passes = [
        {"loop": "held", "batch": 32, "calls_s": [0.7] * 3, "lead_in": {"seqs": 32},
         "transport": counters(0.5, 0.0, 0.01, 3.0, 64)},  # the first pass: no baseline
        {"loop": "held", "batch": 32, "calls_s": [0.7] * 3, "lead_in": {"seqs": 32},
         "transport": counters(0.54, 0.004, 0.0104, 4.2, 128)},
        {"loop": "held", "batch": 8, "calls_s": [0.2] * 4, "transport": [None]},
    ]
    lines = gr._worker_table([{"runs": [{"mode": B, "passes": passes}]}])
    row = next(line for line in lines if line.startswith("| (b)"))
    # (0.54 - 0.5) s over 3 calls and the lead-in: 10 ms a call; 300 ms of copy threads;
    # 64 copies over 4 calls
    assert row.endswith("| 32 | 1 | 10.0 | 1.0 | 0.1 | 300.0 | 16.0 |"), row
    old = [{**ps, "transport": [{k: v for k, v in (ps["transport"][0] or {}).items()
                                 if k != "copies"}]} for ps in passes[:2]]
    row = next(line for line in gr._worker_table([{"runs": [{"mode": B, "passes": old}]}])
               if line.startswith("| (b)"))
    assert row.endswith("| 300.0 | – |"), row  # a run from before the copies were counted
    assert len([line for line in lines if line.startswith("| (b)")]) == 1  # no counters
    assert gr._worker_table([{"runs": [{"mode": B, "passes": passes[:1]}]}]) == []


def test_steps_are_summarised_as_the_union_of_their_intervals():
    events = [("execute_model", 0.0, 0.1), ("sample_tokens", 0.05, 0.3),  # overlapping
              ("execute_model", 0.5, 0.6), ("sample_tokens", 0.6, 0.7)]
    got = gb.steps_summary(events)
    assert got["steps"] == 2
    assert abs(got["busy_s"] - 0.5) < 1e-9  # 0.0-0.3 and 0.5-0.7, not 0.6 summed
    assert abs(got["execute_s"] - 0.2) < 1e-9 and abs(got["sample_s"] - 0.35) < 1e-9


def test_the_steps_table_gives_each_call_its_worker_time_and_the_rest():
    passes = [{"loop": "held", "batch": 32, "calls_s": [0.74] * 3, "lead_in": {"seqs": 32},
               "worker_steps": [{"steps": 16, "busy_s": 2.8, "execute_s": 2.0,
                                 "sample_s": 0.8}]}]
    lines = gr._steps_table([{"runs": [{"mode": B, "passes": passes}]}])
    row = next(line for line in lines if line.startswith("| (b)"))
    # 16 steps and 2.8 s over 4 calls: 4 steps, 700 ms busy of a 740 ms call, 40 ms rest
    assert row.endswith("| 32 | 1 | 4.0 | 740.0 | 700.0 | 40.0 |"), row


def test_pass_calls_give_every_batch_size_the_same_number_of_calls():
    seqs = list(range(256))
    assert len(gb.pass_seqs(seqs, 32, {"pass_calls": 8})) == 256
    assert gb.pass_seqs(seqs, 8, {"pass_calls": 8}) == list(range(64))
    assert gb.pass_seqs(seqs, 8, {}) == seqs  # without --pass-calls: every sequence
    header = gr._header([{"params": {"num_seqs": 256, "pass_calls": 8}}], None)
    assert "of which a pass at batch B takes the first 8 × B (8 calls)" in header[-1]
    assert "per pass" in gr._header([{"params": {"num_seqs": 96}}], None)[-1]


def test_the_call_limit_lowers_the_deadline_and_never_raises_it():
    """``--end-by`` (from tools/gpu/gpu_bench.sh: the device call's start plus its limit, less
    a margin) caps ``--deadline``: a call whose kit install took a minute gets a minute
    less, and a deadline already inside the limit stays."""
    now = 1_000_000.0
    assert gb.capped_deadline(530, now + 600 - 60 - 36, now) == 504
    assert gb.capped_deadline(300, now + 504, now) == 300
    assert gb.capped_deadline(530, None, now) == 530
    assert gb.capped_deadline(530, now - 5, now) == 0.0


def test_the_parser_takes_end_by():
    a = gb.run_parser().parse_args(["--end-by", "1234.5", "--deadline", "400"])
    assert (a.end_by, a.deadline) == (1234.5, 400)


def test_check_file_holds_the_first_sequences_of_a_pass(tmp_path):
    """The check file is written once, from the pass's first calls: with the check set
    one call long, a later call must not overwrite it, or files of calls at different
    batch sizes hold different sequences under the same names."""
    pytest.importorskip("torch")
    pytest.importorskip("safetensors")
    import torch
    from safetensors import safe_open

    class Ex:
        def check_layers(self, batch, out):
            return [[torch.full((n, 4), float(n))] for n in batch]

    p = {"check_seqs": 2, "layers": [3], "work": str(tmp_path), "tokens_sha": "x",
         "model": "m", "mode": "b:0.4.0.1"}
    res: dict = {}
    keep = gb._CheckKeeper(p, Ex(), res)
    for batch in ([5, 6], [7, 8], [9, 10]):  # token counts stand in for sequences
        keep(batch, None)
    with safe_open(res["check_file"]["path"], "pt") as f:
        shapes = {k: tuple(f.get_tensor(k).shape) for k in f.keys()}  # noqa: SIM118
    assert shapes == {"0.3": (5, 4), "1.3": (6, 4)}


def test_short_call_runs_the_baseline_and_skips_the_last_paths():
    """A call too short for every path runs (a) first and skips the last ones: every
    ratio needs (a), so time kept for later paths must not cost it."""
    # 254 s left, 30 s for the comparison, 75 s a child, three children (a, b, b): keeping
    # 2 x 75 s for the later ones would leave (a) 74 s, under 75
    assert gb.child_budget(254, 30, 75, 2) == 75      # (a) runs
    assert gb.child_budget(300, 30, 75, 2) == 120     # room for all: later ones kept
    assert gb.child_budget(100, 30, 75, 0) is None    # the last path no longer fits
    assert gb.child_budget(105, 30, 75, 1) == 75


def test_the_first_child_of_a_short_call_outlasts_a_cold_engine_start():
    """A call with 320 s left after the checkpoint build and four paths: (a), the first
    engine of a fresh machine, needs about 98 s; the default ``--min-child`` gives it that
    rather than an equal share it is killed in (75 s did), and the last path is skipped."""
    min_child = gb.run_parser().parse_args([]).min_child
    left = 320
    for later, path_s in ((3, 98), (2, 70), (1, 70)):  # (a) cold, two warm (b) children
        assert gb.child_budget(left, 30, min_child, later) >= path_s
        left -= path_s
    assert gb.child_budget(left, 30, min_child, 0) is None  # (c): 82 s left


def test_a_process_that_ran_no_pass_is_left_out_of_the_memory_comparison():
    """(c) started its engine and then skipped every pass for the deadline: its process
    peak is its engine start's, so (b)'s process peak is not judged against it."""
    doc = {"runs": [
        {"mode": B, "round": 0, "ok": True, "rss_end_kib": {"vmhwm_kib": 3 * 2**20},
         "passes": [_pass("offline", 32, 0, 96.0)]},
        {"mode": "c", "round": 0, "ok": True, "rss_end_kib": {"vmhwm_kib": 2**20},
         "passes": [], "skipped": [{"round": 0, "batch": 32, "loop": "offline",
                                    "why": "deadline: 0s left"}]}]}
    agg = gr.aggregate([doc])
    assert not agg["proc_peak_ratio"].get(B)
    assert set(agg["proc_peak_gib"]) == {B}
    md = gr.render_markdown([doc])
    assert "files without per-pass peaks" not in md
    assert "offline, batch 32: not run (deadline: 0s left)" in md


def test_check_files_of_different_lengths_compare_their_common_sequences(tmp_path):
    pytest.importorskip("torch")
    import torch
    from safetensors.torch import save_file

    meta = {"tokens_sha": "x", "layers": "[3]"}

    def write(name, n, bad=None):
        t = {f"{i}.3": torch.ones(4 + i, 2) for i in range(n)}
        if bad is not None:
            t[f"{bad}.3"] = -t[f"{bad}.3"]
        save_file(t, str(tmp_path / name), metadata=meta)
        return str(tmp_path / name)

    res = gb.compare_files(write("a", 3), write("b", 2), [3])
    assert res["ok"] and res["per_layer"]["3"]["seqs"] == 2
    # a wrong value among the common sequences still fails
    assert not gb.compare_files(write("c", 3, bad=1), write("d", 2), [3])["ok"]
    # a file that is not sequences 0..N-1 is not compared
    t = {"1.3": torch.ones(5, 2)}
    save_file(t, str(tmp_path / "e"), metadata=meta)
    assert "different tensors" in gb.compare_files(write("f", 2), str(tmp_path / "e"),
                                                   [3])["error"]
