"""The ordered adapter registry. One module per upstream change.

Order matters where adapters build on each other: fixes that must precede
``import speculators`` come first, then those that must precede the import of
speculators' generator module, then the ones that rebind names inside it.
"""

from __future__ import annotations

from .._core import Adapter

ADAPTERS: list[Adapter] = []
