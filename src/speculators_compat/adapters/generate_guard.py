"""Validate ``generate()`` input up front, and never let a failed call leak into the next.

Why: speculators' ``generate()`` adds every sequence to the scheduler before it runs
anything. An empty sequence fails deep inside vLLM after earlier sequences of the batch
were added, and any failure mid-call leaves requests (and captured rows) behind that
the next call would silently return as part of its own batch.
How: wrap ``VllmHiddenStatesGenerator.generate`` (speculators' class, the consumer):
before it runs, reject an empty batch, empty sequences and non-integer tokens with a
message naming the sequence; if it raises anyway, abort every request left in its
scheduler and reset the workers' capture, then re-raise.
Applies when: speculators' in-process generator is installed.
Remove when: speculators < 0.5 support is dropped.
"""

from __future__ import annotations

import numbers
from types import ModuleType

from .._core import CompatError, Context, Kind, Patcher, Verdict
from ._base import GeneratorAdapter


def validate_batch(token_ids) -> None:
    if hasattr(token_ids, "tolist"):
        token_ids = token_ids.tolist()
    if token_ids is None or len(token_ids) == 0:
        raise CompatError("speculators-compat: generate() got an empty batch; pass a list of "
                          "token-id sequences.")
    for i, seq in enumerate(token_ids):
        seq = seq.tolist() if hasattr(seq, "tolist") else seq
        if seq is None or len(seq) == 0:
            raise CompatError(f"speculators-compat: sequence {i} of the batch is empty; drop "
                              "empty samples before generate() (nothing was run).")
        bad = next((t for t in seq
                    if not isinstance(t, numbers.Integral) or isinstance(t, bool)), None)
        if bad is not None:
            raise CompatError(f"speculators-compat: sequence {i} contains {bad!r} "
                              f"({type(bad).__name__}); token ids must be ints (nothing was run).")


def _cleanup(generator) -> None:
    scheduler = getattr(generator, "scheduler", None)
    if scheduler is not None:
        leftover = list(getattr(scheduler, "requests", {}) or {})
        if leftover:
            from vllm.v1.request import RequestStatus

            scheduler.finish_requests(leftover, RequestStatus.FINISHED_ABORTED)
    executor = getattr(generator, "executor", None)
    if executor is not None:
        executor.collective_rpc("_reset_capture")


class GenerateGuard(GeneratorAdapter):
    name = "generate_guard"
    kind = Kind.SAFEGUARD
    summary = "reject bad generate() input up front; clean up after a failed call"
    upstream = ("speculators 0.3/0.4: generate() adds requests before running; failures "
                "leave state that corrupts the next call")
    vllm_range = None
    remove_when = "speculators < 0.5 support is dropped"

    def check(self, ctx: Context, gen: ModuleType) -> Verdict:
        if not hasattr(gen.VllmHiddenStatesGenerator, "generate"):
            return Verdict.mismatch("VllmHiddenStatesGenerator has no generate()")
        return Verdict.needed("validate input before requests are added; clean up on failure")

    def patch(self, patcher: Patcher, ctx: Context, gen: ModuleType) -> None:
        def wrapper(wrapped, instance, args, kwargs):
            token_ids = kwargs.get("token_ids", args[0] if args else None)
            validate_batch(token_ids)
            try:
                return wrapped(*args, **kwargs)
            except BaseException:
                try:
                    _cleanup(instance)
                except Exception:  # noqa: BLE001 - the original error matters more
                    pass
                raise

        patcher.wrap(gen.VllmHiddenStatesGenerator, "generate", wrapper)
