"""speculators' generator through the transport: calls of several sizes, every result
held across the later calls and compared with transformers after all of them ran; then
a forked child writes into the held results in place and the parent's stay unchanged;
writes a JSON verdict.

Usage: transport.py --out FILE --model PATH [--tp N]
"""

import argparse
import json
import os

if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--model", required=True)
    p.add_argument("--tp", type=int, default=1)
    a = p.parse_args()
    if a.tp > 1:
        os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "|".join(
            str(i % (os.cpu_count() or 1)) for i in range(a.tp)))

    from speculators_compat.demo.runner import make_sequences, run_check

    shm_before = set(os.listdir("/dev/shm")) if os.path.isdir("/dev/shm") else set()
    # 12, 64 (more than speculators' 32 sequences per step: several steps) and 5.
    batches = [make_sequences(n, seed=i) for i, n in enumerate([12, 64, 5])]

    def worker_stats(worker):
        sender = getattr(worker, "_compat_sender", None)
        return None if sender is None else dict(sender.stats)

    def fork_write(outputs) -> dict:
        """A forked child multiplies every held result by zero in place; the parent's
        checksums must not change (results are private memory, as after a clone)."""
        import torch

        tensors = [h for res in outputs for r in res for h in r["hidden_states"]]
        before = [float(t.float().abs().sum()) for t in tensors]
        pid = os.fork()
        if pid == 0:
            try:
                for t in tensors:
                    t.mul_(0)
                os._exit(0 if all(float(t.abs().sum()) == 0 for t in tensors) else 3)
            except BaseException:  # noqa: BLE001
                os._exit(4)
        _, status = os.waitpid(pid, 0)
        after = [float(t.float().abs().sum()) for t in tensors]
        return {"child_exit": os.waitstatus_to_exitcode(status), "tensors": len(tensors),
                "unchanged": before == after and all(x > 0 for x in before),
                "dtype": sorted({str(t.dtype) for t in tensors}) == [str(torch.bfloat16)]}

    def checks(gen, outputs):
        receiver = getattr(gen.executor, "compat_receiver", None)
        return {"worker_stats": gen.executor.collective_rpc(worker_stats),
                "driver_stats": None if receiver is None else dict(receiver.stats),
                "driver_fallback": None if receiver is None else receiver.fallback_reason,
                "has_receiver": receiver is not None, "fork": fork_write(outputs)}

    result = run_check(a.model, layer_ids=[0, 2, 5], batches=batches,
                       generator_kwargs={"tensor_parallel_size": a.tp} if a.tp > 1 else {},
                       extra_checks=checks)
    shm_after = set(os.listdir("/dev/shm")) if os.path.isdir("/dev/shm") else set()
    result["shm_left"] = sorted(f for f in shm_after - shm_before if "speculators" in f)
    with open(a.out, "w") as f:
        json.dump(result, f, default=str)
