"""``collective_rpc(..., unique_reply_rank=r)`` returns the single result (vLLM 0.11.1).

Why: speculators 0.3.0 was written for the list convention and takes ``[0]`` of the
reply: on 0.11.1+ that picks the first layer's tensor out of the returned list of
layers (771 items of shape [512] instead of 4 × [512, 7168], or ``Boolean value of
Tensor with more than one value is ambiguous``). vLLM's own callers rely on the new
convention, so only speculators' calls may see the old one.
How: a hook of the generator's executor (``speculators_compat._executor``) wraps the
single reply in a one-item list for the RPCs speculators indexes (``_get_captured_states``), for
speculators 0.3.x only (0.4 was written for the single-result convention).
Applies when: the installed executor documents/implements the single-result convention
and the installed speculators uses the list contract.
It comes after ``shm_transport``, whose answer keeps vLLM's reply convention.
Remove when: speculators 0.3.x support is dropped.
"""

from __future__ import annotations

from types import ModuleType

from .._adapter import Context, Verdict
from . import _probes, _targets
from ._base import ExecutorFeature

#: RPCs speculators 0.3.0 issues with ``unique_reply_rank`` and indexes with ``[0]``.
#: vLLM's own calls on the same executor (e.g. ``execute_model``) keep vLLM's convention.
SPECULATORS_LIST_REPLY_METHODS = frozenset({"_get_captured_states"})


def returns_single_result(executor_cls) -> bool | None:
    method = getattr(executor_cls, "collective_rpc", None)
    params = _probes.parameters(method) or {}
    if "unique_reply_rank" not in params:
        return None
    doc = (getattr(method, "__doc__", None) or "").lower()
    return bool("single result" in doc or "kv_output_aggregator" in params)


class CollectiveRpcUniqueReply(ExecutorFeature):
    name = "collective_rpc_unique_reply"
    summary = "give speculators 0.3's collective_rpc(unique_reply_rank=) the list it indexes"
    upstream = ("vLLM 0.11.1: MultiprocExecutor.collective_rpc returns a single result when "
                "unique_reply_rank is given (vllm/v1/executor/multiproc_executor.py)")
    vllm_range = ">=0.11.1.dev0"
    speculators_range = ">=0.3.0.dev0,<0.4.0.dev0"
    remove_when = "speculators 0.3.x support is dropped"
    #: The list goes around shm_transport's answer, which keeps vLLM's convention.
    after = ("shm_transport",)

    def check(self, ctx: Context, gen: ModuleType) -> Verdict:
        single = returns_single_result(self.executor_class(gen))
        if single is None:
            return Verdict.mismatch("collective_rpc has no unique_reply_rank parameter")
        if not single:
            return Verdict.not_needed("collective_rpc returns a list (old convention)")
        if _probes.worker_contract(ctx) != _targets.CONTRACT_LIST:
            return Verdict.not_needed("installed speculators expects the single-result "
                                      "convention")
        return Verdict.needed("collective_rpc returns a single result; speculators 0.3 "
                              "indexes [0] into it")

    def rpc(self, executor, call, method, *args, **kwargs):
        out = call(method, *args, **kwargs)
        if (method in SPECULATORS_LIST_REPLY_METHODS
                and kwargs.get("unique_reply_rank") is not None
                and not kwargs.get("non_block")):
            return [out]
        return out
