"""How long ``speculators-compat check-data`` takes on many small files.

Makes ``--files`` synthetic ``data_<i>.pt`` files shaped like speculators 0.3/0.4's offline
script's (``input_ids``, a list of ``--layers`` bf16 hidden states ``[tokens, --hidden]``,
``loss_mask``; 8 distinct lengths around ``--tokens``), its ``sample_lengths.json`` and
``data_config.json``, in a temporary directory, then times the command in its own process
(``python -m speculators_compat check-data DIR --json``): wall time, interpreter start and
the workers' torch import included. The files are written just before, so they are read
from the page cache.

    PYTHONPATH=src python benchmarks/cpu/check_data_bench.py [--files 100000] [--jobs N]
"""

from __future__ import annotations

import argparse
import io
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def make(directory: str, files: int, layers: int, tokens: int, hidden: int) -> None:
    """Write the files: a few serialized templates, copied byte for byte."""
    templates = []
    for k in range(8):
        n = tokens + k
        buf = io.BytesIO()
        torch.save({"input_ids": torch.arange(n, dtype=torch.long),
                    "hidden_states": [torch.randn(n, hidden, dtype=torch.bfloat16)
                                      for _ in range(layers)],
                    "loss_mask": torch.ones(n, dtype=torch.long)}, buf)
        templates.append((n, buf.getvalue()))
    lengths = {}
    for i in range(files):
        n, data = templates[i % len(templates)]
        with open(os.path.join(directory, f"data_{i}.pt"), "wb") as f:
            f.write(data)
        lengths[str(i)] = n
    with open(os.path.join(directory, "sample_lengths.json"), "w") as f:
        json.dump(lengths, f)
    ids = list(range(layers))
    config = {"reproducibility": {"command": "data_generation_offline.py --target-model-path "
                                             "m --train-data-path d --output-dir out"},
              "model": {"hidden_size": hidden},
              "data": {"num_samples": files, "seq_length": tokens + 8},
              "hidden_states": {"layer_ids": ids},
              "format": {"schema": {"hidden_states": {"dtype": "list[torch.bfloat16]"}}}}
    with open(os.path.join(directory, "data_config.json"), "w") as f:
        json.dump(config, f)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--files", type=int, default=100_000)
    p.add_argument("--jobs", type=int, default=None, help="default: the CPU count")
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--tokens", type=int, default=16)
    p.add_argument("--hidden", type=int, default=8)
    p.add_argument("--dir", default=None, help="use (and keep) this directory")
    args = p.parse_args()
    directory = args.dir or tempfile.mkdtemp(prefix="check-data-bench-")
    os.makedirs(directory, exist_ok=True)
    try:
        t = time.perf_counter()
        if not os.path.isfile(os.path.join(directory, "data_config.json")):
            make(directory, args.files, args.layers, args.tokens, args.hidden)
        made = time.perf_counter() - t
        cmd = [sys.executable, "-m", "speculators_compat", "check-data", directory, "--json"]
        if args.jobs:
            cmd += ["--jobs", str(args.jobs)]
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [os.path.join(ROOT, "src"),
                                                          env.get("PYTHONPATH")]))
        t = time.perf_counter()
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
        wall = time.perf_counter() - t
        if proc.returncode not in (0, 1):
            sys.stderr.write(proc.stdout + proc.stderr)
            return proc.returncode
        result = json.loads(proc.stdout)
        print(json.dumps({"files": result["files_checked"], "bad": len(result["bad_files"]),
                          "jobs": result["jobs"], "cpus": os.cpu_count(),
                          "wall_s": round(wall, 2), "command_s": result["seconds"],
                          "files_per_s": round(result["files_checked"] / wall),
                          "make_s": round(made, 1), "torch": torch.__version__}))
        return proc.returncode
    finally:
        if args.dir is None:
            shutil.rmtree(directory, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
