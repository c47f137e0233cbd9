"""The package's own imports point one way: no cycle among its modules, no adapter
importing another adapter.

Read from the source (the AST of every module under ``src/speculators_compat``), so
imports made inside functions count as much as those at the top: a cycle that only
closes at run time is still a knot (entry points -> ``_process`` -> engine + adapters ->
kernel). Importing ``a.b`` is counted as an edge to ``a.b`` only, not to package ``a``'s
``__init__`` (Python runs it, but a package's ``__init__`` is not a dependency of its
submodules in the sense checked here); ``from . import x`` is an edge to submodule ``x``
where one exists, else to the package itself.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = "speculators_compat"
SRC = Path(__file__).resolve().parents[2] / "src"


def modules(src: Path = SRC) -> dict[str, tuple[Path, bool]]:
    """Dotted module name -> (file, is a package ``__init__``)."""
    found = {}
    for path in sorted((src / PACKAGE).rglob("*.py")):
        parts = list(path.relative_to(src).with_suffix("").parts)
        is_pkg = parts[-1] == "__init__"
        found[".".join(parts[:-1] if is_pkg else parts)] = (path, is_pkg)
    return found


def import_graph(src: Path = SRC) -> dict[str, set[str]]:
    """Module -> the package's modules it imports (top level and inside functions,
    relative and absolute)."""
    mods = modules(src)

    def owner(name: str) -> str | None:  # the longest known module that ``name`` starts with
        while name and name not in mods:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {}
    for name, (path, is_pkg) in mods.items():
        here = name if is_pkg else name.rpartition(".")[0]
        edges: set[str | None] = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                edges.update(owner(a.name) for a in node.names
                             if a.name.split(".")[0] == PACKAGE)
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = here.split(".")[:len(here.split(".")) - node.level + 1]
                    target = ".".join(base + ([node.module] if node.module else []))
                else:
                    target = node.module or ""
                if target.split(".")[0] != PACKAGE:
                    continue
                for a in node.names:
                    sub = f"{target}.{a.name}"
                    edges.add(sub if sub in mods else owner(target))
        edges.discard(None)
        edges.discard(name)
        graph[name] = {e for e in edges if e is not None}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def is_adapter(name: str) -> bool:
    """An adapter module: ``adapters.<name>`` whose name has no leading underscore."""
    parent, _, leaf = name.rpartition(".")
    return parent == f"{PACKAGE}.adapters" and not leaf.startswith("_")


def test_no_import_cycle():
    found = cycles(import_graph())
    assert not found, "import cycles among the package's modules: " + "; ".join(
        " <-> ".join(c) for c in found)


def test_no_adapter_imports_another_adapter():
    graph = import_graph()
    crossing = sorted((a, b) for a, edges in graph.items() if is_adapter(a)
                      for b in edges if is_adapter(b))
    assert not crossing, f"adapters importing adapters (move what they share to a module " \
                         f"of the adapters package that imports no adapter): {crossing}"


def test_the_graph_reader_sees_imports_inside_functions(tmp_path):
    """Known-wrong input: two modules that import each other only inside functions, and
    an adapter that imports another one relatively, are found."""
    pkg = tmp_path / PACKAGE
    (pkg / "adapters").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("def f():\n    from .b import g\n")
    (pkg / "b.py").write_text("def g():\n    from speculators_compat import a\n")
    (pkg / "adapters" / "__init__.py").write_text("")
    (pkg / "adapters" / "one.py").write_text("from .two import X\n")
    (pkg / "adapters" / "two.py").write_text("X = 1\n")
    graph = import_graph(tmp_path)
    assert cycles(graph) == [[f"{PACKAGE}.a", f"{PACKAGE}.b"]]
    assert f"{PACKAGE}.adapters.two" in graph[f"{PACKAGE}.adapters.one"]
    assert is_adapter(f"{PACKAGE}.adapters.one") and not is_adapter(f"{PACKAGE}.adapters._x")
