"""Adapter dependencies with the full registry on the real vLLM and speculators.

Each adapter is disabled in turn (one fresh ``Activation`` of the whole registry per
case, in this interpreter: activation state is per object and ``deactivate()`` restores
everything), and every adapter that requires it, directly or through another one, must
then not apply and must name what it requires. ``hook_capture`` disabled means the
workers run speculators' own extension, which answers neither ``shm_transport``'s nor
``request_metadata_in_driver``'s calls: those must not act.
"""

from __future__ import annotations

from speculators_compat import _env
from speculators_compat._activation import Activation
from speculators_compat._report import Status
from speculators_compat.adapters import ADAPTERS

from .support import ADAPTER_NAMES, Base, expected_status


def _dependents(name: str) -> dict[str, str]:
    """Adapters that require ``name`` directly or transitively -> the requirement each one
    names (its own requirement on the path to ``name``)."""
    found: dict[str, str] = {}
    frontier = {name}
    while frontier:
        nxt = set()
        for a in ADAPTERS:
            hit = next((r for r in a.requires if r in frontier), None)
            if hit is not None and a.name not in found:
                found[a.name] = hit
                nxt.add(a.name)
        frontier = nxt
    return found


def test_the_registry_declares_the_capture_dependencies():
    assert _dependents("hook_capture") == {"request_metadata_in_driver": "hook_capture",
                                           "shm_transport": "hook_capture",
                                           "step_overlap": "hook_capture"}


def test_disabling_an_adapter_turns_off_what_requires_it(base: Base, monkeypatch):
    flipped = []
    with base.suspended():
        for name in ADAPTER_NAMES:
            monkeypatch.setenv(_env.DISABLE, name)
            act = Activation(lambda: list(ADAPTERS))
            try:
                report = act.activate(process="driver")
                statuses = {r.name: r for r in report.results}
            finally:
                act.deactivate()
            assert statuses[name].status is Status.DISABLED
            for dependent, requirement in _dependents(name).items():
                r = statuses[dependent]
                assert r.status is not Status.APPLIED and not r.changes, (name, dependent, r)
                assert r.status is Status.NOT_NEEDED, (name, dependent, r)
                assert r.reason.startswith(f"requires {requirement}, which is "), r.reason
                if expected_status(dependent, base.env) is Status.APPLIED:
                    flipped.append((name, dependent))
            # adapters that do not depend on the disabled one keep their verdict
            for other in set(ADAPTER_NAMES) - {name} - set(_dependents(name)):
                assert statuses[other].status is expected_status(other, base.env), (
                    name, other, statuses[other])
    if expected_status("hook_capture", base.env) is Status.APPLIED:
        # not vacuous here: the dependents apply in a full activation and were turned off
        assert ("hook_capture", "shm_transport") in flipped
