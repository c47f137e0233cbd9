"""docs/performance.md's generated blocks and plots must match the recorded results they
are rendered from: the CPU block from ``benchmarks/cpu/results.json`` (``bench.py --render``),
the GPU block and docs/performance-gpu-details.md from the files the block names
(``gpu_bench.py render``). No vLLM needed."""

import re
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "performance.md"


def _block(text: str, begin: str, end: str = "<!-- END GENERATED") -> str:
    return text.split(begin, 1)[1].split(end, 1)[0]


def _render(tmp_path: Path, cmd: list[str], plot: str) -> Path:
    """Render into a copy of the page (the plot beside it, so the plot link is the same)."""
    shutil.copy(DOC, tmp_path / "performance.md")
    proc = subprocess.run([sys.executable, *cmd, "--update-docs", "--docs",
                           str(tmp_path / "performance.md"), "--plot", str(tmp_path / plot)],
                          capture_output=True, text=True, check=False, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return tmp_path / "performance.md"


def test_cpu_block_is_current(tmp_path):
    out = _render(tmp_path, [str(ROOT / "benchmarks" / "cpu" / "bench.py"), "--render",
                             str(ROOT / "benchmarks" / "cpu" / "results.json")], "perf.svg")
    begin = "<!-- BEGIN GENERATED RESULTS"
    assert _block(out.read_text(), begin) == _block(DOC.read_text(), begin), (
        "run: bench.py --render benchmarks/cpu/results.json --update-docs")
    assert (tmp_path / "perf.svg").read_text() == (ROOT / "docs" / "perf.svg").read_text()


def test_gpu_block_is_current(tmp_path):
    begin = "<!-- BEGIN GENERATED GPU RESULTS"
    files = re.findall(r"`(docs/results/[^`]+\.json)`",
                       next(line for line in _block(DOC.read_text(), begin).splitlines()
                            if line.startswith("Files: ")))
    assert files, "the GPU block names no files"
    details = tmp_path / "performance-gpu-details.md"
    out = _render(tmp_path, [str(ROOT / "benchmarks" / "gpu" / "gpu_bench.py"), "render",
                             *[str(ROOT / f) for f in files], "--details", str(details)],
                  "perf-gpu.svg")
    fix = "run: gpu_bench.py render <the files the block names> --update-docs"
    assert _block(out.read_text(), begin) == _block(DOC.read_text(), begin), fix
    assert details.read_text() == (ROOT / "docs" / details.name).read_text(), fix
    assert (tmp_path / "perf-gpu.svg").read_text() == \
        (ROOT / "docs" / "perf-gpu.svg").read_text()
