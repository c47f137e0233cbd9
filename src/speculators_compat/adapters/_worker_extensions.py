"""The workers' hidden-state extension: which one a generator's workers must run, and
which one they do run (imports no adapter).

``hook_capture`` names the shim's extension (:data:`COMPAT_EXTENSIONS`) in the activation's
context (:data:`WORKER_EXTENSION_KEY`); ``generate_guard`` asks the workers which one they
run (:func:`running_extensions`) and refuses a mismatch. Adapters never import each
other, so what one produces and another reads lives in a module of its own like this
one; which adapter must have applied for another one to act is declared on the adapter
(``Adapter.requires``) and decided by the activation.
"""

from __future__ import annotations

from .._speculators import CONTRACT_BY_REQUEST, CONTRACT_LIST, WORKER_EXTENSION
from . import _probes

#: Key under which the activation's context holds the extension class the workers of a
#: generator built now must run (set by ``hook_capture`` when it applies; read by
#: ``generate_guard``, which defaults to speculators' own extension).
WORKER_EXTENSION_KEY = "worker_extension_cls"

#: The shim's worker extensions (``speculators_compat.worker_extension``), by the result
#: contract of the installed speculators, as ``ParallelConfig.worker_extension_cls`` names
#: them (by string: the class is imported in the worker only).
COMPAT_EXTENSIONS = {
    CONTRACT_LIST: "speculators_compat.worker_extension.ListContractExtension",
    CONTRACT_BY_REQUEST: "speculators_compat.worker_extension.ByRequestContractExtension",
}


def worker_classes(worker) -> list[str]:
    """Runs in each worker (``collective_rpc``): the qualified names of the classes the
    worker is made of, the ``worker_extension_cls`` vLLM mixed in among them."""
    inner = getattr(worker, "worker", None) or worker  # vLLM's WorkerWrapperBase
    return [f"{c.__module__}.{c.__qualname__}" for c in type(inner).__mro__]


def running_extensions(executor, timeout: float | None = None) -> list[list[str]]:
    """Per worker, the hidden-state extensions (speculators' or the shim's) it runs."""
    known = {WORKER_EXTENSION, *COMPAT_EXTENSIONS.values()}
    kwargs = {}
    if timeout is not None and "timeout" in (_probes.parameters(executor.collective_rpc)
                                             or {}):
        kwargs["timeout"] = timeout
    replies = executor.collective_rpc(worker_classes, **kwargs)
    return [[name for name in names if name in known] for names in replies]
