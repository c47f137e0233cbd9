"""Send each of speculators' steps without waiting for the one before: the driver
schedules step n+1 while the workers run step n.

Why: speculators' ``generate()`` runs ``schedule()`` → ``execute_model()`` (→
``sample_tokens()`` in 0.4) one step at a time and waits for every reply, which it never
reads: it never calls ``update_from_output``, so no step's schedule depends on an
earlier step's output. The GPU therefore idles while the driver schedules the next step
and the step travels to the workers and back (vLLM's own engine overlaps both with
async scheduling, which ``scheduling_sync`` keeps off for this loop). A batch-32 call of
the 8B-shaped benchmark is about four steps of 8,192 tokens; a batch-8 call is one.
How: hooks of the generator's executor (``speculators_compat._executor``, which holds the
steps in flight) send each step as one RPC to the shim's worker extension
(``_compat_step``: ``execute_model`` and, where the split exists, ``sample_tokens(None)``
in the worker, answering ``None``) without waiting
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
It comes after ``executor_sample_tokens`` (its step replaces that one's, and answers the
step's ``sample_tokens`` first).
Remove when: speculators < 0.5 support is dropped.
"""

from __future__ import annotations

from types import ModuleType

from .. import _executor
from .._adapter import Context, Verdict
from .._report import Kind
from . import _probes
from ._base import ExecutorFeature

#: The worker extension's per-step RPC (``worker_extension._CompatHiddenStatesExtension``).
STEP_RPC = "_compat_step"


def _ordered_futures(executor_cls: type) -> str | None:
    """Why the executor cannot keep non-blocking replies in order, or ``None`` if it can."""
    if "non_block" not in (_probes.parameters(executor_cls.collective_rpc) or {}):
        return "MultiprocExecutor.collective_rpc() has no non_block parameter"
    if "futures_queue" not in _probes.source(executor_cls.collective_rpc):
        return ("MultiprocExecutor.collective_rpc() does not queue its replies in order "
                "(no futures_queue)")
    return None


def settle(executor, keep_last: bool = False) -> None:
    """Wait for the steps in flight (all, or all but the newest) in order; raise the first
    one's error after every step sent has answered."""
    pending = executor.compat_steps
    if not pending:
        return
    if keep_last and len(pending) == 1:
        return
    done, rest = (pending[:-1], pending[-1:]) if keep_last else (pending, [])
    # An interrupt (KeyboardInterrupt) is not caught: it leaves at once, with the steps
    # still in flight (generate_guard then makes the generator unusable).
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
        executor.compat_steps = []
        raise first
    executor.compat_steps = list(rest)


class StepOverlap(ExecutorFeature):
    name = "step_overlap"
    kind = Kind.PERFORMANCE
    summary = ("send each generator step without waiting for the previous one "
               "(the driver schedules the next step while the workers run one)")
    upstream = ("speculators' generate() waits for every execute_model()/sample_tokens() "
                "reply and never reads it (no update_from_output)")
    vllm_range = None
    speculators_range = "<0.5.0.dev0"
    remove_when = "speculators < 0.5 support is dropped"
    #: The step RPC is a method of the shim's worker extension.
    requires = ("hook_capture",)
    #: Its step replaces executor_sample_tokens' and answers the step's sample_tokens first.
    after = ("executor_sample_tokens",)

    def check(self, ctx: Context, gen: ModuleType) -> Verdict:
        src = _probes.source(gen)
        if ".execute_model(" not in src:
            return Verdict.not_needed("the generator runs no execute_model() loop")
        if "update_from_output" in src:
            return Verdict.not_needed("the generator reads each step's output "
                                      "(update_from_output): steps must run one by one")
        why_not = _ordered_futures(self.executor_class(gen))
        if why_not:
            return Verdict.not_needed(why_not)
        return Verdict.needed("the generator waits for every step's reply and reads none: "
                              "each step is sent without waiting, one step ahead")

    def execute_model(self, executor, call, scheduler_output, *args, **kwargs):
        if kwargs.get("non_block", args[0] if args else False):
            # a caller that handles futures itself: vLLM's own path
            settle(executor)
            return call(scheduler_output, *args, **kwargs)
        from vllm import envs

        fut = executor.compat_vllm("collective_rpc")(
            STEP_RPC, args=(scheduler_output,),
            unique_reply_rank=getattr(executor, "output_rank", 0), non_block=True,
            timeout=getattr(envs, "VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS", None))
        executor.compat_steps = [*executor.compat_steps, fut]
        executor.compat_step_answer = None
        settle(executor, keep_last=True)
        return None

    def sample_tokens(self, executor, call, grammar_output=None, *args, **kwargs):
        answer = executor.compat_step_answer
        if answer is not _executor.NOTHING and not args and not kwargs.get("non_block"):
            executor.compat_step_answer = _executor.NOTHING
            return answer  # sampled inside the step already
        settle(executor)
        return call(grammar_output, *args, **kwargs)

    def rpc(self, executor, call, method, *args, **kwargs):
        settle(executor)
        executor.compat_step_answer = _executor.NOTHING
        return call(method, *args, **kwargs)
