"""The activation core: adapter declarations, the patch recorder, the report.

Why one recorder: ``deactivate()`` must restore the exact original objects
(identity), including attributes that were inherited rather than own (those are
deleted again, not overwritten with the inherited value) and names rebound in
consumer modules; and an adapter that fails halfway must leave nothing behind.
Every change therefore goes through :class:`Patcher`, which keeps an undo log
replayed last-in-first-out.
"""

from __future__ import annotations

import enum
import json
import logging
import os
import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from . import _env, _versions
from ._patcher import _MISSING, Patcher, _label, env_default, with_env_default  # noqa: F401

logger = logging.getLogger("speculators_compat")


class Status(str, enum.Enum):
    """What happened to one adapter in one process."""

    APPLIED = "applied"
    NOT_NEEDED = "not-needed"
    MISMATCH = "mismatch"  # the installed API matches neither the old nor the known new shape
    FAILED = "failed"  # probe or apply raised; everything it changed was rolled back
    DISABLED = "disabled"  # switched off by name (env var or ``only=``)


class Kind(str, enum.Enum):
    """Why an adapter exists; says when it is expected to apply.

    Only ``upstream-change`` adapters follow vLLM (and transformers) releases: none of
    them applies on the vLLM a speculators release pinned (0.11.0 for 0.3.0).
    ``platform`` adapters let the pipeline run where upstream never ran it (vLLM's CPU
    platform, no CUDA device) and apply only there. ``safeguard`` adapters guard against
    data-loss or crash hazards in speculators' own code, on every vLLM where the hazard
    exists; ``scope`` adapters only refuse what the shim cannot support; ``performance``
    adapters change how data moves, never what it is (disable them to get upstream's
    path back).
    """

    UPSTREAM_CHANGE = "upstream-change"
    PLATFORM = "platform"
    SAFEGUARD = "safeguard"
    SCOPE = "scope"
    PERFORMANCE = "performance"


class Phase(str, enum.Enum):
    """Where an adapter acts: the process that drives vLLM, or vLLM's worker processes."""

    DRIVER = "driver"
    WORKER = "worker"
    BOTH = "both"


class Stage(str, enum.Enum):
    """When an adapter must act, relative to speculators' imports (registry order).

    :class:`Phase` says in which processes an adapter acts; the stage says when, and
    the registry lists adapters stage by stage. The two import stages must act before
    a module is imported (:attr:`precedes`): ``activate()`` refuses to run after that
    import (``_order``), and vLLM's workers get them at interpreter start
    (``_bootstrap``). ``generator`` adapters rebind names inside speculators' imported
    generator module; ``worker`` adapters act only inside vLLM's worker processes.
    """

    BEFORE_SPECULATORS_IMPORT = "before-speculators-import"
    BEFORE_GENERATOR_IMPORT = "before-generator-import"
    GENERATOR = "generator"
    WORKER = "worker"

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


class CompatError(RuntimeError):
    """An error the user can act on: says what is wrong and what to do."""


class UnsupportedError(CompatError):
    """Raised by a probe when the installation is one the shim cannot help at all.

    ``activate()`` in the driver re-raises it (after undoing anything applied), strict
    or not; in worker processes it is only reported.
    """


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


@dataclass
class AdapterResult:
    """One line of the report."""

    name: str
    status: Status
    reason: str
    upstream: str
    summary: str
    phase: str
    vllm_range: str | None
    changes: list[str] = field(default_factory=list)
    kind: str = Kind.UPSTREAM_CHANGE.value

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["status"] = self.status.value
        return d


@dataclass
class Report:
    """What activation did in this process: per adapter, plus versions and pid."""

    results: list[AdapterResult]
    versions: dict[str, str | None]
    pid: int
    process: str
    strict: bool
    active: bool

    def __getitem__(self, name: str) -> AdapterResult:
        for r in self.results:
            if r.name == name:
                return r
        raise KeyError(name)

    def by_status(self, status: Status) -> list[str]:
        return [r.name for r in self.results if r.status is status]

    @property
    def applied(self) -> list[str]:
        return self.by_status(Status.APPLIED)

    def applied_of(self, kind: Kind) -> list[str]:
        return [r.name for r in self.results
                if r.status is Status.APPLIED and r.kind == kind.value]

    @property
    def problems(self) -> list[AdapterResult]:
        return [r for r in self.results if r.status in (Status.MISMATCH, Status.FAILED)]

    def as_dict(self) -> dict[str, Any]:
        return {
            "speculators_compat": self.versions.get("speculators_compat"),
            "active": self.active,
            "process": self.process,
            "pid": self.pid,
            "strict": self.strict,
            "versions": dict(self.versions),
            "adapters": [r.as_dict() for r in self.results],
        }

    def to_json(self, path: str | os.PathLike[str] | None = None, **kw: Any) -> str:
        """The report as JSON; also written to ``path`` if given (provenance beside data)."""
        text = json.dumps(self.as_dict(), indent=kw.pop("indent", 2), **kw)
        if path is not None:
            with open(path, "w", encoding="utf-8") as f:
                f.write(text + "\n")
        return text

    def summary_line(self) -> str:
        counts: dict[str, int] = {}
        for r in self.results:
            counts[r.status.value] = counts.get(r.status.value, 0) + 1
        parts = ", ".join(f"{n} {s}" for s, n in counts.items())
        v = self.versions
        by_kind = "; ".join(f"{k.value}: {', '.join(names)}" for k in Kind
                            if (names := self.applied_of(k)))
        return (f"speculators-compat {v.get('speculators_compat')} active in {self.process} "
                f"pid {self.pid} (vllm {v.get('vllm')}, speculators {v.get('speculators')}): "
                f"{parts}; applied: {by_kind or 'none'}")

    def __str__(self) -> str:
        lines = [self.summary_line()]
        width = max((len(r.name) for r in self.results), default=0)
        for r in self.results:
            lines.append(f"  {r.name:<{width}}  {r.status.value:<10}  {r.kind:<15}  {r.reason}")
        return "\n".join(lines)


class Activation:
    """Process-wide activation state (one per process), guarded by a lock."""

    def __init__(self, adapters: Callable[[], Sequence[Adapter]],
                 on_activate: Callable[[Patcher, str], None] | None = None) -> None:
        self._adapters = adapters
        #: Called with (patcher, process) after the adapters; changes go through the patcher
        #: (the package uses it to put its interpreter-start hook on PYTHONPATH).
        self._on_activate = on_activate
        self._lock = threading.RLock()
        self._patcher = Patcher()
        self.report: Report | None = None
        #: adapter name -> the targets (``"module:Qualified.name"``) its ``apply()`` or
        #: ``refuse()`` changed in this activation, as the Patcher recorded them (the
        #: contract suite compares them with the adapter's declared targets).
        self.touched: dict[str, list[str]] = {}
        self._logged = False

    @property
    def active(self) -> bool:
        return self.report is not None and self.report.active

    def activate(self, *, only: Iterable[str] | None = None, strict: bool | None = None,
                 process: str = "driver", write_report: bool | None = None) -> Report:
        """``write_report``: write ``SPECULATORS_COMPAT_REPORT_FILE`` (default: in the
        driver); a child started by an activated process passes ``False``."""
        with self._lock:
            if self.active:
                assert self.report is not None
                logger.debug("speculators-compat already active: %s", self.report.summary_line())
                return self.report
            adapters = list(self._adapters())
            known = {a.name for a in adapters}
            selected = None if only is None else set(only)
            if selected is not None and selected - known:
                raise ValueError(
                    f"speculators-compat: unknown adapter name(s) {sorted(selected - known)}; "
                    f"known: {sorted(known)}")
            disabled = _env.names(os.environ.get(_env.DISABLE))
            known_or_kind = known | {k.value for k in Kind if k is not Kind.SCOPE}
            if disabled - known_or_kind:
                logger.warning("speculators-compat: %s names unknown adapter(s) %s; known: %s",
                               _env.DISABLE, sorted(disabled - known_or_kind),
                               sorted(known_or_kind))
            strict = _env.flag(os.environ.get(_env.STRICT)) if strict is None else strict
            ctx = Context(process)
            self.touched = {}
            results = []
            try:
                for a in adapters:
                    results.append(self._run_one(a, ctx, selected, disabled))
                self._patcher.setenv(_env.ACTIVE, "1")
                if self._on_activate is not None:
                    self._on_activate(self._patcher, process)
            except BaseException:
                # UnsupportedError, or an interrupt (Ctrl+C) inside a probe or an apply:
                # leave nothing half-patched, so a later activate() starts from scratch.
                self._patcher.revert(0)
                raise
            report = Report(results, ctx.versions, os.getpid(), process, strict, True)
            self.report = report
            if strict and report.problems:
                self.deactivate()
                report.active = False
                details = "; ".join(f"{r.name}: {r.status.value}: {r.reason}"
                                    for r in report.problems)
                raise CompatError(
                    f"speculators-compat (strict): {details}. Nothing was patched. "
                    f"Unset {_env.STRICT} to run with the remaining adapters, or disable "
                    f"these with {_env.DISABLE}=<name,...> if you know they do not matter.")
            self._log(report)
            if write_report is None:
                write_report = process == "driver"
            path = os.environ.get(_env.REPORT_FILE) if write_report else None
            if path:
                try:
                    report.to_json(path)
                except OSError as exc:
                    logger.warning("speculators-compat: could not write the report to %s=%s: %s",
                                   _env.REPORT_FILE, path, exc)
            return report

    def _run_one(self, adapter: Adapter, ctx: Context, selected: set[str] | None,
                 disabled: frozenset[str]) -> AdapterResult:
        def result(status: Status, reason: str, changes: list[str] | None = None):
            return AdapterResult(adapter.name, status, reason, adapter.upstream, adapter.summary,
                                 adapter.phase.value, adapter.vllm_range, changes or [],
                                 adapter.kind.value)

        by_kind = adapter.kind is not Kind.SCOPE and adapter.kind.value in disabled
        if adapter.name in disabled or by_kind:
            return result(Status.DISABLED, f"disabled by {_env.DISABLE}")
        if selected is not None and adapter.name not in selected:
            return result(Status.DISABLED, "not selected by activate(only=...)")
        if ctx.process == "worker" and adapter.phase is Phase.DRIVER:
            return result(Status.NOT_NEEDED, "driver-side adapter; this is a vLLM worker process")
        try:
            verdict = adapter.probe(ctx)
        except UnsupportedError as exc:
            if ctx.process == "driver":
                raise
            return result(Status.MISMATCH, str(exc))
        except Exception as exc:  # a probe must never take the user down
            logger.debug("probe of %s raised", adapter.name, exc_info=True)
            return self._fail_closed(adapter, ctx, result(Status.FAILED,
                                                          f"probe raised {exc!r}"))
        if not verdict.apply:
            return self._fail_closed(adapter, ctx, result(verdict.status, verdict.reason))
        reason = verdict.reason
        vllm = ctx.versions.get("vllm")
        if adapter.vllm_range and _versions.in_range(vllm, adapter.vllm_range) is False:
            # The probe decides (nightlies, backports); the range is the declared guard,
            # so say loudly that this installation is outside it.
            reason += f" [vLLM {vllm} is outside the declared range {adapter.vllm_range}]"
            logger.warning("speculators-compat: adapter %s applies outside its declared vLLM "
                           "range %s (vLLM %s): the probe found the old API shape",
                           adapter.name, adapter.vllm_range, vllm)
        mark = len(self._patcher)
        try:
            adapter.apply(self._patcher, ctx)
        except Exception as exc:
            logger.debug("apply of %s raised", adapter.name, exc_info=True)
            try:
                self._patcher.revert(mark)
            except Exception:  # noqa: BLE001
                pass
            return self._fail_closed(adapter, ctx, result(
                Status.FAILED, f"apply raised {exc!r}; rolled back"))
        self.touched[adapter.name] = self._patcher.targets(mark)
        return result(Status.APPLIED, reason, self._patcher.changes()[mark:])

    def _fail_closed(self, adapter: Adapter, ctx: Context, res: AdapterResult) -> AdapterResult:
        """A data-guarding adapter that could not act: make what it guards refuse."""
        if not (adapter.fail_closed and res.status in (Status.MISMATCH, Status.FAILED)
                and ctx.process == "driver"):
            return res
        message = (f"speculators-compat: adapter {adapter.name} could not be applied "
                   f"({res.status.value}: {res.reason}); without it the hidden states could be "
                   f"silently wrong ({adapter.summary}), so the generator refuses to run. "
                   f"Report the installed versions; to run without it anyway, set "
                   f"{_env.DISABLE}={adapter.name}.")
        mark = len(self._patcher)
        try:
            adapter.refuse(self._patcher, ctx, message)
        except Exception as exc:  # nothing to guard (e.g. no generator): say so
            logger.debug("refuse of %s raised", adapter.name, exc_info=True)
            try:
                self._patcher.revert(mark)
            except Exception:  # noqa: BLE001 - already logged by revert()
                pass
            res.reason += f"; could not install the refusal: {exc!r}"
            return res
        res.changes = self._patcher.changes()[mark:]
        self.touched[adapter.name] = self._patcher.targets(mark)
        if res.changes:
            res.reason += "; fail closed: the generator refuses to run"
        return res

    def _log(self, report: Report) -> None:
        if not self._logged:
            logger.info(report.summary_line())
            self._logged = True
        else:
            logger.debug(report.summary_line())
        for r in report.problems:
            logger.warning("speculators-compat: adapter %s %s: %s", r.name, r.status.value,
                           r.reason)

    def deactivate(self) -> None:
        with self._lock:
            self._patcher.revert(0)
            if self.report is not None:
                self.report.active = False
            self.report = None
            self.touched = {}
