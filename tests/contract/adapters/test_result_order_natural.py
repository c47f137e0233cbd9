"""Contract of the ``result_order_natural`` adapter,
on the installed vLLM and speculators.

Speculators' legacy call shape fails (or is wrong) bare where the upstream note says
so and works through the adapter. The checks every adapter shares (the probe agrees with
the expectation table, apply/revert restores identity and changes only the declared
targets) run for every adapter in tests/contract/test_every_adapter.py.
"""

from __future__ import annotations

import builtins
import inspect

import pytest

from ..expectations import applied_if
from ..support import (
    BY_NAME,
    one,
)

NAME = "result_order_natural"

#: Its expected status on the installed release, and why (read by ``expectations.py``).
EXPECTED = (
    lambda e: applied_if(e.speculators_04),
    "speculators 0.4.x orders results by request ids sorted as strings")


def test_legacy_call_shape(base, vllm_config):
    legacy_call_shape(base, base.gen, vllm_config, BY_NAME[NAME])


def legacy_call_shape(base, gen, cfg, adapter):
    ids = [f"req_0_{i}" for i in range(12)]
    # speculators' module looks `sorted` up in its globals, then builtins.
    assert "sorted" not in vars(gen)
    src = inspect.getsource(gen)
    assert ("sorted(request_id_to_idx.keys())" in src) == base.env.speculators_04
    # The upstream bug: string order puts req_0_10 and req_0_11 before req_0_2.
    assert builtins.sorted(ids)[:4] == ["req_0_0", "req_0_1", "req_0_10", "req_0_11"]
    with one(base, adapter) as applied:
        if not applied:
            assert "sorted" not in vars(gen)
            return
        s = gen.sorted
        assert s(reversed(ids)) == ids  # numeric: req_0_2 before req_0_10
        assert s(["req_0_10", "req_0_2"]) == ["req_0_2", "req_0_10"]
        assert s(["req_1_0", "req_0_10"]) == ["req_0_10", "req_1_0"]
        assert s(ids, reverse=True) == ids[::-1]
        assert s({f"req_3_{i}": i for i in (10, 2, 1)}.keys()) == ["req_3_1", "req_3_2",
                                                                   "req_3_10"]
        # Anything else sorts exactly as builtins.sorted does.
        for items, kw in [
            (["req_0_10", "req_0_2", "x"], {}),
            (["b", "a", "c"], {}),
            (["b", "a", "c"], {"reverse": True}),
            ([3, 1, 2], {}),
            ([], {}),
            (ids, {"key": len}),
            (["req_0_10", "req_0_2"], {"key": str.lower}),
            (["Req_0_10", "Req_0_2"], {}),
            (["req_0_10 ", "req_0_2"], {}),
            ([(2, "a"), (1, "b")], {}),
        ]:
            assert s(iter(items), **kw) == builtins.sorted(items, **kw), (items, kw)
        with pytest.raises(TypeError):
            s([1, "a"])
        with pytest.raises(TypeError):
            s([1, 2], lambda x: x)  # key is keyword-only, as in builtins.sorted
    assert "sorted" not in vars(gen)
