"""speculators 0.4.x returns batches of 11+ sequences out of input order.

Why (upstream bug, silent data corruption): 0.4.x's generator orders results by
``sorted(request ids)``, a string sort of ``req_<call>_<index>``: ``req_0_10`` sorts
before ``req_0_2``, while speculators' own offline script pairs results with loss masks
by position.
How: speculators' module looks ``sorted`` up in its own globals before builtins; bind
there a ``sorted`` that orders speculators' request ids numerically (any other input
is sorted exactly as the builtin does). Results come back in input order.
This changes upstream 0.4.x's observable order for batches of 11+ (to the documented
one); the report says so.
Applies when: the installed generator sorts request ids (speculators 0.4.x); when its
source cannot be read the probe reports a mismatch (fail closed: the generator refuses).
Fails closed: when its probe finds an unknown shape or raises, building the generator
and ``generate()`` raise ``CompatError`` (opt out:
``SPECULATORS_COMPAT_DISABLE=result_order_natural``).
Remove when: speculators 0.4.x support is dropped.
"""

from __future__ import annotations

import builtins
from types import ModuleType

from .._adapter import Context, Verdict
from .._patcher import Patcher
from .._report import Kind
from .._speculators import request_index
from . import _probes, _refusal, _targets
from ._base import GeneratorAdapter


def natural_sorted(iterable, /, *, key=None, reverse=False):
    items = list(iterable)
    if key is None and items and all(request_index(i) is not None for i in items):
        return builtins.sorted(items, key=request_index, reverse=reverse)
    return builtins.sorted(items, key=key, reverse=reverse)


class ResultOrderNatural(GeneratorAdapter):
    name = "result_order_natural"
    kind = Kind.SAFEGUARD
    summary = "return 0.4.x results in input order (numeric, not string, request-id order)"
    upstream = ("speculators 0.4.x bug: results ordered by sorted(request ids) as strings "
                "(req_0_10 < req_0_2); fixed here, changing 0.4.x's order for 11+ sequences")
    vllm_range = None
    speculators_range = ">=0.4.0.dev0,<0.5.0.dev0"
    remove_when = "speculators 0.4.x support is dropped"
    targets = _targets.in_generator("sorted")
    refusal_targets = _targets.REFUSAL_TARGETS
    fail_closed = True

    def refuse(self, patcher: Patcher, ctx: Context, message: str) -> None:
        _refusal.refuse_generator(patcher, ctx, message)

    def check(self, ctx: Context, gen: ModuleType) -> Verdict:
        src = _probes.source(gen)
        if not src:
            return Verdict.mismatch("the source of speculators' generator module is "
                                    "unavailable: cannot tell how it orders results")
        if "sorted(request_id_to_idx" not in src:
            return Verdict.not_needed("generator does not order results by sorted request ids")
        return Verdict.needed("generator orders results by request ids sorted as strings; "
                              "results are returned in input order instead (differs from "
                              "upstream 0.4.x for batches of 11+ sequences)")

    def patch(self, patcher: Patcher, ctx: Context, gen: ModuleType) -> None:
        patcher.setattr(gen, "sorted", natural_sorted)
