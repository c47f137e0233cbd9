"""Shared probes of the consumer (speculators' generator) and the installed vLLM.

Adapters patch names inside speculators' generator module, because that module
imported vLLM's symbols by name (``from vllm... import Scheduler``): rebinding
them there changes what speculators sees and nothing that vLLM's own engine uses.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
from types import ModuleType
from typing import Any

from .._core import Context

GENERATOR_MODULE = "speculators.data_generation.vllm_hidden_states_generator"
WORKER_MODULE = "speculators.data_generation.custom_worker"
WORKER_EXTENSION = f"{WORKER_MODULE}.HiddenStatesWorkerExtension"
_GENERATOR_AND_PARENTS = frozenset(
    GENERATOR_MODULE.rsplit(".", i)[0] for i in range(GENERATOR_MODULE.count(".") + 1))

#: speculators 0.4's offline-script metadata module (``get_device_name``).
CONFIG_MODULE = "speculators.data_generation.config_generator"


def in_generator(*names: str) -> tuple[str, ...]:
    """Declared targets (``Adapter.targets``) for names in speculators' generator module."""
    return tuple(f"{GENERATOR_MODULE}:{n}" for n in names)


#: What ``generate_guard.refuse_generator`` wraps when a fail-closed adapter refuses.
REFUSAL_TARGETS = in_generator("VllmHiddenStatesGenerator.__init__",
                               "VllmHiddenStatesGenerator.generate")

#: speculators' worker extension returns a list of per-layer tensors (0.3.x)...
CONTRACT_LIST = "list"
#: ... or a dict request id -> per-layer tensors, with per-step metadata (0.4.x).
CONTRACT_BY_REQUEST = "by_request"


def generator_module(ctx: Context) -> ModuleType | None:
    """speculators' generator module, imported once per activation (``None`` if absent)."""

    def load() -> ModuleType | None:
        try:
            return importlib.import_module(GENERATOR_MODULE)
        except ModuleNotFoundError as exc:
            # Only the generator (or a package above it) missing means "no generator";
            # a missing dependency of speculators is a real error and propagates.
            if exc.name not in _GENERATOR_AND_PARENTS:
                raise
            error = exc
            ctx.memo("generator_error", lambda: error)
            return None

    return ctx.memo("generator_module", load)


def generator_missing_reason(ctx: Context) -> str:
    err = ctx.memo("generator_error", lambda: None)
    spec = ctx.versions.get("speculators")
    if spec is None:
        return "speculators is not installed"
    return (f"speculators {spec} has no in-process generator ({GENERATOR_MODULE}: {err}); "
            "speculators >= 0.5 uses vLLM's own extract_hidden_states instead")


def worker_contract(ctx: Context) -> str | None:
    """Which result contract the installed speculators' worker extension implements."""

    def probe() -> str | None:
        try:
            mod = importlib.import_module(WORKER_MODULE)
        except ModuleNotFoundError:
            return None
        ext = getattr(mod, "HiddenStatesWorkerExtension", None)
        if ext is None:
            return None
        return CONTRACT_BY_REQUEST if hasattr(ext, "_set_request_metadata") else CONTRACT_LIST

    return ctx.memo("worker_contract", probe)


def parameters(obj: Any) -> dict[str, inspect.Parameter] | None:
    """Parameters of a callable (``__init__`` for classes), ``None`` if not inspectable."""
    try:
        return dict(inspect.signature(obj).parameters)
    except (TypeError, ValueError):
        return None


def required(param: inspect.Parameter | None) -> bool:
    return param is not None and param.default is inspect.Parameter.empty and param.kind not in (
        inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)


def source(obj: Any) -> str:
    try:
        return inspect.getsource(obj)
    except (OSError, TypeError):
        return ""


def consumer_passes(gen: ModuleType, text: str) -> bool:
    """Whether speculators' generator source contains ``text`` (e.g. a keyword argument
    it already passes itself): adapters that would only supply it are then not needed."""
    return text in source(gen)


def subclass(base: type, name_suffix: str, namespace: dict[str, Any]) -> type:
    """A thin subclass of ``base`` (whatever is currently bound in the consumer)."""
    ns = dict(namespace)
    ns.setdefault("__module__", "speculators_compat.adapters")
    ns.setdefault("__doc__", base.__doc__)
    cls = type(base.__name__, (base,), ns)
    cls.__qualname__ = f"{base.__qualname__}[compat:{name_suffix}]"
    return cls


def module_source(name: str) -> str | None:
    """Source text of a vLLM module, found without importing it (probes stay cheap:
    importing model modules would cost a noticeable part of ``import vllm``)."""
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.origin or not spec.origin.endswith(".py"):
        return None
    try:
        with open(spec.origin, encoding="utf-8") as f:
            return f.read()
    except OSError:
        return None


def has_module(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def is_cpu_platform() -> bool:
    from vllm.platforms import current_platform

    return bool(getattr(current_platform, "is_cpu", lambda: False)())


def has_cuda() -> bool:
    import torch

    return bool(torch.cuda.is_available())
