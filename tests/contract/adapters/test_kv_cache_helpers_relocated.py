"""Contract of the ``kv_cache_helpers_relocated`` adapter,
on the installed vLLM and speculators.

Speculators' legacy call shape fails (or is wrong) bare where the upstream note says
so and works through the adapter. The checks every adapter shares (the probe agrees with
the expectation table, apply/revert restores identity and changes only the declared
targets) run for every adapter in tests/contract/test_every_adapter.py.
"""

from __future__ import annotations

import importlib
import importlib.util

from ..expectations import V, applied_if
from ..support import (
    BY_NAME,
    KV_UTILS,
    one,
)

NAME = "kv_cache_helpers_relocated"

#: Its expected status on the installed release, and why (read by ``expectations.py``).
EXPECTED = (
    lambda e: applied_if(e.vllm >= V("0.33.0.dev0")),
    "0.33 moved _get_kv_cache_groups_uniform_spec & co. to kv_cache_planning")


def test_legacy_call_shape(base, vllm_config):
    legacy_call_shape(base, base.gen, vllm_config, BY_NAME[NAME])


def legacy_call_shape(base, gen, cfg, adapter):
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
