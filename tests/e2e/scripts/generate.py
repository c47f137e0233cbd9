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
    p.add_argument("--min-len", type=int, default=4)
    p.add_argument("--max-len", type=int, default=48)
    p.add_argument("--check-unscaled-differs", action="store_true",
                   help="compare with a reference that ignores llama_4_scaling too")
    a = p.parse_args()

    from speculators_compat.demo.runner import make_sequences, run_check

    batches = [make_sequences(int(n), seed=i, min_len=a.min_len, max_len=a.max_len)
               for i, n in enumerate(a.batches.split(","))]
    kwargs = {}
    if a.max_num_batched_tokens:
        kwargs["max_num_batched_tokens"] = a.max_num_batched_tokens

    def consistency(gen, outputs):
        import torch

        batch = batches[-1]
        first = outputs[-1]
        again = gen.generate([list(s) for s in batch])
        singles = [gen.generate([list(s)])[0] for s in batch[:5]]
        from speculators_compat.demo.runner import runner_request_count

        held = gen.executor.collective_rpc(runner_request_count)

        def same(x, y):
            return all(torch.equal(h1, h2) for h1, h2 in zip(x["hidden_states"],
                                                             y["hidden_states"]))

        return {"runner_requests_held": held,
                "repeat_identical": all(same(x, y) for x, y in zip(first, again)),
                "single_equals_batch": all(same(s, b) for s, b in zip(singles, first)),
                "single_close_to_batch": all(
                    all(torch.allclose(h1.float(), h2.float(), atol=0.05, rtol=0.05)
                        for h1, h2 in zip(s["hidden_states"], b["hidden_states"]))
                    for s, b in zip(singles, first))}

    def unscaled(gen, outputs):
        from speculators_compat.demo.reference import compare, reference_hidden_states

        ref = reference_hidden_states(a.model, [list(s) for s in batches[-1]],
                                      sorted(set(gen.layer_ids)), apply_llama_4_scaling=False)
        cmp = compare([r["hidden_states"] for r in outputs[-1]], ref)
        return {"unscaled_reference_ok": cmp["ok"], "unscaled_min_cosine": cmp["min_cosine"]}

    extra = consistency if a.consistency else (unscaled if a.check_unscaled_differs else None)
    result = run_check(a.model, layer_ids=[int(x) for x in a.layers.split(",")],
                       batches=batches, activate=not a.no_activate,
                       max_model_len=a.max_model_len, generator_kwargs=kwargs,
                       extra_checks=extra)
    result["driver_pid"] = os.getpid()
    with open(a.out, "w") as f:
        json.dump(result, f, default=str)
