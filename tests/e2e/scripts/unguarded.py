"""A user script that builds the generator in its top-level code, with no main guard.

Usage: unguarded.py --out FILE --model PATH

Records what building the generator raised, how long it took, and whether any worker
process had been started by then.
"""

import argparse
import json
import multiprocessing
import os
import time

p = argparse.ArgumentParser()
p.add_argument("--out", required=True)
p.add_argument("--model", required=True)
a = p.parse_args()
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
import speculators_compat  # noqa: E402

speculators_compat.activate()
from speculators.data_generation.vllm_hidden_states_generator import (  # noqa: E402
    VllmHiddenStatesGenerator,
)

t0 = time.monotonic()
try:
    gen = VllmHiddenStatesGenerator(a.model, layer_ids=[0, 2], max_model_len=128)
    out = {"raised": None}
except Exception as exc:  # noqa: BLE001 - the message is what the test checks
    out = {"raised": type(exc).__name__, "message": str(exc)}
out["seconds"] = time.monotonic() - t0
out["children"] = len(multiprocessing.active_children())
out["script"] = os.path.abspath(__file__)
if multiprocessing.parent_process() is None:  # a spawned worker running it again: no
    with open(a.out, "w") as f:
        json.dump(out, f)
