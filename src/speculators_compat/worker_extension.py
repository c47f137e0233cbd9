"""Worker extensions that replace speculators' ``HiddenStatesWorkerExtension``.

vLLM mixes the class named in ``ParallelConfig.worker_extension_cls`` into its worker
class in every worker process. The ``hook_capture`` adapter names one of these
instead of speculators' class; they answer the same RPCs speculators' generator sends
(``_setup_hidden_states_capture``, ``_reset_capture``, ``_set_request_metadata``,
``_get_captured_states``) with the installed speculators version's own result contract,
but capture through :mod:`speculators_compat._capture` (hooks on decoder layers, rows
attributed with the runner's real batch order).

This module imports only the shim's core at import time; torch and vLLM are imported
when the RPCs run (inside the worker, where they are loaded anyway).
"""

from __future__ import annotations

from typing import Any

from . import _transport
from ._errors import CompatError


class _CompatHiddenStatesExtension:
    """Shared RPC surface; subclasses choose the result contract."""

    def _setup_hidden_states_capture(self, layer_ids: list[int]) -> None:
        from vllm.distributed import get_tp_group

        from ._capture import LayerCapture

        old = getattr(self, "_compat_capture", None)
        if old is not None:
            old.remove()
        enabled = get_tp_group().rank_in_group == 0  # capture once per token, as upstream
        self._compat_capture = LayerCapture(self.model_runner, layer_ids, enabled)
        self._layer_ids = frozenset(layer_ids)

    def _capture(self):
        cap = getattr(self, "_compat_capture", None)
        if cap is None:
            raise RuntimeError("Must call _setup_hidden_states_capture before capturing states")
        return cap

    def _set_request_metadata(self, request_metadata: dict[str, int]) -> None:
        """Accepted for speculators 0.4's driver; rows are attributed from the runner's own
        batch layout instead, which also covers decode rows and reordered batches."""

    def _reset_capture(self) -> None:
        cap = self._capture()
        if cap.sink is not None:
            cap.sink.wait()  # copies of an abandoned call still read rows reset() frees
        cap.reset()
        cap.sink = None

    def _compat_exporter_of_worker(self):
        exporter = getattr(self, "_compat_exporter", None)
        if exporter is None:
            exporter = self._compat_exporter = _transport.ShmExporter()
        return exporter

    def _release_segments(self, released) -> None:
        """Free the segments the driver no longer views, first thing in either transport
        RPC: the driver has already forgotten them, so a call that returns early (capture
        off) or fails would otherwise leave them leased for good, and each later call
        would allocate and fault in a fresh segment inside its forward step."""
        exporter = getattr(self, "_compat_exporter", None)
        if exporter is not None and released:
            exporter.release(released)

    def _compat_reset_capture(self, plan=(), released=(), token=None) -> dict | None:
        """speculators' ``_reset_capture`` with the call's plan (request ids and prompt
        lengths in input order) from the shim's driver: rows then stream into shared
        memory while the model runs (:class:`speculators_compat._transport.StreamingSink`).
        With a ``token``, the sink also publishes landed rows on the exporter's board for
        the driver's early copy (:mod:`speculators_compat._early`); the reply says where
        the board is."""
        self._release_segments(released)
        self._reset_capture()
        cap = self._capture()
        if not cap.enabled or not plan:
            return None
        exporter = self._compat_exporter_of_worker()
        exporter.new_call()
        board = exporter.board(token)
        cap.sink = _transport.StreamingSink(exporter, plan, len(cap.layer_ids), self.CONTRACT,
                                            board=board)
        # Memory for this call and the next one of its size, made beside this forward
        # (15 % for the segment ends the layout leaves unused).
        call_bytes = exporter.token_bytes * sum(int(n) for _, n in plan)
        exporter.grow_ahead(call_bytes * 23 // 10)
        return None if board is None else {_transport.MARKER: 1, "board": board.info()}

    def _compat_export_states(self, released=(), more: bool = False) -> dict | None:
        """The shared-memory transport's RPC (see :mod:`speculators_compat._transport`):
        what ``_get_captured_states`` returns, as a small descriptor of shared memory;
        ``released`` names segments the driver no longer uses."""
        self._release_segments(released)
        cap = self._capture()
        if not cap.enabled:
            return None
        exporter = self._compat_exporter_of_worker()
        if more:
            return exporter.next_piece()
        sink, cap.sink = cap.sink, None
        if sink is not None:
            sink.wait()  # before take() frees the rows its side-stream copies read
        order, lengths = cap.ordered_requests(), dict(cap.prompt_len)
        states = self._get_captured_states()  # every completeness check runs here
        if states is None:
            return None
        if sink is not None:
            reply = sink.describe(order, lengths)
            if reply is not None:
                return reply
        try:
            return exporter.export(states, self.CONTRACT)
        except (OSError, MemoryError) as exc:
            exporter.reset()
            return _transport.rpc_reply(states, f"shared memory refused in the worker: {exc!r}")

    def _speculators_compat_report(self) -> dict | None:
        from ._process import worker_report

        return worker_report()


class ListContractExtension(_CompatHiddenStatesExtension):
    """speculators 0.3.x contract: a list with one tensor per layer (ascending layer id),
    rows of all requests concatenated in input order; ``None`` if nothing was captured."""

    CONTRACT = _transport.LIST

    def _get_captured_states(self) -> list[Any] | None:
        cap = self._capture()
        if not cap.enabled:
            return None
        per_request = cap.take()
        if not per_request:
            return None
        import torch

        layers = list(zip(*per_request.values()))
        return [torch.cat(list(chunks), dim=0) for chunks in layers]


class ByRequestContractExtension(_CompatHiddenStatesExtension):
    """speculators 0.4.x contract: ``{request_id: [tensor per layer]}``; ``None`` if empty."""

    CONTRACT = _transport.BY_REQUEST

    def _get_captured_states(self) -> dict[str, list[Any]] | None:
        cap = self._capture()
        if not cap.enabled:
            return None
        return cap.take() or None


EXTENSIONS = {
    _transport.LIST: f"{__name__}.ListContractExtension",
    _transport.BY_REQUEST: f"{__name__}.ByRequestContractExtension",
}

__all__ = ["EXTENSIONS", "ByRequestContractExtension", "CompatError", "ListContractExtension"]
