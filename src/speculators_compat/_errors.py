"""The errors a user can act on (shared by every module, so it imports nothing)."""

from __future__ import annotations


class CompatError(RuntimeError):
    """An error the user can act on: says what is wrong and what to do."""


class UnsupportedError(CompatError):
    """Raised by a probe when the installation is one the shim cannot help at all.

    ``activate()`` in the driver re-raises it (after undoing anything applied), strict
    or not; in worker processes it is only reported.
    """


class DraftLayersWarning(UserWarning):
    """An EAGLE-3 draft may be served with other target layers than it was trained on
    (or which ones it was trained on cannot be told); the message says what to do."""
