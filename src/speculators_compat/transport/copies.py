"""Worker side: captured rows from the GPU into a call's region while the model runs.

Why not straight into the region: a device-to-host copy runs at full bus speed only into
page-locked memory, and locking each call's fresh region (``cudaHostRegister``) cost
about 0.45 s per GiB on an H200 host, more than the copy. So each batch of rows goes
first into pinned staging memory (PyTorch's caching host allocator: locked once, reused
by later calls) on a side stream that overlaps the forward, and copy threads move it
from there into the region (numpy releases the GIL), also beside the forward.

Bounded: at most ``max_inflight`` bytes of rows wait in staging; a layer hook that
would go past it waits for the copy threads (the forward then slows, memory does not
grow). On CPU builds there is no staging: rows are copied into the region in the step.
"""

from __future__ import annotations

import os
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

#: Threads of the worker's copies from staging into the region (each moves pieces of at
#: most :data:`PIECE` bytes), and the environment variable that sets them.
COPY_THREADS_ENV = "SPECULATORS_COMPAT_COPY_THREADS"
DEFAULT_THREADS = 4
PIECE = 16 << 20
#: Most bytes of rows waiting in pinned staging, and the variable that sets it.
STAGING_BYTES_ENV = "SPECULATORS_COMPAT_TRANSPORT_BYTES"
DEFAULT_STAGING_BYTES = 1 << 30


def copy_threads() -> int:
    """``SPECULATORS_COMPAT_COPY_THREADS`` or :data:`DEFAULT_THREADS`, at most the CPUs."""
    try:
        wanted = int(os.environ.get(COPY_THREADS_ENV, DEFAULT_THREADS))
    except ValueError:
        wanted = DEFAULT_THREADS
    return max(1, min(wanted, os.cpu_count() or 1))


def staging_bytes() -> int:
    try:
        return max(int(os.environ.get(STAGING_BYTES_ENV, DEFAULT_STAGING_BYTES)), 1 << 20)
    except ValueError:
        return DEFAULT_STAGING_BYTES


def bytes_of(t) -> Any:
    """A flat uint8 numpy view of a contiguous CPU tensor's bytes."""
    import torch

    return t.reshape(-1).view(torch.uint8).numpy()


class RowCopier:
    """Copies (region view, rows) pairs: on CUDA through staging on threads, else at once."""

    def __init__(self, threads: int | None = None, max_inflight: int | None = None) -> None:
        self.threads = threads or copy_threads()
        self.max_inflight = max_inflight or staging_bytes()
        self._pool: ThreadPoolExecutor | None = None
        self._stream = None
        self._cv = threading.Condition()
        self._inflight = 0
        self._futures: list[Future] = []
        #: ``staged``: bytes through staging; ``inflight_wait_s``: hooks waiting for room;
        #: ``tail_s``: time :meth:`wait` waited for copies after the last step.
        self.stats = {"staged": 0, "inflight_wait_s": 0.0, "tail_s": 0.0}

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

        nbytes = sum(dst.nbytes for dst, _ in pairs)
        self._reserve(nbytes)
        stream = self._side_stream()
        ready = torch.cuda.Event()
        ready.record()
        staged = []
        with torch.cuda.stream(stream):
            stream.wait_event(ready)
            for dst, rows in pairs:
                host = torch.empty(rows.shape, dtype=rows.dtype, pin_memory=True)
                host.copy_(rows, non_blocking=True)
                rows.record_stream(stream)  # its memory is not reused before the copy ran
                staged.append((dst, host))
            done = torch.cuda.Event(blocking=True)  # waiting threads sleep, not spin
            done.record(stream)
        self.stats["staged"] += nbytes
        if self._pool is None:
            self._pool = ThreadPoolExecutor(self.threads,
                                            thread_name_prefix="speculators-compat-copy")
        for dst, host in staged:
            src = bytes_of(host)
            for lo in range(0, dst.nbytes, PIECE):
                hi = min(lo + PIECE, dst.nbytes)
                self._futures.append(self._pool.submit(self._piece, done, dst[lo:hi],
                                                       src[lo:hi], host))

    def _piece(self, done, dst, src, host) -> None:
        import numpy as np

        try:
            done.synchronize()
            np.copyto(dst, src)
        finally:
            del host  # the staging block returns to PyTorch's cache with its last piece
            self._release(dst.nbytes)

    def _reserve(self, nbytes: int) -> None:
        with self._cv:
            if self._inflight and self._inflight + nbytes > self.max_inflight:
                t0 = time.perf_counter()
                while self._inflight and self._inflight + nbytes > self.max_inflight:
                    self._cv.wait()
                self.stats["inflight_wait_s"] += time.perf_counter() - t0
            self._inflight += nbytes

    def _release(self, nbytes: int) -> None:
        with self._cv:
            self._inflight -= nbytes
            self._cv.notify_all()

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
