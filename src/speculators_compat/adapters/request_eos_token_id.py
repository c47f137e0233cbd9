"""``Request(eos_token_id=...)`` was removed in vLLM 0.17 (EOS lives in SamplingParams).

Why: speculators 0.3/0.4 pass ``eos_token_id`` to ``Request``: ``TypeError:
Request.__init__() got an unexpected keyword argument 'eos_token_id'`` — after the model
has loaded. For a one-token prefill the EOS id never matters.
How: rebind ``Request`` in speculators' module to a wrapper that drops the argument
when the installed ``Request`` does not accept it.
Applies when: ``Request.__init__`` has no ``eos_token_id`` parameter.
Remove when: speculators < 0.5 support is dropped.
"""

from __future__ import annotations

from types import ModuleType

from .._adapter import Context, Verdict
from .._patcher import Patcher
from . import _probes, _targets, _wrappers
from ._base import GeneratorAdapter


class RequestEosTokenId(GeneratorAdapter):
    name = "request_eos_token_id"
    summary = "drop eos_token_id= from Request(...)"
    upstream = "vLLM 0.17.0: Request.__init__ eos_token_id removed (EOS in SamplingParams)"
    vllm_range = ">=0.17.0.dev0"
    remove_when = "speculators < 0.5 support is dropped"
    targets = _targets.in_generator("Request")

    def check(self, ctx: Context, gen: ModuleType) -> Verdict:
        params = _probes.parameters(gen.Request)
        if params is None or not {"request_id", "prompt_token_ids"} <= params.keys():
            return Verdict.mismatch("Request.__init__ lacks request_id/prompt_token_ids")
        if "eos_token_id" in params:
            return Verdict.not_needed("Request.__init__ accepts eos_token_id")
        return Verdict.needed("Request.__init__ no longer takes eos_token_id")

    def patch(self, patcher: Patcher, ctx: Context, gen: ModuleType) -> None:
        patcher.wrap(gen, "Request", _wrappers.drop_kwarg("eos_token_id"))
