"""Run speculators' own ``VllmHiddenStatesGenerator`` (unchanged) and check its output.

Shared by ``speculators-compat demo`` and the end-to-end tests: build/reuse a tiny
checkpoint, optionally activate the shim, construct the generator, extract hidden
states for batches of token sequences, and compare every returned layer with a
transformers forward of the same checkpoint. Each step is named, so a failure says
precisely which step failed and how.
"""

from __future__ import annotations

import os
import random
import time
import traceback
from collections.abc import Sequence
from typing import Any

DEFAULT_LAYERS = {"llama": [0, 2, 5], "deepseek_v3": [0, 1, 3], "qwen3": [0, 2, 5],
                  "qwen3_moe": [0, 1, 3]}


def make_sequences(n: int, *, seed: int = 0, min_len: int = 4, max_len: int = 48,
                   vocab: int = 512) -> list[list[int]]:
    """``n`` token sequences of mixed lengths (ids avoid the special tokens 0..4)."""
    rng = random.Random(seed)
    return [[rng.randrange(5, vocab) for _ in range(rng.randrange(min_len, max_len + 1))]
            for _ in range(n)]


def runner_request_count(worker) -> int:
    """Requests a worker's model runner still holds (V1 ``requests``; V2 ``req_states``).
    Used with ``collective_rpc`` to check nothing accumulates across ``generate()`` calls."""
    runner = worker.model_runner
    if hasattr(runner, "requests"):
        return len(runner.requests)
    return len(runner.req_states.req_id_to_index)


def capture_restarts(worker) -> int | None:
    """Prompts the worker's capture restarted since the last ``generate()`` began
    (recomputed after a preemption); ``None`` where the shim's capture is not running."""
    cap = getattr(worker, "_compat_capture", None)
    return None if cap is None else cap.restarts


class StepFailed(Exception):
    def __init__(self, step: str, exc: BaseException) -> None:
        super().__init__(f"step '{step}' failed: {type(exc).__name__}: {exc}")
        self.step = step
        self.exc = exc


class _Steps:
    def __init__(self, log) -> None:
        self.log = log
        self.done: list[dict[str, Any]] = []

    def __call__(self, name: str, fn, *args, **kwargs):
        self.log(f"[{len(self.done) + 1}] {name} ...")
        t = time.perf_counter()
        try:
            out = fn(*args, **kwargs)
        except BaseException as exc:
            self.done.append({"step": name, "ok": False, "error": f"{type(exc).__name__}: {exc}",
                              "traceback": traceback.format_exc()})
            raise StepFailed(name, exc) from exc
        self.done.append({"step": name, "ok": True, "seconds": time.perf_counter() - t})
        return out


def run_check(model_path: str, *, layer_ids: Sequence[int] | None, batches: Sequence[Sequence[
        Sequence[int]]], activate: bool = True, max_model_len: int = 512,
        generator_kwargs: dict[str, Any] | None = None, log=print,
        extra_checks=None, setup=None) -> dict[str, Any]:
    """Extract hidden states for each batch and compare with transformers.

    Returns a JSON-able dict: ``ok``, ``steps`` (each with ok/error), ``report`` (the
    driver's activation report), ``worker_reports``, ``batches`` (per batch: sizes,
    order check, comparison summary, tokens/s). ``setup(gen)`` runs once the generator
    is built, before the first batch (tests use it to shrink the KV cache);
    ``extra_checks(gen, outputs)`` after the last batch; what they return is reported
    as ``setup`` / ``extra``.
    """
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    steps = _Steps(log)
    result: dict[str, Any] = {"ok": False, "steps": steps.done, "batches": []}
    try:
        if activate:
            import speculators_compat

            rep = steps("activate speculators-compat", speculators_compat.activate)
            result["report"] = rep.as_dict()
            log(str(rep))
        gen_mod = steps("import speculators' generator", __import__,
                        "speculators.data_generation.vllm_hidden_states_generator",
                        fromlist=["VllmHiddenStatesGenerator"])
        kwargs = dict(generator_kwargs or {})
        gen = steps("start VllmHiddenStatesGenerator (vLLM engine, workers, KV cache)",
                    gen_mod.VllmHiddenStatesGenerator, model_path,
                    layer_ids=list(layer_ids) if layer_ids is not None else None,
                    max_model_len=max_model_len, **kwargs)
        try:
            if activate:
                from .._plugin import worker_report

                # A function, not the extension's RPC: speculators' own extension (where
                # hook_capture is not needed, e.g. its pinned vLLM) has no report method.
                result["worker_reports"] = steps(
                    "ask vLLM workers for their activation report",
                    gen.executor.collective_rpc, worker_report)
            if setup is not None:
                result["setup"] = steps("test setup", setup, gen)
            outputs = []
            for b, batch in enumerate(batches):
                t = time.perf_counter()
                res = steps(f"generate() batch {b} ({len(batch)} sequences)", gen.generate,
                            [list(s) for s in batch])
                dt = time.perf_counter() - t
                outputs.append(res)
                result["batches"].append({"size": len(batch), "returned": len(res),
                                          "seconds": dt,
                                          "tokens": sum(len(s) for s in batch)})
            if extra_checks is not None:
                result["extra"] = steps("extra checks", extra_checks, gen, outputs)
            layers = sorted(set(gen.layer_ids))
            result["layer_ids"] = layers
        finally:
            del gen
        from .reference import compare, reference_hidden_states

        for b, (batch, res) in enumerate(zip(batches, outputs)):
            info = result["batches"][b]
            info["input_order"] = len(res) == len(batch) and all(
                r["input_ids"].tolist() == list(s)[: max_model_len - 1]
                for r, s in zip(res, batch))
            info["dtypes"] = sorted({str(h.dtype) for r in res for h in r["hidden_states"]})
            ref = steps(f"transformers reference for batch {b}", reference_hidden_states,
                        model_path, [list(s)[: max_model_len - 1] for s in batch], layers)
            cmp = steps(f"compare batch {b}", compare, [r["hidden_states"] for r in res], ref)
            info["compare"] = {k: v for k, v in cmp.items() if k != "per_sequence"}
            info["ok"] = bool(cmp["ok"] and info["input_order"]
                              and info["returned"] == info["size"])
            info["tokens_per_s"] = info["tokens"] / info["seconds"] if info["seconds"] else None
        result["ok"] = all(b.get("ok") for b in result["batches"]) and bool(result["batches"])
    except StepFailed as exc:
        result["failed_step"] = exc.step
        result["error"] = f"{type(exc.exc).__name__}: {exc.exc}"
    return result
