"""Whether the support matrix's records still describe the shim's adapter code.

Why: a row of ``docs/support-matrix.md`` proves what the shim did at the commit it was
recorded at; once an adapter (or a module adapters use) changes, the row proves nothing
about the new code. ``tests/unit/test_support_matrix_fresh.py`` runs :func:`check`, so
the page cannot go stale silently: re-running ``python3 tools/matrix/matrix.py run`` at the new
head records the current commit and the check passes again.

*Adapter code* (:func:`adapter_paths`): every module of ``speculators_compat.adapters``
and every module of the package they reach, through imports (at the top or inside
functions) or by name in a string (vLLM's workers load ``worker_extension`` from the
dotted path an adapter hands them). ``__main__``, the demo, the shipped ``_proven.json``
and ``_matrix_proof`` (:data:`NOT_ADAPTER_CODE`) are not: changing them changes no verdict the
matrix records.

What counts is the code, not its text: a file is compared as its syntax tree without
docstrings (:func:`code_of`), so an edit to docstrings or comments alone leaves the records
current (it changes no verdict), while any change to a statement, a name or a constant
makes them stale.

Each record (doctor, contract, e2e) carries ``shim`` (the commit, ``+dirty`` when ``src/``
had uncommitted changes) and ``shim_src`` (:func:`source_digest` of the adapter code as
it ran). A record is current when

* git knows its commit: the adapter code is the same at that commit and at ``HEAD``
  (the files ``git diff`` names, compared with :func:`code_of`), and a ``+dirty``
  record's digest equals today's; or
* git cannot tell (a shallow clone without that commit, an unpacked archive): its digest
  equals the digest of the adapter code here.

A record that neither can verify (no digest, no history) is *unverified*, with the reason
(e.g. ``git fetch --unshallow``), never silently current.

Usage: ``python3 tools/matrix/matrix_fresh.py`` (exit 1 when a record is stale);
``--redigest`` recomputes the recorded digests from their commits (:func:`redigest`), and
gives the GPU matrix files theirs (:func:`redigest_gpu`).
"""

from __future__ import annotations

import ast
import hashlib
import json
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "docs" / "support-matrix.json"
PACKAGE = "speculators_compat"
ADAPTERS = f"{PACKAGE}.adapters"
RERUN = "python3 tools/matrix/matrix.py run"
#: Modules adapters reach that change no verdict the matrix records: ``_matrix_proof`` phrases
#: what the recorded results say (doctor's and the report's text about them), from the
#: shipped copy of those results. Editing it must not make the records it reads stale.
NOT_ADAPTER_CODE = frozenset({f"{PACKAGE}._matrix_proof"})


# --------------------------------------------------------------------------- adapter code

def _modules(src: Path) -> dict[str, Path]:
    """Dotted module name -> file, for every module of the package under ``src``."""
    found = {}
    for path in sorted((src / PACKAGE).rglob("*.py")):
        parts = list(path.relative_to(src).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join(parts)] = path
    return found


def _edges(name: str, path: Path, mods: dict[str, Path]) -> set[str]:
    """The package's modules ``name`` imports or names in a string constant."""
    def owner(dotted: str) -> str | None:  # the longest module ``dotted`` starts with
        while dotted and dotted not in mods:
            dotted = dotted.rpartition(".")[0]
        return dotted or None

    here = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str | None] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(owner(a.name) for a in node.names if a.name.startswith(PACKAGE))
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = here.split(".")[:len(here.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target.split(".")[0] == PACKAGE:
                found.update(f"{target}.{a.name}" if f"{target}.{a.name}" in mods
                             else owner(target) for a in node.names)
        elif (isinstance(node, ast.Constant) and isinstance(node.value, str)
              and node.value.startswith(PACKAGE + ".") and " " not in node.value):
            found.add(owner(node.value.split(":")[0]))
    found.discard(None)
    found.discard(name)
    return {m for m in found if m is not None}


def adapter_paths(root: Path = ROOT) -> list[str]:
    """The adapter code (see the module docstring), as paths relative to ``root``."""
    src = root / "src"
    mods = _modules(src)
    todo = [m for m in mods if m == ADAPTERS or m.startswith(ADAPTERS + ".")]
    seen = set(todo) | NOT_ADAPTER_CODE
    while todo:
        name = todo.pop()
        for dep in _edges(name, mods[name], mods):
            if dep not in seen:
                seen.add(dep)
                todo.append(dep)
    return sorted(mods[m].relative_to(root).as_posix() for m in seen - NOT_ADAPTER_CODE
                  if m in mods)


def code_of(text: str) -> str:
    """A module's code without its docstrings and comments: a dump of its syntax tree with
    every module, class and function docstring removed, positions left out (:func:`_dump`).
    The text itself where it does not parse."""
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return text
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if (body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant)
                    and isinstance(body[0].value.value, str)):
                node.body = body[1:] or [ast.Pass()]
    return _dump(tree)


def _dump(node: Any) -> str:
    """A syntax tree as text, the same on every Python that parses it alike.

    Why not ``ast.dump``: its text differs between Python releases for the same code
    (3.12 adds ``type_params=[]`` to every function and class, 3.13 leaves out empty
    fields), so a digest of it depends on the interpreter that computes it: the GPU
    machine's Python 3.12 and the CPU matrix's 3.11 gave two digests of one tree; early
    3.12 releases also put an empty string piece into an f-string's nested format spec.
    Fields that are ``None`` or empty and f-string pieces that are empty strings are left
    out here, and nothing else is."""
    if isinstance(node, ast.AST):
        fields = []
        for name in node._fields:
            value = getattr(node, name, None)
            if isinstance(node, ast.JoinedStr) and name == "values":
                value = [v for v in value
                         if not (isinstance(v, ast.Constant) and v.value == "")]
            if value is None or (isinstance(value, list) and not value):
                continue
            fields.append(f"{name}={_dump(value)}")
        return f"{type(node).__name__}({', '.join(fields)})"
    if isinstance(node, list):
        return "[" + ", ".join(_dump(x) for x in node) + "]"
    return repr(node)


def source_digest(root: Path = ROOT) -> str:
    """A digest of the adapter code in the working tree (paths and :func:`code_of` each
    file)."""
    h = hashlib.sha256()
    for rel in adapter_paths(root):
        code = code_of((root / rel).read_text(encoding="utf-8", errors="replace"))
        h.update(rel.encode() + b"\0" + code.encode() + b"\0")
    return "sha256:" + h.hexdigest()[:20]


def _code_changed(root: Path, commit: str, rel: str) -> bool:
    """Whether ``rel`` holds other code at ``HEAD`` than at ``commit`` (:func:`code_of`;
    added or removed counts as changed)."""
    texts = []
    for rev in (commit, "HEAD"):
        proc = _git(root, "show", f"{rev}:{rel}")
        if proc.returncode != 0:
            return True
        texts.append(proc.stdout)
    return code_of(texts[0]) != code_of(texts[1])


# --------------------------------------------------------------------------- records

@dataclass
class Record:
    env: str
    where: str  # "0.32.0 × 0.4.0.1 contract"
    shim: str | None
    shim_src: str | None


def _parts(data: dict[str, Any]):
    """(env, where, part) for every recorded part that ran shim code (``not-run`` parts
    did not); ``part`` is the record's own dict."""
    for env, rec in (data.get("envs") or {}).items():
        for spec, s in (rec.get("speculators") or {}).items():
            parts = {"doctor": s.get("doctor"), "contract": s.get("contract"),
                     "training chain": s.get("train"),
                     **{f"e2e {k}": e for k, e in (s.get("e2e") or {}).items()}}
            pinned = (s.get("pinned") or {}).get("e2e_without_safeguards")
            if pinned:
                parts["e2e llama without safeguards"] = pinned
            for label, part in parts.items():
                if part and part.get("status") != "not-run":
                    yield env, f"{env} × {spec} {label}", part


def records(data: dict[str, Any]) -> list[Record]:
    """Every recorded part of the results that ran shim code (``not-run`` parts did not)."""
    return [Record(env, where, part.get("shim"), part.get("shim_src"))
            for env, where, part in _parts(data)]


def digest_at(commit: str, root: Path = ROOT) -> str | None:
    """:func:`source_digest` of the adapter code at ``commit`` (from that commit's tree, in
    a temporary worktree), or ``None`` where git does not have the commit."""
    import tempfile

    if _history(root) is not None or _git(root, "rev-parse", "--verify", "--quiet",
                                          f"{commit}^{{commit}}").returncode != 0:
        return None
    with tempfile.TemporaryDirectory() as tmp:
        tree = Path(tmp) / "tree"
        if _git(root, "worktree", "add", "--detach", str(tree), commit).returncode != 0:
            return None
        try:
            return source_digest(tree)
        finally:
            _git(root, "worktree", "remove", "--force", str(tree))


def redigest(data: dict[str, Any], root: Path = ROOT) -> int:
    """Recompute ``shim_src`` of every record made at a commit git has, without
    uncommitted changes, from that commit's tree (after :func:`source_digest` changed
    what it digests). Returns how many digests changed; other records are left as
    they are."""
    digests: dict[str, str | None] = {}
    changed = 0
    for _env, _where, part in _parts(data):
        shim = part.get("shim") or ""
        if not shim or "+" in shim:
            continue
        commit = shim.split(" ")[0]
        if commit not in digests:
            digests[commit] = digest_at(commit, root)
        new = digests[commit]
        if new is not None and part.get("shim_src") != new:
            part["shim_src"] = new
            changed += 1
    return changed


def redigest_gpu(results: Path, root: Path = ROOT) -> list[str]:
    """Give every GPU matrix file (``docs/results/gpu-*.json``, not ``gpu-models-*``) whose
    ``meta.shim`` names a commit git has, without ``+dirty``, the ``meta.shim_src`` digest
    of that commit's adapter code (``tests/e2e/scripts/gpu_matrix.py`` records it itself
    since 2026-12-05). Returns the files changed."""
    changed = []
    for f in sorted(results.glob("gpu-*.json")):
        if f.name.startswith("gpu-models-"):
            continue
        data = json.loads(f.read_text())
        meta = data.get("meta") or {}
        shim = (meta.get("shim") or "").split(" ")[0]
        if not shim or "+" in shim:
            continue
        digest = digest_at(shim, root)
        if digest is not None and meta.get("shim_src") != digest:
            meta["shim_src"] = digest
            f.write_text(json.dumps(data, indent=1) + "\n")
            changed.append(f.name)
    return changed


# --------------------------------------------------------------------------- check

@dataclass
class Verdict:
    stale: list[str] = field(default_factory=list)  # one line per stale commit/reason
    unverified: list[str] = field(default_factory=list)
    checked: int = 0

    def message(self) -> str:
        lines = []
        if self.stale:
            lines += ["docs/support-matrix.json holds results of older adapter code:",
                      *(f"  - {s}" for s in self.stale),
                      f"re-run the matrix at this commit ({RERUN}; one env: --envs NAME) "
                      "and commit docs/support-matrix.json, docs/support-matrix.md and "
                      "src/speculators_compat/_proven.json"]
        if self.unverified:
            lines += ["not verifiable here:", *(f"  - {s}" for s in self.unverified)]
        return "\n".join(lines)


def _git(root: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True,
                          check=False)


def _history(root: Path) -> str | None:
    """``None`` when git can answer here, else why not."""
    try:
        proc = _git(root, "rev-parse", "--is-inside-work-tree")
    except OSError:
        return "git is not installed"
    if proc.returncode != 0 or proc.stdout.strip() != "true":
        return f"{root} is not a git checkout"
    return None


def _names(where: list[str], n: int = 4) -> str:
    return ", ".join(where[:n]) + (f" and {len(where) - n} more" if len(where) > n else "")


def _envs(group: list[Record]) -> str:
    """``env 0.12.0, 0.14.0 (40 results)``: where a group of records comes from."""
    names = list(dict.fromkeys(r.env for r in group))
    return (f"env{'s' if len(names) > 1 else ''} {', '.join(names)} "
            f"({len(group)} result{'s' if len(group) > 1 else ''})")


def check(data: dict[str, Any], root: Path = ROOT) -> Verdict:
    """Which records are stale (see the module docstring)."""
    verdict = Verdict()
    recs = records(data)
    verdict.checked = len(recs)
    digest = source_digest(root)
    no_git = _history(root)
    shallow = no_git is None and _git(root, "rev-parse", "--is-shallow-repository"
                                      ).stdout.strip() == "true"
    paths = adapter_paths(root)
    by_commit: dict[str, list[Record]] = {}
    for r in recs:
        if not r.shim:
            verdict.stale.append(f"{r.where}: recorded without a shim commit")
            continue
        by_commit.setdefault(r.shim, []).append(r)
    for shim, group in by_commit.items():
        commit, dirty = shim.split("+")[0].split(" ")[0], "+dirty" in shim
        known = no_git is None and _git(root, "rev-parse", "--verify", "--quiet",
                                        f"{commit}^{{commit}}").returncode == 0
        if known:
            changed = [rel for rel in _git(root, "diff", "--name-only", commit, "HEAD", "--",
                                           *paths).stdout.split()
                       if _code_changed(root, commit, rel)]
            if changed:
                last = _git(root, "log", "-1", "--format=%h %ad %s", "--date=short",
                            f"{commit}..HEAD", "--", *changed).stdout.strip()
                last = last if len(last) <= 80 else last[:79] + "…"
                verdict.stale.append(
                    f"{_envs(group)}: recorded at {shim}; adapter code changed since "
                    f"({_names(changed, 3)}; last change: {last or 'merged in'})")
                continue
            if dirty:
                bad = [r for r in group if r.shim_src != digest]
                if bad:
                    verdict.stale.append(f"{_envs(bad)}: recorded at {shim} with "
                                         "uncommitted changes under src/ that are not the "
                                         "adapter code of this checkout")
            continue
        if no_git is None and not shallow:
            verdict.stale.append(f"{_envs(group)}: recorded at {shim}, a commit this "
                                 "repository's history does not have (rebased or squashed "
                                 "away)")
            continue
        why = no_git or (f"a shallow clone without {commit} (git fetch --unshallow gives "
                         "git the history to check)")
        # No history: the digest decides, where one was recorded.
        undigested = [r for r in group if r.shim_src is None]
        differ = [r for r in group if r.shim_src not in (None, digest)]
        if undigested:
            verdict.unverified.append(f"{_envs(undigested)}: recorded at {shim} without "
                                      f"a digest; {why}")
        if differ:
            verdict.stale.append(f"{_envs(differ)}: recorded at {shim}; the adapter code "
                                 f"here differs from what ran ({why})")
    return verdict


def main() -> int:
    if sys.argv[1:] == ["--redigest"]:
        data = json.loads(RESULTS.read_text())
        n = redigest(data)
        RESULTS.write_text(json.dumps(data, indent=1) + "\n")
        gpu = redigest_gpu(RESULTS.parent / "results")
        print(f"{n} digests recomputed; GPU files: {', '.join(gpu) or 'none changed'}")
        return 0
    verdict = check(json.loads(RESULTS.read_text()))
    print(verdict.message() or f"all {verdict.checked} recorded results are current with "
                                "the adapter code")
    return 1 if verdict.stale else 0


if __name__ == "__main__":
    sys.exit(main())
