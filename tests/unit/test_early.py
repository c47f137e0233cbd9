"""Rows copied into the driver while the model runs (``speculators_compat._early``).

The worker half (``StreamingSink`` with a board) and the driver half (``ShmImporter`` with
its early-copy thread) run in one process here, over the same memfds and ``/proc/<pid>/fd``
mappings as across processes; tests/e2e/test_transport.py runs them in real vLLM workers.
"""

from __future__ import annotations

import gc
import threading
import time

import pytest

torch = pytest.importorskip("torch")

from speculators_compat import _early, _transport  # noqa: E402

BF16 = torch.bfloat16
SMALL = 4 << 20


def _states(lens=(5, 12, 9), n_layers=3, hidden=32, seed=0):
    g = torch.Generator().manual_seed(seed)
    return {f"req_0_{i}": [torch.randn(n, hidden, generator=g).to(BF16)
                           for _ in range(n_layers)] for i, n in enumerate(lens)}


class _Call:
    """One ``generate()`` call through both halves; the driver always copies it."""

    def __init__(self, states, contract=_transport.BY_REQUEST, importer=None, exporter=None):
        self.states = states
        self.contract = contract
        self.n_layers = len(next(iter(states.values())))
        self.plan = [(rid, v[0].shape[0]) for rid, v in states.items()]
        self.exporter = exporter or _transport.ShmExporter(chunk_bytes=SMALL)
        self.importer = importer or _transport.ShmImporter(handoff=True)
        self.importer._hand_over_now = lambda reply: False  # results held: a copy
        self.importer._copy_expected = True
        self.exporter.new_call()
        token = self.importer.next_token()
        board = self.exporter.board(token)
        self.sink = _transport.StreamingSink(self.exporter, self.plan, self.n_layers,
                                             contract, board=board)
        self.importer.begin_call([None, {_transport.MARKER: 1, "board": board.info()}],
                                 self.plan)
        self.early = self.importer._early

    def step(self, pos, rows, states=None):
        """One model step: ``rows`` prompt rows of every request from ``pos``."""
        states = states or self.states
        for slot in range(self.n_layers):
            self.sink.write(slot, [(rid, pos, v[slot][pos:pos + rows])
                                   for rid, v in states.items() if pos < v[slot].shape[0]])

    def wait_copied(self, rows, timeout=10.0):
        deadline = time.time() + timeout
        want = [min(rows, n) for _, n in self.plan]
        while self.early.done != want:
            assert time.time() < deadline, (self.early.done, self.early.failed)
            time.sleep(0.005)

    def fetch(self):
        reply = self.sink.describe(list(self.states), dict(self.plan))
        assert reply is not None
        return self.importer.fetch(lambda released, more: reply)

    def want(self, states=None):
        states = states or self.states
        if self.contract == _transport.LIST:
            return [torch.cat([v[s] for v in states.values()]) for s in range(self.n_layers)]
        return states


def _equal(a, b) -> bool:
    if isinstance(a, dict):
        return list(a) == list(b) and all(_equal(a[k], b[k]) for k in a)
    assert len(a) == len(b)
    return all(x.dtype == y.dtype and x.shape == y.shape and torch.equal(x, y)
               for x, y in zip(a, b))


@pytest.mark.parametrize("contract", [_transport.BY_REQUEST, _transport.LIST])
def test_rows_landed_before_the_end_are_copied_while_the_model_runs(contract):
    call = _Call(_states(), contract)
    call.step(0, 4)
    call.step(4, 4)
    call.wait_copied(8)  # the driver's thread copied both steps before the call ended
    early_bytes = call.early.copied
    assert early_bytes == sum(min(8, n) for _, n in call.plan) * 32 * 2 * call.n_layers
    call.step(8, 4)
    got = call.fetch()
    assert _equal(got, call.want())
    stats = call.importer.stats
    assert (stats["early_calls"], stats["early_dropped"]) == (1, 0)
    assert stats["early_bytes"] >= early_bytes
    assert all(t.device.type == "cpu" and t.dtype == BF16
               for t in (got if isinstance(got, list) else [x for v in got.values() for x in v]))


def test_results_stay_right_after_the_worker_reuses_the_segments():
    exporter = _transport.ShmExporter(chunk_bytes=SMALL)
    importer = _transport.ShmImporter(handoff=True)
    first = _Call(_states(seed=1), importer=importer, exporter=exporter)
    first.step(0, 6)
    first.step(6, 6)
    first.wait_copied(12)
    got1 = [t.clone() for v in first.fetch().values() for t in v]  # speculators' clone
    second = _Call(_states(seed=2), importer=importer, exporter=exporter)
    second.step(0, 12)
    second.wait_copied(12)
    got2 = second.fetch()
    assert _equal(got2, second.want())
    assert all(torch.equal(a, b) for a, b in
               zip(got1, [t for v in first.states.values() for t in v], strict=True))
    assert importer.stats["early_calls"] == 2


def test_a_recomputed_prompt_drops_the_early_copies():
    """vLLM recomputes a preempted prompt from 0: its rows are written again, possibly
    with other values; the early copies of the first write must not be returned."""
    old = _states(seed=3)
    new = _states(seed=4)
    call = _Call(new)
    call.step(0, 6, old)
    call.wait_copied(6)
    call.step(0, 12, new)  # recomputed from 0 (the sink sees pos 0 again)
    got = call.fetch()
    assert _equal(got, call.want(new))
    assert call.sink.board.dead
    assert call.importer.stats["early_calls"] == 0
    assert call.importer.stats["early_dropped"] == 1


def _ended_call():
    """A call whose rows were all copied early, and its final reply."""
    call = _Call(_states())
    call.step(0, 12)
    call.wait_copied(12)
    return call, call.sink.describe(list(call.states), dict(call.plan))


def test_early_copies_of_another_call_are_never_used():
    call, reply = _ended_call()
    reply["board"] += 1  # a reply that is not this call's
    got = call.importer.fetch(lambda released, more: reply)
    assert _equal(got, call.want())
    assert call.importer.stats["early_calls"] == 0


def test_a_layout_that_differs_from_the_reply_is_not_used():
    call, reply = _ended_call()
    key, slot, sid, off, shape, dtype, start, total = reply["items"][0]
    assert call.early.finish(dict(reply, items=[(key, slot, sid, off + 64, shape, dtype,
                                                 start, total)] + reply["items"][1:]),
                             call.importer._arrays(reply),
                             _transport._early_nbytes) is None


def test_a_board_too_small_for_the_layout_publishes_nothing():
    board = _early.Board(words=16)
    board.start(7)
    assert not board.publish_layout(2, 64, False, [[(0, 0), (0, 64)]] * 5, {0: (3, 1 << 20)})
    assert board.dead
    board.close()


def test_no_early_copy_where_no_copy_is_expected():
    importer = _transport.ShmImporter(handoff=True)
    assert importer.next_token() is None  # prepare_call predicted no copy
    importer.begin_call([{_transport.MARKER: 1, "board": {"pid": 1, "fd": 3, "bytes": 8}}],
                        [("r", 1)])
    assert importer._early is None


def test_a_failed_call_stops_its_early_copy():
    call = _Call(_states())
    call.step(0, 4)

    def failing(released, more):
        raise RuntimeError("worker died")

    with pytest.raises(RuntimeError):
        call.importer.fetch(failing)
    assert not call.early._thread.is_alive()
    assert call.importer.stats["early_dropped"] == 1
    gc.collect()


def test_a_call_abandoned_before_its_states_were_fetched_stops_its_early_copy():
    """A model step raised (or Ctrl+C) before the export: ``generate()``'s failure
    ends the call in the transport; the thread must not poll on until the next call."""
    call = _Call(_states())
    call.step(0, 4)
    call.wait_copied(4)
    call.importer.abandon_call()
    assert not call.early._thread.is_alive() and call.importer._early is None
    assert call.importer.stats["early_dropped"] == 1
    assert not call.importer._copy_expected and call.importer.next_token() is None
    gc.collect()


def test_a_call_that_ends_before_the_thread_looked_still_uses_its_layout(monkeypatch):
    monkeypatch.setattr(_early.EarlyCopy, "start", lambda self: self)  # never runs
    call = _Call(_states())
    call.step(0, 12)
    got = call.fetch()
    assert _equal(got, call.want())
    assert (call.importer.stats["early_calls"], call.early.copied) == (1, 0)


class _FakeEvent:
    """A CUDA event stand-in: ``synchronize()`` blocks until the test fires it."""

    def __init__(self):
        self.fired = threading.Event()

    def synchronize(self):
        assert self.fired.wait(10)


def test_the_lander_publishes_a_step_only_after_its_copies_completed():
    board = _early.Board()
    board.start(11)
    assert board.publish_layout(1, 64, False, [[(0, 0)], [(0, 640)]], {0: (3, 1 << 20)})
    lander = _early.Lander(board)
    first, second = _FakeEvent(), _FakeEvent()
    lander.after(first, [(0, 4), (1, 2)])
    lander.after(second, [(0, 9)])
    time.sleep(0.05)
    landed = lambda: board.w[_early.HEADER:_early.HEADER + 2].tolist()  # noqa: E731
    assert landed() == [0, 0]  # nothing fired: nothing published
    first.fired.set()
    deadline = time.time() + 10
    while landed() != [4, 2]:
        assert time.time() < deadline, landed()
        time.sleep(0.005)
    second.fired.set()
    lander.close()  # publishes what is queued, then stops
    assert landed() == [9, 2]
    board.start(12)  # the next call: a late publish of the old call changes nothing
    board.landed([(0, 5)], 11)
    assert board.w[_early.HEADER] == 9 and board.token == 12
    board.close()
