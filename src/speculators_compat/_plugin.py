"""``vllm.general_plugins`` entry point: carries activation into vLLM's processes.

vLLM calls every registered general plugin in each worker process
(``WorkerWrapperBase.init_worker``, before the worker class and
``worker_extension_cls`` are resolved and before the model is built). Workers are
spawned, not forked, on CPU and whenever CUDA is initialised in the parent, so
patches made in the parent do not reach them: this hook re-applies activation there.

It acts only when the parent activated (``SPECULATORS_COMPAT_ACTIVE=1``, set by
``activate()`` and inherited by spawned processes). Installed but not activated,
it does nothing at all: a plain ``vllm serve`` is untouched. It must be
re-entrant: vLLM may call it more than once per process.
"""

from __future__ import annotations

import os

from . import _env


def register() -> None:
    """Entry point body (vLLM ignores the return value)."""
    if not _env.flag(os.environ.get(_env.ACTIVE)):
        return
    from ._process import activate_worker

    activate_worker()
