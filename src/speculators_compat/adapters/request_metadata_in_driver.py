"""speculators 0.4.x sends every step's token counts to the workers, which the shim's
capture does not use: one round trip per step while the GPU waits.

Why: 0.4.x's ``generate()`` calls ``collective_rpc("_set_request_metadata", args=(counts,))``
before every ``execute_model``. Its own worker extension needs the counts to split a
step's rows; the shim's extension (``hook_capture``) attributes rows from the model
runner's own batch layout and ignores them (``_set_request_metadata`` is a no-op there).
Measured on an H200 (8B-shaped model, four layers, batch 32, vLLM 0.26.0), 0.4.0.1's steps
took 0.009-0.012 s per call longer than 0.3.0's, which sends no counts, in the same run.
With this adapter (one run, another machine) its copied calls took 0.713 s against
0.715-0.724 s without: a few milliseconds, not separable from the machine in one run.
How: a hook of the generator's executor (``speculators_compat._executor``) answers that
one method in the driver with what the workers answer (``None`` from each), without sending it. Any
other call, vLLM's own callers and other executors are untouched; a call with other
arguments (``unique_reply_rank``, ``non_block``, keyword ``kwargs``) still goes out.
Applies when: the workers run the shim's extension (requires ``hook_capture``) and the
installed generator sends ``_set_request_metadata`` (probed in its source).
It comes after ``step_overlap``: the answer must not wait for the steps in flight (that
wait would take the overlap away, since the counts precede every step).
Remove when: speculators 0.4.x support is dropped.
"""

from __future__ import annotations

from types import ModuleType

from .._adapter import Context, Verdict
from .._report import Kind
from . import _probes
from ._base import ExecutorFeature

METADATA_RPC = "_set_request_metadata"


class RequestMetadataInDriver(ExecutorFeature):
    name = "request_metadata_in_driver"
    kind = Kind.PERFORMANCE
    summary = "answer speculators 0.4's per-step _set_request_metadata in the driver"
    upstream = ("speculators 0.4.x sends each step's per-request token counts to the "
                "workers (one collective_rpc per step); the shim's capture reads the "
                "runner's batch layout instead")
    vllm_range = None
    speculators_range = ">=0.4.0.dev0,<0.5.0.dev0"
    remove_when = "speculators 0.4.x support is dropped"
    #: Only the shim's extension ignores the counts; speculators' own one needs them.
    requires = ("hook_capture",)
    #: Answered outside step_overlap's hook, which waits for the steps in flight.
    after = ("step_overlap",)

    def check(self, ctx: Context, gen: ModuleType) -> Verdict:
        if f'"{METADATA_RPC}"' not in (_probes.source(gen) or ""):
            return Verdict.not_needed("the generator sends no per-step request metadata")
        return Verdict.needed("the generator sends every step's token counts to the "
                              "workers, whose capture (the shim's) does not use them: "
                              "answered in the driver, one round trip per step saved")

    def rpc(self, executor, call, method, *args, **kwargs):
        if method == METADATA_RPC and not args and set(kwargs) <= {"args", "timeout"}:
            return [None] * max(int(getattr(executor, "world_size", 1) or 1), 1)
        return call(method, *args, **kwargs)
