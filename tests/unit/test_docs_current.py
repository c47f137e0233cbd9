"""docs/adapters.md is generated from the registry; it must be current."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_adapters_doc_is_current():
    proc = subprocess.run([sys.executable, str(ROOT / "tools" / "gen_docs.py"), "--check"],
                          capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr


def test_every_adapter_is_documented_in_its_module():
    from speculators_compat.adapters import ADAPTERS

    names = [a.name for a in ADAPTERS]
    assert len(names) == len(set(names))
    for a in ADAPTERS:
        doc = sys.modules[type(a).__module__].__doc__ or ""
        for part in ("Why", "How", "Applies when", "Remove when"):
            assert part in doc, (a.name, part)
        assert a.upstream and a.summary and a.remove_when, a.name


def test_every_adapter_declares_its_kind():
    """Only ``upstream-change`` adapters may carry a vLLM range: the others act on every
    release where their condition holds (platform, a speculators hazard, scope)."""
    from speculators_compat._report import Kind
    from speculators_compat.adapters import ADAPTERS

    for a in ADAPTERS:
        assert isinstance(a.kind, Kind), a.name
        if a.kind is not Kind.UPSTREAM_CHANGE:
            assert a.vllm_range is None, a.name
    kinds = {a.name: a.kind for a in ADAPTERS}
    assert kinds["no_gpu_kv_sizing"] is Kind.PLATFORM
    assert kinds["generate_guard"] is Kind.SAFEGUARD
