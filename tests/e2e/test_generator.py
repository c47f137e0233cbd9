"""speculators' own generator, unchanged, on real vLLM through the shim (and without it).

Every returned layer is compared with a bf16 transformers forward of the same checkpoint
(``speculators_compat.demo.reference.compare``'s tolerances); batches of 1, 12, 33 and 64
mixed-length sequences must come back whole and in input order. The same run shows the
comparison is able to fail: the result compared in deliberately wrong ways (neighbouring
layer, swapped rows, rows one position late, no residual) must fail every time.

The module's runs (one generator each, fresh interpreters) are independent, so the ones
this combination runs start together, two at a time, when the first test needs one:
start-up (importing vLLM in the driver and the worker) is most of their time, on one
core each.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

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
        assert b["plain_owned"], b  # plain CPU tensors owning exactly their bytes
    assert result["ok"]
    # The comparison can tell: each deliberately wrong result fails it.
    wrong = result["known_wrong"]
    assert wrong.pop("correct") is True, wrong
    assert {"off_by_one_layer", "two_rows_swapped", "rows_one_late"} <= set(wrong), wrong
    assert not any(wrong.values()), wrong


def _chunked_arg() -> bool:
    return installed("speculators").startswith("0.4")


def _mla() -> bool:
    return vllm_version() >= Version("0.28.0")


@pytest.fixture(scope="module")
def runs():
    """The module's generator runs that apply here, started two at a time, biggest
    first: name -> future of the result."""
    require_speculators()
    llama = checkpoint("llama")
    # speculators 0.3 has no max_num_batched_tokens: a first batch above its fixed
    # 8192-token step budget is its chunked-prefill case.
    long = ["--long-batch", "36"] if installed("speculators").startswith("0.3") else []
    args = {"llama": ("--model", llama, "--layers", "0,2,5", "--batches", "1,12,33,64",
                      "--consistency", "--preempt", *long)}
    if _chunked_arg():
        args["chunked"] = ("--model", llama, "--batches", "11", "--max-num-batched-tokens",
                           "64", "--min-len", "40", "--max-len", "120")
    if _mla():
        args["deepseek_v3"] = ("--model", checkpoint("deepseek_v3"), "--layers", "0,1,3",
                               "--batches", "12")
    args["no_activate"] = ("--model", llama, "--batches", "3", "--no-activate")
    with ThreadPoolExecutor(max_workers=2) as pool:
        yield {name: pool.submit(run_script, "generate.py", *a) for name, a in args.items()}


@pytest.fixture(scope="module")
def llama_run(runs):
    return runs["llama"].result()


def test_llama_hidden_states_match_transformers(llama_run):
    _assert_ok(llama_run)
    sizes = [b["size"] for b in llama_run["batches"]]
    if installed("speculators").startswith("0.3"):
        assert sizes[0] == 36 and llama_run["batches"][0]["tokens"] > 8192, sizes
        sizes = sizes[1:]
    assert sizes == [1, 12, 33, 64]
    assert llama_run["layer_ids"] == [0, 2, 5]


def test_batch_results_equal_single_and_repeat(llama_run):
    extra = llama_run["extra"]
    assert extra["repeat_lengths"] == [64, 64], extra
    assert extra["repeat_max_abs_diff"] == 0.0, extra  # the same batch again: bit-identical
    # The same sequence alone and in a batch of 64: bit-identical on vLLM's CPU backend
    # (measured on 0.16 and 0.32 with both speculators releases: max |diff| 0.0).
    assert extra["single_lengths"] == [5, 5], extra
    assert extra["single_max_abs_diff"] == 0.0, extra
    # Nothing accumulates in the workers across calls (only the last call's one request).
    assert max(extra["runner_requests_held"]) <= 1, extra
    # speculators 0.4 made its requests without block hashes (prefix caching is off:
    # nothing reads them), so the results above come from requests vLLM's engine makes.
    want = "none" if installed("speculators").startswith("0.4") else "absent"
    assert extra["block_hasher"] == want, extra


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


def test_workers_run_the_shims_extension(llama_run):
    """Asked of the workers themselves (their class hierarchy), not the driver's report."""
    contract = ("ListContractExtension" if installed("speculators").startswith("0.3")
                else "ByRequestContractExtension")
    classes = llama_run["worker_classes"]
    assert classes, llama_run.get("steps")
    for mro in classes:
        assert f"speculators_compat.worker_extension.{contract}" in mro, mro
        assert not [c for c in mro if c.startswith("speculators.")], mro


def test_kv_cache_pressure_gives_whole_sequences_without_preemption(llama_run):
    """A KV cache about 3x smaller than the batch (32-token prefill chunks): upstream,
    vLLM admits requests on their first chunk and later preempts some mid-prefill, whose
    recompute speculators' loop cannot follow (the capture refused the call with
    "captured only partly" on speculators 0.4 / vLLM 0.16 and both releases on vLLM
    0.32). scheduler_prefill_only admits a request only when its whole prompt fits: the
    call succeeds, equal to transformers, and nothing is preempted."""
    pre = llama_run["extra"]["preempt"]
    assert pre["error"] is None, pre
    assert pre["returned"] == pre["size"] and pre["input_order"], pre
    assert pre["compare"]["ok"], pre["compare"]
    assert pre["preempted"] == 0 and sum(pre["capture_restarts"]) == 0, pre
    # the pressure was real: fewer free blocks than the batch needs at once
    assert pre["kv_blocks"] * 2 < pre["batch_blocks"], pre


def test_without_activate_fails_like_upstream(runs):
    result = runs["no_activate"].result()
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


def test_chunked_prefill_gives_whole_sequences(runs):
    if not _chunked_arg():
        pytest.skip("max_num_batched_tokens is a speculators 0.4 argument")
    _assert_ok(runs["chunked"].result())


def test_deepseek_v3_layout_matches_transformers(runs):
    if not _mla():
        pytest.skip("vLLM's CPU backend runs MLA from about 0.28")
    _assert_ok(runs["deepseek_v3"].result())
