"""What crosses between the capturing worker and the driver: RPC names, the reply format.

A reply is a plain dict (it must unpickle in a process that never imported this module):
either a *region* reply, which names one call's memory in the worker (pid and file
descriptor of a memfd, its size) and where each tensor of the installed speculators
release's result contract lies in it, or a *fallback* reply, which carries the states
themselves through vLLM's pickled ``collective_rpc`` path, with the reason.
"""

from __future__ import annotations

import os
from typing import Any

from .. import _speculators

#: Marker key of a transport reply.
MARKER = "speculators_compat_transport"
#: The worker RPCs the driver sends instead of ``_reset_capture`` / ``_get_captured_states``.
RESET_RPC = "_compat_reset_capture"
EXPORT_RPC = "_compat_export_states"

#: The worker extension's result contracts (speculators 0.3.x / 0.4.x).
LIST = _speculators.CONTRACT_LIST
BY_REQUEST = _speculators.CONTRACT_BY_REQUEST


def unavailable_reason() -> str | None:
    """Why this machine cannot carry states through a memfd (``None`` if it can): the
    driver opens the worker's memfd through ``/proc/<pid>/fd/<n>``."""
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


def region_reply(pid: int, fd: int, size: int, contract: str, items: list,
                 streamed: bool) -> dict:
    """A call's states lie in the worker's memfd ``fd`` (``size`` bytes). ``items``:
    ``(key, layer slot, byte offset, shape, dtype name)`` per tensor of the contract
    (``key``: the request id for 0.4.x, ``None`` for 0.3.x's per-layer lanes)."""
    return {MARKER: 1, "pid": pid, "fd": fd, "size": size, "contract": contract,
            "items": items, "streamed": streamed}


def fallback_reply(states: Any, reason: str) -> dict:
    """A reply that carries the states the old way (pickled by vLLM)."""
    return {MARKER: 1, "fallback": reason, "states": states}


def is_reply(obj: Any) -> bool:
    return isinstance(obj, dict) and obj.get(MARKER) == 1


def tensors_of(states: Any, contract: str) -> list[tuple[Any, int, Any]]:
    """``(key, layer slot, tensor)`` for every tensor of a contract object."""
    if contract == LIST:
        return [(None, slot, t) for slot, t in enumerate(states)]
    return [(rid, slot, t) for rid, layers in states.items() for slot, t in enumerate(layers)]


def assemble(contract: str, by_key: dict) -> Any:
    """The contract object from ``{key: {slot: tensor}}``."""
    def layers(slots: dict) -> list:
        if sorted(slots) != list(range(len(slots))):
            raise RuntimeError(f"speculators-compat transport: layer slots {sorted(slots)}")
        return [slots[i] for i in range(len(slots))]

    if contract == LIST:
        return layers(by_key.get(None, {}))
    return {rid: layers(slots) for rid, slots in by_key.items()}
