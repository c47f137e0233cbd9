"""Start the generator's workers with ``spawn`` (CUDA cannot be re-initialised after fork).

Why: speculators' generator initialises CUDA in the driver (e.g. the tokenizer/config
work, ``torch.cuda`` calls) and then starts ``MultiprocExecutor`` itself. vLLM forces
``spawn`` only on its own engine paths (``LLM``/``EngineCore``), so the default ``fork``
fails on a GPU machine: ``RuntimeError: Cannot re-initialize CUDA in forked
subprocess`` unless the user sets ``VLLM_WORKER_MULTIPROC_METHOD=spawn``.
How: wrap ``VllmHiddenStatesGenerator.__init__`` so the executor starts with
``VLLM_WORKER_MULTIPROC_METHOD=spawn`` unless the user set the variable; it is restored
afterwards, so vLLM's own engines in the same process keep their behaviour.
Applies when: the installed vLLM reads ``VLLM_WORKER_MULTIPROC_METHOD`` and the platform
is not CPU (vLLM's CPU platform sets ``spawn`` itself whenever a config is built, on
every release since 0.11).
Remove when: speculators < 0.5 support is dropped.
"""

from __future__ import annotations

import importlib
from types import ModuleType

from .._adapter import Context, Verdict
from .._patcher import Patcher
from .._report import Kind
from . import _probes, _targets, _wrappers
from ._base import GeneratorAdapter

VAR = "VLLM_WORKER_MULTIPROC_METHOD"


class WorkerSpawnMethod(GeneratorAdapter):
    name = "worker_spawn_method"
    kind = Kind.SAFEGUARD
    summary = "start the generator's vLLM workers with spawn, not fork"
    upstream = ("vLLM forces spawn only in LLM/EngineCore (_maybe_force_spawn); "
                "MultiprocExecutor used directly forks by default")
    vllm_range = None
    remove_when = "speculators < 0.5 support is dropped"
    targets = _targets.in_generator("VllmHiddenStatesGenerator.__init__")
    #: Outside spawn_main_guard's __init__ wrapper, which must see the start method set here.
    after = ("spawn_main_guard",)

    def check(self, ctx: Context, gen: ModuleType) -> Verdict:
        envs = importlib.import_module("vllm.envs")
        if VAR not in getattr(envs, "environment_variables", {}):
            return Verdict.mismatch(f"vLLM does not read {VAR}")
        if _probes.is_cpu_platform():
            return Verdict.not_needed(f"the CPU platform sets {VAR}=spawn itself when the "
                                      "generator builds its config")
        # Decided per generator construction, not here: vLLM's CPU platform itself sets the
        # variable as a side effect of building a config, so its presence now says nothing
        # about the user's choice.
        return Verdict.needed("the generator starts MultiprocExecutor directly; its workers "
                              f"start with spawn unless {VAR} is set when it is built")

    def patch(self, patcher: Patcher, ctx: Context, gen: ModuleType) -> None:
        patcher.wrap(gen.VllmHiddenStatesGenerator, "__init__",
                     _wrappers.with_env_default(VAR, "spawn"))
