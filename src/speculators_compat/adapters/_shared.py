"""What several adapters share about the generator and vLLM's workers (imports no adapter).

Adapters never import each other: what one of them produces and another one reads
(the worker extension a generator's workers must run, the scheduler's abort-all method),
the refusal every fail-closed adapter installs, how the workers are asked which
extension they run, and vLLM's model-runner switch live here. Which adapter must have
applied for another one to act is declared on the adapter (``Adapter.requires``) and
decided by the activation, not by re-running another adapter's probe.
"""

from __future__ import annotations

import importlib

from .._adapter import Context
from .._errors import CompatError
from .._patcher import Patcher
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

#: Method of the ``Scheduler`` rebound by ``scheduler_prefill_only`` that aborts every
#: request at once, deferred ones included (``generate_guard``'s cleanup calls it).
ABORT_ALL = "_compat_abort_all"

#: vLLM's switch between the V1 model runner and Model Runner V2.
V2_SWITCH = "VLLM_USE_V2_MODEL_RUNNER"


def knows_v2_runner_switch() -> bool:
    """Whether the installed vLLM has :data:`V2_SWITCH` among its variables."""
    try:
        envs = importlib.import_module("vllm.envs")
    except ImportError:
        return False
    return V2_SWITCH in getattr(envs, "environment_variables", {})


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
