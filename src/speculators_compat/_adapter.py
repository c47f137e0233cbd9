"""What an adapter is: its declaration, its probe's verdict, the facts probes share.

One adapter answers one upstream change (or one hazard), in one module under
``speculators_compat.adapters``. It declares when it acts (:class:`Phase`: in which
processes; :class:`Stage`: relative to speculators' imports), what it may change
(``targets``), and implements ``probe`` (decide from the installed API) and ``apply``
(change things only through the :class:`~speculators_compat._patcher.Patcher`).
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from . import _versions
from ._patcher import Patcher
from ._report import Kind, Status


class Phase(str, enum.Enum):
    """In which processes an adapter acts: only the one that drives vLLM (skipped in
    vLLM's workers), or both it and vLLM's workers. (The process an activation runs in is
    the string ``Context.process``, ``"driver"`` or ``"worker"``.)"""

    DRIVER = "driver"
    BOTH = "both"


class Stage(str, enum.Enum):
    """When an adapter must act, relative to speculators' imports (registry order).

    :class:`Phase` says in which processes an adapter acts; the stage says when, and
    the registry lists adapters stage by stage. The two import stages must act before
    a module is imported (:attr:`precedes`): ``activate()`` refuses to run after that
    import (``_order``), and vLLM's workers get them at interpreter start
    (``_bootstrap``). ``generator`` adapters rebind names inside speculators' imported
    generator module.
    """

    BEFORE_SPECULATORS_IMPORT = "before-speculators-import"
    BEFORE_GENERATOR_IMPORT = "before-generator-import"
    GENERATOR = "generator"

    @property
    def precedes(self) -> str | None:
        """The module (prefix) whose import this stage must come before, if any."""
        return _PRECEDES.get(self)


_PRECEDES = {Stage.BEFORE_SPECULATORS_IMPORT: "speculators",
             Stage.BEFORE_GENERATOR_IMPORT: "speculators.data_generation"}


@dataclass(frozen=True)
class Verdict:
    """A probe's decision about the installed API."""

    apply: bool
    status: Status
    reason: str

    @classmethod
    def needed(cls, reason: str) -> Verdict:
        return cls(True, Status.APPLIED, reason)

    @classmethod
    def not_needed(cls, reason: str) -> Verdict:
        return cls(False, Status.NOT_NEEDED, reason)

    @classmethod
    def mismatch(cls, reason: str) -> Verdict:
        return cls(False, Status.MISMATCH, reason)


class Adapter:
    """Declaration of one adapter: one upstream change, one module.

    Subclasses set the class attributes and implement :meth:`probe` (a look at the
    installed API that decides whether to apply; ranges are guards and
    documentation only) and :meth:`apply` (changes made only through the patcher).
    """

    name: str = ""
    summary: str = ""
    #: The upstream change this answers, with a reference (release, PR, file).
    upstream: str = ""
    #: vLLM versions the adapter is meant for (PEP 440; lower bounds as X.Y.0.dev0).
    vllm_range: str | None = None
    #: speculators versions whose code it serves.
    speculators_range: str | None = ">=0.3.0.dev0,<0.5.0.dev0"
    phase: Phase = Phase.DRIVER
    #: When it acts (:class:`Stage`); the registry is ordered by stage.
    stage: Stage = Stage.GENERATOR
    #: What its ``apply()`` may change, as ``"module.path:Qualified.name"`` (the names it
    #: rebinds or wraps; ``os.environ:NAME`` for variables): the contract suite checks
    #: every change the Patcher records against this, and docs/adapters.md lists the
    #: adapters stacked on each target.
    targets: tuple[str, ...] = ()
    #: Names of the adapters that must have applied, earlier in the registry, for this one
    #: to act (what it changes only works with theirs). Where one of them did not apply,
    #: the activation reports this one not needed, naming it, and neither probes nor
    #: applies it: an adapter declares what it depends on instead of re-running another
    #: adapter's probe.
    requires: tuple[str, ...] = ()
    #: Names of the adapters this one must come after in the registry, where it holds
    #: them, because of how their changes stack (on a shared target the later one is the
    #: outer wrapper or hook; an import-time fix that needs another's). Unlike
    #: ``requires`` it does not make this one depend on them. The activation checks the
    #: registry against it (with ``requires`` and the stages), so no order is implied by
    #: list position alone.
    after: tuple[str, ...] = ()
    #: What its ``refuse()`` may change (fail-closed adapters).
    refusal_targets: tuple[str, ...] = ()
    #: Why it exists (:class:`Kind`): which installations it is expected to act on.
    kind: Kind = Kind.UPSTREAM_CHANGE
    #: When the adapter can be deleted.
    remove_when: str = ""
    #: Fail closed: without this adapter the data is silently wrong, so when its probe
    #: raises or finds an unknown shape, or its apply fails, the activation installs
    #: :meth:`refuse` instead of going on without it (unless it is disabled by name).
    fail_closed: bool = False

    def probe(self, ctx: Context) -> Verdict:  # pragma: no cover - interface
        raise NotImplementedError

    def apply(self, patcher: Patcher, ctx: Context) -> None:  # pragma: no cover - interface
        raise NotImplementedError

    def refuse(self, patcher: Patcher, ctx: Context, message: str) -> None:
        """Make what this adapter guards raise ``CompatError(message)`` (fail closed)."""

    def describe(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "summary": self.summary,
            "upstream": self.upstream,
            "vllm_range": self.vllm_range,
            "speculators_range": self.speculators_range,
            "phase": self.phase.value,
            "stage": self.stage.value,
            "targets": list(self.targets),
            "requires": list(self.requires),
            "after": list(self.after),
            "kind": self.kind.value,
            "remove_when": self.remove_when,
        }


class Context:
    """Facts shared by the probes of one activation; computed lazily, at most once."""

    def __init__(self, process: str = "driver") -> None:
        self.process = process
        self.versions = _versions.snapshot()
        self._cache: dict[str, Any] = {}

    def memo(self, key: str, compute: Callable[[], Any]) -> Any:
        if key not in self._cache:
            self._cache[key] = compute()
        return self._cache[key]
