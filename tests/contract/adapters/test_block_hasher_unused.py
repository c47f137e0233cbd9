"""Contract of the ``block_hasher_unused`` adapter, on the installed vLLM and speculators.

The installed generator passes the hasher it builds to every
``Request`` (0.4.x); the condition reads vLLM's own config classes (prefix caching off and
no KV connector: no hasher; either on: the hasher stays); and the installed scheduler runs
speculators 0.4's step loop on requests made without a hasher (what the generator does
once the adapter applied), every prompt token scheduled once.

The checks every adapter shares (probe vs. expectation table, apply/revert identity,
declared targets only) are in tests/contract/test_every_adapter.py.
"""

from __future__ import annotations

import inspect

from ..expectations import applied_if
from ..support import (
    BY_NAME,
    MAX_MODEL_LEN,
    build_vllm_config,
    drive_like_speculators_04,
    kv_config_for,
    make_request,
    new_scheduler,
    one,
    resolved_config,
)

NAME = "block_hasher_unused"

#: Its expected status on the installed release, and why (read by ``expectations.py``).
EXPECTED = (
    # Only 0.4.x passes a block_hasher; every vLLM it runs on defaults it to None.
    lambda e: applied_if(e.speculators_04),
    "speculators 0.4.x hashes every prompt block for a prefix cache it turns off")


def test_generator_passes_its_hasher_to_every_request(base):
    src = inspect.getsource(base.gen)
    assert ("block_hasher=self.block_hasher" in src) == base.env.speculators_04
    assert ("self.block_hasher = get_request_block_hasher(" in src) == base.env.speculators_04
    init = base.gen.VllmHiddenStatesGenerator.__init__
    with one(base, BY_NAME[NAME]) as applied:
        assert (base.gen.VllmHiddenStatesGenerator.__init__ is not init) == applied
    assert base.gen.VllmHiddenStatesGenerator.__init__ is init


def test_condition_reads_vllms_config():
    import vllm.config as vc

    from speculators_compat.adapters.block_hasher_unused import hasher_unused

    cfg = build_vllm_config()  # as speculators 0.4 builds it: prefix caching off
    assert cfg.cache_config.enable_prefix_caching is False
    assert hasher_unused(cfg)
    on = build_vllm_config(cache_config=vc.CacheConfig(gpu_memory_utilization=0.8,
                                                       enable_prefix_caching=True))
    assert on.cache_config.enable_prefix_caching is True and not hasher_unused(on)
    cfg.kv_transfer_config = object()  # any KV connector may read the hashes
    assert not hasher_unused(cfg)
    assert not hasher_unused(None)


def test_scheduler_runs_requests_without_a_hasher(base):
    import vllm.config as vc
    from vllm.v1.core.sched.scheduler import Scheduler

    from speculators_compat.adapters.scheduler_prefill_only import chunked_prefill_by_default

    # A step budget below the prompts' total (chunked prompts), where vLLM allows one: on
    # 0.11.x chunked prefill is off unless asked, and its config refuses a budget below
    # max_model_len (speculators 0.3.0, the only release that runs there, never asks).
    budget = 64 if chunked_prefill_by_default(vc.SchedulerConfig) else MAX_MODEL_LEN
    cfg = resolved_config(max_num_batched_tokens=budget)
    sched = new_scheduler(Scheduler, cfg, kv_config_for(cfg))
    lens = {"req_0_0": 40, "req_0_1": 70, "req_0_2": 9}
    for rid, n in lens.items():
        req = make_request(rid, n)
        # made without a hasher, as vLLM's engine makes them with prefix caching off
        assert not getattr(req, "block_hashes", None)
        sched.add_request(req)
    assert drive_like_speculators_04(sched, lens) == lens
    assert not sched.requests
