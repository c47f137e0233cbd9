"""``execute_model`` / ``sample_tokens`` two-phase split (vLLM 0.11.1).

Why: since 0.11.1 ``execute_model`` returns ``None`` on the normal path and
``sample_tokens(grammar_output)`` must follow before the next step; speculators 0.3.0
never calls it: ``RuntimeError: State error: sample_tokens() must be called after
execute_model() returns None.`` (Model Runner V2 has no such check and silently
overwrites state.) speculators 0.4 calls ``sample_tokens`` itself.
How: the ``MultiprocExecutor`` seen by speculators' module completes the step inside
``execute_model`` (``sample_tokens(None)`` when it returned ``None``) and answers a
following ``sample_tokens`` call of the same step with that output, so both the 0.3
(one call) and 0.4 (two calls) loops do exactly one sample per step.
Applies when: the executor has ``sample_tokens`` and the installed speculators' generator
does not call it (0.3.x).
Remove when: speculators 0.3.x support is dropped.
"""

from __future__ import annotations

from types import ModuleType

from .._adapter import Context, Verdict
from .._patcher import Patcher
from . import _helpers, _probes, _targets
from ._base import GeneratorAdapter

_NOTHING = object()


class ExecutorSampleTokens(GeneratorAdapter):
    name = "executor_sample_tokens"
    summary = "complete each step with sample_tokens() inside execute_model()"
    upstream = ("vLLM 0.11.1: execute_model()/sample_tokens() split "
                "(vllm/v1/executor/abstract.py)")
    vllm_range = ">=0.11.1.dev0"
    remove_when = "speculators 0.3.x support is dropped"
    targets = _targets.in_generator("MultiprocExecutor")

    def check(self, ctx: Context, gen: ModuleType) -> Verdict:
        if not hasattr(gen.MultiprocExecutor, "sample_tokens"):
            return Verdict.not_needed("the executor has no sample_tokens(): one-phase steps")
        if _probes.consumer_passes(gen, ".sample_tokens("):
            return Verdict.not_needed("two-phase steps; this speculators calls "
                                      "sample_tokens() itself")
        return Verdict.needed("execute_model() returns None until sample_tokens() is called")

    def patch(self, patcher: Patcher, ctx: Context, gen: ModuleType) -> None:
        base = gen.MultiprocExecutor

        def execute_model(self, scheduler_output, *args, **kwargs):
            out = base.execute_model(self, scheduler_output, *args, **kwargs)
            if out is None:
                out = base.sample_tokens(self, None)
                self._compat_sampled = out
            else:
                self._compat_sampled = _NOTHING
            return out

        def sample_tokens(self, grammar_output=None, *args, **kwargs):
            done = getattr(self, "_compat_sampled", _NOTHING)
            if done is not _NOTHING:
                self._compat_sampled = _NOTHING
                return done
            return base.sample_tokens(self, grammar_output, *args, **kwargs)

        patcher.setattr(gen, "MultiprocExecutor", _helpers.subclass(
            base, self.name, {"execute_model": execute_model, "sample_tokens": sample_tokens}))
