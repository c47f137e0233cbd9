"""Contract of the ``worker_spawn_method`` adapter,
on the installed vLLM and speculators.

Speculators' legacy call shape fails (or is wrong) bare where the upstream note says
so and works through the adapter. The checks every adapter shares (the probe agrees with
the expectation table, apply/revert restores identity and changes only the declared
targets) run for every adapter in tests/contract/test_every_adapter.py.
"""

from __future__ import annotations

import os

from ..expectations import applied_if
from ..support import (
    BY_NAME,
    _build_vllm_config,
    env_during_generator_init,
    one,
)

NAME = "worker_spawn_method"

#: Its expected status on the installed release, and why (read by ``expectations.py``).
EXPECTED = (
    # The suite runs with VLLM_WORKER_MULTIPROC_METHOD unset (as a user would); vLLM
    # forces spawn only on its own engine paths, not for a MultiprocExecutor built
    # directly; but on CPU, building a VllmConfig sets it as a side effect.
    lambda e: applied_if(not e.cpu_platform),
    "the generator starts MultiprocExecutor itself; fork breaks with CUDA initialised")


def test_legacy_call_shape(base, vllm_config):
    legacy_call_shape(base, base.gen, vllm_config, BY_NAME[NAME])


def legacy_call_shape(base, gen, cfg, adapter):
    import vllm.envs as envs

    var = "VLLM_WORKER_MULTIPROC_METHOD"
    assert var in envs.environment_variables
    assert os.environ.get(var) is None
    # Bare: the generator's MultiprocExecutor would start with vLLM's default (fork).
    assert env_during_generator_init(gen)[var] is None
    assert envs.VLLM_WORKER_MULTIPROC_METHOD == "fork"
    if base.env.cpu_platform:
        # ...except on CPU, whose platform sets spawn when speculators builds its config.
        saved = dict(os.environ)
        try:
            _build_vllm_config()
            assert os.environ.get(var) == "spawn"
        finally:
            os.environ.clear()
            os.environ.update(saved)
        with one(base, adapter) as applied:
            assert not applied
        return
    with one(base, adapter) as applied:
        assert applied
        assert env_during_generator_init(gen)[var] == "spawn"
        assert var not in os.environ  # restored after __init__
        os.environ[var] = "fork"  # a user's explicit choice is kept
        try:
            assert env_during_generator_init(gen)[var] == "fork"
            assert os.environ[var] == "fork"
        finally:
            del os.environ[var]
