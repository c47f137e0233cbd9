"""``speculators-compat run --data-parallel N [--gpus-per-replica K] [--replicas-per-gpu M]
SCRIPT ARGS``: N replicas of speculators 0.3/0.4's unchanged offline script on disjoint
sample ranges and disjoint devices (or M replicas sharing each GPU), one output folder with
the files one run writes.

Why: the script runs one generator over the whole dataset (tensor parallel only), and its
resume restarts after the highest ``data_<i>.pt``; a user with eight GPUs runs eight
copies by hand and merges ``sample_lengths.json`` / ``data_config.json`` themselves, and
a sample lost below the highest index stays lost.

How (nothing of the script changes; :mod:`speculators_compat._offline_hooks` is what the
replicas' processes see):

1. Count: the script runs once in count mode (it stops after speculators' preprocessing,
   which writes ``--token-freq-path`` as one run does) and says how many samples ``M``
   its dataset has; cached in the work folder for reruns with the same options.
2. Plan: the file indices ``[S, S + M)`` (``S`` = the script's ``--start-idx``) are cut
   into ``W * N`` contiguous blocks, ``W`` the tasks of a multi-node launch
   (:func:`detect_task`: torchrun / Ray Train ``RANK``/``WORLD_SIZE``, SLURM
   ``SLURM_PROCID``/``SLURM_NTASKS``, Open MPI); this task runs blocks ``rank * N ..``.
   A block depends only on ``M``, ``W`` and ``N``, never on what other tasks have written,
   so tasks that start at different times agree without talking. Within its block a
   replica generates exactly the indices without a whole file (:func:`missing`), one
   script run per contiguous range.
3. Run: a replica's script gets a scratch ``--output-dir`` (under :data:`WORK`) holding an
   empty ``data_<a-1>.pt``, so the script's own resume starts at ``a``; the dataset is cut
   after ``b``; saves land whole in the real folder. Devices: ``CUDA_VISIBLE_DEVICES`` (K
   per replica); on CPU, disjoint cores (``VLLM_CPU_OMP_THREADS_BIND``). With
   ``--replicas-per-gpu M`` (GPUs only), M consecutive replicas share each group of K GPUs
   (N/M groups): each gets the script's ``--gpu-memory-utilization`` (vLLM's share of the
   GPU's memory for its engine) as the user gave it (refused if M times it exceeds 1), else
   the script's default 0.8 / M; on a shared GPU a replica starts once the one before it
   has saved a sample (its engine holds its memory: vLLM measures its own use from the
   GPU's free memory, so two engines starting together miscount). Without it each replica
   has its own GPUs and fewer GPUs than replicas is an error naming the option.
4. Merge: when every index of ``[S, S + M)`` has its file, the task that sees it writes
   ``sample_lengths.json`` (where the release writes one), ``data_config.json`` (the
   command and ``num_samples`` of one run) and, where ``SPECULATORS_COMPAT_REPORT_FILE``
   is set, the shim's report and layers file, then removes :data:`WORK`.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
import zipfile
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TextIO

from . import _draft_layers as dl
from . import _env
from ._files import write_text_atomic
from ._offline_hooks import DATA_NAME, ENV, TEMPORARY

#: The launcher's work folder inside the output folder (removed once the data is merged;
#: ``check-data`` reports the files ending in ``pt`` it holds if a run leaves it).
WORK = ".speculators-compat-dp"
SAMPLE_LENGTHS_FILE = "sample_lengths.json"
#: Seconds between progress lines (``SPECULATORS_COMPAT_DP_PROGRESS_S`` overrides).
PROGRESS_S = 30.0
#: Environment of a torchrun / Ray Train / SLURM task that must not reach the replicas:
#: vLLM would read them as its own distributed setup.
LAUNCHER_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK",
                 "GROUP_WORLD_SIZE", "ROLE_RANK", "ROLE_WORLD_SIZE", "MASTER_ADDR",
                 "MASTER_PORT", "TORCHELASTIC_RUN_ID")


class DataParallelError(Exception):
    """A data-parallel run cannot start: the message says why and what to do."""


# --------------------------------------------------------------------------------------
# Who runs what
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Task:
    """This process's place in a multi-node launch (``rank`` of ``world``)."""

    rank: int = 0
    world: int = 1
    local_rank: int = 0
    local_world: int = 1
    source: str = "single task"


#: (rank, world, local rank, local world, what sets them), first found wins: torchrun sets
#: RANK inside a SLURM allocation too, and then it is the one that counts.
_TASK_VARS = (
    ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "torchrun / Ray Train"),
    ("SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_NTASKS_PER_NODE", "SLURM"),
    ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
     "OMPI_COMM_WORLD_LOCAL_SIZE", "Open MPI"),
)


def _int(environ: Mapping[str, str], name: str) -> int | None:
    value = environ.get(name, "").strip()
    if not value:
        return None
    head = value.split("(")[0].split(",")[0]  # SLURM_NTASKS_PER_NODE like "4(x2)"
    try:
        return int(head)
    except ValueError as exc:
        raise DataParallelError(f"{name}={value!r} is not a number") from exc


def detect_task(environ: Mapping[str, str], rank: int | None = None,
                world: int | None = None) -> Task:
    """This task's rank among the tasks of a torchrun / Ray Train / SLURM / Open MPI
    launch (``rank``/``world`` given: those)."""
    if rank is not None or world is not None:
        if rank is None or world is None:
            raise DataParallelError("--rank and --world-size go together")
        task = Task(rank, world, 0, 1, "--rank/--world-size")
    else:
        task = Task()
        for r, w, lr, lw, source in _TASK_VARS:
            rv, wv = _int(environ, r), _int(environ, w)
            if rv is None and wv is None:
                continue
            if rv is None or wv is None:
                raise DataParallelError(f"{r if rv is None else w} is missing while "
                                        f"{w if rv is None else r} is set ({source}): set "
                                        "both, or neither")
            task = Task(rv, wv, _int(environ, lr) or 0, _int(environ, lw) or 1, source)
            break
    if task.world < 1 or not 0 <= task.rank < task.world:
        raise DataParallelError(f"rank {task.rank} of {task.world} tasks ({task.source}): "
                                "the rank must be in [0, world size)")
    return task


def split(start: int, count: int, parts: int) -> list[tuple[int, int]]:
    """``[start, start + count)`` cut into ``parts`` contiguous ``[a, b)`` blocks whose
    sizes differ by at most one (empty blocks where ``parts > count``)."""
    if parts < 1:
        raise ValueError(f"parts must be at least 1, not {parts}")
    return [(start + count * p // parts, start + count * (p + 1) // parts)
            for p in range(parts)]


def runs(indices: Iterable[int]) -> list[tuple[int, int]]:
    """Sorted ``indices`` as contiguous ``[a, b)`` ranges."""
    out: list[list[int]] = []
    for i in sorted(set(indices)):
        if out and i == out[-1][1]:
            out[-1][1] = i + 1
        else:
            out.append([i, i + 1])
    return [(a, b) for a, b in out]


def visible_gpus(environ: Mapping[str, str]) -> list[str]:
    """The GPUs this task may use: ``CUDA_VISIBLE_DEVICES`` where set (empty: none), else
    ``nvidia-smi -L``'s (none without it: a CPU host)."""
    if "CUDA_VISIBLE_DEVICES" in environ:
        return [d.strip() for d in environ["CUDA_VISIBLE_DEVICES"].split(",") if d.strip()]
    exe = shutil.which("nvidia-smi")
    if not exe:
        return []
    try:
        out = subprocess.run([exe, "-L"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    return [str(k) for k, line in enumerate(out.splitlines()) if line.startswith("GPU ")]


def assign_gpus(gpus: Sequence[str], replicas: int, per_replica: int,
                task: Task, replicas_per_gpu: int = 1) -> list[list[str]]:
    """``per_replica`` GPUs for each replica: disjoint, or with ``replicas_per_gpu`` M > 1
    shared by M consecutive replicas (replica ``r`` gets group ``r // M``). Several tasks
    on a node that see the same GPUs (torchrun ``--nproc-per-node``) take their local
    rank's share."""
    groups = -(-replicas // replicas_per_gpu)  # ceil
    need = groups * per_replica
    pool = list(gpus)
    if task.local_world > 1 and len(pool) >= need * task.local_world:
        pool = pool[task.local_rank * need:(task.local_rank + 1) * need]
    if len(pool) < need:
        shared = (f" / --replicas-per-gpu {replicas_per_gpu}" if replicas_per_gpu > 1
                  else "")
        raise DataParallelError(
            f"--data-parallel {replicas}{shared} x --gpus-per-replica {per_replica} needs "
            f"{need} GPUs, this task sees {len(pool)} ({', '.join(pool) or 'none'}): lower "
            "--data-parallel, give the task more GPUs (CUDA_VISIBLE_DEVICES), or let "
            "replicas share a GPU (--replicas-per-gpu M: each gets 1/M of its memory)")
    return [pool[(r // replicas_per_gpu) * per_replica:
                 (r // replicas_per_gpu + 1) * per_replica] for r in range(replicas)]


#: speculators 0.3/0.4's offline script: the option that sizes its vLLM generator on the
#: GPU (``LLM(gpu_memory_utilization=...)``: the share of the GPU's memory one engine may
#: take, weights, activations and KV cache together) and its argparse default.
GPU_MEMORY_OPTION = "--gpu-memory-utilization"
SCRIPT_GPU_MEMORY = 0.8


def shared_gpu_args(args: Sequence[str], replicas_per_gpu: int) -> list[str]:
    """The script's arguments for a replica that shares its GPUs with
    ``replicas_per_gpu - 1`` others: the user's ``--gpu-memory-utilization`` (a share per
    replica) if given, else the script's default divided among the replicas of a GPU.
    Unchanged with one replica per GPU."""
    if replicas_per_gpu == 1:
        return list(args)
    given = option(args, GPU_MEMORY_OPTION)
    if given is None:
        share = SCRIPT_GPU_MEMORY / replicas_per_gpu
        return with_option(args, GPU_MEMORY_OPTION, f"{share:.4g}")
    try:
        value = float(given)
    except ValueError as exc:
        raise DataParallelError(f"{GPU_MEMORY_OPTION} {given!r} is not a number") from exc
    if not 0 < value * replicas_per_gpu <= 1:
        raise DataParallelError(
            f"{GPU_MEMORY_OPTION} {given} is each replica's share of its GPU's memory: "
            f"{replicas_per_gpu} replicas per GPU x {given} = {value * replicas_per_gpu:.3g} "
            f"of the GPU; pass at most {1 / replicas_per_gpu:.3g} (or leave it out: "
            f"{SCRIPT_GPU_MEMORY} / {replicas_per_gpu} = "
            f"{SCRIPT_GPU_MEMORY / replicas_per_gpu:.3g} each)")
    return list(args)


def assign_cores(cores: Sequence[int], replicas: int) -> list[str] | None:
    """``VLLM_CPU_OMP_THREADS_BIND`` for each replica on a CPU host: disjoint cores
    (``None`` where there are fewer cores than replicas)."""
    cores = sorted(cores)
    if len(cores) < replicas:
        return None
    return [",".join(map(str, cores[a:b])) for a, b in split(0, len(cores), replicas)]


# --------------------------------------------------------------------------------------
# The script's options
# --------------------------------------------------------------------------------------


def option(args: Sequence[str], name: str) -> str | None:
    """The value of ``name`` in ``args`` (``--x v`` or ``--x=v``; the last one wins, as
    argparse does)."""
    value = None
    for k, a in enumerate(args):
        if a == name and k + 1 < len(args):
            value = args[k + 1]
        elif a.startswith(name + "="):
            value = a.partition("=")[2]
    return value


def with_option(args: Sequence[str], name: str, value: str) -> list[str]:
    """``args`` with every ``name`` option removed and ``name value`` appended."""
    out: list[str] = []
    skip = False
    for a in args:
        if skip:
            skip = False
        elif a == name:
            skip = True
        elif not a.startswith(name + "="):
            out.append(a)
    return [*out, name, value]


# --------------------------------------------------------------------------------------
# The output folder
# --------------------------------------------------------------------------------------


def whole(path: str) -> bool:
    """Whether ``path`` is a complete ``torch.save`` file: a zip archive whose end record
    is there (written last; a file cut off by a crash has none)."""
    try:
        return os.path.getsize(path) > 0 and zipfile.is_zipfile(path)
    except OSError:
        return False


def data_files(out: str) -> dict[int, str]:
    """``data_<i>.pt`` names in ``out`` by index."""
    found: dict[int, str] = {}
    if os.path.isdir(out):
        for entry in os.scandir(out):
            m = DATA_NAME.match(entry.name)
            if m and entry.is_file():
                found[int(m.group(1))] = entry.path
    return found


def missing(out: str, a: int, b: int, files: Mapping[int, str] | None = None
            ) -> tuple[list[int], list[int]]:
    """``(absent, incomplete)`` indices of ``[a, b)`` in ``out``."""
    files = data_files(out) if files is None else files
    absent = [i for i in range(a, b) if i not in files]
    present = [i for i in range(a, b) if i in files]
    if len(present) < 256:
        verdicts = [whole(files[i]) for i in present]
    else:  # a resumed run of millions of files on a network filesystem: reads overlap
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(max_workers=16) as pool:
            verdicts = list(pool.map(whole, (files[i] for i in present), chunksize=64))
    return absent, [i for i, ok in zip(present, verdicts) if not ok]


def _read_json(path: str) -> Any:
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def _saved_log(path: str) -> dict[int, int]:
    """``index -> tokens`` from a replica's saved-samples log (last line of an index wins)."""
    out: dict[int, int] = {}
    try:
        with open(path, encoding="utf-8") as f:
            for line in f:
                parts = line.split()
                if len(parts) >= 2 and parts[0].isdigit() and parts[1].isdigit():
                    out[int(parts[0])] = int(parts[1])
    except OSError:
        pass
    return out


def _tokens_in_file(path: str) -> int:
    import torch

    return int(torch.load(path, map_location="cpu", mmap=True, weights_only=True)
               ["input_ids"].shape[0])


def merge(out: str, start: int, samples: int, command: str,
          report_file: str | None = None) -> list[str]:
    """Write the metadata one run writes into ``out`` from the work folder's records
    (see the module docstring); returns the files written."""
    work = os.path.join(out, WORK)
    records = []
    if os.path.isdir(work):
        for name in sorted(os.listdir(work)):
            if name.startswith("done-") and name.endswith(".json"):
                rec = _read_json(os.path.join(work, name))
                if isinstance(rec, dict):
                    records.append(rec)
    written: list[str] = []
    lengths_path = os.path.join(out, SAMPLE_LENGTHS_FILE)
    existing = _read_json(lengths_path)
    if any(r.get("sample_lengths") is not None for r in records) or isinstance(existing, dict):
        lengths: dict[int, int] = {}
        if isinstance(existing, dict):
            lengths.update({int(k): v for k, v in existing.items() if str(k).isdigit()})
        if os.path.isdir(work):
            for name in sorted(os.listdir(work)):
                if name.startswith("saved-") and name.endswith(".log"):
                    lengths.update(_saved_log(os.path.join(work, name)))
        for r in sorted(records, key=lambda r: r.get("finished", 0)):
            lengths.update({int(k): v for k, v in (r.get("sample_lengths") or {}).items()})
        for i in range(start, start + samples):
            if i not in lengths:
                lengths[i] = _tokens_in_file(os.path.join(out, f"data_{i}.pt"))
        write_text_atomic(lengths_path, json.dumps({str(i): lengths[i] for i in sorted(lengths)},
                                                   indent=2))
        written.append(SAMPLE_LENGTHS_FILE)
    configs = [r for r in records if isinstance(r.get("data_config"), dict)]
    if configs:
        latest = max(configs, key=lambda r: str(r["data_config"].get("generated_at", "")))
        config = json.loads(json.dumps(latest["data_config"]))
        if isinstance(config.get("reproducibility"), dict):
            config["reproducibility"]["command"] = command
        if isinstance(config.get("data"), dict):
            config["data"]["num_samples"] = samples
        write_text_atomic(os.path.join(out, dl.DATA_CONFIG_FILE), json.dumps(config, indent=2))
        written.append(dl.DATA_CONFIG_FILE)
    reports = [r for r in records if isinstance(r.get("report"), dict)]
    if report_file and reports:
        latest = max(reports, key=lambda r: r.get("finished", 0))
        folder = os.path.dirname(os.path.abspath(report_file))
        os.makedirs(folder, exist_ok=True)
        write_text_atomic(report_file, json.dumps(latest["report"], indent=2))
        written.append(report_file)
        layer_docs = [r["layers"] for r in records if isinstance(r.get("layers"), dict)]
        generators = [g for doc in layer_docs for g in doc.get("generators") or []]
        distinct: list[dict] = []
        for g in generators:  # one record per distinct capture, as one run writes
            key = (g.get("model"), g.get("layer_ids"), g.get("num_hidden_layers"))
            if all((d.get("model"), d.get("layer_ids"), d.get("num_hidden_layers")) != key
                   for d in distinct):
                distinct.append(g)
        if distinct:
            written.append(dl.write_layers_file(folder, distinct,
                                                layer_docs[0].get("speculators_compat")))
    return written


def clean(out: str) -> None:
    """Remove the work folder and temporaries of killed saves (no writer is left)."""
    shutil.rmtree(os.path.join(out, WORK), ignore_errors=True)
    for entry in os.scandir(out):
        if TEMPORARY.match(entry.name):
            try:
                os.unlink(entry.path)
            except OSError:
                pass


# --------------------------------------------------------------------------------------
# Replicas
# --------------------------------------------------------------------------------------


@dataclass
class Replica:
    """One replica of this task: its block, devices and the ranges left to generate."""

    index: int  # global replica number
    block: tuple[int, int]
    todo: list[tuple[int, int]]
    env: dict[str, str]
    devices: str
    proc: subprocess.Popen | None = None
    current: tuple[int, int] | None = None
    log: TextIO | None = None
    rc: int | None = None
    failed_range: tuple[int, int] | None = None
    saved: int = 0  # samples saved by this launch
    first_save: float | None = None
    last_save: float | None = None
    done_ranges: list[tuple[int, int]] = field(default_factory=list)
    started: float = 0.0
    note: str = ""
    #: The replica of this task that shares this one's GPUs and starts before it; this
    #: one starts once that one's engine holds its memory (:meth:`Launch.may_start`).
    after: Replica | None = None
    launched: bool = False

    @property
    def total(self) -> int:
        return sum(b - a for a, b in self.todo) + sum(b - a for a, b in self.done_ranges) + (
            self.current[1] - self.current[0] if self.current else 0) + (
            self.failed_range[1] - self.failed_range[0] if self.failed_range else 0)


class Launch:
    """This task's replicas, from the count to the merge."""

    def __init__(self, script: str, args: Sequence[str], replicas: int, gpus_per_replica: int,
                 indices: tuple[int, int] | None, task: Task, environ: Mapping[str, str],
                 stream: TextIO, replicas_per_gpu: int = 1) -> None:
        self.script = os.path.abspath(script)
        self.args = list(args)
        self.replicas = replicas
        self.per = gpus_per_replica
        self.per_gpu = replicas_per_gpu
        self.indices = indices
        self.task = task
        self.environ = dict(environ)
        self.stream = stream
        out = option(self.args, "--output-dir")
        if not out:
            raise DataParallelError(
                "--data-parallel: the script's command has no --output-dir: it runs "
                "speculators' offline script (scripts/data_generation_offline.py), whose "
                "--output-dir is where the replicas write")
        self.out = os.path.abspath(out)
        self.work = os.path.join(self.out, WORK)
        start = option(self.args, "--start-idx")
        try:
            self.start = int(start) if start is not None else 0
        except ValueError as exc:
            raise DataParallelError(f"--start-idx {start!r} is not a number") from exc
        tp = option(self.args, "--tensor-parallel-size")
        if tp is not None and tp.isdigit() and int(tp) != gpus_per_replica and self.gpus():
            raise DataParallelError(
                f"the script's --tensor-parallel-size {tp} and --gpus-per-replica "
                f"{gpus_per_replica} differ: each replica's generator uses the GPUs it is "
                "given; pass the same number to both (or drop --tensor-parallel-size)")
        if replicas_per_gpu > 1 and not self.gpus():
            raise DataParallelError(
                f"--replicas-per-gpu {replicas_per_gpu}: this task sees no GPU "
                "(CUDA_VISIBLE_DEVICES, nvidia-smi); on a CPU host the replicas split the "
                "cores by themselves: leave the option out")
        #: what each replica's script gets (its share of a shared GPU's memory)
        self.replica_args = shared_gpu_args(self.args, replicas_per_gpu)
        self.report_file = self.environ.get(_env.REPORT_FILE) or None
        self.progress_s = float(self.environ.get(_env.DATA_PARALLEL_PROGRESS_S, PROGRESS_S))

    # ---------------------------------------------------------------- small helpers
    def say(self, text: str) -> None:
        prefix = "[dp]" if self.task.world == 1 else f"[dp {self.task.rank}/{self.task.world}]"
        print(f"{prefix} {text}", file=self.stream, flush=True)

    def gpus(self) -> list[str]:
        if not hasattr(self, "_gpus"):
            self._gpus = visible_gpus(self.environ)
        return self._gpus

    def one_run_command(self) -> str:
        """What ``reproducibility.command`` says after one run of the user's command."""
        return " ".join([os.path.basename(self.script), *self.args])

    def child_cmd(self, args: Sequence[str]) -> list[str]:
        return [sys.executable, "-m", "speculators_compat", "run", self.script, *args]

    def base_env(self) -> dict[str, str]:
        env = {k: v for k, v in self.environ.items() if k not in LAUNCHER_VARS}
        env.pop(_env.ACTIVE, None)
        env["PYTHONUNBUFFERED"] = "1"
        return env

    # ---------------------------------------------------------------- 1. count
    def count(self) -> int:
        data = option(self.args, "--train-data-path")
        stat = None
        if data and os.path.isfile(data):
            st = os.stat(data)
            stat = [st.st_size, st.st_mtime_ns]
        key = {"script": self.script, "args": self.args, "cwd": os.getcwd(), "data": stat}
        cache = os.path.join(self.work, "samples.json")
        known = _read_json(cache)
        if isinstance(known, dict) and known.get("key") == key and isinstance(
                known.get("samples"), int):
            return known["samples"]
        os.makedirs(self.work, exist_ok=True)
        count_file = os.path.join(self.work, f"count-{self.task.rank}.json")
        log_path = os.path.join(self.work, f"count-{self.task.rank}.log")
        env = self.base_env()
        env[ENV] = json.dumps({"mode": "count", "count_file": count_file})
        self.say(f"counting the script's samples (speculators' preprocessing; log {log_path})")
        try:
            os.unlink(count_file)
        except OSError:
            pass
        with open(log_path, "w") as log:
            rc = subprocess.run(self.child_cmd(self.args), env=env, stdout=log,
                                stderr=subprocess.STDOUT).returncode
        result = _read_json(count_file)
        if rc != 0 or not isinstance(result, dict):
            tail = _tail(log_path)
            raise DataParallelError(
                f"the script did not get through preprocessing (exit {rc}); its output "
                f"({log_path}) ends:\n{tail}")
        samples = int(result["samples"])
        write_text_atomic(cache, json.dumps({"key": key, "samples": samples}) + "\n")
        return samples

    # ---------------------------------------------------------------- 2. plan
    def plan(self, samples: int) -> list[Replica]:
        total = self.task.world * self.replicas
        lo, hi = self.start, self.start + samples
        if self.indices is not None:
            lo, hi = max(lo, self.indices[0]), min(hi, self.indices[1])
        blocks = split(lo, max(0, hi - lo), total)
        mine = range(self.task.rank * self.replicas, (self.task.rank + 1) * self.replicas)
        files = data_files(self.out)
        if self.gpus():
            devices = [",".join(d) for d in assign_gpus(self.gpus(), self.replicas, self.per,
                                                        self.task, self.per_gpu)]
        else:
            cores = assign_cores(sorted(os.sched_getaffinity(0)), self.replicas) \
                if hasattr(os, "sched_getaffinity") else None
            bind = self.environ.get("VLLM_CPU_OMP_THREADS_BIND", "auto")
            tp = option(self.args, "--tensor-parallel-size")
            if cores is None or bind != "auto" or (tp not in (None, "1")):
                cores = None
            devices = [f"cores {c}" if cores else "CPU" for c in (cores or
                                                                   [""] * self.replicas)]
        out = []
        for local, g in enumerate(mine):
            a, b = blocks[g]
            absent, incomplete = missing(self.out, a, b, files)
            env = self.base_env()
            if self.gpus():
                env["CUDA_VISIBLE_DEVICES"] = devices[local]
            elif devices[local].startswith("cores "):
                env["VLLM_CPU_OMP_THREADS_BIND"] = devices[local][len("cores "):]
            rep = Replica(g, (a, b), runs([*absent, *incomplete]), env,
                          ("GPU " + devices[local]) if self.gpus() else devices[local])
            if incomplete:
                rep.note = (f"{len(incomplete)} incomplete file(s) regenerated: "
                            f"{_compress(incomplete)}")
            if self.per_gpu > 1 and out and out[-1].devices == rep.devices:
                rep.after = out[-1]
                share = option(self.replica_args, GPU_MEMORY_OPTION)
                rep.note = "; ".join(filter(None, [rep.note, (
                    f"shares its GPU with replica {rep.after.index} ({GPU_MEMORY_OPTION} "
                    f"{share} each); starts once that one's engine holds its memory")]))
            out.append(rep)
        return out

    def may_start(self, rep: Replica) -> bool:
        """Whether ``rep`` (work left, not started) may start now: at once, or, sharing
        its GPUs, once the replica before it on them has saved a sample or ended (vLLM sizes
        its KV cache from the GPU's free memory before and after its profiling run, so a
        neighbour loading at the same time counts as its own use: a smaller cache, or no
        room at all)."""
        prev = rep.after
        if prev is None:
            return True
        if prev.saved > 0:
            return True
        if prev.launched:
            return prev.proc is None
        return not prev.todo and prev.current is None  # nothing to run: never starts

    # ---------------------------------------------------------------- 3. run
    def start_next(self, rep: Replica) -> None:
        a, b = rep.todo.pop(0)
        rep.current = (a, b)
        scratch = os.path.join(self.work, f"range-{a}-{b}")
        shutil.rmtree(scratch, ignore_errors=True)
        os.makedirs(scratch)
        if a > 0:  # the script resumes after the highest data_<i>.pt: at a
            open(os.path.join(scratch, f"data_{a - 1}.pt"), "wb").close()
        saved_log = os.path.join(self.work, f"saved-{a}-{b}.log")
        open(saved_log, "w").close()
        env = dict(rep.env)
        env[ENV] = json.dumps({"mode": "range", "out": self.out, "scratch": scratch,
                               "stop": b - self.start, "samples": self.samples,
                               "log": saved_log})
        env[_env.REPORT_FILE] = os.path.join(scratch, "compat-report.json")
        args = with_option(self.replica_args, "--output-dir", scratch)
        args = with_option(args, "--token-freq-path", os.path.join(scratch, "token_freq.pt"))
        if rep.log is None:
            rep.log = open(self.replica_log(rep), "a")  # noqa: SIM115 (closed by run())
        rep.log.write(f"\n==== speculators-compat data-parallel: replica {rep.index}, "
                      f"data_{a}..data_{b - 1}: {shlex.join(self.child_cmd(args))}\n")
        rep.log.flush()
        rep.saved_offset = 0  # type: ignore[attr-defined]
        rep.proc = subprocess.Popen(self.child_cmd(args), env=env, stdout=rep.log,
                                    stderr=subprocess.STDOUT, start_new_session=True)
        # its process group, for a user (or a test) who stops one replica
        write_text_atomic(os.path.join(self.work, f"replica-{rep.index}.pid"),
                          f"{rep.proc.pid}\n")

    def replica_log(self, rep: Replica) -> str:
        return os.path.join(self.work, f"replica-{rep.index}.log")

    def poll_saved(self, rep: Replica) -> None:
        if rep.current is None:
            return
        a, b = rep.current
        path = os.path.join(self.work, f"saved-{a}-{b}.log")
        try:
            with open(path, encoding="utf-8") as f:
                f.seek(getattr(rep, "saved_offset", 0))
                chunk = f.read()
        except OSError:
            return
        end = chunk.rfind("\n") + 1
        rep.saved_offset = getattr(rep, "saved_offset", 0) + len(  # type: ignore[attr-defined]
            chunk[:end].encode())
        for line in chunk[:end].splitlines():
            parts = line.split()
            if len(parts) >= 3:
                rep.saved += 1
                when = float(parts[2])
                rep.first_save = rep.first_save or when
                rep.last_save = when

    def finish(self, rep: Replica) -> None:
        """The current range's process ended: record it (or the failure)."""
        assert rep.proc is not None and rep.current is not None
        rc = rep.proc.returncode
        self.poll_saved(rep)
        a, b = rep.current
        scratch = os.path.join(self.work, f"range-{a}-{b}")
        if rc == 0:
            absent, _ = missing(self.out, a, b)
            if absent:
                rc = -1
                rep.log.write(f"speculators-compat: the script exited 0 but "  # type: ignore
                              f"data_<i>.pt of {_compress(absent)} are missing\n")
        if rc != 0:
            rep.rc = rc
            rep.failed_range = rep.current
            rep.current = None
            rep.todo.clear()
            return
        record = {"range": [a, b], "replica": rep.index, "finished": time.time(),
                  "sample_lengths": _read_json(os.path.join(scratch, SAMPLE_LENGTHS_FILE)),
                  "data_config": _read_json(os.path.join(scratch, dl.DATA_CONFIG_FILE)),
                  "report": _read_json(os.path.join(scratch, "compat-report.json")),
                  "layers": _read_json(os.path.join(scratch, dl.LAYERS_FILE))}
        write_text_atomic(os.path.join(self.work, f"done-{a}-{b}.json"), json.dumps(record))
        shutil.rmtree(scratch, ignore_errors=True)
        rep.done_ranges.append((a, b))
        rep.current = None
        rep.proc = None

    def progress(self, reps: Sequence[Replica], now: float) -> None:
        for rep in reps:
            a, b = rep.block
            have = rep.block[1] - rep.block[0] - rep.total + rep.saved
            state = ("done" if rep.current is None and not rep.todo and rep.rc is None else
                     f"FAILED (exit {rep.rc})" if rep.rc is not None else
                     f"waiting for replica {rep.after.index}'s engine"
                     if rep.after is not None and not rep.launched else "running")
            rate = eta = ""
            # over the replica's whole time (engine start included): an honest ETA early
            end = now if state == "running" else (rep.last_save or now)
            if rep.saved and end > rep.started:
                per_s = rep.saved / (end - rep.started)
                rate = f", {per_s:.2f} samples/s"
                left = rep.total - rep.saved
                if state == "running" and per_s > 0:
                    eta = f", ETA {_duration(left / per_s)}"
            self.say(f"replica {rep.index} ({rep.devices}) data_{a}..data_{b - 1}: "
                     f"{have}/{b - a} samples{rate}{eta} [{state}]")

    def resume_command(self, rep: Replica) -> str:
        a, b = rep.failed_range or rep.block
        prefix = f"CUDA_VISIBLE_DEVICES={rep.env['CUDA_VISIBLE_DEVICES']} " \
            if self.gpus() else ""
        flags = ["--data-parallel", "1", "--world-size", "1", "--rank", "0",
                 "--indices", f"{a}:{rep.block[1]}"]
        if self.per != 1:
            flags += ["--gpus-per-replica", str(self.per)]
        return prefix + shlex.join(["speculators-compat", "run", *flags, self.script,
                                    *self.args])

    def stop_all(self, reps: Sequence[Replica]) -> None:
        for rep in reps:
            if rep.proc is not None and rep.proc.poll() is None:
                try:
                    os.killpg(rep.proc.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
        deadline = time.time() + 20
        for rep in reps:
            if rep.proc is None:
                continue
            try:
                rep.proc.wait(timeout=max(0.1, deadline - time.time()))
            except subprocess.TimeoutExpired:
                pass
            try:
                os.killpg(rep.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            rep.proc.wait()

    # ---------------------------------------------------------------- all of it
    def run(self) -> int:
        t0 = time.time()
        self.samples = self.count()
        lo, hi = self.start, self.start + self.samples
        reps = self.plan(self.samples)
        todo = sum(b - a for r in reps for a, b in r.todo)
        self.say(f"{self.samples} samples (data_{lo}..data_{hi - 1}) in {self.out}; "
                 f"task {self.task.rank} of {self.task.world} ({self.task.source}), "
                 f"{len(reps)} replica(s) here, {todo} sample(s) to generate")
        for rep in reps:
            a, b = rep.block
            what = ", ".join(f"data_{x}..data_{y - 1}" for x, y in rep.todo) or "nothing"
            self.say(f"replica {rep.index} ({rep.devices}) block data_{a}..data_{b - 1}: "
                     f"generates {what}" + (f"; {rep.note}" if rep.note else ""))
        interrupted = None

        def on_term(signum, _frame):  # SLURM's time limit, a kill of the job
            raise KeyboardInterrupt(signal.Signals(signum).name)

        old = signal.signal(signal.SIGTERM, on_term)
        try:
            pending = [rep for rep in reps if rep.todo]

            def start_ready() -> None:
                for rep in list(pending):
                    if self.may_start(rep):
                        pending.remove(rep)
                        rep.started, rep.launched = time.time(), True
                        self.start_next(rep)

            start_ready()
            last = time.time()
            while pending or any(r.proc is not None for r in reps):
                time.sleep(0.5)
                for rep in reps:
                    self.poll_saved(rep)
                    if rep.proc is not None and rep.proc.poll() is not None:
                        self.finish(rep)
                        if rep.todo:
                            self.start_next(rep)
                        else:
                            rep.proc = None
                start_ready()
                if time.time() - last >= self.progress_s:
                    last = time.time()
                    self.progress(reps, last)
        except KeyboardInterrupt as exc:
            interrupted = str(exc) or "SIGINT"
            self.stop_all(reps)
            for rep in reps:
                if rep.current is None and rep.todo and not rep.launched:  # never started
                    rep.current = rep.todo[0]
                    rep.proc = None
                if rep.current is not None:
                    rep.rc = rep.proc.returncode if rep.proc else -1
                    rep.failed_range = rep.current
                    rep.current = None
                    rep.todo.clear()
        finally:
            signal.signal(signal.SIGTERM, old)
            for rep in reps:
                if rep.log is not None:
                    rep.log.close()
        self.progress(reps, time.time())
        return self.summary(reps, time.time() - t0, interrupted)

    def summary(self, reps: Sequence[Replica], seconds: float, interrupted: str | None) -> int:
        generated = sum(r.saved for r in reps)
        failed = [r for r in reps if r.rc is not None]
        self.say(f"{generated} sample(s) generated in {_duration(seconds)} by "
                 f"{len(reps)} replica(s)" + (f"; interrupted ({interrupted})"
                                              if interrupted else ""))
        for rep in failed:
            a, b = rep.failed_range or rep.block
            self.say(f"replica {rep.index} ({rep.devices}) FAILED (exit {rep.rc}) in "
                     f"data_{a}..data_{b - 1} of its block data_{rep.block[0]}.."
                     f"data_{rep.block[1] - 1}; log {self.replica_log(rep)}, ending:")
            for line in _tail(self.replica_log(rep), 12).splitlines():
                self.say(f"    {line}")
            self.say(f"  resume it alone: {self.resume_command(rep)}")
        if failed:
            self.say("or run the same command again: every replica generates only the "
                     "samples its block lacks (a file that exists is whole)")
            return 1
        files = data_files(self.out)
        lo, hi = self.start, self.start + self.samples
        absent = [i for i in range(lo, hi) if i not in files]
        if absent:
            self.say(f"{hi - lo - len(absent)}/{hi - lo} samples present: waiting on other "
                     f"tasks ({_compress(absent)}); the task that completes the set merges "
                     "the metadata")
            return 0
        written = merge(self.out, lo, self.samples, self.one_run_command(), self.report_file)
        clean(self.out)
        self.say(f"all {hi - lo} samples present in {self.out}" +
                 (f"; wrote {', '.join(written)}" if written else ""))
        return 0


def _compress(indices: Sequence[int], limit: int = 6) -> str:
    parts = [f"{a}" if b == a + 1 else f"{a}-{b - 1}" for a, b in runs(indices)]
    return ", ".join(parts[:limit]) + (f" and {len(parts) - limit} more ranges"
                                       if len(parts) > limit else "")


def _duration(seconds: float) -> str:
    seconds = int(round(seconds))
    if seconds < 120:
        return f"{seconds}s"
    if seconds < 7200:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


def _tail(path: str, lines: int = 20) -> str:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return "\n".join(f.read().splitlines()[-lines:])
    except OSError:
        return "(no output)"


def plain_run_gaps(args: Sequence[str]) -> str | None:
    """For a plain ``run`` of the offline script: the indices below the highest
    ``data_<i>.pt`` of its ``--output-dir`` that have no file (its own resume starts
    after the highest, so they would stay missing), as a warning; ``None`` if none."""
    out = option(args, "--output-dir")
    if not out or not os.path.isdir(out):
        return None
    files = data_files(out)
    start = option(args, "--start-idx")
    start = int(start) if start and start.isdigit() else 0
    if not files:
        return None
    top = max(files)
    gaps = [i for i in range(start, top) if i not in files]
    if not gaps:
        return None
    return (f"{out}: {len(gaps)} sample(s) below the highest file data_{top}.pt have no file "
            f"({_compress(gaps)}); the script resumes after data_{top}.pt, so they stay "
            "missing. `speculators-compat run --data-parallel 1` with the same arguments "
            "generates exactly the missing samples")


def parse_indices(text: str) -> tuple[int, int]:
    """``A:B`` -> ``(A, B)``, the file indices ``[A, B)``."""
    a, sep, b = text.partition(":")
    if not sep or not a.strip().isdigit() or not b.strip().isdigit() or int(a) >= int(b):
        raise DataParallelError(f"--indices {text!r}: expected A:B with A < B (file indices "
                                "data_A..data_<B-1>)")
    return int(a), int(b)


def main(script: str, args: Sequence[str], replicas: int, gpus_per_replica: int = 1,
         indices: str | None = None, rank: int | None = None, world: int | None = None,
         environ: Mapping[str, str] | None = None, stream: TextIO | None = None,
         replicas_per_gpu: int = 1) -> int:
    """``speculators-compat run --data-parallel``: returns the exit status."""
    stream = stream or sys.stderr
    environ = os.environ if environ is None else environ
    try:
        if not os.path.isfile(script):
            raise DataParallelError(f"{script}: no such file (--data-parallel runs a script: "
                                    "speculators' scripts/data_generation_offline.py)")
        task = detect_task(environ, rank, world)
        launch = Launch(script, args, replicas, gpus_per_replica,
                        parse_indices(indices) if indices else None, task, environ, stream,
                        replicas_per_gpu)
        return launch.run()
    except DataParallelError as exc:
        print(f"speculators-compat run --data-parallel: {exc}", file=stream)
        return 2
