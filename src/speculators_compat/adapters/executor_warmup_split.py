"""``initialize_from_config`` no longer warms the model up (vLLM 0.27).

Why: from 0.27 the engine core calls ``compile_or_warm_up_model()`` separately after
``initialize_from_config``; speculators' generator calls only the latter, so the model
would run its first real batch un-warmed (on GPU: without the sampler/kernels warm-up
the engine expects). Warm-up runs the model on dummy data: the capture ignores it
(its hooks record only inside ``execute_model`` steps of scheduled requests, which
warm-up's dummy runs are not).
How: the ``MultiprocExecutor`` seen by speculators' module calls
``compile_or_warm_up_model()`` after ``initialize_from_config`` when the release split it.
Applies when: the executor has ``compile_or_warm_up_model`` and ``initialize_from_config``
does not call it.
Remove when: speculators < 0.5 support is dropped.
"""

from __future__ import annotations

from types import ModuleType

from .._adapter import Context, Verdict
from .._patcher import Patcher
from . import _helpers, _probes, _targets
from ._base import GeneratorAdapter


class ExecutorWarmupSplit(GeneratorAdapter):
    name = "executor_warmup_split"
    summary = "call compile_or_warm_up_model() after initialize_from_config()"
    upstream = ("vLLM 0.27.0: Executor.initialize_from_config no longer warms up "
                "(vllm/v1/executor/abstract.py)")
    vllm_range = ">=0.27.0.dev0"
    remove_when = "speculators < 0.5 support is dropped"
    targets = _targets.in_generator("MultiprocExecutor")

    def check(self, ctx: Context, gen: ModuleType) -> Verdict:
        ex = gen.MultiprocExecutor
        if not hasattr(ex, "compile_or_warm_up_model"):
            return Verdict.not_needed("the executor has no separate warm-up")
        if "compile_or_warm_up_model" in _probes.source(ex.initialize_from_config):
            return Verdict.not_needed("initialize_from_config still warms up")
        return Verdict.needed("initialize_from_config no longer warms up")

    def patch(self, patcher: Patcher, ctx: Context, gen: ModuleType) -> None:
        base = gen.MultiprocExecutor

        def initialize_from_config(self, kv_cache_configs, *args, **kwargs):
            out = base.initialize_from_config(self, kv_cache_configs, *args, **kwargs)
            self.compile_or_warm_up_model()
            return out

        patcher.setattr(gen, "MultiprocExecutor", _helpers.subclass(
            base, self.name, {"initialize_from_config": initialize_from_config}))
