"""Refuse an activation that comes after the speculators import it had to precede.

Some adapters act at import time: they must run before a module is imported, because
that import fails or builds something broken without them (``transformers5_config_torch``:
speculators' pydantic configs on transformers 5; ``kv_cache_helpers_relocated``:
speculators' generator module on vLLM 0.33). ``activate()`` called after such an import
cannot repair what the import already built.

What is detectable, honestly: on the releases where these adapters are needed, the early
import raises (``PydanticUndefinedAnnotation: name 'torch' is not defined``,
``ImportError: cannot import name ...``), so a script that imports speculators first
normally stops at that import, before ``activate()`` runs; nothing of the shim can run
earlier in a process that was not started by an activated one (docs/troubleshooting.md
names that error and the fix). When the script went on anyway (it caught the error),
the failed import leaves half-built speculators modules in ``sys.modules``: then
``activate()`` sees them and raises :class:`CompatError` naming the fix, instead of
letting a later import or a worker fail far from the cause.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable

from ._adapter import Adapter
from ._errors import CompatError
from ._report import Report, Status


def import_time(adapters: Iterable[Adapter]) -> dict[str, tuple[str, ...]]:
    """Import-time adapters of the registry -> the module prefixes whose earlier import
    they cannot repair (their declared :class:`~speculators_compat._adapter.Stage`)."""
    return {a.name: (a.stage.precedes,) for a in adapters if a.stage.precedes}


_ROOTS = ("speculators",)


def _under(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


#: speculators modules that were imported while the shim was active (so built with the
#: import-time fixes): a re-activation in the same process is not refused for them.
_BUILT_WITH_FIX: set[str] = set()


def remember_built_with_fix() -> None:
    """Call while active, before ``deactivate()``: the speculators modules loaded now
    were built with the import-time fixes."""
    _BUILT_WITH_FIX.update(imported_before())


def imported_before() -> frozenset[str]:
    """The speculators modules loaded now (call it before activation)."""
    return frozenset(m for m in list(sys.modules) if any(_under(m, r) for r in _ROOTS))


def check_import_order(report: Report, before: frozenset[str],
                       adapters: Iterable[Adapter]) -> None:
    """Raise :class:`CompatError` if an import-time adapter of the registry ``adapters``
    applied after the import it had to precede (``before``: :func:`imported_before` taken
    before activation)."""
    late = []
    for name, prefixes in import_time(adapters).items():
        try:
            result = report[name]
        except KeyError:
            continue
        if result.status is not Status.APPLIED:
            continue
        modules = sorted(m for m in before - _BUILT_WITH_FIX
                         if any(_under(m, p) for p in prefixes))
        if modules:
            late.append((name, modules))
    if not late:
        return
    details = "; ".join(f"{name} must act before {', '.join(mods[:3])}"
                        f"{' ...' if len(mods) > 3 else ''} is imported"
                        for name, mods in late)
    raise CompatError(
        f"speculators-compat: activate() was called after speculators was (partly) imported "
        f"in this process ({details}); those modules were built without the fix and stay "
        "broken. Move `import speculators_compat; speculators_compat.activate()` above every "
        "speculators import (the first lines of the script), or run the script unchanged "
        "with `speculators-compat run SCRIPT ARGS...` (or `... run -m MODULE ARGS...`). "
        "Nothing was patched.")
