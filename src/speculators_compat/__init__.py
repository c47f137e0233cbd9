"""speculators-compat: run speculators 0.3.x / 0.4.x hidden-state extraction, unchanged,
on newer and nightly vLLM.

Usage::

    import speculators_compat
    speculators_compat.activate()   # before the unchanged upstream pipeline runs

Importing this package is cheap (no vLLM, torch or transformers import) and changes
nothing; :func:`activate` probes the installed vLLM and speculators, applies the
adapters they need in this process, and makes vLLM's spawned worker processes do
the same (an interpreter-start hook on ``PYTHONPATH``, and the ``vllm.general_plugins``
entry point).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

from ._core import Activation, CompatError, Kind, Report, Status, UnsupportedError

__version__ = "0.1.0"
__all__ = ["activate", "deactivate", "report", "save_report", "CompatError", "Kind",
           "Report", "Status", "UnsupportedError", "__version__"]

logging.getLogger("speculators_compat").addHandler(logging.NullHandler())


def _registry():
    from .adapters import ADAPTERS

    return ADAPTERS


def _bootstrap_hook(patcher, process: str) -> None:
    from ._bootstrap import install

    install(patcher, process)


_ACTIVATION = Activation(_registry, on_activate=_bootstrap_hook)


def activate(*, only: Iterable[str] | None = None, strict: bool | None = None) -> Report:
    """Apply every adapter the installed vLLM / speculators need, in this process.

    Idempotent and thread-safe: a second call returns the first call's report.
    ``only`` restricts activation to the named adapters (others are reported
    ``disabled``). ``strict=True`` (or ``SPECULATORS_COMPAT_STRICT=1``) raises
    :class:`CompatError` and patches nothing if an adapter finds an API it does not
    know (``mismatch``) or fails. ``SPECULATORS_COMPAT_DISABLE=a,b`` disables
    adapters by name. Raises :class:`CompatError` (and patches nothing) when a
    speculators import that an import-time adapter had to precede already happened
    in this process (``_order``). Every Python process started from here on
    activates at interpreter start (``_bootstrap``).
    """
    from ._order import check_import_order, imported_before

    already = _ACTIVATION.active
    before = imported_before()
    report = _ACTIVATION.activate(only=only, strict=strict, process="driver")
    if not already:
        try:
            check_import_order(report, before)
        except CompatError:
            _ACTIVATION.deactivate()
            raise
    return report


def deactivate() -> None:
    """Undo everything :func:`activate` changed, restoring the original objects."""
    _ACTIVATION.deactivate()


def report() -> Report | None:
    """The current activation's report, or ``None`` when not active."""
    return _ACTIVATION.report


def save_report(path) -> str:
    """Write the activation report as JSON to ``path`` (keep it next to generated data).

    Raises :class:`CompatError` when the shim is not active, so provenance is never
    silently missing.
    """
    current = _ACTIVATION.report
    if current is None:
        raise CompatError("speculators-compat is not active: call speculators_compat.activate() "
                          "before generating data, then save_report(path).")
    return current.to_json(path)
