"""``tools/gpu/gpu_host_watch.sh`` (started by the device preamble for every call): it logs the
host's memory and disk, kills the processes under the call's shell, not the shell itself
and not itself, when memory runs below its floor, and ends with the shell."""

import os
import subprocess
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
WATCH = ROOT / "tools" / "gpu" / "gpu_host_watch.sh"


def _call(tmp_path, mem_floor_mb: int, child_s: int):
    """A call's shell: the watcher in the background, then a child that runs ``child_s``
    seconds; the shell reports the child's exit status and goes on."""
    log = tmp_path / "host.txt"
    script = (f'bash {WATCH} $$ {log} >/dev/null 2>&1 & '
              f'python3 -c "import time; time.sleep({child_s})"; '
              'echo "child rc=$?"; sleep 1')
    env = {**os.environ, "GPU_WATCH_MIN_MEM_MB": str(mem_floor_mb)}
    t0 = time.monotonic()
    out = subprocess.run(["bash", "-c", script], env=env, capture_output=True, text=True,
                         timeout=60)
    return out, log.read_text(), time.monotonic() - t0


def test_low_memory_kills_the_calls_processes_and_the_call_goes_on(tmp_path):
    out, log, took = _call(tmp_path, mem_floor_mb=1 << 40, child_s=30)
    assert took < 15, took
    assert "child rc=137" in out.stdout  # killed; the shell itself went on
    assert "mem_available_mb=" in log and "killing the call's processes" in log


def test_enough_memory_only_logs_and_the_watcher_ends_with_the_call(tmp_path):
    out, log, _ = _call(tmp_path, mem_floor_mb=0, child_s=3)
    assert "child rc=0" in out.stdout
    assert "killing" not in log and "mem_available_mb=" in log
    time.sleep(3)
    left = subprocess.run(["pgrep", "-f", str(tmp_path / "host.txt")],
                          capture_output=True, text=True).stdout.split()
    assert not left, left


def test_a_shell_that_exited_counts_as_ended_before_it_is_reaped(tmp_path):
    """The shell execs its last command, so the watcher's ROOT_PID is the process whose
    parent reads the output to its end before reaping it; here the watcher also holds
    that output open, and must still see the zombie as the call's end."""
    script = (f'bash {WATCH} $$ {tmp_path / "host.txt"} & '
              'python3 -c "import time; time.sleep(1)"; sleep 1')
    out = subprocess.run(["bash", "-c", script], capture_output=True, text=True,
                         env={**os.environ, "GPU_WATCH_MIN_MEM_MB": "0"}, timeout=30)
    assert out.returncode == 0
