"""The capture's reading of vLLM's real model code (no engine started)."""

from __future__ import annotations

import inspect
import re

import pytest

from speculators_compat._errors import CompatError

from .support import (
    Base,
)


def test_fp16_unscale_factor_reads_vllm_deepseek_layer(base: Base, monkeypatch):
    """The fp16 overflow guard of vLLM's real ``DeepseekV2DecoderLayer.forward`` is found
    (factor = routed_scaling_factor); when the source cannot be read, or scales in a form
    not known, a float16 layer raises instead of silently using 1.0."""
    import torch
    from vllm.model_executor.models.deepseek_v2 import DeepseekV2DecoderLayer

    from speculators_compat._capture import fp16_unscale_factor

    def layer(cls=DeepseekV2DecoderLayer, dtype=torch.float16, factor=2.5):
        obj = object.__new__(cls)
        torch.nn.Module.__init__(obj)
        obj.routed_scaling_factor = factor
        obj.norm = torch.nn.Parameter(torch.ones(4, dtype=dtype))
        return obj

    # vLLM's guard: `1.0 / self.routed_scaling_factor` (0.12+), `1. / ...` (0.11)
    assert re.search(r"\b1\.0* / self\.routed_scaling_factor",
                     inspect.getsource(DeepseekV2DecoderLayer.forward))
    assert fp16_unscale_factor(layer()) == 2.5
    assert fp16_unscale_factor(layer(factor=1.0)) == 1.0

    class Renamed(DeepseekV2DecoderLayer):  # a future vLLM writing the guard otherwise
        def forward(self, hidden_states, residual):
            return hidden_states / self.routed_scaling_factor, residual

    class NoGuard(DeepseekV2DecoderLayer):  # a future vLLM without the guard
        def forward(self, hidden_states, residual):
            return hidden_states, residual

    with pytest.raises(CompatError, match="routed_scaling_factor"):
        fp16_unscale_factor(layer(Renamed))
    assert fp16_unscale_factor(layer(NoGuard)) == 1.0
    assert fp16_unscale_factor(layer(Renamed, dtype=torch.bfloat16)) == 1.0

    def no_source(obj):
        raise OSError("could not get source code")

    monkeypatch.setattr(inspect, "getsource", no_source)
    with pytest.raises(CompatError, match="cannot read the source"):
        fp16_unscale_factor(layer())
    assert fp16_unscale_factor(layer(dtype=torch.bfloat16)) == 1.0  # never applied to bf16
