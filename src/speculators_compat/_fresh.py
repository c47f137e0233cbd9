"""Driver memory for copied results, made ready while the model runs.

Why: where the transport copies a call's hidden states into the driver's own memory (the
results of earlier calls are still held, so handing the shared-memory segments over would
make the worker grow its pinned pool every call; or a batch larger than the pool), the
copy's cost is mostly not the copy: it is the kernel faulting in and zeroing every fresh
page the copy first touches. Measured on an H200 with an 8B-shaped model, four layers,
batch 32 and every result held: about 0.11 s per call (1 GiB) on 8 threads, the whole gap
to vLLM's own prefill. The driver does nothing while the worker runs the forward, so that
is when the pages can be made.

How: when a call starts, :meth:`FreshMemory.prepare` is given the call's size (its prompt
tokens times the bytes per token the transport learnt from earlier calls); a background
thread maps that much private anonymous memory, asks for transparent huge pages
(``MADV_HUGEPAGE``: 512 times fewer faults where the kernel allows it) and touches one byte
per page on a few threads (numpy releases the GIL), beside the worker's forward. When the
states arrive, :meth:`FreshMemory.take` carves exactly-sized pieces out of it; each result
is a tensor over its own piece (its storage is exactly its bytes, see
:mod:`speculators_compat._handoff`), and the mapping goes away with the last of them.
Where the region is not ready in time, ``take`` waits for it (the same work, done anyway);
where it is too small or could not be made, ``take`` returns ``None`` and the caller uses
ordinary memory. Nothing here touches CUDA or the worker.
"""

from __future__ import annotations

import mmap
import os
import threading
import time
from typing import Any

#: Bytes a region is rounded up to (a transparent huge page).
HUGE = 2 << 20
#: Ask for transparent huge pages (``MADV_HUGEPAGE``). The GPU benchmark turns it off to
#: measure what huge-page faults beside the forward cost (``gpu_bench --no-huge-pages``).
HUGE_PAGES = True
PAGE = mmap.PAGESIZE
ALIGN = 64


def _touch_threads() -> int:
    return max(1, min(4, (os.cpu_count() or 1) // 4))


class FreshMemory:
    """One region of pre-faulted private memory at a time, handed out in pieces."""

    def __init__(self, threads: int | None = None, stats: dict | None = None) -> None:
        self.threads = threads or _touch_threads()
        self._region: Any = None  # uint8 array over the current region
        self._used = 0
        self._pending: Any = None  # a region the background thread finished
        self._job: threading.Thread | None = None
        #: ``fresh_bytes``: bytes made ready; ``fresh_s``: the background thread's time;
        #: ``fresh_wait_s``: time :meth:`take` waited for it; ``fresh_hugepages``: whether
        #: the kernel took ``MADV_HUGEPAGE`` (``None``: nothing made yet). ``stats``: a
        #: dict to keep them in (the transport's own).
        self.stats = stats if stats is not None else {}
        for key, value in (("fresh_bytes", 0), ("fresh_s", 0.0), ("fresh_wait_s", 0.0),
                           ("fresh_hugepages", None)):
            self.stats.setdefault(key, value)

    def free(self) -> int:
        return 0 if self._region is None else self._region.nbytes - self._used

    def prepare(self, nbytes: int) -> None:
        """Have ``nbytes`` ready for :meth:`take`, made in the background."""
        if nbytes <= 0:
            return
        self._collect()
        if self.free() >= nbytes or self._job is not None:
            return
        size = -(-nbytes // HUGE) * HUGE
        self._job = threading.Thread(target=self._make, args=(size,), daemon=True,
                                     name="speculators-compat-fresh")
        self._job.start()

    def take(self, nbytes: int):
        """A uint8 array of exactly ``nbytes`` from the prepared region, or ``None``."""
        if self._job is not None:
            t0 = time.perf_counter()
            self._job.join()
            self.stats["fresh_wait_s"] += time.perf_counter() - t0
        self._collect()
        if self._region is None or nbytes <= 0:
            return None
        start = -(-self._used // ALIGN) * ALIGN
        if start + nbytes > self._region.nbytes:
            return None
        self._used = start + nbytes
        return self._region[start:start + nbytes]

    def drop(self) -> None:
        """Forget the current region (pieces already handed out keep it mapped)."""
        if self._job is not None:
            self._job.join()
        self._job = self._pending = self._region = None
        self._used = 0

    def _collect(self) -> None:
        """Adopt the background thread's region once it is done."""
        if self._job is not None and not self._job.is_alive():
            self._job = None
        if self._job is None and self._pending is not None:
            self._region, self._pending, self._used = self._pending, None, 0

    def _make(self, size: int) -> None:
        import numpy as np

        t0 = time.perf_counter()
        try:
            mm = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
            huge = HUGE_PAGES
            try:
                if huge:
                    mm.madvise(mmap.MADV_HUGEPAGE)
            except (AttributeError, OSError, ValueError):
                huge = False
            arr = np.frombuffer(mm, dtype=np.uint8)
            step = -(-size // self.threads)
            step = -(-step // PAGE) * PAGE
            spans = [(lo, min(lo + step, size)) for lo in range(0, size, step)]

            def touch(span):
                arr[span[0]:span[1]:PAGE] = 0  # numpy releases the GIL

            if len(spans) == 1:
                touch(spans[0])
            else:
                from concurrent.futures import ThreadPoolExecutor

                with ThreadPoolExecutor(len(spans)) as pool:
                    list(pool.map(touch, spans))
            self._pending = arr
            self.stats["fresh_bytes"] += size
            self.stats["fresh_hugepages"] = huge
        except Exception:  # noqa: BLE001 - an optimisation: take() then returns None
            self._pending = None
        self.stats["fresh_s"] += time.perf_counter() - t0
