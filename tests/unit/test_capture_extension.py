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
    dist.get_tp_group = lambda: SimpleNamespace(rank_in_group=state.rank)
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


def test_segments_the_driver_released_are_freed_while_the_capture_is_off(fake_tp):
    """The driver hands back the shared-memory segments it no longer views with the next
    call's first RPC (``_compat_reset_capture`` / ``_compat_export_states``). A worker
    whose capture is off (switched off, as the benchmark's "capture off" does) must still
    free them: otherwise they stay leased for good, every later call allocates and faults
    in a fresh segment inside its forward step, and the pool only grows."""
    from speculators_compat import _transport

    w = worker(ByRequestContractExtension)
    exporter = w._compat_exporter = _transport.ShmExporter(chunk_bytes=1 << 20)
    try:
        first, _ = exporter._alloc(1024)
        second, _ = exporter._alloc(2 << 20)
        assert first.sid != second.sid
        first.leased = second.leased = True
        w._compat_capture.enabled = False
        w._compat_reset_capture([("req_0_0", 3)], [first.sid])
        assert not first.leased and second.leased
        assert w._compat_export_states([second.sid]) is None
        assert not second.leased
    finally:
        exporter.close()


def test_reset_with_a_token_starts_the_board_and_says_where_it_is(fake_tp):
    """The driver's early copy (``speculators_compat._early``) reads the board the reset
    names; without a token (no copy expected) there is no board and no reply."""
    import os

    from speculators_compat import _early, _transport

    w = worker(ByRequestContractExtension)
    exporter = w._compat_exporter = _transport.ShmExporter(chunk_bytes=1 << 20)
    try:
        assert w._compat_reset_capture([("req_0_0", 3)], [], None) is None
        assert w._compat_capture.sink.board is None
        reply = w._compat_reset_capture([("req_0_0", 3)], [], 41)
        assert _transport.is_reply(reply)
        board = reply["board"]
        assert board["pid"] == os.getpid() and board["bytes"] == _early.WORDS * 8
        assert w._compat_capture.sink.board is exporter._board
        assert exporter._board.w[_early.TOKEN] == 41 and not exporter._board.w[_early.READY]
    finally:
        w._reset_capture()
        exporter.close()
