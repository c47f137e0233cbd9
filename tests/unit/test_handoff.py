"""Zero copy: speculators' ``clone()`` of a transported tensor takes the call's memory
over (``speculators_compat.transport.handoff`` with the rest of the transport).

Worker and driver halves run in one process, as in test_transport.py; speculators' own use
is reproduced literally (``h.clone().cpu()`` for 0.4.x, ``h[o:o + n].clone().cpu()`` for
0.3.x). tests/e2e/test_transport.py runs it inside real vLLM workers.
"""

from __future__ import annotations

import io

import pytest

torch = pytest.importorskip("torch")

from speculators_compat.demo.runner import owns_exactly  # noqa: E402
from speculators_compat.transport import handoff, wire  # noqa: E402
from speculators_compat.transport.driver import Receiver  # noqa: E402
from speculators_compat.transport.worker import Sender  # noqa: E402

BF16 = torch.bfloat16
HIDDEN = 256


def _states(seed=0, lens=(60, 45, 70, 33), n_layers=2):
    g = torch.Generator().manual_seed(seed)
    return {f"req_{seed}_{i}": [torch.randn(n, HIDDEN, generator=g).to(BF16)
                                for _ in range(n_layers)] for i, n in enumerate(lens)}


def _fetch(states, contract=wire.BY_REQUEST, handoff_on=True):
    """One call through the transport (the worker's export of a copy of ``states``);
    returns (contract object, the region's address range in the driver)."""
    copy = ({k: [t.clone() for t in v] for k, v in states.items()}
            if isinstance(states, dict) else [t.clone() for t in states])
    sender, receiver = Sender(), Receiver(handoff=handoff_on)
    reply = sender.export(copy, contract)
    got = receiver.fetch(lambda: reply)
    sender.close()
    first = next(iter(got.values()))[0] if isinstance(got, dict) else got[0]
    lo = first.untyped_storage().data_ptr() - reply["items"][0][2]
    return got, (lo, lo + reply["size"])


def _inside(t, span) -> bool:
    return span[0] <= t.data_ptr() < span[1]


def test_clone_takes_the_region_over_and_results_own_exactly_their_bytes():
    states = _states()
    got, span = _fetch(states)
    assert all(type(h) is handoff.handoff_class() for v in got.values() for h in v)
    results = {rid: [h.clone().cpu() for h in layers] for rid, layers in got.items()}
    for rid, layers in results.items():
        for h, want in zip(layers, states[rid], strict=True):
            assert owns_exactly(h)  # plain tensor, storage = its own bytes
            assert _inside(h, span)  # no copy: the region itself
            assert h.dtype == want.dtype and torch.equal(h, want)
            buf = io.BytesIO()
            torch.save(h, buf)  # saves this result, not the whole region
            assert len(buf.getvalue()) < h.numel() * h.element_size() + 4096


def test_list_contract_slices_clone_to_exact_storages():
    """speculators 0.3.x slices each layer's lane per sequence, then clones."""
    lens = [60, 45, 70, 33]
    lanes = [torch.randn(sum(lens), HIDDEN).to(BF16) for _ in range(2)]
    got, span = _fetch(lanes, wire.LIST)
    offset = 0
    for n in lens:
        layer_states = [h[offset:offset + n].clone().cpu() for h in got]
        for h, lane in zip(layer_states, lanes, strict=True):
            assert owns_exactly(h) and _inside(h, span)
            assert torch.equal(h, lane[offset:offset + n])
        offset += n


def test_owns_exactly_fails_a_view_of_the_whole_lane():
    """Known wrong: handing over a slice that keeps the whole lane as its storage (what
    ``as_subclass`` of the slice would give) fails the check that results own exactly
    their bytes."""
    lanes = [torch.randn(208, HIDDEN).to(BF16)]
    got, _ = _fetch(lanes, wire.LIST)
    wrong = got[0][10:50].as_subclass(torch.Tensor)
    assert torch.equal(wrong, lanes[0][10:50]) and not owns_exactly(wrong)
    assert not owns_exactly(got[0][10:50])  # the subclass itself is not what users get


def test_clone_copies_where_memory_cannot_be_taken_over():
    got, span = _fetch(_states())
    h = next(iter(got.values()))[0]
    for copied in (h.t().clone(), h.clone(memory_format=torch.contiguous_format).t().clone()):
        assert type(copied) is torch.Tensor and not _inside(copied, span)
        assert torch.equal(copied, h.t())
    took = h.clone(memory_format=torch.contiguous_format)
    assert type(took) is torch.Tensor and _inside(took, span)


def test_without_handoff_tensors_are_plain_views():
    got, _ = _fetch(_states(), handoff_on=False)
    assert all(type(h) is torch.Tensor for v in got.values() for h in v)
