"""The adapter registry: the adapter modules, applied in this order, one line each.

One adapter per upstream change, one module per adapter: ``adapters/<name>.py`` defines
the adapter whose ``name`` is ``<name>`` (:func:`adapter_in` finds it), so registering
one is its line in :data:`ORDER` and nothing else.

The list runs stage by stage (before ``import speculators``, before the generator
module's import, names inside it, workers); on a shared target a later adapter wraps (or
hooks the executor) outside an earlier one. Where that order matters, the adapter says
so itself (``after``, ``requires``), and every activation checks this list against the
declarations (``_activation.check_order``): nothing here depends on a comment.
"""

from __future__ import annotations

import importlib
from types import ModuleType

from .._adapter import Adapter

#: The adapter modules of this package, in registry order.
ORDER: tuple[str, ...] = (
    # before `import speculators`
    "transformers5_config_torch",
    "transformers5_config_dataclass",
    # before speculators' generator module is imported
    "kv_cache_helpers_relocated",
    "transformers5_config_validate",
    "transformers5_config_pad_token",
    # scope: speculators with the in-process generator
    "speculators_supported",
    # names inside speculators' generator module
    "scheduler_config_encoder_decoder",
    "scheduling_sync",
    "prefix_caching_off",
    "kv_cache_extensible_off",
    "cpu_block_size",
    "attention_block_size",
    "kv_cache_specs_kwarg",
    "kv_cache_groups_hybrid",
    "kv_cache_config_fields",
    "no_gpu_kv_sizing",
    "scheduler_block_size",
    "scheduler_prefill_only",
    "request_eos_token_id",
    "block_hasher_unused",
    "kv_cache_layout_resolution",
    "executor_sample_tokens",
    "hook_capture",
    "step_overlap",
    "request_metadata_in_driver",
    "shm_transport",
    "collective_rpc_unique_reply",
    "executor_warmup_split",
    "result_order_natural",
    "generate_guard",
    "shutdown_at_exit",
    "spawn_main_guard",
    "draft_aux_layers",
    "worker_spawn_method",
)


def adapter_in(module: ModuleType) -> Adapter:
    """The adapter ``module`` defines: its one :class:`Adapter` subclass whose ``name`` is
    the module's own name (so its contract file, ``test_<name>.py``, and the name users
    disable it by are the module's)."""
    leaf = module.__name__.rpartition(".")[2]
    found = [c for c in vars(module).values()
             if isinstance(c, type) and issubclass(c, Adapter)
             and c.__module__ == module.__name__ and c.name == leaf]
    if len(found) != 1:
        raise ImportError(
            f"speculators-compat: adapter module {module.__name__} must define exactly one "
            f"Adapter subclass with name = {leaf!r} (found {[c.__name__ for c in found]}); "
            "an adapter's module is named after it")
    return found[0]()


ADAPTERS: list[Adapter] = [adapter_in(importlib.import_module(f"{__name__}.{m}"))
                           for m in ORDER]

__all__ = ["ADAPTERS", "ORDER", "adapter_in"]
