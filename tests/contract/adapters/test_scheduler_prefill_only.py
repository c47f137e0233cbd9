"""Contract of the ``scheduler_prefill_only`` adapter,
on the installed vLLM and speculators.

Speculators' legacy call shape fails (or is wrong) bare where the upstream note says
so and works through the adapter. The checks every adapter shares (the probe agrees with
the expectation table, apply/revert restores identity and changes only the declared
targets) run for every adapter in tests/contract/test_every_adapter.py.
"""

from __future__ import annotations

from collections import Counter

import pytest

from ..expectations import V, applied_if
from ..support import (
    BY_NAME,
    MAX_NUM_SEQS,
    build_vllm_config,
    drive_like_speculators_03,
    drive_like_speculators_04,
    kv_config_for,
    make_request,
    new_scheduler,
    one,
    resolved_config,
)

NAME = "scheduler_prefill_only"

#: Its expected status on the installed release, and why (read by ``expectations.py``).
EXPECTED = (
    # A speculators hazard, not a vLLM change: speculators never calls
    # update_from_output, so prefilled requests stay `running` on every V1
    # scheduler (>max_num_seqs sequences never scheduled in 0.4; chunked prompts
    # aborted mid-prefill in 0.3). Not for 0.3 on 0.11.x, where SchedulerConfig leaves
    # chunked prefill off by default (0.3's loop finishes what it scheduled).
    lambda e: applied_if(not (e.speculators_03 and e.vllm < V("0.12.0.dev0"))),
    "speculators' step loop never finishes prefilled requests (V1, chunked prefill)")


def test_legacy_call_shape(base, vllm_config):
    legacy_call_shape(base, base.gen, vllm_config, BY_NAME[NAME])


def legacy_call_shape(base, gen, cfg, adapter):
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
