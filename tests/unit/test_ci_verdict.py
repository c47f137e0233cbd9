"""``tools/envs.py test`` cannot pass empty: skips outside the allow-list and suites that
ran fewer tests than their minimum fail the combination (read from a junit file)."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools"))
import envs  # noqa: E402

REQUIRE = {"tests/contract": 2, "tests/e2e": 1}


def junit(tmp_path: Path, cases: list[tuple[str, str, str]], why: str = "why") -> Path:
    """cases: (classname, name, outcome) with outcome passed/skipped/failed."""
    body = []
    for cls, name, outcome in cases:
        inner = {"passed": "", "skipped": f'<skipped message="{why}"/>',
                 "failed": '<failure message="boom"/>'}[outcome]
        body.append(f'<testcase classname="{cls}" name="{name}">{inner}</testcase>')
    path = tmp_path / "j.xml"
    path.write_text(f'<testsuites><testsuite name="pytest" tests="{len(cases)}">'
                    f'{"".join(body)}</testsuite></testsuites>')
    return path


GOOD = [("tests.contract.test_adapters", "test_a", "passed"),
        ("tests.contract.test_adapters.TestKinds", "test_b[x]", "passed"),
        ("tests.e2e.test_generator", "test_llama_hidden_states_match_transformers", "passed")]


def test_test_ids():
    import xml.etree.ElementTree as ET

    case = ET.fromstring('<testcase classname="tests.contract.test_adapters.TestKinds" '
                         'name="test_b[x]"/>')
    assert envs._test_id(case) == "tests/contract/test_adapters.py::TestKinds::test_b[x]"


def test_complete_run_passes(tmp_path):
    counts, problems = envs.junit_verdict(junit(tmp_path, GOOD), "0.32.0", "0.4.0.1", REQUIRE)
    assert problems == [] and counts == {"passed": 3, "failed": 0, "skipped": 0}


def test_every_test_skipped_fails(tmp_path):
    cases = [(c, n, "skipped") for c, n, _ in GOOD]
    _, problems = envs.junit_verdict(junit(tmp_path, cases), "0.32.0", "0.4.0.1", REQUIRE)
    assert sum("skip not allowed" in p for p in problems) == 3
    assert any("tests/contract: only 0 tests ran (minimum 2)" in p for p in problems)
    assert any("tests/e2e: only 0 tests ran (minimum 1)" in p for p in problems)


def test_allowed_skip_only_where_it_applies(tmp_path):
    chunked = ("tests.e2e.test_generator", "test_chunked_prefill_gives_whole_sequences",
               "skipped")
    path = junit(tmp_path, [*GOOD, chunked])
    _, problems = envs.junit_verdict(path, "0.32.0", "0.3.0", REQUIRE)
    assert problems == []  # speculators 0.3 has no max_num_batched_tokens
    _, problems = envs.junit_verdict(path, "0.32.0", "0.4.0.1", REQUIRE)
    assert problems == ["skip not allowed here: tests/e2e/test_generator.py::"
                        "test_chunked_prefill_gives_whole_sequences (why)"]
    mla = ("tests.e2e.test_models", "test_deepseek_llama_4_scaling_is_kept", "skipped")
    path = junit(tmp_path, [*GOOD, mla])
    assert envs.junit_verdict(path, "0.16.0", "0.4.0.1", REQUIRE)[1] == []
    assert len(envs.junit_verdict(path, "0.32.0", "0.4.0.1", REQUIRE)[1]) == 1


def test_failures_counted(tmp_path):
    cases = [*GOOD, ("tests.e2e.test_errors", "test_x", "failed")]
    counts, problems = envs.junit_verdict(junit(tmp_path, cases), "0.32.0", "0.4.0.1", REQUIRE)
    assert counts["failed"] == 1 and problems == []


def test_unit_suite_skips_are_not_policed(tmp_path):
    cases = [("tests.unit.test_capture", "test_x", "skipped")]
    counts, problems = envs.junit_verdict(junit(tmp_path, cases), None, None, {})
    assert problems == [] and counts["skipped"] == 1


def test_lint_verdict_fails_on_findings_and_on_ruff_errors():
    assert envs.lint_verdict(0) == {"passed": 1, "failed": 0, "skipped": 0}
    assert envs.lint_verdict(1)["failed"] == 1  # findings
    assert envs.lint_verdict(2)["failed"] == 1  # ruff itself failed (config, missing)


def test_lanes_alternate_envs_newest_first_and_cover_every_combination():
    order = envs.lane_order(["0.16.0", "0.32.0"], ("0.3.0", "0.4.0.1"))
    assert order == [("0.32.0", "0.4.0.1"), ("0.16.0", "0.4.0.1"),
                     ("0.32.0", "0.3.0"), ("0.16.0", "0.3.0")]
    # two lanes never start two combinations of one env together
    assert order[0][0] != order[1][0]


def test_jobs_from_environment(monkeypatch):
    monkeypatch.setenv("SPECULATORS_COMPAT_TEST_JOBS", "1")
    assert envs.default_jobs() == 1
    monkeypatch.delenv("SPECULATORS_COMPAT_TEST_JOBS")
    monkeypatch.setattr(envs.os, "cpu_count", lambda: 8)
    assert envs.default_jobs() == 2
    monkeypatch.setattr(envs.os, "cpu_count", lambda: 1)
    assert envs.default_jobs() == 1


def test_combinations_all_counted_with_lanes(monkeypatch):
    seen = []

    def fake(vllm, spec, paths, label, extra, prefix=None):
        seen.append((label, prefix))
        return {"passed": 1, "failed": int(spec == "bad"), "skipped": 0}

    monkeypatch.setattr(envs, "_pytest", fake)
    combos = [("0.32.0", "0.4.0.1"), ("0.16.0", "bad"), ("0.32.0", "0.3.0")]
    results = envs.run_combinations(combos, 2, ["tests/e2e"], [])
    assert set(results) == set(combos) and results[("0.16.0", "bad")]["failed"] == 1
    assert all(prefix for _, prefix in seen) and len(seen) == 3
    seen.clear()
    envs.run_combinations(combos, 1, ["tests/e2e"], [])
    assert [p for _, p in seen] == [None] * 3  # one by one: output passes through


NO_PLATFORM = (envs.NO_PLATFORM_SKIP + " (CUDA build, no GPU): configs, KV caches and "
               "schedulers cannot be built")


def test_contract_level_skips_only_in_contract_envs(tmp_path):
    """A CUDA-build env (level contract) passes with its no-platform skips; the same skips
    fail a CPU-build env, another reason fails, and a test off the list fails."""
    assert envs.RECIPES["0.34.0"].level == "contract"
    listed = ("tests.contract.adapters.test_scheduler_block_size", "test_legacy_call_shape",
              "skipped")
    path = junit(tmp_path, [*GOOD, listed], why=NO_PLATFORM)
    assert envs.junit_verdict(path, "0.34.0", "0.4.0.1", REQUIRE)[1] == []
    assert len(envs.junit_verdict(path, "0.32.0", "0.4.0.1", REQUIRE)[1]) == 1
    other_reason = junit(tmp_path, [*GOOD, listed], why="something else")
    assert len(envs.junit_verdict(other_reason, "0.34.0", "0.4.0.1", REQUIRE)[1]) == 1
    off_list = ("tests.contract.adapters.test_scheduler_block_size",
                "test_probe_agrees_with_release", "skipped")
    path = junit(tmp_path, [*GOOD, off_list], why=NO_PLATFORM)
    assert len(envs.junit_verdict(path, "0.34.0", "0.4.0.1", REQUIRE)[1]) == 1


def test_contract_level_skips_name_tests_that_exist():
    """Every listed id is a test function of the contract suite (a renamed test would
    otherwise leave an entry that allows nothing and hide nothing)."""
    for tid in envs.CONTRACT_LEVEL_SKIPS:
        path, name = tid.split("::")
        assert f"def {name}(" in (ROOT / path).read_text(), tid


def test_a_path_selection_runs_only_in_the_suites_it_names():
    """``envs.py test tests/e2e/test_transport.py -s`` runs that file in the real-vLLM
    combinations only (collected in the unit suite's interpreter it was an error)."""
    assert envs._split_selection(["tests/e2e/test_transport.py", "-s"]) == (
        [], ["tests/e2e/test_transport.py"], ["-s"])
    assert envs._split_selection(["tests/unit/test_matrix_proof.py::test_x", "tests/contract"]) == (
        ["tests/unit/test_matrix_proof.py::test_x"], ["tests/contract"], [])
    assert envs._split_selection(["-k", "transport"]) == (None, None, ["-k", "transport"])
