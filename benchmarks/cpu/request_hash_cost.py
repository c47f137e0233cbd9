"""What speculators 0.4's per-request block hasher costs the driver (adapter
``block_hasher_unused``): make the requests of one ``generate()`` call through vLLM's own
``Request``, with the hasher speculators 0.4 builds and without it.

Usage (any machine with vLLM; no model, no GPU)::

    python benchmarks/cpu/request_hash_cost.py [--batch 32] [--min-len 768] [--max-len 1024]

Prints one JSON line: seconds per call (median of ``--repeats``) with and without the
hasher, the hash algorithm (vLLM's default ``prefix_caching_hash_algo``) and the block
size. The GPU benchmark's shape is the default (batch 32 of 768-1024 tokens).
"""

from __future__ import annotations

import argparse
import inspect
import json
import random
import statistics
import time


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--min-len", type=int, default=768)
    p.add_argument("--max-len", type=int, default=1024)
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--repeats", type=int, default=7)
    a = p.parse_args()

    import vllm
    from vllm import SamplingParams
    from vllm.config import CacheConfig
    from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
    from vllm.v1.request import Request

    try:  # where speculators 0.4 imports it from, by vLLM release
        from vllm.utils.hashing import get_hash_fn_by_name
    except ImportError:
        from vllm.utils import get_hash_fn_by_name

    algo = CacheConfig().prefix_caching_hash_algo
    hash_fn = get_hash_fn_by_name(algo)
    init_none_hash(hash_fn)
    hasher = get_request_block_hasher(a.block_size, hash_fn)
    rng = random.Random(0)
    seqs = [[rng.randrange(128_000) for _ in range(rng.randint(a.min_len, a.max_len))]
            for _ in range(a.batch)]
    extra = {"eos_token_id": 2} if "eos_token_id" in inspect.signature(Request).parameters else {}

    def one_call(block_hasher) -> float:
        t = time.perf_counter()
        for i, ids in enumerate(seqs):
            Request(request_id=f"req_0_{i}", prompt_token_ids=ids,
                    sampling_params=SamplingParams(max_tokens=1, temperature=0.0),
                    pooling_params=None, arrival_time=0.0, block_hasher=block_hasher,
                    **extra)
        return time.perf_counter() - t

    times: dict[str, list[float]] = {"with_hasher_s": [], "without_s": []}
    for _ in range(a.repeats):  # alternating
        times["with_hasher_s"].append(one_call(hasher))
        times["without_s"].append(one_call(None))
    out = {k: round(statistics.median(v), 5) for k, v in times.items()}
    out.update(vllm=vllm.__version__, hash_algo=algo, block_size=a.block_size, batch=a.batch,
               tokens=sum(map(len, seqs)), repeats=a.repeats)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
