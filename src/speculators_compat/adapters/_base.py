"""Base for adapters that rebind names in speculators' generator module."""

from __future__ import annotations

from types import ModuleType

from .._adapter import Adapter, Context, Verdict
from .._patcher import Patcher
from . import _probes


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
