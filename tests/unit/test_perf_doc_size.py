"""docs/performance.md stays a reference for users: how to run each benchmark, what it
measures, the current results and what they mean, in under :data:`MAX_LINES` lines. The
GPU benchmark's per-pass diagnostics go to the generated docs/performance-gpu-details.md;
superseded runs live in git, not on the page."""

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MAX_LINES = 400


def too_long(text: str, limit: int = MAX_LINES) -> bool:
    return len(text.splitlines()) >= limit


def test_performance_page_is_short():
    lines = len((ROOT / "docs" / "performance.md").read_text().splitlines())
    assert not too_long((ROOT / "docs" / "performance.md").read_text()), (
        f"docs/performance.md has {lines} lines (limit {MAX_LINES}): move diagnostics to the "
        "generated details page, drop superseded runs (git keeps them)")


def test_a_long_page_is_caught():
    assert too_long("x\n" * MAX_LINES)
    assert not too_long("x\n" * (MAX_LINES - 1))
