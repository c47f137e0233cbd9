"""What this process generated: the facts about its data that are known only as it runs.

Why: ``activate()`` writes the report before any generator exists, but which layers the
data holds is decided when speculators' generator is built (``layer_ids`` or its
defaults). The ``draft_aux_layers`` adapter records each generator here; the process's
activation (:mod:`speculators_compat._process`) listens and rewrites the report file,
and the layers file next to it, so that the layers travel with the data to a training
process that runs later and elsewhere.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

logger = logging.getLogger("speculators_compat")

_GENERATORS: list[dict[str, Any]] = []
_LISTENERS: list[Callable[[], None]] = []


def record_generator(record: dict[str, Any]) -> None:
    """Remember one generator of this process and tell the listeners (never raises:
    provenance must not take data generation down)."""
    _GENERATORS.append(dict(record))
    for listener in list(_LISTENERS):
        try:
            listener()
        except Exception as exc:  # noqa: BLE001
            logger.warning("speculators-compat: could not record the generator's layers: %r",
                           exc)


def generators() -> list[dict[str, Any]]:
    """The generators this process built, in order (copies)."""
    return [dict(r) for r in _GENERATORS]


def data_section() -> dict[str, Any]:
    """The report's ``data`` section: empty until a generator was built here."""
    return {"hidden_states": generators()} if _GENERATORS else {}


def listen(listener: Callable[[], None]) -> None:
    """Call ``listener()`` after every :func:`record_generator` (once per listener)."""
    if listener not in _LISTENERS:
        _LISTENERS.append(listener)


def clear() -> None:
    """Forget every record (tests)."""
    _GENERATORS.clear()
