"""Captured hidden states reach the driver through one memfd per call, not through pickles.

Why: speculators' generator fetches every captured row with
``collective_rpc("_get_captured_states")``. vLLM pickles the reply: a CUDA tensor goes
through ``torch.save`` into bytes (a blocking device-to-host copy into pageable memory),
through the executor's response queue, and is loaded again in the driver onto the
driver's GPU, where speculators' ``.cpu()`` copies it back. With four layers of an
8B-shaped model that cost about three quarters of the wall time on an H200.

How, and how long memory lives (one rule): every ``generate()`` call gets a *region*, a
memfd of exactly its states' bytes. The capturing worker (TP rank 0) writes each step's
rows into it while the model runs (:mod:`.worker`, :mod:`.copies`), and replies to the
export RPC with a small descriptor (:mod:`.wire`). The driver maps the region privately
and returns tensors over it (:mod:`.driver`); speculators' ``clone()`` takes them over
(:mod:`.handoff`), so the results *are* the region, and it is freed when the last result
that uses it is (:mod:`.region`). The worker closes its side at the next call. Nothing
is pooled, leased or reused across calls, so results stay valid whatever later calls do,
a caller may keep any number of them, and the transport's own memory is the pinned
staging of rows in flight (bounded, :mod:`.copies`). Nothing is created in ``/dev/shm``.

Where a memfd cannot be used (no ``memfd_create``, ``/proc/<pid>/fd`` not readable) the
reply carries the states the old way and the driver logs why, once: never a crash,
never different data.

Modules: :mod:`.wire` (RPC names, reply format), :mod:`.region` (the memory),
:mod:`.copies` (GPU rows into it), :mod:`.worker` (the worker's side of a call),
:mod:`.driver` (the driver's side), :mod:`.handoff` (zero-copy ``clone()``).
"""
