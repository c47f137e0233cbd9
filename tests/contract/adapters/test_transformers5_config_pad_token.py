"""Contract of the ``transformers5_config_pad_token`` adapter, on the installed
transformers and speculators.

Speculators' call shape (an EAGLE draft over a layer config class without ``pad_token_id``,
as speculators' own ``test_eagle_speculator_auto_architecture_error_handling`` builds it)
raises ``AttributeError`` bare on transformers 5 and reaches speculators' own error through
the adapter, leaving the config object without the attribute.

The adapter is a pre-import one (``Stage.BEFORE_GENERATOR_IMPORT``): on vLLM >= 0.33 the
session fixture holds it active (the generator's own imports need that stage), so the
bare call runs with the session's copy suspended (``adapter_context``); otherwise the
"bare" call would already go through the adapter and reach speculators' ``TypeError``.

The checks every adapter shares (probe vs. expectation table, apply/revert identity,
declared targets only) are in tests/contract/test_every_adapter.py.
"""

from __future__ import annotations

import pytest

from ..expectations import applied_if
from ..support import (
    APPLIED,
    BY_NAME,
    activated,
    adapter_context,
    expected_status,
)

NAME = "transformers5_config_pad_token"

#: Its expected status on the installed release, and why (read by ``expectations.py``).
EXPECTED = (
    lambda e: applied_if(e.transformers_major >= 5),
    "transformers 5 dropped pad_token_id from the PreTrainedConfig base; speculators' "
    "EagleSpeculator.__init__ reads transformer_layer_config.pad_token_id")


def eagle_config():
    from speculators import SpeculatorsConfig, VerifierConfig
    from speculators.models.eagle import EagleSpeculatorConfig
    from speculators.proposals.greedy import GreedyTokenProposalConfig
    from transformers import PretrainedConfig

    class CompatContractCustomConfig(PretrainedConfig):
        model_type = "compat_contract_custom"

        def __init__(self, **kwargs):
            super().__init__(**kwargs)
            self.vocab_size, self.hidden_size, self.intermediate_size = 320, 64, 128
            self.num_hidden_layers, self.num_attention_heads = 1, 4
            self.max_position_embeddings = 128

    layer = CompatContractCustomConfig()
    return layer, EagleSpeculatorConfig(
        transformer_layer_architecture="auto", transformer_layer_config=layer,
        speculators_config=SpeculatorsConfig(
            algorithm="eagle", proposal_methods=[GreedyTokenProposalConfig()],
            default_proposal_method="greedy",
            verifier=VerifierConfig(name_or_path="test/verifier",
                                    architectures=["CustomForCausalLM"])))


def test_legacy_call_shape(base):
    from speculators.models.eagle import EagleSpeculator

    adapter = BY_NAME[NAME]
    tf5 = base.env.transformers_major >= 5
    layer, config = eagle_config()
    speculators_error = "is not a valid causal language model config class"
    with adapter_context(base, NAME):
        if tf5:
            with pytest.raises(AttributeError, match="pad_token_id"):
                EagleSpeculator(config, verifier_attachment_mode="detached")
        with activated(adapter) as report:
            assert report[NAME].status is expected_status(NAME, base.env), report[NAME]
            assert (report[NAME].status is APPLIED) == tf5
            with pytest.raises(TypeError, match=speculators_error):
                EagleSpeculator(config, verifier_attachment_mode="detached")
            assert hasattr(layer, "pad_token_id") == (not tf5)  # left as it was
