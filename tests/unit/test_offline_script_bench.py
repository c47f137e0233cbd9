"""benchmarks/offline_script_bench.py's pure parts: the data it writes, the generation
loop's time read from speculators' own log lines (stamped by the parent as they arrive),
and the steady rate from the files' write times. No vLLM, no speculators."""

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("offline_script_bench_under_test",
                                               ROOT / "benchmarks" / "offline_script_bench.py")
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
