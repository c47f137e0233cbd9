"""Fill ``.gpu-kit/spectests/<version>/`` from a git clone of speculators.

Why: the device machine has no network, and the GPU checks run speculators' own files
unchanged: ``tests/datagen/test_vllm_hidden_states.py`` (its GPU regression tests,
``tests/e2e/scripts/gpu_speculators_tests.py``) and ``scripts/data_generation_offline.py``
(its offline script, ``benchmarks/gpu/offline_script_bench.py``). They are read from the
release tags with ``git show`` (byte for byte) and carried with the device call
(``.gpu-kit/spectests``, a few tens of kB, git-ignored). ``pytest-section.toml`` keeps the
release's ``[tool.pytest.ini_options]`` for reference.

Usage::

    git clone https://github.com/vllm-project/speculators /tmp/speculators
    python3 tools/gpu/spectests_fetch.py /tmp/speculators            # 0.3.0 and 0.4.0.1
    python3 tools/gpu/spectests_fetch.py /tmp/speculators --version 0.4.0.1
"""

from __future__ import annotations

import argparse
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / ".gpu-kit" / "spectests"
VERSIONS = ("0.3.0", "0.4.0.1")
FILES = ("tests/datagen/test_vllm_hidden_states.py", "tests/datagen/__init__.py",
         "scripts/data_generation_offline.py")


def show(repo: Path, tag: str, path: str) -> bytes:
    return subprocess.run(["git", "-C", str(repo), "show", f"{tag}:{path}"], check=True,
                          capture_output=True).stdout


def pytest_section(pyproject: str) -> str:
    """``[tool.pytest.ini_options]`` up to the next table."""
    out, inside = [], False
    for line in pyproject.splitlines():
        if line.strip().startswith("["):
            inside = line.strip() == "[tool.pytest.ini_options]"
        if inside:
            out.append(line)
    return "\n".join(out) + "\n"


def fetch(repo: Path, version: str, out: Path = OUT) -> list[Path]:
    tag = f"v{version}"
    written = []
    for path in FILES:
        dest = out / version / path
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_bytes(show(repo, tag, path))
        written.append(dest)
    section = out / version / "pytest-section.toml"
    section.write_text(pytest_section(show(repo, tag, "pyproject.toml").decode()))
    return [*written, section]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("repo", type=Path, help="a git clone of vllm-project/speculators")
    p.add_argument("--version", action="append", choices=VERSIONS,
                   help="a release (default: both)")
    a = p.parse_args(argv)
    for version in a.version or VERSIONS:
        for path in fetch(a.repo, version):
            print(f"{path.relative_to(ROOT)}: {path.stat().st_size} bytes")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
