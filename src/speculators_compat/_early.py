"""Rows copied into the driver's memory while the model still runs.

Why: where the transport copies a call's hidden states into the driver's own memory
(every earlier result is still held, see :mod:`speculators_compat._transport`), that copy
ran after the last step, while the GPU waited. Measured on an H200 with an 8B-shaped
model, four layers, batch 32, every result kept: the steps ran at vLLM's own speed
(0.692 s against 0.690 s per call), the copy after them took 0.026-0.028 s per call and
was most of what was left between the generator and vLLM's native extraction. The rows
of a step are in shared memory long before the call ends: the driver can copy them
while the later steps run.

How: the worker that captures keeps a small *board* (one memfd of 64-bit words, mapped
by the driver like the pool's segments). When a call's rows get their place in the pool
(:class:`speculators_compat._transport.StreamingSink`), the worker writes the layout on
the board: for every request of the plan and every captured layer, the segment and
offset of its first row, and the segments' descriptors. After every step it writes, per
request, how many prompt rows have *landed* (their copies to shared memory completed:
the side stream's event has fired, or the copy was synchronous). A driver thread
(:class:`EarlyCopy`) polls the board and copies each request's landed rows into memory
of its own while the model runs; when the states arrive it stops, and the transport
copies only the rows it had not reached.

Why it cannot return a wrong row:

- every call has a token the driver chose (passed with the reset); the thread reads the
  board only while it carries that token;
- a row is published only after its copy completed, and the rows of a call's places are
  written once, unless the scheduler recomputes a prompt (preemption): the worker then
  marks the board dead, and the driver copies the whole call after the states arrive;
- the early copies count only if the final reply (an RPC: a full synchronisation
  point) names the same token, and the layout the thread read equals the reply's item by
  item; otherwise they are dropped and the whole call is copied, as before;
- ordering: the worker writes a request's count only after its rows are in memory (a
  completed event or a synchronous copy); the driver's thread reads the counts, then
  copies with numpy, which releases the GIL (a lock: a full barrier) before it reads the
  rows.

Applies when: the driver copies a call (results held, :meth:`ShmImporter.prepare_call`
predicted a copy) and the rows were streamed. Nothing here touches CUDA in the driver.
"""

from __future__ import annotations

import mmap
import os
import queue
import threading
from collections.abc import Callable
from typing import Any

#: Words (int64) of a board: 1 MiB, room for about 60,000 requests x layers.
WORDS = 1 << 17
#: Header words.
TOKEN, READY, DEAD, NPLAN, NLAYERS, ROW_BYTES, NSEG, IS_LIST = range(8)
HEADER = 8
#: How often the driver's thread looks at the board while nothing is new.
POLL_S = 0.002
#: Copy rows early at all. The GPU benchmark turns it off to measure what it saves
#: (``gpu_bench --no-early-copy``); not a setting.
ENABLED = True


def _words(mm):
    import numpy as np

    return np.frombuffer(mm, dtype=np.int64)


class Board:
    """Worker side: the call's layout and per-request landed rows, in shared memory."""

    def __init__(self, words: int = WORDS) -> None:
        self.fd = os.memfd_create("speculators-compat-board", os.MFD_CLOEXEC)
        try:
            os.ftruncate(self.fd, words * 8)
            self.mm = mmap.mmap(self.fd, words * 8)
        except BaseException:
            os.close(self.fd)
            raise
        self.w = _words(self.mm)
        self.token = 0
        self._n = 0

    def info(self) -> dict:
        return {"pid": os.getpid(), "fd": self.fd, "bytes": self.w.nbytes}

    def start(self, token: int) -> None:
        """A call starts: nothing published for it yet."""
        w = self.w
        w[READY] = 0
        w[DEAD] = 0
        self.token = int(token)
        w[TOKEN] = self.token
        self._n = 0

    def publish_layout(self, n_layers: int, row_bytes: int, is_list: bool,
                       src: list[list[tuple[int, int]]],
                       segments: dict[int, tuple[int, int]]) -> bool:
        """``src[i][slot]``: (segment id, byte offset) of request ``i``'s first row in
        layer ``slot``; ``segments``: id -> (worker fd, size). False if it does not fit."""
        n = len(src)
        w = self.w
        if HEADER + n + 2 * n * n_layers + 3 * len(segments) > len(w):
            self.kill()
            return False
        w[NPLAN], w[NLAYERS], w[ROW_BYTES] = n, n_layers, row_bytes
        w[NSEG], w[IS_LIST] = len(segments), int(is_list)
        w[HEADER:HEADER + n] = 0
        base = HEADER + n
        k = n * n_layers
        w[base:base + k] = [sid for per in src for sid, _ in per]
        w[base + k:base + 2 * k] = [off for per in src for _, off in per]
        table = [v for sid, (fd, size) in sorted(segments.items()) for v in (sid, fd, size)]
        w[base + 2 * k:base + 2 * k + len(table)] = table
        self._n = n
        w[READY] = 1
        return True

    def landed(self, ends, token: int) -> None:
        """``ends``: (request ``i``, ``rows``): request ``i``'s prompt rows ``0..rows``
        are in shared memory, every layer; for the call ``token`` only."""
        if token != self.token or not self._n:
            return
        for i, rows in ends:
            if 0 <= i < self._n:
                self.w[HEADER + i] = rows

    def kill(self) -> None:
        """Rows of this call may be rewritten (or were never placed): publish nothing."""
        self.w[DEAD] = 1

    @property
    def dead(self) -> bool:
        return bool(self.w[DEAD])

    def close(self) -> None:
        self.w = None
        try:
            self.mm.close()
        except BufferError:
            pass
        os.close(self.fd)


class Lander:
    """Worker side: publishes a step's rows on the board as soon as their copies to
    shared memory completed, from a thread that waits on the side stream's events (with
    blocking sync: it sleeps), so that the worker's main thread never waits and the rows
    of a step are published while the model still runs the rest of it."""

    def __init__(self, board: Board) -> None:
        self.board = board
        self.token = board.token
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._thread: threading.Thread | None = None

    def after(self, event, ends) -> None:
        """Publish ``ends`` once ``event`` (recorded after their copies) has fired."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, daemon=True,
                                            name="speculators-compat-lander")
            self._thread.start()
        self._queue.put((event, ends))

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            event, ends = item
            try:
                event.synchronize()  # releases the GIL
            except Exception:  # noqa: BLE001 - publish nothing more; the end copies the rest
                while self._queue.get() is not None:
                    pass
                return
            self.board.landed(ends, self.token)

    def close(self) -> None:
        """Publish what is queued and stop (before the board serves another call)."""
        if self._thread is not None:
            self._queue.put(None)
            self._thread.join()
            self._thread = None


def read_layout(w, plan_len: int) -> dict | None:
    """The layout a board holds (``None`` if it does not match a plan of this length)."""
    n, n_layers, row_bytes = int(w[NPLAN]), int(w[NLAYERS]), int(w[ROW_BYTES])
    if n != plan_len or n_layers <= 0 or row_bytes <= 0:
        return None
    base = HEADER + n
    k = n * n_layers
    sids = w[base:base + k].tolist()
    offs = w[base + k:base + 2 * k].tolist()
    nseg = int(w[NSEG])
    table = w[base + 2 * k:base + 2 * k + 3 * nseg].tolist()
    return {"n_layers": n_layers, "row_bytes": row_bytes, "is_list": bool(w[IS_LIST]),
            "src": [[(sids[i * n_layers + s], offs[i * n_layers + s]) for s in range(n_layers)]
                    for i in range(n)],
            "segments": {table[j]: (table[j + 1], table[j + 2]) for j in range(0, len(table), 3)}}


class EarlyCopy:
    """Driver side: one call's thread that copies landed rows while the model runs.

    ``board``: the driver's int64 view of the worker's board; ``plan``: the call's
    (request id, prompt length) in input order; ``segment(sid, fd, size)``: the driver's
    uint8 view of a pool segment; ``owned(nbytes)``: memory of the driver's own."""

    def __init__(self, board, token: int, plan, segment: Callable, owned: Callable) -> None:
        self.board = board
        self.token = int(token)
        self.plan = [(str(r), int(n)) for r, n in plan]
        self._segment = segment
        self._owned = owned
        self.layout: dict | None = None
        self.regions: dict[tuple[Any, int], Any] = {}
        self.arrays: dict[int, Any] = {}  # the layout's segments, as the driver maps them
        self.dst: dict[tuple[int, int], tuple[tuple[Any, int], int]] = {}
        self.done = [0] * len(self.plan)
        self.copied = 0
        self.failed: str | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True,
                                        name="speculators-compat-early")

    def start(self) -> EarlyCopy:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()

    # -- the thread ----------------------------------------------------------------
    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                if not self._once():
                    if self.failed:
                        return
                    self._stop.wait(POLL_S)
        except Exception as exc:  # noqa: BLE001 - an optimisation: the end copies it all
            self.failed = f"{type(exc).__name__}: {exc}"

    def _once(self) -> bool:
        """Copy what landed since the last look; True if anything was copied."""
        w = self.board
        if int(w[TOKEN]) != self.token:  # the reset set it before the thread started
            self.failed = "board taken by another call"
            return False
        if w[DEAD]:
            self.failed = "rows rewritten (recomputed prompt) or not placed"
            return False
        if self.layout is None:
            if not w[READY]:
                return False
            self._prepare(read_layout(w, len(self.plan)))
            if self.failed:
                return False
        landed = w[HEADER:HEADER + len(self.plan)].tolist()
        work = False
        for i, end in enumerate(landed):
            if self._stop.is_set():
                break
            end = min(int(end), self.plan[i][1])
            if end > self.done[i]:
                self._copy_rows(i, self.done[i], end)
                self.done[i] = end
                work = True
        return work

    def _prepare(self, layout: dict | None) -> None:
        if layout is None:
            self.failed = "board layout does not match the plan"
            return
        rb, n_layers = layout["row_bytes"], layout["n_layers"]
        total = sum(n for _, n in self.plan)
        for slot in range(n_layers):
            start = 0
            for i, (rid, n) in enumerate(self.plan):
                if layout["is_list"]:
                    key = (None, slot)
                    if key not in self.regions:
                        self.regions[key] = self._owned(total * rb)
                    self.dst[(i, slot)] = (key, start * rb)
                else:
                    key = (rid, slot)
                    self.regions[key] = self._owned(n * rb)
                    self.dst[(i, slot)] = (key, 0)
                start += n
        self.arrays = {sid: self._segment(sid, fd, size)
                       for sid, (fd, size) in layout["segments"].items()}
        self.layout = layout

    def _copy_rows(self, i: int, a: int, b: int) -> None:
        import numpy as np

        rb = self.layout["row_bytes"]
        for slot, (sid, off) in enumerate(self.layout["src"][i]):
            key, doff = self.dst[(i, slot)]
            np.copyto(self.regions[key][doff + a * rb:doff + b * rb],
                      self.arrays[sid][off + a * rb:off + b * rb])
            self.copied += (b - a) * rb

    # -- the end ---------------------------------------------------------------------
    def finish(self, reply: dict, arrays: dict, nbytes: Callable) -> tuple[dict, list] | None:
        """Stop; if the early copies belong to this reply, the regions per (key, slot)
        and the (source, destination) pairs of the rows still to copy; else ``None``.

        ``arrays``: the reply's segments as the driver maps them (sid -> uint8 array);
        ``nbytes(shape, dtype_name)``: a tensor's bytes."""
        self.stop()
        if self.failed or reply.get("board") != self.token:
            return None
        if self.layout is None:  # nothing landed before the end (one short step)
            if not self.board[READY] or int(self.board[TOKEN]) != self.token:
                return None
            self._prepare(read_layout(self.board, len(self.plan)))
            if self.failed:
                return None
        rb = self.layout["row_bytes"]
        items = reply["items"]
        if len(items) != len(self.regions):
            return None
        by_key: dict[tuple[Any, int], tuple] = {}
        for key, slot, sid, off, shape, dtype, start, total in items:
            region = self.regions.get((key, slot))
            if (region is None or sid is None or start != 0 or shape[0] != total
                    or region.nbytes != nbytes(shape, dtype) or sid not in arrays):
                return None
            by_key[(key, slot)] = (sid, off)
        pairs = []
        for (i, slot), (key, doff) in self.dst.items():
            sid, off = by_key[key]
            if self.layout["src"][i][slot] != (sid, off + doff):
                return None
            a, b = self.done[i] * rb, self.plan[i][1] * rb
            if b > a:
                pairs.append((arrays[sid][off + doff + a:off + doff + b],
                              self.regions[key][doff + a:doff + b]))
        return self.regions, pairs
