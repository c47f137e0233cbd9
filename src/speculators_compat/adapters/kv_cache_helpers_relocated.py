"""vLLM 0.33 moved the KV-cache planning helpers out of ``kv_cache_utils``.

Why: speculators 0.3/0.4 import ``_get_kv_cache_groups_uniform_spec``,
``get_kv_cache_config_from_groups`` and ``unify_hybrid_kv_cache_specs`` from
``vllm.v1.core.kv_cache_utils`` at module import; 0.33 moved them to
``vllm.v1.core.kv_cache_planning`` without re-exporting, so the import fails:
``ImportError: cannot import name '_get_kv_cache_groups_uniform_spec'``.
How: before speculators' generator module is imported, bind the missing names in
``kv_cache_utils`` to the objects in their new home (adds names only; vLLM never
looks them up there any more). Revert deletes them. Phase ``both``: a vLLM worker
that re-runs a main script importing speculators at module level needs them as well.
Applies when: a name speculators imports is missing from ``kv_cache_utils`` and present
in ``kv_cache_planning``. Mismatch when it is in neither.
Remove when: speculators < 0.5 support is dropped.
"""

from __future__ import annotations

import importlib

from .._adapter import Adapter, Context, Phase, Stage, Verdict
from .._patcher import Patcher

OLD = "vllm.v1.core.kv_cache_utils"
NEW = "vllm.v1.core.kv_cache_planning"
NAMES = ("_get_kv_cache_groups_uniform_spec", "get_kv_cache_config_from_groups",
         "unify_hybrid_kv_cache_specs", "get_request_block_hasher", "init_none_hash")


class KVCacheHelpersRelocated(Adapter):
    name = "kv_cache_helpers_relocated"
    summary = "re-export KV-cache planning helpers where speculators imports them"
    upstream = "vLLM 0.33.0: helpers moved to vllm/v1/core/kv_cache_planning.py, no re-export"
    vllm_range = ">=0.33.0.dev0"
    phase = Phase.BOTH
    remove_when = "speculators < 0.5 support is dropped"
    stage = Stage.BEFORE_GENERATOR_IMPORT
    targets = tuple(f"{OLD}:{n}" for n in NAMES)

    def _missing(self) -> tuple[object, list[str]]:
        old = importlib.import_module(OLD)
        return old, [n for n in NAMES if not hasattr(old, n)]

    def probe(self, ctx: Context) -> Verdict:
        if ctx.versions.get("vllm") is None:
            return Verdict.not_needed("vLLM is not installed")
        _, missing = self._missing()
        if not missing:
            return Verdict.not_needed(f"{OLD} still defines the helpers speculators imports")
        try:
            new = importlib.import_module(NEW)
        except ModuleNotFoundError:
            return Verdict.mismatch(f"{OLD} lacks {missing} and {NEW} does not exist")
        absent = [n for n in missing if not hasattr(new, n)]
        if absent:
            return Verdict.mismatch(f"{absent} are in neither {OLD} nor {NEW}")
        return Verdict.needed(f"{missing} moved to {NEW}")

    def apply(self, patcher: Patcher, ctx: Context) -> None:
        old, missing = self._missing()
        new = importlib.import_module(NEW)
        for n in missing:
            patcher.setattr(old, n, getattr(new, n))
