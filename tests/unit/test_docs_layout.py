"""The layout tables of docs/how-it-works.md and docs/contributing.md list every module.

Each table is the code block that starts with ``src/speculators_compat/``: one row per
module (``name.py``) or package (``name/``, one row for the whole package unless the
table lists its modules too, as contributing.md does for ``adapters/``). Every module and
package directly under ``src/speculators_compat`` must have its row, no row may name one
that does not exist, and where a table lists a package's modules it lists all of them
(adapter modules as ``<name>.py``).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PKG = ROOT / "src" / "speculators_compat"
DOCS = ("docs/how-it-works.md", "docs/contributing.md")
ROW = re.compile(r"^( +)([\w<>]+(?:\.py|/))(?:\s|$)")


def entries(directory: Path) -> set[str]:
    """``name.py`` for each module, ``name/`` for each package, directly in ``directory``."""
    found = {p.name for p in directory.glob("*.py")}
    found |= {f"{p.name}/" for p in directory.iterdir()
              if p.is_dir() and (p / "__init__.py").is_file()}
    return found


def table(text: str) -> dict[str, set[str]]:
    """The layout block of a doc: ``""`` -> top-level rows, ``"pkg/"`` -> its listed rows."""
    lines = text.splitlines()
    start = lines.index("src/speculators_compat/")
    rows: dict[str, set[str]] = {"": set()}
    parent = ""
    for line in lines[start + 1:]:
        if line.startswith("```") or not line.startswith(" "):
            break
        m = ROW.match(line)
        if m is None:
            continue
        indent, name = len(m.group(1)), m.group(2)
        if indent == 2:
            rows[""].add(name)
            parent = name if name.endswith("/") else ""
        elif indent == 4 and parent:
            rows.setdefault(parent, set()).add(name)
    return rows


def problems(rows: dict[str, set[str]], package: Path = PKG) -> list[str]:
    found = []
    have = entries(package)
    found += [f"missing row: {n}" for n in sorted(have - rows[""])]
    found += [f"row of no module: {n}" for n in sorted(rows[""] - have)]
    for parent, listed in rows.items():
        if not parent:
            continue
        sub = entries(package / parent.rstrip("/"))
        if parent == "adapters/":  # adapter modules are the "<name>.py" row
            sub = {n for n in sub if n.startswith("_")} | {"<name>.py"}
        found += [f"missing row under {parent}: {n}" for n in sorted(sub - listed)]
        found += [f"row of no module under {parent}: {n}" for n in sorted(listed - sub)]
    return found


@pytest.mark.parametrize("doc", DOCS)
def test_layout_table_lists_every_module(doc):
    rows = table((ROOT / doc).read_text())
    assert not problems(rows), f"{doc}: " + "; ".join(problems(rows))


def test_the_check_finds_a_missing_and_a_stale_row(tmp_path):
    """Known-wrong tables: a module without its row, a row without its module, a package
    whose listed modules miss one."""
    pkg = tmp_path / "speculators_compat"
    (pkg / "transport").mkdir(parents=True)
    for name in ("__init__.py", "_a.py", "_b.py", "transport/__init__.py", "transport/x.py"):
        (pkg / name).write_text("")
    text = "\n".join(["src/speculators_compat/", "  __init__.py   face", "  _a.py   a",
                      "    continued text.py", "  _gone.py  removed", "  transport/  one row",
                      "```"])
    assert problems(table(text), pkg) == ["missing row: _b.py", "row of no module: _gone.py"]
    text = text.replace("  transport/  one row", "  transport/  listed\n    __init__.py  x")
    assert "missing row under transport/: x.py" in problems(table(text), pkg)
