"""On the vLLM speculators 0.3.0 pins (0.11) no ``upstream-change`` adapter may apply, except
the ones ``tools/matrix/matrix.py`` allows there by name (they lift a limit of speculators'
own code on every vLLM); the page names them with their reason, and the second pinned
Llama run disables them with the safeguards."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools" / "matrix"))
import matrix  # noqa: E402
import matrix_render  # noqa: E402


def doctor(*applied: tuple[str, str], vllm: str = "0.11.0+cpu") -> dict:
    return {"versions": {"vllm": vllm},
            "adapters": {n: {"status": "applied", "kind": k} for n, k in applied}}


def test_an_upstream_change_on_the_pinned_vllm_fails_the_check():
    pin = matrix.pinned_check("0.3.0", doctor(("step_overlap", "performance"),
                                              ("hook_capture", "upstream-change")))
    assert pin["strict"] and pin["upstream_change_applied"] == ["hook_capture"]
    line = "\n".join(matrix_render._pinned(
        [{"env": "0.11.0", "speculators": {"0.3.0": {"pinned": pin}}}], ["0.3.0"]))
    assert "**upstream-change adapters applied: hook_capture**" in line


def test_an_allowed_adapter_passes_and_is_named_with_its_reason():
    pin = matrix.pinned_check("0.3.0", doctor(("kv_cache_groups_hybrid", "upstream-change"),
                                              ("generate_guard", "safeguard")))
    assert pin["upstream_change_applied"] == []
    assert set(pin["allowed"]) == {"kv_cache_groups_hybrid"}
    line = "\n".join(matrix_render._pinned(
        [{"env": "0.11.0", "speculators": {"0.3.0": {"pinned": pin}}}], ["0.3.0"]))
    assert "`kv_cache_groups_hybrid`: speculators 0.3/0.4 put every layer" in line
    assert "**upstream-change adapters applied" not in line


def test_the_second_pinned_run_disables_the_allowed_adapters_with_the_safeguards():
    off = matrix.NO_SAFEGUARDS["SPECULATORS_COMPAT_DISABLE"].split(",")
    assert off[0] == "safeguard" and set(off[1:]) == set(matrix.PINNED_ALLOWED)


def test_elsewhere_nothing_is_checked():
    assert matrix.pinned_check("0.3.0", doctor(vllm="0.32.0+cpu")) is None
