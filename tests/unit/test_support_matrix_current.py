"""docs/support-matrix.md is generated from docs/support-matrix.json; it must be current.

No vLLM needed: rendering reads only the recorded results (``tools/matrix/matrix.py run``
records them; ``tools/matrix/matrix.py render`` writes the page).
"""

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_support_matrix_doc_is_current():
    proc = subprocess.run([sys.executable, str(ROOT / "tools" / "matrix" / "matrix.py"), "render",
                           "--check"], capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr


def test_support_matrix_results_cover_the_ci_envs():
    sys.path.insert(0, str(ROOT / "tools"))
    try:
        import envs
    finally:
        sys.path.pop(0)
    data = json.loads((ROOT / "docs" / "support-matrix.json").read_text())
    assert set(data["envs"]) <= set(envs.RECIPES), "results for an env without a recipe"
    for name in envs.CI_VERSIONS:
        assert name in data["envs"], f"no recorded results for the CI env {name}"
