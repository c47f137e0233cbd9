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
