"""The adapters' wrappers and speculators' shared names: each fact stated once, behaving as the
hand-written code it replaced did."""

from __future__ import annotations

import wrapt

from speculators_compat import _speculators
from speculators_compat._report import Kind
from speculators_compat.adapters import _wrappers


def _echo(*args, **kwargs):
    return args, kwargs


def test_default_kwarg_fills_only_what_the_caller_left_out():
    f = wrapt.FunctionWrapper(_echo, _wrappers.default_kwarg("flag", False))
    assert f(1) == ((1,), {"flag": False})
    assert f(1, flag=True) == ((1,), {"flag": True})


def test_drop_kwarg_drops_only_that_argument():
    f = wrapt.FunctionWrapper(_echo, _wrappers.drop_kwarg("gone"))
    assert f(1, gone=2, kept=3) == ((1,), {"kept": 3})
    assert f(1) == ((1,), {})


def test_argument_reads_keyword_then_position_then_default():
    assert _wrappers.argument((), {"x": 1}, "x", 0) == 1
    assert _wrappers.argument((5, 6), {}, "x", 1) == 6
    assert _wrappers.argument((5,), {}, "x", 1) is None
    assert _wrappers.argument((5,), {}, "x", 1, default=7) == 7


def test_subclass_is_thin_and_named_for_the_adapter():
    class Base:
        """doc"""

    sub = _wrappers.subclass(Base, "my_adapter", {"x": 1})
    assert issubclass(sub, Base) and sub.__name__ == "Base" and sub.__doc__ == "doc"
    assert sub.__qualname__.endswith("[compat:my_adapter]") and vars(sub)["x"] == 1


def test_request_id_grammar_is_speculators_req_call_index():
    assert _speculators.request_index("req_0_10") == (0, 10)
    assert _speculators.request_index("req_12_3") == (12, 3)
    for other in ("req_0_10 ", "Req_0_1", "req_0", "req_a_1", 7, None):
        assert _speculators.request_index(other) is None, other


def test_contract_names_have_one_home():
    from speculators_compat import worker_extension
    from speculators_compat.adapters import _targets
    from speculators_compat.transport import wire

    assert _speculators.CONTRACTS == ("list", "by_request")
    assert (wire.LIST, wire.BY_REQUEST) == _speculators.CONTRACTS
    assert (_targets.CONTRACT_LIST, _targets.CONTRACT_BY_REQUEST) == _speculators.CONTRACTS
    assert set(worker_extension.EXTENSIONS) == set(_speculators.CONTRACTS)


def test_the_extension_names_adapters_use_are_the_worker_extension_classes():
    """``hook_capture`` names the shim's extensions by string (adapters import no entry
    point); those strings are the classes :mod:`speculators_compat.worker_extension` has."""
    import importlib

    from speculators_compat import worker_extension
    from speculators_compat.adapters import _worker_extensions

    assert _worker_extensions.COMPAT_EXTENSIONS == worker_extension.EXTENSIONS
    for path in _worker_extensions.COMPAT_EXTENSIONS.values():
        module, _, name = path.rpartition(".")
        assert getattr(importlib.import_module(module), name).CONTRACT in _speculators.CONTRACTS


def test_every_kind_describes_itself():
    for k in Kind:
        assert k.description and k.description[0].islower(), k
