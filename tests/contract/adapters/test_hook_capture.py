"""Contract of the ``hook_capture`` adapter,
on the installed vLLM and speculators.

Speculators' legacy call shape fails (or is wrong) bare where the upstream note says
so and works through the adapter. The checks every adapter shares (the probe agrees with
the expectation table, apply/revert restores identity and changes only the declared
targets) run for every adapter in tests/contract/test_every_adapter.py.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import os

import pytest

from speculators_compat._errors import CompatError

from ..expectations import V, applied_if
from ..support import (
    BY_NAME,
    SPECULATORS_EXTENSION,
    env_during_generator_init,
    one,
)

NAME = "hook_capture"

#: Its expected status on the installed release, and why (read by ``expectations.py``).
EXPECTED = (
    # 0.3 contract: get_input_embeddings -> embed_input_ids (0.11.1);
    # 0.4 contract: DeepseekV2 llama_4_scaling (0.12) and Model Runner V2.
    lambda e: applied_if(e.vllm >= (V("0.11.1.dev0") if e.speculators_03
                                 else V("0.12.0.dev0"))),
    "speculators' copied model forward no longer matches vLLM's models")


def test_legacy_call_shape(base, vllm_config):
    legacy_call_shape(base, base.gen, vllm_config, BY_NAME[NAME])


def legacy_call_shape(base, gen, cfg, adapter):
    from vllm.model_executor.models.deepseek_v2 import DeepseekV2DecoderLayer
    from vllm.model_executor.models.llama import LlamaModel

    from speculators_compat import worker_extension

    # Upstream facts behind the verdict.
    renamed = base.env.vllm >= V("0.11.1.dev0")
    assert hasattr(LlamaModel, "get_input_embeddings") != renamed  # 0.11.1 rename
    assert hasattr(LlamaModel, "embed_input_ids") == renamed
    assert ("llama_4_scaling" in inspect.signature(DeepseekV2DecoderLayer.forward).parameters
            ) == (base.env.vllm >= V("0.12.0.dev0"))
    assert SPECULATORS_EXTENSION in inspect.getsource(gen)

    call = dict(tensor_parallel_size=1, worker_extension_cls=SPECULATORS_EXTENSION)
    assert gen.ParallelConfig(**call).worker_extension_cls == SPECULATORS_EXTENSION
    if not renamed:
        # 0.11.0 (speculators 0.3.0's own pin): speculators' forward loop matches vLLM.
        with one(base, adapter) as applied:
            assert not applied
            assert gen.ParallelConfig(**call).worker_extension_cls == SPECULATORS_EXTENSION
        return
    contract = "list" if base.env.speculators_03 else "by_request"
    with one(base, adapter) as applied:
        assert applied
        pc = gen.ParallelConfig(**call)
        assert pc.worker_extension_cls == worker_extension.EXTENSIONS[contract]
        module, _, cls = pc.worker_extension_cls.rpartition(".")
        assert isinstance(getattr(importlib.import_module(module), cls), type)
        # other extensions are left alone
        other = gen.ParallelConfig(tensor_parallel_size=1, worker_extension_cls="a.B")
        assert other.worker_extension_cls == "a.B"
        with pytest.raises(CompatError, match="pipeline_parallel_size=2"):
            gen.ParallelConfig(**call, pipeline_parallel_size=2)
        assert isinstance(pc, importlib.import_module("vllm.config").ParallelConfig)
        # Where the release has the Model Runner V2 switch, the generator's construction
        # (and so its spawned workers) runs with the V1 runner; restored afterwards.
        switch = "VLLM_USE_V2_MODEL_RUNNER"
        has_switch = switch in importlib.import_module("vllm.envs").environment_variables
        assert env_during_generator_init(gen)[switch] == ("0" if has_switch else None)
        assert switch not in os.environ
