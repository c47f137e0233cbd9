"""Row bookkeeping of the capture (``_capture.LayerCapture``) with fake runners.

What must hold: every captured row lands at its request's prompt position (whatever
order the runner's batch is in, across chunked-prefill steps), decode rows are not kept,
a recomputed prompt (preemption) restarts the request's rows instead of appending to
them, positions the capture cannot account for are refused, and ``take()`` refuses
partial results. Needs torch (not vLLM); skipped only where torch is absent.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from capture_fakes import (  # noqa: E402
    FakeV1Runner,
    FakeV2Runner,
    expected_rows,
    scheduler_output,
    step,
)

from speculators_compat._capture import LayerCapture, scheduled_positions  # noqa: E402
from speculators_compat._errors import CompatError  # noqa: E402

LAYERS = [0, 2, 3]


def prompts_of(**lengths: int) -> dict[str, list[int]]:
    return {rid.replace("__", "_"): list(range(5, 5 + n)) for rid, n in lengths.items()}


def assert_whole(cap: LayerCapture, runner, prompts: dict[str, list[int]], out=None) -> None:
    out = cap.take() if out is None else out
    assert list(out) == sorted(prompts, key=lambda r: int(r.rsplit("_", 1)[1])), list(out)
    for rid, layers in out.items():
        assert len(layers) == len(LAYERS), (rid, len(layers))
        for k, t in zip(LAYERS, layers):
            torch.testing.assert_close(t, expected_rows(runner.codes(rid), len(prompts[rid]), k),
                                       rtol=0, atol=0, msg=f"{rid} layer {k}")


def v1(order=None) -> tuple[FakeV1Runner, LayerCapture]:
    runner = FakeV1Runner(order=order)
    return runner, LayerCapture(runner, LAYERS, enabled=True)


# -- layout ------------------------------------------------------------------------------
def test_rows_follow_runner_order_across_chunks():
    runner, cap = v1()
    p = prompts_of(req_0_0=5, req_0_1=9, req_0_2=3, req_0_10=4)
    # Step 1: three requests, one chunked; the runner's rows are in reverse order.
    step(runner, [("req_0_0", 5, 0, True), ("req_0_1", 4, 0, True), ("req_0_2", 3, 0, True)], p)
    # Step 2: the rest of req_0_1, a new request, and a decode row of req_0_0 (not kept).
    step(runner, [("req_0_1", 5, 4, False), ("req_0_10", 4, 0, True), ("req_0_0", 1, 5, False)],
         p)
    assert cap.restarts == 0
    assert_whole(cap, runner, p)  # input order is numeric: req_0_10 after req_0_2


def test_scheduler_order_rows_too():
    runner, cap = v1(order=lambda ids: ids)
    p = prompts_of(req_1_0=6, req_1_1=2)
    step(runner, [("req_1_0", 6, 0, True), ("req_1_1", 2, 0, True)], p)
    assert_whole(cap, runner, p)


def test_runner_batch_must_match_scheduled_requests():
    runner, cap = v1(order=lambda ids: ids[:-1])
    p = prompts_of(req_0_0=3, req_0_1=3)
    with pytest.raises(CompatError, match="does not match the scheduled"):
        step(runner, [("req_0_0", 3, 0, True), ("req_0_1", 3, 0, True)], p)


def test_take_refuses_partial_prefill_and_forgets_after_success():
    runner, cap = v1()
    p = prompts_of(req_0_0=8)
    step(runner, [("req_0_0", 5, 0, True)], p)
    with pytest.raises(CompatError, match=r"req_0_0: 5/8 tokens"):
        cap.take()
    step(runner, [("req_0_0", 3, 5, False)], p)
    assert_whole(cap, runner, p)
    assert cap.take() == {}


def test_not_armed_or_disabled_captures_nothing():
    runner = FakeV1Runner()
    cap = LayerCapture(runner, LAYERS, enabled=False)
    step(runner, [("req_0_0", 3, 0, True)], prompts_of(req_0_0=3))
    assert cap.rows == {} and cap.prompt_len == {}


def test_layer_ids_checked():
    with pytest.raises(CompatError, match="out of range"):
        LayerCapture(FakeV1Runner(n_layers=4), [0, 4], enabled=True)
    with pytest.raises(CompatError, match="no layer ids"):
        LayerCapture(FakeV1Runner(), [], enabled=True)


def test_remove_restores_runner():
    runner = FakeV1Runner()
    original = runner.execute_model
    cap = LayerCapture(runner, LAYERS, enabled=True)
    assert runner.execute_model != original
    cap.remove()
    assert runner.execute_model == original and "execute_model" not in runner.__dict__
    assert all(not layer._forward_hooks for layer in runner.model.model.layers)


# -- Model Runner V2 ---------------------------------------------------------------------
def test_v2_rows_follow_prepared_batch_order():
    runner = FakeV2Runner()
    cap = LayerCapture(runner, LAYERS, enabled=True)
    p = prompts_of(req_0_0=7, req_0_1=2, req_0_2=4)
    step(runner, [("req_0_0", 7, 0, True), ("req_0_1", 2, 0, True), ("req_0_2", 3, 0, True)], p)
    step(runner, [("req_0_2", 1, 3, False)], p)
    assert_whole(cap, runner, p)


def test_v2_without_prepared_batch_refuses():
    runner = FakeV2Runner(prepare=False)
    LayerCapture(runner, LAYERS, enabled=True)
    with pytest.raises(CompatError, match="without preparing its batch"):
        step(runner, [("req_0_0", 3, 0, True)], prompts_of(req_0_0=3))


def test_v2_batch_with_other_counts_refuses():
    from types import SimpleNamespace

    runner = FakeV2Runner()
    LayerCapture(runner, LAYERS, enabled=True)
    runner.batch_override = SimpleNamespace(req_ids=["req_0_0"], num_reqs=1,
                                            num_scheduled_tokens=[2])
    with pytest.raises(CompatError, match="Model Runner V2's batch does not match"):
        step(runner, [("req_0_0", 3, 0, True)], prompts_of(req_0_0=3))


def test_v2_dummy_run_is_ignored():
    runner = FakeV2Runner(prepare=False)
    cap = LayerCapture(runner, LAYERS, enabled=True)
    runner.entries = [("dummy", 2, 0, True)]
    so = scheduler_output([], {})
    so.num_scheduled_tokens = {"dummy": 2}  # not a capture request, no prepared batch
    runner.execute_model(so)
    assert cap.rows == {}


# -- stale release -----------------------------------------------------------------------
def test_stale_requests_are_released_with_the_next_step():
    runner, cap = v1()
    p = prompts_of(req_0_0=3, req_0_1=3)
    step(runner, [("req_0_0", 3, 0, True), ("req_0_1", 3, 0, True)], p)
    cap.take()
    assert set(runner.requests) == {"req_0_0", "req_0_1"}  # never told they finished
    cap.reset()  # next generate(): the earlier requests are stale
    p2 = prompts_of(req_1_0=2)
    step(runner, [("req_1_0", 2, 0, True)], p2)
    assert runner.seen_finished[-1] == {"req_0_0", "req_0_1"}
    assert set(runner.requests) == {"req_1_0"}
    assert_whole(cap, runner, p2)


def test_stale_release_spares_rescheduled_ids_and_dummy_runs():
    runner, cap = v1()
    step(runner, [("req_0_0", 3, 0, True)], prompts_of(req_0_0=3))
    cap.reset()
    so = scheduler_output([], {})
    runner.execute_model(so, dummy_run=True)  # a dummy run does not consume the release
    assert runner.seen_finished[-1] == set()
    step(runner, [("req_0_0", 3, 0, True)], prompts_of(req_0_0=3))  # same id scheduled again
    assert runner.seen_finished[-1] == set()


# -- recompute (preemption) --------------------------------------------------------------
def _preempted_run(runner, p, cached_shape="lists"):
    # req_0_0 gets 6 of 10 positions, then is preempted (num_computed_tokens -> 0) while
    # req_0_1 runs, then resumed as a cached request from position 0 and run whole.
    step(runner, [("req_0_0", 6, 0, True), ("req_0_1", 2, 0, True)], p, cached_shape=cached_shape)
    step(runner, [("req_0_1", 2, 2, False)], p, cached_shape=cached_shape)
    step(runner, [("req_0_0", 10, 0, False)], p, cached_shape=cached_shape)


@pytest.mark.parametrize("cached_shape", ["lists", "objects"])
def test_recomputed_prompt_restarts_its_rows(cached_shape):
    runner, cap = v1()
    p = prompts_of(req_0_0=10, req_0_1=4)
    _preempted_run(runner, p, cached_shape)
    assert cap.restarts == 1
    assert_whole(cap, runner, p)


def test_recompute_in_chunks_and_as_new_request():
    """Model Runner V2 gets a resumed request as a new one; it may resume in chunks."""
    runner = FakeV2Runner()
    cap = LayerCapture(runner, LAYERS, enabled=True)
    p = prompts_of(req_0_0=10)
    step(runner, [("req_0_0", 6, 0, True)], p)
    step(runner, [("req_0_0", 4, 0, True)], p)  # resumed, first chunk
    step(runner, [("req_0_0", 6, 4, False)], p)
    assert cap.restarts == 1
    assert_whole(cap, runner, p)


def test_without_position_check_a_recompute_is_misattributed(monkeypatch):
    """The check above is what makes the result right: without it (rows appended in
    arrival order) the same run passes take()'s completeness check with wrong rows."""
    monkeypatch.setattr(LayerCapture, "_check_positions", lambda self, so: None)
    runner, cap = v1()
    p = prompts_of(req_0_0=10, req_0_1=4)
    step(runner, [("req_0_0", 6, 0, True), ("req_0_1", 2, 0, True)], p)
    step(runner, [("req_0_1", 2, 2, False)], p)
    step(runner, [("req_0_0", 10, 0, False)], p)
    out = cap.take()  # no error ...
    with pytest.raises(AssertionError):  # ... but positions 6..9 hold rows of 0..3
        assert_whole(cap, runner, p, out)


def test_gap_in_positions_refuses():
    runner, cap = v1()
    p = prompts_of(req_0_0=10)
    with pytest.raises(CompatError, match="from 4, but the capture holds no rows of its 10"):
        step(runner, [("req_0_0", 6, 4, True)], p)  # e.g. a prefix-cache hit
    runner, cap = v1()
    step(runner, [("req_0_0", 4, 0, True)], p)
    with pytest.raises(CompatError, match="from 6, but the capture holds rows 0..3"):
        step(runner, [("req_0_0", 4, 6, False)], p)


def test_partial_rewind_refuses():
    runner, cap = v1()
    p = prompts_of(req_0_0=10)
    step(runner, [("req_0_0", 6, 0, True)], p)
    with pytest.raises(CompatError, match="from 2, but the capture holds rows 0..5"):
        step(runner, [("req_0_0", 4, 2, False)], p)


def test_unknown_positions_refuse_only_where_rows_are_needed():
    runner, cap = v1()
    p = prompts_of(req_0_0=4)
    with pytest.raises(CompatError, match="no num_computed_tokens"):
        step(runner, [("req_0_0", 4, 0, True)], p, positions=False)
    runner, cap = v1()
    step(runner, [("req_0_0", 4, 0, True)], p)
    step(runner, [("req_0_0", 1, 4, False)], p, positions=False)  # decode: nothing to place
    assert_whole(cap, runner, p)


def test_decode_after_full_capture_is_not_a_gap():
    runner, cap = v1()
    p = prompts_of(req_0_0=4)
    step(runner, [("req_0_0", 4, 0, True)], p)
    step(runner, [("req_0_0", 1, 4, False)], p)
    step(runner, [("req_0_0", 1, 5, False)], p)
    assert cap.restarts == 0
    assert_whole(cap, runner, p)


def test_scheduled_positions_shapes():
    p = prompts_of(req_0_0=4, req_0_1=4)
    so = scheduler_output([("req_0_0", 4, 0, True), ("req_0_1", 2, 2, False)], p)
    assert scheduled_positions(so) == {"req_0_0": 0, "req_0_1": 2}
    so = scheduler_output([("req_0_1", 2, 2, False)], p, cached_shape="objects")
    assert scheduled_positions(so) == {"req_0_1": 2}
    so.scheduled_cached_reqs = None
    assert scheduled_positions(so) == {}
    so = scheduler_output([("req_0_1", 2, 2, False)], p)
    so.scheduled_cached_reqs.num_computed_tokens = [2, 3]
    with pytest.raises(CompatError, match="1 cached requests but 2"):
        scheduled_positions(so)


@pytest.mark.parametrize("spelling", ["1.0 / self.routed_scaling_factor",
                                      "1. / self.routed_scaling_factor"])
def test_fp16_guard_is_read_in_both_of_vllms_spellings(spelling, tmp_path):
    """vLLM's DeepSeek layers scale fp16 outputs by ``1.0 / ...`` (0.12+) or ``1. / ...``
    (0.11): both mean the capture must multiply back by ``routed_scaling_factor``."""
    import importlib.util

    from speculators_compat._capture import fp16_unscale_factor

    source = tmp_path / "fp16_layer.py"
    source.write_text(
        "import torch\n\n\n"
        "class Layer(torch.nn.Module):\n"
        "    def __init__(self):\n"
        "        super().__init__()\n"
        "        self.routed_scaling_factor = 2.5\n"
        "        self.w = torch.nn.Parameter(torch.ones(2, dtype=torch.float16))\n\n"
        "    def forward(self, hidden_states):\n"
        f"        hidden_states *= {spelling}\n"
        "        return hidden_states\n")
    spec = importlib.util.spec_from_file_location("fp16_layer", source)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert fp16_unscale_factor(module.Layer()) == 2.5


# --------------------------------------------------------------------------- layer returns

def _layer_of(module_name: str):
    cls = type("DecoderLayer", (), {"__module__": module_name})
    return cls()


def test_layer_output_pairs_and_triples():
    """(h, r) -> h + r; (h, None) -> h; Kimi-Linear / Kimi-K3's (h, None, r) -> h + r (its
    first value alone is the MLP's output: cosine 0.65 at layer 0 against transformers on
    an H100, 2026-12-06); PLaMo 3's (h, r, aux) -> h + r; any other triple, or Kimi-K3's
    attention-residual blocks (prefix_sum set), is refused rather than summed."""
    import torch

    from speculators_compat._capture import layer_output
    from speculators_compat._errors import CompatError

    h, r, x = torch.ones(2, 3), torch.full((2, 3), 2.0), torch.full((2, 3), 5.0)
    assert torch.equal(layer_output((h, r), 0), h + r)
    assert torch.equal(layer_output((h, None), 0), h)
    kimi = _layer_of("vllm.models.kimi_k3.nvidia.model")
    assert torch.equal(layer_output((h, None, r), 0, kimi), h + r)
    assert not torch.equal(layer_output((h, None, r), 0, kimi), h)  # the old reading
    with pytest.raises(CompatError, match="attention-residual"):
        layer_output((h, x, r), 0, kimi)
    plamo = _layer_of("vllm.model_executor.models.plamo3")
    assert torch.equal(layer_output((h, r, x), 0, plamo), h + r)
    with pytest.raises(CompatError, match="three values"):
        layer_output((h, x, r), 3, _layer_of("vllm.models.qwen4_exp.nvidia.model"))
    with pytest.raises(CompatError, match="of 4"):
        layer_output((h, r, x, x), 0, kimi)


def test_tensor_parallel_partial_layer_outputs_are_refused():
    """Under tensor parallelism vLLM 0.34's Qwen3.5 (``mlp_output_is_partial``) and CUDA
    DSA layers return an un-reduced partial: the capture refuses at setup, before any data
    (rank 0 would save the partial as the layer's output); at TP 1, or for other layers, it
    captures as before."""
    from speculators_compat._capture import LayerCapture
    from speculators_compat._errors import CompatError

    runner = FakeV1Runner()
    layers = runner.model.model.layers
    LayerCapture(runner, LAYERS, enabled=True, tp_size=2).remove()  # ordinary layers
    layers[2].mlp_output_is_partial = True
    LayerCapture(runner, LAYERS, enabled=True, tp_size=1).remove()  # TP 1: complete
    with pytest.raises(CompatError, match="tensor_parallel_size=1"):
        LayerCapture(runner, LAYERS, enabled=True, tp_size=2)
    layers[2].mlp_output_is_partial = False
    dsa = type("DeepseekV32DecoderLayer", (type(layers[0]),),
               {"__module__": "vllm.models.deepseek_v32.nvidia.model"})
    layers[LAYERS[0]].__class__ = dsa
    with pytest.raises(CompatError, match="DeepseekV32DecoderLayer"):
        LayerCapture(runner, LAYERS, enabled=True, tp_size=4)
