"""The support matrix's records describe today's adapter code (``tools/matrix/matrix_fresh.py``).

The first test is the check itself, on docs/support-matrix.json: it fails once an adapter
(or a module adapters use) changed after the commit a record was made at, and names the
re-run. The others run the check on throwaway git repositories: what counts as adapter
code, a change after the record (stale), a change elsewhere (current), uncommitted
changes, a commit the history lacks, and a shallow clone or a checkout without git,
where the digest recorded with each result decides.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools" / "matrix"))
import matrix_fresh  # noqa: E402

PKG = "src/speculators_compat"


def _version() -> Version:
    text = (ROOT / "pyproject.toml").read_text()
    return Version(re.search(r'^version = "([^"]+)"', text, re.M).group(1))


def test_a_release_carries_results_of_its_adapter_code():
    """The release gate: records of older adapter code are allowed only in a development
    version (``X.Y.Z.devN``), where the shipped ``_proven.json`` marks them not current
    (``test_matrix_proof.py::test_shipped_copy_is_current`` keeps it rendered with today's
    digest), so ``doctor`` does not count them; a release needs every record current."""
    verdict = matrix_fresh.check(json.loads(matrix_fresh.RESULTS.read_text()))
    assert verdict.checked > 0
    if verdict.stale:
        assert _version().is_devrelease, (
            f"version {_version()} is a release: " + verdict.message())
    if verdict.unverified:
        pytest.skip(verdict.message())


def test_stale_records_are_not_counted():
    """Every release level the package counts (``current`` in ``_proven.json``) ran
    today's adapter code: its CPU records carry today's digest."""
    sys.path.insert(0, str(ROOT / "tools" / "matrix"))
    import matrix_proven

    digest = matrix_fresh.source_digest()
    data = json.loads(matrix_fresh.RESULTS.read_text())
    shipped = json.loads((ROOT / PKG / "_proven.json").read_text())["releases"]
    for rec in data["envs"].values():
        level = matrix_proven.LEVEL_OF_ENV.get(rec.get("level"))
        release = matrix_proven.public((rec.get("versions") or {}).get("vllm"))
        entry = (shipped.get(release) or {}).get(level)
        if not entry or not entry.get("current", False):
            continue
        for spec in entry["speculators"]:
            assert matrix_proven._row_digests(rec["speculators"][spec]) == {digest}, (
                release, level, spec)


def test_adapter_code_of_this_package():
    paths = set(matrix_fresh.adapter_paths())
    assert f"{PKG}/adapters/hook_capture.py" in paths
    assert f"{PKG}/_patcher.py" in paths  # imported by adapters
    # named by a dotted path in adapters/_worker_extensions
    assert f"{PKG}/worker_extension.py" in paths
    assert f"{PKG}/_capture.py" in paths  # imported by worker_extension
    assert f"{PKG}/__main__.py" not in paths
    assert not any(p.startswith(f"{PKG}/demo/") for p in paths)


def test_code_is_the_same_text_on_every_python():
    """The digest must not depend on the interpreter computing it: the GPU machine's
    Python 3.12 and the CPU matrix's 3.11 gave two digests of one tree with ``ast.dump``
    (3.12's ``type_params=[]``; 3.12.1's empty piece in a nested f-string format spec).
    The expected text is fixed, so this fails on any Python that dumps it otherwise."""
    code = matrix_fresh.code_of('def f(x, w):\n    """Doc."""\n    return f"{x:<{w}}"\n')
    assert code == (
        "Module(body=[FunctionDef(name='f', args=arguments(args=[arg(arg='x'), "
        "arg(arg='w')]), body=[Return(value=JoinedStr(values=[FormattedValue("
        "value=Name(id='x', ctx=Load()), conversion=-1, format_spec=JoinedStr(values=["
        "Constant(value='<'), FormattedValue(value=Name(id='w', ctx=Load()), "
        "conversion=-1)]))]))])])")
    # a change of code still shows; a docstring alone does not
    assert matrix_fresh.code_of("def f(x, w):\n    return x\n") != code
    assert matrix_fresh.code_of(
        'def f(x, w):\n    """Other."""\n    return f"{x:<{w}}"\n') == code


# --------------------------------------------------------------------------- throwaway repos

def git(repo: Path, *args: str) -> str:
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t",
           "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t"}
    return subprocess.run(["git", "-C", str(repo), "-c", "commit.gpgsign=false", *args],
                          check=True, capture_output=True, text=True, env=env).stdout.strip()


def write(repo: Path, rel: str, text: str) -> None:
    path = repo / PKG / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def commit(repo: Path, message: str) -> str:
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", message)
    return git(repo, "rev-parse", "--short=12", "HEAD")


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    """A package: one adapter importing a helper and naming a worker module by its
    dotted path, and modules no adapter reaches (the CLI, a demo)."""
    r = tmp_path / "repo"
    r.mkdir()
    git(r, "init", "-q")
    write(r, "__init__.py", "")
    write(r, "__main__.py", "print('cli')\n")
    write(r, "_helper.py", "X = 1\n")
    write(r, "worker.py", "Y = 1\n")
    write(r, "demo/__init__.py", "")
    write(r, "adapters/__init__.py", "from .one import One\n")
    write(r, "adapters/one.py", "from .._helper import X\n"
                                "EXT = 'speculators_compat.worker.Ext'\nclass One: ...\n")
    commit(r, "first")
    return r


def results(shim: str, digest: str | None = None) -> dict:
    part = {"shim": shim, **({"shim_src": digest} if digest else {})}
    return {"envs": {"0.32.0": {"speculators": {"0.4.0.1": {
        "doctor": dict(part), "contract": dict(part),
        "e2e": {"llama": dict(part), "deepseek_v3": {"status": "not-run", "why": "x"}}}}}}}


def test_adapter_paths_follow_imports_and_dotted_names(repo):
    assert matrix_fresh.adapter_paths(repo) == [
        f"{PKG}/_helper.py", f"{PKG}/adapters/__init__.py", f"{PKG}/adapters/one.py",
        f"{PKG}/worker.py"]


def test_current_until_adapter_code_changes(repo):
    first = git(repo, "rev-parse", "--short=12", "HEAD")
    data = results(first)
    assert matrix_fresh.check(data, repo).stale == []
    write(repo, "__main__.py", "print('changed cli')\n")
    write(repo, "demo/__init__.py", "# changed\n")
    commit(repo, "cli and demo only")
    assert matrix_fresh.check(data, repo).stale == []
    for rel in ("_helper.py", "worker.py"):  # imported; named by a dotted path
        write(repo, rel, "CHANGED = 1\n")
        last = commit(repo, f"change {rel}")
        verdict = matrix_fresh.check(data, repo)
        assert len(verdict.stale) == 1 and first in verdict.stale[0], verdict.stale
        assert f"{PKG}/{rel}" in verdict.stale[0] and last[:7] in verdict.stale[0]
        assert matrix_fresh.check(results(last), repo).stale == []  # re-recorded
        assert "tools/matrix/matrix.py run" in verdict.message()


def test_docstrings_and_comments_alone_keep_records_current(repo, tmp_path):
    first = git(repo, "rev-parse", "--short=12", "HEAD")
    digest = matrix_fresh.source_digest(repo)
    write(repo, "adapters/one.py", '"""What One is for, and why."""\n'
                                   "from .._helper import X  # the helper\n"
                                   "EXT = 'speculators_compat.worker.Ext'\n"
                                   "class One:\n    \"\"\"Documented now.\"\"\"\n    ...\n")
    commit(repo, "docstrings and comments only")
    assert matrix_fresh.check(results(first), repo).stale == []
    assert matrix_fresh.source_digest(repo) == digest  # the no-history path agrees
    write(repo, "adapters/one.py", '"""What One is for, and why."""\n'
                                   "from .._helper import X  # the helper\n"
                                   "EXT = 'speculators_compat.worker.Other'\n"
                                   "class One:\n    \"\"\"Documented now.\"\"\"\n    ...\n")
    commit(repo, "a constant changed")
    verdict = matrix_fresh.check(results(first), repo)
    assert len(verdict.stale) == 1 and f"{PKG}/adapters/one.py" in verdict.stale[0]
    assert matrix_fresh.source_digest(repo) != digest


def test_redigest_recomputes_from_each_records_commit(repo):
    first = git(repo, "rev-parse", "--short=12", "HEAD")
    at_first = matrix_fresh.source_digest(repo)
    write(repo, "_helper.py", "X = 2\n")
    commit(repo, "code changed")
    data = results(first, "sha256:old-definition")
    dirty = results(first + "+dirty", "sha256:old-definition")
    assert matrix_fresh.redigest(data, repo) == 3  # doctor, contract, e2e llama
    assert {r.shim_src for r in matrix_fresh.records(data)} == {at_first}
    assert matrix_fresh.redigest(dirty, repo) == 0  # what ran is not in git
    assert matrix_fresh.records(dirty)[0].shim_src == "sha256:old-definition"


def test_unrecorded_and_unknown_commits_are_stale(repo):
    assert matrix_fresh.check(results(""), repo).stale  # no commit recorded
    verdict = matrix_fresh.check(results("0123456789ab"), repo)
    assert "does not have" in verdict.stale[0]


def test_dirty_record_holds_only_with_todays_digest(repo):
    head = git(repo, "rev-parse", "--short=12", "HEAD")
    digest = matrix_fresh.source_digest(repo)
    assert matrix_fresh.check(results(head + "+dirty", digest), repo).stale == []
    assert matrix_fresh.check(results(head + "+dirty", "sha256:other"), repo).stale
    assert matrix_fresh.check(results(head + "+dirty"), repo).stale


def test_shallow_clone_uses_the_digest(repo, tmp_path):
    old = git(repo, "rev-parse", "--short=12", "HEAD")
    old_digest = matrix_fresh.source_digest(repo)
    write(repo, "__main__.py", "print('later')\n")
    commit(repo, "later, cli only")
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", "--depth", "1", f"file://{repo}", str(clone)],
                   check=True, capture_output=True)
    # the record's commit is not in the shallow history: the digest decides
    verdict = matrix_fresh.check(results(old, old_digest), clone)
    assert verdict.stale == [] and verdict.unverified == []
    write(clone, "_helper.py", "CHANGED = 1\n")
    verdict = matrix_fresh.check(results(old, old_digest), clone)
    assert len(verdict.stale) == 1 and "shallow clone" in verdict.stale[0]
    verdict = matrix_fresh.check(results(old), clone)  # no digest: said, not passed
    assert verdict.stale == [] and "git fetch --unshallow" in verdict.unverified[0]


def test_without_git_the_digest_decides(repo, tmp_path):
    head = git(repo, "rev-parse", "--short=12", "HEAD")
    digest = matrix_fresh.source_digest(repo)
    plain = tmp_path / "plain"
    shutil.copytree(repo, plain, ignore=shutil.ignore_patterns(".git"))
    assert matrix_fresh.check(results(head, digest), plain).stale == []
    write(plain, "adapters/one.py", "CHANGED = 1\n")
    assert "not a git checkout" in matrix_fresh.check(results(head, digest), plain).stale[0]
    assert matrix_fresh.check(results(head), plain).unverified
