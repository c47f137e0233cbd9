"""Build speculators' generator on a model the shim refuses; record what was raised.

Usage: refused_model.py --out FILE --model PATH [--model PATH ...]

A model directory may hold a config alone (no weights, no tokenizer): a refusal must
come before anything is read beyond the config. Records, per model, the exception, how
long building took, and whether any worker process had been started (several models share
one interpreter: one import of vLLM and speculators). One model: the record itself; more:
``{"models": [record, ...]}`` in the order given.
"""

import argparse
import json
import multiprocessing
import time


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--model", required=True, action="append")
    a = p.parse_args()
    import speculators_compat

    speculators_compat.activate()
    from speculators.data_generation.vllm_hidden_states_generator import (
        VllmHiddenStatesGenerator,
    )

    records = []
    for model in a.model:
        t0 = time.monotonic()
        try:
            VllmHiddenStatesGenerator(model, layer_ids=[0, 1], max_model_len=128)
            out = {"raised": None}
        except Exception as exc:  # noqa: BLE001 - the message is what the test checks
            out = {"raised": type(exc).__name__, "message": str(exc)}
        out["seconds"] = time.monotonic() - t0
        out["children"] = len(multiprocessing.active_children())
        records.append(out)
    with open(a.out, "w") as f:
        json.dump(records[0] if len(records) == 1 else {"models": records}, f)


if __name__ == "__main__":
    main()
