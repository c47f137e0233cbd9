"""Models that mix attention kinds in one network, through speculators' unchanged generator.

Qwen3-Next puts gated-delta-net linear attention (a per-request recurrent state, no KV
blocks) beside full attention; Gemma 4 puts sliding-window layers beside full-attention
layers of another head size. Neither fits speculators' one KV cache group: both run only
with vLLM's own grouping (the ``kv_cache_groups_hybrid`` adapter). Every captured layer
is compared with transformers; sequences of 60-160 tokens cross Gemma 4's 64-token
window, and with speculators 0.4's 96-token step budget every prompt is prefilled over
several steps, so the linear-attention state must carry from step to step (and never
from one request to the next: batch 1, then 7 new requests).

The two runs (fresh interpreters) start together when the module's first test needs one.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest
from helpers import (
    assert_generated_ok,
    checkpoint,
    installed,
    require_speculators,
    run_script,
    vllm_version,
)
from packaging.version import Version

pytestmark = pytest.mark.e2e

COMMON = ("--batches", "1,7", "--min-len", "60", "--max-len", "160")


#: vLLM CPU builds that load Qwen3-Next: 0.32 does; 0.16's fails while loading it
#: (``dispatch_cpu_unquantized_gemm``: the gated-delta-net conv1d weight is 3-D), before
#: any shim code runs. Releases in between are not verified here.
QWEN3_NEXT_CPU = Version("0.32.0")


def _qwen3_next_runs_here() -> bool:
    return vllm_version() >= QWEN3_NEXT_CPU


def _gemma4_runs_here() -> bool:
    """Gemma 4 needs transformers 5 (the checkpoint and the reference)."""
    return Version(installed("transformers") or "0") >= Version("5.5")


@pytest.fixture(scope="module")
def runs():
    require_speculators()
    spec = installed("speculators") or ""
    chunked = ("--max-num-batched-tokens", "96") if spec.startswith("0.4") else ()
    args = {}
    if _qwen3_next_runs_here():
        args["qwen3_next"] = ("--model", checkpoint("qwen3_next"), "--layers", "0,2,3",
                              *COMMON, *chunked)
    if _gemma4_runs_here():
        args["gemma4"] = ("--model", checkpoint("gemma4"), "--layers", "0,4,5", *COMMON,
                          *chunked)
    with ThreadPoolExecutor(max_workers=max(1, len(args))) as pool:
        yield {name: pool.submit(run_script, "generate.py", *a) for name, a in args.items()}


def test_qwen3_next_linear_attention_matches_transformers(runs):
    if not _qwen3_next_runs_here():
        pytest.skip(f"vLLM {vllm_version()}'s CPU build does not load Qwen3-Next (verified "
                    f"from {QWEN3_NEXT_CPU})")
    result = runs["qwen3_next"].result()
    assert_generated_ok(result)


def test_gemma4_sliding_and_full_of_two_head_sizes_match_transformers(runs):
    if not _gemma4_runs_here():
        pytest.skip(f"Gemma 4 needs transformers 5 (this env: {installed('transformers')}, "
                    f"vLLM {vllm_version()})")
    assert_generated_ok(runs["gemma4"].result())
