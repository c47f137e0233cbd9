"""The matrix's training chain runs once per transformers version of the e2e envs, in the
newest release env that has it (``tools/matrix/matrix_train.py``); the page says which env's
result stands for the others, and a failed chain leaves the row unproven."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools" / "matrix"))
import matrix_proven  # noqa: E402
import matrix_render  # noqa: E402
import matrix_train  # noqa: E402

TF = {"0.16.0": "4.57.6", "0.20.0": "4.57.6", "0.28.0": "5.20.2", "0.30.0": "5.20.2",
      "nightly": "5.20.2", "0.31.0": "5.17.0", "0.34.0": "5.20.2"}
DATA = {"envs": {n: {"versions": {"transformers": tf}} for n, tf in TF.items()}}


def test_one_env_per_transformers_version():
    where = {n: matrix_train.trains_for(DATA, n) for n in TF}
    assert where == {"0.16.0": "0.20.0", "0.20.0": "0.20.0", "0.28.0": "0.30.0",
                     "0.30.0": "0.30.0", "nightly": "0.30.0",  # a release before the nightly
                     "0.31.0": "0.31.0",
                     "0.34.0": None}  # contract level: no e2e at all
    assert matrix_train.trains_for({"envs": {"0.32.0": {}}}, "0.32.0") is None  # no doctor yet


def test_train_cell_and_proven():
    assert matrix_render.train_cell({"status": "not-run",
                                     "why": "transformers 5.20.2: trained in the 0.30.0 env"}
                                    ) == "= 0.30.0"
    assert matrix_render.train_cell({"status": "pass", "passed": 7, "failed": 0,
                                     "skipped": 0}) == "7/0/0"
    failed = {"status": "fail", "passed": 6, "failed": 1, "skipped": 0}
    assert matrix_render.train_cell(failed) == "**FAIL** 6/1/0"
    row = {"doctor": {"supported": True, "adapters": {}}, "contract": {"failed": 0},
           "e2e": {"llama": {"status": "pass"}}}
    assert matrix_proven.row_holds("e2e", row)
    assert not matrix_proven.row_holds("e2e", {**row, "train": failed})
    assert matrix_proven.row_holds("e2e", {**row, "train": {"status": "not-run", "why": "x"}})
