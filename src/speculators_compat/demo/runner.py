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

from .._speculators import GENERATOR_MODULE

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


def worker_classes(worker) -> list[str]:
    """``module.qualname`` of every class in the worker's MRO: asked of the workers (with
    ``collective_rpc``) to see which hidden-states extension vLLM really mixed in. Some
    releases hand the function their ``WorkerWrapperBase``, whose ``worker`` is the
    worker itself."""
    inner = getattr(worker, "worker", None) or worker
    return [f"{c.__module__}.{c.__qualname__}" for c in type(inner).__mro__]


def capture_restarts(worker) -> int | None:
    """Prompts the worker's capture restarted since the last ``generate()`` began
    (recomputed after a preemption); ``None`` where the shim's capture is not running."""
    cap = getattr(worker, "_compat_capture", None)
    return None if cap is None else cap.restarts


def known_wrong_compares(model_path: str, sequences, actual, layers,
                         tolerances: dict[str, float] | None = None) -> dict[str, Any]:
    """The reference comparison of deliberately wrong results (``compare``'s summary
    per kind of mistake, and of the correct result as ``correct``).

    Each wrong one must fail (``ok`` False): otherwise the tolerances are too loose to
    see that kind of mistake. The wrong results are the kinds of bugs a
    capture could have: the neighbouring layer's output (off-by-one layer id); two rows
    of one sequence swapped, and every row one position late (misattributed rows); the
    layer's own update without the residual stream it adds to (``hidden_states``
    without ``+ residual``), for layers above 0.
    """
    import transformers

    from .reference import compare as _compare
    from .reference import reference_hidden_states

    def compare(a, e):
        return _compare(a, e, **(tolerances or {}))

    # The language model's count: a multimodal wrapper's config keeps it in text_config.
    n_layers = transformers.AutoConfig.from_pretrained(model_path).get_text_config(
        ).num_hidden_layers
    wanted = sorted(set(layers) | {k + 1 if k + 1 < n_layers else k - 1 for k in layers}
                    | {k - 1 for k in layers if k > 0})
    ref_all = reference_hidden_states(model_path, sequences, wanted)
    pos = {k: i for i, k in enumerate(wanted)}
    ref = [[per[pos[k]] for k in layers] for per in ref_all]
    out: dict[str, Any] = {"correct": compare(actual, ref)}
    neighbour = [k + 1 if k + 1 < n_layers else k - 1 for k in layers]
    out["off_by_one_layer"] = compare(
        actual, [[per[pos[k]] for k in neighbour] for per in ref_all])
    longest = max(range(len(actual)), key=lambda i: actual[i][0].shape[0])
    swapped = [list(seq) for seq in actual]
    swapped[longest] = [t[[1, 0, *range(2, t.shape[0])]] for t in actual[longest]]
    out["two_rows_swapped"] = compare(swapped, ref)
    out["rows_one_late"] = compare([[torch_roll(t) for t in seq] for seq in actual], ref)
    if any(k > 0 for k in layers):
        no_residual = [[per[pos[k]] - per[pos[k - 1]] if k > 0 else per[pos[k]]
                        for k in layers] for per in ref_all]
        out["missing_residual"] = compare(actual, no_residual)
    return out


def torch_roll(t):
    import torch

    return torch.roll(t, shifts=1, dims=0)


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


def owns_exactly(t) -> bool:
    """Is ``t`` what speculators' ``clone().cpu()`` returns: a plain CPU ``torch.Tensor``,
    contiguous, whose storage is exactly its own bytes (so ``torch.save`` of one result
    writes that result, not a whole shared buffer)?"""
    import torch

    return (type(t) is torch.Tensor and t.device.type == "cpu" and t.is_contiguous()
            and t.storage_offset() == 0
            and t.untyped_storage().nbytes() == t.numel() * t.element_size())


def run_check(model_path: str, *, layer_ids: Sequence[int] | None, batches: Sequence[Sequence[
        Sequence[int]]], activate: bool = True, max_model_len: int = 512,
        generator_kwargs: dict[str, Any] | None = None, log=print,
        extra_checks=None, setup=None, known_wrong: bool = False,
        tolerances: dict[str, float] | None = None) -> dict[str, Any]:
    """Extract hidden states for each batch and compare with transformers.

    Returns a JSON-able dict: ``ok``, ``steps`` (each with ok/error), ``report`` (the
    driver's activation report), ``worker_reports``, ``batches`` (per batch: sizes,
    order check, comparison summary, tokens/s). ``setup(gen)`` runs once the generator
    is built, before the first batch (tests use it to shrink the KV cache);
    ``extra_checks(gen, outputs)`` after the last batch; what they return is reported
    as ``setup`` / ``extra``. ``known_wrong``: also compare the largest batch's result
    in deliberately wrong ways (see :func:`known_wrong_compares`) and report whether
    each passed; every one must fail, or the comparison could not tell.
    ``tolerances``: keyword arguments for ``reference.compare`` (its defaults otherwise).
    """
    tol = dict(tolerances or {})
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
                        GENERATOR_MODULE,
                        fromlist=["VllmHiddenStatesGenerator"])
        kwargs = dict(generator_kwargs or {})
        gen = steps("start VllmHiddenStatesGenerator (vLLM engine, workers, KV cache)",
                    gen_mod.VllmHiddenStatesGenerator, model_path,
                    layer_ids=list(layer_ids) if layer_ids is not None else None,
                    max_model_len=max_model_len, **kwargs)
        try:
            if activate:
                from .._process import worker_report

                # A function, not the extension's RPC: speculators' own extension (where
                # hook_capture is not needed, e.g. its pinned vLLM) has no report method.
                result["worker_reports"] = steps(
                    "ask vLLM workers for their activation report",
                    gen.executor.collective_rpc, worker_report)
            result["worker_classes"] = steps(
                "ask vLLM workers for their class hierarchy",
                gen.executor.collective_rpc, worker_classes)
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
            # the transport's driver side, if used
            receiver = getattr(getattr(gen, "executor", None), "compat_receiver", None)
            result["transport"] = None if receiver is None else dict(receiver.stats)
        finally:
            del gen
        from .reference import compare, reference_hidden_states

        for b, (batch, res) in enumerate(zip(batches, outputs)):
            info = result["batches"][b]
            info["input_order"] = len(res) == len(batch) and all(
                r["input_ids"].tolist() == list(s)[: max_model_len - 1]
                for r, s in zip(res, batch))
            info["dtypes"] = sorted({str(h.dtype) for r in res for h in r["hidden_states"]})
            info["plain_owned"] = all(owns_exactly(h) for r in res for h in r["hidden_states"])
            ref = steps(f"transformers reference for batch {b}", reference_hidden_states,
                        model_path, [list(s)[: max_model_len - 1] for s in batch], layers)
            cmp = steps(f"compare batch {b}", compare, [r["hidden_states"] for r in res], ref,
                        **tol)
            info["compare"] = {k: v for k, v in cmp.items() if k != "per_sequence"}
            info["ok"] = bool(cmp["ok"] and info["input_order"] and info["plain_owned"]
                              and info["returned"] == info["size"])
            info["tokens_per_s"] = info["tokens"] / info["seconds"] if info["seconds"] else None
        if known_wrong and outputs:
            # The first 8 sequences of the largest batch: enough to show each wrong kind
            # fails, at a fraction of another full reference forward.
            b = max(range(len(batches)), key=lambda i: len(batches[i]))
            seqs = [list(s)[: max_model_len - 1] for s in batches[b][:8]]
            found = steps(
                f"known-wrong comparisons on batch {b}", known_wrong_compares, model_path,
                seqs, [r["hidden_states"] for r in outputs[b][:8]], layers, tol)
            result["known_wrong"] = {k: v["ok"] for k, v in found.items()}
            result["known_wrong_stats"] = {
                k: {m: v[m] for m in ("min_cosine", "max_rel_abs_err", "max_rel_l2_err")}
                for k, v in found.items()}
        result["ok"] = all(b.get("ok") for b in result["batches"]) and bool(result["batches"])
    except StepFailed as exc:
        result["failed_step"] = exc.step
        result["error"] = f"{type(exc.exc).__name__}: {exc.exc}"
    return result
