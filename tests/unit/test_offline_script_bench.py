"""benchmarks/gpu/offline_script_bench.py's pure parts: the data it writes, the generation
loop's time read from speculators' own log lines (stamped by the parent as they arrive),
and the steady rate from the files' write times. No vLLM, no speculators."""

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location(
    "offline_script_bench_under_test", ROOT / "benchmarks" / "gpu" / "offline_script_bench.py")
osb = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(osb)


def test_conversations_are_distinct_sharegpt_rows_of_the_asked_length():
    rows = osb.conversations(50, 20, 40, 1024, seed=3)
    assert rows == osb.conversations(50, 20, 40, 1024, seed=3)  # seeded
    assert len({r["conversations"][0]["value"].split()[0] for r in rows}) == 50
    for r in rows:
        human, gpt = r["conversations"]
        assert (human["from"], gpt["from"]) == ("human", "gpt")
        words = (human["value"] + " " + gpt["value"]).split()
        assert 20 <= len(words) <= 40
        assert all(w[0] == "t" and 5 <= int(w[1:]) < 1024 for w in words)


def test_the_loop_is_timed_from_the_scripts_own_lines():
    log = "\n".join([
        "1000.000 2026-12-03 17:35:12,419 - preprocessing - INFO -   Loaded 12 samples",
        "1010.250 2026-12-03 17:36:09,595 - __main__ - INFO -   Processing 12/12 samples",
        "1010.300 Generating hidden states:  50%|█████     | 1/2",
        "1012.750 2026-12-03 17:36:09,840 - __main__ - INFO -   Saved 12 new data points to x",
        "1013.000 2026-12-03 17:36:14,870 - __main__ - INFO -   Saved 12 files to x",
        "garbage line without a stamp: Processing 99/99 samples"])
    t = osb.parse_timing(log)
    assert t["loop_start"] == 1010.25 and t["loop_end"] == 1012.75
    assert t["loop_s"] == 2.5 and t["samples_logged"] == 12
    assert "loop_s" not in osb.parse_timing("1.0 Processing 3/3 samples")  # never ended


def test_the_steady_rate_leaves_out_the_first_call():
    files = [{"mtime": 10.0 + i, "tokens": 100} for i in range(6)]
    got = osb.steady_rate(files, batch=2)
    assert got["steady_s"] == 4.0  # from the first call's last file (11.0) to 15.0
    assert got["steady_tokens_per_s"] == 400 / 4.0 and got["steady_samples_per_s"] == 1.0
    assert osb.steady_rate(files[:2], batch=2) == {}


#: gpu_bench.py's FULL model (Llama-3-8B's shape).
LLAMA3_8B = {"hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
             "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128,
             "vocab_size": 128256}


def test_the_disk_estimate_covers_the_8b_checkpoint_and_a_releases_files():
    # the build child wrote 16,060,556,376 bytes of safetensors for this config (2026-12-04)
    assert abs(osb.checkpoint_bytes(LLAMA3_8B) - 16_060_556_376) < 0.01 * 16_060_556_376
    # 256 samples of 760-1010 words at 4 layers: about 7.5 GB were written on the H200
    assert 7.5e9 < osb.release_output_bytes(256, 1010, 4096, 4) < 9.5e9


def test_pruning_keeps_the_samples_the_comparison_reads(tmp_path):
    for i in range(12):
        (tmp_path / f"data_{i}.pt").write_bytes(b"x" * 10)
    (tmp_path / "data_config.json").write_text("{}")
    assert osb.prune_output(tmp_path, 4) == 80
    assert sorted(f.name for f in tmp_path.iterdir()) == [
        "data_0.pt", "data_1.pt", "data_2.pt", "data_3.pt", "data_config.json"]


def test_a_disk_without_room_is_refused_before_anything_runs(tmp_path, monkeypatch):
    class Args:
        tiny, out, work = False, str(tmp_path / "out"), str(tmp_path / "work")

    bench = object.__new__(osb.Bench)
    bench.a, bench.work, bench.base = Args, tmp_path / "work", tmp_path / "work" / "o"
    bench.base.mkdir(parents=True)
    cfg = {"model": LLAMA3_8B}
    usage = type("U", (), {"free": 20 * osb.GIB})
    monkeypatch.setattr(osb.shutil, "disk_usage", lambda _p: usage)
    room = bench.disk_room(cfg, 256, 1010, 4096, 4)  # no checkpoint yet: 16 + 8 + 2 GB
    assert not room["ok"] and "rm -rf /root/gpu-models" in room["error"]
    assert "checkpoint" in room["error"]
    (bench.work / "ckpt" / "llama3-8b-shape").mkdir(parents=True)
    (bench.work / "ckpt" / "llama3-8b-shape" / "config.json").write_text("{}")
    assert bench.disk_room(cfg, 256, 1010, 4096, 4)["ok"]  # built: files + margin fit
