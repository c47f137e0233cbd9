"""The worker extensions' RPCs (``worker_extension``) over a fake runner: each result
contract, the setup/reset cycle, and refusal paths. Needs torch (not vLLM)."""

from __future__ import annotations

import sys
from types import ModuleType, SimpleNamespace

import pytest

torch = pytest.importorskip("torch")

from capture_fakes import FakeV1Runner, expected_rows, step  # noqa: E402

from speculators_compat.worker_extension import (  # noqa: E402
    EXTENSIONS,
    ByRequestContractExtension,
    ListContractExtension,
)

LAYERS = [1, 0, 3]  # speculators may pass them unsorted; results are by ascending id


@pytest.fixture
def fake_tp(monkeypatch):
    """``vllm.distributed.get_tp_group`` without vLLM; ``rank`` sets this worker's rank."""
    state = SimpleNamespace(rank=0)
    vllm = ModuleType("vllm")
    dist = ModuleType("vllm.distributed")
    dist.get_tp_group = lambda: SimpleNamespace(rank_in_group=state.rank,
                                                world_size=state.rank + 1)
    vllm.distributed = dist
    monkeypatch.setitem(sys.modules, "vllm", vllm)
    monkeypatch.setitem(sys.modules, "vllm.distributed", dist)
    return state


def worker(cls):
    w = cls()
    w.model_runner = FakeV1Runner()
    w._setup_hidden_states_capture(LAYERS)
    return w


def run_batch(w, call: int, lengths: list[int]) -> dict[str, list[int]]:
    w._reset_capture()
    p = {f"req_{call}_{i}": list(range(5, 5 + n)) for i, n in enumerate(lengths)}
    step(w.model_runner, [(rid, len(ids), 0, True) for rid, ids in p.items()], p)
    return p


def test_by_request_contract(fake_tp):
    w = worker(ByRequestContractExtension)
    p = run_batch(w, 0, [3, 5, 2])
    w._set_request_metadata({"req_0_0": 3})  # accepted, not needed
    out = w._get_captured_states()
    assert list(out) == list(p)
    for rid, layers in out.items():
        assert len(layers) == 3
        for k, t in zip(sorted(LAYERS), layers):
            assert torch.equal(t, expected_rows(w.model_runner.codes(rid), len(p[rid]), k))
    assert w._get_captured_states() is None  # taken: nothing left


def test_list_contract_concatenates_in_input_order(fake_tp):
    w = worker(ListContractExtension)
    p = run_batch(w, 0, [3, 5, 2])
    out = w._get_captured_states()
    assert len(out) == 3
    codes = w.model_runner.codes
    for k, t in zip(sorted(LAYERS), out):
        want = torch.cat([expected_rows(codes(r), len(p[r]), k) for r in p])
        assert torch.equal(t, want)
    assert w._get_captured_states() is None


def test_other_tp_ranks_return_none(fake_tp):
    fake_tp.rank = 1
    for cls in (ListContractExtension, ByRequestContractExtension):
        w = worker(cls)
        run_batch(w, 0, [3])
        assert w._get_captured_states() is None


def test_setup_twice_replaces_the_capture(fake_tp):
    w = worker(ByRequestContractExtension)
    first = w._compat_capture
    w._setup_hidden_states_capture([0])
    assert w._compat_capture is not first
    hooks = [len(layer._forward_hooks) for layer in w.model_runner.model.model.layers]
    assert hooks == [1, 0, 0, 0]  # the first capture's hooks are gone
    p = run_batch(w, 1, [4])
    out = w._get_captured_states()
    assert [t.shape[0] for t in out["req_1_0"]] == [len(p["req_1_0"])]


def test_rpc_before_setup_fails_clearly():
    w = ByRequestContractExtension()
    with pytest.raises(RuntimeError, match="_setup_hidden_states_capture"):
        w._reset_capture()


def test_next_call_releases_and_forgets_the_previous_one(fake_tp):
    w = worker(ByRequestContractExtension)
    run_batch(w, 0, [3, 3])
    w._get_captured_states()
    p = run_batch(w, 1, [2])
    out = w._get_captured_states()
    assert list(out) == list(p)
    assert set(w.model_runner.requests) == {"req_1_0"}


def test_extension_names_resolve():
    import importlib

    for path in EXTENSIONS.values():
        mod, _, name = path.rpartition(".")
        assert isinstance(getattr(importlib.import_module(mod), name), type)


def test_reset_with_a_plan_streams_rows_into_the_calls_region(fake_tp):
    """With the driver's plan, every step's rows go into the call's region as the layers
    produce them; the export RPC then only describes that region, and the driver reads
    exactly what ``_get_captured_states`` would have returned."""
    from speculators_compat.transport.driver import Receiver

    w = worker(ByRequestContractExtension)
    p = {"req_0_0": list(range(5, 12)), "req_0_1": list(range(5, 9))}
    w._compat_reset_capture([(rid, len(ids)) for rid, ids in p.items()])
    runner = w.model_runner
    step(runner, [("req_0_0", 4, 0, True), ("req_0_1", 4, 0, True)], p)  # chunked
    step(runner, [("req_0_0", 3, 4, False)], p)
    reply = w._compat_export_states()
    assert reply["streamed"], reply
    got = Receiver().fetch(lambda: reply)
    assert list(got) == list(p)
    for rid, layers in got.items():
        for k, t in zip(sorted(LAYERS), layers, strict=True):
            assert torch.equal(t, expected_rows(runner.codes(rid), len(p[rid]), k))
    w._compat_reset_capture([])  # the next call closes the worker's side of the region
    assert w._compat_sender._sent == [] and got["req_0_0"][0].sum() > 0


def test_capture_off_answers_nothing(fake_tp):
    w = worker(ByRequestContractExtension)
    w._compat_capture.enabled = False
    assert w._compat_reset_capture([("req_0_0", 3)]) is None
    assert w._compat_export_states() is None
