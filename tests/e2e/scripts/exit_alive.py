"""A generator still alive when its script ends, and what the exit leaves behind.

Usage: exit_alive.py --out FILE --model PATH

Runs this file again as a child with ``--child PIDFILE``: the child builds the generator
at module level under the main guard (as user scripts do), runs one batch, writes its
workers' pids and returns without deleting the generator, so speculators' ``__del__``
would run during interpreter teardown. The parent records the child's exit code, whether
its output has an ignored exception or a traceback, and whether its workers are gone.
"""

import argparse
import json
import os
import subprocess
import sys
import time


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie waiting for its parent counts as gone
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--out")
    p.add_argument("--model", required=True)
    p.add_argument("--child")
    a = p.parse_args()
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    if a.child:
        import speculators_compat

        speculators_compat.activate()
        from speculators.data_generation.vllm_hidden_states_generator import (
            VllmHiddenStatesGenerator,
        )

        gen = VllmHiddenStatesGenerator(a.model, layer_ids=[0, 2], max_model_len=128)
        res = gen.generate([[5, 6, 7, 8, 9], [10, 11, 12]])
        info = {"returned": len(res), "workers": [w.proc.pid for w in gen.executor.workers],
                "applied": "shutdown_at_exit" in speculators_compat.report().applied}
        with open(a.child, "w") as f:
            json.dump(info, f)
        sys.exit(0)  # the generator is still alive here
    pidfile = a.out + ".child.json"
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, __file__, "--model", a.model, "--child", pidfile],
                          capture_output=True, text=True, timeout=600)
    exit_s = time.monotonic() - t0
    child = {}
    if os.path.exists(pidfile):
        with open(pidfile) as f:
            child = json.load(f)
    time.sleep(1.0)
    output = proc.stdout + proc.stderr
    result = {"rc": proc.returncode, "child": child, "seconds": exit_s,
              "ignored_exception": "Exception ignored" in output,
              "traceback": "Traceback (most recent call last)" in output,
              "workers_left": [pid for pid in child.get("workers", []) if alive(pid)],
              "tail": output[-3000:]}
    with open(a.out, "w") as f:
        json.dump(result, f)
