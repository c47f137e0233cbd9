"""GPU run: speculators' unchanged generator on tiny checkpoints of many model families.

For each (family, speculators release) a fresh ``generate.py`` process builds
``VllmHiddenStatesGenerator`` through the shim and compares every captured layer with a
transformers forward of the same checkpoint (``output_hidden_states[k + 1]``); batches
must come back whole and in input order, and the known-wrong results must fail the same
comparison. Runs share the one GPU (``--parallel`` at a time, ``--gpu-mem`` each).

For each family the *floor* is recorded too: transformers' own bf16 forward against its
float32 forward, per layer. A random checkpoint whose bf16 forward already moves far from
float32 cannot be compared at the default tolerance; the floor says so instead of blaming
vLLM or the shim.

Usage (device: ``bash tools/gpu/gpu_families.sh [PARTS...] -- ARGS``; CPU: the env's python)::

    gpu_families.py --ckpts DIR --out DIR --spec 0.4.0.1=PATH [--spec 0.3.0=PATH]
        [--families gemma4,qwen3_next,...] [--parallel 6] [--gpu-mem 0.1] [--deadline S]
    gpu_families.py --collect --ckpts DIR --out RUNS_DIR --spec ... [--families ...]

``--deadline`` stops runs still going after S seconds; ``families.json`` is rewritten as each
run ends, so a call the device cuts short keeps what finished. ``--collect`` rebuilds the
record from a runs folder brought back (``runs.tar.xz``) without running anything.

``DIR/<family>`` are checkpoints from ``speculators_compat.demo.checkpoints``; the layers
and batches per family are in :data:`PLAN`. Writes ``families.json`` (rewritten after every
run) and one log per run.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path

HERE = Path(__file__).resolve().parent
START = time.time()
ROOT = HERE.parents[2]
STANDINS = HERE / "standins"

#: family -> (layers, extra generate.py arguments). Layers cover both attention kinds of
#: each family (linear / sliding / full / sparse); sequences of 70-200 tokens cross the
#: 64-token windows and, for 0.4.x, a 256-token step budget splits prompts over steps.
PLAN: dict[str, tuple[str, list[str]]] = {
    "llama": ("0,2,5", []),
    "gemma4": ("0,4,5", []),
    "qwen3_next": ("0,2,3", []),
    "qwen3_5": ("0,2,3", []),
    "qwen3_5_moe": ("0,2,3", []),
    "deepseek_v32": ("0,1,3", []),
    "glm_moe_dsa": ("0,1,3", []),
    "kimi_linear": ("0,2,3", []),
    "nemotron_h": ("0,3,4", []),
    # The multimodal wrappers (``...ForConditionalGeneration``, text_config + vision tower)
    # of two families, text-only prompts: the layers of their language models.
    "qwen3_5_mm": ("0,2,3", []),
    "gemma4_mm": ("0,4,5", []),
}


def floor(model: str, layers: list[int], device: str) -> dict:
    """transformers bf16 vs float32 on the sequences ``generate.py`` uses (batch 1, 11)."""
    import torch

    from speculators_compat.demo.reference import compare, reference_hidden_states
    from speculators_compat.demo.runner import make_sequences

    seqs = make_sequences(11, seed=1, min_len=70, max_len=200)
    kw = {"device": device} if device else {}
    bf16 = reference_hidden_states(model, seqs, layers, dtype=torch.bfloat16, **kw)
    fp32 = reference_hidden_states(model, seqs, layers, dtype=torch.float32, **kw)
    c = compare([[h.float() for h in s] for s in bf16], fp32)
    return {"min_cosine": c["min_cosine"], "per_layer": c["per_layer"]}


def _architecture(ckpt: Path) -> dict:
    """The checkpoint's architecture and model type (what doctor --model looks up)."""
    try:
        cfg = json.loads((ckpt / "config.json").read_text())
    except (OSError, ValueError):
        return {}
    return {"architecture": (cfg.get("architectures") or [None])[0],
            "model_type": cfg.get("model_type")}


def _why(error: str | None) -> str | None:
    """The last line of an error that names its cause (for the architecture page)."""
    lines = [ln.strip() for ln in (error or "").splitlines() if "Error" in ln]
    return lines[-1][-300:] if lines else None


def _needs_flashinfer_standin(family: str) -> bool:
    """Qwen3.5 on a machine without FlashInfer: vLLM 0.34's Qwen3.5 norm imports
    ``flashinfer.norm`` unconditionally; ``standins/`` holds a PyTorch stand-in (its README)."""
    import importlib.util

    return family.startswith("qwen3_5") and importlib.util.find_spec("flashinfer") is None


def hide_cuda_toolkit(env: dict) -> None:
    """With the stand-in importable, vLLM's ``has_flashinfer()`` would answer True where
    the machine has nvcc and ninja (FlashInfer's JIT) and then run FlashInfer's autotuner
    and backends, which the stand-in does not have ("No module named
    'flashinfer.autotuner'", H100, 2026-12-06). A ``CUDA_HOME`` without ``bin/nvcc`` makes
    it answer False, as on a machine without FlashInfer (standins/README.md)."""
    env["CUDA_HOME"] = str(STANDINS / "no-cuda-toolkit")
    env.pop("CUDA_PATH", None)


def _log_tail(log: Path, limit: int = 4000) -> str:
    """The end of a failed run's log from its last traceback on (the families JSON comes
    back from the device; the logs may not)."""
    try:
        text = log.read_text(errors="replace")
    except OSError:
        return ""
    at = text.rfind("Traceback (most recent call last)")
    return (text[at:] if at >= 0 else text)[-limit:]


def run_one(family: str, release: str, spec_path: str, a) -> dict:
    layers, extra = PLAN[family]
    out = Path(a.out) / f"{family}-{release}.json"
    log = Path(a.out) / f"{family}-{release}.log"
    cmd = [sys.executable, str(HERE / "generate.py"), "--out", str(out),
           "--model", str(Path(a.ckpts) / family), "--layers", layers, "--batches", "1,11",
           "--min-len", "70", "--max-len", "200", "--gpu-mem", str(a.gpu_mem), *extra]
    if a.vllm_additional_config:
        cmd += ["--vllm-additional-config", a.vllm_additional_config]
    if release.startswith("0.4") and a.step_tokens:
        cmd += ["--max-num-batched-tokens", str(a.step_tokens)]
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT / "src"), spec_path,
                                                    env.get("PYTHONPATH")) if p)
    env.setdefault("VLLM_WORKER_MULTIPROC_METHOD", "spawn")
    standin = _needs_flashinfer_standin(family)
    if standin:
        env["PYTHONPATH"] = os.pathsep.join((str(STANDINS), env["PYTHONPATH"]))
        hide_cuda_toolkit(env)
    t0 = time.time()
    timeout = a.run_timeout
    if a.deadline:
        timeout = max(1.0, min(timeout, a.deadline - (time.time() - START)))
    with open(log, "w") as f:
        try:
            rc = subprocess.call(cmd, env=env, stdout=f, stderr=subprocess.STDOUT,
                                 timeout=timeout)
        except subprocess.TimeoutExpired:
            rc = "timeout"
    return summarize(family, release, rc, round(time.time() - t0, 1), Path(a.out),
                     Path(a.ckpts), standin)


def summarize(family: str, release: str, rc: object, seconds: float | None, out_dir: Path,
              ckpts: Path, standin: bool) -> dict:
    """The record of one run from its ``generate.py`` JSON and log (also ``--collect``)."""
    layers = PLAN[family][0]
    out = out_dir / f"{family}-{release}.json"
    log = out_dir / f"{family}-{release}.log"
    result = {"family": family, "release": release, "rc": rc, "seconds": seconds,
              "layers": layers, **_architecture(ckpts / family)}
    if standin:
        result["flashinfer_standin"] = True
    try:
        r = json.loads(out.read_text())
    except (OSError, ValueError):
        result["error"] = log.read_text()[-3000:]
        result["why"] = _why(result["error"])
        return result
    result["ok"] = bool(r.get("ok"))
    result["failed_step"] = r.get("failed_step")
    if r.get("error"):
        result["error"] = str(r["error"])[-3000:]
    result["batches"] = [{"size": b.get("size"), "returned": b.get("returned"),
                          "input_order": b.get("input_order"),
                          "ok": (b.get("compare") or {}).get("ok"),
                          "per_layer_min_cosine": [round(x["min_cosine"], 6) for x in
                                                   (b.get("compare") or {}).get("per_layer", [])]}
                         for b in r.get("batches", [])]
    result["known_wrong"] = r.get("known_wrong")
    if not result["ok"]:
        result["why"] = _why(result.get("error"))
        result["log_tail"] = _log_tail(log)
    return result


def _meta() -> dict:
    """Versions and the adapter-code digest the runs use (tools/matrix/matrix_fresh.py)."""
    import importlib.metadata as md

    meta = {}
    for dist in ("vllm", "torch", "transformers"):
        try:
            meta[dist] = md.version(dist)
        except md.PackageNotFoundError:
            meta[dist] = None
    sys.path.insert(0, str(ROOT / "tools" / "matrix"))
    try:
        import matrix_fresh

        meta["shim_src"] = matrix_fresh.source_digest(ROOT)
    finally:
        sys.path.pop(0)
    return meta


def collect(a, report: dict, save, specs: dict, families: list[str]) -> int:
    """``--collect``: the record of the finished runs in ``--out``; the others are listed
    as ``unfinished`` (never counted as failures: they did not end). Versions come from
    each run's activation report, the digest from ``--shim-src`` or this tree."""
    out = Path(a.out)
    report["unfinished"] = []
    for release in specs:
        for f in families:
            if (out / f"{f}-{release}.json").is_file():
                report["runs"].append(summarize(f, release, None, None, out, Path(a.ckpts),
                                                _needs_flashinfer_standin(f)))
            else:
                report["unfinished"].append(f"{f}-{release}")
    for name in sorted(out.glob("*.json")):
        try:
            versions = (json.loads(name.read_text()).get("report") or {}).get("versions")
        except (OSError, ValueError):
            continue
        if versions:
            report["meta"].update({k: versions.get(k) for k in ("vllm", "torch",
                                                                "transformers")})
            break
    report.pop("started", None)
    report["collected"] = True
    save()
    for r in report["runs"]:
        print(r.get("family"), r.get("release"), "ok" if r.get("ok") else "FAIL")
    print("unfinished:", ", ".join(report["unfinished"]) or "none")
    return 0 if all(r.get("ok") for r in report["runs"]) else 1


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--ckpts", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--spec", action="append", default=[], help="RELEASE=PATH")
    p.add_argument("--families", default=",".join(PLAN))
    p.add_argument("--parallel", type=int, default=6)
    p.add_argument("--gpu-mem", type=float, default=0.1)
    p.add_argument("--step-tokens", type=int, default=256)
    p.add_argument("--run-timeout", type=int, default=420)
    p.add_argument("--vllm-additional-config", default="",
                   help="passed to every generate.py run (see there)")
    p.add_argument("--floor-device", default="cuda")
    p.add_argument("--no-floor", action="store_true")
    p.add_argument("--deadline", type=float, default=0,
                   help="seconds for all runs: a run still going then is stopped ('timeout')")
    p.add_argument("--collect", action="store_true",
                   help="no runs: the record of the runs whose JSON is in --out (a call cut "
                        "short by the device's limit), versions from their own reports")
    a = p.parse_args()
    Path(a.out).mkdir(parents=True, exist_ok=True)
    specs = dict(s.split("=", 1) for s in a.spec)
    families = [f for f in a.families.split(",") if f and (Path(a.ckpts) / f).is_dir()]
    report: dict = {"meta": _meta(), "families": families, "runs": [], "floors": {},
                    "started": time.time()}
    path = Path(a.out) / "families.json"

    def save() -> None:
        path.write_text(json.dumps(report, indent=1))

    if a.collect:
        return collect(a, report, save, specs, families)
    # family by family, both releases together: a call cut short leaves whole families
    jobs = [(f, r, sp) for f in families for r, sp in specs.items()]
    with ThreadPoolExecutor(max_workers=a.parallel) as pool:
        futures = [pool.submit(run_one, f, r, sp, a) for f, r, sp in jobs]
        for fut in as_completed(futures):  # saved as each run ends: a cut call keeps them
            try:
                report["runs"].append(fut.result())
            except Exception as exc:  # noqa: BLE001 - one run's failure is a result
                report["runs"].append({"error": f"{type(exc).__name__}: {exc}"})
            save()
    if not a.no_floor:
        for f in families:
            try:
                layers = [int(x) for x in PLAN[f][0].split(",")]
                report["floors"][f] = floor(str(Path(a.ckpts) / f), layers, a.floor_device)
            except Exception as exc:  # noqa: BLE001
                report["floors"][f] = {"error": f"{type(exc).__name__}: {exc}"[-1500:]}
            save()
    report["seconds"] = round(time.time() - report.pop("started"), 1)
    save()
    for r in report["runs"]:
        print(r.get("family"), r.get("release"), "ok" if r.get("ok") else "FAIL",
              r.get("failed_step") or "", [b.get("per_layer_min_cosine") for b in
                                           r.get("batches", [])], r.get("seconds"))
    for f, fl in report["floors"].items():
        print("floor", f, fl.get("min_cosine"), fl.get("error", ""))
    return 0 if all(r.get("ok") for r in report["runs"]) else 1


if __name__ == "__main__":
    sys.exit(main())
