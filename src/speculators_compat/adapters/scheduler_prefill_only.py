"""Prefill-only scheduling: every sequence of a batch is captured whole, whatever its size.

Why (upstream hazards, silent data loss): speculators never calls
``update_from_output``, so a request whose prefill finished stays ``running`` with
nothing to schedule. With more sequences than ``max_num_seqs`` (32) the others can
never be scheduled: speculators 0.4.x stops with only 32 captured (reported upstream;
here it raises ``Request req_0_32 not found``). And speculators 0.3.0 aborts every
request scheduled in a step, including one whose prefill was only partly scheduled
(chunked prefill: batches above ``max_num_batched_tokens``), truncating it.
How: the ``Scheduler`` seen by speculators' module finishes a request as soon as its
prompt is fully computed (at the start of the next ``schedule()``, freeing its slot and
blocks), and defers an abort requested for a request whose prompt is not yet fully
computed until it is. Nothing changes for requests that fit in one step. Under KV
cache pressure it admits a waiting request only when its whole prompt fits next to
what the running ones still need (:func:`hold_back`): vLLM would admit it on its first
chunk and later preempt a request mid-prefill, whose recompute speculators' loop cannot
follow (the capture then refuses the call). The deferral is
for speculators' own step loop only: ``abort_all()`` (what ``generate_guard`` calls after
a failed ``generate()``) aborts every request at once, deferred ones included, so that no
request of a failed call can run in the next one.
Applies when: the scheduler exposes ``running`` / ``finish_requests`` and requests
track ``num_computed_tokens`` / ``num_prompt_tokens`` (V1 scheduler), except for
speculators 0.3.x on a vLLM whose ``SchedulerConfig`` leaves chunked prefill off by
default (0.11.x, 0.3.0's own pin): 0.3's loop then finishes every request it scheduled
and no prompt is ever split, so nothing is lost.
Fails closed: when its probe finds an unknown shape or raises, building the generator
and ``generate()`` raise ``CompatError`` (opt out:
``SPECULATORS_COMPAT_DISABLE=scheduler_prefill_only``).
Remove when: speculators < 0.5 support is dropped.
"""

from __future__ import annotations

from types import ModuleType

from .._adapter import Context, Verdict
from .._patcher import Patcher
from .._report import Kind
from . import _probes, _refusal, _targets, _wrappers
from ._base import GeneratorAdapter


def _prefilled(request) -> bool:
    return request.num_computed_tokens >= request.num_prompt_tokens


def hold_back(scheduler) -> list:
    """Take the waiting requests out of the queue (for one ``schedule()``) whose whole
    prompt would not fit in the KV cache next to what the running ones still need.

    vLLM admits a waiting request when its first chunk fits; a later chunk of a running
    one that finds no free block then preempts a request (its computed tokens dropped,
    recomputed from position 0), which speculators' loop cannot follow. Admitting only
    what fits whole never preempts. The queue's order is kept (everything after the
    first request that does not fit waits too); with nothing running the head is always
    admitted (vLLM then fits it or refuses it itself). Only for a single KV cache group
    (one block size and one need per token); otherwise nothing is held back.
    """
    if not scheduler.waiting:
        return []
    try:
        held = _over_budget(scheduler)
    except (AttributeError, IndexError, KeyError, TypeError):  # another shape: admit as vLLM does
        return []
    if held:
        scheduler.waiting.remove_requests(held)
    return held


def _over_budget(scheduler) -> list:
    groups = scheduler.kv_cache_config.kv_cache_groups
    if len(groups) != 1:
        return []
    manager = scheduler.kv_cache_manager
    block = groups[0].kv_cache_spec.block_size
    free = manager.block_pool.get_num_free_blocks()

    def blocks(request) -> int:
        return -(-request.num_prompt_tokens // block)

    for request in scheduler.running:
        free -= max(0, blocks(request) - len(manager.get_block_ids(request.request_id)[0]))
    held: list = []
    first = not scheduler.running
    for request in list(scheduler.waiting):
        need = blocks(request)
        if held or (need > free and not first):
            held.append(request)
            continue
        free -= need
        first = False
    return held


def chunked_prefill_by_default(config_cls) -> bool:
    """Whether ``SchedulerConfig(...)`` without ``enable_chunked_prefill`` (speculators
    0.3.0's call) chunks prompts; ``True`` when it cannot be told (the safe answer)."""
    param = (_probes.parameters(config_cls) or {}).get("enable_chunked_prefill")
    if param is None or param.default is param.empty:
        return True
    return bool(param.default)  # 0.11: None, left unset (off); 0.12+: True


class SchedulerPrefillOnly(GeneratorAdapter):
    name = "scheduler_prefill_only"
    kind = Kind.SAFEGUARD
    summary = "finish requests once prefilled; never abort a partly prefilled one"
    upstream = ("speculators 0.3/0.4 hazards: >max_num_seqs sequences never scheduled "
                "(0.4), chunked prompts aborted mid-prefill (0.3); vLLM V1 scheduler")
    vllm_range = None
    remove_when = "speculators < 0.5 support is dropped"
    targets = _targets.in_generator("Scheduler")
    refusal_targets = _targets.REFUSAL_TARGETS
    fail_closed = True

    def refuse(self, patcher: Patcher, ctx: Context, message: str) -> None:
        _refusal.refuse_generator(patcher, ctx, message)

    def check(self, ctx: Context, gen: ModuleType) -> Verdict:
        sched, req = gen.Scheduler, gen.Request
        missing = [n for n in ("schedule", "finish_requests") if not hasattr(sched, n)]
        src = _probes.source(req)
        missing += [n for n in ("num_computed_tokens", "num_prompt_tokens") if n not in src]
        if missing:
            return Verdict.mismatch(f"scheduler/request lack {missing}")
        if (_probes.worker_contract(ctx) == _targets.CONTRACT_LIST
                and not chunked_prefill_by_default(gen.SchedulerConfig)):
            return Verdict.not_needed("speculators 0.3's loop finishes every scheduled request "
                                      "and chunked prefill is off by default: no prompt is split")
        return Verdict.needed("speculators' step loop never finishes prefilled requests; "
                              "batches above max_num_seqs or chunked prompts lose data")

    def patch(self, patcher: Patcher, ctx: Context, gen: ModuleType) -> None:
        base = gen.Scheduler
        aborted = gen.RequestStatus.FINISHED_ABORTED

        def schedule(self, *args, **kwargs):
            done = [r.request_id for r in list(self.running) if _prefilled(r)]
            deferred = getattr(self, "_compat_deferred", set())
            done += [rid for rid in deferred
                     if rid in self.requests and _prefilled(self.requests[rid])
                     and rid not in done]
            if done:
                base.finish_requests(self, done, aborted)
                deferred.difference_update(done)
            held = hold_back(self)
            try:
                return base.schedule(self, *args, **kwargs)
            finally:
                for request in held:  # the tail of the queue, back in its order
                    self.waiting.add_request(request)

        def finish_requests(self, request_ids, finished_status, *args, **kwargs):
            if finished_status == aborted and request_ids is not None:
                ids = [request_ids] if isinstance(request_ids, str) else list(request_ids)
                pending = {rid for rid in ids
                           if rid in self.requests and not _prefilled(self.requests[rid])}
                if pending:
                    deferred = self.__dict__.setdefault("_compat_deferred", set())
                    deferred.update(pending)
                    ids = [rid for rid in ids if rid not in pending]
                return base.finish_requests(self, ids, finished_status, *args, **kwargs)
            return base.finish_requests(self, request_ids, finished_status, *args, **kwargs)

        def abort_all(self) -> None:
            """Abort every request now, including those not fully prefilled."""
            self.__dict__.pop("_compat_deferred", None)
            base.finish_requests(self, list(self.requests), aborted)

        patcher.setattr(gen, "Scheduler", _wrappers.subclass(
            base, self.name, {"schedule": schedule, "finish_requests": finish_requests,
                              _targets.ABORT_ALL: abort_all}))

