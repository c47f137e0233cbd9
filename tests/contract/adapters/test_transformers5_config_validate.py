"""Contract of the ``transformers5_config_validate`` adapter, on the installed
transformers and speculators.

Speculators' call shape (``save_pretrained`` of one
of its configs) raises the issue's ``TypeError`` bare on transformers 5 and writes a
``config.json`` that loads back equal through the adapter; pydantic's
``Model.validate(value)`` keeps working; transformers' validators still run (an invalid
config is refused at save time, as transformers does for its own configs).

The checks every adapter shares (probe vs. expectation table, apply/revert identity,
declared targets only) are in tests/contract/test_every_adapter.py.
"""

from __future__ import annotations

import json

import pytest

from ..expectations import applied_if
from ..support import (
    APPLIED,
    BY_NAME,
    activated,
    expected_status,
)

NAME = "transformers5_config_validate"

#: Its expected status on the installed release, and why (read by ``expectations.py``).
EXPECTED = (
    lambda e: applied_if(e.transformers_major >= 5),
    "transformers 5's config save_pretrained calls self.validate(), pydantic's "
    "BaseModel.validate(value) on speculators' configs: TypeError")


def eagle3_config():
    from speculators import SpeculatorsConfig, VerifierConfig
    from speculators.models.eagle3 import Eagle3SpeculatorConfig
    from speculators.proposals.greedy import GreedyTokenProposalConfig
    from transformers import LlamaConfig

    layer = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                        num_attention_heads=4, num_key_value_heads=2, vocab_size=1000)
    return Eagle3SpeculatorConfig(
        transformer_layer_config=layer, draft_vocab_size=500,
        speculators_config=SpeculatorsConfig(
            algorithm="eagle3", proposal_methods=[GreedyTokenProposalConfig()],
            default_proposal_method="greedy",
            verifier=VerifierConfig(name_or_path="verifier", architectures=["LlamaForCausalLM"])))


def test_legacy_call_shape(base, tmp_path):
    from speculators import SpeculatorsConfig
    from speculators.models.eagle3 import Eagle3SpeculatorConfig

    adapter = BY_NAME[NAME]
    fixes = [BY_NAME["transformers5_config_torch"], BY_NAME["transformers5_config_dataclass"]]
    tf5 = base.env.transformers_major >= 5
    with base.suspended():
        with activated(*fixes):
            config = eagle3_config()
            if tf5:
                with pytest.raises(TypeError, match="validate"):
                    config.save_pretrained(tmp_path / "bare")
        with activated(*fixes, adapter) as report:
            assert report[NAME].status is expected_status(NAME, base.env), report[NAME]
            applied = report[NAME].status is APPLIED
            assert applied == tf5, report[NAME]
            config = eagle3_config()
            config.save_pretrained(tmp_path / "ok")
            saved = json.loads((tmp_path / "ok" / "config.json").read_text())
            assert saved["speculators_model_type"] == "eagle3"
            assert saved["draft_vocab_size"] == 500
            loaded = Eagle3SpeculatorConfig.from_pretrained(tmp_path / "ok")
            # (transformers 4 records the hub revision, `_commit_hash`, on load)
            assert ({k: v for k, v in loaded.model_dump().items() if k != "_commit_hash"}
                    == config.model_dump())
            # pydantic's class-side validation is unchanged
            dumped = config.speculators_config.model_dump()
            assert SpeculatorsConfig.model_validate(dumped) == config.speculators_config
            with pytest.warns(DeprecationWarning):
                again = Eagle3SpeculatorConfig.validate(config.model_dump())
            assert again.draft_vocab_size == 500
            if applied:
                # transformers' validators run: output_attentions with sdpa is refused
                bad = eagle3_config()
                bad.__dict__.update(_attn_implementation_internal="sdpa",
                                    _output_attentions=True)
                with pytest.raises(Exception, match="validate_output_attentions"):
                    bad.save_pretrained(tmp_path / "bad")
                assert not (tmp_path / "bad" / "config.json").exists()
