"""One call's memory: a memfd the worker fills and the driver then maps privately.

Lifetime, in one sentence: each ``generate()`` call gets a region of exactly its states'
bytes; the worker writes it and keeps it only until the driver has mapped it; the
driver's mapping is the tensors' storage, so the memory lives exactly as long as the
results that use it, and nothing is reused, leased or tracked across calls.

Why a memfd: it has no name in ``/dev/shm`` and no size limit there (Docker's 64 MB
default), and it goes away with the last mapping, however the processes end.

Why the driver maps it ``MAP_PRIVATE`` (:func:`map_private`): the worker has finished
writing when the driver maps it, so a private mapping reads exactly the worker's bytes
(the pages are shared with the file, no copy), while any later write is copy-on-write:
an in-place change of a result changes that process's copy only, also across
``fork()`` (a ``DataLoader`` or ``multiprocessing`` worker that modifies a sample in
place leaves the parent's results untouched), as with ordinary private memory.

Population: the first write to each page of a fresh memfd costs a page fault that
allocates and zeroes the page; on the GPU's side those faults would land in the copies
after the last model step. :meth:`Region.populate` faults the region in ahead, on a
background thread, while the model runs (``MADV_POPULATE_WRITE``, which never changes the
contents, so it may race with the copies; where the kernel lacks it, ``fallocate``, which
allocates without mapping). Both are called so that the thread lets go of the GIL:
``mmap.madvise`` holds it for the whole call, and on the H200 that stalled the worker's
forward (which launches kernels from Python) by about 0.4 s per GiB populated
(2026-12-03); ``madvise`` goes through ``ctypes``, which releases it.
"""

from __future__ import annotations

import mmap
import os
import threading
import time
from typing import Any

#: ``MADV_POPULATE_WRITE`` (Linux 5.14); Python's ``mmap`` names it only from 3.13.
MADV_POPULATE_WRITE = getattr(mmap, "MADV_POPULATE_WRITE", 23)
MADV_DONTNEED = getattr(mmap, "MADV_DONTNEED", 4)
#: Bytes populated per ``madvise`` call (the copies of a step can start meanwhile).
POPULATE_SPAN = 32 << 20
#: Fault the region in ahead (a measurement switch of the GPU benchmark, not a setting).
POPULATE = True


class Region:
    """Worker side: a memfd of ``nbytes`` mapped shared for writing (see module)."""

    def __init__(self, nbytes: int) -> None:
        self.size = max(int(nbytes), mmap.PAGESIZE)
        self.fd = os.memfd_create("speculators-compat", os.MFD_CLOEXEC)
        try:
            os.ftruncate(self.fd, self.size)
            self.mm = mmap.mmap(self.fd, self.size)
        except BaseException:
            os.close(self.fd)
            raise
        self._populator: threading.Thread | None = None
        self._stop = False
        self.populate_s = 0.0

    def array(self):
        """A uint8 numpy array over the whole region (what views are cut from)."""
        import numpy as np

        return np.frombuffer(self.mm, dtype=np.uint8)

    def populate(self) -> None:
        """Fault every page in on a background thread (see module); returns at once."""
        if not POPULATE or self._populator is not None:
            return
        self._populator = threading.Thread(target=self._populate, daemon=True,
                                           name="speculators-compat-populate")
        self._populator.start()

    def _populate(self) -> None:
        t0 = time.perf_counter()
        madvise = _madvise()
        try:
            base = self.array().ctypes.data
            for start in range(0, self.size, POPULATE_SPAN):
                if self._stop:
                    break
                length = min(POPULATE_SPAN, self.size - start)
                if madvise is not None and madvise(base + start, length,
                                                   MADV_POPULATE_WRITE) == 0:
                    continue
                madvise = None  # an older kernel: allocate without mapping
                os.posix_fallocate(self.fd, start, length)  # releases the GIL
        except (OSError, ValueError):  # an optimisation: the copies fault pages in anyway
            pass
        self.populate_s = time.perf_counter() - t0

    def close(self) -> None:
        """Unmap and close (the driver's mapping, if any, keeps the memory).

        The page-table entries go first, a span at a time (``MADV_DONTNEED``, which for a
        shared mapping leaves the memfd's contents as they are), so that no single call
        holds the worker's address-space lock for a whole region: a ``mmap`` or heap
        growth on the model's forward thread, while this runs on a background thread,
        then waits for one span, not for the whole unmap."""
        self._stop = True
        if self._populator is not None:
            self._populator.join()
            self._populator = None
        _drop_mapped_pages(self.mm, self.size)
        try:
            self.mm.close()
        except BufferError:  # a view is still alive: the mapping goes with it
            pass
        try:
            os.close(self.fd)
        except OSError:
            pass


def _drop_mapped_pages(mm, size: int) -> None:
    """``MADV_DONTNEED`` over a *shared* mapping in spans (see :meth:`Region.close`); a
    no-op where it cannot be done (closed mapping, no ``madvise``)."""
    madvise = _madvise()
    if madvise is None or mm.closed:
        return
    import numpy as np

    view = np.frombuffer(mm, dtype=np.uint8)
    base = view.ctypes.data
    del view
    for start in range(0, size, POPULATE_SPAN):
        if madvise(base + start, min(POPULATE_SPAN, size - start), MADV_DONTNEED) != 0:
            return


def _madvise():
    """libc's ``madvise`` through ctypes (which releases the GIL), or ``None``."""
    global _MADVISE
    if _MADVISE is None:
        try:
            import ctypes

            fn = ctypes.CDLL(None, use_errno=True).madvise
            fn.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
            fn.restype = ctypes.c_int
            _MADVISE = fn
        except (OSError, AttributeError):
            _MADVISE = False
    return _MADVISE or None


_MADVISE = None


def map_private(pid: int, fd: int, size: int) -> Any:
    """Driver side: a uint8 numpy array over a private mapping of process ``pid``'s memfd
    ``fd`` (see module). The mapping lives as long as the array or any view of it; it is
    then unmapped on a background thread (:class:`_Unmapper`)."""
    import numpy as np

    local = os.open(f"/proc/{pid}/fd/{fd}", os.O_RDONLY)
    try:
        mm = mmap.mmap(local, size, flags=mmap.MAP_PRIVATE,
                       prot=mmap.PROT_READ | mmap.PROT_WRITE)
    finally:
        os.close(local)
    arr = np.frombuffer(mm, dtype=np.uint8)
    _UNMAPPER.track(arr, mm)
    return arr


class _Unmapper:
    """Unmaps a call's region off the thread that dropped its last result.

    Why: unmapping a region whose worker side is already closed frees every page of it
    (about 262,000 per GiB); that happens where the last result of a call dies, which in
    speculators' offline script is the main thread rebinding ``results`` between two
    ``generate()`` calls, i.e. between two forwards. Here the finalizer of the region's
    array only queues the mapping, and a daemon thread closes it (a forked child starts
    its own thread on its first unmap)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._queue: list = []
        self._wake = threading.Condition(self._lock)
        self._thread: threading.Thread | None = None
        self._pid = 0

    def track(self, arr, mm) -> None:
        import weakref

        fin = weakref.finalize(arr, self._later, mm)
        fin.atexit = False

    def _later(self, mm) -> None:
        with self._lock:
            if self._pid != os.getpid() or self._thread is None or not self._thread.is_alive():
                self._pid = os.getpid()
                self._thread = threading.Thread(target=self._run, daemon=True,
                                                name="speculators-compat-unmap")
                self._thread.start()
            self._queue.append(mm)
            self._wake.notify()

    def _run(self) -> None:
        while True:
            with self._lock:
                while not self._queue:
                    self._wake.wait()
                batch, self._queue = self._queue, []
            for mm in batch:
                try:
                    mm.close()
                except (BufferError, ValueError):  # still exported: goes with its views
                    pass


_UNMAPPER = _Unmapper()
