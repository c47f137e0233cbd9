"""The checks every adapter of the registry gets, on the installed vLLM and speculators.

For each registered adapter: its probe's status matches the expectation table
(``expectations.EXPECTED``) and its declared vLLM / speculators ranges, and every verdict
says why; activating it alone and deactivating it restores every namespace it may touch
to the identical objects, changes exactly what its report lists, leaves vLLM's own
objects alone and changes only its declared ``targets``. The checks themselves are in
``support.py``; each adapter's own file (``adapters/test_<name>.py``) keeps what is
specific to it (speculators' legacy call shape, bare and through the adapter).
"""

from __future__ import annotations

import pytest

from .support import ADAPTER_NAMES, Base, check_apply_then_revert, check_probe_agrees_with_release


@pytest.mark.parametrize("name", ADAPTER_NAMES)
def test_probe_agrees_with_release(base: Base, name: str):
    check_probe_agrees_with_release(base, name)


@pytest.mark.parametrize("name", ADAPTER_NAMES)
def test_apply_then_revert_restores_identity(base: Base, name: str):
    check_apply_then_revert(base, name)
