"""The shared-memory transport (``speculators_compat._transport``) with real tensors.

Worker and driver halves run in one process here (the driver maps the worker's memfds
through ``/proc/<pid>/fd`` exactly as it does across processes); the end-to-end runs in
tests/e2e go through real vLLM worker processes.
"""

from __future__ import annotations

import gc

import pytest

torch = pytest.importorskip("torch")

from speculators_compat import _transport  # noqa: E402

BF16 = torch.bfloat16
SMALL = 4 << 20  # segment size: keeps the tests' allocations small


def _states(n_req=5, n_layers=3, hidden=64, seed=0, lens=None):
    g = torch.Generator().manual_seed(seed)
    lens = lens or [3 + 7 * i for i in range(n_req)]
    return {f"req_0_{i}": [torch.randn(n, hidden, generator=g).to(BF16) for _ in range(n_layers)]
            for i, n in enumerate(lens)}


def _clone(states):
    return {k: [t.clone() for t in v] for k, v in states.items()}


def _roundtrip(exporter, importer, states, contract=_transport.BY_REQUEST):
    calls = []

    def call(released, more):
        exporter.release(released)
        calls.append(more)
        return exporter.next_piece() if more else exporter.export(states, contract)

    return importer.fetch(call), calls


def _equal(a, b) -> bool:
    if isinstance(a, dict):
        return list(a) == list(b) and all(_equal(a[k], b[k]) for k in a)
    return len(a) == len(b) and all(x.dtype == y.dtype and x.shape == y.shape
                                    and torch.equal(x, y) for x, y in zip(a, b))


def test_by_request_round_trip_keeps_order_dtype_and_values():
    states = _states()
    got, calls = _roundtrip(_transport.ShmExporter(chunk_bytes=SMALL),
                            _transport.ShmImporter(), _clone(states))
    assert calls == [False]
    assert _equal(got, states)
    assert all(t.device.type == "cpu" and t.dtype == BF16 for v in got.values() for t in v)


def test_list_contract_round_trip():
    per_layer = [torch.randn(40, 32).to(BF16) for _ in range(4)]
    got, _ = _roundtrip(_transport.ShmExporter(chunk_bytes=SMALL), _transport.ShmImporter(),
                        [t.clone() for t in per_layer], _transport.LIST)
    assert isinstance(got, list) and _equal(got, per_layer)


def test_results_stay_valid_after_later_calls_and_memory_is_reused():
    exporter, importer = _transport.ShmExporter(chunk_bytes=SMALL), _transport.ShmImporter()
    first_states = _states(seed=1)
    first, _ = _roundtrip(exporter, importer, _clone(first_states))
    # The first result is still held: its segment is leased, a second call must not
    # write into it.
    second_states = _states(seed=2)
    second, _ = _roundtrip(exporter, importer, _clone(second_states))
    assert _equal(first, first_states) and _equal(second, second_states)
    assert len(exporter.segments) == 2
    del first, second
    gc.collect()
    for seed in range(3, 8):  # released segments are reused: the pool does not grow
        s = _states(seed=seed)
        got, _ = _roundtrip(exporter, importer, _clone(s))
        assert _equal(got, s)
        del got
        gc.collect()
    assert len(exporter.segments) == 2


def test_batch_larger_than_the_pool_comes_in_pieces_into_owned_memory():
    states = _states(n_req=6, hidden=512, lens=[300, 250, 400, 10, 333, 120])  # ~5.6 MB
    exporter = _transport.ShmExporter(pool_bytes=1 << 20, chunk_bytes=1 << 20)
    got, calls = _roundtrip(exporter, _transport.ShmImporter(), _clone(states))
    assert calls[0] is False and len(calls) > 3 and all(calls[1:])
    assert exporter.stats["pieces"] == len(calls)
    assert _equal(got, states)
    assert sum(s.size for s in exporter.segments.values()) <= 1 << 20
    # owned: writing into the pool afterwards does not change the result
    for seg in exporter.segments.values():
        seg.buf.fill_(0)
    assert _equal(got, states)


def test_a_known_wrong_transport_is_detected():
    """The equality check above fails on a result with two rows swapped."""
    states = _states()
    got, _ = _roundtrip(_transport.ShmExporter(chunk_bytes=SMALL), _transport.ShmImporter(),
                        _clone(states))
    layer = got["req_0_1"][0]
    layer[[0, 1]] = layer[[1, 0]]
    assert not _equal(got, states)


def test_fallback_reply_returns_states_and_says_why(caplog):
    states = _states()
    importer = _transport.ShmImporter()
    got = importer.fetch(lambda released, more: _transport.rpc_reply(states, "no memfd"))
    assert got is states
    assert importer.fallback_reason == "no memfd"
    assert "no memfd" in caplog.text


def test_streaming_sink_writes_rows_in_place_and_describes_the_contract():
    exporter = _transport.ShmExporter(chunk_bytes=SMALL)
    states = _states(n_req=3, n_layers=2)
    plan = [(rid, layers[0].shape[0]) for rid, layers in states.items()]
    for contract in (_transport.BY_REQUEST, _transport.LIST):
        exporter.new_call()
        sink = _transport.StreamingSink(exporter, plan, 2, contract)
        for slot in range(2):  # two "steps" per layer: first rows, then the rest
            sink.write(slot, [(rid, 0, v[slot][:2]) for rid, v in states.items()])
            sink.write(slot, [(rid, 2, v[slot][2:]) for rid, v in states.items()])
        reply = sink.describe(list(states), dict(plan))
        assert reply is not None
        got = _transport.ShmImporter()._views(reply)
        if contract == _transport.LIST:
            want = [torch.cat([v[s] for v in states.values()]) for s in range(2)]
        else:
            want = states
        assert _equal(got, want)
        del got
        gc.collect()
        exporter.release(list(exporter.segments))


def test_streaming_sink_refuses_what_was_not_planned():
    exporter = _transport.ShmExporter(chunk_bytes=SMALL)
    states = _states(n_req=2, n_layers=1)
    plan = [(rid, v[0].shape[0]) for rid, v in states.items()]
    sink = _transport.StreamingSink(exporter, plan, 1, _transport.BY_REQUEST)
    sink.write(0, [("req_9_9", 0, states["req_0_0"][0])])  # not in the plan
    assert not sink.ok and sink.describe(list(states), dict(plan)) is None
    sink = _transport.StreamingSink(exporter, plan, 1, _transport.BY_REQUEST)
    rid, n = plan[0]
    sink.write(0, [(rid, 1, states[rid][0])])  # one row past the prompt's end
    assert not sink.ok
    sink = _transport.StreamingSink(exporter, plan, 1, _transport.BY_REQUEST)
    for r, v in states.items():
        sink.write(0, [(r, 0, v[0])])
    assert sink.describe(list(reversed(list(states))), dict(plan)) is None  # other order


def test_grow_ahead_makes_the_next_calls_memory_in_the_background():
    chunk = 256 << 10
    exporter = _transport.ShmExporter(pool_bytes=8 * chunk, chunk_bytes=chunk)
    exporter.grow_ahead(3 * chunk)
    exporter._grower.join()
    assert exporter.stats["grown"] == 3 and len(exporter.segments) == 3
    assert sorted(exporter.segments) == [0, 1, 2]
    got = exporter._alloc(chunk - 64)  # a call takes a grown segment, allocates nothing
    assert got is not None and len(exporter.segments) == 3
    exporter.grow_ahead(3 * chunk)  # one is in use now: one more is made
    exporter._grower.join()
    assert exporter.stats["grown"] == 4
    exporter.grow_ahead(100 * chunk)  # never past the pool
    exporter._grower.join()
    assert sum(s.size for s in exporter.segments.values()) == 8 * chunk
    # Held segments (leased) are not free: the next call's memory is grown beside them.
    exporter = _transport.ShmExporter(pool_bytes=8 * chunk, chunk_bytes=chunk)
    states = _states(n_req=2, hidden=512, lens=[100, 100])  # six 100 KiB tensors
    call = sum(t.numel() * t.element_size() for v in states.values() for t in v)
    importer = _transport.ShmImporter()
    first, _ = _roundtrip(exporter, importer, _clone(states))
    held = len(exporter.segments)
    assert held == 3 and all(s.leased for s in exporter.segments.values())
    exporter.new_call()
    exporter.grow_ahead(call)
    exporter._grower.join()
    assert exporter.stats["grown"] == 3  # beside the held ones
    second, _ = _roundtrip(exporter, importer, _clone(states))
    assert len(exporter.segments) == held + 3  # the call allocated nothing itself
    assert _equal(first, states) and _equal(second, states)
    exporter.close()


def test_a_failing_grower_leaves_the_call_to_allocate(monkeypatch):
    """Growing ahead is an optimisation: an error there (CUDA, memory) must neither escape
    its thread nor stop the call, which then allocates on its own."""
    import threading

    escaped = []
    monkeypatch.setattr(threading, "excepthook", escaped.append)
    exporter = _transport.ShmExporter(pool_bytes=8 << 20, chunk_bytes=1 << 20)
    real = _transport._Segment

    def failing(size):
        raise RuntimeError("CUDA error: out of memory (pinning)")

    monkeypatch.setattr(_transport, "_Segment", failing)
    exporter.grow_ahead(2 << 20)
    exporter._grower.join()
    monkeypatch.setattr(_transport, "_Segment", real)
    assert escaped == [] and exporter.stats["grown"] == 0 and not exporter.segments
    got = exporter._alloc(1000)
    assert got is not None and len(exporter.segments) == 1
    exporter.close()


def test_the_first_call_makes_the_steady_pool_and_waits_for_it():
    """The first streamed call learns a call's size: it grows the pool to what steady use
    needs (``FIRST_CALL_AHEAD`` calls beside itself) and waits for that at its end, so
    later calls find their segments ready; later calls grow nothing more."""
    chunk = 64 << 10
    exporter = _transport.ShmExporter(pool_bytes=64 * chunk, chunk_bytes=chunk)
    states = _states(n_req=2, n_layers=2, hidden=512, lens=[40, 24])  # 128 KiB a call
    call = sum(t.numel() * t.element_size() for v in states.values() for t in v)
    plan = [(rid, v[0].shape[0]) for rid, v in states.items()]
    sizes = []
    for _ in range(4):
        exporter.new_call()
        sink = _transport.StreamingSink(exporter, plan, 2, _transport.BY_REQUEST)
        for slot in range(2):
            sink.write(slot, [(rid, 0, v[slot]) for rid, v in states.items()])
        reply = sink.describe(list(states), dict(plan))
        assert reply is not None and exporter._grower is None  # waited at the first end
        got = _transport.ShmImporter()._views(reply)
        assert _equal(got, states)
        sizes.append(sum(s.size for s in exporter.segments.values()))
        del got
        gc.collect()
        exporter.release(list(exporter.segments))
    assert sizes[0] >= call * (1 + _transport.FIRST_CALL_AHEAD), (sizes, call)
    assert sizes == [sizes[0]] * 4, sizes
    assert exporter.stats["grown"] > 0
    exporter.close()
