"""GPU end-to-end matrix: speculators' unchanged generator on real vLLM (GPU build) via the shim.

Every combination runs in its own process (a fresh interpreter; ``PYTHONPATH`` selects the
speculators release), builds the generator once and extracts hidden states for batches of
1, 11 and 33 mixed-length sequences; every returned layer is compared with a bf16
transformers forward (``speculators_compat.demo.runner.run_check``). Axes:

- speculators release: one ``--spec VERSION=DIR`` per release (DIR goes on PYTHONPATH);
- checkpoint: tiny Llama and DeepSeek-V3 layout (MLA + MoE), built here by
  ``build_checkpoint`` with this machine's transformers;
- Model Runner V2 switch ``VLLM_USE_V2_MODEL_RUNNER``: ``0``; unset (the shim pins the V1
  runner for the generator); ``1`` (Model Runner V2 forced);
- tensor parallel size 1, and 2 for the Llama checkpoint where 2 GPUs exist (``--tp2``).

``VLLM_WORKER_MULTIPROC_METHOD`` is removed from every run's environment: the shim's
``worker_spawn_method`` adapter must choose ``spawn`` (CUDA is initialised in the driver).
Each run also reports which model runner class its workers used. Runs go in parallel
(small ``gpu_memory_utilization``; GPUs assigned round-robin) under one deadline; results are
written to ``--out`` (``matrix.json``, ``summary.md``) after every finished run, so an
interrupted call still returns what finished.

Usage (device): python3 tests/e2e/scripts/gpu_matrix.py --out $OUT \\
    --spec 0.3.0=/root/spec-0.3.0 --spec 0.4.0.1=/root/spec-0.4.0.1 --site /root/site [--tp2]
Usage (CPU, to test the script): --spec 0.4.0.1=.envs/speculators-0.4.0.1 --models llama
    --v2 0 --batches 1,3 (with a vLLM env's python)
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
LAYERS = {"llama": [0, 2, 5], "deepseek_v3": [0, 1, 3]}
V2_MODES = {"0": "0", "unset": None, "1": "1"}


def _runner_info(worker) -> dict:
    """Runs inside each vLLM worker (collective_rpc): which model runner it uses."""
    import os as _os

    r = getattr(worker, "model_runner", None)
    t = type(r)
    return {"runner": f"{t.__module__}.{t.__name__}", "has_input_batch": hasattr(r, "input_batch"),
            "env_v2": _os.environ.get("VLLM_USE_V2_MODEL_RUNNER"),
            "env_mp": _os.environ.get("VLLM_WORKER_MULTIPROC_METHOD")}


def child(a) -> None:
    """One combination: run_check in this process; JSON to a.result."""
    from speculators_compat.demo.runner import make_sequences, run_check

    batches = [make_sequences(int(n), seed=i, min_len=a.min_len, max_len=a.max_len)
               for i, n in enumerate(a.batches.split(","))]

    def extra(gen, outputs):
        try:
            return {"workers": gen.executor.collective_rpc(_runner_info)}
        except Exception as exc:  # noqa: BLE001 - informational only
            return {"workers_error": f"{type(exc).__name__}: {exc}"}

    kwargs = {"gpu_memory_utilization": a.gpu_mem, "tensor_parallel_size": a.tp}
    if a.max_num_batched_tokens:  # speculators 0.4 only: chunked prefill
        kwargs["max_num_batched_tokens"] = a.max_num_batched_tokens
    t = time.time()
    result = run_check(a.model, layer_ids=[int(x) for x in a.layers.split(",")], batches=batches,
                       max_model_len=512, generator_kwargs=kwargs, extra_checks=extra)
    result["wall_s"] = time.time() - t
    result["env"] = {k: os.environ.get(k) for k in ("VLLM_USE_V2_MODEL_RUNNER",
                                                     "VLLM_WORKER_MULTIPROC_METHOD",
                                                     "CUDA_VISIBLE_DEVICES")}
    for st in result.get("steps", []):  # keep the JSON small: last lines of tracebacks only
        if "traceback" in st:
            st["traceback"] = st["traceback"][-3000:]
    with open(a.result, "w") as f:
        json.dump(result, f, default=str)


def _combos(a, n_gpus: int) -> list[dict]:
    combos = []
    for ver, path in a.spec:
        for model in a.models.split(","):
            for mode in a.v2.split(","):
                combos.append({"spec": ver, "spec_dir": path, "model": model, "v2": mode, "tp": 1})
    if a.tp2 and n_gpus >= 2:
        for ver, path in a.spec:
            for mode in a.tp2_v2.split(","):
                combos.append({"spec": ver, "spec_dir": path, "model": "llama", "v2": mode,
                               "tp": 2})
    for c in combos:
        c["id"] = f"spec{c['spec']}-{c['model']}-v2_{c['v2']}-tp{c['tp']}" + (
            f"-{a.tag}" if a.tag else "")
    return combos


def _summarise(c: dict, res: dict | None, log_tail: str, rc) -> dict:
    row = {k: c[k] for k in ("id", "spec", "model", "v2", "tp")}
    row["rc"] = rc
    if res is None:
        row.update(ok=False, error=f"no result (rc={rc}); log tail: {log_tail[-1500:]}")
        return row
    cos = [b.get("compare", {}).get("min_cosine") for b in res.get("batches", [])]
    cos = [x for x in cos if x is not None]
    row.update(
        ok=bool(res.get("ok")),
        min_cosine=min(cos) if cos else None,
        batches=[{"size": b.get("size"), "returned": b.get("returned"), "ok": b.get("ok"),
                  "input_order": b.get("input_order"), "dtypes": b.get("dtypes"),
                  "min_cosine": b.get("compare", {}).get("min_cosine"),
                  "max_rel_abs_err": b.get("compare", {}).get("max_rel_abs_err"),
                  "seconds": b.get("seconds")} for b in res.get("batches", [])],
        failed_step=res.get("failed_step"), error=res.get("error"),
        workers=(res.get("extra") or {}).get("workers") or (res.get("extra") or {}).get(
            "workers_error"),
        adapters={a["name"]: a["status"] for a in (res.get("report") or {}).get("adapters", [])},
        wall_s=res.get("wall_s"))
    if not row["ok"] and not row["error"]:
        reasons = [r for b in res.get("batches", []) for r in b.get("compare", {}).get(
            "reasons", [])[:3]]
        row["error"] = "; ".join(reasons[:5]) or "batch check failed"
    return row


def _write(out: Path, meta: dict, rows: list[dict]) -> None:
    (out / "matrix.json").write_text(json.dumps({"meta": meta, "runs": rows}, indent=1,
                                                default=str))
    lines = ["| combination | result | min cosine | runner (workers) | notes |",
             "|---|---|---|---|---|"]
    for r in rows:
        w = r.get("workers")
        runner = ", ".join(sorted({x["runner"].removeprefix("vllm.") for x in w})) if (
            isinstance(w, list) and w) else (w or "")
        cos = "" if r.get("min_cosine") is None else f"{r['min_cosine']:.4f}"
        note = (r.get("error") or "").replace("|", "/").replace("\n", " ")[:300]
        lines.append(f"| {r['id']} | {'pass' if r.get('ok') else 'FAIL'} | {cos} | {runner} "
                     f"| {note} |")
    (out / "summary.md").write_text("\n".join(lines) + "\n")


def _shim_code() -> dict:
    """The shim code this run tests, as the CPU matrix records it (``tools/matrix/matrix.py``'s
    ``shim_stamp``): ``shim`` (the commit, ``+dirty`` with uncommitted changes under src/;
    ``SPECULATORS_COMPAT_COMMIT`` where the copy has no git) and ``shim_src`` (the adapter
    code's digest, which tells ``tools/matrix/matrix_proven.py`` whether the GPU level still
    describes today's adapter code)."""
    sys.path.insert(0, str(ROOT / "tools" / "matrix"))
    try:
        import matrix

        out = matrix.shim_stamp()
    except Exception as exc:  # noqa: BLE001 - the run itself does not depend on it
        out = {"shim_src_error": repr(exc)}
    finally:
        sys.path.remove(str(ROOT / "tools" / "matrix"))
    out["shim"] = out.get("shim") or os.environ.get("SPECULATORS_COMPAT_COMMIT")
    return out


def main(a) -> None:
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    logs = Path(a.logs)
    logs.mkdir(parents=True, exist_ok=True)
    deadline = time.time() + a.deadline
    src = str(ROOT / "src")
    base_pp = [src] + ([a.site] if a.site else [])
    sys.path[:0] = base_pp
    from speculators_compat.demo.checkpoints import build_checkpoint

    ckpts = {m: str(build_checkpoint(m, Path(a.ckpts) / m)) for m in a.models.split(",")}
    n_gpus = 0
    try:
        import torch

        n_gpus = torch.cuda.device_count()
    except Exception:  # noqa: BLE001
        pass
    combos = _combos(a, n_gpus)
    meta = {"n_gpus": n_gpus, "batches": a.batches, "started": time.time(), "tag": a.tag,
            "min_len": a.min_len, "max_len": a.max_len,
            "max_num_batched_tokens": a.max_num_batched_tokens,
            "python": sys.version.split()[0]}
    meta.update(_shim_code())
    try:
        import torch
        import transformers

        meta.update(torch=torch.__version__, transformers=transformers.__version__)
        import importlib.metadata as md

        meta["vllm"] = md.version("vllm")
    except Exception as exc:  # noqa: BLE001
        meta["versions_error"] = str(exc)
    rows: list[dict] = []
    pending = list(combos)
    running: list[tuple[dict, subprocess.Popen, Path, Path, float]] = []
    gpu_rr = 0
    while pending or running:
        while pending and len(running) < a.parallel and time.time() < deadline:
            c = pending.pop(0)
            env = dict(os.environ)
            env["PYTHONPATH"] = os.pathsep.join([src, c["spec_dir"]] + base_pp[1:])
            env.pop("VLLM_WORKER_MULTIPROC_METHOD", None)
            env.pop("SPECULATORS_COMPAT_ACTIVE", None)
            env.setdefault("OMP_NUM_THREADS", "2")
            env.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
            if V2_MODES[c["v2"]] is None:
                env.pop("VLLM_USE_V2_MODEL_RUNNER", None)
            else:
                env["VLLM_USE_V2_MODEL_RUNNER"] = V2_MODES[c["v2"]]
            if n_gpus and c["tp"] == 1:
                env["CUDA_VISIBLE_DEVICES"] = str(gpu_rr % n_gpus)
                gpu_rr += 1
            res_file = logs / f"{c['id']}.json"
            log_file = logs / f"{c['id']}.log"
            res_file.unlink(missing_ok=True)
            cmd = [a.python, __file__, "--child", "--result", str(res_file),
                   "--model", ckpts[c["model"]], "--layers", ",".join(map(str, LAYERS[c["model"]])),
                   "--batches", a.batches, "--tp", str(c["tp"]), "--gpu-mem", str(a.gpu_mem),
                   "--min-len", str(a.min_len), "--max-len", str(a.max_len),
                   "--max-num-batched-tokens", str(a.max_num_batched_tokens or 0)]
            with open(log_file, "w") as lf:
                p = subprocess.Popen(cmd, env=env, stdout=lf, stderr=subprocess.STDOUT,
                                     cwd=str(logs), start_new_session=True)
            running.append((c, p, res_file, log_file, time.time()))
            print(f"started {c['id']}", flush=True)
        if not pending and not running:
            break
        if pending and time.time() >= deadline and not running:
            for c in pending:
                rows.append({**{k: c[k] for k in ("id", "spec", "model", "v2", "tp")},
                             "ok": False, "error": "not run: deadline reached"})
            pending = []
            break
        time.sleep(1)
        still = []
        for c, p, res_file, log_file, t0 in running:
            rc = p.poll()
            over = time.time() > deadline or time.time() - t0 > a.timeout
            if rc is None and not over:
                still.append((c, p, res_file, log_file, t0))
                continue
            if rc is None:
                try:
                    os.killpg(p.pid, 9)
                except OSError:
                    pass
                p.wait()
                rc = "timeout"
            res = json.loads(res_file.read_text()) if res_file.exists() else None
            tail = log_file.read_text(errors="replace")[-4000:] if log_file.exists() else ""
            row = _summarise(c, res, tail, rc)
            row["seconds"] = time.time() - t0
            if not row["ok"]:
                row["log_tail"] = tail[-2500:]
            rows.append(row)
            print(f"{'PASS' if row['ok'] else 'FAIL'} {c['id']} min_cos={row.get('min_cosine')} "
                  f"{(row.get('error') or '')[:300]}", flush=True)
            _write(out, meta, rows)
        running = still
    meta["finished"] = time.time()
    _write(out, meta, rows)
    print((out / "summary.md").read_text())


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--child", action="store_true")
    p.add_argument("--result")
    p.add_argument("--model")
    p.add_argument("--layers")
    p.add_argument("--tp", type=int, default=1)
    p.add_argument("--gpu-mem", type=float, default=0.1)
    p.add_argument("--batches", default="1,11,33")
    p.add_argument("--min-len", type=int, default=4)
    p.add_argument("--max-len", type=int, default=48)
    p.add_argument("--max-num-batched-tokens", type=int, default=0,
                   help="chunked prefill (speculators 0.4 only; 0: speculators' default)")
    p.add_argument("--tag", default="", help="suffix of the combination ids")
    p.add_argument("--out")
    p.add_argument("--spec", action="append", default=[],
                   type=lambda s: tuple(s.split("=", 1)), help="VERSION=DIR (repeatable)")
    p.add_argument("--site", default=None, help="folder with vLLM and its dependencies")
    p.add_argument("--models", default="llama,deepseek_v3")
    p.add_argument("--v2", default="0,unset,1")
    p.add_argument("--tp2", action="store_true", help="also tensor parallel 2 (Llama)")
    p.add_argument("--tp2-v2", default="unset,1")
    p.add_argument("--ckpts", default="/tmp/gpu-matrix-ckpts")
    p.add_argument("--logs", default="/tmp/gpu-matrix-logs")
    p.add_argument("--python", default=sys.executable)
    p.add_argument("--parallel", type=int, default=8)
    p.add_argument("--timeout", type=float, default=420)
    p.add_argument("--deadline", type=float, default=480, help="seconds for the whole matrix")
    args = p.parse_args()
    if args.child:
        child(args)
    else:
        args.spec = [(v, os.path.abspath(d)) for v, d in args.spec]
        main(args)
