"""This process's activation: the one :class:`~speculators_compat._activation.Activation`.

What ``speculators_compat.activate()`` / ``deactivate()`` / ``report()`` /
``save_report()`` act on in the user's process, what the ``vllm.general_plugins`` entry
point (:mod:`speculators_compat._plugin`) and the interpreter-start hook
(:mod:`speculators_compat._bootstrap`'s ``sitecustomize``) activate in child processes,
and what a worker answers when asked for its report. It passes the engine the registry
(:data:`speculators_compat.adapters.ADAPTERS`, imported on first activation: importing the
package stays cheap) and the bootstrap's ``install`` (run after the adapters, through the
Patcher). Only the entry points and the package's face import this module.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable, Sequence

from . import _bootstrap, _draft_layers, _env, _layer_record, _order
from ._activation import Activation
from ._adapter import Adapter
from ._errors import CompatError
from ._patcher import Patcher
from ._report import Report


def _registry() -> Sequence[Adapter]:
    from .adapters import ADAPTERS

    return ADAPTERS


def _bootstrap_hook(patcher: Patcher, process: str) -> None:
    _bootstrap.install(patcher, process)


#: This process's activation: ``speculators_compat.activate()`` in the user's process,
#: the ``vllm.general_plugins`` entry point and the interpreter-start hook in children.
ACTIVATION = Activation(_registry, on_activate=_bootstrap_hook)


def _write_data_files(report: Report, path: str) -> None:
    """The report at ``path`` and, once a generator ran here, :data:`LAYERS_FILE
    <speculators_compat._draft_layers.LAYERS_FILE>` beside it: the layers the data holds,
    for a training process that reads that folder later."""
    report.data = _layer_record.data_section()
    folder = os.path.dirname(os.path.abspath(path))
    records = _layer_record.generators()
    if records:
        os.makedirs(folder, exist_ok=True)
    report.to_json(path)
    if records:
        _draft_layers.write_layers_file(folder, records,
                                        report.versions.get("speculators_compat"))


def _generator_built() -> None:
    """A generator of this process decided its layers: rewrite the report file (if this
    activation wrote one) with them, and the layers file next to it."""
    current = ACTIVATION.report
    if current is None:
        return
    current.data = _layer_record.data_section()
    if ACTIVATION.report_path:
        _write_data_files(current, ACTIVATION.report_path)


_layer_record.listen(_generator_built)


def activate(*, only: Iterable[str] | None = None, strict: bool | None = None) -> Report:
    """Apply every adapter the installed vLLM / speculators need, in this process.

    Idempotent and thread-safe: a second call returns the first call's report.
    ``only`` restricts activation to the named adapters (others are reported
    ``disabled``). ``strict=True`` (or ``SPECULATORS_COMPAT_STRICT=1``) raises
    :class:`CompatError` and patches nothing if an adapter finds an API it does not
    know (``mismatch``) or fails. ``SPECULATORS_COMPAT_DISABLE=a,b`` disables
    adapters by name. ``only`` and ``strict`` hold in every process started from here
    on as well (vLLM's workers included). Raises :class:`CompatError` (and patches
    nothing) when a speculators import that an import-time adapter had to precede
    already happened in this process (``_order``). Every Python process started from
    here on activates at interpreter start (``_bootstrap``).
    """
    already = ACTIVATION.active
    before = _order.imported_before()
    result = ACTIVATION.activate(only=only, strict=strict, process="driver")
    if not already:
        try:
            _order.check_import_order(result, before, _registry())
        except CompatError:
            ACTIVATION.deactivate()
            raise
    return result


def deactivate() -> None:
    """Undo everything :func:`activate` changed, restoring the original objects."""
    if ACTIVATION.active:
        _order.remember_built_with_fix()
    ACTIVATION.deactivate()


def report() -> Report | None:
    """The current activation's report, or ``None`` when not active."""
    return ACTIVATION.report


def save_report(path) -> str:
    """Write the activation report as JSON to ``path`` (keep it next to generated data).

    Once speculators' generator ran in this process, the report has a ``data`` section
    (the layers each generator captured) and ``speculators-compat-layers.json`` is written
    beside it: a draft trained on the data in that folder then names those layers in its
    config (the ``draft_aux_layers`` adapter). Raises :class:`CompatError` when the shim
    is not active, so provenance is never silently missing.
    """
    current = ACTIVATION.report
    if current is None:
        raise CompatError("speculators-compat is not active: call speculators_compat.activate() "
                          "before generating data, then save_report(path).")
    _write_data_files(current, path)
    return current.to_json()


def activate_worker() -> None:
    """The ``vllm.general_plugins`` entry point's activation (a vLLM worker process)."""
    ACTIVATION.activate(process="worker")


def worker_report(worker=None) -> dict | None:
    """The activation report of the process this runs in, as a dict (``None`` if the
    shim is not active there). Usable with ``collective_rpc(worker_report)``."""
    rep = ACTIVATION.report
    return None if rep is None else rep.as_dict()


def start() -> None:
    """Activate in a freshly started interpreter (called by ``sitecustomize``).

    Never raises: the interpreter must start whatever happens here. A child that
    activates as driver does not write ``SPECULATORS_COMPAT_REPORT_FILE``: that file
    is the explicitly activated process's report. Which adapters a child gets follows
    from its command line (:func:`speculators_compat._bootstrap.process_kind`).
    """
    if not _env.flag(os.environ.get(_env.ACTIVE)):
        return
    kind = _bootstrap.process_kind()
    if kind is None:
        return
    try:
        ACTIVATION.activate(process=kind, write_report=False)
    except Exception as exc:  # noqa: BLE001 - never take the interpreter down
        sys.stderr.write(
            f"speculators-compat: WARNING: activation at interpreter start failed in pid "
            f"{os.getpid()} ({kind}): {type(exc).__name__}: {exc}\n")
