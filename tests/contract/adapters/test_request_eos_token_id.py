"""Contract of the ``request_eos_token_id`` adapter,
on the installed vLLM and speculators.

Speculators' legacy call shape fails (or is wrong) bare where the upstream note says
so and works through the adapter. The checks every adapter shares (the probe agrees with
the expectation table, apply/revert restores identity and changes only the declared
targets) run for every adapter in tests/contract/test_every_adapter.py.
"""

from __future__ import annotations

import importlib
import importlib.util

import pytest

from ..expectations import V, applied_if
from ..support import (
    BY_NAME,
    one,
)

NAME = "request_eos_token_id"

#: Its expected status on the installed release, and why (read by ``expectations.py``).
EXPECTED = (
    lambda e: applied_if(e.vllm >= V("0.17.0.dev0")),
    "Request.__init__ lost eos_token_id in 0.17")


def test_legacy_call_shape(base, vllm_config):
    legacy_call_shape(base, base.gen, vllm_config, BY_NAME[NAME])


def legacy_call_shape(base, gen, cfg, adapter):
    from vllm.sampling_params import SamplingParams

    def call():
        kwargs = dict(request_id="req_0_0", prompt_token_ids=[1, 2, 3],
                      sampling_params=SamplingParams(max_tokens=1, temperature=0.0),
                      pooling_params=None, eos_token_id=2, arrival_time=0.0)
        if base.env.speculators_04:
            kwargs["block_hasher"] = None  # 0.4 passes its block hasher too
        return gen.Request(**kwargs)

    needed = base.env.vllm >= V("0.17.0.dev0")
    if needed:
        # upstream error text: "Request.__init__() got an unexpected keyword argument
        # 'eos_token_id'" (0.3/0.4 on 0.17+).
        with pytest.raises(TypeError, match="unexpected keyword argument 'eos_token_id'"):
            call()
    else:
        call()
    with one(base, adapter) as applied:
        req = call()
        assert req.request_id == "req_0_0" and list(req.prompt_token_ids) == [1, 2, 3]
        assert isinstance(req, importlib.import_module("vllm.v1.request").Request)
    assert applied == needed
