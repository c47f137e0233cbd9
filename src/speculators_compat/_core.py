"""Former home of the activation core, kept as a re-export (code and tests import it).

The core is split by job: :mod:`._patcher` (the undo log), :mod:`._report` (Status,
Kind, AdapterResult, Report), :mod:`._adapter` (Adapter, Phase, Stage, Verdict,
Context), :mod:`._errors` and :mod:`._activation` (running the adapters; the
process-wide state). New code imports from those modules.
"""

from __future__ import annotations

from ._activation import Activation
from ._adapter import Adapter, Context, Phase, Stage, Verdict
from ._errors import CompatError, UnsupportedError
from ._patcher import Patcher, _label, env_default, target_of, with_env_default
from ._report import AdapterResult, Kind, Report, Status

__all__ = ["Activation", "Adapter", "AdapterResult", "CompatError", "Context", "Kind", "Patcher",
           "Phase", "Report", "Stage", "Status", "UnsupportedError", "Verdict", "_label",
           "env_default", "target_of", "with_env_default"]
