"""Contract of the ``scheduler_config_encoder_decoder`` adapter,
on the installed vLLM and speculators.

Speculators' legacy call shape fails (or is wrong) bare where the upstream note says
so and works through the adapter. The checks every adapter shares (the probe agrees with
the expectation table, apply/revert restores identity and changes only the declared
targets) run for every adapter in tests/contract/test_every_adapter.py.
"""

from __future__ import annotations

import inspect

import pytest

from ..expectations import V, applied_if
from ..support import (
    BY_NAME,
    SCHEDULER_CONFIG_03,
    one,
)

NAME = "scheduler_config_encoder_decoder"

#: Its expected status on the installed release, and why (read by ``expectations.py``).
EXPECTED = (
    lambda e: applied_if(e.vllm >= V("0.12.0.dev0") and e.speculators_03),
    "SchedulerConfig.is_encoder_decoder is a required InitVar from 0.12 (0.4 passes it)")


def test_legacy_call_shape(base, vllm_config):
    legacy_call_shape(base, base.gen, vllm_config, BY_NAME[NAME])


def legacy_call_shape(base, gen, cfg, adapter):
    needed = base.env.vllm >= V("0.12.0.dev0")
    if needed:
        # upstream error text: "ValidationError ... SchedulerConfig ... is_encoder_decoder Field
        # required" (speculators 0.3.0 on 0.12+).
        with pytest.raises(Exception, match=r"(?s)is_encoder_decoder.*Field required"):
            gen.SchedulerConfig(**SCHEDULER_CONFIG_03)
    passes = "is_encoder_decoder=False" in inspect.getsource(gen)
    assert passes == base.env.speculators_04
    with one(base, adapter) as applied:
        if not passes:
            sc = gen.SchedulerConfig(**SCHEDULER_CONFIG_03)
            assert (sc.max_num_seqs, sc.max_num_batched_tokens) == (32, 8192)
        if needed:  # 0.4.x's call (passes it itself) works either way.
            gen.SchedulerConfig(**SCHEDULER_CONFIG_03, is_encoder_decoder=False)
    assert applied == (needed and not passes)
