"""tools/matrix/speculators_suites.py: junit parsing, hub classification, merging, the pinned-stack
verdict, and its section of the support matrix (no vLLM, no speculators needed)."""

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools" / "matrix"))
import matrix_render  # noqa: E402
import speculators_suites as suites  # noqa: E402

JUNIT = """<?xml version="1.0"?><testsuites><testsuite>
<testcase classname="tests.unit.test_config" name="test_ok"/>
<testcase classname="tests.unit.test_config" name="test_broken">\
<failure message="AttributeError: x">tb</failure></testcase>
<testcase classname="tests.unit.utils.test_loading" name="test_hub"><failure message="boom">\
huggingface_hub.errors.LocalEntryNotFoundError: offline</failure></testcase>
<testcase classname="tests.unit.test_model" name="test_err"><error message="E">tb</error></testcase>
<testcase classname="tests.unit.test_model" name="test_skip"><skipped message="s"/></testcase>
</testsuite></testsuites>"""


def junit(tmp_path: Path, name: str, text: str = JUNIT) -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


def test_parse_counts_and_hub(tmp_path):
    r = suites.parse_junit(junit(tmp_path, "a.xml"))
    assert (r["passed"], r["failed"], r["error"], r["skipped"]) == (1, 2, 1, 1)
    assert r["hub_failures"] == ["tests.unit.utils.test_loading::test_hub"]
    assert r["non_hub_failures"] == ["tests.unit.test_config::test_broken",
                                     "tests.unit.test_model::test_err"]


def test_merge_later_part_wins_and_drops_the_interrupted_entry(tmp_path):
    first = junit(tmp_path, "a.xml", JUNIT.replace(
        '<testcase classname="tests.unit.test_model" name="test_skip">',
        '<testcase classname="" name="interrupted"/><testcase classname="tests.unit.test_model" '
        'name="test_skip">'))
    second = junit(tmp_path, "b.xml", """<testsuites><testsuite>
<testcase classname="tests.unit.test_model" name="test_err"/></testsuite></testsuites>""")
    m = suites.merge_junit([first, second])
    assert m["outcomes"]["tests.unit.test_model::test_err"] == "passed"
    assert "::interrupted" not in m["outcomes"]
    assert m["error"] == 0 and m["passed"] == 2


def test_verdict_names_pinned_passes_that_regress(tmp_path):
    pinned = suites.parse_junit(junit(tmp_path, "p.xml", JUNIT.replace(
        '<failure message="AttributeError: x">tb</failure>', "")))
    new = suites.parse_junit(junit(tmp_path, "n.xml"))
    v = suites.verdicts({"0.4.0.1": {"0.16.0": {"bare": pinned}, "0.32.0": {"shim": new}}})
    key = "0.4.0.1 on vLLM 0.32.0 with the shim"
    assert v[key]["regressed"] == ["tests.unit.test_config::test_broken"] and not v[key]["ok"]
    ok = suites.verdicts({"0.4.0.1": {"0.16.0": {"bare": new}, "0.32.0": {"shim": new}}})
    assert ok[key]["ok"]


def test_matrix_section_renders_counts(tmp_path):
    r = suites.parse_junit(junit(tmp_path, "a.xml"))
    doc = {"pinned_env": "0.16.0", "results": {"0.4.0.1": {"0.32.0": {"shim": r}}},
           "verdicts": {}, "notes": ["a note"]}
    (tmp_path / "speculators-suites-2026-12-01.json").write_text(json.dumps(doc))
    text = "\n".join(matrix_render.render_suites(tmp_path))
    assert "| 0.4.0.1 | 0.32.0 | shim | 1 | 2 | 1 | 1 |" in text
    assert "`test_broken`" in text and "- a note" in text
    assert matrix_render.render_suites(tmp_path / "none") == []
