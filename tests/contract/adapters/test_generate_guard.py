"""Contract of the ``generate_guard`` adapter,
on the installed vLLM and speculators.

Speculators' legacy call shape fails (or is wrong) bare where the upstream note says
so and works through the adapter. The checks every adapter shares (the probe agrees with
the expectation table, apply/revert restores identity and changes only the declared
targets) run for every adapter in tests/contract/test_every_adapter.py.
"""

from __future__ import annotations

import pytest
from helpers import checkpoint

from speculators_compat._errors import CompatError

from ..expectations import V, applied_if
from ..support import (
    APPLIED,
    BY_NAME,
    MAX_NUM_SEQS,
    activated,
    kv_config_for,
    new_scheduler,
    one,
    resolved_config,
)

NAME = "generate_guard"

#: Its expected status on the installed release, and why (read by ``expectations.py``).
EXPECTED = (
    # speculators' own generate() hazard, independent of the vLLM release.
    lambda e: applied_if(e.speculators < V("0.5.0.dev0")),
    "generate() adds requests before running; a failure leaks into the next call")


def test_legacy_call_shape(base, vllm_config):
    legacy_call_shape(base, base.gen, vllm_config, BY_NAME[NAME])


def legacy_call_shape(base, gen, cfg, adapter):
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
