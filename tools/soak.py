"""Soak run: many batches through one generator, with injected failures; nothing may leak.

Why: the end-to-end tests run a handful of ``generate()`` calls. State that grows by a
little per call (scheduler requests, the model runner's per-request state, memory in the
driver or the workers), or a failed call that leaves something behind for the next one,
only shows over thousands of sequences. Not a CI test (it takes minutes to hours).

What it does: speculators' unchanged ``VllmHiddenStatesGenerator`` on the tiny CPU demo
checkpoint (through the shim), ``--sequences`` sequences in batches of ``--batch``; every
``--fail-every`` sequences one call fails in its first model step (raised from the
generator's executor instance) and the same batch is then retried, as a user's loop
would. After every call: the scheduler holds no request, and the model runner holds at
most the last call's requests (released with the next call's first step). Every
``--check-every``-th batch is compared with transformers. Driver and worker RSS are
sampled after warm-up and along the run, with the transport's regions each maps (bounded:
a region that outlived its call would make the count grow).

Usage::

    PYTHONPATH=.envs/speculators-0.4.0.1 .envs/vllm-0.32.0/bin/python tools/soak.py \\
        --out docs/results/soak.json [--sequences 5000]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


#: The transport's regions a process may map between two calls: the worker keeps the last
#: call's region until the next call starts (and may still be closing the one before);
#: the driver maps the results alive (here one call's, rebound at each call) plus the
#: previous call's if its unmapping thread has not reached it yet. Correct runs show 1 and
#: 1 (docs/soak.md); a region that outlives its call makes the count grow with the calls.
MAX_REGIONS = {"worker": 2, "driver": 2}


def transport_regions(pid: int | str = "self") -> int:
    """How many of the transport's memfd regions process ``pid`` maps (distinct files)."""
    files = set()
    with open(f"/proc/{pid}/maps") as maps:
        for line in maps:
            if "/memfd:speculators-compat" in line:
                files.add(line.split()[4])  # the inode
    return len(files)


def worker_rss(worker) -> tuple[int, int, int]:
    """(pid, RSS bytes, transport regions mapped) of a vLLM worker process (asked with
    ``collective_rpc``)."""
    import psutil

    return os.getpid(), psutil.Process().memory_info().rss, transport_regions()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True)
    p.add_argument("--sequences", type=int, default=5000)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--fail-every", type=int, default=500)
    p.add_argument("--check-every", type=int, default=100, help="batches")
    p.add_argument("--warmup", type=int, default=10, help="batches before the RSS baseline")
    p.add_argument("--sample-every", type=int, default=25,
                   help="batches between two samples of RSS and transport regions")
    p.add_argument("--ckpts", default=str(ROOT / ".cache" / "ckpts"))
    a = p.parse_args(argv)
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")

    import psutil
    import transformers

    import speculators_compat
    from speculators_compat.demo.checkpoints import build_checkpoint
    from speculators_compat.demo.reference import compare, reference_hidden_states
    from speculators_compat.demo.runner import make_sequences, runner_request_count

    model = str(build_checkpoint(
        "llama", Path(a.ckpts) / f"tf-{transformers.__version__}" / "llama"))
    report = speculators_compat.activate()
    from speculators.data_generation.vllm_hidden_states_generator import (
        VllmHiddenStatesGenerator,
    )

    layers = [0, 2, 5]
    gen = VllmHiddenStatesGenerator(model, layer_ids=layers, max_model_len=512)
    driver = psutil.Process()
    shown = Path(model).resolve()
    result: dict = {"model": str(shown.relative_to(ROOT) if shown.is_relative_to(ROOT)
                                 else shown), "sequences": a.sequences, "batch": a.batch,
                    "versions": dict(report.versions),
                    "failures_injected": 0, "failures_raised": 0, "checks": [],
                    "rss": [], "problems": []}

    def sample(batch_no: int, when: str = "after") -> None:
        workers = gen.executor.collective_rpc(worker_rss)
        regions = {"driver": transport_regions(), "workers": [n for _, _, n in workers]}
        result["rss"].append({"batch": batch_no, "when": when,
                              "driver_mb": driver.memory_info().rss / 2**20,
                              "workers_mb": [r / 2**20 for _, r, _ in workers],
                              "regions": regions})
        if (regions["driver"] > MAX_REGIONS["driver"]
                or max(regions["workers"]) > MAX_REGIONS["worker"]):
            result["problems"].append({"batch": batch_no, "error": "transport regions "
                                       f"left mapped: {regions} (at most {MAX_REGIONS})"})

    def state_check(batch_no: int, size: int) -> None:
        """Scheduler empty; the runner holds at most the last successful call's
        requests (a failed call's first step never reached it, so after a failure it
        still holds the call before's; both are released with the next step)."""
        sched = gen.scheduler
        left = (len(sched.requests), len(sched.running), len(sched.waiting))
        held = gen.executor.collective_rpc(runner_request_count)
        if any(left) or max(held) > size:
            result["problems"].append(
                {"batch": batch_no, "scheduler(requests,running,waiting)": left,
                 "runner_held": held})

    def inject_failure() -> None:
        ex = gen.executor
        original = ex.__dict__.get("execute_model")

        def failing(*args, **kwargs):
            if original is None:
                del ex.execute_model
            else:
                ex.execute_model = original
            raise RuntimeError("soak: injected failure in the first model step")

        ex.execute_model = failing

    t0 = time.time()
    done = 0
    batch_no = 0
    next_failure = a.fail_every
    last_size = 0
    while done < a.sequences:
        n = min(a.batch, a.sequences - done)
        seqs = make_sequences(n, seed=batch_no, min_len=4, max_len=200)
        if done + n >= next_failure:
            next_failure += a.fail_every
            result["failures_injected"] += 1
            inject_failure()
            try:
                gen.generate([list(s) for s in seqs])
            except Exception as exc:  # expected: the injected failure
                result["failures_raised"] += 1
                result.setdefault("failure_errors", []).append(
                    f"{type(exc).__name__}: {str(exc)[:200]}")
            else:
                result["problems"].append({"batch": batch_no, "error": "no failure raised"})
            state_check(batch_no, last_size)
        out = gen.generate([list(s) for s in seqs])
        last_size = n
        if len(out) != n or any(r["input_ids"].tolist() != s for r, s in zip(out, seqs)):
            result["problems"].append({"batch": batch_no, "error": "wrong size or order"})
        state_check(batch_no, n)
        if batch_no % a.check_every == 0:
            sample(batch_no, "before reference check")
            cmp = compare([r["hidden_states"] for r in out],
                          reference_hidden_states(model, seqs, layers))
            result["checks"].append({"batch": batch_no, "ok": cmp["ok"],
                                     "min_cosine": cmp["min_cosine"],
                                     "max_rel_l2_err": cmp.get("max_rel_l2_err")})
            if not cmp["ok"]:
                result["problems"].append({"batch": batch_no, "error": cmp["reasons"][:3]})
        if batch_no == a.warmup or batch_no % a.sample_every == 0:
            sample(batch_no)
        done += n
        batch_no += 1
        if batch_no % 10 == 0:
            print(f"{done} sequences, {batch_no} batches, {time.time() - t0:.0f}s",
                  flush=True)
    sample(batch_no)
    result["batches"] = batch_no
    result["seconds"] = time.time() - t0
    base = next((r for r in result["rss"] if r["batch"] >= a.warmup), result["rss"][0])
    last = result["rss"][-1]
    result["rss_growth_after_warmup_mb"] = {
        "driver": last["driver_mb"] - base["driver_mb"],
        "workers": [x - y for x, y in zip(last["workers_mb"], base["workers_mb"])]}
    # The driver's transformers reference checks load the model each time; growth
    # across them is the reference's, not the generator's.
    checks = [i for i, r in enumerate(result["rss"]) if r["when"] != "after"]
    result["driver_growth_in_reference_checks_mb"] = sum(
        result["rss"][i + 1]["driver_mb"] - result["rss"][i]["driver_mb"]
        for i in checks if i + 1 < len(result["rss"]) and result["rss"][i]["batch"] >= a.warmup)
    result["ok"] = (not result["problems"]
                    and result["failures_raised"] == result["failures_injected"]
                    and all(c["ok"] for c in result["checks"]))
    Path(a.out).write_text(json.dumps(result, indent=1, default=str))
    print(json.dumps({k: v for k, v in result.items() if k not in ("rss", "checks")},
                     indent=1, default=str))
    gen = None  # shut the engine down while logging still works  # noqa: F841
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
