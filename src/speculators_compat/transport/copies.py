"""Worker side: captured rows from the GPU into a call's region while the model runs.

Why not straight into the region: a device-to-host copy runs at full bus speed only into
page-locked memory, and locking each call's fresh region (``cudaHostRegister``) cost
about 0.45 s per GiB on an H200 host, more than the copy. So rows go first into one
pinned staging ring (:class:`Staging`: locked once per worker, reused by every call) on a
side stream that overlaps the forward, and copy threads move them from there into the
region (numpy releases the GIL), also beside the forward.

Why a ring of our own rather than a pinned tensor per batch of rows: a first version that
took one from PyTorch's caching host allocator for every layer and step spent about
0.45 s per GiB of rows inside the layer hooks on the H200 (2026-12-03,
``gpu_transport_check.py``; the cause was not isolated). The ring is allocated once and
involves no allocator; a hook only waits when the copy threads are a whole ring behind.

Bounded: the ring holds at most ``SPECULATORS_COMPAT_TRANSPORT_BYTES`` of rows in flight
(default 512 MiB); a hook that finds it full waits for the copy threads (the forward then
slows, memory does not grow). On CPU builds there is no staging: rows are copied into
the region in the step.
"""

from __future__ import annotations

import os
import threading
import time
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

#: Threads of the worker's copies from staging into the region (each moves pieces of at
#: most :data:`PIECE` bytes), and the environment variable that sets them.
COPY_THREADS_ENV = "SPECULATORS_COMPAT_COPY_THREADS"
DEFAULT_THREADS = 4
PIECE = 16 << 20
#: Bytes of the pinned staging ring (rows in flight), and the variable that sets it.
STAGING_BYTES_ENV = "SPECULATORS_COMPAT_TRANSPORT_BYTES"
DEFAULT_STAGING_BYTES = 512 << 20
ALIGN = 512


def copy_threads() -> int:
    """``SPECULATORS_COMPAT_COPY_THREADS`` or :data:`DEFAULT_THREADS`, at most the CPUs."""
    try:
        wanted = int(os.environ.get(COPY_THREADS_ENV, DEFAULT_THREADS))
    except ValueError:
        wanted = DEFAULT_THREADS
    return max(1, min(wanted, os.cpu_count() or 1))


def staging_bytes() -> int:
    try:
        return max(int(os.environ.get(STAGING_BYTES_ENV, DEFAULT_STAGING_BYTES)), 4 << 20)
    except ValueError:
        return DEFAULT_STAGING_BYTES


def bytes_of(t) -> Any:
    """A flat uint8 numpy view of a contiguous CPU tensor's bytes."""
    import torch

    return t.reshape(-1).view(torch.uint8).numpy()


class Staging:
    """A ring of pinned memory: spans are reserved in order and freed in any order; the
    space of a span comes back once it and every span reserved before it are free."""

    def __init__(self, nbytes: int, buf: Any = None) -> None:
        import torch

        self.size = nbytes
        self.buf = (buf if buf is not None else
                    torch.empty(nbytes, dtype=torch.uint8, pin_memory=True))
        self._cv = threading.Condition()
        self._spans: deque = deque()  # [start, end, freed] in reservation order
        self._head = 0  # next free byte
        self.wait_s = 0.0

    def _room(self, n: int) -> int | None:
        """Start of ``n`` free bytes at the head (wrapping to 0), or ``None``."""
        if not self._spans:
            self._head = 0
            return 0 if n <= self.size else None
        tail = self._spans[0][0]
        if self._head > tail:  # live spans in one piece: free [head, size) and [0, tail)
            if self.size - self._head >= n:
                return self._head
            return 0 if tail >= n else None
        if self._head < tail:  # wrapped: free [head, tail)
            return self._head if tail - self._head >= n else None
        return None  # head met tail: full

    def reserve(self, n: int) -> list:
        """A span of ``n`` bytes (``n`` at most the ring's size); waits for room."""
        n = -(-n // ALIGN) * ALIGN
        with self._cv:
            start = self._room(n)
            if start is None:
                t0 = time.perf_counter()
                while start is None:
                    self._cv.wait()
                    start = self._room(n)
                self.wait_s += time.perf_counter() - t0
            span = [start, start + n, False]
            self._spans.append(span)
            self._head = start + n
            return span

    def free(self, span: list) -> None:
        with self._cv:
            span[2] = True
            while self._spans and self._spans[0][2]:
                self._spans.popleft()
            self._cv.notify_all()


class RowCopier:
    """Copies (region view, rows) pairs: on CUDA through staging on threads, else at once."""

    def __init__(self, threads: int | None = None, staging: int | None = None) -> None:
        self.threads = threads or copy_threads()
        self.staging_size = staging or staging_bytes()
        self._staging: Staging | None = None
        self._pool: ThreadPoolExecutor | None = None
        self._stream = None
        self._futures: list[Future] = []
        #: ``staged``: bytes through staging; ``staging_wait_s``: hooks waiting for room in
        #: the ring; ``hook_s``: time the hooks spent queueing copies; ``tail_s``: time
        #: :meth:`wait` waited for copies after the last step.
        self.stats = {"staged": 0, "staging_wait_s": 0.0, "hook_s": 0.0, "tail_s": 0.0,
                      "enqueue_s": 0.0, "submit_s": 0.0}

    def copy(self, pairs: list[tuple[Any, Any]]) -> None:
        """``pairs``: (destination: a uint8 numpy view of the region, rows: a tensor of the
        same bytes). CPU rows are copied now; CUDA rows are queued (see module)."""
        if not pairs:
            return
        if not pairs[0][1].is_cuda:
            import numpy as np

            for dst, rows in pairs:
                np.copyto(dst, bytes_of(rows.contiguous()))
            return
        self._copy_cuda(pairs)

    def _copy_cuda(self, pairs) -> None:
        import torch

        t0 = time.perf_counter()
        if self._staging is None:
            self._staging = Staging(self.staging_size)
        if self._pool is None:
            self._pool = ThreadPoolExecutor(self.threads,
                                            thread_name_prefix="speculators-compat-copy")
        staging = self._staging
        stream = self._side_stream()
        ready = torch.cuda.Event()
        ready.record()
        limit = max(staging.size // 4, ALIGN)
        waited = staging.wait_s
        with torch.cuda.stream(stream):
            stream.wait_event(ready)
            for dst, rows in pairs:
                flat = rows.reshape(-1).view(torch.uint8)
                for lo in range(0, dst.nbytes, limit):
                    hi = min(lo + limit, dst.nbytes)
                    span = staging.reserve(hi - lo)
                    t1 = time.perf_counter()
                    host = staging.buf[span[0]:span[0] + (hi - lo)]
                    host.copy_(flat[lo:hi], non_blocking=True)
                    done = torch.cuda.Event(blocking=True)  # waiting threads sleep
                    done.record(stream)
                    t2 = time.perf_counter()
                    self._queue(done, dst[lo:hi], host.numpy(), span)
                    self.stats["enqueue_s"] += t2 - t1
                    self.stats["submit_s"] += time.perf_counter() - t2
                rows.record_stream(stream)  # its memory is not reused before the copy ran
                self.stats["staged"] += dst.nbytes
        self.stats["staging_wait_s"] += staging.wait_s - waited
        self.stats["hook_s"] += time.perf_counter() - t0

    def _queue(self, done, dst, src, span) -> None:
        """Copy ``src`` (staging) to ``dst`` (region) once ``done`` fired, in pieces on the
        threads; the span goes back to the ring with the last piece."""
        pieces = [(lo, min(lo + PIECE, dst.nbytes)) for lo in range(0, dst.nbytes, PIECE)]
        left = [len(pieces)]
        lock = threading.Lock()

        def piece(lo: int, hi: int) -> None:
            import numpy as np

            try:
                done.synchronize()
                np.copyto(dst[lo:hi], src[lo:hi])
            finally:
                with lock:
                    left[0] -= 1
                    last = left[0] == 0
                if last:
                    self._staging.free(span)

        for lo, hi in pieces:
            self._futures.append(self._pool.submit(piece, lo, hi))

    def _side_stream(self):
        if self._stream is None:
            import torch

            self._stream = torch.cuda.Stream()
        return self._stream

    def wait(self) -> None:
        """Every queued copy is done (raises the first copy's error, if any)."""
        futures, self._futures = self._futures, []
        if not futures:
            return
        t0 = time.perf_counter()
        error = None
        for f in futures:
            try:
                f.result()
            except BaseException as exc:  # noqa: BLE001 - every copy must finish first
                error = error or exc
        self.stats["tail_s"] += time.perf_counter() - t0
        if error is not None:
            raise error

    def close(self) -> None:
        try:
            self.wait()
        except Exception:  # noqa: BLE001 - closing: the call is gone
            pass
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None
        self._staging = None
