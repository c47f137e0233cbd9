"""Fake model runners and scheduler outputs for the capture unit tests (torch, no vLLM).

Why fakes: the row bookkeeping of :mod:`speculators_compat._capture` (which rows of a
step belong to which request and prompt position) must be testable without starting
vLLM, and for cases a real run rarely produces on demand (a preemption in the middle of
a chunked prefill, Model Runner V2's reordered batch, a prefix-cache gap).

Every hidden row the fake model produces encodes where it came from: column 0 is the
request's code, column 1 the prompt position, column 2 the number of decoder layers the
row went through (layer ``k`` outputs ``k + 1``). A correct capture of layer ``k`` for a
request of prompt length ``n`` is therefore exactly ``expected_rows(code, n, k)``.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import torch


class FakeLayer(torch.nn.Module):
    """vLLM-style decoder layer: returns ``(delta, residual)``; its output is their sum."""

    def forward(self, hidden: torch.Tensor, residual: torch.Tensor | None):
        inp = hidden if residual is None else hidden + residual
        delta = torch.zeros_like(inp)
        delta[:, 2] = 1.0
        return delta, inp


class FakeBase(torch.nn.Module):
    def __init__(self, n_layers: int) -> None:
        super().__init__()
        self.layers = torch.nn.ModuleList(FakeLayer() for _ in range(n_layers))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        hidden, residual = x, None
        for layer in self.layers:
            hidden, residual = layer(hidden, residual)
        return hidden + residual


class FakeModel(torch.nn.Module):
    def __init__(self, n_layers: int) -> None:
        super().__init__()
        self.model = FakeBase(n_layers)


def expected_rows(code: int, n: int, layer: int) -> torch.Tensor:
    return torch.tensor([[float(code), float(p), float(layer + 1)] for p in range(n)])


class Codes:
    """A number per request id, so that rows name their request."""

    def __init__(self) -> None:
        self._codes: dict[str, int] = {}

    def __call__(self, rid: str) -> int:
        return self._codes.setdefault(rid, len(self._codes) + 1)


def scheduler_output(entries, prompts: dict[str, list[int]], *, cached_shape: str = "lists",
                     positions: bool = True, finished=()) -> Any:
    """A SchedulerOutput look-alike: ``entries`` are ``(req_id, tokens, start, is_new)``.

    ``cached_shape``: "lists" (vLLM 0.10+: one object of parallel lists) or "objects"
    (earlier V1: one object per cached request). ``positions=False`` leaves out every
    ``num_computed_tokens`` (a release the capture cannot read positions from).
    """
    new, cached = [], []
    for rid, _n, start, is_new in entries:
        if is_new:
            d = {"req_id": rid, "prompt_token_ids": prompts[rid]}
            if positions:
                d["num_computed_tokens"] = start
            new.append(SimpleNamespace(**d))
        else:
            cached.append((rid, start))
    if cached_shape == "objects":
        cached_obj: Any = [SimpleNamespace(req_id=r, resumed_from_preemption=s == 0,
                                           **({"num_computed_tokens": s} if positions else {}))
                           for r, s in cached]
    else:
        d = {"req_ids": [r for r, _ in cached],
             "resumed_req_ids": {r for r, s in cached if s == 0}}
        if positions:
            d["num_computed_tokens"] = [s for _, s in cached]
        cached_obj = SimpleNamespace(**d)
    return SimpleNamespace(
        scheduled_new_reqs=new, scheduled_cached_reqs=cached_obj,
        num_scheduled_tokens={rid: n for rid, n, _, _ in entries},
        total_num_scheduled_tokens=sum(n for _, n, _, _ in entries),
        finished_req_ids=set(finished))


def _rows(entries, codes: Codes, order: list[str]) -> torch.Tensor:
    by_id = {rid: (n, start) for rid, n, start, _ in entries}
    rows = []
    for rid in order:
        n, start = by_id[rid]
        rows += [[float(codes(rid)), float(start + i), 0.0] for i in range(n)]
    return torch.tensor(rows, dtype=torch.float32)


class FakeV1Runner:
    """Model Runner V1 look-alike: ``input_batch.req_ids`` gives the row order.

    ``order`` maps the step's scheduled ids to the batch order (default: reversed, so
    that scheduler order and row order differ). The runner keeps ``requests`` until a
    step's ``finished_req_ids`` names them, like vLLM's.
    """

    def __init__(self, n_layers: int = 4, order=None) -> None:
        self.model = FakeModel(n_layers)
        self.input_batch = SimpleNamespace(req_ids=[], num_reqs=0)
        self.requests: dict[str, Any] = {}
        self.codes = Codes()
        self.order = order or (lambda ids: list(reversed(ids)))
        self.entries: list = []
        self.seen_finished: list[set[str]] = []

    def execute_model(self, so, *args, **kwargs):
        self.seen_finished.append(set(so.finished_req_ids))
        for rid in so.finished_req_ids:
            self.requests.pop(rid, None)
        order = self.order(list(so.num_scheduled_tokens))
        for rid in order:
            self.requests.setdefault(rid, object())
        self.input_batch.req_ids = [*order, None]  # a free slot, as in vLLM
        self.input_batch.num_reqs = len(order)
        if not order:
            return None
        return self.model.model(_rows(self.entries, self.codes, order))


class FakeV2Runner:
    """Model Runner V2 look-alike: no ``input_batch``; each step's batch comes from
    ``prepare_inputs``, sorted by query length (not in the scheduler's order)."""

    def __init__(self, n_layers: int = 4, prepare: bool = True) -> None:
        self.model = FakeModel(n_layers)
        self.req_states = SimpleNamespace(req_id_to_index={})
        self.pcp_manager = None
        self.codes = Codes()
        self.entries: list = []
        self._prepare = prepare
        self.batch_override = None

    def prepare_inputs(self, so):
        ids = sorted(so.num_scheduled_tokens, key=lambda r: so.num_scheduled_tokens[r])
        batch = SimpleNamespace(req_ids=ids, num_reqs=len(ids),
                                num_scheduled_tokens=[so.num_scheduled_tokens[r] for r in ids])
        return self.batch_override or batch

    def execute_model(self, so, *args, **kwargs):
        for rid in so.finished_req_ids:
            self.req_states.req_id_to_index.pop(rid, None)
        if not so.num_scheduled_tokens:
            return None
        if self._prepare:
            batch = self.prepare_inputs(so)
            order = list(batch.req_ids)
        else:
            order = list(so.num_scheduled_tokens)
        for rid in order:
            self.req_states.req_id_to_index.setdefault(rid, len(self.req_states.req_id_to_index))
        return self.model.model(_rows(self.entries, self.codes, order))


def step(runner, entries, prompts, **kwargs):
    """Run one scheduled step through the (capture-wrapped) runner."""
    runner.entries = entries
    so = scheduler_output(entries, prompts, **kwargs)
    runner.execute_model(so)
    return so
