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
    scripts = dict.fromkeys(args, "generate.py")
    if _qwen3_next_runs_here():
        scripts["qwen3_next_errors"] = "errors.py"
        args["qwen3_next_errors"] = ("--model", checkpoint("qwen3_next"), "--layers", "0,2,3")
    with ThreadPoolExecutor(max_workers=max(1, len(args))) as pool:
        yield {name: pool.submit(run_script, scripts[name], *a) for name, a in args.items()}


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


def test_qwen3_next_failed_and_interrupted_calls_leave_no_linear_attention_state(runs):
    """The failure paths of ``test_errors.py`` on a model with per-request linear-attention
    state (Qwen3-Next): a call whose first or second model step raises leaves the scheduler
    empty, and the next call on the same generator still equals transformers (no state of
    the failed call's requests reaches it); an interrupted call issues no RPC and makes the
    generator refuse further calls."""
    if not _qwen3_next_runs_here():
        pytest.skip(f"vLLM {vllm_version()}'s CPU build does not load Qwen3-Next (verified "
                    f"from {QWEN3_NEXT_CPU})")
    result = runs["qwen3_next_errors"].result()
    empty = {"requests": 0, "running": 0, "waiting": 0, "deferred": 0}
    for section in ("failed_step", "failed_second_step"):
        info = result[section]
        assert "error" not in info, info
        assert "injected failure" in info["failed"]["message"], info["failed"]
        assert info["scheduler_after_failure"] == empty, info
        nxt = info["next_call"]
        assert nxt["returned"] == nxt["expected"] == 12 and nxt["input_order"], nxt
        assert nxt["compare_ok"], nxt
    info = result["interrupted"]
    assert info["raised"] == "KeyboardInterrupt" and info["rpcs_after_interrupt"] == [], info
    assert info["next_call"]["raised"] == "CompatError", info
