"""The transport (``speculators_compat.transport``) with real tensors and real memfds.

Worker and driver halves run in one process here (the driver opens the worker's memfd
through ``/proc/<pid>/fd`` exactly as it does across processes); tests/e2e runs them in
real vLLM worker processes.
"""

from __future__ import annotations

import gc
import os

import pytest

torch = pytest.importorskip("torch")

from speculators_compat.transport import wire  # noqa: E402
from speculators_compat.transport.driver import Receiver  # noqa: E402
from speculators_compat.transport.worker import Sender  # noqa: E402

BF16 = torch.bfloat16
HIDDEN = 64


def _states(lens=(3, 10, 17, 24), n_layers=3, seed=0, call=0):
    g = torch.Generator().manual_seed(seed)
    return {f"req_{call}_{i}": [torch.randn(n, HIDDEN, generator=g).to(BF16)
                                for _ in range(n_layers)] for i, n in enumerate(lens)}


def _copy(states):
    if isinstance(states, dict):
        return {k: [t.clone() for t in v] for k, v in states.items()}
    return [t.clone() for t in states]


def _equal(a, b) -> bool:
    if isinstance(a, dict):
        return list(a) == list(b) and all(_equal(a[k], b[k]) for k in a)
    return len(a) == len(b) and all(x.dtype == y.dtype and x.shape == y.shape
                                    and torch.equal(x, y) for x, y in zip(a, b))


def _plan(states):
    return [(rid, layers[0].shape[0]) for rid, layers in states.items()]


def _stream(sender, states, contract=wire.BY_REQUEST, chunk=7):
    """One call as the capture feeds it: per step, each layer's rows of every request
    (chunks of ``chunk`` prompt positions), then the export RPC's reply."""
    plan = _plan(states)
    n_layers = len(next(iter(states.values())))
    sink = sender.begin_call(plan, n_layers, contract)
    longest = max(n for _, n in plan)
    for pos in range(0, longest, chunk):
        for slot in range(n_layers):
            sink.write(slot, [(rid, pos, layers[slot][pos:pos + chunk])
                              for rid, layers in states.items()
                              if pos < layers[slot].shape[0]])
    held = states if contract == wire.BY_REQUEST else _lanes(states)
    return sender.reply(held, contract, list(states), dict(plan))


def _lanes(states):
    n_layers = len(next(iter(states.values())))
    return [torch.cat([v[s] for v in states.values()]) for s in range(n_layers)]


def _fetch(receiver, reply):
    return receiver.fetch(lambda: reply)


def test_streamed_call_arrives_whole_in_input_order_with_dtype():
    sender, receiver = Sender(), Receiver()
    states = _states()
    reply = _stream(sender, _copy(states))
    assert reply["streamed"] and sender.stats["streamed"] == 1
    got = _fetch(receiver, reply)
    assert _equal(got, states)
    assert all(t.device.type == "cpu" for v in got.values() for t in v)
    sender.close()


def test_list_contract_streams_one_lane_per_layer():
    sender, receiver = Sender(), Receiver()
    states = _states(lens=(5, 9, 2))
    reply = _stream(sender, _copy(states), contract=wire.LIST, chunk=4)
    assert reply["streamed"]
    got = _fetch(receiver, reply)
    assert isinstance(got, list) and _equal(got, _lanes(states))
    sender.close()


def _stream_steps(sender, states, contract, budget, order=None):
    """One call as vLLM's chunked prefill feeds it: each step computes up to ``budget``
    prompt positions, requests in ``order`` (default: input order), and each layer's
    output is ONE tensor of the step's rows, of which every request gets a slice (what the
    capture's hooks hand the sink). Returns the reply."""
    plan = _plan(states)
    n_layers = len(next(iter(states.values())))
    sink = sender.begin_call(plan, n_layers, contract)
    done = {rid: 0 for rid, _ in plan}
    lengths = dict(plan)
    while any(done[r] < lengths[r] for r in done):
        left, chunks = budget, []  # (rid, start, n)
        for rid in order or list(states):
            n = min(lengths[rid] - done[rid], left)
            if n > 0:
                chunks.append((rid, done[rid], n))
                left -= n
        for slot in range(n_layers):
            step = torch.cat([states[r][slot][a:a + n] for r, a, n in chunks])
            entries, off = [], 0
            for rid, a, n in chunks:
                entries.append((rid, a, step[off:off + n]))
                off += n
            sink.write(slot, entries)
        for rid, a, n in chunks:
            done[rid] = a + n
    held = states if contract == wire.BY_REQUEST else _lanes(states)
    return sender.reply(held, contract, list(states), lengths)


@pytest.mark.parametrize("contract", [wire.BY_REQUEST, wire.LIST])
def test_a_steps_rows_of_consecutive_requests_go_as_one_copy(contract):
    """Rows that follow each other in the step's tensor and in the region are one copy:
    with chunked prefill of 5 + 9 + 4 + 12 positions at 16 per step, each layer takes one
    copy per step (two steps), for both contracts. A step whose requests run in another
    order than the input still arrives exact, one copy per request and step (1, 0, 3 in
    the first step, 3, 2 in the second: five per layer)."""
    states = _states(lens=(5, 9, 4, 12))
    for order, copies in ((None, 2 * 3), (["req_0_1", "req_0_0", "req_0_3", "req_0_2"], 5 * 3)):
        sender, receiver = Sender(), Receiver()
        reply = _stream_steps(sender, _copy(states), contract, budget=16, order=order)
        assert reply["streamed"]
        want = states if contract == wire.BY_REQUEST else _lanes(states)
        assert _equal(_fetch(receiver, reply), want)
        assert sender.stats["copies"] == copies
        sender.close()


def test_rows_join_only_when_they_follow_each_other_in_memory():
    from speculators_compat.transport.worker import _joined

    step = torch.randn(10, HIDDEN).to(BF16)
    both = _joined(step[0:4], step[4:10])
    assert both is not None and torch.equal(both, step)
    assert _joined(step[0:4], step[5:10]) is None  # a row left out between them
    assert _joined(step[4:10], step[0:4]) is None  # the other way round
    assert _joined(step[0:4], step.clone()[4:10]) is None  # other memory
    assert _joined(step[0:4], step[4:10].float()) is None
    assert _joined(step[0:4, :8], step[4:10, :8]) is None  # not contiguous


@pytest.mark.parametrize("spoil", ["unplanned request", "recomputed prompt", "rows past end",
                                   "missing rows"])
def test_unforeseen_rows_switch_streaming_off_and_the_export_is_still_exact(spoil):
    """What the plan did not foresee never becomes a wrong row: the sink switches off and
    the states the capture holds are exported at the end."""
    sender, receiver = Sender(), Receiver()
    states = _states()
    plan = _plan(states)
    sink = sender.begin_call(plan, 3, wire.BY_REQUEST)
    for slot in range(3):
        sink.write(slot, [(rid, 0, v[slot]) for rid, v in states.items()])
    if spoil == "unplanned request":
        sink.write(0, [("req_9_9", 0, states["req_0_0"][0])])
    elif spoil == "recomputed prompt":  # a preemption: positions start at 0 again
        sink.write(1, [("req_0_1", 0, states["req_0_1"][1])])
    elif spoil == "rows past end":
        sink.write(2, [("req_0_0", 3, states["req_0_0"][2])])
    else:
        sink._next[("req_0_3", 2)] -= 1
    reply = sender.reply(_copy(states), wire.BY_REQUEST, list(states),
                         dict(plan))
    assert not reply["streamed"] and sender.stats["exported"] == 1
    assert _equal(_fetch(receiver, reply), states)
    sender.close()


def test_a_plan_other_than_the_capture_is_exported_at_the_end():
    sender, receiver = Sender(), Receiver()
    states = _states()
    sink = sender.begin_call(_plan(states), 3, wire.BY_REQUEST)
    for slot in range(3):
        sink.write(slot, [(rid, 0, v[slot]) for rid, v in states.items()])
    order = list(reversed(states))  # the capture holds the same rows in another order
    held = {r: states[r] for r in order}
    reply = sender.reply(_copy(held), wire.BY_REQUEST, order,
                         {r: v[0].shape[0] for r, v in held.items()})
    assert not reply["streamed"]
    assert _equal(_fetch(receiver, reply), held)
    sender.close()


def _maps_of_regions(want: int | None = None) -> int:
    """Mappings of regions in this process (waits up to 5 s for ``want``: the driver
    unmaps on a background thread)."""
    import time

    deadline = time.monotonic() + 5
    while True:
        gc.collect()
        with open(f"/proc/{os.getpid()}/maps") as f:
            n = sum("memfd:speculators-compat" in line for line in f)
        if want is None or n == want or time.monotonic() > deadline:
            return n
        time.sleep(0.01)


def test_results_outlive_later_calls_and_the_worker_and_go_with_their_last_tensor():
    sender, receiver = Sender(), Receiver(handoff=True)
    before = _maps_of_regions()
    first_states = _states(seed=1)
    first = {r: [h.clone() for h in v]  # speculators 0.4's clone(): takes the region over
             for r, v in _fetch(receiver, _stream(sender, _copy(first_states))).items()}
    for call in range(1, 4):  # later calls, each in a region of its own
        later = _states(seed=10 + call, call=call)
        assert _equal(_fetch(receiver, _stream(sender, _copy(later))), later)
    sender.close()  # the worker's side of every region is gone
    gc.collect()
    assert _equal(first, first_states)
    assert _maps_of_regions(before + 1) == before + 1  # only the region ``first`` uses
    del first
    assert _maps_of_regions(before) == before


def test_results_are_private_across_fork():
    """A forked child's in-place write (a DataLoader worker modifying a sample) never
    reaches the parent's results, and the parent's later writes never reach the child."""
    sender, receiver = Sender(), Receiver(handoff=True)
    states = _states()
    got = {r: [h.clone() for h in v]
           for r, v in _fetch(receiver, _stream(sender, _copy(states))).items()}
    sender.close()
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # child
        try:
            os.close(write)
            os.read(read, 1)  # the parent has written its results
            ok = _equal(got, states)
            for layers in got.values():
                for t in layers:
                    t.mul_(0)
            os._exit(0 if ok else 3)
        except BaseException:  # noqa: BLE001
            os._exit(4)
    os.close(read)
    target = got["req_0_2"][1]
    saved = target.clone()
    target.add_(1)  # the parent writes after the fork; the child must not see it
    os.write(write, b"x")
    os.close(write)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, "the child saw the parent's write"
    target.copy_(saved)
    assert _equal(got, states), "the child's in-place write changed the parent's results"


def test_without_handoff_views_are_plain_and_clone_copies():
    sender, receiver = Sender(), Receiver(handoff=False)
    states = _states(lens=(4, 6))
    got = _fetch(receiver, _stream(sender, _copy(states)))
    assert all(type(t) is torch.Tensor for v in got.values() for t in v)
    assert receiver.stats["handed_over"] == 0 and receiver.stats["calls"] == 1
    sender.close()


def test_export_of_empty_rows_and_fallback_reply():
    sender, receiver = Sender(), Receiver()
    states = {"req_0_0": [torch.empty(0, HIDDEN, dtype=BF16)]}
    got = _fetch(receiver, sender.export(states, wire.BY_REQUEST))
    assert got["req_0_0"][0].shape == (0, HIDDEN)
    pickled = _states(lens=(2,))
    assert _fetch(receiver, wire.fallback_reply(pickled, "no memfd")) is pickled
    assert receiver.fallback_reason == "no memfd"
    assert _fetch(receiver, None) is None
    sender.close()


def test_nothing_is_created_in_dev_shm():
    if not os.path.isdir("/dev/shm"):
        pytest.skip("no /dev/shm on this machine")
    before = set(os.listdir("/dev/shm"))
    sender, receiver = Sender(), Receiver(handoff=True)
    got = _fetch(receiver, _stream(sender, _copy(_states())))
    assert set(os.listdir("/dev/shm")) == before
    del got
    sender.close()


def test_unavailable_reason_is_none_on_linux():
    assert wire.unavailable_reason() is None


def test_staging_ring_reserves_in_order_and_reuses_freed_space():
    """The pinned ring (here over ordinary memory): spans come back once they and every
    span before them are free; a full ring makes the next reservation wait."""
    import threading

    from speculators_compat.transport.copies import ALIGN, Staging

    ring = Staging(8 * ALIGN, buf=torch.empty(8 * ALIGN, dtype=torch.uint8))
    a = ring.reserve(3 * ALIGN)
    b = ring.reserve(3 * ALIGN)
    assert (a[0], b[0]) == (0, 3 * ALIGN)
    c = ring.reserve(2 * ALIGN)  # exactly the rest: the ring is full
    assert c[0] == 6 * ALIGN
    ring.free(b)  # not the oldest: nothing comes back yet
    got = []
    t = threading.Thread(target=lambda: got.append(ring.reserve(2 * ALIGN)))
    t.start()
    t.join(0.2)
    assert not got  # waits
    ring.free(a)  # a and b back: [0, 6 * ALIGN) free, the head wraps to 0
    t.join(2)
    assert got and got[0][0] == 0
    d = ring.reserve(4 * ALIGN)  # after the wrapped span, up to c's start
    assert d[0] == 2 * ALIGN
    for span in (c, got[0], d):
        ring.free(span)
    assert ring.reserve(8 * ALIGN)[0] == 0 and ring.wait_s > 0


def test_populating_a_region_lets_other_threads_run(monkeypatch):
    """The worker's forward launches its kernels from Python: faulting a region in beside
    it must not hold the GIL (``mmap.madvise`` does, for the whole call; here one call
    covers the region, so such a version leaves the other thread nearly no time)."""
    import threading
    import time

    from speculators_compat.transport import region as region_mod
    from speculators_compat.transport.region import Region

    monkeypatch.setattr(region_mod, "POPULATE_SPAN", 512 << 20)

    def ticks_per_s(seconds: float, during=None) -> float:
        done, ticks = threading.Event(), [0]

        def spin():
            while not done.is_set():
                ticks[0] += 1

        t = threading.Thread(target=spin)
        t.start()
        time.sleep(0.02)
        t0, a = time.perf_counter(), ticks[0]
        if during is None:
            time.sleep(seconds)
        else:
            during()
        rate = (ticks[0] - a) / (time.perf_counter() - t0)
        done.set()
        t.join()
        return rate

    base = ticks_per_s(0.2)
    region = Region(512 << 20)

    def populate():
        region.populate()
        region._populator.join()

    during = ticks_per_s(0, populate)
    region.close()
    assert region.populate_s > 0
    assert during > 0.1 * base, (during, base)


def test_later_calls_are_laid_out_at_their_start_before_earlier_regions_close(monkeypatch):
    """From the second call on, the region is made when the call starts, with the first
    call's row format, and only then are the earlier calls' regions closed (unmapping and
    mapping contend for the worker's address-space lock: the forward thread must not map);
    the rows arrive exact. The first call lays out at its first rows."""
    from speculators_compat.transport import worker as worker_mod

    events = []
    made = worker_mod.Region

    class Recorded(made):
        def __init__(self, nbytes):
            events.append("make")
            super().__init__(nbytes)

    monkeypatch.setattr(worker_mod, "Region", Recorded)
    monkeypatch.setattr(Sender, "close_sent", lambda self, _orig=Sender.close_sent:
                        (events.append("close"), _orig(self))[1])
    sender, receiver = Sender(), Receiver()
    first = _states(call=0)
    sink = sender.begin_call(_plan(first), 3, wire.BY_REQUEST)
    assert sink.region is None  # nothing known of the rows yet
    _fetch(receiver, _stream(sender, _copy(first)))
    events.clear()
    second = _states(lens=(8, 2, 30), seed=1, call=1)
    got = _fetch(receiver, _stream(sender, _copy(second)))
    assert events == ["make", "close"]  # one region, made before the first call's closed
    assert _equal(got, second)
    sender.close()


def test_rows_of_another_format_than_foreseen_lay_the_call_out_again():
    """A layout made at the call's start for bfloat16 rows meets float32 rows of the same
    width: the region is made again at the first rows (before any copy), never a wrong
    dtype or row size."""
    sender, receiver = Sender(), Receiver()
    _fetch(receiver, _stream(sender, _states(call=0)))
    wide = {k: [t.float() for t in v] for k, v in _states(seed=2, call=1).items()}
    reply = _stream(sender, _copy(wide))
    assert reply["streamed"]
    got = _fetch(receiver, reply)
    assert _equal(got, wide)
    sender.close()


def test_closing_a_sent_region_keeps_the_drivers_copy():
    """The worker drops its page-table entries span by span before unmapping; the
    memfd's contents stay, so the driver's mapping reads the states unchanged."""
    from speculators_compat.transport import region as region_mod

    sender, receiver = Sender(), Receiver()
    states = _states(lens=(300, 700), call=0)
    original = region_mod.POPULATE_SPAN
    region_mod.POPULATE_SPAN = 4096 * 4  # many spans for a small region
    try:
        got = _fetch(receiver, _stream(sender, _copy(states)))
        sender.end_calls()
        for t in _close_threads():
            t.join()
        assert _equal(got, states)
    finally:
        region_mod.POPULATE_SPAN = original
    sender.close()


def _close_threads():
    """The sender's background threads closing sent regions, still running."""
    import threading

    return [t for t in threading.enumerate() if t.name == "speculators-compat-close"]
