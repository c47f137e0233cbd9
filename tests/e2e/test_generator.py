"""speculators' own generator, unchanged, on real vLLM through the shim (and without it).

Every returned layer is compared with a bf16 transformers forward of the same checkpoint
(min per-token cosine >= 0.99, max abs error <= 5% of the reference's max); batches of
1, 12, 33 and 64 mixed-length sequences must come back whole and in input order.
"""

from __future__ import annotations

import pytest
from helpers import checkpoint, installed, require_speculators, run_script, vllm_version
from packaging.version import Version

pytestmark = pytest.mark.e2e


def _assert_ok(result: dict) -> None:
    assert "failed_step" not in result, (result.get("failed_step"), result.get("error"),
                                         result.get("_stderr_tail"))
    for b in result["batches"]:
        assert b["returned"] == b["size"], b
        assert b["input_order"], b
        assert b["dtypes"] == ["torch.bfloat16"], b
        assert b["compare"]["ok"], b["compare"]
    assert result["ok"]


@pytest.fixture(scope="module")
def llama_run():
    require_speculators()
    return run_script("generate.py", "--model", checkpoint("llama"), "--layers", "0,2,5",
                      "--batches", "1,12,33,64", "--consistency")


def test_llama_hidden_states_match_transformers(llama_run):
    _assert_ok(llama_run)
    assert [b["size"] for b in llama_run["batches"]] == [1, 12, 33, 64]
    assert llama_run["layer_ids"] == [0, 2, 5]


def test_batch_results_equal_single_and_repeat(llama_run):
    extra = llama_run["extra"]
    assert extra["repeat_identical"], extra
    assert extra["single_close_to_batch"], extra
    # Nothing accumulates in the workers across calls (only the last call's one request).
    assert max(extra["runner_requests_held"]) <= 1, extra


def test_adapters_reach_spawned_workers(llama_run):
    reports = llama_run["worker_reports"]
    assert reports and all(r is not None for r in reports), reports
    for r in reports:
        assert r["process"] == "worker"
        assert r["pid"] != llama_run["driver_pid"]
        assert r["active"]
    driver = llama_run["report"]
    assert driver["process"] == "driver"
    statuses = {a["name"]: a["status"] for a in driver["adapters"]}
    assert statuses["hook_capture"] == "applied"


def test_without_activate_fails_like_upstream():
    require_speculators()
    result = run_script("generate.py", "--model", checkpoint("llama"), "--batches", "3",
                        "--no-activate")
    assert not result["ok"]
    assert "failed_step" in result, "upstream speculators should fail on this vLLM without us"
    step, error = result["failed_step"], result["error"]
    v = vllm_version()
    if installed("transformers").startswith("5"):
        assert step == "import speculators' generator"
        assert "torch" in error and "not defined" in error
    elif installed("speculators").startswith("0.3") and v >= Version("0.12.0"):
        assert "is_encoder_decoder" in error
    else:  # speculators 0.4 on a machine without a GPU: zero KV blocks
        assert step.startswith("start VllmHiddenStatesGenerator"), (step, error)


def test_chunked_prefill_gives_whole_sequences():
    require_speculators()
    if not installed("speculators").startswith("0.4"):
        pytest.skip("max_num_batched_tokens is a speculators 0.4 argument")
    result = run_script("generate.py", "--model", checkpoint("llama"), "--batches", "11",
                        "--max-num-batched-tokens", "64", "--min-len", "40", "--max-len", "120")
    _assert_ok(result)


def test_deepseek_v3_layout_matches_transformers():
    require_speculators()
    if vllm_version() < Version("0.28.0"):
        pytest.skip("vLLM's CPU backend runs MLA from about 0.28")
    result = run_script("generate.py", "--model", checkpoint("deepseek_v3"), "--layers",
                        "0,1,3", "--batches", "12")
    _assert_ok(result)
