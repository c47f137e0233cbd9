"""Shared helpers for contract and end-to-end tests (real vLLM, real speculators).

These tests run inside an environment built by ``tools/envs.py`` (a vLLM CPU build,
with one speculators release selected through ``PYTHONPATH``). They skip, saying
why, where vLLM or speculators is missing, so ``pytest tests/unit`` works anywhere.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPTS = Path(__file__).resolve().parent / "e2e" / "scripts"
sys.path.insert(0, str(ROOT / "tools"))
from sessions import run_in_own_session  # noqa: E402  (tools/sessions.py)

CKPT_ROOT = Path(os.environ.get("SPECULATORS_COMPAT_TEST_CKPTS", ROOT / ".cache" / "ckpts"))


def installed(module: str) -> str | None:
    from speculators_compat import _versions

    return _versions.installed(module)


def vllm_version():
    from speculators_compat import _versions

    return _versions.parse(installed("vllm"))


#: Set by ``tools/envs.py test`` for the real-vLLM suites (and under ``CI=true``): there a
#: missing vLLM or speculators means the environment is broken, and skipping would let
#: the run pass with no real-vLLM coverage at all. So it fails instead.
REQUIRE_REAL = (os.environ.get("SPECULATORS_COMPAT_REQUIRE_REAL") == "1"
                or os.environ.get("CI", "").lower() == "true")


def missing(reason: str):
    """Skip (a plain ``pytest`` anywhere) or fail (CI / ``envs.py test``) for ``reason``."""
    if REQUIRE_REAL:
        pytest.fail(f"{reason}; required here (SPECULATORS_COMPAT_REQUIRE_REAL=1 or CI=true)",
                    pytrace=False)
    pytest.skip(reason)


def require_vllm():
    if installed("vllm") is None:
        missing("vLLM is not installed in this environment (run via tools/envs.py test)")


def require_speculators():
    require_vllm()
    if installed("speculators") is None:
        missing("speculators is not on PYTHONPATH (run via tools/envs.py test)")


def checkpoint(kind: str, **overrides) -> str:
    """Build (once per transformers version) and return a tiny checkpoint directory."""
    from speculators_compat.demo.checkpoints import build_checkpoint

    tf = installed("transformers")
    suffix = "" if not overrides else "-" + "-".join(sorted(overrides))
    path = CKPT_ROOT / f"tf-{tf}" / f"{kind}{suffix}"
    return str(build_checkpoint(kind, path, **overrides))


def run_script(name: str, *args: str, env: dict | None = None, timeout: int = 900) -> dict:
    """Run ``tests/e2e/scripts/<name>`` in a fresh interpreter of this env; return its JSON."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "result.json"
        full_env = dict(os.environ)
        full_env.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
        full_env.pop("SPECULATORS_COMPAT_ACTIVE", None)
        full_env.update(env or {})
        if full_env.get("PYTHONPATH"):  # scripts run in a temp cwd: make entries absolute
            full_env["PYTHONPATH"] = os.pathsep.join(
                os.path.abspath(p) for p in full_env["PYTHONPATH"].split(os.pathsep) if p)
        # Own session, output to a file: vLLM processes left behind by a crashed script
        # can neither block the test on a pipe nor outlive it.
        rc, output = run_in_own_session(
            [sys.executable, str(SCRIPTS / name), "--out", str(out), *args], full_env,
            Path(tmp) / "output.log", timeout, tmp)
        if not out.exists():
            raise AssertionError(f"{name} wrote no result (rc={rc}):\n{output[-10000:]}")
        data = json.loads(out.read_text())
        data["_rc"] = rc
        data["_stderr_tail"] = output[-6000:]
        return data


def assert_generated_ok(result: dict) -> None:
    """A ``generate.py`` verdict that holds: no failed step, every batch whole, in input
    order and equal to transformers, and every deliberately wrong result failing the same
    comparison (so the comparison can tell)."""
    assert "failed_step" not in result, (result.get("failed_step"), result.get("error"),
                                         result.get("_stderr_tail"))
    for b in result["batches"]:
        assert b["returned"] == b["size"] and b["input_order"], b
        assert b["compare"]["ok"], b["compare"]
    assert result["ok"]
    wrong = dict(result["known_wrong"])
    assert wrong.pop("correct") is True and wrong and not any(wrong.values()), wrong
