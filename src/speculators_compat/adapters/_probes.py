"""Probes: cheap looks at the installed speculators and vLLM that verdicts are built from.

Signatures, sources (read without importing where an import would cost), modules,
the platform; and speculators' generator module itself, imported once per activation.
Every probe is a pure read: nothing here changes anything.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
from types import ModuleType
from typing import Any

from .._adapter import Context, Verdict
from .._speculators import (
    CONTRACT_BY_REQUEST,
    CONTRACT_LIST,
    GENERATOR_MODULE,
    WORKER_MODULE,
)

_GENERATOR_AND_PARENTS = frozenset(
    GENERATOR_MODULE.rsplit(".", i)[0] for i in range(GENERATOR_MODULE.count(".") + 1))


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


def speculators_class(ctx: Context, module: str, name: str) -> type | None:
    """``module.name`` from the installed speculators, or None when speculators or that
    module is missing (the training-side adapters are then not needed)."""
    if ctx.versions.get("speculators") is None:
        return None
    try:
        return getattr(importlib.import_module(module), name, None)
    except ModuleNotFoundError:
        return None


#: vLLM's switch between the V1 model runner and Model Runner V2.
V2_SWITCH = "VLLM_USE_V2_MODEL_RUNNER"


def knows_v2_runner_switch() -> bool:
    """Whether the installed vLLM has :data:`V2_SWITCH` among its variables."""
    try:
        envs = importlib.import_module("vllm.envs")
    except ImportError:
        return False
    return V2_SWITCH in getattr(envs, "environment_variables", {})


#: transformers' config module (its config base: the ``transformers5_config_*`` adapters).
TRANSFORMERS_CONFIG = "transformers.configuration_utils"


def config_class() -> type | None:
    """transformers' config base (``PreTrainedConfig``; ``PretrainedConfig`` on 4.x)."""
    mod = importlib.import_module(TRANSFORMERS_CONFIG)
    return getattr(mod, "PreTrainedConfig", None) or getattr(mod, "PretrainedConfig", None)


def config_base(ctx: Context) -> tuple[type | None, Verdict | None]:
    """transformers' ``PreTrainedConfig``, or the verdict that ends a transformers-5 config
    probe before it looks further (transformers missing, or no such class). The three
    ``transformers5_config_*`` adapters start their probes with it."""
    if ctx.versions.get("transformers") is None:
        return None, Verdict.not_needed("transformers is not installed")
    base = config_class()
    if base is None:
        return None, Verdict.mismatch(f"{TRANSFORMERS_CONFIG} has no PreTrainedConfig")
    return base, None
