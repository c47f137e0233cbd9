"""speculators' generator through the shared-memory transport, with a deliberately small
pool: batches that fit stream into shared memory while the model runs, a batch larger
than the pool comes in pieces; every result (held across later calls) is compared with
transformers; writes a JSON verdict.

Usage: transport.py --out FILE --model PATH [--tp N] [--pool-bytes N]
"""

import argparse
import json
import os

if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--model", required=True)
    p.add_argument("--tp", type=int, default=1)
    p.add_argument("--pool-bytes", type=int, default=1 << 20)
    a = p.parse_args()
    os.environ["SPECULATORS_COMPAT_TRANSPORT_BYTES"] = str(a.pool_bytes)  # workers inherit
    if a.tp > 1:
        os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "|".join(
            str(i % (os.cpu_count() or 1)) for i in range(a.tp)))

    from speculators_compat.demo.runner import make_sequences, run_check

    shm_before = set(os.listdir("/dev/shm")) if os.path.isdir("/dev/shm") else set()
    # 12 and 5 sequences fit a 1 MiB pool (tiny Llama, 3 layers); 64 do not.
    batches = [make_sequences(n, seed=i) for i, n in enumerate([12, 64, 5])]

    def worker_stats(worker):
        exporter = getattr(worker, "_compat_exporter", None)
        return None if exporter is None else dict(exporter.stats)

    def checks(gen, outputs):
        importer = gen.executor.__dict__.get("_compat_importer")
        return {"worker_stats": gen.executor.collective_rpc(worker_stats),
                "driver_stats": None if importer is None else dict(importer.stats),
                "driver_fallback": None if importer is None else importer.fallback_reason,
                "has_importer": importer is not None}

    result = run_check(a.model, layer_ids=[0, 2, 5], batches=batches,
                       generator_kwargs={"tensor_parallel_size": a.tp} if a.tp > 1 else {},
                       extra_checks=checks)
    shm_after = set(os.listdir("/dev/shm")) if os.path.isdir("/dev/shm") else set()
    result["shm_left"] = sorted(f for f in shm_after - shm_before if "speculators" in f)
    with open(a.out, "w") as f:
        json.dump(result, f, default=str)
