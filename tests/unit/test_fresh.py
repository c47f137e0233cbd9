"""Driver memory made ready while the model runs (``speculators_compat._fresh``)."""

from __future__ import annotations

import gc
import weakref

import pytest

np = pytest.importorskip("numpy")

from speculators_compat import _fresh  # noqa: E402


def test_pieces_are_exact_aligned_and_disjoint():
    fresh = _fresh.FreshMemory(threads=2)
    fresh.prepare(5 << 20)
    sizes = [1000, 3, 4096 * 3 + 5, 1 << 20]
    pieces = [fresh.take(n) for n in sizes]
    assert [p.nbytes for p in pieces] == sizes
    assert all(p.ctypes.data % _fresh.ALIGN == 0 for p in pieces)
    spans = sorted((p.ctypes.data, p.ctypes.data + p.nbytes) for p in pieces)
    assert all(a[1] <= b[0] for a, b in zip(spans, spans[1:]))
    for i, p in enumerate(pieces):
        p[:] = i + 1
    assert [int(p[0]) for p in pieces] == [1, 2, 3, 4] and all(
        int(p[-1]) == i + 1 for i, p in enumerate(pieces))
    assert fresh.stats["fresh_bytes"] == 6 << 20 and fresh.stats["fresh_hugepages"] in (
        True, False)


def test_take_without_room_returns_none():
    fresh = _fresh.FreshMemory()
    assert fresh.take(10) is None  # nothing prepared
    fresh.prepare(1 << 20)
    assert fresh.take(3 << 20) is None  # larger than the region (2 MiB)
    assert fresh.take(1 << 20) is not None


def test_a_region_lives_as_long_as_any_piece():
    fresh = _fresh.FreshMemory()
    fresh.prepare(1 << 20)
    piece = fresh.take(100)
    region = weakref.ref(piece.base.base if piece.base.base is not None else piece.base)
    fresh.drop()
    gc.collect()
    assert region() is not None
    piece[:] = 7
    assert int(piece.sum()) == 700
    del piece
    gc.collect()
    assert region() is None


def test_prepare_keeps_a_region_with_room_and_replaces_a_full_one():
    fresh = _fresh.FreshMemory()
    fresh.prepare(1 << 20)
    first = fresh.take(1 << 20)
    fresh.prepare(1 << 20)  # 1 MiB of the 2 MiB region left: kept
    assert fresh.stats["fresh_bytes"] == 2 << 20
    second = fresh.take(1 << 20)
    fresh.prepare(1 << 20)  # full: a new region
    third = fresh.take(1 << 20)
    assert fresh.stats["fresh_bytes"] == 4 << 20
    assert first is not None and second is not None and third is not None


def test_a_failed_region_leaves_take_to_ordinary_memory(monkeypatch):
    def refuse(*args, **kwargs):
        raise OSError("no memory")

    monkeypatch.setattr(_fresh.mmap, "mmap", refuse)
    fresh = _fresh.FreshMemory()
    fresh.prepare(1 << 20)
    assert fresh.take(100) is None and fresh.stats["fresh_bytes"] == 0
