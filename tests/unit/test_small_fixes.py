"""deactivate() removes only the bootstrap's own PYTHONPATH entry; the report file is
replaced atomically, never written in place."""

from __future__ import annotations

import json
import os

import pytest

from speculators_compat import _bootstrap
from speculators_compat._patcher import Patcher
from speculators_compat._report import Report

DIR = _bootstrap.DIRECTORY


@pytest.mark.parametrize("before, added, after", [
    (None, None, None),
    ("", None, ""),
    ("/keep", None, "/keep"),
    (None, "/new", "/new"),
    ("/keep", "/new", "/keep:/new"),
])
def test_revert_drops_only_the_bootstrap_entry(monkeypatch, before, added, after):
    if before is None:
        monkeypatch.delenv("PYTHONPATH", raising=False)
    else:
        monkeypatch.setenv("PYTHONPATH", before)
    p = Patcher()
    _bootstrap.install(p, "driver")
    if added:  # the user's own entry, added while active
        os.environ["PYTHONPATH"] += os.pathsep + added
    p.revert()
    expected = None if after is None else after.replace(":", os.pathsep)
    assert os.environ.get("PYTHONPATH") == expected


def test_report_file_is_replaced_not_written_in_place(tmp_path):
    path = tmp_path / "report.json"
    path.write_text("old")
    inode = os.stat(path).st_ino
    Report([], {"vllm": "x"}, 1, "driver", False, True).to_json(path)
    assert os.stat(path).st_ino != inode  # a new file renamed over the old one
    assert json.loads(path.read_text())["pid"] == 1
    assert [p.name for p in tmp_path.iterdir()] == ["report.json"]  # no temporary left
    mask = os.umask(0)
    os.umask(mask)
    assert os.stat(path).st_mode & 0o777 == 0o666 & ~mask  # as an in-place write gives
