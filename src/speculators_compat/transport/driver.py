"""Driver side: the states of a call, as tensors over the worker's region.

:class:`Receiver` performs the export RPC, maps the region the reply names privately
(:func:`~.region.map_private`) and rebuilds the installed speculators' contract object
from it: CPU tensors of the same dtype, shapes, lists and order as the pickled path. With
``handoff`` they are :class:`~.handoff` tensors whose ``clone()`` (which speculators
calls on every tensor it returns) takes the memory over instead of copying, so the
results are the region itself; otherwise speculators' clone copies them and the region
goes when ``generate()`` drops the views. A fallback reply carries the states pickled:
they are returned as they are and the reason is logged once.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from . import handoff as _handoff
from . import wire
from .region import map_private

logger = logging.getLogger("speculators_compat")


class Receiver:
    def __init__(self, handoff: bool = False) -> None:
        self.handoff = handoff
        #: The first fallback's reason (states pickled), ``None`` while there was none.
        self.fallback_reason: str | None = None
        #: ``fetch_s``: the export RPC and mapping; ``handed_over``: calls returned as
        #: tensors whose clone() takes the region over; ``calls`` / ``bytes``: regions
        #: received; ``streamed``: of those, written while the model ran;
        #: ``after_fetch_s``: the rest of ``generate()`` (set by the adapter).
        self.stats = {"fetch_s": 0.0, "calls": 0, "bytes": 0, "streamed": 0,
                      "handed_over": 0, "after_fetch_s": 0.0, "copy_threads": 0}

    def fetch(self, call: Callable[[], Any]) -> Any:
        """``call()`` performs the worker RPC; returns the contract object (CPU tensors),
        or ``None`` if the worker captured nothing."""
        t0 = time.perf_counter()
        reply = call()
        if reply is None:
            return None
        if "fallback" in reply:
            if reply["fallback"] and self.fallback_reason is None:
                self.fallback_reason = reply["fallback"]
                logger.warning("speculators-compat: hidden states travel pickled through "
                               "collective_rpc (slower): %s", reply["fallback"])
            return reply["states"]
        arr = map_private(int(reply["pid"]), int(reply["fd"]), int(reply["size"]))
        make = _handoff.hand_over if self.handoff else _handoff.plain
        by_key: dict = {}
        for key, slot, off, shape, dtype_name in reply["items"]:
            dtype = _handoff.torch_dtype(dtype_name)
            n = _handoff.nbytes(shape, dtype)
            by_key.setdefault(key, {})[slot] = make(arr[off:off + n], dtype, tuple(shape))
        del arr
        self.stats["calls"] += 1
        self.stats["bytes"] += int(reply["size"])
        self.stats["streamed"] += bool(reply.get("streamed"))
        self.stats["handed_over"] += self.handoff
        self.stats["fetch_s"] += time.perf_counter() - t0
        return wire.assemble(reply["contract"], by_key)
