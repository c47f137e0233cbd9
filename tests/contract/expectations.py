"""The expectation table: per adapter, the status its probe must reach on a release.

Written from the upstream changes each adapter documents (docs/adapters.md) and checked
against the installed versions by every adapter's contract file: a future vLLM that
changes shape fails there, loudly. One entry per adapter in the registry
(``tests/contract/test_registry.py`` checks that).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import pytest
from packaging.version import Version

from speculators_compat._report import Status

APPLIED, NOT_NEEDED = Status.APPLIED, Status.NOT_NEEDED


def V(s: str) -> Version:
    return Version(s)


# --------------------------------------------------------------------------------------
# The installed environment
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
    "transformers5_config_dataclass": (
        lambda e: _status(e.transformers_major >= 5),
        "transformers 5 makes every PretrainedConfig subclass a dataclass with a generated "
        "__init__: speculators' pydantic configs raise AttributeError __pydantic_fields_set__"),
    "transformers5_config_pad_token": (
        lambda e: _status(e.transformers_major >= 5),
        "transformers 5 dropped pad_token_id from the PreTrainedConfig base; speculators' "
        "EagleSpeculator.__init__ reads transformer_layer_config.pad_token_id"),
    "transformers5_config_validate": (
        lambda e: _status(e.transformers_major >= 5),
        "transformers 5's config save_pretrained calls self.validate(), pydantic's "
        "BaseModel.validate(value) on speculators' configs: TypeError"),
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
    "kv_cache_extensible_off": (
        # verified: absent in 0.16 and 0.32 (CacheConfig), present in 0.34.0.
        lambda e: _status(e.vllm >= V("0.34.0.dev0")),
        "CacheConfig.enable_extensible_kv_cache (on by default on CUDA) from 0.34"),
    "cpu_block_size": (
        _cpu_block_size,
        "CPU attention kernels accept MultipleOf(32) only (0.29+); 16 worked before"),
    "attention_block_size": (
        # upstream: CacheConfig.user_specified_block_size appeared in 0.18.0 (absent in
        # 0.17.0's vllm/config/cache.py, present in 0.18-0.34).
        lambda e: _status(e.vllm >= V("0.18.0.dev0")),
        "an explicit block_size binds every attention backend from 0.18 (sparse MLA: 64)"),
    "kv_cache_groups_hybrid": (
        # get_kv_cache_groups(vllm_config, kv_cache_spec) and is_kv_cache_spec_uniform exist
        # in every release the shim supports (0.11-0.34; kv_cache_planning from 0.33).
        lambda e: APPLIED,
        "speculators builds one KV cache group; hybrid models need vLLM's grouping"),
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
    "request_metadata_in_driver": (
        # Follows hook_capture (the shim's extension ignores the counts); only 0.4.x sends
        # them.
        lambda e: _status(e.speculators_04 and e.vllm >= V("0.12.0.dev0")),
        "speculators 0.4.x sends every step's token counts to the workers"),
    "step_overlap": (
        # Follows hook_capture (the step RPC is the shim's extension's); vLLM 0.11.1 queues
        # non-blocking replies in order (FutureWrapper, futures_queue); both releases'
        # loops wait for every step and read no output.
        lambda e: _status(e.speculators < V("0.5.0.dev0") and e.vllm >= V("0.11.1.dev0")),
        "speculators' generate() waits for every step's reply and reads none"),
    "block_hasher_unused": (
        # Only 0.4.x passes a block_hasher; every vLLM it runs on defaults it to None.
        lambda e: _status(e.speculators_04),
        "speculators 0.4.x hashes every prompt block for a prefix cache it turns off"),
    "generate_guard": (
        # speculators' own generate() hazard, independent of the vLLM release.
        lambda e: _status(e.speculators < V("0.5.0.dev0")),
        "generate() adds requests before running; a failure leaks into the next call"),
    "shutdown_at_exit": (
        # speculators' own __del__ (both releases) is its only shutdown, independent of the
        # vLLM release.
        lambda e: _status(e.speculators < V("0.5.0.dev0")),
        "speculators 0.3/0.4 stop the executor only in __del__ (teardown, at exit)"),
    "spawn_main_guard": (
        # The generator starts MultiprocExecutor itself on every release; whether its
        # workers spawn is decided per construction (the adapter checks it there).
        lambda e: _status(e.speculators < V("0.5.0.dev0")),
        "spawned workers run the main script again; an unguarded one builds a generator "
        "in every worker"),
    "draft_aux_layers": (
        # speculators' own numbering vs. vLLM's (output of layer k = vLLM id k + 1) and a
        # draft config that names no layers: every vLLM release, both speculators releases.
        lambda e: _status(e.speculators < V("0.5.0.dev0")),
        "the generator captures layer outputs and Eagle3SpeculatorConfig leaves "
        "eagle_aux_hidden_state_layer_ids None; vLLM feeds the layer inputs (ids k + 1)"),
}

def expected_status(name: str, env: Env) -> Status:
    fn, why = EXPECTED[name]
    status = fn(env)
    if status is None:
        pytest.fail(f"no expectation recorded for {name} on {env}: read the installed "
                    f"vLLM source and add it to EXPECTED ({why})")
    return status
