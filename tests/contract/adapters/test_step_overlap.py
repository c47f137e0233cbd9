"""Contract of the ``step_overlap`` adapter, on the installed vLLM and speculators.

The installed executor's non-blocking RPCs are what the adapter relies on (a reply queue
that a blocking call drains first, in order); through the adapter each of speculators'
steps is one non-blocking ``_compat_step`` message, at most one step runs ahead, a
following ``sample_tokens`` sends nothing, any other RPC waits for the steps first, and
a failed step's error is raised with nothing left in flight. The generator itself runs
through it in the e2e suite (tests/e2e), against transformers.

The checks every adapter shares are in tests/contract/test_every_adapter.py.
"""

from __future__ import annotations

import inspect

import pytest

from ..expectations import V, applied_if
from ..support import BY_NAME, _check_executor_shim, one

NAME = "step_overlap"

#: Its expected status on the installed release, and why (read by ``expectations.py``).
EXPECTED = (
    # Follows hook_capture (the step RPC is the shim's extension's); vLLM 0.11.1 queues
    # non-blocking replies in order (FutureWrapper, futures_queue); both releases'
    # loops wait for every step and read no output.
    lambda e: applied_if(e.speculators < V("0.5.0.dev0") and e.vllm >= V("0.11.1.dev0")),
    "speculators' generate() waits for every step's reply and reads none")


class _Reply:
    """A non-blocking reply as the executor hands it out: ``result()`` answers or raises."""

    def __init__(self, log, tag, error=None):
        self.log, self.tag, self.error = log, tag, error
        self.waited = False

    def result(self):
        self.waited = True
        self.log.append(("wait", self.tag))
        if self.error is not None:
            raise self.error
        return None


def _executor(gen, monkeypatch, fail=()):
    from vllm.v1.executor.multiproc_executor import MultiprocExecutor

    log, replies = [], []

    def collective_rpc(self, method, timeout=None, args=(), kwargs=None, non_block=False,
                       unique_reply_rank=None, **extra):
        tag = f"{method}#{sum(1 for m in log if m[0] == 'send')}"
        log.append(("send", method, non_block, unique_reply_rank))
        if not non_block:
            return ["w"]
        reply = _Reply(log, tag, RuntimeError(f"worker failed in {tag}")
                       if len(replies) in fail else None)
        replies.append(reply)
        return reply

    monkeypatch.setattr(MultiprocExecutor, "collective_rpc", collective_rpc)
    ex = object.__new__(gen.MultiprocExecutor)
    ex.output_rank = 0
    return ex, log, replies


def test_reply_queue_and_step_shape(base, monkeypatch):
    from vllm.v1.executor.multiproc_executor import MultiprocExecutor

    gen = base.gen
    src = inspect.getsource(gen)
    # speculators' loop waits for every step and reads no output.
    assert ".execute_model(scheduler_output)" in src and "update_from_output" not in src
    if base.env.vllm >= V("0.11.1.dev0"):
        # The reply queue the adapter relies on: non_block futures that every blocking
        # call drains first, in order.
        assert "non_block" in inspect.signature(MultiprocExecutor.collective_rpc).parameters
        assert "futures_queue" in inspect.getsource(MultiprocExecutor.collective_rpc)
    with one(base, BY_NAME[NAME]) as applied:
        _check_executor_shim(gen, MultiprocExecutor, applied, NAME,
                             {"execute_model", "sample_tokens", "collective_rpc"})
        if not applied:
            return
        ex, log, replies = _executor(gen, monkeypatch)
        assert ex.execute_model("so-0") is None
        assert ex.sample_tokens(None) is None  # 0.4's second call: nothing sent
        assert ex.execute_model("so-1") is None
        # one message per step, without waiting; step 0 waited for after step 1 was sent
        assert log == [("send", "_compat_step", True, 0), ("send", "_compat_step", True, 0),
                       ("wait", "_compat_step#0")]
        assert ex.collective_rpc("_get_captured_states", unique_reply_rank=0) == ["w"]
        # any other RPC: the step in flight first
        assert log[3:] == [("wait", "_compat_step#1"),
                           ("send", "_get_captured_states", False, 0)]
        assert all(r.waited for r in replies)


def test_a_failed_step_is_raised_with_nothing_left_in_flight(base, monkeypatch):
    gen = base.gen
    with one(base, BY_NAME[NAME]) as applied:
        if not applied:  # the status is checked against the expectation table above
            return
        ex, log, replies = _executor(gen, monkeypatch, fail={0})
        ex.execute_model("so-0")
        with pytest.raises(RuntimeError, match="worker failed in _compat_step#0"):
            ex.execute_model("so-1")  # step 1 was sent before step 0's error came back
        assert [r.waited for r in replies] == [True, True]
        assert ex.collective_rpc("_reset_capture") == ["w"]  # nothing stale is raised
        # a failure of the newest step surfaces at the next RPC of any kind
        ex, log, replies = _executor(gen, monkeypatch, fail={1})
        ex.execute_model("so-0")
        ex.execute_model("so-1")
        with pytest.raises(RuntimeError, match="worker failed in _compat_step#1"):
            ex.collective_rpc("_get_captured_states", unique_reply_rank=0)
        assert "_get_captured_states" not in [m[1] for m in log if m[0] == "send"]
