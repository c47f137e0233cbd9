"""Capture decoder-layer outputs with hooks instead of speculators' copied model forward.

Why: speculators' worker extension replaces ``base_model.forward`` with its own loop.
On vLLM 0.11.1+ that loop fails (``AttributeError: ... has no attribute
'get_input_embeddings'``: renamed ``embed_input_ids``); on DeepSeek-V2/V3 since 0.12 it
drops the ``llama_4_scaling`` the model's forward passes to every layer (silently wrong
for configs that set it); and where Model Runner V2 exists, rows come in the runner's
order, not the scheduler's (silently misattributed sequences on GPU).
How: speculators names its extension by string in ``ParallelConfig``; the rebound
``ParallelConfig`` in speculators' module names
:mod:`speculators_compat.worker_extension`'s class for the installed speculators'
result contract instead. It answers the same RPCs, captures with forward hooks on the
decoder layers and attributes rows with the runner's real batch layout. Pipeline
parallelism is refused here, before any worker starts, and so are the models the shim
knows it cannot run (:mod:`speculators_compat._model_support`: sliding-window + full
attention where vLLM's GPU build cannot group them, attention-residual blocks, the
hyper-connection streams of DeepSeek-V4, MiniMax-M3's layers that vLLM never calls as
modules; a config transformers cannot build is read as JSON), before any weights
load. The capture reads both the V1 runner's ``input_batch`` and Model Runner V2's
per-step batch; where the release has the switch, the generator's construction runs with
``VLLM_USE_V2_MODEL_RUNNER=0`` unless the user set it (V1 is the most tested path;
``=1`` is honoured), and the variable is restored afterwards (vLLM's own engines in the
same process are unaffected). vLLM 0.34
removed Model Runner V1 (and with it the switch): there the V2 path is the only one, and
the report says when a user's ``VLLM_USE_V2_MODEL_RUNNER=0`` cannot be honoured. Which
extension a live generator's workers really run is asked from the workers themselves
(``_worker_extensions.running_extensions``): ``generate_guard`` refuses a generator whose
workers run another one than the current activation names (one built before ``activate()``).
Applies when: the installed vLLM has any of the changes above.
Fails closed: when its probe finds an unknown shape or raises, building the generator
and ``generate()`` raise ``CompatError`` (opt out: ``SPECULATORS_COMPAT_DISABLE=hook_capture``).
Remove when: speculators < 0.5 support is dropped.
"""

from __future__ import annotations

import os
from types import ModuleType

from .._adapter import Context, Verdict
from .._errors import CompatError
from .._model_support import check_generator_model
from .._patcher import Patcher
from . import _probes, _refusal, _targets, _worker_extensions, _wrappers
from ._base import GeneratorAdapter


def _reasons(contract: str) -> list[str]:
    reasons = []
    llama = _probes.module_source("vllm.model_executor.models.llama") or ""
    wanted = "get_input_embeddings" if contract == _targets.CONTRACT_LIST else "embed_input_ids"
    if f"def {wanted}(" not in llama:
        reasons.append(f"base models have no {wanted}() (speculators' forward calls it)")
    deepseek = _probes.module_source("vllm.model_executor.models.deepseek_v2") or ""
    if "llama_4_scaling" in deepseek:
        reasons.append("DeepSeek-V2/V3 layers take llama_4_scaling, which speculators' "
                       "forward drops")
    if _probes.has_module("vllm.v1.worker.gpu.model_runner"):
        reasons.append("Model Runner V2 exists (rows in its own per-step order)")
    return reasons


class HookCapture(GeneratorAdapter):
    name = "hook_capture"
    fail_closed = True
    summary = "capture decoder-layer outputs with forward hooks, rows attributed by the runner"
    upstream = ("vLLM 0.11.1: embed_input_ids rename; 0.12: DeepseekV2DecoderLayer "
                "llama_4_scaling; 0.22+: Model Runner V2 (vllm/v1/worker/gpu/); 0.34: "
                "Model Runner V1 removed")
    vllm_range = ">=0.11.1.dev0"
    remove_when = "speculators < 0.5 support is dropped"
    targets = _targets.in_generator("ParallelConfig", "VllmHiddenStatesGenerator.__init__")
    refusal_targets = _targets.REFUSAL_TARGETS

    def check(self, ctx: Context, gen: ModuleType) -> Verdict:
        contract = _probes.worker_contract(ctx)
        if contract is None:
            return Verdict.mismatch("speculators' HiddenStatesWorkerExtension not found")
        if _targets.WORKER_EXTENSION not in _probes.source(gen):
            return Verdict.mismatch("speculators' generator does not name "
                                    f"{_targets.WORKER_EXTENSION}")
        reasons = _reasons(contract)
        if not reasons:
            return Verdict.not_needed("speculators' own forward loop matches this vLLM")
        pin = ("; V1 model runner pinned for the generator"
               if _probes.knows_v2_runner_switch() else "")
        if v1_runner_removed():
            pin = "; Model Runner V1 is gone from this vLLM: rows follow V2's batches"
            switch = _probes.V2_SWITCH
            if os.environ.get(switch, "1") != "1":
                pin += (f" ({switch}={os.environ[switch]} cannot be honoured: this "
                        "vLLM runs V2 whatever it says; unset it)")
        return Verdict.needed("; ".join(reasons) + f" -> hook capture ({contract} contract)"
                              + pin)

    def refuse(self, patcher: Patcher, ctx: Context, message: str) -> None:
        _refusal.refuse_generator(patcher, ctx, message)

    def patch(self, patcher: Patcher, ctx: Context, gen: ModuleType) -> None:
        ours = _worker_extensions.COMPAT_EXTENSIONS[_probes.worker_contract(ctx)]

        def wrapper(wrapped, instance, args, kwargs):
            if kwargs.get("worker_extension_cls") == _targets.WORKER_EXTENSION:
                kwargs["worker_extension_cls"] = ours
            pp = kwargs.get("pipeline_parallel_size", 1) or 1
            if pp > 1:
                raise CompatError(
                    f"speculators-compat: pipeline_parallel_size={pp} is not supported by the "
                    "hidden-state capture; use tensor_parallel_size instead.")
            return wrapped(*args, **kwargs)

        patcher.wrap(gen, "ParallelConfig", wrapper)
        patcher.wrap(gen.VllmHiddenStatesGenerator, "__init__", _refuse_unsupported_models)
        if _probes.knows_v2_runner_switch():
            # the generator (config + spawned workers) is built with the V1 model runner unless
            # the user chose (the worker then refuses V2 clearly)
            patcher.wrap(gen.VllmHiddenStatesGenerator, "__init__",
                         _wrappers.with_env_default(_probes.V2_SWITCH, "0"))
        # generate_guard checks the workers run it
        ctx.memo(_worker_extensions.WORKER_EXTENSION_KEY, lambda: ours)


def _refuse_unsupported_models(wrapped, instance, args, kwargs):
    """Before the generator loads anything: refuse models known not to run here."""
    path = kwargs.get("model_path", args[0] if args else None)
    if isinstance(path, str):
        check_generator_model(path)
    return wrapped(*args, **kwargs)



def v1_runner_removed() -> bool:
    """vLLM 0.34 removed Model Runner V1 (``vllm/v1/worker/gpu_model_runner.py``)."""
    return (_probes.has_module("vllm.v1.worker.gpu.model_runner")
            and not _probes.has_module("vllm.v1.worker.gpu_model_runner"))
