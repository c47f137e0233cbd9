"""Contract of the ``speculators_supported`` adapter,
on the installed vLLM and speculators.

Speculators' legacy call shape fails (or is wrong) bare where the upstream note says
so and works through the adapter. The checks every adapter shares (the probe agrees with
the expectation table, apply/revert restores identity and changes only the declared
targets) run for every adapter in tests/contract/test_every_adapter.py.
"""

from __future__ import annotations

import importlib
import importlib.util

from speculators_compat import _env

from ..expectations import NOT_NEEDED, V
from ..support import (
    BY_NAME,
    GEN,
    _consumer_owned,
    _vllm_owned,
    diff,
    one,
    snapshot,
)

NAME = "speculators_supported"

#: Its expected status on the installed release, and why (read by ``expectations.py``).
EXPECTED = (
    # A scope check that never patches: not-needed for releases with the in-process
    # generator (0.3/0.4); raises UnsupportedError for >= 0.5 (not installable here).
    lambda e: NOT_NEEDED if e.speculators < V("0.5.0.dev0") else None,
    "speculators 0.5 replaced the in-process generator")


def test_legacy_call_shape(base, vllm_config):
    legacy_call_shape(base, base.gen, vllm_config, BY_NAME[NAME])


def legacy_call_shape(base, gen, cfg, adapter):
    # A pure scope check: with the in-process generator installed it changes nothing
    # and raises nothing (speculators >= 0.5, where it raises, is not installable here).
    assert importlib.util.find_spec(GEN) is not None
    spaces = {**_vllm_owned(), **_consumer_owned(gen)}
    before = snapshot(spaces)
    with one(base, adapter) as applied:
        assert not applied
        assert diff(before, snapshot(spaces)) <= {f"os.environ[{_env.ACTIVE!r}]"}
