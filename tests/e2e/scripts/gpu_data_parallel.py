"""Wall time of ``speculators-compat run --data-parallel`` on one device, and whether the
replicas' files equal one run's: speculators' unchanged offline script
(``scripts/data_generation_offline.py``), real vLLM.

Runs, on the same samples (each in its own folder, the same relative ``--output-dir``, so
their commands read the same):

- (a) ``speculators-compat run SCRIPT ...``: one run (388 samples on a GPU, 10 on a CPU:
  not a multiple of twice the batch size 8, so the second replica's batches hold other
  samples than one run's);
- (b) ``speculators-compat run --data-parallel 2 [--replicas-per-gpu 2] SCRIPT ...``: two
  replicas; on a GPU both on the one GPU with half the script's default memory share each
  (``--gpu-memory-utilization`` 0.4), on a CPU host on disjoint cores (the launcher's core
  split; ``--replicas-per-gpu`` is for GPUs);
- (c), (d): (a) and (b) with ``SPECULATORS_COMPAT_BATCH_INVARIANT=1`` (GPU only: vLLM's
  batch-invariant kernels are CUDA kernels, and the option is refused on a CPU build).

Reported per run: wall time (the command's, start-up, the launcher's count pass and the
second replica's wait for the first one's engine included), samples/s over it, the
launcher's own summary lines; the ratios (b)/(a) and (d)/(c). Compared file by file (the
same ``data_<i>.pt`` names, ``sample_lengths.json``): (c) and (d) must be bit-identical
(``torch.equal`` on every tensor); (a) and (b) must have equal ``input_ids`` and loss masks
and hidden states within bf16 noise (minimum per-token cosine >= :data:`MIN_COSINE`; the
largest absolute difference is reported). Every run's folder must pass
``speculators-compat check-data``. A run that fails or passes its timeout has its log's
end recorded and the next run goes on; a run's files are removed once compared (disk).

Model: a random-weight Llama checkpoint built by
:func:`speculators_compat.demo.checkpoints.build_fast_checkpoint` (``--shape``: ``1b``,
Llama-3.2-1B's shape, the GPU default; ``8b``, Llama-3-8B's, in ``/root/gpu-bench/ckpt``
where ``benchmarks/gpu/offline_script_bench.py`` builds and reuses it; ``tiny`` on CPU), with
the word-level tokenizer and ChatML template of the offline-script bench; data: that
bench's seeded ShareGPT-style ``.jsonl`` (``offline_script_bench.conversations``). No
network.

Device (``tools/gpu/gpu_data_parallel.sh`` does it after the kit's preamble)::

    python3 tests/e2e/scripts/gpu_data_parallel.py --device gpu --out $OUT \\
        --work /root/gpu-dp --site /root/site --spec 0.4.0.1=/root/spec-0.4.0.1

CPU (tiny model, 10 samples, (a) and (b) only)::

    .envs/vllm-0.32.0/bin/python tests/e2e/scripts/gpu_data_parallel.py --device cpu \\
        --out /tmp/dp-out --work /tmp/dp-work --spec 0.4.0.1=.envs/speculators-0.4.0.1

Writes ``<out>/data_parallel.json`` (rewritten after every step) and prints a summary.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
BENCH = ROOT / "benchmarks" / "gpu"
sys.path.insert(0, str(BENCH))

import gpu_bench  # noqa: E402  (its model shapes; imports no torch)
from offline_script_bench import _machine, _run, conversations, write_jsonl  # noqa: E402

SCRIPT = "scripts/data_generation_offline.py"
UPSTREAM = ROOT / "tests" / "e2e" / "scripts" / "upstream"
LOG_TAIL = 4000
#: (a) vs (b) without batch invariance: minimum per-token cosine of one sample's states
#: computed in other batches (tests/e2e/test_data_parallel.py's bound).
MIN_COSINE = 0.999
#: Llama-3.2-1B's shape (weights random): an engine start of a few seconds' weights.
LLAMA32_1B = {"hidden_size": 2048, "intermediate_size": 8192, "num_hidden_layers": 16,
              "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 64,
              "vocab_size": 128256, "max_position_embeddings": 8192,
              "rope_parameters": {"rope_type": "default", "rope_theta": 500000.0}}
SHAPES = {"tiny": (gpu_bench.TINY, [1, 3, 5]), "1b": (LLAMA32_1B, [2, 8, 14, 15]),
          "8b": (gpu_bench.LLAMA3_8B, [2, 16, 29, 31])}
#: (name, replicas, batch invariant)
RUNS = [("a", 1, False), ("b", 2, False), ("c", 1, True), ("d", 2, True)]


# ----------------------------------------------------------------------------- children
def build_child(params: str) -> None:
    p = json.loads(Path(params).read_text())
    import torch

    from speculators_compat.demo.checkpoints import build_fast_checkpoint

    device = "cuda" if torch.cuda.is_available() else "cpu"
    t = time.perf_counter()
    path = build_fast_checkpoint("llama", p["ckpt"], device=device, **p["model_config"])
    Path(p["result"]).write_text(json.dumps({"ok": True, "path": str(path), "device": device,
                                             "seconds": time.perf_counter() - t}))


def _states(obj) -> list:
    hs = obj.get("hidden_states")
    return list(hs) if isinstance(hs, (list, tuple)) else ([hs] if hs is not None else [])


def compare_child(params: str) -> None:
    """Two runs' folders file by file: names, ``sample_lengths.json``, every tensor."""
    p = json.loads(Path(params).read_text())
    import torch

    a, b = Path(p["a"]), Path(p["b"])
    res: dict = {"a": str(a), "b": str(b)}
    names_a = sorted(x.name for x in a.glob("data_*.pt"))
    names_b = sorted(x.name for x in b.glob("data_*.pt"))
    res.update(files_a=len(names_a), files_b=len(names_b), same_names=names_a == names_b)
    la, lb = a / "sample_lengths.json", b / "sample_lengths.json"
    if la.exists() or lb.exists():
        res["sample_lengths_equal"] = (la.exists() and lb.exists() and
                                       json.loads(la.read_text()) == json.loads(lb.read_text()))
    bit_identical, ids_equal, max_abs, min_cos, differing = True, True, 0.0, 1.0, []
    for name in sorted(set(names_a) & set(names_b)):
        x = torch.load(a / name, map_location="cpu", weights_only=True)
        y = torch.load(b / name, map_location="cpu", weights_only=True)
        same = set(x) == set(y)
        for key in sorted(set(x) & set(y)):
            if key == "hidden_states":
                continue
            if isinstance(x[key], torch.Tensor) and isinstance(y[key], torch.Tensor):
                eq = x[key].shape == y[key].shape and torch.equal(x[key], y[key])
                same &= eq
                ids_equal &= eq
        sx, sy = _states(x), _states(y)
        if len(sx) != len(sy):
            same = ids_equal = False
        for u, v in zip(sx, sy):
            if u.shape != v.shape:
                same = ids_equal = False
                continue
            if not torch.equal(u, v):
                same = False
                uf, vf = u.float(), v.float()
                max_abs = max(max_abs, float((uf - vf).abs().max()))
                cos = torch.nn.functional.cosine_similarity(
                    uf.reshape(-1, uf.shape[-1]), vf.reshape(-1, vf.shape[-1]), dim=-1)
                min_cos = min(min_cos, float(cos.min()))
        if not same:
            differing.append(name)
        bit_identical &= same
    res.update(bit_identical=bit_identical and res["same_names"] and
               res.get("sample_lengths_equal", True),
               input_ids_and_masks_equal=ids_equal, files_differing=len(differing),
               first_differing=differing[:5], max_abs_diff=max_abs, min_cosine=min_cos)
    res["within_bf16_noise"] = (res["same_names"] and ids_equal and min_cos >= MIN_COSINE and
                                res.get("sample_lengths_equal", True))
    Path(p["result"]).write_text(json.dumps(res))


# ------------------------------------------------------------------------------- parent
class DataParallelRuns:
    def __init__(self, a) -> None:
        self.a = a
        self.t0 = time.time()
        self.out, self.work = Path(a.out), Path(a.work)
        self.out.mkdir(parents=True, exist_ok=True)
        self.work.mkdir(parents=True, exist_ok=True)
        self.gpu = a.device == "gpu"
        self.version, self.spec_dir = a.spec
        self.doc: dict = {"kind": "data_parallel", "argv": sys.argv[1:], "device": a.device,
                          "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "runs": {},
                          "compare": {}, "machine": _machine(gpu_bench._nvidia_smi())}

    def save(self) -> None:
        path = self.out / "data_parallel.json"
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.doc, indent=1, default=str))
        os.replace(tmp, path)

    def say(self, text: str) -> None:
        print(f"[{time.time() - self.t0:5.0f}s] {text}", flush=True)

    def remaining(self) -> float:
        return self.a.deadline - (time.time() - self.t0)

    def env(self, invariant: bool = False) -> dict:
        env = dict(os.environ)
        pp = [str(ROOT / "src"), os.path.abspath(self.spec_dir)] + (
            [os.path.abspath(self.a.site)] if self.a.site else [])
        env["PYTHONPATH"] = os.pathsep.join(pp)
        env.update(HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
                   VLLM_NO_USAGE_STATS="1", TOKENIZERS_PARALLELISM="false",
                   SPECULATORS_COMPAT_DP_PROGRESS_S="10")
        for k in ("SPECULATORS_COMPAT_ACTIVE", "SPECULATORS_COMPAT_REPORT_FILE",
                  "SPECULATORS_COMPAT_BATCH_INVARIANT", "SPECULATORS_COMPAT_DATA_PARALLEL"):
            env.pop(k, None)
        if invariant:
            env["SPECULATORS_COMPAT_BATCH_INVARIANT"] = "1"
        if not self.gpu:
            env.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
            env["CUDA_VISIBLE_DEVICES"] = ""
        return env

    def child(self, mode: str, params: dict, name: str, timeout: float) -> dict:
        pfile, rfile = self.work / f"{name}.params.json", self.work / f"{name}.result.json"
        rfile.unlink(missing_ok=True)
        pfile.write_text(json.dumps({**params, "result": str(rfile)}))
        log = self.work / f"{name}.log"
        rc, wall = _run([self.a.python, str(Path(__file__).resolve()), mode, str(pfile)],
                        self.env(), self.work, log, timeout)
        if rfile.exists():
            return {**json.loads(rfile.read_text()), "rc": rc, "wall_s": wall}
        return {"ok": False, "rc": rc, "wall_s": wall,
                "log_tail": log.read_text(errors="replace")[-LOG_TAIL:]}

    def script(self) -> Path:
        if self.a.script:
            return Path(self.a.script)
        kit = ROOT / ".gpu-kit" / "spectests" / self.version / SCRIPT
        return kit if kit.is_file() else (UPSTREAM / f"speculators-{self.version}" /
                                          "data_generation_offline.py")

    def main(self) -> int:
        a = self.a
        shape = a.shape or ("1b" if self.gpu else "tiny")
        model_cfg, layers = SHAPES[shape]
        # not a multiple of 2 x the batch size: replica 1's batches hold other samples than
        # one run's, so the comparison sees different batch compositions
        n = a.samples or (388 if self.gpu else 10)
        lo, hi = (a.min_len, a.max_len) if a.min_len else ((256, 512) if self.gpu else (20, 40))
        ckpt = Path(a.ckpt) if a.ckpt else (
            Path("/root/gpu-bench/ckpt/llama3-8b-shape") if shape == "8b" else
            self.work / "ckpt" / f"llama-{shape}")
        seq_length = 2048 if self.gpu else 512
        self.doc["params"] = {"samples": n, "words": [lo, hi], "shape": shape,
                              "model_config": model_cfg, "layers": layers,
                              "batch_size": a.batch_size, "seq_length": seq_length,
                              "seed": a.seed, "speculators": self.version,
                              "script": str(self.script()), "min_cosine": MIN_COSINE}
        self.save()
        build = self.child("--build", {"ckpt": str(ckpt), "model_config": model_cfg}, "build",
                           min(300, self.remaining()))
        self.doc["build"] = build
        self.save()
        if not build.get("ok"):
            self.say(f"checkpoint build failed: {build.get('log_tail', '')[-800:]}")
            return 1
        self.say(f"checkpoint {build['path']} ({build['seconds']:.0f}s)")
        data = self.work / "conversations.jsonl"
        write_jsonl(data, conversations(n, lo, hi, model_cfg["vocab_size"], a.seed))
        common = ["--target-model-path", build["path"], "--train-data-path", str(data),
                  "--output-dir", "out", "--hf-cache-dir", "hf", "--token-freq-path",
                  "token_freq.pt", "--layer-ids", *map(str, layers), "--batch-size",
                  str(a.batch_size), "--seq-length", str(seq_length),
                  "--tensor-parallel-size", "1", "--max-samples", str(n),
                  "--num-preprocessing-workers", "1"]
        by_name = {r[0]: r for r in RUNS}
        runs = [by_name[x] for x in a.runs if self.gpu or not by_name[x][2]]
        for i, (name, replicas, invariant) in enumerate(runs):
            left = self.remaining() - a.compare_reserve * (1 + (len(runs) - i - 1) // 2)
            if left < a.min_run:
                self.doc["runs"][name] = {"ok": False, "error": "not run: deadline"}
                self.save()
                continue
            self.doc["runs"][name] = self.run_one(name, replicas, invariant, common, n,
                                                  min(a.run_timeout, left))
            self.save()
            pair = {"b": "a", "d": "c"}.get(name)
            if pair in self.doc["runs"]:
                self.compare(pair, name, invariant)
        self.finish()
        return 0 if self.doc["ok"] else 1

    def run_one(self, name: str, replicas: int, invariant: bool, common: list, n: int,
                timeout: float) -> dict:
        folder = self.work / f"run-{name}"
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True)
        launcher = []
        if replicas > 1:
            launcher = ["--data-parallel", str(replicas)]
            if self.gpu:
                launcher += ["--replicas-per-gpu", str(replicas)]
        cmd = [self.a.python, "-m", "speculators_compat", "run", *launcher,
               str(self.script()), *common]
        env = self.env(invariant)
        if self.gpu:
            env.setdefault("CUDA_VISIBLE_DEVICES", "0")
        self.say(f"({name}) {replicas} replica(s){' batch-invariant' if invariant else ''}: "
                 f"{' '.join(cmd[3:3 + len(launcher) + 2])} ...")
        log = folder / "run.log"
        rc, wall = _run(cmd, env, folder, log, timeout)
        text = log.read_text(errors="replace")
        out = folder / "out"
        files = len(list(out.glob("data_*.pt"))) if out.is_dir() else 0
        run = {"replicas": replicas, "replicas_per_gpu": replicas if self.gpu and replicas > 1
               else None, "batch_invariant": invariant, "cmd": cmd[3:], "rc": rc,
               "wall_s": wall, "files": files, "samples_per_s": files / wall if wall else None,
               "output_dir": str(out), "timeout_s": timeout,
               "dp_lines": [ln.split(" ", 1)[1] for ln in text.splitlines()
                            if " [dp" in ln][-12:]}
        run["ok"] = rc == 0 and files == n
        if not run["ok"]:
            run["log_tail"] = text[-LOG_TAIL:]
        else:
            run["check_data"] = self.check_data(out, folder)
            run["ok"] = run["check_data"]["ok"]
        self.say(f"({name}) rc {rc}, {wall:.1f}s, {files}/{n} files, "
                 f"{run['samples_per_s'] or 0:.2f} samples/s, check-data "
                 f"{(run.get('check_data') or {}).get('ok')}")
        return run

    def check_data(self, out: Path, folder: Path) -> dict:
        log = folder / "check-data.log"
        rc, wall = _run([self.a.python, "-m", "speculators_compat", "check-data", str(out)],
                        self.env(), folder, log, max(60, min(300, self.remaining())))
        res = {"ok": rc == 0, "rc": rc, "wall_s": wall}
        if rc != 0:
            res["log_tail"] = log.read_text(errors="replace")[-LOG_TAIL:]
        return res

    def compare(self, first: str, second: str, invariant: bool) -> None:
        ra, rb = self.doc["runs"].get(first, {}), self.doc["runs"].get(second, {})
        key = f"{first}_vs_{second}"
        if not (ra.get("files") and rb.get("files")):
            self.doc["compare"][key] = {"ok": False, "error": "a run has no files"}
        else:
            res = self.child("--compare", {"a": ra["output_dir"], "b": rb["output_dir"]}, key,
                             max(60, min(300, self.remaining())))
            res["required"] = "bit_identical" if invariant else "within_bf16_noise"
            res["ok"] = bool(res.get(res["required"]))
            self.doc["compare"][key] = res
            self.say(f"{key}: {res['required']} {res['ok']} (bit-identical "
                     f"{res.get('bit_identical')}, max abs diff {res.get('max_abs_diff')}, "
                     f"min cosine {res.get('min_cosine')}, {res.get('files_differing')} "
                     "file(s) differ)")
        if ra.get("wall_s") and rb.get("wall_s") and ra.get("ok") and rb.get("ok"):
            self.doc[f"ratio_{second}_over_{first}"] = rb["wall_s"] / ra["wall_s"]
        self.save()
        if not self.a.keep_output:
            for r in (ra, rb):
                if r.get("output_dir"):
                    shutil.rmtree(Path(r["output_dir"]).parent / "out", ignore_errors=True)
                    shutil.rmtree(Path(r["output_dir"]).parent / "hf", ignore_errors=True)

    def finish(self) -> None:
        runs, cmp_ = self.doc["runs"], self.doc["compare"]
        self.doc["wall_s"] = time.time() - self.t0
        self.doc["ok"] = bool(runs) and all(r.get("ok") for r in runs.values()) and bool(
            cmp_) and all(c.get("ok") for c in cmp_.values())
        self.save()
        print("\nrun  replicas  batch-inv  wall s  samples/s  check-data  ok")
        for name, r in runs.items():
            print(f"({name})  {r.get('replicas', '-'):>8}  {str(r.get('batch_invariant', '-')):>9}"
                  f"  {r.get('wall_s') or 0:6.1f}  {r.get('samples_per_s') or 0:9.2f}  "
                  f"{str((r.get('check_data') or {}).get('ok')):>10}  {r.get('ok')}"
                  + (f"  {r['error']}" if r.get("error") else ""))
        for k in ("ratio_b_over_a", "ratio_d_over_c"):
            if k in self.doc:
                print(f"{k}: {self.doc[k]:.3f}")
        for k, c in cmp_.items():
            print(f"{k}: {c.get('required')} -> {c.get('ok')} (max abs diff "
                  f"{c.get('max_abs_diff')}, min cosine {c.get('min_cosine')})")
        print(f"ok: {self.doc['ok']}; {self.out / 'data_parallel.json'}", flush=True)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] in ("--build", "--compare"):
        try:
            (build_child if argv[0] == "--build" else compare_child)(argv[1])
            return 0
        except Exception:
            traceback.print_exc()
            return 1
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", choices=["gpu", "cpu"], default=None,
                   help="default: gpu where nvidia-smi lists one")
    p.add_argument("--out", required=True)
    p.add_argument("--work", required=True)
    p.add_argument("--spec", default=None, metavar="VERSION=PATH",
                   help="the speculators release (default 0.4.0.1=/root/spec-0.4.0.1); "
                        "repeatable, the last one is used")
    p.add_argument("--site", default=None, help="extra PYTHONPATH entry (the GPU kit's)")
    p.add_argument("--script", default=None, help="the offline script (default: the kit's, "
                   "else tests/e2e/scripts/upstream)")
    p.add_argument("--python", default=sys.executable)
    p.add_argument("--shape", choices=sorted(SHAPES), default=None,
                   help="the checkpoint (default 1b on GPU, tiny on CPU)")
    p.add_argument("--ckpt", default=None, help="the checkpoint folder (built if absent)")
    p.add_argument("--samples", type=int, default=None, help="default 388 GPU, 10 CPU")
    p.add_argument("--min-len", type=int, default=None)
    p.add_argument("--max-len", type=int, default=None)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--run-timeout", type=float, default=None,
                   help="seconds per run (default 180 GPU, 900 CPU)")
    p.add_argument("--deadline", type=float, default=None,
                   help="seconds for everything (default 545 GPU, 3000 CPU)")
    p.add_argument("--min-run", type=float, default=60,
                   help="no run starts with fewer seconds left")
    p.add_argument("--compare-reserve", type=float, default=30)
    p.add_argument("--keep-output", action="store_true")
    p.add_argument("--runs", default="a,b,c,d",
                   help="which of (a)..(d), in this order, comma-separated (each pair "
                        "compared once both ran; b after a, d after c)")
    a = p.parse_args(argv)
    if a.device is None:
        a.device = "gpu" if gpu_bench._nvidia_smi() else "cpu"
    gpu = a.device == "gpu"
    a.runs = [r.strip() for r in a.runs.split(",") if r.strip()]
    if not set(a.runs) <= {r[0] for r in RUNS}:
        p.error(f"--runs {','.join(a.runs)}: a, b, c, d")
    a.run_timeout = a.run_timeout or (180 if gpu else 900)
    a.deadline = a.deadline or (545 if gpu else 3000)
    spec = a.spec or "0.4.0.1=/root/spec-0.4.0.1"
    version, sep, path = spec.partition("=")
    if not sep:
        p.error("--spec VERSION=PATH")
    a.spec = (version, path)
    return DataParallelRuns(a).main()


if __name__ == "__main__":
    sys.exit(main())
