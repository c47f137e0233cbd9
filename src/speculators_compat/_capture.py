"""Decoder-layer capture inside a vLLM worker, by forward hooks (no copied forwards).

Why hooks: speculators' worker extension replaces the base model's ``forward`` with a
generic loop. That loop breaks when vLLM renames things (``get_input_embeddings`` →
``embed_input_ids`` in 0.11.1) and is silently wrong for models whose forward does
more than call the layers (DeepSeek-V2/V3 pass ``llama_4_scaling`` to every layer;
newer releases add sequence-parallel MoE gathers). A forward hook on decoder layer k
reads what the model's own forward produced: ``hidden_states + residual`` of the
``(hidden_states, residual)`` pair the layer returns, i.e. the output of layer k before
the final norm (transformers' ``hidden_states[k+1]``), which is speculators' meaning.

Row attribution: a layer's output rows are in the model runner's batch order for that
step. The capture reads that order from the runner itself (V1:
``input_batch.req_ids``) together with the step's ``num_scheduled_tokens``, keeps only
prompt (prefill) rows of each request, and assembles every request's rows across
chunked-prefill steps. Model Runner V2 (``vllm/v1/worker/gpu/``, no ``input_batch``)
builds a fresh batch each step in ``prepare_inputs`` (requests sorted by query length,
not in the scheduler's order); there the capture records the batch that
``prepare_inputs`` returns for the step (``req_ids`` + ``num_scheduled_tokens``, the
order the model's rows are in) and attributes rows with it. Results are then produced in
the installed speculators' own contract by :mod:`speculators_compat.worker_extension`.

Positions: a step's rows of a request are the prompt positions starting at the request's
``num_computed_tokens`` in the scheduler output, not simply the next ones after those
already taken. After a preemption vLLM V1 resets ``num_computed_tokens`` to 0 and runs
the prompt again: the capture then restarts that request's rows (the earlier ones are
dropped), and it refuses any other gap or overlap rather than mislabel rows.
"""

from __future__ import annotations

import importlib.util
import re
from collections.abc import Iterable
from typing import Any

from ._errors import CompatError
from ._speculators import request_index


def find_base_model(model: Any) -> Any:
    """The module holding the decoder ``layers`` (same search as speculators 0.4)."""
    if hasattr(model, "get_language_model"):
        lm = model.get_language_model()
        base = getattr(lm, "model", lm)
    else:
        base = getattr(model, "model", None)
    if base is None or not hasattr(base, "layers"):
        raise CompatError(
            f"speculators-compat: cannot find the decoder layers of {type(model).__name__} "
            "(expected `model.model.layers` or `get_language_model().model.layers`). "
            "Hidden-state capture supports decoder-only models whose layers return "
            "(hidden_states, residual); please report the architecture.")
    return base


#: Decoder layers that return three values, by the vLLM module that defines them: which
#: value is the residual. A triple is read only where its meaning is known; elsewhere the
#: capture refuses (summing the first two would be silently wrong: vLLM 0.34's Kimi-Linear /
#: Kimi-K3 layers return ``(hidden_states, prefix_sum, residual)``, and reading the first
#: value alone gave cosine 0.65 at layer 0 against transformers).
THREE_VALUE_LAYERS: dict[str, str] = {
    # (hidden_states, prefix_sum, residual); prefix_sum only with attention-residual
    # blocks (config.attn_res_block_size), whose layer output is not a plain sum
    "kimi_k3": "prefix_sum_residual",
    # (hidden_states, residual, aux_hidden_states)
    "plamo3": "residual_aux",
}


def _three_value_kind(layer: Any) -> str | None:
    module = type(layer).__module__ if layer is not None else ""
    parts = module.split(".")
    return next((kind for name, kind in THREE_VALUE_LAYERS.items() if name in parts), None)


def layer_output(output: Any, layer_idx: int, layer: Any = None) -> Any:
    """``hidden_states + residual`` from a decoder layer's return value (``layer``: the
    decoder layer module, which says what a three-value return holds)."""
    if isinstance(output, (tuple, list)):
        if len(output) == 3:
            kind = _three_value_kind(layer)
            if kind == "residual_aux" and output[1] is not None:
                return output[0] + output[1]
            if kind == "prefix_sum_residual":
                if output[1] is not None:
                    raise CompatError(
                        f"speculators-compat: decoder layer {layer_idx} "
                        f"({type(layer).__name__}) uses attention-residual blocks "
                        "(attn_res_block_size): its output is not hidden_states + residual, "
                        "and the capture cannot read it. Extract this model's hidden states "
                        "with vLLM's own extract_hidden_states (speculators >= 0.5).")
                if output[2] is not None:
                    return output[0] + output[2]
                return output[0].clone()
            raise CompatError(
                f"speculators-compat: decoder layer {layer_idx} ({type(layer).__name__}) "
                "returns three values whose meaning the capture does not know: its hidden "
                "states cannot be read. This architecture is not supported; please report it.")
        if len(output) == 2:
            if output[1] is not None:
                return output[0] + output[1]
            return output[0].clone()  # later in-place ops (fused add+norm) must not alter it
        if len(output) == 1 and hasattr(output[0], "shape"):
            return output[0].clone()
    elif hasattr(output, "shape"):
        return output.clone()
    raise CompatError(
        f"speculators-compat: decoder layer {layer_idx} returned {type(output).__name__}"
        f"{f' of {len(output)}' if isinstance(output, (tuple, list)) else ''}, "
        "not (hidden_states, residual): its hidden states cannot be read by the capture. "
        "This architecture is not supported; please report it.")


def tp_partial_outputs(layers: Any, ids: Iterable[int]) -> list[int]:
    """The hooked layers whose returned hidden states are, under tensor parallelism, an
    un-reduced partial sum: vLLM 0.34's Qwen3.5 layers with the fused all-reduce norm
    (``mlp_output_is_partial``) and its CUDA DeepSeek-V3.2 / GLM-5 (DSA) layers
    (``vllm/models/deepseek_v32``: MLP and MoE with ``reduce_results=False``). Read from
    vLLM 0.34's sources; not run here (one GPU)."""
    found = []
    for i in ids:
        layer = layers[i]
        module = type(layer).__module__.split(".")
        if getattr(layer, "mlp_output_is_partial", False) is True or (
                "models" in module and "deepseek_v32" in module):
            found.append(i)
    return found


def _v1_runner_hint(lead: str = " Start") -> str:
    """Advice to fall back to the V1 model runner, where this vLLM still has one (it was
    removed in 0.34: ``VLLM_USE_V2_MODEL_RUNNER=0`` is then refused by vLLM)."""
    if importlib.util.find_spec("vllm.v1.worker.gpu_model_runner") is None:
        return ""
    return f"{lead} with VLLM_USE_V2_MODEL_RUNNER=0."


#: vLLM's DeepSeek fp16 guard, as its decoder layers spell it.
_FP16_GUARD = re.compile(r"\b1\.0* / self\.routed_scaling_factor\b")


def fp16_unscale_factor(layer: Any) -> float:
    """Factor that undoes a layer's fp16 overflow guard, 1.0 if it has none.

    DeepSeek-V2/V3 decoder layers (vLLM) running in float16 carry ``hidden_states`` and
    ``residual`` scaled by ``1 / routed_scaling_factor`` (RMSNorm does not see the scale,
    so the model's own output is unaffected); the captured sum must be multiplied back to
    be the layer's true output. Detected by probing the layer's forward source; when the
    source cannot be read, or scales by ``routed_scaling_factor`` in a form not known
    here, it raises rather than guess (1.0 would silently shrink every captured value).
    """
    import inspect

    factor = getattr(layer, "routed_scaling_factor", None)
    if not factor or factor == 1.0:
        return 1.0
    if type(getattr(layer, "self_attn", None)).__name__ == "DeepseekAttention":
        return 1.0  # vLLM skips the guard for this attention class
    name = f"{type(layer).__qualname__}.forward"
    params = getattr(layer, "parameters", None)
    fp16 = params is None or any(str(p.dtype) == "torch.float16" for p in params())
    try:
        src = inspect.getsource(type(layer).forward)
    except (OSError, TypeError) as exc:
        if not fp16:
            return 1.0  # the factor only ever applies to float16 outputs
        raise CompatError(
            f"speculators-compat: cannot read the source of {name} ({exc}), so the capture "
            f"cannot tell whether its float16 outputs are scaled by 1/routed_scaling_factor "
            f"({factor}); install vLLM with its .py sources, or run in bfloat16.") from exc
    if _FP16_GUARD.search(src):  # `1.0 / self.routed_scaling_factor` (0.12+), `1. /` (0.11)
        return float(factor)
    if "routed_scaling_factor" in src and fp16:
        raise CompatError(
            f"speculators-compat: {name} uses routed_scaling_factor ({factor}) in a form the "
            "capture does not know, so it cannot undo it for float16 outputs; run in "
            "bfloat16, or report the vLLM version.")
    return 1.0  # the forward does not scale its outputs


def request_order_key(req_id: str, first_seen: int) -> tuple:
    """Input order of speculators' request ids ``req_<call>_<index>`` (numeric, not
    string order); ids of another form keep the order the worker first saw them."""
    index = request_index(req_id)
    if index is not None:
        return (0, *index, first_seen)
    return (1, 0, 0, first_seen)


def scheduled_positions(so: Any) -> dict[str, int]:
    """Prompt position of each scheduled request's first token in this step.

    Read from the scheduler output's ``num_computed_tokens``: ``scheduled_new_reqs[i]``
    carries it as an attribute; ``scheduled_cached_reqs`` is one object with parallel
    lists ``req_ids`` / ``num_computed_tokens`` (vLLM 0.10+), or a list of per-request
    objects (earlier V1 releases). Probed, not keyed on version strings; a request whose
    position cannot be read is missing from the result.
    """
    pos: dict[str, int] = {}
    for new in getattr(so, "scheduled_new_reqs", None) or ():
        n = getattr(new, "num_computed_tokens", None)
        if n is not None:
            pos[new.req_id] = int(n)
    cached = getattr(so, "scheduled_cached_reqs", None)
    if cached is None:
        return pos
    if isinstance(cached, (list, tuple)):
        for c in cached:
            n = getattr(c, "num_computed_tokens", None)
            if n is not None:
                pos[c.req_id] = int(n)
        return pos
    ids = list(getattr(cached, "req_ids", None) or ())
    nums = getattr(cached, "num_computed_tokens", None)
    if nums is not None:
        nums = list(nums)
        if len(nums) != len(ids):
            raise CompatError(
                "speculators-compat: the scheduler output lists "
                f"{len(ids)} cached requests but {len(nums)} computed-token counts; "
                "refusing to attribute rows.")
        pos.update(zip(ids, (int(n) for n in nums)))
    return pos


class LayerCapture:
    """Hooks on decoder layers plus per-request row bookkeeping for one worker."""

    def __init__(self, runner: Any, layer_ids: Iterable[int], enabled: bool,
                 tp_size: int = 1) -> None:
        self.runner = runner
        self.enabled = enabled
        base = find_base_model(runner.model)
        layers = base.layers
        n = len(layers)
        ids = sorted({int(i) for i in layer_ids})
        bad = [i for i in ids if i < 0 or i >= n]
        if bad:
            raise CompatError(f"speculators-compat: layer ids {bad} out of range: the model "
                              f"has {n} decoder layers (valid ids 0..{n - 1}).")
        if not ids:
            raise CompatError("speculators-compat: no layer ids to capture.")
        start = getattr(base, "start_layer", 0)
        end = getattr(base, "end_layer", n)
        if (start, end) != (0, n):
            raise CompatError(
                "speculators-compat: pipeline parallelism is not supported by the capture "
                f"(this rank holds layers {start}..{end - 1} of {n}); use "
                "tensor_parallel_size instead.")
        self._v2 = not hasattr(runner, "input_batch")
        if self._v2:
            if not (callable(getattr(runner, "prepare_inputs", None))
                    and hasattr(runner, "req_states")):
                raise CompatError(
                    f"speculators-compat: the model runner {type(runner).__name__} has no "
                    "`input_batch` (vLLM Model Runner V2), whose row order the capture "
                    f"cannot read yet.{_v1_runner_hint()}")
            if getattr(runner, "pcp_manager", None) is not None:
                raise CompatError(
                    "speculators-compat: prefill context parallelism splits each step's "
                    "rows across ranks; the capture does not support it under Model Runner "
                    f"V2. Start without it.{_v1_runner_hint(' Or start')}")
        partial = tp_partial_outputs(layers, ids) if tp_size > 1 else []
        if partial:
            raise CompatError(
                f"speculators-compat: with tensor_parallel_size={tp_size}, decoder layers "
                f"{partial} of {type(layers[partial[0]]).__name__} return an un-reduced "
                "tensor-parallel partial (vLLM defers the all-reduce into the next layer's "
                "norm), which the capture on rank 0 would save as the layer's output. Run "
                "the generator with tensor_parallel_size=1 for this model.")
        self._stale: set[str] = set()
        self.layer_ids = ids
        self._slot = {layer: i for i, layer in enumerate(ids)}
        self._unscale = {i: fp16_unscale_factor(layers[i]) for i in ids}
        self._handles = [layers[i].register_forward_hook(self._hook_for(i)) for i in ids]
        self._step: Any = None
        #: Where rows also go as they are produced (the transport's ``CallSink``), or
        #: ``None``.
        self.sink: Any = None
        self._step_layout: list[tuple[str, int, int]] | None = None
        self.armed = False
        self.reset()
        self._original_execute = runner.__dict__.get("execute_model")
        cls_execute = type(runner).execute_model
        capture = self

        def execute_model(scheduler_output, *args, **kwargs):
            if capture._stale and not kwargs.get("dummy_run"):
                capture._release_stale(scheduler_output)
            capture._begin_step(scheduler_output)
            try:
                if capture._original_execute is not None:
                    return capture._original_execute(scheduler_output, *args, **kwargs)
                return cls_execute(runner, scheduler_output, *args, **kwargs)
            finally:
                capture._step = None
                capture._step_layout = None
                capture._v2_batch = None

        runner.execute_model = execute_model
        self._v2_batch: Any = None
        self._original_prepare = None
        if self._v2:
            self._original_prepare = runner.__dict__.get("prepare_inputs")
            prepare = runner.prepare_inputs  # bound, or the instance attribute above

            def prepare_inputs(*args, **kwargs):
                batch = prepare(*args, **kwargs)
                capture._v2_batch = batch  # the batch whose row order this step runs
                return batch

            runner.prepare_inputs = prepare_inputs

    # -- lifecycle -----------------------------------------------------------------
    def reset(self) -> None:
        """Forget everything captured; start recording (speculators' ``_reset_capture``)."""
        self.prompt_len: dict[str, int] = {}
        self.first_seen: dict[str, int] = {}
        self.rows: dict[str, list[list[Any]]] = {}
        self.count: dict[str, int] = {}
        #: Requests whose rows were restarted because vLLM recomputed their prompt
        #: (preemption), counted since this reset (read by tests and the soak run).
        self.restarts = 0
        self.armed = True
        if self._v2:
            held = getattr(getattr(self.runner, "req_states", None), "req_id_to_index", None)
        else:
            held = getattr(self.runner, "requests", None)
        self._stale = set(held or ())

    def remove(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles = []
        if self._original_execute is not None:
            self.runner.execute_model = self._original_execute
        else:
            self.runner.__dict__.pop("execute_model", None)
        if self._v2:
            if self._original_prepare is not None:
                self.runner.prepare_inputs = self._original_prepare
            else:
                self.runner.__dict__.pop("prepare_inputs", None)

    # -- per step --------------------------------------------------------------------
    def _release_stale(self, so: Any) -> None:
        """Release the runner's per-request state of earlier ``generate()`` calls.

        Why: a model runner keeps state for every request until a step's
        ``finished_req_ids`` names it (Model Runner V2: a slot in ``req_states``,
        ``max_num_seqs`` of them; V1: an entry in ``requests``). speculators' generator
        (with prefill-only scheduling) finishes requests in a ``schedule()`` output that
        it never executes, so the runner never hears of it: V2 then fails a later batch
        with ``AssertionError: No free indices``, and V1's ``requests`` grows with every
        sequence of a long run. speculators resets the capture at the start of every
        ``generate()``, when every request of earlier calls is finished; those the runner
        still held then are passed to the runner's own finished-request handling with the
        next step.
        """
        stale = self._stale - set(so.num_scheduled_tokens)
        self._stale = set()
        if stale:
            so.finished_req_ids = set(getattr(so, "finished_req_ids", None) or ()) | stale

    def _begin_step(self, so: Any) -> None:
        self._step = so
        self._step_layout = None
        self._v2_batch = None
        if not (self.armed and self.enabled):
            return
        for new in getattr(so, "scheduled_new_reqs", None) or ():
            prompt = getattr(new, "prompt_token_ids", None)
            if prompt is None:
                raise CompatError(
                    f"speculators-compat: request {new.req_id} has no prompt_token_ids "
                    "(prompt embeddings are not supported by the capture).")
            self.prompt_len[new.req_id] = len(prompt)
            self.first_seen.setdefault(new.req_id, len(self.first_seen))
        self._check_positions(so)

    def _check_positions(self, so: Any) -> None:
        """Line up each capture request's rows with where the step's chunk starts.

        Rows are taken as prompt positions ``count[rid]..``; the scheduler says the chunk
        starts at ``num_computed_tokens``. Equal: the normal case. 0 while rows were
        already taken: the prompt is being recomputed (a V1 preemption resets the request
        to 0), so its rows restart. Anything else (a gap, e.g. positions served from a
        prefix cache, or a partial rewind) cannot be attributed: refuse.
        """
        positions = scheduled_positions(so)
        for rid in so.num_scheduled_tokens:
            plen = self.prompt_len.get(rid)
            if plen is None:
                continue
            done = self.count.get(rid, 0)
            start = positions.get(rid)
            if start is None:
                if done >= plen:
                    continue  # prompt fully captured; later rows are not kept anyway
                raise CompatError(
                    f"speculators-compat: the scheduler output gives no num_computed_tokens "
                    f"for request {rid}; the capture cannot tell which prompt positions this "
                    "step computes, refusing to attribute rows. Please report this vLLM "
                    "release.")
            if start == done or (start >= plen and done >= plen):
                continue
            if start == 0:
                self._restart(rid)
                continue
            held = f"rows 0..{done - 1}" if done else "no rows"
            raise CompatError(
                f"speculators-compat: request {rid}: this step computes prompt positions "
                f"from {start}, but the capture holds {held} of its {plen}; "
                "positions it did not see (a prefix-cache hit?) or a partial recompute "
                "cannot be attributed. Start the generator with prefix caching off.")

    def _restart(self, rid: str) -> None:
        """Drop a request's rows taken so far: its prompt is computed again from 0."""
        self.count.pop(rid, None)
        self.rows.pop(rid, None)
        self.restarts += 1

    def _layout(self, num_rows: int) -> list[tuple[str, int, int]]:
        """(request id, row offset, rows to keep) for this step, in the runner's order."""
        if self._step_layout is not None:
            return self._step_layout
        so = self._step
        scheduled: dict[str, int] = dict(so.num_scheduled_tokens)
        if self._v2:
            order = self._v2_order(scheduled)
            if order is None:  # a dummy run (warm-up/profiling): no rows of ours
                self._step_layout = []
                return self._step_layout
        else:
            batch = self.runner.input_batch
            order = [r for r in list(batch.req_ids)[: batch.num_reqs] if r is not None]
        if sorted(order) != sorted(scheduled):
            raise CompatError(
                "speculators-compat: the model runner's batch does not match the scheduled "
                f"requests ({len(order)} vs {len(scheduled)}); refusing to attribute rows.")
        total = sum(scheduled.values())
        if num_rows < total:
            raise CompatError(f"speculators-compat: layer produced {num_rows} rows for "
                              f"{total} scheduled tokens; refusing to attribute rows.")
        layout = []
        offset = 0
        for rid in order:
            n = scheduled[rid]
            if rid in self.prompt_len:
                done = self.count.get(rid, 0)
                keep = max(0, min(n, self.prompt_len[rid] - done))
                if keep:
                    layout.append((rid, offset, keep))
                    self.count[rid] = done + keep
            offset += n
        self._step_layout = layout
        return layout

    def _v2_order(self, scheduled: dict[str, int]) -> list[str] | None:
        """Model Runner V2: request order of this step's batch (from ``prepare_inputs``),
        checked against the scheduler's per-request token counts; ``None`` for a dummy
        run (no batch prepared and none of the step's requests is a capture request)."""
        batch = self._v2_batch
        if batch is None:
            if any(r in self.prompt_len for r in scheduled):
                raise CompatError(
                    "speculators-compat: Model Runner V2 ran a step without preparing its "
                    "batch through prepare_inputs; the row order is unknown, refusing to "
                    f"attribute rows.{_v1_runner_hint()}")
            return None
        n = int(batch.num_reqs)
        order = list(batch.req_ids)[:n]
        counts = [int(c) for c in list(batch.num_scheduled_tokens)[:n]]
        if len(order) != n or dict(zip(order, counts)) != scheduled:
            raise CompatError(
                "speculators-compat: Model Runner V2's batch does not match the scheduled "
                f"requests ({len(order)} vs {len(scheduled)}, or different token counts); "
                "refusing to attribute rows.")
        return order

    def _hook_for(self, layer_idx: int):
        def hook(module, inputs, output):
            if self._step is None or not (self.armed and self.enabled):
                return
            hidden = layer_output(output, layer_idx, module)
            factor = self._unscale[layer_idx]
            if factor != 1.0 and str(hidden.dtype) == "torch.float16":
                hidden = hidden * factor
            slot = self._slot[layer_idx]
            streamed = []
            for rid, offset, keep in self._layout(hidden.shape[0]):
                per_layer = self.rows.setdefault(rid, [[] for _ in self.layer_ids])
                rows = hidden[offset: offset + keep]
                if self.sink is not None:  # prompt position of these rows
                    streamed.append((rid, sum(c.shape[0] for c in per_layer[slot]), rows))
                per_layer[slot].append(rows)
            if streamed:
                self.sink.write(slot, streamed)
            return

        return hook

    # -- results ---------------------------------------------------------------------
    def ordered_requests(self) -> list[str]:
        first = self.first_seen
        return sorted(self.prompt_len, key=lambda r: request_order_key(r, first.get(r, 0)))

    def take(self) -> dict[str, list[Any]]:
        """Every request's full prompt rows per layer (in input order); then forget them.

        Raises if any request's prefill was captured only partly: never a silent
        truncation.
        """
        import torch

        out: dict[str, list[Any]] = {}
        incomplete = [(r, self.count.get(r, 0), self.prompt_len.get(r))
                      for r in self.ordered_requests()
                      if self.count.get(r, 0) != self.prompt_len.get(r)]
        if incomplete:
            details = ", ".join(f"{r}: {c}/{p} tokens" for r, c, p in incomplete[:5])
            raise CompatError(
                "speculators-compat: prefill of some requests was captured only partly "
                f"({details}); refusing to return truncated hidden states.")
        for rid in self.ordered_requests():
            out[rid] = [torch.cat(chunks, dim=0) for chunks in self.rows[rid]]
            if not out[rid] or out[rid][0].shape[0] != self.prompt_len[rid]:
                raise CompatError(f"speculators-compat: request {rid}: captured rows do not "
                                  "match its prompt length; refusing to return them.")
        self.rows.clear()
        self.count.clear()
        self.prompt_len.clear()
        self.first_seen.clear()
        return out
