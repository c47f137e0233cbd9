"""Docs, changelog, code and tests describe the code, the measurement and its date, not the
rounds of work that produced them: no "<ordinal> session", "this session", "(<ordinal>
session)", "later session", "this round", and no internal issue numbers ("issue 12"),
which mean nothing to a reader of the project."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
ORDINAL = (r"(first|second|third|fourth|fifth|sixth|seventh|eighth|ninth|tenth|eleventh|"
           r"twelfth|\d+(st|nd|rd|th))")
PATTERNS = [
    re.compile(rf"\b{ORDINAL}\s+sessions?\b", re.I),
    re.compile(r"\b(this|that|last|previous|next|later|earlier|same|current|one)\s+"
               r"(gpu\s+|device\s+)?sessions?\b(?!\s*fixture)", re.I),
    re.compile(r"\bsessions?\s+(ago|before)\b", re.I),
    re.compile(r"\bthis\s+round\b", re.I),
    re.compile(r"\b(round|rounds)\s+of\s+work\b", re.I),
    re.compile(r"(?<!speculators )(?<!vllm )\bissues?\s+#?\d+", re.I),  # upstream's: fine
]
#: What the check reads: the docs, the changelog, the README, the code, tools, benchmarks
#: and tests.
GLOBS = ["README.md", "CHANGELOG.md", "docs/**/*.md", "src/**/*.py", "tools/**/*.py",
         "tools/**/*.sh", "benchmarks/**/*.py", "tests/**/*.py"]


def narration(text: str) -> list[str]:
    """The lines of ``text`` that narrate rounds of work."""
    return [line.strip() for line in text.splitlines()
            if any(p.search(line) for p in PATTERNS)]


def test_narration_is_caught():
    for line in ("Findings of the eighth session", "measured this session",
                 "(seventh session)", "rendered until the 9th session",
                 "as in a later session", "issue 12's targets", "(issue 14)",
                 "this round of work"):
        assert narration(line), line
    for line in ("5 rounds of 6 fresh processes", "a second call on the same machine",
                 "the script runs in its own session", "scope='session' fixtures",
                 "start_new_session=True", "one round trip per step",
                 "speculators issue #279"):
        assert not narration(line), line


def test_no_work_narration():
    here = Path(__file__).resolve()
    hits = []
    for pattern in GLOBS:
        for path in sorted(ROOT.glob(pattern)):
            if path.resolve() == here or ".envs" in path.parts:
                continue
            hits += [f"{path.relative_to(ROOT)}: {line}" for line in
                     narration(path.read_text(errors="replace"))]
    assert not hits, "narration of rounds of work:\n" + "\n".join(hits[:60])
