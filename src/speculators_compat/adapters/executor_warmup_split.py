"""``initialize_from_config`` no longer warms the model up (vLLM 0.27).

Why: from 0.27 the engine core calls ``compile_or_warm_up_model()`` separately after
``initialize_from_config``; speculators' generator calls only the latter, so the model
would run its first real batch un-warmed (on GPU: without the sampler/kernels warm-up
the engine expects). Warm-up runs the model on dummy data: the capture ignores it
(its hooks record only inside ``execute_model`` steps of scheduled requests, which
warm-up's dummy runs are not).
How: a hook of the generator's executor (``speculators_compat._executor``) calls
``compile_or_warm_up_model()`` after ``initialize_from_config`` when the release split it.
Applies when: the executor has ``compile_or_warm_up_model`` and ``initialize_from_config``
does not call it.
Remove when: speculators < 0.5 support is dropped.
"""

from __future__ import annotations

from types import ModuleType

from .._adapter import Context, Verdict
from . import _probes
from ._base import ExecutorFeature


class ExecutorWarmupSplit(ExecutorFeature):
    name = "executor_warmup_split"
    summary = "call compile_or_warm_up_model() after initialize_from_config()"
    upstream = ("vLLM 0.27.0: Executor.initialize_from_config no longer warms up "
                "(vllm/v1/executor/abstract.py)")
    vllm_range = ">=0.27.0.dev0"
    remove_when = "speculators < 0.5 support is dropped"

    def check(self, ctx: Context, gen: ModuleType) -> Verdict:
        ex = self.executor_class(gen)
        if not hasattr(ex, "compile_or_warm_up_model"):
            return Verdict.not_needed("the executor has no separate warm-up")
        if "compile_or_warm_up_model" in _probes.source(ex.initialize_from_config):
            return Verdict.not_needed("initialize_from_config still warms up")
        return Verdict.needed("initialize_from_config no longer warms up")

    def initialized(self, executor) -> None:
        executor.compile_or_warm_up_model()
