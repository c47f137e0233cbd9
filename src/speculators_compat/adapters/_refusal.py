"""The refusal every fail-closed adapter installs when it cannot act.

A data-guarding adapter whose probe or apply fails makes building speculators' generator,
and ``generate()``, raise instead of letting it produce silently wrong data
(``Adapter.fail_closed``; what it wraps is declared as ``_targets.REFUSAL_TARGETS``).
"""

from __future__ import annotations

from .._adapter import Context
from .._errors import CompatError
from .._patcher import Patcher
from . import _probes


def refuse_generator(patcher: Patcher, ctx: Context, message: str) -> None:
    """Fail closed: make building a generator, and ``generate()``, raise ``message``
    (what every fail-closed adapter's ``refuse()`` installs; ``_targets.REFUSAL_TARGETS``)."""
    gen = _probes.generator_module(ctx)
    if gen is None:
        return

    def refuse(wrapped, instance, args, kwargs):
        raise CompatError(message)

    patcher.wrap(gen.VllmHiddenStatesGenerator, "__init__", refuse)
    patcher.wrap(gen.VllmHiddenStatesGenerator, "generate", refuse)
