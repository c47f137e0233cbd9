"""The adapter registry, applied in this order. One module per upstream change.

The list runs stage by stage (before ``import speculators``, before the generator
module's import, names inside it, workers); on a shared target a later adapter wraps (or
hooks the executor) outside an earlier one. Where that order matters, the adapter says
so itself (``after``, ``requires``), and every activation checks this list against the
declarations (``_activation.check_order``): nothing here depends on a comment.
"""

from __future__ import annotations

from .._adapter import Adapter
from .attention_block_size import AttentionBlockSize
from .block_hasher_unused import BlockHasherUnused
from .collective_rpc_unique_reply import CollectiveRpcUniqueReply
from .cpu_block_size import CPUBlockSize
from .draft_aux_layers import DraftAuxLayers
from .executor_sample_tokens import ExecutorSampleTokens
from .executor_warmup_split import ExecutorWarmupSplit
from .generate_guard import GenerateGuard
from .hook_capture import HookCapture
from .kv_cache_config_fields import KVCacheConfigFields
from .kv_cache_extensible_off import KVCacheExtensibleOff
from .kv_cache_groups_hybrid import KVCacheGroupsHybrid
from .kv_cache_helpers_relocated import KVCacheHelpersRelocated
from .kv_cache_layout_resolution import KVCacheLayoutResolution
from .kv_cache_specs_kwarg import KVCacheSpecsKwarg
from .no_gpu_kv_sizing import NoGpuKVSizing
from .prefix_caching_off import PrefixCachingOff
from .request_eos_token_id import RequestEosTokenId
from .request_metadata_in_driver import RequestMetadataInDriver
from .result_order_natural import ResultOrderNatural
from .scheduler_block_size import SchedulerBlockSize
from .scheduler_config_encoder_decoder import SchedulerConfigEncoderDecoder
from .scheduler_prefill_only import SchedulerPrefillOnly
from .scheduling_sync import SchedulingSync
from .shm_transport import ShmTransport
from .shutdown_at_exit import ShutdownAtExit
from .spawn_main_guard import SpawnMainGuard
from .speculators_supported import SpeculatorsSupported
from .step_overlap import StepOverlap
from .transformers5_config_dataclass import Transformers5ConfigDataclass
from .transformers5_config_pad_token import Transformers5ConfigPadToken
from .transformers5_config_torch import Transformers5ConfigTorch
from .transformers5_config_validate import Transformers5ConfigValidate
from .worker_spawn_method import WorkerSpawnMethod

ADAPTERS: list[Adapter] = [
    # before `import speculators`
    Transformers5ConfigTorch(),
    Transformers5ConfigDataclass(),
    # before speculators' generator module is imported
    KVCacheHelpersRelocated(),
    Transformers5ConfigValidate(),
    Transformers5ConfigPadToken(),
    # scope: speculators with the in-process generator
    SpeculatorsSupported(),
    # names inside speculators' generator module
    SchedulerConfigEncoderDecoder(),
    SchedulingSync(),
    PrefixCachingOff(),
    KVCacheExtensibleOff(),
    CPUBlockSize(),
    AttentionBlockSize(),
    KVCacheSpecsKwarg(),
    KVCacheGroupsHybrid(),
    KVCacheConfigFields(),
    NoGpuKVSizing(),
    SchedulerBlockSize(),
    SchedulerPrefillOnly(),
    RequestEosTokenId(),
    BlockHasherUnused(),
    KVCacheLayoutResolution(),
    ExecutorSampleTokens(),
    HookCapture(),
    StepOverlap(),
    RequestMetadataInDriver(),
    ShmTransport(),
    CollectiveRpcUniqueReply(),
    ExecutorWarmupSplit(),
    ResultOrderNatural(),
    GenerateGuard(),
    ShutdownAtExit(),
    SpawnMainGuard(),
    DraftAuxLayers(),
    WorkerSpawnMethod(),
]

__all__ = ["ADAPTERS"]
