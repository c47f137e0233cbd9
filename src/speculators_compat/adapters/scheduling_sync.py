"""Keep speculators' step loop synchronous: ``async_scheduling`` defaults on since 0.14.

Why: vLLM 0.14.0 resolves ``SchedulerConfig.async_scheduling`` to ``True`` for the mp/uni
executors; workers then return asynchronous outputs and overlap steps. speculators'
generator drives ``schedule()``/``execute_model()`` itself, one step at a time, and was
written for the synchronous engine of its pinned releases.
How: the rebound ``SchedulerConfig`` in speculators' module passes
``async_scheduling=False`` unless the caller chose a value.
Applies when: ``SchedulerConfig`` has an ``async_scheduling`` field.
Remove when: speculators < 0.5 support is dropped.
"""

from __future__ import annotations

from types import ModuleType

from .._adapter import Context, Verdict
from .._patcher import Patcher
from . import _probes, _targets, _wrappers
from ._base import GeneratorAdapter


class SchedulingSync(GeneratorAdapter):
    name = "scheduling_sync"
    summary = "build speculators' SchedulerConfig with async_scheduling=False"
    upstream = "vLLM 0.14.0: async_scheduling resolves to True for mp/uni executors"
    vllm_range = ">=0.14.0.dev0"
    remove_when = "speculators < 0.5 support is dropped"
    targets = _targets.in_generator("SchedulerConfig")

    def check(self, ctx: Context, gen: ModuleType) -> Verdict:
        params = _probes.parameters(gen.SchedulerConfig) or {}
        if "async_scheduling" not in params:
            return Verdict.not_needed("SchedulerConfig has no async_scheduling field")
        if params["async_scheduling"].default is False:
            return Verdict.not_needed("SchedulerConfig.async_scheduling defaults to False")
        return Verdict.needed("SchedulerConfig.async_scheduling exists; pin it off for the "
                              "generator's own synchronous step loop")

    def patch(self, patcher: Patcher, ctx: Context, gen: ModuleType) -> None:
        patcher.wrap(gen, "SchedulerConfig", _wrappers.default_kwarg("async_scheduling", False))
