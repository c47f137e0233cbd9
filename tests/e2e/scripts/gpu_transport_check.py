"""GPU check of the transport alone (no vLLM): rows of a simulated forward, at an 8B
model's width, go through ``speculators_compat.transport`` on CUDA and come back exact.

Why: the CUDA path of the transport (side-stream copies into pinned staging, copy threads
into the call's region, populate) cannot run on a machine without a GPU, and a vLLM run
mixes its cost with everything else. This runs it on the device's own torch, with a
stand-in forward (matrix products on the compute stream between the layer hooks), and
reports per call: the forward alone, the forward with the rows streamed, the wait for
the copies after the last step (``tail``), and whether every returned row equals the GPU
row it came from. Both result contracts; every call's results held, as a caller that
keeps them would.

Usage (device; the image's torch is enough)::

    PYTHONPATH=src python3 tests/e2e/scripts/gpu_transport_check.py --out $OUT/transport.json
"""

from __future__ import annotations

import argparse
import json
import os
import time


def simulate(args, contract: str, threads: int, capture: bool) -> dict:
    import torch

    from speculators_compat.transport import wire
    from speculators_compat.transport.copies import RowCopier
    from speculators_compat.transport.driver import Receiver
    from speculators_compat.transport.worker import Sender

    torch.manual_seed(0)
    dev = torch.device(args.device)
    w = torch.randn(args.hidden, args.hidden, device=dev, dtype=torch.bfloat16) / 64
    sender = Sender()
    sender.copier = RowCopier(threads=threads)
    receiver = Receiver(handoff=True)
    calls, held, exact = [], [], True
    g = torch.Generator().manual_seed(1)
    for call in range(args.calls):
        lens = [int(x) for x in torch.randint(args.min_len, args.max_len + 1, (args.batch,),
                                              generator=g)]
        plan = [(f"req_{call}_{i}", n) for i, n in enumerate(lens)]
        # chunked prefill: steps of at most args.step_tokens tokens, requests in order
        steps, cur, room = [], [], args.step_tokens
        done = {rid: 0 for rid, _ in plan}
        queue = list(plan)
        while queue:
            rid, n = queue[0]
            take = min(n - done[rid], room)
            cur.append((rid, done[rid], take))
            done[rid] += take
            room -= take
            if done[rid] == n:
                queue.pop(0)
            if room == 0 or not queue:
                steps.append(cur)
                cur, room = [], args.step_tokens
        truth: dict = {rid: [[] for _ in range(args.layers)] for rid, _ in plan}
        sink = sender.begin_call(plan, args.layers, contract) if capture else None
        sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
        sync()
        t0 = time.perf_counter()
        for step in steps:
            rows = sum(t for _, _, t in step)
            x = torch.randn(rows, args.hidden, device=dev, dtype=torch.bfloat16)
            for slot in range(args.layers):
                for _ in range(args.work):
                    x = torch.tanh(x @ w)  # the model's work between two hooks
                hidden = x + 0.5  # what the hook computes (hidden_states + residual)
                if capture:
                    entries, off = [], 0
                    for rid, pos, take in step:
                        r = hidden[off:off + take]
                        entries.append((rid, pos, r))
                        truth[rid][slot].append(r)
                        off += take
                    sink.write(slot, entries)
        sync()
        t_steps = time.perf_counter() - t0
        result = None
        if capture:
            t1 = time.perf_counter()
            order = [rid for rid, _ in plan]
            lengths = dict(plan)
            states = {rid: [torch.cat(c) for c in truth[rid]] for rid in order}
            held_states = (states if contract == wire.BY_REQUEST else
                           [torch.cat([states[r][s] for r in order]) for s in range(args.layers)])
            reply = sender.reply(held_states, contract, order, lengths)
            t_reply = time.perf_counter() - t1
            result = receiver.fetch(lambda reply=reply: reply)
            if contract == wire.BY_REQUEST:
                got = {rid: [h.clone() for h in layers] for rid, layers in result.items()}
                exact = exact and all(torch.equal(got[r][s], states[r][s].cpu())
                                      for r in order for s in range(args.layers))
            else:
                got = [h.clone() for h in result]
                exact = exact and all(torch.equal(got[s], held_states[s].cpu())
                                      for s in range(args.layers))
            held.append(got)
            calls.append({"steps_s": t_steps, "reply_s": t_reply, "streamed": reply["streamed"],
                          "bytes": reply["size"], "tokens": sum(lens)})
        else:
            calls.append({"steps_s": t_steps, "tokens": sum(lens)})
    stats = sender.all_stats()
    sender.close()
    return {"contract": contract, "threads": threads, "capture": capture, "calls": calls,
            "exact": exact, "stats": stats}


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--hidden", type=int, default=4096)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--min-len", type=int, default=768)
    p.add_argument("--max-len", type=int, default=1024)
    p.add_argument("--step-tokens", type=int, default=8192)
    p.add_argument("--calls", type=int, default=4)
    p.add_argument("--work", type=int, default=100,
                   help="matrix products between two hooks (100: about an 8B forward)")
    p.add_argument("--threads", default="2,4,8")
    p.add_argument("--device", default="cuda", help="cuda; cpu only tests the script")
    a = p.parse_args()
    import torch

    out = {"device": torch.cuda.get_device_name() if a.device == "cuda" else "cpu",
           "torch": torch.__version__, "cpus": os.cpu_count(), "runs": []}
    ok = True
    for contract in ("by_request", "list"):
        base = simulate(a, contract, 4, capture=False)
        out["runs"].append(base)
        for threads in [int(t) for t in a.threads.split(",")]:
            run = simulate(a, contract, threads, capture=True)
            ok = ok and run["exact"] and all(c["streamed"] for c in run["calls"])
            out["runs"].append(run)
            med = sorted(c["steps_s"] + c["reply_s"] for c in run["calls"][1:])
            ref = sorted(c["steps_s"] for c in base["calls"][1:])
            print(f"{contract:10s} threads {threads}: exact {run['exact']}, call "
                  f"{med[len(med) // 2]:.3f} s vs forward alone {ref[len(ref) // 2]:.3f} s, "
                  f"tail {run['stats']['tail_s'] / len(run['calls']):.4f} s/call, "
                  f"hook {run['stats']['write_s'] / len(run['calls']):.4f} s/call, "
                  f"staging wait {run['stats']['staging_wait_s']:.3f} s, in the copier "
                  f"{run['stats']['hook_s'] / len(run['calls']):.4f} s/call", flush=True)
    out["ok"] = ok
    with open(a.out, "w") as f:
        json.dump(out, f, indent=1, default=str)
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
