"""Bad input and failures: clear errors, nothing run, nothing leaked into the next call.

Usage: errors.py --out FILE --model PATH
"""

import argparse
import json
import os
import time


def attempt(fn):
    try:
        fn()
    except Exception as exc:  # noqa: BLE001 - the message is what the test checks
        return {"raised": type(exc).__name__, "message": str(exc)}
    return {"raised": None}


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--model", required=True)
    a = p.parse_args()
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    import speculators_compat

    speculators_compat.activate()
    from speculators.data_generation.vllm_hidden_states_generator import (
        VllmHiddenStatesGenerator,
    )

    from speculators_compat.demo.reference import compare, reference_hidden_states
    from speculators_compat.demo.runner import make_sequences

    out = {}
    t = time.perf_counter()
    out["layer_out_of_range"] = attempt(
        lambda: VllmHiddenStatesGenerator(a.model, layer_ids=[0, 99], max_model_len=64))
    out["layer_out_of_range"]["seconds"] = time.perf_counter() - t

    gen = VllmHiddenStatesGenerator(a.model, layer_ids=[0, 2, 5], max_model_len=64)
    out["empty_batch"] = attempt(lambda: gen.generate([]))
    out["empty_sequence"] = attempt(lambda: gen.generate([[5, 6, 7], []]))
    out["bad_token"] = attempt(lambda: gen.generate([[5, 6, 7], [5, "x"]]))

    # After the failures, a good batch (with over-long sequences, truncated to
    # max_model_len - 1 as upstream documents) must come back exactly right.
    seqs = make_sequences(5, seed=3, min_len=20, max_len=100)
    res = gen.generate(seqs)
    truncated = [s[:63] for s in seqs]
    ref = reference_hidden_states(a.model, truncated, [0, 2, 5])
    cmp = compare([r["hidden_states"] for r in res], ref)
    out["after_errors"] = {
        "returned": len(res),
        "input_ids_truncated": [r["input_ids"].tolist() for r in res] == truncated,
        "rows": [r["hidden_states"][0].shape[0] for r in res],
        "compare_ok": cmp["ok"], "min_cosine": cmp["min_cosine"],
    }
    del gen
    with open(a.out, "w") as f:
        json.dump(out, f, default=str)
