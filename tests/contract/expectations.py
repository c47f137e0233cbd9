"""The expectation table: per adapter, the status its probe must reach on a release.

Each row is written from the upstream change its adapter documents (docs/adapters.md) and
lives beside the adapter's contract test, as ``EXPECTED = (fn, why)`` in
``adapters/test_<name>.py``; this module collects them and holds what they share (the
installed environment, :func:`applied_if`). They are checked against the installed
versions by ``test_every_adapter.py``: a future vLLM that changes shape fails there,
loudly. One row per adapter in the registry (``tests/contract/test_registry.py`` checks
that).
"""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Callable, Iterator, Mapping

import pytest
from packaging.version import Version

from speculators_compat._report import Status

APPLIED, NOT_NEEDED = Status.APPLIED, Status.NOT_NEEDED


def V(s: str) -> Version:
    return Version(s)


# --------------------------------------------------------------------------------------
# The installed environment
# --------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Env:
    vllm: Version
    speculators: Version
    transformers_major: int
    cpu_platform: bool
    cuda: bool

    @property
    def speculators_03(self) -> bool:
        return V("0.3.0.dev0") <= self.speculators < V("0.4.0.dev0")

    @property
    def speculators_04(self) -> bool:
        return V("0.4.0.dev0") <= self.speculators < V("0.5.0.dev0")

    def __str__(self) -> str:
        return (f"vllm {self.vllm}, speculators {self.speculators}, transformers "
                f"{self.transformers_major}.x, cpu_platform={self.cpu_platform}, "
                f"cuda={self.cuda}")

def applied_if(applied: bool) -> Status:
    return APPLIED if applied else NOT_NEEDED


def kv_engine_sets(e: Env) -> Status:
    """Engine-set KV-cache state (``kv_cache_config_fields``, ``kv_cache_layout_resolution``).
    Upstream: layout resolution "~0.29+", KVCacheConfig fields "0.29-0.32"; verified: absent
    in 0.16, present in 0.32."""
    return applied_if(e.vllm >= V("0.29.0.dev0"))


#: An expectation: the expected status for an env (``None`` when none is recorded for
#: that release), and why.
Row = tuple[Callable[[Env], "Status | None"], str]


class _Rows(Mapping[str, Row]):
    """adapter name -> its :data:`Row`, read from ``EXPECTED`` of its contract file
    (``adapters/test_<name>.py``) when first asked: each adapter's expectation lives
    beside its test, and adding an adapter adds no row anywhere else."""

    def __init__(self) -> None:
        self._rows: dict[str, Row] | None = None

    def _load(self) -> dict[str, Row]:
        if self._rows is None:
            from speculators_compat.adapters import ADAPTERS

            rows = {}
            for a in ADAPTERS:
                try:
                    module = importlib.import_module(f"{__package__}.adapters.test_{a.name}")
                except ModuleNotFoundError:
                    continue  # test_registry names the adapters without a contract file
                row = getattr(module, "EXPECTED", None)
                if row is not None:
                    rows[a.name] = row
            self._rows = rows
        return self._rows

    def __getitem__(self, name: str) -> Row:
        return self._load()[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._load())

    def __len__(self) -> int:
        return len(self._load())


#: adapter name -> (expected status for an env, or None when no expectation is recorded
#: for that release; why), each from the adapter's own contract file.
EXPECTED: Mapping[str, Row] = _Rows()


def expected_status(name: str, env: Env) -> Status:
    fn, why = EXPECTED[name]
    status = fn(env)
    if status is None:
        pytest.fail(f"no expectation recorded for {name} on {env}: read the installed "
                    f"vLLM source and add it to EXPECTED in tests/contract/adapters/"
                    f"test_{name}.py ({why})")
    return status
