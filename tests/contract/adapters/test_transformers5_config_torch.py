"""Contract of the ``transformers5_config_torch`` adapter,
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

from ..expectations import applied_if
from ..support import (
    BY_NAME,
    TF_CONFIG,
    one,
)

NAME = "transformers5_config_torch"

#: Its expected status on the installed release, and why (read by ``expectations.py``).
EXPECTED = (
    lambda e: applied_if(e.transformers_major >= 5),
    "transformers 5 annotates PretrainedConfig.dtype with torch imported only under "
    "TYPE_CHECKING: `import speculators` raises PydanticUndefinedAnnotation")


def test_legacy_call_shape(base, vllm_config):
    legacy_call_shape(base, base.gen, vllm_config, BY_NAME[NAME])


def legacy_call_shape(base, gen, cfg, adapter):
    import speculators.config as sc

    def define_config():
        # What speculators' modules do at import: subclass SpeculatorModelConfig (a
        # pydantic model over transformers' PretrainedConfig) and build its schema.
        class CompatContractConfig(sc.SpeculatorModelConfig):
            pass

        CompatContractConfig.model_rebuild(force=True)
        return CompatContractConfig

    with base.suspended():
        if base.env.transformers_major >= 5:
            from pydantic.errors import PydanticUndefinedAnnotation

            with pytest.raises(PydanticUndefinedAnnotation, match="torch"):
                define_config()
        else:
            define_config()
        with one(base, adapter) as applied:
            assert applied == (base.env.transformers_major >= 5)
            define_config()
            if applied:
                import torch

                assert importlib.import_module(TF_CONFIG).torch is torch
        assert "torch" not in vars(importlib.import_module(TF_CONFIG)) or not applied
