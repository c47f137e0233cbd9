"""Run a command in its own session and kill its whole process group afterwards.

Why: speculators' generator starts vLLM worker processes; when a run crashes or times out
they must neither outlive it nor block the caller on a pipe. Output goes to a file.
Shared by ``tools/matrix/matrix.py`` and the test helpers (``tests/helpers.py``).
"""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path


def run_in_own_session(cmd: list[str], env: dict[str, str], logfile: Path, timeout: float,
                       cwd: str | Path) -> tuple[int, str]:
    """Run ``cmd`` with output to ``logfile``; returns (returncode, output). A timeout gives
    returncode -9. The process group is killed in every case."""
    logfile.parent.mkdir(parents=True, exist_ok=True)
    with open(logfile, "w") as f:
        proc = subprocess.Popen(cmd, env=env, stdout=f, stderr=subprocess.STDOUT, cwd=cwd,
                                start_new_session=True)
        try:
            rc = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            rc = -9
        finally:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait()
    return rc, logfile.read_text(errors="replace")
