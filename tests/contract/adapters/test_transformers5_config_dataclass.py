"""Contract of the ``transformers5_config_dataclass`` adapter, on the installed
transformers and speculators.

Speculators' own call shape (a ``SpeculatorModelConfig`` subclass without an ``__init__``,
built with keywords) raises the issue's ``AttributeError`` bare on transformers 5 and works
through the adapter; transformers' own subclasses still get transformers' dataclass
treatment.

The checks every adapter shares (probe vs. expectation table, apply/revert identity,
declared targets only) are in tests/contract/test_every_adapter.py.
"""

from __future__ import annotations

import pytest

from ..expectations import applied_if
from ..support import (
    BY_NAME,
    activated,
    one,
)

NAME = "transformers5_config_dataclass"

#: Its expected status on the installed release, and why (read by ``expectations.py``).
EXPECTED = (
    lambda e: applied_if(e.transformers_major >= 5),
    "transformers 5 makes every PretrainedConfig subclass a dataclass with a generated "
    "__init__: speculators' pydantic configs raise AttributeError __pydantic_fields_set__")


def define_and_build():
    """What speculators' modules do: subclass SpeculatorModelConfig without an __init__
    (as Eagle3SpeculatorConfig does) and build one with keywords."""
    from pydantic import Field
    from speculators.config import SpeculatorModelConfig

    class CompatContractDataclassConfig(SpeculatorModelConfig):
        speculators_model_type: str = "compat_contract"
        width: int = Field(default=3)

    CompatContractDataclassConfig.model_rebuild(force=True)
    return CompatContractDataclassConfig, CompatContractDataclassConfig(width=5)


def test_legacy_call_shape(base):
    from transformers import PretrainedConfig

    adapter = BY_NAME[NAME]
    torch_fix = BY_NAME["transformers5_config_torch"]
    with base.suspended(), activated(torch_fix):
        if base.env.transformers_major >= 5:
            with pytest.raises(AttributeError, match="__pydantic_fields_set__"):
                define_and_build()
        else:
            define_and_build()
        with one(base, adapter) as applied:
            assert applied == (base.env.transformers_major >= 5)
            cls, config = define_and_build()
            assert config.width == 5 and config.speculators_model_type == "compat_contract"
            assert "__init__" not in vars(cls) and "__eq__" not in vars(cls)
            assert config.to_dict()["width"] == 5

            # Scope: a plain transformers subclass goes through transformers' hook unchanged.
            class PlainConfig(PretrainedConfig):
                model_type = "compat_contract_plain"

            assert ("__init__" in vars(PlainConfig)) == (base.env.transformers_major >= 5)
