"""``execute_model`` / ``sample_tokens`` two-phase split (vLLM 0.11.1).

Why: since 0.11.1 ``execute_model`` returns ``None`` on the normal path and
``sample_tokens(grammar_output)`` must follow before the next step; speculators 0.3.0
never calls it: ``RuntimeError: State error: sample_tokens() must be called after
execute_model() returns None.`` (Model Runner V2 has no such check and silently
overwrites state.) speculators 0.4 calls ``sample_tokens`` itself.
How: a hook of the generator's executor (``speculators_compat._executor``) completes the
step inside ``execute_model`` (``sample_tokens(None)`` when it returned ``None``) and answers a
following ``sample_tokens`` call of the same step with that output, so both the 0.3
(one call) and 0.4 (two calls) loops do exactly one sample per step.
Applies when: the executor has ``sample_tokens`` and the installed speculators' generator
does not call it (0.3.x).
Remove when: speculators 0.3.x support is dropped.
"""

from __future__ import annotations

from types import ModuleType

from .. import _executor
from .._adapter import Context, Verdict
from . import _probes
from ._base import ExecutorFeature


class ExecutorSampleTokens(ExecutorFeature):
    name = "executor_sample_tokens"
    summary = "complete each step with sample_tokens() inside execute_model()"
    upstream = ("vLLM 0.11.1: execute_model()/sample_tokens() split "
                "(vllm/v1/executor/abstract.py)")
    vllm_range = ">=0.11.1.dev0"
    remove_when = "speculators 0.3.x support is dropped"

    def check(self, ctx: Context, gen: ModuleType) -> Verdict:
        if not hasattr(self.executor_class(gen), "sample_tokens"):
            return Verdict.not_needed("the executor has no sample_tokens(): one-phase steps")
        if _probes.consumer_passes(gen, ".sample_tokens("):
            return Verdict.not_needed("two-phase steps; this speculators calls "
                                      "sample_tokens() itself")
        return Verdict.needed("execute_model() returns None until sample_tokens() is called")

    def execute_model(self, executor, call, scheduler_output, *args, **kwargs):
        out = call(scheduler_output, *args, **kwargs)
        if out is None:
            out = executor.compat_sampled = executor.compat_vllm("sample_tokens")(None)
        else:
            executor.compat_sampled = _executor.NOTHING
        return out

    def sample_tokens(self, executor, call, grammar_output=None, *args, **kwargs):
        done = executor.compat_sampled
        if done is not _executor.NOTHING:
            executor.compat_sampled = _executor.NOTHING
            return done
        return call(grammar_output, *args, **kwargs)
