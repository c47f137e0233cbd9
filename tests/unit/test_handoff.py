"""Zero copy: speculators' ``clone()`` of a transported tensor takes the memory over
(``speculators_compat._handoff`` with the transport of ``speculators_compat._transport``).

Worker and driver halves run in one process, as in test_transport.py; speculators' own use
is reproduced literally (``h.clone().cpu()`` for 0.4.x, ``h[o:o + n].clone().cpu()`` for
0.3.x). tests/e2e/test_transport.py runs it inside real vLLM workers.
"""

from __future__ import annotations

import gc
import io

import pytest

torch = pytest.importorskip("torch")

from speculators_compat import _handoff, _transport  # noqa: E402
from speculators_compat.demo.runner import owns_exactly  # noqa: E402

BF16 = torch.bfloat16
HIDDEN = 256
CHUNK = 256 << 10  # segments about the size of a call: the rows fill them


def _states(seed=0, lens=(60, 45, 70, 33), n_layers=2):
    g = torch.Generator().manual_seed(seed)
    return {f"req_{seed}_{i}": [torch.randn(n, HIDDEN, generator=g).to(BF16)
                                for _ in range(n_layers)] for i, n in enumerate(lens)}


def _fetch(exporter, importer, states, contract=_transport.BY_REQUEST):
    """One call through the transport (the worker's export of a copy of ``states``)."""
    copy = ({k: [t.clone() for t in v] for k, v in states.items()}
            if isinstance(states, dict) else [t.clone() for t in states])

    def call(released, more):
        exporter.release(released)
        return exporter.next_piece() if more else exporter.export(copy, contract)

    return importer.fetch(call)


def _speculators_04(got):
    """speculators 0.4.x: ``[h.clone().cpu() for h in states[req_id]]``."""
    return {rid: [h.clone().cpu() for h in layers] for rid, layers in got.items()}


def _pointers(importer) -> list[tuple[int, int]]:
    """Address ranges of the driver's mappings of the worker's segments."""
    import numpy as np

    spans = []
    for mm, size in importer._maps.values():
        base = np.frombuffer(mm, dtype=np.uint8).ctypes.data
        spans.append((base, base + size))
    return spans


def _inside(t, spans) -> bool:
    return any(lo <= t.data_ptr() < hi for lo, hi in spans)


def test_clone_takes_the_shared_memory_over_and_results_own_exactly_their_bytes():
    exporter = _transport.ShmExporter(chunk_bytes=CHUNK)
    importer = _transport.ShmImporter(handoff=True)
    states = _states()
    got = _fetch(exporter, importer, states)
    assert importer.stats["handed_over"] == 1
    assert all(type(h) is _handoff.handoff_class() for v in got.values() for h in v)
    results = _speculators_04(got)
    spans = _pointers(importer)
    for rid, layers in results.items():
        assert len(layers) == len(states[rid])
        for h, want in zip(layers, states[rid]):
            assert owns_exactly(h)  # plain tensor, storage = its own bytes
            assert _inside(h, spans)  # no copy: the leased segment itself
            assert h.dtype == want.dtype and torch.equal(h, want)
            buf = io.BytesIO()
            torch.save(h, buf)  # saves this result, not the whole segment
            assert len(buf.getvalue()) < h.numel() * h.element_size() + 4096


def test_results_keep_their_segment_leased_until_the_last_one_is_gone():
    exporter = _transport.ShmExporter(chunk_bytes=CHUNK)
    importer = _transport.ShmImporter(handoff=True)
    first_states = _states(seed=1)
    results = _speculators_04(_fetch(exporter, importer, first_states))
    gc.collect()
    assert importer.take_released() == []  # speculators' views are gone, results are not
    leased = {sid for sid, s in exporter.segments.items() if s.leased}
    assert leased
    for seed in range(2, 6):  # later calls never write a segment the results hold
        later = _speculators_04(_fetch(exporter, importer, _states(seed=seed)))
        exporter.release(importer.take_released())
        assert all(torch.equal(h, w) for rid in results
                   for h, w in zip(results[rid], first_states[rid], strict=True))
        del later
        gc.collect()
    exporter.release(importer.take_released())
    keep = results["req_1_2"][1]
    del results
    gc.collect()
    assert not set(importer.take_released()) & leased  # one result still refers to it
    assert torch.equal(keep, first_states["req_1_2"][1])
    del keep
    gc.collect()
    assert set(importer.take_released()) >= leased


def test_list_contract_slices_clone_to_exact_storages():
    """speculators 0.3.x slices each layer's lane per sequence, then clones."""
    exporter = _transport.ShmExporter(chunk_bytes=CHUNK)
    importer = _transport.ShmImporter(handoff=True)
    lens = [60, 45, 70, 33]
    lanes = [torch.randn(sum(lens), HIDDEN).to(BF16) for _ in range(2)]
    got = _fetch(exporter, importer, lanes, _transport.LIST)
    assert importer.stats["handed_over"] == 1
    offset, spans = 0, _pointers(importer)
    for n in lens:
        layer_states = [h[offset:offset + n].clone().cpu() for h in got]
        for h, lane in zip(layer_states, lanes, strict=True):
            assert owns_exactly(h) and _inside(h, spans)
            assert torch.equal(h, lane[offset:offset + n])
        offset += n


def test_owns_exactly_fails_a_view_of_the_whole_lane():
    """Known wrong: handing over a slice that keeps the whole lane as its storage (what
    ``as_subclass`` of the slice would give) fails the check that results own exactly
    their bytes."""
    exporter = _transport.ShmExporter(chunk_bytes=CHUNK)
    lanes = [torch.randn(208, HIDDEN).to(BF16)]
    got = _fetch(exporter, _transport.ShmImporter(handoff=True), lanes, _transport.LIST)
    wrong = got[0][10:50].as_subclass(torch.Tensor)
    assert torch.equal(wrong, lanes[0][10:50]) and not owns_exactly(wrong)
    assert not owns_exactly(got[0][10:50])  # the subclass itself is not what users get


def test_clone_copies_where_memory_cannot_be_taken_over():
    importer = _transport.ShmImporter(handoff=True)
    got = _fetch(_transport.ShmExporter(chunk_bytes=CHUNK), importer, _states())
    h = next(iter(got.values()))[0]
    spans = _pointers(importer)
    for copied in (h.t().clone(), h.clone(memory_format=torch.contiguous_format).t().clone()):
        assert type(copied) is torch.Tensor and not _inside(copied, spans)
        assert torch.equal(copied, h.t())
    took = h.clone(memory_format=torch.contiguous_format)
    assert type(took) is torch.Tensor and _inside(took, spans)


def test_small_rows_in_big_segments_are_copied():
    """Rows that fill a small part of their segment: results would hold far more memory.
    The transport copies them into driver memory and releases the segment at once;
    speculators' clone takes that memory over."""
    exporter = _transport.ShmExporter(chunk_bytes=4 << 20)
    importer = _transport.ShmImporter(handoff=True)
    states = _states(lens=(3, 4))
    got = _fetch(exporter, importer, states)
    assert (importer.stats["handed_over"], importer.stats["copied_ahead"]) == (0, 1)
    spans = _pointers(importer)
    assert importer.take_released() == sorted(exporter.segments)  # back at once
    results = _speculators_04(got)
    for rid, layers in results.items():
        for h, want in zip(layers, states[rid], strict=True):
            assert owns_exactly(h) and not _inside(h, spans) and torch.equal(h, want)


def test_offline_script_pattern_is_zero_copy_with_a_pool_that_settles():
    """speculators' offline script: each batch's results are saved and dropped when the
    next call returns. Every call is handed over and the pool stops growing."""
    exporter = _transport.ShmExporter(pool_bytes=8 * CHUNK, chunk_bytes=CHUNK)
    importer = _transport.ShmImporter(handoff=True)
    results, sizes = None, []
    for seed in range(10):
        exporter.release(importer.take_released())
        exporter.new_call()
        exporter.grow_ahead(2 * CHUNK)  # what the worker extension asks for
        importer.prepare_call(sum(len(v[0]) for v in _states(seed=seed).values()))
        results = _speculators_04(_fetch(exporter, importer, _states(seed=seed)))
        want = _states(seed=seed)
        assert all(torch.equal(h, w) for rid in want
                   for h, w in zip(results[rid], want[rid], strict=True))
        sizes.append(len(exporter.segments))
        gc.collect()
    assert (importer.stats["handed_over"], importer.stats["copied_ahead"]) == (10, 0)
    assert importer.stats["fresh_bytes"] == 0  # nothing made for copies that never came
    assert sizes[3:] == [sizes[3]] * 7 and sizes[3] <= 4, sizes


def test_a_caller_keeping_every_result_gets_copies_after_the_first_calls():
    """Kept results would make every call need fresh segments (slower on the H200 than
    the copy): after about one call's worth is held, the transport copies each call into
    driver memory made ready while the model ran (``prepare_call``), and the pool keeps
    its size."""
    exporter = _transport.ShmExporter(pool_bytes=8 * CHUNK, chunk_bytes=CHUNK)
    importer = _transport.ShmImporter(handoff=True, copy_threads=2)
    held, regions = [], []
    for seed in range(9):  # a call is 1 of the pool's 8 segments
        importer.prepare_call(sum(_states(seed=seed)[r][0].shape[0]
                                  for r in _states(seed=seed)))
        regions.append(importer._fresh._job is not None or importer._fresh.free() > 0)
        held.append(_speculators_04(_fetch(exporter, importer, _states(seed=seed))))
        exporter.release(importer.take_released())
        gc.collect()
    assert (importer.stats["handed_over"], importer.stats["copied_ahead"]) == (2, 7)
    # Memory made ahead from the third call on (the first taught the bytes per token).
    assert regions == [False, False] + [True] * 7, regions
    assert importer.stats["fresh_bytes"] >= 7 * 212 * 2 * HIDDEN * 2
    assert exporter.stats["copied"] == 9 and len(exporter.segments) == 3  # never pickled
    spans = _pointers(importer)
    for results in held[2:]:
        for h in (h for layers in results.values() for h in layers):
            assert owns_exactly(h) and not _inside(h, spans)
    for seed, results in enumerate(held):
        want = _states(seed=seed)
        assert all(torch.equal(h, w) for rid in want
                   for h, w in zip(results[rid], want[rid], strict=True))


def test_pieces_are_handed_over_from_the_drivers_own_memory():
    exporter = _transport.ShmExporter(pool_bytes=1 << 20, chunk_bytes=1 << 20)
    importer = _transport.ShmImporter(handoff=True)
    states = _states(lens=(300, 250, 400, 10, 333, 120))  # ~2.9 MB: larger than the pool
    got = _fetch(exporter, importer, states)
    assert exporter.stats["pieces"] >= 2 and importer.stats["copied_ahead"] == 1
    results = _speculators_04(got)
    for seg in exporter.segments.values():
        seg.buf.fill_(0)  # the pool is reused: results are the driver's own memory
    for rid, layers in results.items():
        for h, want in zip(layers, states[rid], strict=True):
            assert owns_exactly(h) and torch.equal(h, want)


def test_without_handoff_tensors_are_plain_views():
    got = _fetch(_transport.ShmExporter(chunk_bytes=CHUNK), _transport.ShmImporter(),
                 _states())
    assert all(type(h) is torch.Tensor for v in got.values() for h in v)


def test_a_copy_that_fails_still_gives_the_segments_back():
    """An error while the transport copies a call (memory, a signal) reaches the caller,
    and the call's segments still go back to the worker: nothing refers to them."""
    exporter = _transport.ShmExporter(chunk_bytes=4 << 20)  # small rows: copied ahead
    importer = _transport.ShmImporter(handoff=True)

    def failing(pairs):
        raise MemoryError("no memory for the copy")

    importer._copy = failing
    with pytest.raises(MemoryError):
        _fetch(exporter, importer, _states(lens=(3, 4)))
    leased = sorted(sid for sid, s in exporter.segments.items() if s.leased)
    assert leased and importer.take_released() == leased
    del importer._copy
    exporter.release(leased)
    got = _speculators_04(_fetch(exporter, importer, _states(seed=3, lens=(3, 4))))
    want = _states(seed=3, lens=(3, 4))
    assert all(torch.equal(h, w) for rid in want for h, w in zip(got[rid], want[rid],
                                                                 strict=True))


def _driver_rss_kib(importer) -> int:
    """Resident KiB of the driver's own mappings of the segments (``/proc/self/smaps``:
    the worker half, in this process, maps the same pages separately)."""
    starts = {start for start, _end in _pointers(importer)}
    rss, current = 0, False
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split()[0]
            if "-" in head and not head.endswith(":"):
                current = int(head.split("-")[0], 16) in starts
            elif current and head == "Rss:":
                rss += int(line.split()[1])
    return rss


def test_released_results_leave_only_a_calls_worth_of_the_pool_mapped():
    """After a caller releases every result it kept, the pages of the pool the driver
    read stop counting in its RSS, except the lowest segments a call of the last size
    needs (the next call is written there); the data stays in the worker's segments."""
    chunk = 1 << 20
    exporter = _transport.ShmExporter(pool_bytes=16 * chunk, chunk_bytes=chunk)
    importer = _transport.ShmImporter(handoff=True, copy_threads=2)
    lens = (300, 250, 400, 330)  # 1.25 MiB of rows per call: two segments each
    held = []
    for seed in range(5):
        importer.prepare_call(sum(lens))
        held.append(_speculators_04(_fetch(exporter, importer, _states(seed=seed, lens=lens))))
        exporter.release(importer.take_released())
        gc.collect()
    assert (importer.stats["handed_over"], importer.stats["copied_ahead"]) == (2, 3)
    mapped = sum(size for _mm, size in importer._maps.values())
    assert mapped >= 6 * chunk, mapped  # two held calls and the segments copies came from
    assert importer.stats["trimmed_bytes"] == 0  # nothing is trimmed while results live
    for seed, results in enumerate(held):  # reads every held row
        want = _states(seed=seed, lens=lens)
        assert all(torch.equal(h, w) for rid in want
                   for h, w in zip(results[rid], want[rid], strict=True))
    before = _driver_rss_kib(importer)
    assert before >= 3 * 1.2 * 1024, before  # three calls' rows were read (1.25 MiB each)
    del held, results
    gc.collect()
    kept = importer._call_segment_bytes
    assert kept == 2 * chunk
    assert importer.stats["trimmed_bytes"] == mapped - kept
    after = _driver_rss_kib(importer)
    assert after <= kept / 1024 and before - after >= 1024, (before, after, kept)
    # The segments still hold their data and serve the next calls.
    exporter.release(importer.take_released())
    got = _speculators_04(_fetch(exporter, importer, _states(seed=7, lens=lens)))
    want = _states(seed=7, lens=lens)
    assert all(torch.equal(h, w) for rid in want for h, w in zip(got[rid], want[rid],
                                                                 strict=True))
