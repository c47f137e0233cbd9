"""Send each of speculators' steps without waiting for the one before: the driver
schedules step n+1 while the workers run step n.

Why: speculators' ``generate()`` runs ``schedule()`` → ``execute_model()`` (→
``sample_tokens()`` in 0.4) one step at a time and waits for every reply, which it never
reads: it never calls ``update_from_output``, so no step's schedule depends on an
earlier step's output. The GPU therefore idles while the driver schedules the next step
and the step travels to the workers and back (vLLM's own engine overlaps both with
async scheduling, which ``scheduling_sync`` keeps off for this loop). A batch-32 call of
the 8B-shaped benchmark is about four steps of 8,192 tokens; a batch-8 call is one.
How: the ``MultiprocExecutor`` that speculators' module builds sends each step as one
RPC to the shim's worker extension (``_compat_step``: ``execute_model`` and, where the
split exists, ``sample_tokens(None)`` in the worker, answering ``None``) without waiting
(``non_block``), then waits for the step before it: at most one step runs ahead.
``execute_model`` answers ``None`` (the normal two-phase answer) and a following
``sample_tokens`` of that step answers ``None`` without a message, so both the 0.3 loop
(one call) and the 0.4 loop (two calls) send one message per step. vLLM's message queue
keeps the order, and the workers run the steps on one stream in that order, so every
step sees the state of the ones before exactly as in the synchronous loop (a block freed
by ``schedule()`` for step n+1 is reused only after step n has run). Any other RPC (the
capture's reset and export, speculators' own calls) first waits for the steps in flight
and raises the first step's error; a failed step also fails the next ``execute_model``.
No step reply carries data speculators uses. vLLM's own callers and other executors are
untouched. ``SPECULATORS_COMPAT_DISABLE=step_overlap`` runs the synchronous loop.
Applies when: the workers run the shim's extension (requires ``hook_capture``) and the
installed executor sends an RPC without waiting (``collective_rpc(non_block=...)``)
through a first-in-first-out queue of replies that every blocking call drains first
(``FutureWrapper`` with ``futures_queue``; probed in its source).
Remove when: speculators < 0.5 support is dropped.
"""

from __future__ import annotations

import functools
from types import ModuleType

from .._adapter import Context, Verdict
from .._patcher import Patcher
from .._report import Kind
from . import _helpers, _probes, _targets
from ._base import GeneratorAdapter

#: The worker extension's per-step RPC (``worker_extension._CompatHiddenStatesExtension``).
STEP_RPC = "_compat_step"
_NONE_PENDING = object()


def _ordered_futures(executor_cls: type) -> str | None:
    """Why the executor cannot keep non-blocking replies in order, or ``None`` if it can."""
    if "non_block" not in (_probes.parameters(executor_cls.collective_rpc) or {}):
        return "MultiprocExecutor.collective_rpc() has no non_block parameter"
    if "futures_queue" not in _probes.source(executor_cls.collective_rpc):
        return ("MultiprocExecutor.collective_rpc() does not queue its replies in order "
                "(no futures_queue)")
    return None


class StepOverlap(GeneratorAdapter):
    name = "step_overlap"
    kind = Kind.PERFORMANCE
    summary = ("send each generator step without waiting for the previous one "
               "(the driver schedules the next step while the workers run one)")
    upstream = ("speculators' generate() waits for every execute_model()/sample_tokens() "
                "reply and never reads it (no update_from_output)")
    vllm_range = None
    speculators_range = "<0.5.0.dev0"
    remove_when = "speculators < 0.5 support is dropped"
    targets = _targets.in_generator("MultiprocExecutor")
    #: The step RPC is a method of the shim's worker extension.
    requires = ("hook_capture",)

    def check(self, ctx: Context, gen: ModuleType) -> Verdict:
        src = _probes.source(gen)
        if ".execute_model(" not in src:
            return Verdict.not_needed("the generator runs no execute_model() loop")
        if "update_from_output" in src:
            return Verdict.not_needed("the generator reads each step's output "
                                      "(update_from_output): steps must run one by one")
        why_not = _ordered_futures(gen.MultiprocExecutor)
        if why_not:
            return Verdict.not_needed(why_not)
        return Verdict.needed("the generator waits for every step's reply and reads none: "
                              "each step is sent without waiting, one step ahead")

    def patch(self, patcher: Patcher, ctx: Context, gen: ModuleType) -> None:
        base = gen.MultiprocExecutor

        def _settle(self, keep_last: bool = False) -> None:
            """Wait for the steps in flight (all, or all but the newest) in order; raise
            the first one's error after every step sent has answered."""
            pending = self.__dict__.get("_compat_steps") or []
            if not pending:
                return
            if keep_last and len(pending) == 1:
                return
            done, rest = (pending[:-1], pending[-1:]) if keep_last else (pending, [])
            # An interrupt (KeyboardInterrupt) is not caught: it leaves at once, with the
            # steps still in flight (generate_guard then makes the generator unusable).
            first = None
            for fut in done:
                try:
                    fut.result()
                except Exception as exc:  # noqa: BLE001 - re-raised below
                    first = first or exc
            if first is not None:
                for fut in rest:  # nothing stays in flight behind a failed step
                    try:
                        fut.result()
                    except Exception:  # noqa: BLE001, S110 - the first error wins
                        pass
                self._compat_steps = []
                raise first
            self._compat_steps = rest

        def execute_model(self, scheduler_output, non_block: bool = False):
            if non_block:  # a caller that handles futures itself: vLLM's own path
                _settle(self)
                return base.execute_model(self, scheduler_output, non_block=True)
            from vllm import envs

            fut = base.collective_rpc(
                self, STEP_RPC, args=(scheduler_output,),
                unique_reply_rank=getattr(self, "output_rank", 0), non_block=True,
                timeout=getattr(envs, "VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS", None))
            self.__dict__.setdefault("_compat_steps", []).append(fut)
            self._compat_sample_answer = None
            _settle(self, keep_last=True)
            return None

        def sample_tokens(self, grammar_output=None, *args, **kwargs):
            answer = self.__dict__.get("_compat_sample_answer", _NONE_PENDING)
            if answer is not _NONE_PENDING and not args and not kwargs.get("non_block"):
                self._compat_sample_answer = _NONE_PENDING
                return answer  # sampled inside the step already
            _settle(self)
            return base.sample_tokens(self, grammar_output, *args, **kwargs)

        @functools.wraps(base.collective_rpc)  # later probes read its signature
        def collective_rpc(self, method, *args, **kwargs):
            _settle(self)
            self._compat_sample_answer = _NONE_PENDING
            return base.collective_rpc(self, method, *args, **kwargs)

        patcher.setattr(gen, "MultiprocExecutor", _helpers.subclass(
            base, self.name, {"execute_model": execute_model, "sample_tokens": sample_tokens,
                              "collective_rpc": collective_rpc}))
