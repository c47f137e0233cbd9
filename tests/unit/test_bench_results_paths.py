"""``bench.py`` writes ``benchmarks/cpu/results.json`` (committed) with the paths under the
repository relative to it, so the file does not name the checkout it was made in; other
strings, and paths outside the repository, are left as they are."""

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks" / "cpu"))

import bench  # noqa: E402


def test_paths_under_the_repository_are_relative():
    data = {"params": {"model": str(ROOT / ".cache" / "bench" / "llama"),
                       "pycache_prefix": None, "site": "/opt/site"},
            "runs": [{"log": str(ROOT / "benchmarks" / "logs" / "a.log"), "mode": "a"}],
            "note": f"{ROOT}x is not under it"}
    out = bench._repo_relative(data)
    assert out["params"] == {"model": ".cache/bench/llama", "pycache_prefix": None,
                             "site": "/opt/site"}
    assert out["runs"] == [{"log": "benchmarks/logs/a.log", "mode": "a"}]
    assert out["note"] == data["note"]


def test_committed_results_name_no_checkout():
    import json

    def strings(x):
        if isinstance(x, dict):
            for v in x.values():
                yield from strings(v)
        elif isinstance(x, list):
            for v in x:
                yield from strings(v)
        elif isinstance(x, str):
            yield x

    data = json.loads((ROOT / "benchmarks" / "cpu" / "results.json").read_text())
    absolute = [s for s in strings(data) if s.startswith("/") and "/.cache/bench/" in s]
    assert not absolute, absolute[:3]
