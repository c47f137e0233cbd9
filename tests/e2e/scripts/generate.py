"""Run speculators' unchanged generator on a tiny checkpoint; write a JSON verdict.

Usage: generate.py --out FILE --model PATH --layers 0,2,5 --batches 1,12 [--no-activate]
       [--consistency] [--max-model-len N] [--max-num-batched-tokens N]
"""

import argparse
import json
import os

if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--model", required=True)
    p.add_argument("--layers", default="0,2,5")
    p.add_argument("--batches", default="12")
    p.add_argument("--no-activate", action="store_true")
    p.add_argument("--consistency", action="store_true",
                   help="also check repeat calls and batch-vs-single equality")
    p.add_argument("--max-model-len", type=int, default=512)
    p.add_argument("--max-num-batched-tokens", type=int, default=None)
    p.add_argument("--gpu-mem", type=float, default=None,
                   help="gpu_memory_utilization of the generator (GPU runs beside others)")
    p.add_argument("--min-len", type=int, default=4)
    p.add_argument("--max-len", type=int, default=48)
    p.add_argument("--check-unscaled-differs", action="store_true",
                   help="compare with a reference that ignores llama_4_scaling too")
    p.add_argument("--preempt", action="store_true",
                   help="after the batches, run one more batch with a KV cache too small for "
                        "it and 32-token prefill chunks, so that vLLM preempts requests "
                        "mid-prefill and recomputes them; check it against transformers")
    p.add_argument("--long-batch", type=int, default=0,
                   help="first run one batch of this many 240-300-token sequences (above "
                        "speculators' 8192-token step budget: chunked prefill)")
    p.add_argument("--vllm-additional-config", default="",
                   help="JSON for VllmConfig(additional_config=...) of the generator, e.g. "
                        "'{\"gdn_prefill_backend\": \"triton\"}' where the GPU kit lacks "
                        "FlashInfer (vLLM's default GDN prefill kernel on Hopper)")
    p.add_argument("--tolerances", default="",
                   help="compare() tolerances for this run, e.g. min_cosine=0.985,"
                        "max_rel_l2_err=0.1 (defaults: demo.reference's)")
    a = p.parse_args()
    tolerances = {k: float(v) for k, v in
                  (item.split("=") for item in a.tolerances.split(",") if item)}

    from speculators_compat.demo.runner import make_sequences, run_check

    if a.vllm_additional_config and not a.no_activate:
        from generator_config import give_generator_additional_config

        import speculators_compat

        speculators_compat.activate()  # before speculators is imported
        give_generator_additional_config(json.loads(a.vllm_additional_config))

    batches = [make_sequences(int(n), seed=i, min_len=a.min_len, max_len=a.max_len)
               for i, n in enumerate(a.batches.split(","))]
    if a.long_batch:
        batches.insert(0, make_sequences(a.long_batch, seed=1000, min_len=240, max_len=300))
    kwargs = {}
    if a.gpu_mem:
        kwargs["gpu_memory_utilization"] = a.gpu_mem
    if a.max_num_batched_tokens:
        kwargs["max_num_batched_tokens"] = a.max_num_batched_tokens

    def consistency(gen, outputs):
        """The last batch again (must be bit-identical), and its first five sequences one
        at a time (the same sequence computed in another batch composition). Lengths are
        reported and compared before any pairing: a shorter result cannot pass."""
        from speculators_compat.demo.reference import compare
        from speculators_compat.demo.runner import runner_request_count

        batch = batches[-1]
        first = outputs[-1]
        again = gen.generate([list(s) for s in batch])
        singles = [gen.generate([list(s)])[0] for s in batch[:5]]
        held = gen.executor.collective_rpc(runner_request_count)

        def max_abs_diff(xs, ys):
            """Largest absolute difference over all tensors; None if any shape differs."""
            if len(xs) != len(ys):
                return None
            worst = 0.0
            for x, y in zip(xs, ys):
                hx, hy = x["hidden_states"], y["hidden_states"]
                if len(hx) != len(hy) or any(a.shape != b.shape for a, b in zip(hx, hy)):
                    return None
                for a, b in zip(hx, hy):
                    worst = max(worst, float((a.float() - b.float()).abs().max()))
            return worst

        vs = compare([r["hidden_states"] for r in singles], [r["hidden_states"] for r in first[:5]])
        return {"runner_requests_held": held,
                "repeat_lengths": [len(first), len(again)],
                "repeat_max_abs_diff": max_abs_diff(first, again),
                "single_lengths": [len(singles), len(first[:5])],
                "single_max_abs_diff": max_abs_diff(singles, first[:5]),
                "batch_max_abs": max(float(h.abs().max()) for r in first
                                     for h in r["hidden_states"]),
                "single_vs_batch": {k: v for k, v in vs.items() if k != "per_sequence"}}

    def unscaled(gen, outputs):
        from speculators_compat.demo.reference import compare, reference_hidden_states

        ref = reference_hidden_states(a.model, [list(s) for s in batches[-1]],
                                      sorted(set(gen.layer_ids)), apply_llama_4_scaling=False)
        cmp = compare([r["hidden_states"] for r in outputs[-1]], ref, **tolerances)
        return {"unscaled_reference_ok": cmp["ok"], "unscaled_min_cosine": cmp["min_cosine"]}

    def preemption(gen, outputs):
        """A KV cache too small for the batch: upstream, vLLM's scheduler preempts requests
        in the middle of their (chunked) prefill and later recomputes them from position 0
        (scheduler_prefill_only admits only what fits whole, so nothing is). The
        scheduler's threshold makes every request prefill in 32-token chunks (many partial
        prefills at once); blocks taken out of the scheduler's pool leave it room for about
        2.5 of the batch's longest prompts. Preemptions are counted in the scheduler's
        outputs, restarts in the workers' capture."""
        import torch

        from speculators_compat.demo.reference import compare, reference_hidden_states
        from speculators_compat.demo.runner import capture_restarts

        sched = gen.scheduler
        cfg = sched.scheduler_config
        saved = (cfg.long_prefill_token_threshold,
                 getattr(sched, "adaptive_long_prefill_threshold", None))
        cfg.long_prefill_token_threshold = 32
        if saved[1] is not None:
            sched.adaptive_long_prefill_threshold = False
        batch = make_sequences(8, seed=99, min_len=200, max_len=300)
        block = sched.kv_cache_config.kv_cache_groups[0].kv_cache_spec.block_size
        room = -(-5 * max(map(len, batch)) // (2 * block))
        pool = sched.kv_cache_manager.block_pool
        held = pool.get_new_blocks(pool.get_num_free_blocks() - room)
        counts = {"preempted": 0, "resumed": 0, "steps": 0}
        schedule = sched.schedule

        def counting(*args, **kwargs):
            out = schedule(*args, **kwargs)
            counts["steps"] += 1
            counts["preempted"] += len(getattr(out, "preempted_req_ids", None) or ())
            counts["resumed"] += len(
                getattr(out.scheduled_cached_reqs, "resumed_req_ids", None) or ())
            return out

        sched.schedule = counting
        res, restarts, error = [], None, None
        try:
            res = gen.generate([list(s) for s in batch])
            restarts = gen.executor.collective_rpc(capture_restarts)
        except Exception as exc:  # reported: the test decides which errors are acceptable
            error = f"{type(exc).__name__}: {exc}"
        finally:
            del sched.schedule
            pool.free_blocks(held)
            cfg.long_prefill_token_threshold = saved[0]
            if saved[1] is not None:
                sched.adaptive_long_prefill_threshold = saved[1]
        cmp = None
        if res:
            ref = reference_hidden_states(a.model, batch, sorted(set(gen.layer_ids)))
            cmp = compare([r["hidden_states"] for r in res], ref)
        return {"preempt": {
            **counts, "kv_blocks": room, "block_size": block, "capture_restarts": restarts,
            "batch_blocks": sum(-(-len(s) // block) for s in batch),
            "error": error, "size": len(batch), "returned": len(res),
            "input_order": len(res) == len(batch) and all(
                torch.equal(r["input_ids"], torch.tensor(s)) for r, s in zip(res, batch)),
            "compare": cmp and {k: v for k, v in cmp.items() if k != "per_sequence"}}}

    checks = [f for f, on in ((consistency, a.consistency),
                              (unscaled, a.check_unscaled_differs),
                              (preemption, a.preempt)) if on]

    def extra(gen, outputs):
        # speculators 0.4's per-request block hasher (adapter block_hasher_unused: none
        # where prefix caching is off, as vLLM's own engine builds requests).
        hasher = getattr(gen, "block_hasher", "absent")
        found = {"block_hasher": hasher if hasher == "absent" else
                 ("none" if hasher is None else "set")}
        for check in checks:
            found.update(check(gen, outputs))
        return found

    result = run_check(a.model, layer_ids=[int(x) for x in a.layers.split(",")],
                       batches=batches, activate=not a.no_activate,
                       max_model_len=a.max_model_len, generator_kwargs=kwargs,
                       extra_checks=extra if checks else None,
                       known_wrong=not a.no_activate, tolerances=tolerances)
    result["driver_pid"] = os.getpid()
    with open(a.out, "w") as f:
        json.dump(result, f, default=str)
