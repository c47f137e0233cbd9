"""The driver's intra-op threads around speculators' copies of the returned states.

Why: on GPU platforms vLLM reduces the driver's torch threads to one. The
``shm_transport`` adapter gives speculators' ``clone()`` of the returned states (after
the last model step) the driver's original threads, and must leave the model steps
before it on vLLM's count (spinning threads there slowed the H200 run down by half),
and restore vLLM's count however ``generate()`` ends. Toy generator and executor; the
real path runs in the GPU benchmark (docs/performance.md).
"""

from __future__ import annotations

import pytest
import torch

from speculators_compat._executor import GeneratorExecutor
from speculators_compat.adapters import shm_transport
from speculators_compat.transport.driver import Receiver


class _Generator:
    def __init__(self, threads: int | None) -> None:
        self.executor = GeneratorExecutor()  # no vLLM class under it: state only
        self.executor.compat_link(self)
        self.executor.compat_receiver = Receiver()
        if threads:
            self.__dict__["_compat_copy_threads"] = threads
        self.seen: list[tuple[str, int]] = []

    def generate(self, fail_after_fetch: bool = False) -> str:
        """The shape of speculators' generate(): steps, the states RPC, the copies."""
        self.seen.append(("steps", torch.get_num_threads()))
        receiver = self.executor.compat_receiver
        shm_transport._raise_copy_threads(self.executor, receiver)  # the RPC returned
        self.seen.append(("copies", torch.get_num_threads()))
        if fail_after_fetch:
            raise RuntimeError("boom")
        return "done"


@pytest.fixture
def reduced_threads():
    before = torch.get_num_threads()
    torch.set_num_threads(1)  # what vLLM's executor leaves the driver on GPU platforms
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _call(gen: _Generator, **kwargs):
    return shm_transport._copy_threads(lambda: gen.generate(**kwargs), gen, (), {})


def test_threads_raised_only_for_the_copies(reduced_threads):
    gen = _Generator(threads=2)
    assert _call(gen) == "done"
    assert gen.seen == [("steps", 1), ("copies", 2)]
    assert torch.get_num_threads() == 1
    stats = gen.executor.compat_receiver.stats
    assert stats["copy_threads"] == 2 and stats["after_fetch_s"] > 0
    assert "_compat_copy_call" not in gen.__dict__


def test_threads_restored_when_generate_fails(reduced_threads):
    gen = _Generator(threads=2)
    with pytest.raises(RuntimeError, match="boom"):
        _call(gen, fail_after_fetch=True)
    assert gen.seen == [("steps", 1), ("copies", 2)]
    assert torch.get_num_threads() == 1


def test_nothing_changes_where_vllm_did_not_reduce_threads(reduced_threads):
    gen = _Generator(threads=None)  # CPU platform: link() recorded nothing
    assert _call(gen) == "done"
    assert gen.seen == [("steps", 1), ("copies", 1)]
    assert gen.executor.compat_receiver.stats["copy_threads"] == 0


def test_a_states_rpc_outside_generate_changes_nothing(reduced_threads):
    gen = _Generator(threads=2)
    shm_transport._raise_copy_threads(gen.executor, gen.executor.compat_receiver)
    assert torch.get_num_threads() == 1
