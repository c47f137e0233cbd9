"""Shared fixtures for the unit tests: toy adapters, fresh activations, clean env.

No vLLM, torch or transformers: only ``packaging``, ``wrapt`` and ``pytest``.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from typing import Any

import pytest

from speculators_compat import _versions
from speculators_compat._activation import Activation
from speculators_compat._adapter import Adapter, Context, Phase, Verdict
from speculators_compat._patcher import Patcher
from speculators_compat._report import Kind

ENV_PREFIX = "SPECULATORS_COMPAT_"


class ToyAdapter(Adapter):
    """Configurable adapter that counts probe/apply calls.

    ``verdict`` is a :class:`Verdict`, an exception instance (raised by probe), or a
    callable ``ctx -> Verdict``. ``change`` is a callable ``(patcher, ctx) -> None``
    that makes the adapter's changes (it may raise to simulate a half-applied adapter).
    """

    def __init__(self, name: str, *, phase: Phase = Phase.DRIVER,
                 verdict: Any = None,
                 change: Callable[[Patcher, Context], None] | None = None,
                 upstream: str = "", summary: str = "", vllm_range: str | None = None,
                 kind: Kind = Kind.UPSTREAM_CHANGE, requires: tuple[str, ...] = ()):
        self.name = name
        self.requires = requires
        self.kind = kind
        self.phase = phase
        self.upstream = upstream or f"upstream change for {name}"
        self.summary = summary or f"toy adapter {name}"
        self.vllm_range = vllm_range
        self._verdict = Verdict.needed(f"{name} needed") if verdict is None else verdict
        self._change = change
        self.probe_calls = 0
        self.apply_calls = 0
        self._count_lock = threading.Lock()

    def probe(self, ctx: Context) -> Verdict:
        with self._count_lock:
            self.probe_calls += 1
        v = self._verdict
        if isinstance(v, BaseException):
            raise v
        if callable(v) and not isinstance(v, Verdict):
            return v(ctx)
        return v

    def apply(self, patcher: Patcher, ctx: Context) -> None:
        with self._count_lock:
            self.apply_calls += 1
        if self._change is not None:
            self._change(patcher, ctx)


@pytest.fixture
def toy() -> type[ToyAdapter]:
    return ToyAdapter


@pytest.fixture(autouse=True)
def _clean_env_and_cache():
    """Every test starts without SPECULATORS_COMPAT_* variables and with an empty
    version cache, and leaves os.environ exactly as it found it."""
    saved = {k: v for k, v in os.environ.items() if k.startswith(ENV_PREFIX)}
    for k in saved:
        del os.environ[k]
    _versions.clear_cache()
    try:
        yield
    finally:
        for k in [k for k in os.environ if k.startswith(ENV_PREFIX)]:
            del os.environ[k]
        os.environ.update(saved)
        _versions.clear_cache()


@pytest.fixture
def make_activation():
    """``make_activation(*adapters)`` -> a fresh :class:`Activation` over the toy
    adapters; every activation made this way is deactivated at teardown (before the
    env fixture restores the environment)."""
    made: list[Activation] = []

    def factory(*adapters: Adapter) -> Activation:
        act = Activation(lambda: list(adapters))
        made.append(act)
        return act

    yield factory
    for act in reversed(made):
        act.deactivate()


@pytest.fixture
def toy_global(monkeypatch, make_activation):
    """Replace the package-global activation by one over toy adapters; returns a
    function ``(*adapters) -> Activation`` that installs it."""
    from speculators_compat import _process

    def install(*adapters: Adapter) -> Activation:
        act = make_activation(*adapters)
        monkeypatch.setattr(_process, "ACTIVATION", act)
        return act

    return install
