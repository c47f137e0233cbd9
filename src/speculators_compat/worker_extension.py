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

from ._errors import CompatError
from .transport import wire


class _CompatHiddenStatesExtension:
    """Shared RPC surface; subclasses choose the result contract."""

    def _setup_hidden_states_capture(self, layer_ids: list[int]) -> None:
        from vllm.distributed import get_tp_group

        from ._capture import LayerCapture

        old = getattr(self, "_compat_capture", None)
        if old is not None:
            old.remove()
        tp = get_tp_group()
        enabled = tp.rank_in_group == 0  # capture once per token, as upstream
        self._compat_capture = LayerCapture(self.model_runner, layer_ids, enabled,
                                            tp_size=tp.world_size)
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
        self._reset_capture_only()
        sender = getattr(self, "_compat_sender", None)
        if sender is not None:
            sender.close_sent()

    def _reset_capture_only(self) -> None:
        """speculators' reset, leaving the regions sent to the driver open (the caller
        closes them)."""
        cap = self._capture()
        sender = getattr(self, "_compat_sender", None)
        if sender is not None:
            sender.discard_sink()  # an abandoned call's copies still read rows reset() frees
        cap.reset()
        cap.sink = None

    def _compat_sender_of_worker(self):
        sender = getattr(self, "_compat_sender", None)
        if sender is None:
            from .transport.worker import Sender

            sender = self._compat_sender = Sender()
        return sender

    def _compat_reset_capture(self, plan=()) -> None:
        """speculators' ``_reset_capture`` with the call's plan (request ids and prompt
        lengths in input order) from the shim's driver: rows then go into the call's
        region while the model runs (:class:`speculators_compat.transport.worker.Sender`)."""
        self._reset_capture_only()
        cap = self._capture()
        if not cap.enabled or not plan:
            sender = getattr(self, "_compat_sender", None)
            if sender is not None:
                sender.close_sent()
            return None
        cap.sink = self._compat_sender_of_worker().begin_call(plan, len(cap.layer_ids),
                                                              self.CONTRACT)
        return None

    def _compat_export_states(self) -> dict | None:
        """The transport's RPC (see :mod:`speculators_compat.transport`): what
        ``_get_captured_states`` returns, as a descriptor of the call's region."""
        cap = self._capture()
        if not cap.enabled:
            return None
        sender = self._compat_sender_of_worker()
        cap.sink = None
        order, lengths = cap.ordered_requests(), dict(cap.prompt_len)
        try:
            states = self._get_captured_states()  # every completeness check runs here
        except BaseException:
            sender.end_calls()
            raise
        if states is None:
            sender.end_calls()
            return None
        try:
            return sender.reply(states, self.CONTRACT, order, lengths)
        except (OSError, MemoryError) as exc:
            sender.end_calls()
            return wire.fallback_reply(states, f"shared memory refused in the worker: {exc!r}")

    def _compat_step(self, scheduler_output) -> None:
        """One of speculators' steps in one message (the ``step_overlap`` adapter): the
        forward and, where vLLM splits it off (0.11.1+), the sampling that must follow
        before the next step. The driver sends it without waiting and reads no output,
        so none is sent back."""
        out = self.execute_model(scheduler_output)
        sample = getattr(self, "sample_tokens", None)
        if out is None and callable(sample):
            sample(None)
        return None

    def _speculators_compat_report(self) -> dict | None:
        from ._process import worker_report

        return worker_report()


class ListContractExtension(_CompatHiddenStatesExtension):
    """speculators 0.3.x contract: a list with one tensor per layer (ascending layer id),
    rows of all requests concatenated in input order; ``None`` if nothing was captured."""

    CONTRACT = wire.LIST

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

    CONTRACT = wire.BY_REQUEST

    def _get_captured_states(self) -> dict[str, list[Any]] | None:
        cap = self._capture()
        if not cap.enabled:
            return None
        return cap.take() or None


EXTENSIONS = {
    wire.LIST: f"{__name__}.ListContractExtension",
    wire.BY_REQUEST: f"{__name__}.ByRequestContractExtension",
}

__all__ = ["EXTENSIONS", "ByRequestContractExtension", "CompatError", "ListContractExtension"]
