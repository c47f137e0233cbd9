"""The scope check's refusals (toy context: which module is missing is simulated)."""

import pytest

from speculators_compat._adapter import Context
from speculators_compat._errors import UnsupportedError
from speculators_compat._report import Status
from speculators_compat.adapters import _probes
from speculators_compat.adapters.speculators_supported import SpeculatorsSupported


def _ctx(**versions) -> Context:
    ctx = Context("driver")
    ctx.versions = {"vllm": "0.32.0", "transformers": "5.19.0", "speculators": "0.4.0.1",
                    **versions}
    return ctx


def _missing(name: str):
    def load(ctx):
        raise ModuleNotFoundError(f"No module named '{name}'", name=name)
    return load


def test_transformers_without_the_module_speculators_imports(monkeypatch):
    monkeypatch.setattr(_probes, "generator_module",
                        _missing("transformers.modeling_attn_mask_utils"))
    with pytest.raises(UnsupportedError) as err:
        SpeculatorsSupported().probe(_ctx(transformers="5.21.0"))
    msg = str(err.value)
    assert "transformers.modeling_attn_mask_utils" in msg and "5.21.0" in msg
    assert "transformers<5.21" in msg


def test_vllm_older_than_speculators_needs(monkeypatch):
    monkeypatch.setattr(_probes, "generator_module", _missing("vllm.utils.hashing"))
    with pytest.raises(UnsupportedError, match="vllm.utils.hashing"):
        SpeculatorsSupported().probe(_ctx(vllm="0.11.0"))


def test_other_missing_dependency_propagates(monkeypatch):
    monkeypatch.setattr(_probes, "generator_module", _missing("loguru"))
    with pytest.raises(ModuleNotFoundError):
        SpeculatorsSupported().probe(_ctx())


def test_speculators_0_5_is_refused_and_0_4_is_fine(monkeypatch):
    monkeypatch.setattr(_probes, "generator_module", lambda ctx: object())
    with pytest.raises(UnsupportedError, match="extract_hidden_states"):
        SpeculatorsSupported().probe(_ctx(speculators="0.5.0"))
    assert SpeculatorsSupported().probe(_ctx()).status is Status.NOT_NEEDED
