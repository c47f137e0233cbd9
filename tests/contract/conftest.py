"""Fixtures of the contract suite: speculators' generator imported once per session."""

from __future__ import annotations

import importlib
import importlib.util
import os
from collections.abc import Iterator

import pytest
from helpers import require_speculators, vllm_version

from speculators_compat import _env
from speculators_compat._activation import Activation
from speculators_compat._adapter import Stage
from speculators_compat.adapters import ADAPTERS

from .support import (
    GEN,
    USER_CHOICES,
    Base,
    _env_facts,
    activated,
    build_vllm_config,
    platform_detected,
)


@pytest.fixture(scope="session")
def base() -> Iterator[Base]:
    require_speculators()
    # Activation reads these; the suite must not inherit a user's settings.
    names = (_env.DISABLE, _env.STRICT, _env.REPORT_FILE, _env.ACTIVE, "VLLM_CACHE_ROOT",
             *USER_CHOICES)
    saved = {k: os.environ.pop(k) for k in names if k in os.environ}
    # vLLM caches model-class inspection under $VLLM_CACHE_ROOT/modelinfos keyed by
    # architecture only (the file hash is checked on read), so envs of different vLLM
    # releases sharing the default root evict each other and every ModelConfig then
    # re-inspects in a subprocess (~15 s). One root per release, unless the user set one.
    os.environ["VLLM_CACHE_ROOT"] = saved.get("VLLM_CACHE_ROOT") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "vllm",
        "speculators-compat-contract", str(vllm_version()))
    def staged(stage: Stage) -> Activation:
        return Activation(lambda: [a for a in ADAPTERS if a.stage is stage])

    activations = [staged(Stage.BEFORE_SPECULATORS_IMPORT)]
    activations[0].activate(process="driver")
    try:
        try:
            gen = importlib.import_module(GEN)
        except ImportError:
            # vLLM >= 0.33: the generator's own imports need the relocated helpers.
            activations.append(staged(Stage.BEFORE_GENERATOR_IMPORT))
            activations[-1].activate(process="driver")
            gen = importlib.import_module(GEN)
        env = _env_facts()
        # Warm-up: run every probe once so lazy imports / caches they trigger happen
        # before any namespace snapshot (they are not changes made by an adapter).
        with activated(*ADAPTERS):
            pass
        yield Base(activations, gen, env)
    finally:
        for act in reversed(activations):
            act.deactivate()
        for k in names:
            os.environ.pop(k, None)
        os.environ.update(saved)

@pytest.fixture(scope="session")
def vllm_config(base):
    """A config whose KV layout is not resolved (as speculators leaves it); ``None``
    where vLLM detects no platform (checks that need one skip themselves)."""
    return build_vllm_config() if platform_detected() else None
