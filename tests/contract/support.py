"""What the contract files share: namespaces and their snapshots, fresh activations,
vLLM objects built the way speculators builds them, speculators' step loops, and the
generic checks every adapter's contract file runs (probe vs. table, apply/revert
identity, declared targets).

No mocks: these run inside an environment built by ``tools/envs.py`` (a vLLM CPU
build, one speculators release on ``PYTHONPATH``). No engine is started and no model
runs; the only heavy objects are ``VllmConfig``s built from a tiny checkpoint, vLLM's
own ``Scheduler`` (which needs no worker) and KV-cache configs. Every activation is a
fresh ``Activation``; the package-global ``speculators_compat.activate()`` is never used.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import importlib.util
import inspect
import os
import sys
from collections import Counter
from collections.abc import Iterator
from types import ModuleType

import pytest
from helpers import checkpoint, installed, vllm_version
from packaging.version import Version

from speculators_compat import _versions
from speculators_compat._activation import Activation
from speculators_compat._adapter import Adapter
from speculators_compat._patcher import _label
from speculators_compat._report import Report
from speculators_compat._speculators import CONFIG_MODULE, GENERATOR_MODULE, WORKER_EXTENSION
from speculators_compat.adapters import ADAPTERS

from .expectations import APPLIED, EXPECTED, Env, V, expected_status  # noqa: F401

GEN = GENERATOR_MODULE
KV_UTILS = "vllm.v1.core.kv_cache_utils"
TF_CONFIG = "transformers.configuration_utils"
#: speculators' config generator (offline script metadata; no_gpu_kv_sizing wraps a name there).
CONFIG_GEN = CONFIG_MODULE
SPECULATORS_EXTENSION = WORKER_EXTENSION

#: speculators' generator constants (identical in 0.3.0 and 0.4.x on CPU).
MAX_NUM_SEQS = 32

MAX_MODEL_LEN = 512

#: Keys a module namespace may gain from just running code (warnings bookkeeping).
IGNORED_KEYS = frozenset({"__warningregistry__"})

#: vLLM variables adapters treat as the user's choice; the suite runs without them.
USER_CHOICES = ("VLLM_WORKER_MULTIPROC_METHOD", "VLLM_USE_V2_MODEL_RUNNER",
                "SPECULATORS_COMPAT_BATCH_INVARIANT", "VLLM_BATCH_INVARIANT")

ADAPTER_NAMES = [a.name for a in ADAPTERS]

BY_NAME: dict[str, Adapter] = {a.name: a for a in ADAPTERS}

#: Adapters that must act before ``import speculators`` / the generator import (their
#: declared stage); the session fixture holds them active, so their own tests suspend it.
PRE_IMPORT = tuple(a.name for a in ADAPTERS if a.stage.precedes)


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

def with_requirements(adapters) -> list[Adapter]:
    """``adapters`` preceded by the registry's adapters they require (transitively, in
    registry order): what decides whether they act in a full activation."""
    given = {a.name for a in adapters}
    needed: set[str] = set()
    todo = list(adapters)
    while todo:
        for r in todo.pop().requires:
            if r not in given and r not in needed:
                needed.add(r)
                todo.append(BY_NAME[r])
    return [a for a in ADAPTERS if a.name in needed] + list(adapters)


@contextlib.contextmanager
def activated(*adapters: Adapter, strict: bool = False) -> Iterator[Report]:
    """A fresh activation over ``adapters`` and the adapters they require (so each one's
    status is the one a full activation gives it); deactivated on exit."""
    registry = with_requirements(adapters)
    act = Activation(lambda: registry)
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

@contextlib.contextmanager
def adapter_context(base: Base, name: str) -> Iterator[None]:
    """Pre-import adapters are probed with the module fixture's copies suspended."""
    if name in PRE_IMPORT:
        with base.suspended():
            yield
    else:
        yield

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
              importlib.import_module(TF_CONFIG), importlib.import_module(CONFIG_GEN),
              *CONFIG_CLASSES(), *TRAINING_CLASSES()]
    return {_label(obj): obj for obj in spaces}


def CONFIG_CLASSES() -> list[type]:  # noqa: N802 - a constant computed late
    """transformers' config base, speculators' config base and EAGLE draft (the
    transformers5_config_* adapters change these class namespaces, scoped to speculators')."""
    from speculators.config import SpeculatorModelConfig
    from speculators.models.eagle import EagleSpeculator

    from speculators_compat.adapters._probes import config_class

    return [config_class(), SpeculatorModelConfig, EagleSpeculator]


def TRAINING_CLASSES() -> list[type]:  # noqa: N802 - a constant computed late
    """Where an EAGLE-3 draft meets its data: speculators' draft config and training
    dataset (the draft_aux_layers adapter wraps a method of each)."""
    from speculators.models.eagle3 import Eagle3SpeculatorConfig
    from speculators.train.data import Eagle3SampleFileDataset

    return [Eagle3SpeculatorConfig, Eagle3SampleFileDataset]

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

@contextlib.contextmanager
def one(base: Base, adapter: Adapter) -> Iterator[bool]:
    """``with one(base, adapter) as applied``: active, status checked against the table."""
    with activated(adapter) as report:
        status = report[adapter.name].status
        assert status is expected_status(adapter.name, base.env), report[adapter.name]
        yield status is APPLIED

SCHEDULER_CONFIG_03 = dict(max_num_seqs=32, max_model_len=512, max_num_batched_tokens=8192)

def _check_executor_shim(gen, vllm_cls, applied: bool, name: str,
                         overrides: set[str]) -> None:
    """The generator's executor is the one ``GeneratorExecutor`` over vLLM's class
    (isinstance-compatible), with feature ``name`` among its hooks and overriding exactly
    ``overrides`` of vLLM's methods; vLLM's own class object is untouched."""
    from speculators_compat._executor import GeneratorExecutor

    mod = importlib.import_module("vllm.v1.executor.multiproc_executor")
    assert mod.MultiprocExecutor is vllm_cls
    if not applied:
        assert gen.MultiprocExecutor is vllm_cls
        return
    shim = gen.MultiprocExecutor
    assert shim.__mro__[1:3] == (GeneratorExecutor, vllm_cls), shim.__mro__
    assert name in shim.compat_feature_names, shim.compat_feature_names
    own = {k for k, v in vars(shim).items() if callable(v) and not k.startswith("compat_")}
    assert own == overrides, own
    for k in overrides:
        assert vars(shim)[k] is not vars(vllm_cls).get(k)

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


# --------------------------------------------------------------------------------------
# The checks every adapter's contract file runs
# --------------------------------------------------------------------------------------


def check_probe_agrees_with_release(base: Base, name: str):
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


def check_apply_then_revert(base: Base, name: str):
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
                GEN, TF_CONFIG, CONFIG_GEN, "VllmHiddenStatesGenerator",
                *(_label(c) for c in (*CONFIG_CLASSES(), *TRAINING_CLASSES())))}
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
