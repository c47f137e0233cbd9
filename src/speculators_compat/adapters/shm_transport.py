"""Captured hidden states reach the driver through shared memory instead of pickles.

Why: speculators' generator reads the captured states with
``collective_rpc("_get_captured_states", unique_reply_rank=0)``. vLLM pickles that reply:
CUDA tensors go through ``torch.save`` (a blocking device-to-host copy), the executor's
response queue and ``torch.load`` back onto the driver's GPU before speculators' own
``.cpu()``. Measured on an H200 with an 8B-shaped model, moving the states cost about
three quarters of the wall time (0.23x of vLLM's own prefill with four layers).
How: a hook of the generator's executor (``speculators_compat._executor``, which holds the
receiver and the link to its generator) sends the call's plan
(request ids and prompt lengths, in input order) with speculators' ``_reset_capture``,
and answers speculators' ``_get_captured_states`` by asking the shim's worker extension
for ``_compat_export_states`` instead. The capturing worker writes each step's rows into
one memfd per call while the model runs (on a side stream and copy threads on CUDA, in
the step on CPU builds) and replies with a descriptor; the driver maps that memory
privately and returns CPU tensors in the installed speculators' own contract (same
dtype, shapes, lists and order): see ``speculators_compat.transport``.
speculators then copies every tensor it returns (``clone()``); at real sizes that copy
was most of the remaining cost (7.5 GB per pass into freshly faulted pages on the H200
benchmark). Where the installed generator's ``generate()`` clones what it gets (probed
in its source), the tensors returned are ``HandoffTensor`` instances whose ``clone()``
takes the call's memory over instead (``speculators_compat.transport.handoff``): the
results are that memory, freed with the last of them, private to the process (a write
after ``fork()`` copies the page). Set ``SPECULATORS_COMPAT_ZERO_COPY=0`` to let
speculators copy; then, where vLLM reduced the driver's intra-op threads when its
executor started, the rest of a ``generate()`` call after the states arrived runs with
up to 8 of the driver's original threads (``SPECULATORS_COMPAT_COPY_THREADS``), so that
those copies are not single-threaded; the reduced count is restored when ``generate()``
returns.
Where a memfd cannot be used, the reply carries the states pickled, as before, and the
driver logs why. vLLM's own callers of ``collective_rpc`` see no change.
Applies when: the shim's worker extension captures (requires ``hook_capture``) and the
machine has ``memfd_create`` with a readable ``/proc/<pid>/fd``.
Remove when: speculators < 0.5 support is dropped.
"""

from __future__ import annotations

import inspect
import os
import time
from types import ModuleType

from .. import _executor
from .._adapter import Context, Verdict
from .._patcher import Patcher
from .._report import Kind
from ..transport import copies, wire
from ..transport.driver import Receiver
from . import _probes, _targets
from ._base import ExecutorFeature

#: The speculators RPC whose reply is carried through shared memory, and the one that
#: starts a call (answered with the call's plan so rows stream while the model runs).
CAPTURED_STATES_RPC = "_get_captured_states"
RESET_CAPTURE_RPC = "_reset_capture"
#: Most intra-op threads of the driver while speculators copies the returned states
#: (zero copy off), where vLLM reduced them to one (0 or 1: leave vLLM's choice). The same
#: variable sets the worker's copy threads (``transport.copies``).
COPY_THREADS_ENV = copies.COPY_THREADS_ENV
DEFAULT_COPY_THREADS = 8
#: ``0``: speculators' clone() copies the returned tensors (no zero-copy handover).
ZERO_COPY_ENV = "SPECULATORS_COMPAT_ZERO_COPY"


class ShmTransport(ExecutorFeature):
    name = "shm_transport"
    kind = Kind.PERFORMANCE
    summary = "captured hidden states reach the driver through shared memory, not pickles"
    upstream = ("vLLM's collective_rpc pickles replies (CUDA tensors via torch.save, loaded "
                "back onto the driver's GPU); speculators 0.3/0.4 fetch every captured row "
                "that way")
    vllm_range = None
    remove_when = "speculators < 0.5 support is dropped"
    targets = _targets.in_generator("MultiprocExecutor",
                                    "VllmHiddenStatesGenerator.__init__",
                                    "VllmHiddenStatesGenerator.generate")

    #: The RPCs it sends (``_compat_reset_capture``, ``_compat_export_states``) are answered
    #: only by the shim's worker extension: where speculators' own extension captures, its
    #: replies keep vLLM's collective_rpc path.
    requires = ("hook_capture",)

    def check(self, ctx: Context, gen: ModuleType) -> Verdict:
        if "unique_reply_rank" not in (_probes.parameters(
                self.executor_class(gen).collective_rpc) or {}):
            return Verdict.mismatch("MultiprocExecutor.collective_rpc has no unique_reply_rank")
        reason = wire.unavailable_reason()
        if reason is not None:
            return Verdict.not_needed(f"hidden states travel pickled through collective_rpc: "
                                      f"{reason}")
        handoff = ("speculators' clone() of each returned tensor takes the call's memory over "
                   "(zero copy)" if _zero_copy(gen) else
                   f"speculators copies each returned tensor ({_zero_copy_off_reason(gen)})")
        return Verdict.needed("hidden states travel through one memfd per call, written as "
                              "the layers produce them (side stream and "
                              f"{copies.copy_threads()} copy threads on CUDA, at most "
                              f"{copies.staging_bytes() >> 20} MiB in flight, "
                              f"{copies.STAGING_BYTES_ENV}; in the step on CPU builds), "
                              "mapped privately by the driver; not through pickled "
                              f"collective_rpc replies; {handoff}")

    def hooks(self, ctx: Context, gen: ModuleType) -> _executor.ExecutorHooks:
        return _SharedMemory(gen.RequestStatus.WAITING, _zero_copy(gen))

    def patch(self, patcher: Patcher, ctx: Context, gen: ModuleType) -> None:
        super().patch(patcher, ctx, gen)

        def link(wrapped, instance, args, kwargs):
            import torch

            threads = torch.get_num_threads()
            out = wrapped(*args, **kwargs)
            executor = _executor.of(getattr(instance, "executor", None))
            if executor is not None:
                executor.compat_link(instance)
            limit = int(os.environ.get(COPY_THREADS_ENV, DEFAULT_COPY_THREADS))
            if torch.get_num_threads() < threads and limit > 1:  # vLLM reduced them (GPU)
                instance.__dict__["_compat_copy_threads"] = min(threads, limit)
            return out

        patcher.wrap(gen.VllmHiddenStatesGenerator, "__init__", link)
        patcher.wrap(gen.VllmHiddenStatesGenerator, "generate", _copy_threads)


class _SharedMemory(_executor.ExecutorHooks):
    """The executor's side of the transport: the plan with the reset, the states through
    the receiver."""

    def __init__(self, waiting, handoff: bool) -> None:
        self.waiting = waiting
        self.handoff = handoff

    def plan_of(self, executor) -> list[tuple[str, int]]:
        """This call's requests (ids, prompt lengths) in input order: speculators adds them
        all to its scheduler before it resets the capture."""
        scheduler = getattr(executor.compat_linked(), "scheduler", None)
        requests = getattr(scheduler, "requests", None) or {}
        return [(rid, int(r.num_prompt_tokens)) for rid, r in requests.items()
                if r.status == self.waiting and not r.num_computed_tokens]

    def receiver_of(self, executor) -> Receiver:
        if executor.compat_receiver is None:
            executor.compat_receiver = Receiver(handoff=self.handoff)
        return executor.compat_receiver

    def rpc(self, executor, call, method, *args, **kwargs):
        plain = (args or kwargs.get("args") or kwargs.get("kwargs")
                 or kwargs.get("non_block"))
        if method == RESET_CAPTURE_RPC and not plain:
            plan = self.plan_of(executor)
            if plan:
                self.receiver_of(executor)
                return call(wire.RESET_RPC, **{**kwargs, "args": (plan,)})
        if (method != CAPTURED_STATES_RPC or plain
                or kwargs.get("unique_reply_rank") is None):
            return call(method, *args, **kwargs)
        listed = []

        def export():
            reply = call(wire.EXPORT_RPC, **kwargs)
            if isinstance(reply, list):  # vLLM <= 0.11.0: a one-item list
                listed.append(True)
                reply = next((r for r in reply if r is not None), None)
            return reply

        receiver = self.receiver_of(executor)
        states = receiver.fetch(export)
        _raise_copy_threads(executor, receiver)
        return [states] if listed else states


def _zero_copy_off_reason(gen: ModuleType) -> str | None:
    """Why speculators' ``clone()`` keeps copying (``None``: it takes the memory over)."""
    if os.environ.get(ZERO_COPY_ENV, "1").strip() == "0":
        return f"{ZERO_COPY_ENV}=0"
    try:
        source = inspect.getsource(inspect.unwrap(gen.VllmHiddenStatesGenerator.generate))
    except (OSError, TypeError):
        return "VllmHiddenStatesGenerator.generate has no readable source"
    if ".clone()" not in source:
        return "VllmHiddenStatesGenerator.generate does not clone() what it returns"
    return None


def _zero_copy(gen: ModuleType) -> bool:
    """Hand speculators tensors whose ``clone()`` takes the memory over? Only where the
    installed ``generate()`` clones every tensor it gets (0.3.x, 0.4.x: ``h.clone().cpu()``):
    a ``HandoffTensor`` must never reach a user uncloned."""
    return _zero_copy_off_reason(gen) is None


def _raise_copy_threads(executor, receiver) -> None:
    """The states have arrived: give the rest of this ``generate()`` call (speculators'
    ``clone()`` of every tensor) the driver's original intra-op threads.

    Why only now: the model steps before it need no driver threads (vLLM reduced them
    so that they do not compete with the workers); after the last step the workers wait
    for the driver. How many: the copies are gigabytes per batch at real model sizes, most
    of it first-touched pages the kernel must fault in, which scales up to a point and
    then collapses. Measured on the H200 (8B shape, 4 layers, batch 32, 7.5 GB per pass
    into fresh memory, 2026-12-01): 4 threads 1.42 s, 8 threads 0.85 s, 16 threads 7.8 s
    per pass. Hence at most ``DEFAULT_COPY_THREADS`` (8)."""
    generator = executor.compat_linked()
    call = None if generator is None else generator.__dict__.get("_compat_copy_call")
    if not call or call.get("raised"):
        return
    import torch

    torch.set_num_threads(call["threads"])
    call["raised"] = time.perf_counter()
    receiver.stats["copy_threads"] = call["threads"]


def _copy_threads(wrapped, instance, args, kwargs):
    """Run ``generate()`` with vLLM's reduced intra-op threads until the states arrive,
    then (``_raise_copy_threads``) with the driver's original count, and reduce them again
    when it returns.

    Why: speculators copies every captured tensor it returns (``clone()``): gigabytes
    per batch at real model sizes, which on one thread (memcpy plus first-touch page
    faults) cost more than the transport saved. vLLM reduces the driver's threads when
    its executor starts (``set_multiprocessing_worker_envs`` and the platform's own
    start-up; seen on GPU and CPU builds) so that they do not compete with the workers;
    after the last step the workers wait while the driver copies. Where nothing was
    reduced, nothing changes.
    """
    threads = instance.__dict__.get("_compat_copy_threads")
    if not threads:
        return wrapped(*args, **kwargs)
    import torch

    reduced = torch.get_num_threads()
    call = instance.__dict__["_compat_copy_call"] = {"threads": threads, "raised": None}
    try:
        return wrapped(*args, **kwargs)
    finally:
        instance.__dict__.pop("_compat_copy_call", None)
        if call["raised"]:
            torch.set_num_threads(reduced)
            receiver = getattr(getattr(instance, "executor", None), "compat_receiver", None)
            if receiver is not None:
                receiver.stats["after_fetch_s"] += time.perf_counter() - call["raised"]
