"""Bases for adapters that rebind names in speculators' generator module, and for the
features of the one executor it starts."""

from __future__ import annotations

from types import ModuleType

from .. import _executor
from .._adapter import Adapter, Context, Verdict
from .._patcher import Patcher
from . import _probes
from ._targets import in_generator


class GeneratorAdapter(Adapter):
    """Probes/patches the names speculators' ``VllmHiddenStatesGenerator`` looks up.

    Subclasses implement :meth:`check` and :meth:`patch`, which receive the
    generator module; when it is not importable the adapter is not needed.
    """

    def probe(self, ctx: Context) -> Verdict:
        if ctx.versions.get("vllm") is None:
            return Verdict.not_needed("vLLM is not installed")
        gen = _probes.generator_module(ctx)
        if gen is None:
            if ctx.versions.get("speculators") is not None:
                # speculators >= 0.5: installed, but this shim cannot help it.
                return Verdict.mismatch(_probes.generator_missing_reason(ctx))
            return Verdict.not_needed(_probes.generator_missing_reason(ctx))
        return self.check(ctx, gen)

    def apply(self, patcher: Patcher, ctx: Context) -> None:
        gen = _probes.generator_module(ctx)
        assert gen is not None
        self.patch(patcher, ctx, gen)

    def check(self, ctx: Context, gen: ModuleType) -> Verdict:  # pragma: no cover
        raise NotImplementedError

    def patch(self, patcher: Patcher, ctx: Context, gen: ModuleType) -> None:  # pragma: no cover
        raise NotImplementedError


class ExecutorFeature(GeneratorAdapter, _executor.ExecutorHooks):
    """A change to the executor speculators' generator starts, as hooks of the one
    :class:`~speculators_compat._executor.GeneratorExecutor` (never a subclass of its own).

    Subclasses implement :meth:`check` (probe vLLM's executor class with
    :meth:`executor_class`, which sees through the features installed before) and the
    hooks of :class:`~speculators_compat._executor.ExecutorHooks` they need, on the
    adapter itself or on the object :meth:`hooks` returns (for values computed at apply
    time). Where the order among features matters, declare it with ``after``.
    """

    targets = in_generator("MultiprocExecutor")

    @staticmethod
    def executor_class(gen: ModuleType) -> type:
        """vLLM's ``MultiprocExecutor`` as speculators' module reaches it."""
        return _executor.vllm_class(gen.MultiprocExecutor)

    def hooks(self, ctx: Context, gen: ModuleType) -> _executor.ExecutorHooks:
        """What this feature adds to the executor (default: the adapter's own hooks)."""
        return self

    def patch(self, patcher: Patcher, ctx: Context, gen: ModuleType) -> None:
        _executor.install(patcher, gen, self.name, self.hooks(ctx, gen))
