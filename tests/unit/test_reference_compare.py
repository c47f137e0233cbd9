"""``demo.reference.compare``: lengths are checked (no silent ``zip`` truncation), the
relative L2 bound and per-layer summary, and wrong results of the kinds a capture bug
would give fail with the default tolerances. Needs torch (not vLLM)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from speculators_compat.demo.reference import compare  # noqa: E402


def residual_stream(n_seq: int = 3, tokens: int = 9, hidden: int = 64, layers: int = 4):
    """Per sequence, per layer: a residual stream where each layer adds a small update
    (as in a real decoder), so neighbouring layers are similar but not equal."""
    g = torch.Generator().manual_seed(0)
    out = []
    for _ in range(n_seq):
        h = torch.randn(tokens, hidden, generator=g)
        per = []
        for _ in range(layers):
            h = h + 0.3 * torch.randn(tokens, hidden, generator=g)
            per.append(h.to(torch.bfloat16))
        out.append(per)
    return out


def bf16_noise(seqs):
    return [[(t.float() * (1 + 2**-9)).to(torch.bfloat16) for t in per] for per in seqs]


def test_correct_within_rounding_passes_and_reports_per_layer():
    ref = residual_stream()
    cmp = compare(bf16_noise(ref), ref)
    assert cmp["ok"], cmp["reasons"]
    assert len(cmp["per_layer"]) == 4
    assert cmp["max_rel_l2_err"] < 0.01 and cmp["min_cosine"] > 0.9999


def test_lengths_are_checked_not_zipped():
    ref = residual_stream()
    assert not compare(ref[:2], ref)["ok"]
    assert "number of sequences differs: 2 vs 3" in compare(ref[:2], ref)["reasons"]
    assert not compare([per[:3] for per in ref], ref)["ok"]


@pytest.mark.parametrize("wrong", ["next_layer", "rows_swapped", "rows_one_late",
                                   "no_residual"])
def test_known_wrong_results_fail(wrong):
    ref = residual_stream(layers=5)
    actual = [per[:4] for per in ref]
    expected = [per[:4] for per in ref]
    if wrong == "next_layer":
        actual = [per[1:5] for per in ref]
    elif wrong == "rows_swapped":
        actual[0] = [t[[1, 0, *range(2, t.shape[0])]] for t in actual[0]]
    elif wrong == "rows_one_late":
        actual = [[torch.roll(t, 1, 0) for t in per] for per in actual]
    else:
        actual = [[per[k] if k == 0 else (per[k].float() - per[k - 1].float()).to(torch.bfloat16)
                   for k in range(4)] for per in ref]
    assert compare(actual, expected)["ok"] is False


def test_relative_l2_bound_applies():
    ref = residual_stream()
    off = [[(t.float() * 1.02).to(torch.bfloat16) for t in per] for per in ref]
    assert compare(off, ref, max_rel_l2_err=0.05)["ok"]
    cmp = compare(off, ref, max_rel_l2_err=0.01)
    assert not cmp["ok"] and "relative L2 error" in cmp["reasons"][0]
