"""Captured hidden states reach the driver through shared memory, not through pickles.

Why: speculators' generator fetches every captured row with
``collective_rpc("_get_captured_states")``. vLLM pickles the reply: a CUDA tensor goes
through ``torch.save`` into bytes (a blocking device-to-host copy into pageable memory),
through the executor's response queue, and is loaded again in the driver onto the
driver's GPU, where speculators' ``.cpu()`` copies it back. With four layers of an
8B-shaped model that costs about three quarters of the wall time on an H200.

How: the worker that captures (TP rank 0) copies the captured tensors into anonymous
shared memory (``memfd_create``; pinned with ``cudaHostRegister`` when CUDA is up, so
the copies are DMA at full bus speed) and replies with a small descriptor (file
descriptor numbers, offsets, shapes, dtypes). The driver maps the worker's memory
through ``/proc/<pid>/fd/<n>`` and hands speculators CPU tensors that are views of it:
the only driver-side copy is speculators' own ``clone()``. Nothing is ever created in
``/dev/shm`` (a memfd has no name there and is not bound by its size, e.g. Docker's
64 MB default), and the memory goes away with the last process that maps it, however
the processes end.

Ownership: a segment the driver holds views of is *leased*; the worker never writes a
leased segment. When the driver's views of a segment are all gone (a ``weakref``
finalizer on the array the views share), the segment is released with the next request.
The pool is bounded (``SPECULATORS_COMPAT_TRANSPORT_BYTES``, default a quarter of the
available memory, at most 8 GiB): a batch larger than the pool comes in pieces, which
the driver copies into memory of its own (so results stay valid whatever happens to the
pool). When shared memory cannot be used (no ``memfd_create``, ``/proc/<pid>/fd`` not
readable, allocation refused), the reply carries the states the old way and the
driver logs why, once: never a crash, never different data.

Zero copy (``ShmImporter(handoff=True)``, see :mod:`speculators_compat._handoff`):
speculators' own ``clone()`` of a returned tensor then takes the memory over instead of
copying it, so its results are views of the leased segment (each with a storage of
exactly its own bytes) and keep the segment leased while they live. A call is handed
over only where its segments will come back for later calls (``_hand_over_now``: the
rows fill them, and earlier results hold no more than about one call's worth, as in
speculators' offline script); otherwise the driver copies the call into memory of its
own on several threads (``_copy_ahead``), memory made while the model ran
(:mod:`speculators_compat._fresh`, started by :meth:`ShmImporter.prepare_call`), and the
call's segments come back at once.
"""

from __future__ import annotations

import logging
import mmap
import os
import threading
import time
import weakref
from collections import deque
from typing import Any

from . import _early, _fresh, _handoff, _speculators

logger = logging.getLogger("speculators_compat")

#: Marker key of a transport reply (a plain dict: it must unpickle without this module).
MARKER = "speculators_compat_transport"
#: Upper bound of the worker's shared-memory pool, in bytes.
POOL_BYTES_ENV = "SPECULATORS_COMPAT_TRANSPORT_BYTES"
CHUNK_BYTES = 256 << 20
MAX_DEFAULT_POOL = 8 << 30
#: Calls' worth of free memory the first call makes beside itself (see
#: :meth:`StreamingSink._allocate`): two calls a caller may hold (zero copy) plus this call
#: and the next, with room for the segment ends the layout leaves unused.
FIRST_CALL_AHEAD = 3.5
#: The worker RPCs the driver calls instead of ``_get_captured_states`` / ``_reset_capture``.
EXPORT_RPC = "_compat_export_states"
RESET_RPC = "_compat_reset_capture"

#: The worker extension's result contracts (speculators 0.3.x / 0.4.x).
LIST = _speculators.CONTRACT_LIST
BY_REQUEST = _speculators.CONTRACT_BY_REQUEST


def default_pool_bytes() -> int:
    env = os.environ.get(POOL_BYTES_ENV)
    if env:
        return max(int(env), 1 << 20)
    available = None
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    available = int(line.split()[1]) * 1024
                    break
    except OSError:
        pass
    if available is None:
        return 1 << 30
    return max(min(available // 4, MAX_DEFAULT_POOL), CHUNK_BYTES)


def unavailable_reason() -> str | None:
    """Why this machine cannot use the shared-memory transport (``None`` if it can)."""
    if not hasattr(os, "memfd_create"):
        return "os.memfd_create is not available (Linux only)"
    try:
        fd = os.memfd_create("speculators-compat-probe", os.MFD_CLOEXEC)
    except OSError as exc:
        return f"memfd_create failed: {exc}"
    try:
        other = os.open(f"/proc/{os.getpid()}/fd/{fd}", os.O_RDWR)
        os.close(other)
    except OSError as exc:
        return f"/proc/<pid>/fd is not readable: {exc}"
    finally:
        os.close(fd)
    return None


def _pin(buf) -> bool:
    """Page-lock ``buf`` for CUDA (DMA copies); ``False`` where that is not possible."""
    try:
        import torch

        if not torch.cuda.is_available() or not torch.cuda.is_initialized():
            return False
        err = torch.cuda.cudart().cudaHostRegister(buf.data_ptr(), buf.numel(), 0)
        return int(err) == 0
    except Exception:  # noqa: BLE001 - pinning is an optimisation only
        return False


def _unpin(buf) -> None:
    try:
        import torch

        torch.cuda.cudart().cudaHostUnregister(buf.data_ptr())
    except Exception:  # noqa: BLE001
        pass


class _Segment:
    """One memfd of the worker's pool, mapped and (on CUDA) pinned."""

    def __init__(self, size: int) -> None:
        import torch

        self.sid, self.size = -1, size  # the sid is set when the pool takes it
        self.fd = os.memfd_create("speculators-compat", os.MFD_CLOEXEC)
        try:
            os.posix_fallocate(self.fd, 0, size)  # ENOSPC now, never SIGBUS later
            self.mm = mmap.mmap(self.fd, size)
        except BaseException:
            os.close(self.fd)
            raise
        self.buf = torch.frombuffer(self.mm, dtype=torch.uint8)
        self.pinned = _pin(self.buf)
        self.used = 0
        self.leased = False

    def close(self) -> None:
        if self.pinned:
            _unpin(self.buf)
        self.buf = None
        try:
            self.mm.close()
        except BufferError:  # a view is still alive: the mapping goes with it
            pass
        os.close(self.fd)


def _items(states: Any, contract: str) -> list[tuple[Any, int, Any]]:
    """(key, layer slot, 2-D tensor) for every tensor of a contract object."""
    if contract == LIST:
        return [(None, slot, t) for slot, t in enumerate(states)]
    return [(rid, slot, t) for rid, layers in states.items() for slot, t in enumerate(layers)]


class ShmExporter:
    """Worker side: copies captured tensors into the pool, answers with descriptors."""

    def __init__(self, pool_bytes: int | None = None, chunk_bytes: int = CHUNK_BYTES) -> None:
        self.pool_bytes = pool_bytes or default_pool_bytes()
        # At least eight segments fit the pool: results a user holds keep whole segments
        # leased (zero copy), and later calls need free ones.
        self.chunk_bytes = max(min(chunk_bytes, self.pool_bytes // 8), 64 << 10)
        self.segments: dict[int, _Segment] = {}
        self._next_sid = 0
        self._lock = threading.Lock()  # segments and sids: the grower adds segments too
        self._grower: threading.Thread | None = None
        self._settle = False  # the first call waits for the pool it grew (grow_first)
        #: Bytes per prompt token (all captured layers) of the last streamed call: the
        #: size of the next call, for :meth:`grow_ahead`.
        self.token_bytes = 0
        self._closed: list[int] = []  # segments the driver should unmap
        self._queue: deque = deque()
        self._contract = BY_REQUEST
        self._first = False
        self._stream = None
        #: The board the driver reads landed rows from (:mod:`speculators_compat._early`),
        #: made at the first call that asks for it; ``False``: it could not be made.
        self._board: Any = None
        #: How replies went: ``streamed`` (rows copied while the model ran), ``copied``
        #: (copied at the end), ``pieces`` (a batch larger than the pool).
        self.stats = {"streamed": 0, "copied": 0, "pieces": 0, "pinned": 0, "unpinned": 0,
                      "write_s": 0.0, "wait_s": 0.0, "grown": 0, "grow_s": 0.0,
                      "grow_wait_s": 0.0}

    # -- pool ----------------------------------------------------------------------
    def release(self, sids) -> None:
        for sid in sids or ():
            seg = self.segments.get(sid)
            if seg is not None:
                seg.leased = False

    def _take_free(self, nbytes: int) -> tuple[_Segment, int] | None:
        """First fit, lowest segment number first: calls reuse the same few segments
        (the driver keeps those mapped when it unmaps the rest, ``ShmImporter._trim``)."""
        with self._lock:
            for seg in self.segments.values():
                if not seg.leased and seg.size - seg.used >= nbytes:
                    off = seg.used
                    seg.used += nbytes
                    return seg, off
        return None

    def _alloc(self, nbytes: int) -> tuple[_Segment, int] | None:
        nbytes = (nbytes + 63) // 64 * 64
        got = self._take_free(nbytes)
        if got is None and self._grower is not None:
            t0 = time.perf_counter()
            self._grower.join()  # it is allocating what this call needs
            self._grower = None
            self.stats["grow_wait_s"] += time.perf_counter() - t0
            got = self._take_free(nbytes)
        if got is not None:
            return got
        total = sum(s.size for s in self.segments.values())
        size = max(self.chunk_bytes, nbytes)
        if total + size > self.pool_bytes:
            # Make room from free segments too small for this tensor.
            for sid in [s.sid for s in self.segments.values() if not s.leased and not s.used]:
                if total + size <= self.pool_bytes:
                    break
                total -= self.segments[sid].size
                self.segments.pop(sid).close()
                self._closed.append(sid)
            if total + size > self.pool_bytes:
                return None
        seg = _Segment(size)
        self._add(seg)
        seg.used = nbytes
        return seg, 0

    def _add(self, seg: _Segment) -> None:
        with self._lock:
            seg.sid, self._next_sid = self._next_sid, self._next_sid + 1
            self.segments[seg.sid] = seg
            self.stats["pinned" if seg.pinned else "unpinned"] += 1

    def grow_ahead(self, nbytes: int) -> None:
        """Make sure ``nbytes`` are free in the pool, allocating what is missing on
        background threads: called when a call starts with this call's size plus the
        next one's, so that the next call finds its memory ready.

        Why: where results are held (zero copy keeps their segments leased), every call
        needs fresh segments; allocating them inside the forward (zero-filled by
        ``posix_fallocate``, then pinned) cost about 0.45 s per GiB on one thread in the
        worker's step on an H200, more than speculators' copy it replaced. Here it runs
        beside this call's forward instead (the GPU is busy, the worker's CPU thread
        mostly waits); a call that needs a segment the grower is still making waits for
        it rather than allocating twice. Bounded by the pool like any allocation."""
        if nbytes <= 0 or (self._grower is not None and self._grower.is_alive()):
            return
        with self._lock:
            free = sum(s.size - s.used for s in self.segments.values() if not s.leased)
            total = sum(s.size for s in self.segments.values())
        missing = nbytes - free
        count = min(-(-missing // self.chunk_bytes),
                    (self.pool_bytes - total) // self.chunk_bytes) if missing > 0 else 0
        if count <= 0:
            return
        device = None
        try:
            import torch

            if torch.cuda.is_available() and torch.cuda.is_initialized():
                device = torch.cuda.current_device()  # pin for this worker's GPU
        except Exception:  # noqa: BLE001 - pinning is an optimisation only
            pass
        self._grower = threading.Thread(target=self._grow, args=(count, device),
                                        name="speculators-compat-grow", daemon=True)
        self._grower.start()

    def grow_first(self, nbytes: int) -> None:
        """The first streamed call knows the size of a call: make the pool a call size
        needs in steady use, beside this (first) call's forward, and let that call wait
        for it at its end (:meth:`settle_first`).

        Why: growing the pool beside later forwards slowed each of them. Measured on the
        H200 (8B shape, four layers, batch 32): the pool grew from 4 to 13-17 segments
        over the first three calls after the warm-up, each 0.2-0.3 s slower than vLLM's
        prefill, the calls after them as fast. A one-off cost belongs to the first call
        (days of data generation pay it once). How much: :data:`FIRST_CALL_AHEAD` calls
        beside this one, bounded by the pool."""
        self.grow_ahead(nbytes)
        self._settle = self._grower is not None

    def settle_first(self) -> None:
        """End of a call: if it is the first, wait for :meth:`grow_first`'s segments."""
        if self._settle:
            self._settle = False
            if self._grower is not None:
                t0 = time.perf_counter()
                self._grower.join()
                self._grower = None
                self.stats["grow_wait_s"] += time.perf_counter() - t0

    def _grow(self, count: int, device) -> None:
        from concurrent.futures import ThreadPoolExecutor

        def one(_):
            if device is not None:
                import torch

                torch.cuda.set_device(device)
            return _Segment(self.chunk_bytes)

        t0 = time.perf_counter()
        try:
            with ThreadPoolExecutor(min(count, 4)) as pool:
                for seg in pool.map(one, range(count)):
                    self._add(seg)
                    self.stats["grown"] += 1
        except Exception:  # noqa: BLE001 - an optimisation: the call allocates (and
            pass           # reports) on its own; nothing may escape a background thread
        self.stats["grow_s"] += time.perf_counter() - t0

    def reset(self) -> None:
        """Forget a failed export (what the driver holds stays leased)."""
        self.new_call()

    def board(self, token: int | None):
        """The board, started for the call ``token`` (``None``: no token, no board)."""
        if token is None:
            return None
        if self._board is None:
            try:
                self._board = _early.Board()
            except (OSError, ValueError):
                self._board = False
        if self._board:
            self._board.start(token)
        return self._board or None

    def close(self) -> None:
        if self._grower is not None:
            self._grower.join()
            self._grower = None
        if self._board:
            self._board.close()
        self._board = None
        for seg in list(self.segments.values()):
            seg.close()
        self.segments.clear()
        self._queue.clear()

    # -- export --------------------------------------------------------------------
    @property
    def pending(self) -> bool:
        return bool(self._queue)

    def export(self, states: Any, contract: str) -> dict:
        """Start exporting a contract object; returns the first piece's descriptor."""
        self._queue.clear()
        self._contract = contract
        for key, slot, t in _items(states, contract):
            self._queue.append((key, slot, t, 0))
        self._first = True
        return self.next_piece()

    def next_piece(self) -> dict:
        with self._lock:
            for seg in self.segments.values():
                if not seg.leased:
                    seg.used = 0
        out, used, cuda = [], set(), False
        whole = True
        while self._queue:
            key, slot, t, start = self._queue[0]
            rows = t.shape[0] - start
            row_bytes = t[0].numel() * t.element_size() if t.shape[0] else 0
            got = self._alloc(rows * row_bytes) if rows else None
            if got is None and rows:
                if out:
                    break
                # Not even one whole tensor fits in a free pool: write as many rows as fit.
                free = [s for s in list(self.segments.values()) if not s.leased]
                best = max(free, key=lambda s: s.size - s.used, default=None)
                fit = 0 if best is None or not row_bytes else (best.size - best.used) // row_bytes
                if fit <= 0:
                    raise MemoryError("speculators-compat transport: every shared-memory "
                                      "segment is still in use by the driver")
                rows = min(rows, fit)
                got = (best, best.used)
                best.used += (rows * row_bytes + 63) // 64 * 64
            if rows < t.shape[0] - start:
                self._queue[0] = (key, slot, t, start + rows)
                whole = False
            else:
                self._queue.popleft()
                whole = whole and start == 0
            if not rows:
                out.append((key, slot, None, 0, tuple(t.shape), str(t.dtype), 0, 0))
                continue
            seg, off = got
            src = t[start:start + rows]
            dst = seg.buf[off:off + rows * row_bytes].view(t.dtype).view(src.shape)
            cuda = cuda or src.is_cuda
            dst.copy_(src, non_blocking=src.is_cuda and seg.pinned)
            used.add(seg.sid)
            out.append((key, slot, seg.sid, off, tuple(src.shape), str(t.dtype), start,
                        t.shape[0]))
        if cuda:
            import torch

            torch.cuda.current_stream().synchronize()
        alone, self._first = self._first and whole and not self._queue, False
        self.stats["copied" if alone else "pieces"] += 1
        return self.lease_reply(used, out, self._contract, more=bool(self._queue),
                                whole=whole and not self._queue)

    def lease_reply(self, used, items, contract: str, more: bool = False,
                    whole: bool = True) -> dict:
        """Mark ``used`` segments leased to the driver; the reply that describes them."""
        for sid in used:
            self.segments[sid].leased = True
        return {MARKER: 1, "pid": os.getpid(), "contract": contract, "pool": self.pool_bytes,
                "segments": {sid: (self.segments[sid].fd, self.segments[sid].size)
                             for sid in used},
                "items": items, "more": more, "whole": whole, "closed": self._take_closed()}

    def side_stream(self):
        """The CUDA stream that copies rows to shared memory beside the forward."""
        if self._stream is None:
            import torch

            self._stream = torch.cuda.Stream()
        return self._stream

    def new_call(self) -> None:
        """A ``generate()`` call starts: free segments are empty again."""
        self._queue.clear()
        with self._lock:
            for seg in self.segments.values():
                if not seg.leased:
                    seg.used = 0

    def _take_closed(self) -> list[int]:
        closed, self._closed = self._closed, []
        return closed


class StreamingSink:
    """Worker side: rows go to shared memory while the model runs, not after.

    Built at the start of a ``generate()`` call from the driver's plan (request ids and
    prompt lengths, in input order). Each decoder-layer hook hands it the rows it kept;
    on CUDA they are copied on a side stream into pinned shared memory, overlapping the
    rest of the forward, so that by the time speculators asks for the states only a
    descriptor is left to send. The layout is the installed speculators' contract: one
    region per request and layer (0.4.x), or one lane per layer with the requests
    concatenated in input order (0.3.x). Anything unplanned (a request not in the plan,
    rows past a prompt's end, a pool too small) switches it off for the call: the export
    then takes the regular path, never a wrong row.
    """

    def __init__(self, exporter: ShmExporter, plan, n_layers: int, contract: str,
                 board: Any = None) -> None:
        self.exporter = exporter
        self.plan = [(str(r), int(n)) for r, n in plan]
        self.n_layers = n_layers
        self.contract = contract
        self.ok = bool(self.plan)
        self.dst: dict[tuple[str, int], Any] | None = None
        self.places: dict[tuple[Any, int], tuple[int, int, tuple, str]] = {}
        self.used: set[int] = set()
        self._cuda = False
        #: Where landed rows are published for the driver's early copy
        #: (:mod:`speculators_compat._early`), or ``None``.
        self.board = board
        self._index = {rid: i for i, (rid, _) in enumerate(self.plan)}
        self._written = [0] * len(self.plan)  # rows written (every layer), per request
        self._step: list[tuple[int, int, int]] | None = None  # this step's (i, pos, rows)
        self._lander = _early.Lander(board) if board is not None else None

    def _allocate(self, sample) -> None:
        self.dst = {}
        width = tuple(sample.shape[1:])
        row_bytes = sample[0].numel() * sample.element_size() if sample.shape[0] else 0
        total = sum(n for _, n in self.plan)
        first = not self.exporter.token_bytes
        self.exporter.token_bytes = row_bytes * self.n_layers

        def region(key, slot, rows):
            got = self.exporter._alloc(max(rows * row_bytes, 1))
            if got is None:
                raise MemoryError("shared-memory pool too small for this batch")
            seg, off = got
            self.used.add(seg.sid)
            view = seg.buf[off:off + rows * row_bytes].view(sample.dtype).view((rows, *width))
            self.places[(key, slot)] = (seg.sid, off, (rows, *width), str(sample.dtype))
            return view

        if self.contract == LIST:
            for slot in range(self.n_layers):
                lane = region(None, slot, total)
                start = 0
                for rid, n in self.plan:
                    self.dst[(rid, slot)] = lane[start:start + n]
                    start += n
        else:
            for rid, n in self.plan:
                for slot in range(self.n_layers):
                    self.dst[(rid, slot)] = region(rid, slot, n)
        if self.board is not None:
            self._publish_layout(row_bytes)
        if first:
            self.exporter.grow_first(int(total * row_bytes * self.n_layers * FIRST_CALL_AHEAD))

    def _publish_layout(self, row_bytes: int) -> None:
        src, start = [], 0
        for rid, n in self.plan:
            if self.contract == LIST:
                per = [self.places[(None, s)] for s in range(self.n_layers)]
                src.append([(sid, off + start * row_bytes) for sid, off, _, _ in per])
            else:
                src.append([self.places[(rid, s)][:2] for s in range(self.n_layers)])
            start += n
        segments = {sid: (self.exporter.segments[sid].fd, self.exporter.segments[sid].size)
                    for sid in self.used}
        self.board.publish_layout(self.n_layers, row_bytes, self.contract == LIST, src,
                                  segments)

    def _track(self, slot: int, entries) -> list[tuple[int, int]] | None:
        """Follow one layer's write of a step for the board: the (request, rows) that
        land with this step once its last layer is written, else ``None``. Marks the
        board dead where rows would be written again (a recomputed prompt) or a layer's
        rows differ from the step's first layer's."""
        board = self.board
        if board is None or board.dead:
            return None
        step = [(self._index.get(rid, -1), pos, rows.shape[0]) for rid, pos, rows in entries]
        if slot == 0:
            if any(i < 0 or pos < self._written[i] for i, pos, _ in step):
                board.kill()
                return None
            self._step = step
        elif step != self._step:
            board.kill()
            return None
        if slot != self.n_layers - 1:
            return None
        self._step = None
        ends = [(i, pos + n) for i, pos, n in step]
        for i, end in ends:
            self._written[i] = end
        return ends

    def write(self, slot: int, entries) -> None:
        """``entries``: (request id, prompt position, rows) of one layer in one step."""
        if not self.ok:
            return
        t0 = time.perf_counter()
        try:
            if self.dst is None:
                self._allocate(entries[0][2])
            pairs = []
            for rid, pos, rows in entries:
                dst = self.dst.get((rid, slot))
                if dst is None or pos + rows.shape[0] > dst.shape[0]:
                    self._off()
                    return
                pairs.append((dst[pos:pos + rows.shape[0]], rows))
        except (OSError, MemoryError):
            self._off()
            return
        ends = self._track(slot, entries)
        if pairs and pairs[0][1].is_cuda:
            import torch

            self._cuda = True
            stream = self.exporter.side_stream()
            ready = torch.cuda.Event()
            ready.record()
            with torch.cuda.stream(stream):
                stream.wait_event(ready)
                for dst, rows in pairs:
                    dst.copy_(rows, non_blocking=True)
                if ends:
                    landed = torch.cuda.Event(blocking=True)
                    landed.record(stream)
                    self._lander.after(landed, ends)
        else:
            for dst, rows in pairs:
                dst.copy_(rows)
            if ends:
                self.board.landed(ends, self.board.token)
        self.exporter.stats["write_s"] += time.perf_counter() - t0

    def _off(self) -> None:
        """Streaming is off for this call: the regular export runs at its end."""
        self.ok = False
        if self.board is not None:
            self.board.kill()

    def wait(self) -> None:
        """The side stream's copies are done and every landed step is published (before
        the rows are freed, described, or the board serves another call)."""
        if self._cuda:
            t0 = time.perf_counter()
            self.exporter.side_stream().synchronize()
            self.exporter.stats["wait_s"] += time.perf_counter() - t0
        if self._lander is not None:
            self._lander.close()

    def describe(self, order: list[str], lengths: dict[str, int]) -> dict | None:
        """The descriptor of the streamed rows when they are exactly what the capture
        holds (``order``: the requests in input order, ``lengths``: their prompt
        lengths); ``None`` when the regular export must run instead."""
        self.wait()
        self.exporter.settle_first()
        planned = [r for r, _ in self.plan]
        if not self.ok or self.dst is None or planned != order or any(
                lengths.get(r) != n for r, n in self.plan):
            if self.board is not None:
                self.board.kill()
            return None
        keys = [None] if self.contract == LIST else order
        items = []
        for key in keys:
            for slot in range(self.n_layers):
                sid, off, shape, dtype = self.places[(key, slot)]
                items.append((key, slot, sid, off, shape, dtype, 0, shape[0]))
        self.exporter.stats["streamed"] += 1
        reply = self.exporter.lease_reply(self.used, items, self.contract)
        if self.board is not None and not self.board.dead:
            reply["board"] = self.board.token  # the driver's early copies are this call's
        return reply


def _rows_bytes(reply: dict) -> int:
    """Bytes of the rows a reply describes."""
    return sum(_handoff.nbytes(shape, dtype) for _key, _slot, sid, _off, shape, dtype, _s, _t
               in reply["items"] if sid is not None)


def _segments_come_back(held: int, call: int, pool: int) -> bool:
    """Will a call's segments (``call`` bytes) come back if its results keep them leased,
    given ``held`` bytes of segments earlier results still lease and the ``pool`` size?

    Only where earlier results hold at most about one call's worth (``1.5 x``): the
    pattern of speculators' offline script, which saves each batch and drops it when the
    next call returns, so the pool settles at a few calls' worth and is reused; and where
    what they hold plus twice this call fits in the pool (room for the next call). A
    caller that keeps every result would otherwise make each call need fresh segments,
    made and pinned in the worker beside the forward: on the H200 that slowed every call
    more than a copy costs (batch 32, results held: 0.78x of vLLM's prefill)."""
    return 2 * held <= 3 * call and held + 2 * call <= pool


def _early_nbytes(shape, dtype_name: str) -> int:
    import torch

    return _handoff.nbytes(shape, getattr(torch, dtype_name.removeprefix("torch.")))


def rpc_reply(states: Any, reason: str) -> dict:
    """A transport reply that carries the states the old way (pickled by vLLM)."""
    return {MARKER: 1, "fallback": reason, "states": states}


def is_reply(obj: Any) -> bool:
    return isinstance(obj, dict) and obj.get(MARKER) == 1


class ShmImporter:
    """Driver side: maps the worker's segments and rebuilds the contract object.

    ``handoff``: return :class:`speculators_compat._handoff.HandoffTensor` instances, whose
    ``clone()`` takes the memory over (zero copy; see the module's "Zero copy")."""

    def __init__(self, handoff: bool = False, copy_threads: int | None = None) -> None:
        self._maps: dict[tuple[int, int], tuple[mmap.mmap, int]] = {}
        self._released: set[int] = set()
        self._held: dict[int, int] = {}  # leased segments the driver still views: size
        # Reentrant: a release runs in a finalizer, wherever the last view died.
        self._lock = threading.RLock()
        self.handoff = handoff
        self.fallback_reason: str | None = None
        #: Threads of the transport's own copies into driver memory (``copy_ahead``).
        self.copy_threads = max(1, copy_threads or min(16, os.cpu_count() or 1))
        self._copier = None
        #: Bytes per prompt token of the last call (all captured layers), its pool size and
        #: this call's prompt tokens (:meth:`prepare_call`): the size of the next call.
        self._token_bytes = 0
        self._pool = 0
        self._call_tokens = 0
        #: Driver-side timers (cumulative): the export RPCs and mapping (``fetch_s``), the
        #: rest of ``generate()`` after the states arrived (``after_fetch_s``: speculators'
        #: copies where it still copies), the threads that rest ran with (``copy_threads``;
        #: 0: not raised). With ``handoff``: calls whose segments speculators' clone took
        #: over (``handed_over``), calls the transport copied into the driver's own memory
        #: instead (``copied_ahead``: earlier results held too much of the pool, or a batch
        #: larger than it; speculators' clone then takes that memory over) and the time of
        #: those copies (``copy_s``; for pieces with their RPCs) and their threads
        #: (``copy_pool_threads``); ``fresh_*``: the memory
        #: made for them while the model ran (:mod:`speculators_compat._fresh`).
        self.stats = {"fetch_s": 0.0, "after_fetch_s": 0.0, "copy_threads": 0,
                      "handed_over": 0, "copied_ahead": 0, "copy_s": 0.0,
                      "trimmed_bytes": 0, "copy_pool_threads": self.copy_threads}
        #: Segment bytes of the last call (what :meth:`_trim` keeps mapped).
        self._call_segment_bytes = 0
        self._fresh = _fresh.FreshMemory(stats=self.stats) if handoff else None
        #: Early copy (:mod:`speculators_compat._early`): rows copied while the model runs
        #: (``early_bytes``), calls whose early copies were used (``early_calls``) or
        #: dropped (``early_dropped``: the call was handed over, fell back, or its board
        #: was marked dead).
        self.stats.update(early_bytes=0, early_calls=0, early_dropped=0)
        self._copy_expected = False  # prepare_call made memory ahead: a copy is coming
        self._early: _early.EarlyCopy | None = None
        self._boards: dict[tuple[int, int], Any] = {}
        self._token = int.from_bytes(os.urandom(6), "little")

    def prepare_call(self, tokens: int) -> None:
        """A call with ``tokens`` prompt tokens starts. Where its states will be copied
        into driver memory (earlier results hold the pool), have that memory made while
        the model runs (:mod:`speculators_compat._fresh`)."""
        self._call_tokens = max(int(tokens), 0)
        self._copy_expected = False
        if self._fresh is None or not self._token_bytes or not self._call_tokens:
            return
        size = self._call_tokens * self._token_bytes
        with self._lock:
            held = sum(self._held.values())
        if not _segments_come_back(held, size, self._pool):
            self._fresh.prepare(size + (64 << 10))  # + room for each piece's alignment
            self._copy_expected = True

    def next_token(self) -> int | None:
        """The token of the call that starts (passed with the reset), or ``None`` where
        this call will not be copied (nothing to copy early)."""
        self._drop_early()
        if not self._copy_expected or not _early.ENABLED:
            return None
        self._token = (self._token + 1) & ((1 << 62) - 1)
        return self._token

    def begin_call(self, replies: Any, plan) -> None:
        """The reset's replies are in: where the capturing worker keeps a board, start
        the thread that copies this call's rows while the model runs."""
        self._drop_early()
        if not self._copy_expected:
            return
        board = next((r["board"] for r in (replies if isinstance(replies, list) else [replies])
                      if is_reply(r) and isinstance(r.get("board"), dict)), None)
        if board is None:
            return
        try:
            words = self._board(board)
        except OSError:
            return
        self._early = _early.EarlyCopy(
            words, self._token, plan,
            segment=lambda sid, fd, size: self._segment(board["pid"], sid, fd, size),
            owned=self._owned_bytes).start()

    def _board(self, board: dict):
        import numpy as np

        key = (int(board["pid"]), int(board["fd"]))
        words = self._boards.get(key)
        if words is None or words.nbytes != board["bytes"]:
            local = os.open(f"/proc/{key[0]}/fd/{key[1]}", os.O_RDWR)
            try:
                mm = mmap.mmap(local, int(board["bytes"]))
            finally:
                os.close(local)
            words = self._boards[key] = np.frombuffer(mm, dtype=np.int64)
        return words

    def _segment(self, pid: int, sid: int, fd: int, size: int):
        import numpy as np

        return np.frombuffer(self._map(pid, sid, fd, size), dtype=np.uint8)

    def _owned_bytes(self, nbytes: int):
        piece = self._fresh.take(nbytes) if self._fresh else None
        if piece is None:
            import numpy as np

            piece = np.empty(nbytes, dtype=np.uint8)
        return piece

    def abandon_call(self) -> None:
        """The call in flight failed or was interrupted: stop its early copy now (its
        rows will never be used; the thread would otherwise poll the board and hold a
        call's worth of driver memory until the next call starts) and forget what
        :meth:`prepare_call` predicted. Local only: no RPC, so safe after Ctrl+C."""
        self._drop_early()
        self._copy_expected = False
        self._call_tokens = 0

    def _drop_early(self, early: _early.EarlyCopy | None = None) -> None:
        """Stop an early copy whose rows will not be used."""
        early = early or self._early
        if early is self._early:
            self._early = None
        if early is not None:
            early.stop()
            self.stats["early_dropped"] += 1

    def take_released(self) -> list[int]:
        with self._lock:
            out = sorted(self._released)
            self._released.clear()
        return out

    def _release(self, sid: int) -> None:
        with self._lock:
            self._released.add(sid)
            idle = self._held.pop(sid, None) is not None and not self._held
        if idle:
            self._trim()

    def _trim(self) -> None:
        """The last results handed over are gone: drop the driver's page mappings of the
        segments the next call will not use, keeping the lowest-numbered ones that hold
        a call of the last call's size (the worker fills free segments lowest first).

        Why: pages of the pool the driver once read stay in its page tables, and count in
        its RSS (as shared memory) until unmapped: after a caller released a pass of kept
        results, about the whole pool (4.25 GiB on the H200 benchmark) stayed counted
        beside the next pass's results (peak 10.5 GiB against 9.1 GiB before; 9.1 GiB
        with this, the peak now being the pass that keeps its results). How:
        ``MADV_DONTNEED`` on the driver's mapping of a memfd only drops the page-table
        entries: the memory and its contents stay in the worker's segment, and a later
        read maps them again (a minor fault). Only when nothing handed over is left
        (a caller that keeps the last call's results while the next runs, as
        speculators' offline script does, never gets here), so no call pays refaults."""
        with self._lock:
            if self._held:
                return
            maps = sorted(self._maps.items(), key=lambda kv: kv[0][1])
            keep = self._call_segment_bytes
        for (_pid, _sid), (mm, size) in maps:
            if keep > 0:
                keep -= size
                continue
            try:
                mm.madvise(mmap.MADV_DONTNEED)
            except (ValueError, OSError):  # closed meanwhile, or no madvise here
                continue
            self.stats["trimmed_bytes"] += size

    def _map(self, pid: int, sid: int, fd: int, size: int) -> mmap.mmap:
        key = (pid, sid)
        with self._lock:  # the early copy's thread maps segments too
            cached = self._maps.get(key)
            if cached is not None and cached[1] == size:
                return cached[0]
            local = os.open(f"/proc/{pid}/fd/{fd}", os.O_RDWR)
            try:
                mm = mmap.mmap(local, size)
            finally:
                os.close(local)
            self._maps[key] = (mm, size)
            return mm

    def fetch(self, call) -> Any:
        """``call(released_sids, more)`` performs the worker RPC; returns the contract
        object (CPU tensors), or ``None`` if the worker captured nothing."""
        early, self._early = self._early, None
        try:
            reply = call(self.take_released(), False)
        except BaseException:
            self._drop_early(early)
            raise
        if reply is None or "fallback" in reply or not reply["whole"]:
            self._drop_early(early)
            early = None
        if reply is None:
            return None
        if "fallback" in reply:
            if reply["fallback"] and self.fallback_reason is None:
                self.fallback_reason = reply["fallback"]
                logger.warning("speculators-compat: hidden states travel pickled through "
                               "collective_rpc (slower): %s", reply["fallback"])
            return reply["states"]
        self._pool = int(reply.get("pool") or 0)
        if reply["whole"]:
            self._learn(_rows_bytes(reply))
            return self._views(reply, early)
        owned: dict = {}
        regions: dict = {}
        total = 0
        t0 = time.perf_counter()
        while True:
            total += _rows_bytes(reply)
            self._copy_into(reply, owned, regions)
            if not reply["more"]:
                break
            reply = call(self.take_released(), True)
        self._learn(total)
        if self.handoff:  # memory of the driver's own: nothing else will write it
            owned = {key: {slot: _handoff.hand_over(regions[(key, slot)], t.dtype, t.shape)
                           for slot, t in slots.items()} for key, slots in owned.items()}
            self.stats["copied_ahead"] += 1
            self.stats["copy_s"] += time.perf_counter() - t0
        return self._assemble(reply["contract"], owned)

    def _learn(self, rows_bytes: int) -> None:
        if self._call_tokens and rows_bytes:
            self._token_bytes = -(-rows_bytes // self._call_tokens)
        self._call_tokens = 0

    def _arrays(self, reply: dict):
        import numpy as np

        for sid in reply.get("closed", ()):
            self._maps.pop((reply["pid"], int(sid)), None)  # unmapped when unreferenced
        arrays = {}
        self._call_segment_bytes = sum(int(size) for _fd, size in reply["segments"].values())
        for sid, (fd, size) in reply["segments"].items():
            mm = self._map(reply["pid"], int(sid), fd, size)
            arr = np.frombuffer(mm, dtype=np.uint8)
            arrays[int(sid)] = arr
        return arrays

    @staticmethod
    def _tensor(arrays, sid, off, shape, dtype_name, make=_handoff.plain):
        import torch

        dtype = getattr(torch, dtype_name.removeprefix("torch."))
        if sid is None:
            return torch.empty(shape, dtype=dtype)
        return make(arrays[sid][off:off + _handoff.nbytes(shape, dtype)], dtype, shape)

    def _hand_over_now(self, reply: dict) -> bool:
        """Hand this call's segments over? Results then keep whole segments leased, so
        only where the segments will come back for later calls: the call's rows fill at
        least half of its segments (else results would hold far more memory than they
        are), and :func:`_segments_come_back`. Otherwise the transport copies the call
        into driver memory (:meth:`_copy_ahead`) and the segments come back at once."""
        if not self.handoff:
            return False
        sizes = {int(sid): int(size) for sid, (_fd, size) in reply["segments"].items()}
        with self._lock:
            held_before = sum(v for k, v in self._held.items() if k not in sizes)
        call = sum(sizes.values())
        over = 2 * _rows_bytes(reply) >= call and _segments_come_back(
            held_before, call, int(reply.get("pool") or 0))
        if over:
            with self._lock:
                self._held.update(sizes)
        return over

    def _views(self, reply: dict, early: _early.EarlyCopy | None = None) -> Any:
        arrays = self._arrays(reply)
        if self.handoff and not self._hand_over_now(reply):
            return self._copy_ahead(reply, arrays, early)
        self._drop_early(early)
        if self.handoff:
            self.stats["handed_over"] += 1
        make = _handoff.hand_over if self.handoff else _handoff.plain
        for sid, arr in arrays.items():
            weakref.finalize(arr, self._release, sid)
        result: dict = {}
        for key, slot, sid, off, shape, dtype, _start, _total in reply["items"]:
            result.setdefault(key, {})[slot] = self._tensor(arrays, sid, off, shape, dtype,
                                                            make)
        del arrays
        return self._assemble(reply["contract"], result)

    def _copy_ahead(self, reply: dict, arrays: dict,
                    early: _early.EarlyCopy | None = None) -> Any:
        """Copy a call into driver memory on :attr:`copy_threads` threads, release its
        segments at once, and hand speculators that memory (its clone takes it over).
        Rows an ``early`` copy already took while the model ran are not copied again.

        Why: where earlier results hold the pool, handing this call's segments over
        would make the worker make and pin fresh ones beside every forward (on the H200
        that slowed each call more than a copy costs); speculators' own clone would copy
        on the driver's intra-op threads into pages first touched by the copy. Here the
        pages were made while the model ran (:meth:`prepare_call`), so this is the copy
        alone."""
        import torch

        t0 = time.perf_counter()
        pairs, result = [], {}
        try:
            done = None
            if early is not None:
                done = early.finish(reply, arrays, _early_nbytes)
                self.stats["early_calls" if done else "early_dropped"] += 1
                if done:
                    self.stats["early_bytes"] += early.copied
            for key, slot, sid, off, shape, dtype_name, _start, _total in reply["items"]:
                dtype = getattr(torch, dtype_name.removeprefix("torch."))
                if sid is None:
                    result.setdefault(key, {})[slot] = torch.empty(shape, dtype=dtype)
                    continue
                if done:
                    dst = done[0][(key, slot)]
                else:
                    dst = self._owned(shape, dtype)
                    pairs.append((arrays[sid][off:off + dst.nbytes], dst))
                result.setdefault(key, {})[slot] = _handoff.hand_over(dst, dtype, shape)
            if done:
                pairs = done[1]  # the rows the early copy had not reached: (src, dst)
            self._copy(pairs)
        finally:  # nothing refers to the segments now, even if the copy failed
            for sid in arrays:
                self._release(sid)
            del arrays, pairs
        self.stats["copied_ahead"] += 1
        self.stats["copy_s"] += time.perf_counter() - t0
        return self._assemble(reply["contract"], result)

    def _owned(self, shape, dtype):
        """Driver memory for a copied tensor (a uint8 array of exactly its bytes): a piece
        of the memory made ahead where there is one, else ordinary memory."""
        piece = self._fresh.take(_handoff.nbytes(shape, dtype)) if self._fresh else None
        return piece if piece is not None else _handoff.owned_empty(shape, dtype)

    def _copy(self, pairs: list) -> None:
        """``numpy.copyto(dst, src)`` for every pair, in pieces on the copy threads
        (numpy releases the GIL while it copies)."""
        import numpy as np

        piece = 8 << 20
        jobs = [(dst[lo:lo + piece], src[lo:lo + piece]) for src, dst in pairs
                for lo in range(0, src.nbytes, piece)]
        if self.copy_threads <= 1 or sum(src.nbytes for src, _ in pairs) < 4 * piece:
            for dst, src in jobs:
                np.copyto(dst, src)
            return
        if self._copier is None:
            from concurrent.futures import ThreadPoolExecutor

            self._copier = ThreadPoolExecutor(self.copy_threads,
                                              thread_name_prefix="speculators-compat-copy")
        list(self._copier.map(lambda job: np.copyto(*job), jobs))

    def _copy_into(self, reply: dict, owned: dict, regions: dict) -> None:
        arrays = self._arrays(reply)
        try:
            for key, slot, sid, off, shape, dtype, start, total in reply["items"]:
                part = self._tensor(arrays, sid, off, shape, dtype)
                slots = owned.setdefault(key, {})
                if slot not in slots:
                    full = (total, *shape[1:])
                    region = regions[(key, slot)] = self._owned(full, part.dtype)
                    slots[slot] = _handoff.plain(region, part.dtype, full)
                slots[slot][start:start + shape[0]].copy_(part)
        finally:  # the pieces were copied (or the call failed): the segments go back
            for sid in arrays:
                self._release(sid)

    @staticmethod
    def _assemble(contract: str, by_key: dict) -> Any:
        def layers(slots: dict) -> list:
            if sorted(slots) != list(range(len(slots))):
                raise RuntimeError(f"speculators-compat transport: layer slots {sorted(slots)}")
            return [slots[i] for i in range(len(slots))]

        if contract == LIST:
            return layers(by_key.get(None, {}))
        return {rid: layers(slots) for rid, slots in by_key.items()}

    def close(self) -> None:
        self._drop_early()
        if self._copier is not None:
            self._copier.shutdown(wait=True)
            self._copier = None
        if self._fresh is not None:
            self._fresh.drop()
        for mm, _ in self._maps.values():
            try:
                mm.close()
            except BufferError:
                pass
        self._maps.clear()
