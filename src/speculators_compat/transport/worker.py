"""Worker side: each call's captured rows go into that call's region as the layers run.

:class:`Sender` lives on the capturing worker (TP rank 0) for the generator's life.
When a ``generate()`` call starts, the driver sends the call's plan (request ids and
prompt lengths in input order) and the sender opens a :class:`CallSink` for it. The
sink lays the whole call out in one :class:`~.region.Region` in the installed
speculators' contract (0.4.x: one block per request and layer; 0.3.x: one lane per layer
with the requests concatenated in input order; both layer by layer, requests in input
order), starts faulting it in, and copies every row the decoder-layer hooks hand it to
its place (:class:`~.copies.RowCopier`), consecutive requests' rows of a step as one
copy. When speculators asks for the states, only a descriptor is left to send.

When the layout is made: the rows' width and dtype fix it. From the second call on they
are the previous call's, so the region is made when the call starts, before the earlier
calls' regions are closed, and the model's forward thread makes none. Why: unmapping a
region and mapping one contend for the worker's address-space lock; the first layer hook
of a call that mapped its region while the previous one was being unmapped waited 25-45
ms on an H100 with the GPU idle (kernel timeline of the GPU benchmark, 2026-12-05). The
first call, or rows of another width or dtype than foreseen (the region is then made
again before any row went into it), lay out at the first rows.

Anything the plan did not foresee (a request not in it, rows past a prompt's end, a
prompt computed again after a preemption, a region that could not be made) switches
the sink off for the call: the states the capture keeps are then written into a fresh
region at the end (:meth:`Sender.export`), never a wrong row. The regions of a call are
closed in the worker at the next call (the driver has mapped them by then).
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any

from . import wire
from .copies import RowCopier, bytes_of
from .region import Region


class CallSink:
    """One call's rows, streamed into its region (see module)."""

    def __init__(self, copier: RowCopier, plan, n_layers: int, contract: str,
                 stats: dict | None = None) -> None:
        self.copier = copier
        self.stats = stats if stats is not None else {"write_s": 0.0, "copies": 0}
        self.plan = [(str(r), int(n)) for r, n in plan]
        self.n_layers = n_layers
        self.contract = contract
        self.ok = bool(self.plan)
        self.region: Region | None = None
        self.items: list = []
        self._dst: dict[tuple[str, int], tuple[int, int]] = {}  # (offset, bytes) per block
        self._arr: Any = None  # the region's bytes
        self._row_bytes = 0
        self._next: dict[tuple[str, int], int] = {}  # next prompt position per block
        #: (width, row bytes, dtype name) the layout was made for; ``None`` before.
        self.row_format: tuple | None = None
        self._seen_rows = False

    def lay_out(self, row_format: tuple) -> None:
        """The call's layout for rows of ``row_format`` (:func:`row_format_of`); makes the
        region and starts faulting it in.

        Blocks lie layer by layer, requests in input order within a layer, for both
        contracts (0.3.x's lane of a layer is exactly its requests' blocks back to back):
        a step's rows of one layer for consecutive whole requests are then one run in the
        step's tensor and one run in the region, and go as one copy (:meth:`write`)."""
        width, row_bytes, dtype = row_format
        total = sum(n for _, n in self.plan)
        self.region = Region(total * row_bytes * self.n_layers)
        self.region.populate()
        self._arr = self.region.array()
        self.items, self._dst = [], {}
        off = 0
        for slot in range(self.n_layers):
            if self.contract == wire.LIST:
                self.items.append((None, slot, off, (total, *width), dtype))
            for rid, n in self.plan:
                self._dst[(rid, slot)] = (off, n * row_bytes)
                off += n * row_bytes
        if self.contract != wire.LIST:  # items in the contract's order: request, then layer
            for rid, n in self.plan:
                for slot in range(self.n_layers):
                    self.items.append((rid, slot, self._dst[(rid, slot)][0], (n, *width),
                                       dtype))
        self._row_bytes = row_bytes
        self.row_format = row_format

    def _first_rows(self, sample) -> None:
        """The first rows of the call: lay out now, or again if the layout made at the
        call's start foresaw another width or dtype (nothing was copied into it yet)."""
        seen = row_format_of(sample)
        if self.region is not None and seen == self.row_format:
            return
        if self.region is not None:
            self._arr = None
            self.region.close()
            self.region = None
        self.lay_out(seen)

    def write(self, slot: int, entries) -> None:
        """``entries``: (request id, prompt position, rows) of one layer in one step. Rows
        that follow each other both in the step's tensor and in the region are copied as
        one piece."""
        if not self.ok:
            return
        t0 = time.perf_counter()
        try:
            if not self._seen_rows:
                self._first_rows(entries[0][2])
                self._seen_rows = True
            runs: list = []  # [region start, region end, rows]
            for rid, pos, rows in entries:
                block = self._dst.get((rid, slot))
                n = rows.shape[0]
                if (block is None or pos != self._next.get((rid, slot), 0)
                        or rows[0].numel() * rows.element_size() != self._row_bytes
                        or (pos + n) * self._row_bytes > block[1]):
                    self.off()
                    return
                self._next[(rid, slot)] = pos + n
                lo = block[0] + pos * self._row_bytes
                hi = lo + n * self._row_bytes
                joined = _joined(runs[-1][2], rows) if runs and runs[-1][1] == lo else None
                if joined is not None:
                    runs[-1][1:] = [hi, joined]
                else:
                    runs.append([lo, hi, rows])
            self.copier.copy([(self._arr[lo:hi], rows) for lo, hi, rows in runs])
            self.stats["copies"] += len(runs)
        except Exception:  # noqa: BLE001 - never fail the forward: export at the end
            self.off()
        self.stats["write_s"] += time.perf_counter() - t0

    def off(self) -> None:
        """Streaming is off for this call: the states are exported at its end."""
        self.ok = False

    def complete(self, order: list[str], lengths: dict[str, int]) -> bool:
        """Every planned row was streamed, for exactly the requests the capture holds
        (``order``: input order, ``lengths``: prompt lengths). Waits for the copies."""
        self.copier.wait()
        planned = [r for r, _ in self.plan]
        return (self.ok and self.region is not None and planned == order
                and all(lengths.get(r) == n for r, n in self.plan)
                and all(self._next.get((r, s)) == n for r, n in self.plan
                        for s in range(self.n_layers)))

    def discard(self) -> None:
        """The call is over without its region being sent: wait for the copies (they
        write into it), then close it."""
        try:
            self.copier.wait()
        finally:
            self._arr = None  # a view of the region: it unmaps once views are gone
            if self.region is not None:
                self.region.close()
                self.region = None


class Sender:
    """The capturing worker's side of the transport (see module)."""

    def __init__(self) -> None:
        self.copier = RowCopier()
        self.sink: CallSink | None = None
        self._sent: list[Region] = []
        #: The rows' (width, row bytes, dtype name) of the last streamed call: the next
        #: call is laid out with it when it starts (see module).
        self.row_format: tuple | None = None
        #: ``streamed``: calls whose rows went to their region while the model ran;
        #: ``exported``: calls written into a region at their end; ``bytes``: bytes sent;
        #: ``populate_s``: time spent faulting regions in (background); ``write_s``: time
        #: the layer hooks spent handing rows over (inside the model's steps); ``copies``:
        #: the copies they queued (one per run of rows adjacent in step and region).
        self.stats = {"streamed": 0, "exported": 0, "bytes": 0, "populate_s": 0.0,
                      "write_s": 0.0, "copies": 0}

    def begin_call(self, plan, n_layers: int, contract: str) -> CallSink | None:
        """A call starts: open its sink (``None`` without a plan), laid out already where
        the previous call's rows say how (see module), then close what earlier calls left
        (the driver has mapped every region it was sent)."""
        self.discard_sink()
        sink = CallSink(self.copier, plan, n_layers, contract, self.stats) if plan else None
        if sink is not None and self.row_format is not None:
            try:
                sink.lay_out(self.row_format)
            except (OSError, MemoryError, ValueError):  # the first rows try again
                sink.discard()
                sink = CallSink(self.copier, plan, n_layers, contract, self.stats)
        self.sink = sink
        self.close_sent()
        return self.sink

    def end_calls(self) -> None:
        self.discard_sink()
        self.close_sent()

    def discard_sink(self) -> None:
        """The open call (if any) ends without its region being sent."""
        sink, self.sink = self.sink, None
        if sink is not None:
            sink.discard()

    def close_sent(self) -> None:
        """Close the regions sent to the driver (it has mapped them), in the background:
        unmapping a call's worth of pages takes a while, and not on the forward's thread."""
        sent, self._sent = self._sent, []
        if sent:
            threading.Thread(target=self._close, args=(sent,), daemon=True,
                             name="speculators-compat-close").start()

    def _close(self, regions: list[Region]) -> None:
        for region in regions:
            region.close()
            self.stats["populate_s"] += region.populate_s

    def reply(self, states: Any, contract: str, order: list[str],
              lengths: dict[str, int]) -> dict:
        """The reply to the driver's export RPC for ``states`` (the capture's contract
        object): the streamed region where it holds exactly them, else a fresh one."""
        sink, self.sink = self.sink, None
        if sink is not None:
            try:
                whole = sink.complete(order, lengths)
            except Exception:  # noqa: BLE001 - a failed copy: export what the capture holds
                whole = False
            if whole:
                sink._arr = None
                self.row_format = sink.row_format
                self.stats["streamed"] += 1
                return self._send(sink.region, contract, sink.items, streamed=True)
            sink.discard()
        return self.export(states, contract)

    def export(self, states: Any, contract: str) -> dict:
        """Write ``states`` into a region of their exact size, now (the plain path: each
        tensor through ``.cpu()``; it runs only where streaming could not)."""
        import numpy as np

        layout, off = [], 0
        for key, slot, t in wire.tensors_of(states, contract):
            nbytes = t.numel() * t.element_size()
            layout.append((key, slot, off, t))
            off += (nbytes + 63) // 64 * 64
        region = Region(off)
        try:
            arr = region.array()
            items = []
            for key, slot, start, t in layout:
                nbytes = t.numel() * t.element_size()
                if nbytes:
                    np.copyto(arr[start:start + nbytes], bytes_of(t.detach().cpu().contiguous()))
                items.append((key, slot, start, tuple(t.shape), str(t.dtype)))
            del arr
        except BaseException:
            region.close()
            raise
        self.stats["exported"] += 1
        return self._send(region, contract, items, streamed=False)

    def _send(self, region: Region, contract: str, items: list, streamed: bool) -> dict:
        self._sent.append(region)
        self.stats["bytes"] += region.size
        return wire.region_reply(os.getpid(), region.fd, region.size, contract, items,
                                 streamed)

    def all_stats(self) -> dict:
        return {**self.stats, **self.copier.stats, "time": time.time()}

    def close(self) -> None:
        self.end_calls()
        self.copier.close()


def row_format_of(rows) -> tuple:
    """(width, bytes per row, dtype name) of a step's rows: what a call's layout needs."""
    return (tuple(rows.shape[1:]), rows[0].numel() * rows.element_size(), str(rows.dtype))


def _joined(a, b):
    """``a`` and then ``b`` as one tensor where ``b``'s rows follow ``a``'s in the same
    memory (slices of one step's hidden states, back to back), else ``None``."""
    if (a.dtype != b.dtype or a.device != b.device or a.shape[1:] != b.shape[1:]
            or not a.is_contiguous() or not b.is_contiguous()
            or a.data_ptr() + a.numel() * a.element_size() != b.data_ptr()
            or a.untyped_storage().data_ptr() != b.untyped_storage().data_ptr()):
        return None
    return a.as_strided((a.shape[0] + b.shape[0], *a.shape[1:]), a.stride(),
                        a.storage_offset())
