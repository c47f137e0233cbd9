"""Captured hidden states reach the driver through shared memory instead of pickles.

Why: speculators' generator reads the captured states with
``collective_rpc("_get_captured_states", unique_reply_rank=0)``. vLLM pickles that reply:
CUDA tensors go through ``torch.save`` (a blocking device-to-host copy), the executor's
response queue and ``torch.load`` back onto the driver's GPU before speculators' own
``.cpu()``. Measured on an H200 with an 8B-shaped model, moving the states cost about
three quarters of the wall time (0.23x of vLLM's own prefill with four layers).
How: the ``MultiprocExecutor`` seen by speculators' module answers that one call by
asking the shim's worker extension for ``_compat_export_states`` instead: the capturing
worker copies the states into anonymous shared memory (memfd, pinned for DMA when CUDA
is up) and replies with a descriptor; the driver maps it and returns CPU tensors in the
installed speculators' own contract (same dtype, shapes, lists and order), views that
stay valid as long as they are referenced (see ``speculators_compat._transport``).
The rows go into shared memory as the decoder-layer hooks produce them: on a side
stream that overlaps the forward on CUDA; on CPU builds (no stream) by a plain copy
inside the step. CPU builds use this path by default too: measured on the CPU
benchmark, that copy is 7-9 ms per 37.7 MB call (0.2-0.3 % of the step), copying at
export would be the same copy on the same core, and the pickled reply costs more copies
(its RPC took 0.06-0.12 s against 0.01 s).
speculators then copies every tensor it returns (``clone()``): at real sizes that copy
was the whole remaining cost (7.5 GB per pass into freshly faulted pages on the H200
benchmark). Where the installed generator's ``generate()`` clones what it gets (probed in
its source), the tensors returned are ``HandoffTensor`` instances whose ``clone()`` takes
the shared memory over instead (a plain tensor with a storage of exactly its bytes; the
segment stays leased while it lives: see ``speculators_compat._handoff``). Where
earlier results still hold about a call's worth of segments (a caller keeping every
result), the driver instead copies the call on up to 16 threads into memory it faulted in
while the model ran (``speculators_compat._fresh``) and the segments come back at once:
kept segments would make the worker make and pin new ones beside every forward, which
was slower on the H200. Most of that copy happens while the model still runs: the reset
asks the capturing worker for a board on which it publishes each request's landed rows,
and a driver thread copies them as they land (``speculators_compat._early``).
Set ``SPECULATORS_COMPAT_ZERO_COPY=0`` to let speculators copy.
Where shared memory cannot be used, the reply carries the states pickled, as before,
and the driver logs why. vLLM's own callers of ``collective_rpc`` see no change. Where
vLLM reduced the driver's intra-op threads when its executor started, the rest of a
``generate()`` call after the states arrived (speculators' own ``clone()`` of every
returned tensor) runs with up to 8 of the driver's original threads, so that those copies are
not single-threaded; the model steps before it keep vLLM's count, and the reduced count
is restored when ``generate()`` returns.
Applies when: the shim's worker extension captures (requires ``hook_capture``) and the
machine has ``memfd_create`` with a readable ``/proc/<pid>/fd``.
Remove when: speculators < 0.5 support is dropped.
"""

from __future__ import annotations

import functools
import inspect
import os
import time
import weakref
from types import ModuleType

from .. import _transport
from .._adapter import Context, Verdict
from .._patcher import Patcher
from .._report import Kind
from . import _helpers, _probes, _targets
from ._base import GeneratorAdapter

#: The speculators RPC whose reply is carried through shared memory, and the one that
#: starts a call (answered with the call's plan so rows stream while the model runs).
CAPTURED_STATES_RPC = "_get_captured_states"
RESET_CAPTURE_RPC = "_reset_capture"
#: Most intra-op threads of the driver while speculators copies the returned states,
#: where vLLM reduced them to one (0 or 1: leave vLLM's choice).
COPY_THREADS_ENV = "SPECULATORS_COMPAT_COPY_THREADS"
DEFAULT_COPY_THREADS = 8
#: Most threads of the transport's own copies into memory made ahead (the same variable
#: sets both). More than for speculators' clone: these copies go into pages already made,
#: so they do not contend on page faults. Measured on the H200 (batch 32, every result
#: kept, same machine): 0.23-0.27 s per pass on 8 threads, 0.16-0.18 s on 16.
DEFAULT_TRANSPORT_COPY_THREADS = 16
#: ``0``: speculators' clone() copies the returned tensors (no zero-copy handover).
ZERO_COPY_ENV = "SPECULATORS_COMPAT_ZERO_COPY"


class ShmTransport(GeneratorAdapter):
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
        if "unique_reply_rank" not in (_probes.parameters(gen.MultiprocExecutor.collective_rpc)
                                       or {}):
            return Verdict.mismatch("MultiprocExecutor.collective_rpc has no unique_reply_rank")
        reason = _transport.unavailable_reason()
        if reason is not None:
            return Verdict.not_needed(f"hidden states travel pickled through collective_rpc: "
                                      f"{reason}")
        handoff = ("speculators' clone() of each returned tensor takes the memory over "
                   "(zero copy; a call whose results would keep the pool from coming back "
                   "is first copied by the driver into memory made during the forward)"
                   if _zero_copy(gen) else
                   f"speculators copies each returned tensor ({_zero_copy_off_reason(gen)})")
        return Verdict.needed(f"hidden states travel through shared memory (memfd, pool up to "
                              f"{_transport.default_pool_bytes() >> 20} MiB, "
                              f"{_transport.POOL_BYTES_ENV}), copied in as the layers produce "
                              "them (side stream on CUDA, in the step on CPU builds); not "
                              f"through pickled collective_rpc replies; {handoff}")

    def patch(self, patcher: Patcher, ctx: Context, gen: ModuleType) -> None:
        base = gen.MultiprocExecutor
        waiting = gen.RequestStatus.WAITING
        handoff = _zero_copy(gen)

        def plan_of(executor) -> list[tuple[str, int]]:
            """This call's requests (ids, prompt lengths) in input order: speculators
            adds them all to its scheduler before it resets the capture."""
            ref = executor.__dict__.get("_compat_generator")
            generator = ref() if ref is not None else None
            scheduler = getattr(generator, "scheduler", None)
            requests = getattr(scheduler, "requests", None) or {}
            return [(rid, int(r.num_prompt_tokens)) for rid, r in requests.items()
                    if r.status == waiting and not r.num_computed_tokens]

        def importer_of(executor) -> _transport.ShmImporter:
            importer = executor.__dict__.get("_compat_importer")
            if importer is None:
                importer = executor.__dict__["_compat_importer"] = _transport.ShmImporter(
                    handoff=handoff, copy_threads=transport_copy_threads())
            return importer

        @functools.wraps(base.collective_rpc)  # later probes read its signature and docstring
        def collective_rpc(self, method, *args, **kwargs):
            plain = (args or kwargs.get("args") or kwargs.get("kwargs")
                     or kwargs.get("non_block"))
            if method == RESET_CAPTURE_RPC and not plain:
                plan = plan_of(self)
                if plan:
                    importer = importer_of(self)
                    importer.prepare_call(sum(n for _, n in plan))
                    released = importer.take_released()
                    token = importer.next_token()
                    replies = base.collective_rpc(self, _transport.RESET_RPC,
                                                  **{**kwargs, "args": (plan, released, token)})
                    importer.begin_call(replies, plan)
                    # speculators' _reset_capture answers None from every rank
                    if isinstance(replies, list):
                        return [None if _transport.is_reply(r) else r for r in replies]
                    return None if _transport.is_reply(replies) else replies
            if (method != CAPTURED_STATES_RPC or plain
                    or kwargs.get("unique_reply_rank") is None):
                return base.collective_rpc(self, method, *args, **kwargs)
            listed = []

            def call(released, more):
                reply = base.collective_rpc(self, _transport.EXPORT_RPC,
                                            **{**kwargs, "args": (released, more)})
                if isinstance(reply, list):  # vLLM <= 0.11.0: a one-item list
                    listed.append(True)
                    reply = next((r for r in reply if r is not None), None)
                return reply

            importer = importer_of(self)
            t0 = time.perf_counter()
            states = importer.fetch(call)
            importer.stats["fetch_s"] += time.perf_counter() - t0
            _raise_copy_threads(self, importer)
            return [states] if listed else states

        def shutdown(self, *args, **kwargs):
            importer = self.__dict__.pop("_compat_importer", None)
            try:
                return base.shutdown(self, *args, **kwargs)
            finally:
                if importer is not None:
                    importer.close()

        patcher.setattr(gen, "MultiprocExecutor", _helpers.subclass(
            base, self.name, {"collective_rpc": collective_rpc, "shutdown": shutdown}))

        def link(wrapped, instance, args, kwargs):
            import torch

            threads = torch.get_num_threads()
            out = wrapped(*args, **kwargs)
            executor = getattr(instance, "executor", None)
            if executor is not None and hasattr(executor, "__dict__"):
                executor.__dict__["_compat_generator"] = weakref.ref(instance)
            limit = int(os.environ.get(COPY_THREADS_ENV, DEFAULT_COPY_THREADS))
            if torch.get_num_threads() < threads and limit > 1:  # vLLM reduced them (GPU)
                instance.__dict__["_compat_copy_threads"] = min(threads, limit)
            return out

        patcher.wrap(gen.VllmHiddenStatesGenerator, "__init__", link)
        patcher.wrap(gen.VllmHiddenStatesGenerator, "generate", _copy_threads)
        patcher.wrap(gen.VllmHiddenStatesGenerator, "generate", _abandon_failed_call)


def transport_copy_threads() -> int:
    """Threads of the transport's own copies: ``SPECULATORS_COMPAT_COPY_THREADS`` or
    :data:`DEFAULT_TRANSPORT_COPY_THREADS`, at most the CPU count."""
    limit = int(os.environ.get(COPY_THREADS_ENV, DEFAULT_TRANSPORT_COPY_THREADS))
    return max(1, min(limit, os.cpu_count() or 1))


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


def _raise_copy_threads(executor, importer) -> None:
    """The states have arrived: give the rest of this ``generate()`` call (speculators'
    ``clone()`` of every tensor) the driver's original intra-op threads.

    Why only now: the model steps before it need no driver threads (vLLM reduced them
    so that they do not compete with the workers); after the last step the workers wait
    for the driver. How many: the copies are gigabytes per batch at real model sizes, most
    of it first-touched pages the kernel must fault in, which scales up to a point and
    then collapses. Measured on the H200 (8B shape, 4 layers, batch 32, 7.5 GB per pass
    into fresh memory, 2026-12-01): 4 threads 1.42 s, 8 threads 0.85 s, 16 threads 7.8 s
    per pass. Hence at most ``DEFAULT_COPY_THREADS`` (8)."""
    ref = executor.__dict__.get("_compat_generator")
    generator = ref() if ref is not None else None
    call = None if generator is None else generator.__dict__.get("_compat_copy_call")
    if not call or call.get("raised"):
        return
    import torch

    torch.set_num_threads(call["threads"])
    call["raised"] = time.perf_counter()
    importer.stats["copy_threads"] = call["threads"]


def _abandon_failed_call(wrapped, instance, args, kwargs):
    """A ``generate()`` that raises (a failed step, Ctrl+C) ends its call in the
    transport at once (:meth:`~speculators_compat._transport.ShmImporter.abandon_call`):
    the thread copying its rows while the model ran stops, rather than polling until the
    next call starts."""
    try:
        return wrapped(*args, **kwargs)
    except BaseException:
        importer = getattr(getattr(instance, "executor", None), "__dict__", {}).get(
            "_compat_importer")
        if importer is not None:
            importer.abandon_call()
        raise


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
            importer = getattr(getattr(instance, "executor", None), "__dict__", {}).get(
                "_compat_importer")
            if importer is not None:
                importer.stats["after_fetch_s"] += time.perf_counter() - call["raised"]
