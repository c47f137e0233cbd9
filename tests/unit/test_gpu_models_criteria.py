"""The pass criteria of the real-shape GPU run (tests/e2e/scripts/gpu_models.py), on
synthetic tensors: the floor-judged check passes a result exactly as far from an oracle as
vLLM's own native_matched path is, and fails what is farther (rows one position late, the
wrong layer), and the task order puts the decisive pair first. No vLLM needed."""

import argparse
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "e2e" / "scripts"))
import gpu_models as gm  # noqa: E402

torch = pytest.importorskip("torch")

LAYERS = [0, 2, 3]


def _seqs(seed: int, n: int = 4) -> list[list]:
    g = torch.Generator().manual_seed(seed)
    return [[torch.randn(12 + i, 64, generator=g) for _ in LAYERS] for i in range(n)]


def _noisy(seqs, scale: float, seed: int):
    g = torch.Generator().manual_seed(seed)
    return [[h + scale * torch.randn(h.shape, generator=g) for h in seq] for seq in seqs]


def test_within_floor_passes_what_vllm_itself_misses_by_and_nothing_more():
    oracle = _seqs(0)
    vllm = _noisy(oracle, 0.2, 1)  # vLLM's own path misses the oracle (rel. L2 ~20 %)
    shim = [[h.clone() for h in seq] for seq in vllm]  # the shim equals vLLM's path
    strict = gm._compare(shim, oracle, LAYERS)
    assert not strict["ok"]  # outside the bf16 tolerance ...
    floor = gm._compare(vllm, oracle, LAYERS)
    margin = gm.MATCHED_DEFAULTS
    assert gm.within_floor(strict, floor, margin)  # ... but exactly at vLLM's floor
    # farther than the floor plus the margin: not explained by vLLM
    worse = gm._compare(_noisy(vllm, 0.2, 2), oracle, LAYERS)
    assert not gm.within_floor(worse, floor, margin)
    # the known-wrong results fail the floor-judged criterion
    judge = gm._judge(None, floor, margin)
    assert judge(shim, oracle, LAYERS)
    assert gm.known_wrong(shim, oracle, LAYERS, judge=judge) == {
        "rows_one_late": False, "neighbour_layer": False}


def test_within_floor_needs_the_same_layers():
    a = _seqs(0)
    st = gm._compare(a, a, LAYERS)
    assert not gm.within_floor(st, gm._compare(a, a, LAYERS[:2]), gm.MATCHED_DEFAULTS)
    assert not gm.within_floor({"per_layer": {}}, {"per_layer": {}}, gm.MATCHED_DEFAULTS)


def test_exact_matched_tolerance_fails_one_bf16_step():
    a = [[h.to(torch.bfloat16) for h in seq] for seq in _seqs(3)]
    assert gm._compare(a, a, LAYERS, gm.MATCHED_EXACT)["ok"]
    assert gm._bitwise_equal(a, a) == 1.0
    b = [[h.clone() for h in seq] for seq in a]
    b[0][1][0, 0] = torch.nextafter(b[0][1][0, 0].float(), torch.tensor(1e9)).to(b[0][1].dtype)
    if torch.equal(b[0][1], a[0][1]):  # bf16 rounding swallowed the step: take a bigger one
        b[0][1][0, 0] += 1
    assert not gm._compare(b, a, LAYERS, gm.MATCHED_EXACT)["ok"]
    assert gm._bitwise_equal(b, a) < 1.0


def test_plan_puts_the_decisive_pair_first():
    a = argparse.Namespace(models="deepseek_v3_fp8,deepseek_v3,qwen3_moe", tp2=False,
                           spec=[("0.3.0", "/s3"), ("0.4.0.1", "/s4")])
    ids = [t["id"] for t in gm.plan(a, n_gpus=1)]
    assert ids[:2] == ["build:deepseek_v3_fp8", "build:qwen3_moe"]
    first = ids[2:8]
    assert first == ["native_matched:deepseek_v3_fp8", "gen:deepseek_v3_fp8:0.4.0.1",
                     "native_matched:deepseek_v3", "gen:deepseek_v3:0.4.0.1",
                     "native_matched:qwen3_moe", "gen:qwen3_moe:0.4.0.1"]
    assert ids[8:11] == ["native:deepseek_v3_fp8", "native:deepseek_v3", "native:qwen3_moe"]
    assert sorted(ids[11:]) == sorted(f"gen:{m}:0.3.0" for m in
                                      ("deepseek_v3_fp8", "deepseek_v3", "qwen3_moe"))
