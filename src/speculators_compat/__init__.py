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

from ._errors import CompatError, UnsupportedError
from ._process import activate, deactivate, report, save_report
from ._report import Kind, Report, Status

__version__ = "0.3.0.dev0"
__all__ = ["activate", "deactivate", "report", "save_report", "CompatError", "Kind",
           "Report", "Status", "UnsupportedError", "__version__"]

logging.getLogger("speculators_compat").addHandler(logging.NullHandler())
