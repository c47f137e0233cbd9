"""scheduler_prefill_only's admission under KV-cache pressure (``hold_back``), with toy
scheduler parts: a waiting request is admitted only when its whole prompt fits next to
what the running ones still need, in queue order; with nothing running the head always
is. The real-vLLM counterpart is test_generator.py's KV-cache-pressure test."""

from __future__ import annotations

from collections import deque
from types import SimpleNamespace as NS

from speculators_compat.adapters.scheduler_prefill_only import hold_back


class Queue(deque):
    def add_request(self, r):
        self.append(r)

    def remove_requests(self, rs):
        for r in list(rs):
            self.remove(r)


def request(rid, tokens):
    return NS(request_id=rid, num_prompt_tokens=tokens)


def scheduler(free, running=(), waiting=(), allocated=None, groups=1):
    allocated = allocated or {}
    manager = NS(block_pool=NS(get_num_free_blocks=lambda: free),
                 get_block_ids=lambda rid: ([0] * allocated.get(rid, 0),))
    spec = NS(kv_cache_spec=NS(block_size=16))
    return NS(waiting=Queue(waiting), running=list(running), kv_cache_manager=manager,
              kv_cache_config=NS(kv_cache_groups=[spec] * groups))


def test_admits_what_fits_whole_and_keeps_the_order():
    w = [request("a", 32), request("b", 40), request("c", 16)]  # 2, 3, 1 blocks
    s = scheduler(free=4, waiting=w)
    assert [r.request_id for r in hold_back(s)] == ["b", "c"]  # c would fit: order kept
    assert [r.request_id for r in s.waiting] == ["a"]


def test_running_requests_keep_the_blocks_they_still_need():
    run = [request("r", 100)]  # 7 blocks, 3 allocated: 4 more to come
    s = scheduler(free=6, running=run, waiting=[request("a", 32), request("b", 16)],
                  allocated={"r": 3})
    assert [r.request_id for r in hold_back(s)] == ["b"]  # 6 - 4 = 2: a fits, b not


def test_with_nothing_running_the_head_is_admitted_even_if_too_big():
    s = scheduler(free=2, waiting=[request("big", 100), request("a", 16)])
    assert [r.request_id for r in hold_back(s)] == ["a"]


def test_nothing_held_when_everything_fits_or_the_shape_is_unknown():
    w = [request("a", 32), request("b", 32)]
    assert hold_back(scheduler(free=100, waiting=w)) == []
    assert hold_back(scheduler(free=1, running=[request("r", 16)], waiting=w, groups=2)) == []
    assert hold_back(NS(waiting=Queue(w), running=[])) == []  # no KV cache parts: as vLLM
