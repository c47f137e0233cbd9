"""Contract tests: every adapter against the real installed vLLM and speculators.

No mocks: these run inside an environment built by ``tools/envs.py`` (a vLLM CPU
build, one speculators release on ``PYTHONPATH``) and skip elsewhere. No engine is
started and no model runs; the only heavy objects are ``VllmConfig``s built from a
tiny checkpoint, vLLM's own ``Scheduler`` (which needs no worker) and KV-cache configs.

For every adapter in ``speculators_compat.adapters.ADAPTERS`` they check:

1. the probe agrees with an explicit expectation table written from
   the upstream changes each adapter documents (docs/adapters.md) and the installed
   versions (a future vLLM that changes
   shape fails here, loudly), and the adapter's declared ranges agree with it;
2. apply-then-revert restores every touched namespace to the identical objects, and
   while active, vLLM's own modules/classes are untouched (only names the report
   lists changed);
3. speculators' legacy call shape fails (or is wrong) on the bare release where
   the adapter's upstream note says so, and works through the adapter's rebound name;
4. activating everything leaves vLLM's own objects identical, strict mode included.

Every activation here is a fresh ``Activation``; the package-global
``speculators_compat.activate()`` is never used (it would stay active for the session).
"""

from __future__ import annotations

import builtins
import contextlib
import dataclasses
import importlib
import importlib.util
import inspect
import os
import sys
from collections import Counter
from collections.abc import Callable, Iterator
from types import ModuleType

import pytest
from helpers import checkpoint, installed, require_speculators, vllm_version
from packaging.version import Version

from speculators_compat import _env, _versions
from speculators_compat._core import Activation, Adapter, CompatError, Report, Status, _label
from speculators_compat.adapters import ADAPTERS
from speculators_compat.adapters.kv_cache_helpers_relocated import KVCacheHelpersRelocated
from speculators_compat.adapters.transformers5_config_torch import Transformers5ConfigTorch

GEN = "speculators.data_generation.vllm_hidden_states_generator"
KV_UTILS = "vllm.v1.core.kv_cache_utils"
TF_CONFIG = "transformers.configuration_utils"
#: speculators' config generator (offline script metadata; no_gpu_kv_sizing wraps a name there).
CONFIG_GEN = "speculators.data_generation.config_generator"
SPECULATORS_EXTENSION = "speculators.data_generation.custom_worker.HiddenStatesWorkerExtension"
#: speculators' generator constants (identical in 0.3.0 and 0.4.x on CPU).
MAX_NUM_SEQS = 32
MAX_MODEL_LEN = 512
#: Keys a module namespace may gain from just running code (warnings bookkeeping).
IGNORED_KEYS = frozenset({"__warningregistry__"})

#: vLLM variables adapters treat as the user's choice; the suite runs without them.
USER_CHOICES = ("VLLM_WORKER_MULTIPROC_METHOD", "VLLM_USE_V2_MODEL_RUNNER")

ADAPTER_NAMES = [a.name for a in ADAPTERS]
BY_NAME: dict[str, Adapter] = {a.name: a for a in ADAPTERS}
#: Adapters that must act before ``import speculators`` / the generator import; the
#: module fixture holds them active, so their own tests suspend it first.
PRE_IMPORT = ("transformers5_config_torch", "kv_cache_helpers_relocated")

APPLIED, NOT_NEEDED = Status.APPLIED, Status.NOT_NEEDED


def V(s: str) -> Version:
    return Version(s)


# --------------------------------------------------------------------------------------
# The installed environment and the expectation table
# --------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Env:
    vllm: Version
    speculators: Version
    transformers_major: int
    cpu_platform: bool
    cuda: bool

    @property
    def speculators_03(self) -> bool:
        return V("0.3.0.dev0") <= self.speculators < V("0.4.0.dev0")

    @property
    def speculators_04(self) -> bool:
        return V("0.4.0.dev0") <= self.speculators < V("0.5.0.dev0")

    def __str__(self) -> str:
        return (f"vllm {self.vllm}, speculators {self.speculators}, transformers "
                f"{self.transformers_major}.x, cpu_platform={self.cpu_platform}, "
                f"cuda={self.cuda}")


def _status(applied: bool) -> Status:
    return APPLIED if applied else NOT_NEEDED


def _cpu_block_size(e: Env) -> Status | None:
    # The probe reads the CPU attention module's source (importing the backend at
    # activate() would cost ~1 s); here the imported backend answers instead:
    #  0.11-0.20: no declared kernel block sizes (any size, 16 kept);
    #  0.24/0.28: [MultipleOf(16)] (16 kept); 0.29+ nightlies, 0.32: [MultipleOf(32)].
    from speculators_compat.adapters.cpu_block_size import cpu_accepts_16

    return _status(e.cpu_platform and not cpu_accepts_16())


def _kv_engine_sets(e: Env) -> Status:
    # upstream: layout resolution "~0.29+", KVCacheConfig fields "0.29-0.32";
    # verified: absent in 0.16, present in 0.32.
    return _status(e.vllm >= V("0.29.0.dev0"))


#: adapter name -> (expected status for an env, or None when no expectation is
#: recorded for that release; why).
EXPECTED: dict[str, tuple[Callable[[Env], Status | None], str]] = {
    "transformers5_config_torch": (
        lambda e: _status(e.transformers_major >= 5),
        "transformers 5 annotates PretrainedConfig.dtype with torch imported only under "
        "TYPE_CHECKING: `import speculators` raises PydanticUndefinedAnnotation"),
    "kv_cache_helpers_relocated": (
        lambda e: _status(e.vllm >= V("0.33.0.dev0")),
        "0.33 moved _get_kv_cache_groups_uniform_spec & co. to kv_cache_planning"),
    "scheduler_config_encoder_decoder": (
        lambda e: _status(e.vllm >= V("0.12.0.dev0") and e.speculators_03),
        "SchedulerConfig.is_encoder_decoder is a required InitVar from 0.12 (0.4 passes it)"),
    "scheduling_sync": (
        lambda e: _status(e.vllm >= V("0.14.0.dev0")),
        "async_scheduling resolves to True for mp/uni executors from 0.14"),
    "prefix_caching_off": (
        lambda e: _status(e.vllm >= V("0.12.0.dev0") and e.speculators_03),
        "CacheConfig.enable_prefix_caching defaults to True from 0.12 (0.4 sets it off)"),
    "cpu_block_size": (
        _cpu_block_size,
        "CPU attention kernels accept MultipleOf(32) only (0.29+); 16 worked before"),
    "kv_cache_specs_kwarg": (
        lambda e: _status(e.vllm >= V("0.12.0.dev0") and e.speculators_03),
        "get_kv_cache_config_from_groups lost kv_cache_specs= in 0.12 (0.4 does not pass it)"),
    "kv_cache_config_fields": (
        _kv_engine_sets,
        "KVCacheConfig gained engine-set kv_cache_layout/hash_block_size/... (0.29-0.32)"),
    "no_gpu_kv_sizing": (
        lambda e: _status(not e.cuda and e.cpu_platform),
        "speculators sizes the KV cache from CUDA free memory; no CUDA here"),
    "scheduler_block_size": (
        lambda e: _status(e.vllm >= V("0.11.1.dev0")),
        "Scheduler.__init__ requires block_size from 0.11.1"),
    "scheduler_prefill_only": (
        # A speculators hazard, not a vLLM change: speculators never calls
        # update_from_output, so prefilled requests stay `running` on every V1
        # scheduler (>max_num_seqs sequences never scheduled in 0.4; chunked prompts
        # aborted mid-prefill in 0.3). Not for 0.3 on 0.11.x, where SchedulerConfig leaves
        # chunked prefill off by default (0.3's loop finishes what it scheduled).
        lambda e: _status(not (e.speculators_03 and e.vllm < V("0.12.0.dev0"))),
        "speculators' step loop never finishes prefilled requests (V1, chunked prefill)"),
    "request_eos_token_id": (
        lambda e: _status(e.vllm >= V("0.17.0.dev0")),
        "Request.__init__ lost eos_token_id in 0.17"),
    "kv_cache_layout_resolution": (
        _kv_engine_sets,
        "the engine core resolves one KV cache layout before KV configs (~0.29+)"),
    "executor_sample_tokens": (
        lambda e: _status(e.vllm >= V("0.11.1.dev0") and e.speculators_03),
        "execute_model/sample_tokens two-phase split in 0.11.1 (0.4 calls sample_tokens)"),
    "collective_rpc_unique_reply": (
        lambda e: _status(e.vllm >= V("0.11.1.dev0") and e.speculators_03),
        "unique_reply_rank returns a single result from 0.11.1; only 0.3.x indexes [0]"),
    "executor_warmup_split": (
        lambda e: _status(e.vllm >= V("0.27.0.dev0")),
        "initialize_from_config no longer warms up from 0.27"),
    "hook_capture": (
        # 0.3 contract: get_input_embeddings -> embed_input_ids (0.11.1);
        # 0.4 contract: DeepseekV2 llama_4_scaling (0.12) and Model Runner V2.
        lambda e: _status(e.vllm >= (V("0.11.1.dev0") if e.speculators_03
                                     else V("0.12.0.dev0"))),
        "speculators' copied model forward no longer matches vLLM's models"),
    "result_order_natural": (
        lambda e: _status(e.speculators_04),
        "speculators 0.4.x orders results by request ids sorted as strings"),
    "speculators_supported": (
        # A scope check that never patches: not-needed for releases with the in-process
        # generator (0.3/0.4); raises UnsupportedError for >= 0.5 (not installable here).
        lambda e: NOT_NEEDED if e.speculators < V("0.5.0.dev0") else None,
        "speculators 0.5 replaced the in-process generator"),
    "worker_spawn_method": (
        # The suite runs with VLLM_WORKER_MULTIPROC_METHOD unset (as a user would); vLLM
        # forces spawn only on its own engine paths, not for a MultiprocExecutor built
        # directly; but on CPU, building a VllmConfig sets it as a side effect.
        lambda e: _status(not e.cpu_platform),
        "the generator starts MultiprocExecutor itself; fork breaks with CUDA initialised"),
    "shm_transport": (
        # Follows hook_capture (the shim's extension answers its RPCs); this machine has
        # memfd_create and a readable /proc/<pid>/fd.
        lambda e: _status(e.vllm >= (V("0.11.1.dev0") if e.speculators_03
                                     else V("0.12.0.dev0"))),
        "vLLM pickles collective_rpc replies (CUDA tensors through torch.save)"),
    "generate_guard": (
        # speculators' own generate() hazard, independent of the vLLM release.
        lambda e: _status(e.speculators < V("0.5.0.dev0")),
        "generate() adds requests before running; a failure leaks into the next call"),
}


# --------------------------------------------------------------------------------------
# Fixtures and helpers
# --------------------------------------------------------------------------------------


@dataclasses.dataclass
class Base:
    """What the module fixture holds active so speculators' generator imports."""

    activations: list[Activation]
    gen: ModuleType
    env: Env

    @contextlib.contextmanager
    def suspended(self) -> Iterator[None]:
        """Deactivate the pre-import adapters (generator stays imported)."""
        for act in reversed(self.activations):
            act.deactivate()
        try:
            yield
        finally:
            for act in self.activations:
                act.activate(process="driver")


@contextlib.contextmanager
def activated(*adapters: Adapter, strict: bool = False) -> Iterator[Report]:
    """A fresh activation over exactly ``adapters``; deactivated on exit."""
    act = Activation(lambda: list(adapters))
    report = act.activate(process="driver", strict=strict)
    try:
        yield report
    finally:
        act.deactivate()


@contextlib.contextmanager
def _deactivating(act: Activation) -> Iterator[Report]:
    """``act`` activated in the driver for the block (its ``touched`` stays readable)."""
    report = act.activate(process="driver")
    try:
        yield report
    finally:
        act.deactivate()


def _env_facts() -> Env:
    import torch
    from vllm.platforms import current_platform

    tf = _versions.parse(installed("transformers"))
    return Env(
        vllm=Version(vllm_version().public),
        speculators=Version(_versions.parse(installed("speculators")).public),
        transformers_major=tf.major if tf is not None else 0,
        cpu_platform=bool(current_platform.is_cpu()),
        cuda=bool(torch.cuda.is_available()),
    )


@pytest.fixture(scope="module")
def base() -> Iterator[Base]:
    require_speculators()
    # Activation reads these; the suite must not inherit a user's settings.
    names = (_env.DISABLE, _env.STRICT, _env.REPORT_FILE, _env.ACTIVE, "VLLM_CACHE_ROOT",
             *USER_CHOICES)
    saved = {k: os.environ.pop(k) for k in names if k in os.environ}
    # vLLM caches model-class inspection under $VLLM_CACHE_ROOT/modelinfos keyed by
    # architecture only (the file hash is checked on read), so envs of different vLLM
    # releases sharing the default root evict each other and every ModelConfig then
    # re-inspects in a subprocess (~15 s). One root per release, unless the user set one.
    os.environ["VLLM_CACHE_ROOT"] = saved.get("VLLM_CACHE_ROOT") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "vllm",
        "speculators-compat-contract", str(vllm_version()))
    activations = [Activation(lambda: [Transformers5ConfigTorch()])]
    activations[0].activate(process="driver")
    try:
        try:
            gen = importlib.import_module(GEN)
        except ImportError:
            # vLLM >= 0.33: the generator's own imports need the relocated helpers.
            activations.append(Activation(lambda: [KVCacheHelpersRelocated()]))
            activations[-1].activate(process="driver")
            gen = importlib.import_module(GEN)
        env = _env_facts()
        # Warm-up: run every probe once so lazy imports / caches they trigger happen
        # before any namespace snapshot (they are not changes made by an adapter).
        with activated(*ADAPTERS):
            pass
        yield Base(activations, gen, env)
    finally:
        for act in reversed(activations):
            act.deactivate()
        for k in names:
            os.environ.pop(k, None)
        os.environ.update(saved)


@contextlib.contextmanager
def adapter_context(base: Base, name: str) -> Iterator[None]:
    """Pre-import adapters are probed with the module fixture's copies suspended."""
    if name in PRE_IMPORT:
        with base.suspended():
            yield
    else:
        yield


def expected_status(name: str, env: Env) -> Status:
    fn, why = EXPECTED[name]
    status = fn(env)
    if status is None:
        pytest.fail(f"no expectation recorded for {name} on {env}: read the installed "
                    f"vLLM source and add it to EXPECTED ({why})")
    return status


# -- namespaces -----------------------------------------------------------------------


def _vllm_owned() -> dict[str, object]:
    """vLLM's own modules and classes speculators' generator reaches (and their homes)."""
    import vllm.config as vc
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.executor.abstract import Executor
    from vllm.v1.executor.multiproc_executor import MultiprocExecutor
    from vllm.v1.kv_cache_interface import KVCacheConfig
    from vllm.v1.request import Request
    from vllm.v1.structured_output import StructuredOutputManager

    classes = [Scheduler, Request, vc.SchedulerConfig, vc.CacheConfig, vc.ParallelConfig,
               vc.ModelConfig, vc.VllmConfig, MultiprocExecutor, Executor, KVCacheConfig,
               StructuredOutputManager]
    owned: dict[str, object] = {}
    for cls in classes:
        owned[f"{cls.__module__}.{cls.__qualname__}"] = cls
        owned[cls.__module__] = sys.modules[cls.__module__]
    for mod in ("vllm.config", KV_UTILS, "vllm.v1.core.sched.scheduler", "vllm.v1.request",
                "vllm.v1.executor.multiproc_executor", "vllm.sampling_params", "torch",
                "torch.cuda"):
        owned[mod] = importlib.import_module(mod)
    return owned


def _consumer_owned(gen: ModuleType) -> dict[str, object]:
    """Namespaces adapters may change, labelled as the patcher labels them."""
    spaces = [gen, gen.VllmHiddenStatesGenerator, importlib.import_module(KV_UTILS),
              importlib.import_module(TF_CONFIG), importlib.import_module(CONFIG_GEN)]
    return {_label(obj): obj for obj in spaces}


#: Variables vLLM's own modules set when first imported (not the shim's doing; which
#: import comes first depends on test order): e.g. vllm._aiter_ops syncs AITER_SITUV2_*.
IMPORT_SIDE_EFFECT_ENV = ("AITER_",)


def snapshot(spaces: dict[str, object]) -> dict[str, dict]:
    snap = {label: dict(vars(obj)) for label, obj in spaces.items()}
    snap["os.environ"] = {k: v for k, v in os.environ.items()
                          if not k.startswith(IMPORT_SIDE_EFFECT_ENV)}
    return snap


def diff(before: dict[str, dict], after: dict[str, dict]) -> set[str]:
    """``namespace.key`` labels whose binding is not the identical object any more."""
    changed = set()
    for label, old in before.items():
        new = after[label]
        for key in (old.keys() | new.keys()) - IGNORED_KEYS:
            if key not in old or key not in new:
                differs = True
            elif label == "os.environ":  # os.environ decodes a new str on every read
                differs = old[key] != new[key]
            else:
                differs = old[key] is not new[key]
            if differs:
                changed.add(f"os.environ[{key!r}]" if label == "os.environ"
                            else f"{label}.{key}")
    return changed


def report_changes(report: Report, name: str) -> set[str]:
    return {c for c in report[name].changes if not c.startswith("os.environ")}


# -- vLLM objects built the way speculators builds them --------------------------------


def platform_detected() -> bool:
    from vllm.platforms import current_platform

    return bool(getattr(current_platform, "device_type", ""))  # "" for UnspecifiedPlatform


def require_platform() -> None:
    """Skip where vLLM found no platform (PyPI's CUDA build on a machine without a GPU:
    ``DeviceConfig`` raises "Failed to infer device type"): only the probe-level tests
    run there (the support matrix's contract level)."""
    if not platform_detected():
        pytest.skip("vLLM detects no platform here (CUDA build, no GPU): configs, KV caches "
                    "and schedulers cannot be built; probes are checked by the other tests")


def build_vllm_config(**kw):
    """:func:`_build_vllm_config`, undoing the CPU platform's process-wide side effect:
    ``check_and_update_config`` sets ``VLLM_WORKER_MULTIPROC_METHOD=spawn`` (and
    ``NUMEXPR_MAX_THREADS``) in ``os.environ``, which would change later verdicts."""
    require_platform()
    saved = dict(os.environ)
    try:
        return _build_vllm_config(**kw)
    finally:
        for k in set(os.environ) - set(saved):
            del os.environ[k]
        os.environ.update(saved)


def _build_vllm_config(*, max_num_batched_tokens: int = 8192, cache_config=None):
    """``VllmHiddenStatesGenerator._create_vllm_config`` (0.4 shape), from vLLM's own
    classes, for the tiny llama checkpoint. The KV block size is left to the platform
    (speculators' hard-coded 16 is the cpu_block_size adapter's business)."""
    import vllm.config as vc

    ckpt = checkpoint("llama")
    sched_kwargs = dict(max_num_seqs=MAX_NUM_SEQS, max_model_len=MAX_MODEL_LEN,
                        max_num_batched_tokens=max_num_batched_tokens)
    if "is_encoder_decoder" in inspect.signature(vc.SchedulerConfig).parameters:
        sched_kwargs["is_encoder_decoder"] = False
    if cache_config is None:
        cache_config = vc.CacheConfig(gpu_memory_utilization=0.8, enable_prefix_caching=False)
    return vc.VllmConfig(
        model_config=vc.ModelConfig(model=ckpt, tokenizer=ckpt, trust_remote_code=True,
                                    dtype="auto", max_model_len=MAX_MODEL_LEN,
                                    enforce_eager=True),
        cache_config=cache_config,
        parallel_config=vc.ParallelConfig(tensor_parallel_size=1,
                                          worker_extension_cls=SPECULATORS_EXTENSION),
        scheduler_config=vc.SchedulerConfig(**sched_kwargs),
        device_config=vc.DeviceConfig(),
        load_config=vc.LoadConfig(),
    )


def kv_groups(cfg) -> list:
    """One full-attention group shaped like the checkpoint's layers (what the worker's
    ``get_kv_cache_spec`` would report, without starting a worker)."""
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheGroupSpec

    mc = cfg.model_config
    spec = FullAttentionSpec(block_size=cfg.cache_config.block_size,
                             num_kv_heads=mc.get_num_kv_heads(cfg.parallel_config),
                             head_size=mc.get_head_size(), dtype=mc.dtype)
    n_layers = mc.get_num_layers(cfg.parallel_config)
    names = [f"model.layers.{i}.self_attn.attn" for i in range(n_layers)]
    return [KVCacheGroupSpec(names, spec)]


def has_engine_level_layout() -> bool:
    try:
        from vllm.v1.attention.backends.utils import resolve_kv_cache_layout  # noqa: F401
    except ImportError:
        return False
    return True


def resolve_layout_like_engine_core(cfg, groups) -> None:
    """EngineCore._initialize_kv_caches' layout step (0.29+), in this process, with the
    layouts the CPU workers would report (``get_supported_kv_cache_layouts`` over the
    CPU attention backend). The kv_cache_layout_resolution adapter does the same
    through the executor's RPCs."""
    if not has_engine_level_layout():
        return
    from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend
    from vllm.v1.attention.backends.utils import (
        get_supported_kv_cache_layouts,
        resolve_kv_cache_layout,
    )

    names = [layout.name for layout in get_supported_kv_cache_layouts([CPUAttentionBackend])]
    resolve_kv_cache_layout(cfg, [names], [g.kv_cache_spec for g in groups])


@pytest.fixture(scope="module")
def vllm_config(base):
    """A config whose KV layout is not resolved (as speculators leaves it); ``None``
    where vLLM detects no platform (checks that need one skip themselves)."""
    return build_vllm_config() if platform_detected() else None


def resolved_config(**kw):
    cfg = build_vllm_config(**kw)
    resolve_layout_like_engine_core(cfg, kv_groups(cfg))
    return cfg


def kv_call(fn, **kwargs):
    """Call ``get_kv_cache_config_from_groups`` (``fn``) as speculators does on this
    release: before 0.12 it also takes ``kv_cache_specs`` (layer name -> spec)."""
    params = inspect.signature(fn).parameters
    if "kv_cache_specs" in params and "kv_cache_specs" not in kwargs:
        kwargs["kv_cache_specs"] = {name: g.kv_cache_spec for g in kwargs["kv_cache_groups"]
                                    for name in g.layer_names}
    return fn(**kwargs)


def kv_config_for(cfg, num_blocks: int = 64):
    """A KV config with ``num_blocks`` blocks, from vLLM's own function."""
    from vllm.v1.core import kv_cache_utils

    groups = kv_groups(cfg)
    page = groups[0].kv_cache_spec.page_size_bytes * len(groups[0].layer_names)
    kvc = kv_call(kv_cache_utils.get_kv_cache_config_from_groups,
                  vllm_config=cfg, kv_cache_groups=groups, available_memory=page * num_blocks)
    assert kvc.num_blocks == num_blocks, kvc
    cfg.cache_config.num_gpu_blocks = kvc.num_blocks  # as speculators does
    return kvc


def make_request(rid: str, n_tokens: int):
    """A ``Request`` as speculators builds one, through vLLM's own class."""
    from vllm.sampling_params import SamplingParams
    from vllm.v1.request import Request

    kwargs = dict(request_id=rid, prompt_token_ids=list(range(1, n_tokens + 1)),
                  sampling_params=SamplingParams(max_tokens=1, temperature=0.0),
                  pooling_params=None, arrival_time=0.0)
    if "eos_token_id" in inspect.signature(Request).parameters:
        kwargs["eos_token_id"] = 2
    return Request(**kwargs)


def new_scheduler(scheduler_cls, cfg, kvc):
    """``Scheduler(...)`` as the engine core would build it for this release (block
    sizes given explicitly, so the scheduling loops below test only the loop)."""
    from vllm.v1.structured_output import StructuredOutputManager

    from speculators_compat.adapters.kv_cache_config_fields import block_sizes

    params = inspect.signature(scheduler_cls).parameters
    kwargs = {}
    if "block_size" in params:
        kwargs["block_size"], hash_bs = block_sizes(kvc, cfg)
        if "hash_block_size" in params and hash_bs is not None:
            kwargs["hash_block_size"] = hash_bs
    return scheduler_cls(vllm_config=cfg, kv_cache_config=kvc,
                         structured_output_manager=StructuredOutputManager(vllm_config=cfg),
                         **kwargs)


def drive_like_speculators_03(sched) -> Counter:
    """speculators 0.3.0's ``generate()`` step loop (executor call elided): prompt
    tokens scheduled per request."""
    from vllm.v1.request import RequestStatus

    scheduled: Counter = Counter()
    while (so := sched.schedule()).total_num_scheduled_tokens > 0:
        scheduled.update(so.num_scheduled_tokens)
        for req_id in so.num_scheduled_tokens:
            sched.finish_requests([req_id], RequestStatus.FINISHED_ABORTED)
    return scheduled


def drive_like_speculators_04(sched, prompt_lens: dict[str, int]) -> Counter:
    """speculators 0.4.x's ``generate()`` step loop (executor calls elided): prefill
    tokens it attributes per request."""
    from vllm.v1.request import RequestStatus

    computed = dict.fromkeys(prompt_lens, 0)
    captured: Counter = Counter()
    all_prefill_complete = False
    while (so := sched.schedule()).total_num_scheduled_tokens > 0 and not all_prefill_complete:
        for req_id, n in so.num_scheduled_tokens.items():
            captured[req_id] += max(0, min(n, prompt_lens[req_id] - computed[req_id]))
            computed[req_id] += n
        all_prefill_complete = all(computed[r] >= prompt_lens[r] for r in prompt_lens)
    sched.finish_requests(list(prompt_lens), RequestStatus.FINISHED_ABORTED)
    return captured


# --------------------------------------------------------------------------------------
# 0. The table covers the registry
# --------------------------------------------------------------------------------------


def test_every_adapter_has_an_expectation_and_a_legacy_check():
    assert set(EXPECTED) == set(ADAPTER_NAMES), (
        "adapters without an expectation: " f"{sorted(set(ADAPTER_NAMES) - set(EXPECTED))}; "
        f"stale expectations: {sorted(set(EXPECTED) - set(ADAPTER_NAMES))}")
    assert set(LEGACY) == set(ADAPTER_NAMES), sorted(set(ADAPTER_NAMES) ^ set(LEGACY))
    assert len(ADAPTER_NAMES) == len(set(ADAPTER_NAMES)), "duplicate adapter names"


# --------------------------------------------------------------------------------------
# 1. Probe agrees with the release
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ADAPTER_NAMES)
def test_probe_agrees_with_release(base: Base, name: str):
    adapter = BY_NAME[name]
    want = expected_status(name, base.env)
    with adapter_context(base, name), activated(adapter) as report:
        got = report[name]
    assert got.status is want, (
        f"{name}: probe says {got.status.value} ({got.reason}); expected {want.value} on "
        f"{base.env}: {EXPECTED[name][1]}")
    assert got.reason, "every verdict must say why"
    if got.status is APPLIED:
        assert got.changes, f"{name} applied but recorded no change"
        if adapter.vllm_range is not None:
            assert _versions.in_range(base.env.vllm, adapter.vllm_range), (
                f"{name} applied on vllm {base.env.vllm}, outside its declared vllm_range "
                f"{adapter.vllm_range!r}")
        if adapter.speculators_range is not None:
            assert _versions.in_range(base.env.speculators, adapter.speculators_range), (
                f"{name} applied on speculators {base.env.speculators}, outside "
                f"{adapter.speculators_range!r}")
    else:
        assert got.changes == []


# --------------------------------------------------------------------------------------
# 2. Apply then revert restores identity; vLLM's own objects untouched while active
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ADAPTER_NAMES)
def test_apply_then_revert_restores_identity(base: Base, name: str):
    adapter = BY_NAME[name]
    with adapter_context(base, name):
        spaces = {**_vllm_owned(), **_consumer_owned(base.gen)}
        before = snapshot(spaces)
        act = Activation(lambda: [adapter])
        report = act.activate(process="driver")
        try:
            during = snapshot(spaces)
            changed = {c for c in diff(before, during) if not c.startswith("os.environ")}
            listed = report_changes(report, name)
            if report[name].status is APPLIED:
                assert changed, f"{name} applied but no namespace changed"
            else:
                assert not changed, f"{name} is {report[name].status.value} but changed {changed}"
            # Exactly what the report lists changed: nothing else, in particular no
            # attribute of vLLM's own classes or modules (except names added by
            # kv_cache_helpers_relocated, which the report lists).
            assert changed == listed, f"changed {sorted(changed)}; report lists {sorted(listed)}"
            vllm_labels = {c for c in changed if c.rsplit(".", 1)[0] not in (
                GEN, TF_CONFIG, CONFIG_GEN, "VllmHiddenStatesGenerator")}
            if name != "kv_cache_helpers_relocated":
                assert not vllm_labels, f"{name} changed vLLM's own objects: {vllm_labels}"
            for label in vllm_labels:
                assert label.rsplit(".", 1)[0] == KV_UTILS and label not in {
                    f"{KV_UTILS}.{k}" for k in before[KV_UTILS]}, f"{label} is not an addition"
            # ...and only its declared targets (what the Patcher recorded).
            touched = act.touched.get(name, [])
            assert set(touched) <= set(adapter.targets), (
                f"{name} changed {sorted(set(touched) - set(adapter.targets))}, which it "
                f"does not declare in `targets`")
            assert bool(touched) == (report[name].status is APPLIED), touched
        finally:
            act.deactivate()
        after = snapshot(spaces)
    assert diff(before, after) == set(), f"{name} left changes after deactivate()"
    for label in before:
        assert before[label].keys() - IGNORED_KEYS == after[label].keys() - IGNORED_KEYS, label


# --------------------------------------------------------------------------------------
# 3. Legacy call shapes through the adapters
# --------------------------------------------------------------------------------------

LEGACY: dict[str, Callable] = {}


def legacy(name: str):
    def register(fn):
        LEGACY[name] = fn
        return fn

    return register


@pytest.mark.parametrize("name", ADAPTER_NAMES)
def test_legacy_call_shape(base: Base, vllm_config, name: str):
    LEGACY[name](base, base.gen, vllm_config, BY_NAME[name])


@contextlib.contextmanager
def one(base: Base, adapter: Adapter) -> Iterator[bool]:
    """``with one(base, adapter) as applied``: active, status checked against the table."""
    with activated(adapter) as report:
        status = report[adapter.name].status
        assert status is expected_status(adapter.name, base.env), report[adapter.name]
        yield status is APPLIED


@legacy("transformers5_config_torch")
def _legacy_transformers5(base, gen, cfg, adapter):
    import speculators.config as sc

    def define_config():
        # What speculators' modules do at import: subclass SpeculatorModelConfig (a
        # pydantic model over transformers' PretrainedConfig) and build its schema.
        class CompatContractConfig(sc.SpeculatorModelConfig):
            pass

        CompatContractConfig.model_rebuild(force=True)
        return CompatContractConfig

    with base.suspended():
        if base.env.transformers_major >= 5:
            from pydantic.errors import PydanticUndefinedAnnotation

            with pytest.raises(PydanticUndefinedAnnotation, match="torch"):
                define_config()
        else:
            define_config()
        with one(base, adapter) as applied:
            assert applied == (base.env.transformers_major >= 5)
            define_config()
            if applied:
                import torch

                assert importlib.import_module(TF_CONFIG).torch is torch
        assert "torch" not in vars(importlib.import_module(TF_CONFIG)) or not applied


@legacy("kv_cache_helpers_relocated")
def _legacy_helpers_relocated(base, gen, cfg, adapter):
    from speculators_compat.adapters.kv_cache_helpers_relocated import NAMES, NEW

    # The names speculators' generator imports from kv_cache_utils (0.3: first three;
    # 0.4 adds the block hasher helpers).
    wanted = ["_get_kv_cache_groups_uniform_spec", "get_kv_cache_config_from_groups",
              "unify_hybrid_kv_cache_specs"]
    if base.env.speculators_04:
        wanted += ["get_request_block_hasher", "init_none_hash"]
    assert set(wanted) <= set(NAMES)
    with base.suspended():
        utils = importlib.import_module(KV_UTILS)
        missing = [n for n in wanted if not hasattr(utils, n)]
        assert bool(missing) == (base.env.vllm >= V("0.33.0.dev0")), missing
        with one(base, adapter) as applied:
            assert applied == bool(missing)
            for n in wanted:  # `from vllm.v1.core.kv_cache_utils import <n>` works
                assert getattr(utils, n) is getattr(gen, n)
            if applied:
                new = importlib.import_module(NEW)
                assert all(getattr(utils, n) is getattr(new, n) for n in missing)
        assert [n for n in wanted if not hasattr(utils, n)] == missing


SCHEDULER_CONFIG_03 = dict(max_num_seqs=32, max_model_len=512, max_num_batched_tokens=8192)


@legacy("scheduler_config_encoder_decoder")
def _legacy_scheduler_config(base, gen, cfg, adapter):
    needed = base.env.vllm >= V("0.12.0.dev0")
    if needed:
        # upstream error text: "ValidationError ... SchedulerConfig ... is_encoder_decoder Field
        # required" (speculators 0.3.0 on 0.12+).
        with pytest.raises(Exception, match=r"(?s)is_encoder_decoder.*Field required"):
            gen.SchedulerConfig(**SCHEDULER_CONFIG_03)
    passes = "is_encoder_decoder=False" in inspect.getsource(gen)
    assert passes == base.env.speculators_04
    with one(base, adapter) as applied:
        if not passes:
            sc = gen.SchedulerConfig(**SCHEDULER_CONFIG_03)
            assert (sc.max_num_seqs, sc.max_num_batched_tokens) == (32, 8192)
        if needed:  # 0.4.x's call (passes it itself) works either way.
            gen.SchedulerConfig(**SCHEDULER_CONFIG_03, is_encoder_decoder=False)
    assert applied == (needed and not passes)


@legacy("scheduling_sync")
def _legacy_scheduling_sync(base, gen, cfg, adapter):
    params = inspect.signature(gen.SchedulerConfig).parameters
    assert "async_scheduling" in params
    call = dict(SCHEDULER_CONFIG_03)
    if "is_encoder_decoder" in params:
        call["is_encoder_decoder"] = False
    if base.env.vllm < V("0.14.0.dev0"):
        # 0.11-0.13: synchronous unless asked; nothing to do.
        assert params["async_scheduling"].default is False
        assert gen.SchedulerConfig(**call).async_scheduling is False
        with one(base, adapter) as applied:
            assert not applied
        return
    # 0.14+: the field is unresolved (None -> True for mp/uni executors) by default.
    assert params["async_scheduling"].default in (None, True)
    assert gen.SchedulerConfig(**call).async_scheduling is not False
    with one(base, adapter) as applied:
        assert applied
        assert gen.SchedulerConfig(**call).async_scheduling is False
        # a caller's explicit choice wins
        assert gen.SchedulerConfig(**call, async_scheduling=True).async_scheduling is True


@legacy("prefix_caching_off")
def _legacy_prefix_caching(base, gen, cfg, adapter):
    call = dict(block_size=16, gpu_memory_utilization=0.8)  # speculators 0.3.0's call
    if base.env.vllm < V("0.12.0.dev0"):
        # 0.11: unset (None) means off for speculators' own engine; nothing to do.
        assert not gen.CacheConfig(**call).enable_prefix_caching
        with one(base, adapter) as applied:
            assert not applied
        return
    assert gen.CacheConfig(**call).enable_prefix_caching is True  # 0.12+ default
    if base.env.speculators_04:
        # 0.4.x sets it off itself: nothing to do.
        assert "enable_prefix_caching=False" in inspect.getsource(gen)
        with one(base, adapter) as applied:
            assert not applied
        return
    with one(base, adapter) as applied:
        assert applied
        assert gen.CacheConfig(**call).enable_prefix_caching is False
        assert gen.CacheConfig(**call, enable_prefix_caching=True).enable_prefix_caching
    assert gen.CacheConfig(**call).enable_prefix_caching is True


@legacy("cpu_block_size")
def _legacy_cpu_block_size(base, gen, cfg, adapter):
    from speculators_compat.adapters.cpu_block_size import cpu_accepts_16

    try:
        from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend
    except ImportError:  # 0.11: TorchSDPABackend, no kernel block sizes declared
        CPUAttentionBackend = None
    call = dict(block_size=16, gpu_memory_utilization=0.8, enable_prefix_caching=False)
    plain = build_vllm_config(cache_config=gen.CacheConfig(**call))
    assert plain.cache_config.block_size == 16  # speculators' 16 is kept by the platform
    accepts_16 = cpu_accepts_16()
    if CPUAttentionBackend is not None:
        assert accepts_16 == CPUAttentionBackend.supports_block_size(16)
    with one(base, adapter) as applied:
        # the probe reads the backend's source; the backend is asked again at call time
        assert applied == (not accepts_16)
        shimmed = build_vllm_config(cache_config=gen.CacheConfig(**call))
        final = shimmed.cache_config.block_size
        if not accepts_16:
            # The hard-coded 16 is dropped: the platform picks a size its attention
            # backend accepts (0.32: 128).
            assert getattr(shimmed.cache_config, "user_specified_block_size", False) is False
            assert final != 16
        else:
            assert final == 16
        if CPUAttentionBackend is not None:
            assert CPUAttentionBackend.supports_block_size(final), final


@legacy("kv_cache_specs_kwarg")
def _legacy_kv_cache_specs(base, gen, cfg, adapter):
    if cfg is None:
        require_platform()
    call = dict(vllm_config=cfg, kv_cache_groups=[], kv_cache_specs={}, available_memory=0)
    needed = base.env.vllm >= V("0.12.0.dev0")
    if needed:
        with pytest.raises(TypeError, match="unexpected keyword argument 'kv_cache_specs'"):
            gen.get_kv_cache_config_from_groups(**call)
    passes = "kv_cache_specs=" in inspect.getsource(gen)
    assert passes == base.env.speculators_03
    with one(base, adapter) as applied:
        if passes or not needed:
            kvc = gen.get_kv_cache_config_from_groups(**call)
        else:  # 0.4.x's own call, without kv_cache_specs
            kvc = gen.get_kv_cache_config_from_groups(
                **{k: v for k, v in call.items() if k != "kv_cache_specs"})
        assert kvc.num_blocks == 1 and kvc.kv_cache_groups == []  # attention-free result
    assert applied == (needed and passes)


@legacy("kv_cache_config_fields")
def _legacy_kv_cache_config_fields(base, gen, cfg, adapter):
    from vllm.v1.kv_cache_interface import KVCacheConfig

    from speculators_compat.adapters.kv_cache_config_fields import FIELDS

    present = {f.name for f in dataclasses.fields(KVCacheConfig)} & set(FIELDS)
    rcfg = resolved_config()
    groups = kv_groups(rcfg)
    call = dict(vllm_config=rcfg, kv_cache_groups=groups, available_memory=1 << 24)
    plain = kv_call(gen.get_kv_cache_config_from_groups, **call)
    with one(base, adapter) as applied:
        assert applied == bool(present)
        filled = kv_call(gen.get_kv_cache_config_from_groups, **call)
    assert filled.num_blocks == plain.num_blocks
    if not applied:
        return
    # What EngineCore._initialize_kv_caches sets (0.32: kv_cache_layout from the cache
    # config; hash_block_size / cache_hit_alignment_tokens from resolve_* helpers).
    # (each only where this release's KVCacheConfig has the field: early 0.29 nightlies
    # have kv_cache_layout alone).
    assert all(getattr(plain, f) is None for f in present), plain
    utils = importlib.import_module(KV_UTILS)
    if "kv_cache_layout" in present:
        assert filled.kv_cache_layout == rcfg.cache_config.kv_cache_layout is not None
    if "hash_block_size" in present:
        sched_bs, hash_bs = utils.resolve_kv_cache_block_sizes(filled, rcfg)
        assert filled.hash_block_size == hash_bs is not None
        if "cache_hit_alignment_tokens" in present:
            assert filled.cache_hit_alignment_tokens == (
                utils.resolve_cache_hit_alignment_tokens(filled, rcfg, sched_bs, hash_bs))


@legacy("no_gpu_kv_sizing")
def _legacy_no_gpu_kv_sizing(base, gen, cfg, adapter):
    import torch

    from speculators_compat.adapters.no_gpu_kv_sizing import cpu_kv_budget

    real_mem_get_info = torch.cuda.mem_get_info
    rcfg = resolved_config()
    groups = kv_groups(rcfg)
    utils = importlib.import_module(KV_UTILS)
    if base.env.speculators_03:
        # 0.3.0: free_memory, _ = torch.cuda.mem_get_info() -> no NVIDIA driver
        with pytest.raises((RuntimeError, AssertionError)):
            gen.torch.cuda.mem_get_info()
    elif torch.accelerator.current_accelerator() is None:
        assert gen.mem_get_info() == (0, 0)  # 0.4's own helper, CPU-only torch
    else:
        # 0.4's own helper on a CUDA build of torch without a driver (vllm 0.16 env):
        # it asks torch.cuda and fails, not (0, 0) as one might assume.
        with pytest.raises((RuntimeError, AssertionError)):
            gen.mem_get_info()
    # ...and with 0 free bytes the KV cache gets 0 blocks (then `num_gpu_blocks > 0`).
    call = dict(vllm_config=rcfg, kv_cache_groups=groups, available_memory=int(0 * 0.8 * 0.2))
    assert kv_call(gen.get_kv_cache_config_from_groups, **call).num_blocks == 0
    with one(base, adapter) as applied:
        assert applied
        if base.env.speculators_03:
            assert gen.torch.cuda.mem_get_info() == (0, 0)
            assert gen.torch.cuda.is_available() is torch.cuda.is_available()
            assert gen.torch.float32 is torch.float32 and gen.torch.tensor is torch.tensor
        else:
            assert gen.mem_get_info() == (0, 0)
        sized = kv_call(gen.get_kv_cache_config_from_groups, **call)
        direct = kv_call(utils.get_kv_cache_config_from_groups, vllm_config=rcfg,
                         kv_cache_groups=groups, available_memory=cpu_kv_budget(rcfg))
        assert sized.num_blocks == direct.num_blocks > 0
        # only speculators' module sees the proxy
        assert sys.modules["torch"] is torch and torch.cuda.mem_get_info is real_mem_get_info
    assert gen.torch is torch
    # 0.4's offline-script metadata: config_generator's get_device_name(0) asks a CUDA build
    # of torch for a GPU that is not there (0.3.0 checks torch.cuda.is_available() first).
    config = importlib.import_module(CONFIG_GEN)
    if not hasattr(config, "get_device_name"):
        assert config._get_gpu_info() == "CPU only"
        return
    real_get_device_name = config.get_device_name
    if torch.accelerator.current_accelerator() is None:
        assert config._get_gpu_info() == "CPU ONLY"  # CPU-only torch: upstream's own answer
    else:
        with pytest.raises((RuntimeError, AssertionError)):
            config._get_gpu_info()
    with one(base, adapter) as applied:
        assert applied
        assert config._get_gpu_info() == "CPU ONLY"
    assert config.get_device_name is real_get_device_name


@legacy("scheduler_block_size")
def _legacy_scheduler_block_size(base, gen, cfg, adapter):
    from vllm.v1.structured_output import StructuredOutputManager

    from speculators_compat.adapters.kv_cache_config_fields import block_sizes

    rcfg = resolved_config()
    kvc = kv_config_for(rcfg)
    som = StructuredOutputManager(vllm_config=rcfg)
    call_03 = dict(vllm_config=rcfg, kv_cache_config=kvc, structured_output_manager=som)
    if base.env.vllm < V("0.11.1.dev0"):
        # 0.11.0: the scheduler reads the block size from the config itself.
        s = gen.Scheduler(**call_03)
        assert s.block_size == rcfg.cache_config.block_size
        with one(base, adapter) as applied:
            assert not applied
        return
    # upstream error text: "Scheduler.__init__() missing 1 required positional argument:
    # 'block_size'" (0.3.0 on 0.11.1+).
    with pytest.raises(TypeError, match="missing 1 required positional argument: 'block_size'"):
        gen.Scheduler(**call_03)
    # What this release's engine core passes.
    utils = importlib.import_module(KV_UTILS)
    if hasattr(utils, "resolve_kv_cache_block_sizes"):
        engine_bs, engine_hash = utils.resolve_kv_cache_block_sizes(kvc, rcfg)
    else:
        pc = rcfg.parallel_config
        engine_bs = (rcfg.cache_config.block_size * pc.decode_context_parallel_size
                     * pc.prefill_context_parallel_size)
        engine_hash = None
    assert block_sizes(kvc, rcfg) == (engine_bs, engine_hash)
    with one(base, adapter) as applied:
        assert applied
        s03 = gen.Scheduler(**call_03)
        s04 = gen.Scheduler(**call_03, block_size=16)  # 0.4.x passes its hard-coded 16
    for s in (s03, s04):
        assert isinstance(s, importlib.import_module("vllm.v1.core.sched.scheduler").Scheduler)
        assert s.block_size == engine_bs
        if engine_hash is not None and "hash_block_size" in vars(s):  # stored from 0.29
            assert s.hash_block_size == engine_hash


@legacy("scheduler_prefill_only")
def _legacy_scheduler_prefill_only(base, gen, cfg, adapter):
    from vllm.v1.core.sched.scheduler import Scheduler

    def run(scheduler_cls, loop: str, prompt_lens: dict[str, int], **cfg_kw) -> Counter:
        rcfg = resolved_config(**cfg_kw)
        sched = new_scheduler(scheduler_cls, rcfg, kv_config_for(rcfg))
        for rid, n in prompt_lens.items():
            sched.add_request(make_request(rid, n))
        if loop == "0.3":
            return drive_like_speculators_03(sched)
        return drive_like_speculators_04(sched, prompt_lens)

    many = {f"req_0_{i}": 3 for i in range(MAX_NUM_SEQS + 8)}  # 40 > max_num_seqs
    chunked = {"req_0_0": 100, "req_0_1": 5}  # 100 > max_num_batched_tokens (64)

    if not base.env.speculators_04 and base.env.vllm < V("0.12.0.dev0"):
        # 0.3.0 on 0.11.x: chunked prefill is off unless asked (and speculators 0.3.0 never
        # asks), so a budget below max_model_len is refused by vLLM's own config, and 0.3's
        # loop captures batches above max_num_seqs whole on the bare scheduler.
        from speculators_compat.adapters.scheduler_prefill_only import (
            chunked_prefill_by_default,
        )

        assert not chunked_prefill_by_default(gen.SchedulerConfig)
        assert run(Scheduler, "0.3", many) == Counter(many)
        with pytest.raises(Exception, match="max_num_batched_tokens"):
            build_vllm_config(max_num_batched_tokens=64)
        with one(base, adapter) as applied:
            assert not applied
            assert gen.Scheduler is Scheduler
        return

    # Upstream hazards on the bare scheduler (silent data loss):
    got = run(Scheduler, "0.4", many)
    assert sorted(got) == sorted(list(many)[:MAX_NUM_SEQS]), "0.4: only 32 of 40 scheduled"
    got = run(Scheduler, "0.3", chunked, max_num_batched_tokens=64)
    assert got["req_0_0"] == 64, f"0.3: chunked prompt aborted mid-prefill ({got})"

    with one(base, adapter) as applied:
        assert applied
        shim = gen.Scheduler
        assert issubclass(shim, Scheduler) and shim is not Scheduler
        for loop in ("0.3", "0.4"):
            assert run(shim, loop, many) == Counter(many), loop
            assert run(shim, loop, chunked, max_num_batched_tokens=64) == Counter(chunked), loop


@legacy("request_eos_token_id")
def _legacy_request_eos(base, gen, cfg, adapter):
    from vllm.sampling_params import SamplingParams

    def call():
        kwargs = dict(request_id="req_0_0", prompt_token_ids=[1, 2, 3],
                      sampling_params=SamplingParams(max_tokens=1, temperature=0.0),
                      pooling_params=None, eos_token_id=2, arrival_time=0.0)
        if base.env.speculators_04:
            kwargs["block_hasher"] = None  # 0.4 passes its block hasher too
        return gen.Request(**kwargs)

    needed = base.env.vllm >= V("0.17.0.dev0")
    if needed:
        # upstream error text: "Request.__init__() got an unexpected keyword argument
        # 'eos_token_id'" (0.3/0.4 on 0.17+).
        with pytest.raises(TypeError, match="unexpected keyword argument 'eos_token_id'"):
            call()
    else:
        call()
    with one(base, adapter) as applied:
        req = call()
        assert req.request_id == "req_0_0" and list(req.prompt_token_ids) == [1, 2, 3]
        assert isinstance(req, importlib.import_module("vllm.v1.request").Request)
    assert applied == needed


@legacy("kv_cache_layout_resolution")
def _legacy_kv_cache_layout(base, gen, cfg, adapter):
    from vllm.v1.executor.multiproc_executor import MultiprocExecutor

    fresh = build_vllm_config()  # layout not resolved, as speculators leaves it
    groups = kv_groups(fresh)
    call = dict(vllm_config=fresh, kv_cache_groups=groups, available_memory=1 << 24)
    needed = has_engine_level_layout()
    if needed:
        # upstream error text: "ValueError: KV cache layout has not been resolved yet" (0.32).
        with pytest.raises(ValueError, match="KV cache layout has not been resolved yet"):
            kv_call(gen.get_kv_cache_config_from_groups, **call)
        # The sequence the adapter replays (what EngineCore does) exists as it expects.
        from vllm.v1.attention.backends.utils import resolve_kv_cache_layout

        assert list(inspect.signature(resolve_kv_cache_layout).parameters)[:3] == [
            "vllm_config", "supported_layouts", "kv_cache_specs"]
        for meth in ("get_kv_cache_specs", "get_supported_kv_cache_layouts",
                     "set_kv_cache_layout"):
            assert callable(getattr(MultiprocExecutor, meth)), meth
        from vllm.v1.core.single_type_kv_cache_manager import (  # noqa: F401
            register_all_kvcache_specs,
        )
        # ...and, replayed in this process, makes speculators' call work.
        resolve_layout_like_engine_core(fresh, groups)
        assert kv_call(gen.get_kv_cache_config_from_groups, **call).num_blocks > 0
    else:
        assert kv_call(gen.get_kv_cache_config_from_groups, **call).num_blocks > 0
    with one(base, adapter) as applied:
        assert applied == needed
        _check_executor_shim(gen, MultiprocExecutor, applied, {"__init__"})


def _check_executor_shim(gen, vllm_cls, applied: bool, overrides: set[str]) -> None:
    """The rebound executor is a thin subclass of vLLM's (isinstance-compatible) that
    overrides exactly ``overrides``; vLLM's own class object is untouched."""
    mod = importlib.import_module("vllm.v1.executor.multiproc_executor")
    assert mod.MultiprocExecutor is vllm_cls
    if not applied:
        assert gen.MultiprocExecutor is vllm_cls
        return
    shim = gen.MultiprocExecutor
    assert shim is not vllm_cls and issubclass(shim, vllm_cls)
    own = {k for k, v in vars(shim).items() if callable(v)}
    assert own == overrides, own
    for k in overrides:
        assert vars(shim)[k] is not vars(vllm_cls).get(k)


@legacy("executor_sample_tokens")
def _legacy_executor_sample_tokens(base, gen, cfg, adapter):
    from vllm.v1.executor.multiproc_executor import MultiprocExecutor

    if base.env.vllm < V("0.11.1.dev0"):
        # 0.11.0: one-phase execute_model, as speculators was written for.
        assert not hasattr(MultiprocExecutor, "sample_tokens")
        with one(base, adapter) as applied:
            _check_executor_shim(gen, MultiprocExecutor, applied, set())
        assert not applied
        return
    # Upstream shape this adapter was written for (0.11.1+): two phases.
    assert list(inspect.signature(MultiprocExecutor.execute_model).parameters)[:2] == [
        "self", "scheduler_output"]
    assert list(inspect.signature(MultiprocExecutor.sample_tokens).parameters)[:2] == [
        "self", "grammar_output"]
    src = inspect.getsource(gen)
    # 0.3.0 never completes a step; 0.4 calls sample_tokens itself.
    assert ("sample_tokens(" in src) == base.env.speculators_04
    with one(base, adapter) as applied:
        _check_executor_shim(gen, MultiprocExecutor, applied,
                             {"execute_model", "sample_tokens"})


@legacy("collective_rpc_unique_reply")
def _legacy_collective_rpc(base, gen, cfg, adapter):
    from vllm.v1.executor.multiproc_executor import MultiprocExecutor

    from speculators_compat.adapters.collective_rpc_unique_reply import (
        SPECULATORS_LIST_REPLY_METHODS,
        returns_single_result,
    )

    single = base.env.vllm >= V("0.11.1.dev0")  # 0.11.0: a list, one entry per rank
    assert returns_single_result(MultiprocExecutor) is single
    assert "unique_reply_rank" in inspect.signature(MultiprocExecutor.collective_rpc).parameters
    src = inspect.getsource(gen)
    assert '"_get_captured_states",\n            unique_reply_rank=0' in src
    # 0.3.0 indexes the reply ([0]); 0.4 uses it as the dict it is.
    assert ("captured_states_list[0]" in src) == base.env.speculators_03
    assert SPECULATORS_LIST_REPLY_METHODS == {"_get_captured_states"}
    with one(base, adapter) as applied:
        _check_executor_shim(gen, MultiprocExecutor, applied, {"collective_rpc"})
        # vLLM's own executor keeps its convention.
        assert returns_single_result(MultiprocExecutor) is single


@legacy("shm_transport")
def _legacy_shm_transport(base, gen, cfg, adapter):
    from vllm.v1.executor.multiproc_executor import MultiprocExecutor

    from speculators_compat import _transport
    from speculators_compat.adapters.collective_rpc_unique_reply import returns_single_result
    from speculators_compat.adapters.shm_transport import (
        CAPTURED_STATES_RPC,
        RESET_CAPTURE_RPC,
    )

    # The calls it answers, as speculators makes them.
    src = inspect.getsource(gen)
    assert f'"{CAPTURED_STATES_RPC}",\n            unique_reply_rank=0' in src
    assert f'self.executor.collective_rpc("{RESET_CAPTURE_RPC}")' in src
    assert _transport.unavailable_reason() is None  # Linux CI: memfd + /proc/<pid>/fd
    single = returns_single_result(MultiprocExecutor)
    init = gen.VllmHiddenStatesGenerator.__init__
    with one(base, adapter) as applied:
        _check_executor_shim(gen, MultiprocExecutor, applied,
                             {"collective_rpc", "shutdown"} if applied else set())
        if applied:
            # Later probes (collective_rpc_unique_reply) still read vLLM's signature and
            # docstring through the shim, and vLLM's own executor is unchanged.
            assert returns_single_result(gen.MultiprocExecutor) is single
            assert gen.VllmHiddenStatesGenerator.__init__ is not init
    assert gen.VllmHiddenStatesGenerator.__init__ is init


@legacy("executor_warmup_split")
def _legacy_executor_warmup(base, gen, cfg, adapter):
    from vllm.v1.engine.core import EngineCore
    from vllm.v1.executor.multiproc_executor import MultiprocExecutor

    split = base.env.vllm >= V("0.27.0.dev0")
    init_src = inspect.getsource(MultiprocExecutor.initialize_from_config)
    engine_src = inspect.getsource(EngineCore._initialize_kv_caches)
    if split:
        assert hasattr(MultiprocExecutor, "compile_or_warm_up_model")
        assert "compile_or_warm_up_model" not in init_src
        # the engine core warms up separately, after initialize_from_config
        assert (engine_src.index("initialize_from_config(")
                < engine_src.index("compile_or_warm_up_model("))
    else:
        assert "compile_or_warm_up_model" in init_src
    assert "compile_or_warm_up_model" not in inspect.getsource(gen)
    with one(base, adapter) as applied:
        assert applied == split
        _check_executor_shim(gen, MultiprocExecutor, applied, {"initialize_from_config"})


@legacy("hook_capture")
def _legacy_hook_capture(base, gen, cfg, adapter):
    from vllm.model_executor.models.deepseek_v2 import DeepseekV2DecoderLayer
    from vllm.model_executor.models.llama import LlamaModel

    from speculators_compat import worker_extension

    # Upstream facts behind the verdict.
    renamed = base.env.vllm >= V("0.11.1.dev0")
    assert hasattr(LlamaModel, "get_input_embeddings") != renamed  # 0.11.1 rename
    assert hasattr(LlamaModel, "embed_input_ids") == renamed
    assert ("llama_4_scaling" in inspect.signature(DeepseekV2DecoderLayer.forward).parameters
            ) == (base.env.vllm >= V("0.12.0.dev0"))
    assert SPECULATORS_EXTENSION in inspect.getsource(gen)

    call = dict(tensor_parallel_size=1, worker_extension_cls=SPECULATORS_EXTENSION)
    assert gen.ParallelConfig(**call).worker_extension_cls == SPECULATORS_EXTENSION
    if not renamed:
        # 0.11.0 (speculators 0.3.0's own pin): speculators' forward loop matches vLLM.
        with one(base, adapter) as applied:
            assert not applied
            assert gen.ParallelConfig(**call).worker_extension_cls == SPECULATORS_EXTENSION
        return
    contract = "list" if base.env.speculators_03 else "by_request"
    with one(base, adapter) as applied:
        assert applied
        pc = gen.ParallelConfig(**call)
        assert pc.worker_extension_cls == worker_extension.EXTENSIONS[contract]
        module, _, cls = pc.worker_extension_cls.rpartition(".")
        assert isinstance(getattr(importlib.import_module(module), cls), type)
        # other extensions are left alone
        other = gen.ParallelConfig(tensor_parallel_size=1, worker_extension_cls="a.B")
        assert other.worker_extension_cls == "a.B"
        with pytest.raises(CompatError, match="pipeline_parallel_size=2"):
            gen.ParallelConfig(**call, pipeline_parallel_size=2)
        assert isinstance(pc, importlib.import_module("vllm.config").ParallelConfig)
        # Where the release has the Model Runner V2 switch, the generator's construction
        # (and so its spawned workers) runs with the V1 runner; restored afterwards.
        switch = "VLLM_USE_V2_MODEL_RUNNER"
        has_switch = switch in importlib.import_module("vllm.envs").environment_variables
        assert env_during_generator_init(gen)[switch] == ("0" if has_switch else None)
        assert switch not in os.environ


@legacy("result_order_natural")
def _legacy_result_order(base, gen, cfg, adapter):
    ids = [f"req_0_{i}" for i in range(12)]
    # speculators' module looks `sorted` up in its globals, then builtins.
    assert "sorted" not in vars(gen)
    src = inspect.getsource(gen)
    assert ("sorted(request_id_to_idx.keys())" in src) == base.env.speculators_04
    # The upstream bug: string order puts req_0_10 and req_0_11 before req_0_2.
    assert builtins.sorted(ids)[:4] == ["req_0_0", "req_0_1", "req_0_10", "req_0_11"]
    with one(base, adapter) as applied:
        if not applied:
            assert "sorted" not in vars(gen)
            return
        s = gen.sorted
        assert s(reversed(ids)) == ids  # numeric: req_0_2 before req_0_10
        assert s(["req_0_10", "req_0_2"]) == ["req_0_2", "req_0_10"]
        assert s(["req_1_0", "req_0_10"]) == ["req_0_10", "req_1_0"]
        assert s(ids, reverse=True) == ids[::-1]
        assert s({f"req_3_{i}": i for i in (10, 2, 1)}.keys()) == ["req_3_1", "req_3_2",
                                                                   "req_3_10"]
        # Anything else sorts exactly as builtins.sorted does.
        for items, kw in [
            (["req_0_10", "req_0_2", "x"], {}),
            (["b", "a", "c"], {}),
            (["b", "a", "c"], {"reverse": True}),
            ([3, 1, 2], {}),
            ([], {}),
            (ids, {"key": len}),
            (["req_0_10", "req_0_2"], {"key": str.lower}),
            (["Req_0_10", "Req_0_2"], {}),
            (["req_0_10 ", "req_0_2"], {}),
            ([(2, "a"), (1, "b")], {}),
        ]:
            assert s(iter(items), **kw) == builtins.sorted(items, **kw), (items, kw)
        with pytest.raises(TypeError):
            s([1, "a"])
        with pytest.raises(TypeError):
            s([1, 2], lambda x: x)  # key is keyword-only, as in builtins.sorted
    assert "sorted" not in vars(gen)


@legacy("speculators_supported")
def _legacy_speculators_supported(base, gen, cfg, adapter):
    # A pure scope check: with the in-process generator installed it changes nothing
    # and raises nothing (speculators >= 0.5, where it raises, is not installable here).
    assert importlib.util.find_spec(GEN) is not None
    spaces = {**_vllm_owned(), **_consumer_owned(gen)}
    before = snapshot(spaces)
    with one(base, adapter) as applied:
        assert not applied
        assert diff(before, snapshot(spaces)) <= {f"os.environ[{_env.ACTIVE!r}]"}


class _EnvAtValidation(list):
    """``layer_ids`` for speculators' ``VllmHiddenStatesGenerator.__init__`` that records
    ``os.environ`` when ``__init__`` validates them (after the tokenizer and HF config
    are loaded, before any vLLM config or worker exists) and is out of bounds, so
    ``__init__`` stops there with its own ValueError: no engine is started."""

    def __init__(self, keys):
        super().__init__([10**6])
        self.keys, self.seen = keys, None

    def __iter__(self):
        self.seen = {k: os.environ.get(k) for k in self.keys}
        return super().__iter__()


def env_during_generator_init(gen, keys=USER_CHOICES) -> dict[str, str | None]:
    ids = _EnvAtValidation(keys)
    with pytest.raises(ValueError, match="out of bounds"):
        gen.VllmHiddenStatesGenerator(model_path=checkpoint("llama"), layer_ids=ids)
    assert ids.seen is not None, "speculators' __init__ no longer validates layer_ids first"
    return ids.seen


@legacy("worker_spawn_method")
def _legacy_worker_spawn_method(base, gen, cfg, adapter):
    import vllm.envs as envs

    var = "VLLM_WORKER_MULTIPROC_METHOD"
    assert var in envs.environment_variables
    assert os.environ.get(var) is None
    # Bare: the generator's MultiprocExecutor would start with vLLM's default (fork).
    assert env_during_generator_init(gen)[var] is None
    assert envs.VLLM_WORKER_MULTIPROC_METHOD == "fork"
    if base.env.cpu_platform:
        # ...except on CPU, whose platform sets spawn when speculators builds its config.
        saved = dict(os.environ)
        try:
            _build_vllm_config()
            assert os.environ.get(var) == "spawn"
        finally:
            os.environ.clear()
            os.environ.update(saved)
        with one(base, adapter) as applied:
            assert not applied
        return
    with one(base, adapter) as applied:
        assert applied
        assert env_during_generator_init(gen)[var] == "spawn"
        assert var not in os.environ  # restored after __init__
        os.environ[var] = "fork"  # a user's explicit choice is kept
        try:
            assert env_during_generator_init(gen)[var] == "fork"
            assert os.environ[var] == "fork"
        finally:
            del os.environ[var]


@legacy("generate_guard")
def _legacy_generate_guard(base, gen, cfg, adapter):
    """A partly failed ``generate()`` must not leave requests for the next call.

    The generator is speculators' real class, built without ``__init__`` (no engine):
    it gets a real tokenizer, a real ``VllmConfig`` and vLLM's real ``Scheduler``, and
    no executor, so speculators' ``generate()`` adds its requests and then fails at
    ``self.executor`` -- a failure after requests were added, as in the hazard.
    """
    from transformers import AutoTokenizer
    from vllm.v1.core.sched.scheduler import Scheduler

    from speculators_compat.adapters.request_eos_token_id import RequestEosTokenId

    rcfg = resolved_config()
    kvc = kv_config_for(rcfg)
    tokenizer = AutoTokenizer.from_pretrained(checkpoint("llama"))

    def bare_generator(scheduler_cls=Scheduler):
        g = object.__new__(gen.VllmHiddenStatesGenerator)
        g.vllm_config, g.tokenizer, g._request_counter = rcfg, tokenizer, 0
        g.block_hasher = None  # 0.4 passes it to Request
        g.scheduler = new_scheduler(scheduler_cls, rcfg, kvc)
        return g

    # vLLM >= 0.17 needs request_eos_token_id for speculators to add any request.
    helper = [RequestEosTokenId()] if base.env.vllm >= V("0.17.0.dev0") else []
    batch = [[1, 2, 3], [4, 5]]
    with activated(*helper):
        g = bare_generator()
        with pytest.raises(AttributeError, match="executor"):
            g.generate(batch)
        leaked = sorted(g.scheduler.requests)
        assert leaked == ["req_0_0", "req_0_1"], leaked  # the upstream hazard
        with pytest.raises(ValueError, match="cannot be empty"):  # speculators' own check
            bare_generator().generate([])
    with activated(*helper), one(base, adapter) as applied:
        assert applied
        g = bare_generator()
        with pytest.raises(AttributeError, match="executor"):  # the original error
            g.generate(batch)
        assert all(r.is_finished() for r in g.scheduler.requests.values())
        assert not g.scheduler.running and not g.scheduler.waiting
        assert g._request_counter == 1  # the failed call's request ids are not reused
        # bad input is refused before anything is added
        vocab = rcfg.model_config.get_vocab_size()
        for bad, match in [([], "empty batch"), ([[1, 2], []], "sequence 1 of the batch is empty"),
                           ([[1, 2.0]], "sequence 0 contains 2.0"),
                           ([[True]], "sequence 0 contains True"),
                           ([[1, 2], [3, vocab]], f"sequence 1 has token id {vocab} at position 1"),
                           ([[-1]], "sequence 0 has token id -1 at position 0")]:
            g = bare_generator()
            with pytest.raises(CompatError, match=match):
                g.generate(bad)
            assert not g.scheduler.requests
        assert "generate" in vars(gen.VllmHiddenStatesGenerator)
    if base.env.speculators_03 and base.env.vllm < V("0.12.0.dev0"):
        return  # scheduler_prefill_only does not apply there
    # With prefill-only scheduling, which defers aborting a request that is not fully
    # prefilled (speculators 0.3's loop), the guard's cleanup still aborts everything.
    prefill = BY_NAME["scheduler_prefill_only"]
    many = [[5 + i % 7] * 3 for i in range(MAX_NUM_SEQS + 8)]
    with activated(*helper, prefill, adapter) as report:
        assert report[prefill.name].status is APPLIED
        g = bare_generator(gen.Scheduler)
        with pytest.raises(AttributeError, match="executor"):
            g.generate(many)
        assert not g.scheduler.requests and not g.scheduler.running and not g.scheduler.waiting
        assert not getattr(g.scheduler, "_compat_deferred", None)


def _break_probe(name: str, monkeypatch, gen) -> str:
    """Make ``name``'s probe meet an unknown shape or raise; returns the expected status."""
    if name == "result_order_natural":  # speculators' source unreadable (e.g. .pyc only)
        from speculators_compat.adapters import _probes

        real = _probes.source
        monkeypatch.setattr(_probes, "source", lambda obj: "" if obj is gen else real(obj))
        return "mismatch"
    if name == "scheduler_prefill_only":  # a scheduler of an unknown shape
        monkeypatch.setattr(gen, "Scheduler", type("Scheduler", (), {}))
        return "mismatch"

    def check(self, ctx, gen):
        raise RuntimeError(f"{name} probe broke")

    monkeypatch.setattr(type(BY_NAME[name]), "check", check)
    return "failed"


@pytest.mark.parametrize("name", ["hook_capture", "result_order_natural",
                                  "scheduler_prefill_only", "generate_guard"])
def test_data_guards_fail_closed(base: Base, monkeypatch, name: str):
    """Without these adapters the data is silently wrong (reordered, truncated, or from
    the broken upstream forward): when one cannot act, speculators' generator refuses
    (before any engine starts), naming the adapter and the opt-out, unless the user
    disabled it by name."""
    gen = base.gen
    adapter = BY_NAME[name]
    spaces = _consumer_owned(gen)
    before = snapshot(spaces)
    with monkeypatch.context() as m:
        status = _break_probe(name, m, gen)
        with activated(adapter) as report:
            r = report[name]
            assert r.status.value == status, r
            assert "fail closed" in r.reason, r
            for call in (lambda: gen.VllmHiddenStatesGenerator(
                             model_path=checkpoint("llama"), layer_ids=[10**6]),
                         lambda: object.__new__(gen.VllmHiddenStatesGenerator).generate([[1]])):
                with pytest.raises(CompatError) as exc:
                    call()
                msg = str(exc.value)
                assert f"adapter {name} could not be applied ({status}" in msg, msg
                assert f"{_env.DISABLE}={name}" in msg, msg
        assert diff(before, snapshot(spaces)) <= {f"{GEN}.Scheduler"}
        act = Activation(lambda: [adapter])
        act.activate(process="driver")
        try:  # the refusal changes only what the adapter declares for it
            assert set(act.touched[name]) == set(adapter.refusal_targets), act.touched
        finally:
            act.deactivate()
        m.setenv(_env.DISABLE, name)
        with activated(adapter) as report:
            assert report[name].status is Status.DISABLED
            with pytest.raises(ValueError, match="out of bounds"):  # speculators' own check
                gen.VllmHiddenStatesGenerator(model_path=checkpoint("llama"), layer_ids=[10**6])
    assert diff(before, snapshot(spaces)) == set()


def test_fp16_unscale_factor_reads_vllm_deepseek_layer(base: Base, monkeypatch):
    """The fp16 overflow guard of vLLM's real ``DeepseekV2DecoderLayer.forward`` is found
    (factor = routed_scaling_factor); when the source cannot be read, or scales in a form
    not known, a float16 layer raises instead of silently using 1.0."""
    import torch
    from vllm.model_executor.models.deepseek_v2 import DeepseekV2DecoderLayer

    from speculators_compat._capture import fp16_unscale_factor

    def layer(cls=DeepseekV2DecoderLayer, dtype=torch.float16, factor=2.5):
        obj = object.__new__(cls)
        torch.nn.Module.__init__(obj)
        obj.routed_scaling_factor = factor
        obj.norm = torch.nn.Parameter(torch.ones(4, dtype=dtype))
        return obj

    assert "1.0 / self.routed_scaling_factor" in inspect.getsource(DeepseekV2DecoderLayer.forward)
    assert fp16_unscale_factor(layer()) == 2.5
    assert fp16_unscale_factor(layer(factor=1.0)) == 1.0

    class Renamed(DeepseekV2DecoderLayer):  # a future vLLM writing the guard otherwise
        def forward(self, hidden_states, residual):
            return hidden_states / self.routed_scaling_factor, residual

    class NoGuard(DeepseekV2DecoderLayer):  # a future vLLM without the guard
        def forward(self, hidden_states, residual):
            return hidden_states, residual

    with pytest.raises(CompatError, match="routed_scaling_factor"):
        fp16_unscale_factor(layer(Renamed))
    assert fp16_unscale_factor(layer(NoGuard)) == 1.0
    assert fp16_unscale_factor(layer(Renamed, dtype=torch.bfloat16)) == 1.0

    def no_source(obj):
        raise OSError("could not get source code")

    monkeypatch.setattr(inspect, "getsource", no_source)
    with pytest.raises(CompatError, match="cannot read the source"):
        fp16_unscale_factor(layer())
    assert fp16_unscale_factor(layer(dtype=torch.bfloat16)) == 1.0  # never applied to bf16


# --------------------------------------------------------------------------------------
# 4. Everything at once: vLLM's own objects identical, strict mode quiet
# --------------------------------------------------------------------------------------


def test_all_adapters_leave_vllm_untouched(base: Base):
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.executor.multiproc_executor import MultiprocExecutor
    from vllm.v1.request import Request

    with base.suspended():
        vllm_spaces = _vllm_owned()
        spaces = {**vllm_spaces, **_consumer_owned(base.gen)}
        before = snapshot(spaces)
        act = Activation(lambda: list(ADAPTERS))
        with _deactivating(act) as report:
            statuses = {r.name: r.status for r in report.results}
            assert statuses == {n: expected_status(n, base.env) for n in ADAPTER_NAMES}
            assert not report.problems
            during = snapshot(spaces)
            added_by_report = report_changes(report, "kv_cache_helpers_relocated")
            vllm_changed = {c for c in diff(before, during)
                            if c.rsplit(".", 1)[0] in vllm_spaces}
            assert vllm_changed == added_by_report, sorted(vllm_changed)
            assert all(c.rsplit(".", 1)[1] not in before[KV_UTILS] for c in added_by_report)
            listed = set().union(*(report_changes(report, n) for n in ADAPTER_NAMES))
            for n in ADAPTER_NAMES:  # everything at once: still only declared targets
                assert set(act.touched.get(n, [])) <= set(BY_NAME[n].targets), n
            assert {c for c in diff(before, during) if not c.startswith("os.environ")} == listed
            # vLLM's own engine sees vLLM's classes; speculators sees subclasses.
            mod = importlib.import_module
            assert mod("vllm.v1.core.sched.scheduler").Scheduler is Scheduler
            assert mod("vllm.v1.executor.multiproc_executor").MultiprocExecutor is MultiprocExecutor
            assert mod("vllm.v1.request").Request is Request
            gen = base.gen
            assert issubclass(gen.MultiprocExecutor, MultiprocExecutor)
            assert issubclass(gen.Scheduler, Scheduler)
            # one thin subclass per applied adapter that rebinds the name, stacked in
            # registry order (the last one outermost)
            executor_shims = [n for n in ("kv_cache_layout_resolution", "executor_sample_tokens",
                                          "shm_transport", "collective_rpc_unique_reply",
                                          "executor_warmup_split")
                              if statuses[n] is APPLIED]
            mro = gen.MultiprocExecutor.__mro__
            assert mro[len(executor_shims)] is MultiprocExecutor
            assert [c.__qualname__.rsplit(":", 1)[-1].rstrip("]")
                    for c in mro[:len(executor_shims)]] == executor_shims[::-1]
            sched_shims = [n for n in ("scheduler_block_size", "scheduler_prefill_only")
                           if statuses[n] is APPLIED]
            assert gen.Scheduler.__mro__[len(sched_shims)] is Scheduler
        after = snapshot(spaces)
    assert diff(before, after) == set()


def test_strict_activation_raises_nothing(base: Base):
    with base.suspended(), activated(*ADAPTERS, strict=True) as report:
        assert report.active and report.strict
        assert report.problems == []
        assert not report.by_status(Status.FAILED) and not report.by_status(Status.MISMATCH)
        assert set(report.applied) == {n for n in ADAPTER_NAMES
                                       if expected_status(n, base.env) is APPLIED}


def test_foreign_api_shape_is_a_mismatch_and_strict_refuses(base: Base, monkeypatch):
    """An installed API of neither the old nor the known new shape (a future vLLM): the
    adapter reports ``mismatch`` and changes nothing; strict mode raises and leaves
    nothing patched. Simulated by rebinding, in speculators' real module, the KV helper to
    a function of another signature."""
    gen = base.gen

    def get_kv_cache_config_from_groups(vllm_config, groups, budget):  # foreign shape
        raise AssertionError("never called")

    monkeypatch.setattr(gen, "get_kv_cache_config_from_groups", get_kv_cache_config_from_groups)
    spaces = {**_vllm_owned(), **_consumer_owned(gen)}
    before = snapshot(spaces)
    adapter = BY_NAME["kv_cache_specs_kwarg"]
    with activated(adapter) as report:
        assert report[adapter.name].status is Status.MISMATCH, report[adapter.name]
        assert "get_kv_cache_config_from_groups" in report[adapter.name].reason
        assert gen.get_kv_cache_config_from_groups is get_kv_cache_config_from_groups
    others = [a for a in ADAPTERS if a.name not in PRE_IMPORT]  # all, as a user activates
    with pytest.raises(CompatError, match=r"strict.*kv_cache_specs_kwarg: mismatch"), \
            activated(*others, strict=True):
        pass  # pragma: no cover - activation raises
    assert gen.get_kv_cache_config_from_groups is get_kv_cache_config_from_groups
    assert diff(before, snapshot(spaces)) == set()


def test_global_activation_never_used(base: Base):
    import speculators_compat

    assert speculators_compat.report() is None
