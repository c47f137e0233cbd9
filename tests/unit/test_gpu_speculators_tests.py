"""The verdict of tests/e2e/scripts/gpu_speculators_tests.py (speculators' own GPU tests run
through the shim) on toy inputs: pytest's last line is parsed in its -q and framed forms, a
skipped test is not ok, and a run importing the wrong speculators or shim is not ok. No
vLLM, torch or transformers needed."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "e2e" / "scripts"))
import gpu_speculators_tests as st  # noqa: E402


@pytest.mark.parametrize(("log", "counts"), [
    ("....\n2 passed in 81.20s (0:01:21)\n", {"passed": 2}),
    ("x\n===== 1 failed, 1 passed, 3 warnings in 12.01s =====\n",
     {"failed": 1, "passed": 1, "warnings": 3}),
    ("ss\nSKIPPED [2] tests/datagen/test_vllm_hidden_states.py:40: CUDA required\n"
     "2 skipped in 0.52s\n", {"skipped": 2}),
    ("E\n1 error in 3.00s\n", {"errors": 1}),
    ("\x1b[32m1 passed\x1b[0m, \x1b[33m1 skipped\x1b[0m in 1.0s\n", {"passed": 1, "skipped": 1}),
    ("2 deselected in 0.1s\n", {"deselected": 2}),
    ("no tests ran in 0.01s\n", {}),
])
def test_parses_pytest_last_line(log, counts):
    assert st.parse_pytest_summary("some output 3 passed earlier\n" + log)["counts"] == counts


def test_no_summary_line_when_pytest_crashed():
    assert st.parse_pytest_summary("Traceback (most recent call last):\n  boom\n") is None


def test_only_a_clean_pass_is_ok():
    assert st.verdict(0, {"line": "", "counts": {"passed": 2}}) == (True, [])
    assert st.verdict(0, {"line": "", "counts": {"passed": 2, "warnings": 5}})[0]


def test_skip_is_a_failure():
    ok, reasons = st.verdict(0, st.parse_pytest_summary("ss\n2 skipped in 0.5s\n"))
    assert not ok
    assert "2 skipped (a skip is a failure here)" in reasons
    ok, _ = st.verdict(0, st.parse_pytest_summary("1 passed, 1 skipped in 0.5s\n"))
    assert not ok


@pytest.mark.parametrize(("rc", "log", "timed_out", "why"), [
    (1, "1 failed, 1 passed in 3s", False, "1 failed"),
    (5, "no tests ran in 0.1s", False, "no test passed"),
    (0, "2 deselected in 0.1s", False, "no test passed"),
    (-9, "1 passed in 3s", True, "timed out"),
    (1, "Traceback", False, "no pytest summary line in the log"),
])
def test_other_failures(rc, log, timed_out, why):
    ok, reasons = st.verdict(rc, st.parse_pytest_summary(log), timed_out)
    assert not ok and why in reasons


def _probe(compat: str, spec: str, version: str) -> dict:
    return {"speculators_compat": {"origin": compat},
            "speculators": {"origin": spec, "version": version}}


def test_probe_names_wrong_imports(tmp_path):
    src, spec = tmp_path / "repo" / "src", tmp_path / "spec-0.4.0.1"
    good = _probe(f"{src}/speculators_compat/__init__.py", f"{spec}/speculators/__init__.py",
                  "0.4.0.1")
    assert st.probe_problems(good, str(src), str(spec), "0.4.0.1") == []
    wheel = _probe("/root/site/speculators_compat/__init__.py",
                   f"{spec}/speculators/__init__.py", "0.4.0.1")
    assert "speculators_compat imported from" in st.probe_problems(
        wheel, str(src), str(spec), "0.4.0.1")[0]
    other = _probe(f"{src}/speculators_compat/__init__.py",
                   f"{tmp_path}/spec-0.3.0/speculators/__init__.py", "0.3.0")
    assert "speculators imported from" in st.probe_problems(
        other, str(src), str(spec), "0.4.0.1")[0]
    mislabelled = _probe(f"{src}/speculators_compat/__init__.py",
                         f"{spec}/speculators/__init__.py", "0.3.0")
    assert "is 0.3.0, not 0.4.0.1" in st.probe_problems(
        mislabelled, str(src), str(spec), "0.4.0.1")[0]
    assert st.probe_problems(None, str(src), str(spec), "0.4.0.1")
    ok, reasons = st.verdict(0, {"line": "", "counts": {"passed": 2}},
                             problems=st.probe_problems(wheel, str(src), str(spec), "0.4.0.1"))
    assert not ok and reasons


def test_stage_tests_copies_the_tree(tmp_path):
    src = tmp_path / "fetched" / "tests" / "datagen"
    src.mkdir(parents=True)
    (src / "__init__.py").write_text("")
    (src / "test_x.py").write_text("def test_x():\n    pass\n")
    work = tmp_path / "work"
    work.mkdir()
    rel = st.stage_tests(src / "test_x.py", work)
    assert rel == Path("tests/datagen/test_x.py")
    assert (work / rel).is_file() and (work / "tests" / "__init__.py").is_file()
    assert (work / "tests" / "datagen" / "__init__.py").is_file()
    assert '"regression:' in (work / "pyproject.toml").read_text()
