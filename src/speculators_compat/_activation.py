"""The engine: run a registry of adapters in one process, each one undoable.

:class:`Activation` probes and applies the adapters of the registry it is given, in
order, through one :class:`~speculators_compat._patcher.Patcher` (so ``deactivate()``
undoes everything, and a failed ``apply()`` is rolled back alone) and builds the
:class:`~speculators_compat._report.Report`. It knows no adapter and no entry point: the
registry and what to do after the adapters (``on_activate``) are passed in by
:mod:`speculators_compat._process`, which holds this process's one activation. The
selection it was activated with (``only=``, ``strict=``) travels to child processes
through the environment.

Dependencies: an adapter names in ``requires`` the adapters that must have applied
before it for its change to be right (``shm_transport`` and ``request_metadata_in_driver``
speak to the shim's worker extension, which only ``hook_capture`` puts in the workers).
Where one of them did not apply (disabled, not needed, mismatched, failed), the dependent
is reported not needed, naming it and its status, and is neither probed nor applied. A
requirement must come earlier in the registry, and so must what an adapter declares it
comes ``after`` (the order its change stacks in), stage by stage: :func:`check_order`,
at every activation. A name the registry does not hold at all (a registry of a single
adapter, as the contract suite builds) constrains nothing.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable, Iterable, Sequence

from . import _batch_invariant, _env, _versions
from ._adapter import Adapter, Context, Phase, Stage
from ._errors import CompatError, UnsupportedError
from ._patcher import Patcher
from ._report import AdapterResult, Kind, Report, Status

logger = logging.getLogger("speculators_compat")


class Activation:
    """One activation of a registry (apply, report, undo), guarded by a lock."""

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
        #: Where this activation writes its report (``SPECULATORS_COMPAT_REPORT_FILE``;
        #: ``None`` in children and without the variable): rewritten as data is generated.
        self.report_path: str | None = None
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
            inherited = only is None and _env.ONLY in os.environ
            if inherited:  # the selection of the process that started this one
                only = _env.names(os.environ[_env.ONLY])
            selected = None if only is None else set(only)
            if selected is not None and selected - known:
                origin = f"{_env.ONLY} (set by activate(only=...))" if inherited else "only="
                raise ValueError(
                    f"speculators-compat: {origin} names unknown adapter(s) "
                    f"{sorted(selected - known)}; known: {sorted(known)}")
            disabled = _env.names(os.environ.get(_env.DISABLE))
            known_or_kind = known | {k.value for k in Kind if k is not Kind.SCOPE}
            if disabled - known_or_kind:
                logger.warning("speculators-compat: %s names unknown adapter(s) %s; known: %s",
                               _env.DISABLE, sorted(disabled - known_or_kind),
                               sorted(known_or_kind))
            strict = _env.flag(os.environ.get(_env.STRICT)) if strict is None else strict
            check_order(adapters)
            ctx = Context(process)
            self.touched = {}
            results = []
            done: dict[str, AdapterResult] = {}
            try:
                for a in adapters:
                    res = self._run_one(a, ctx, selected, disabled, done)
                    done[a.name] = res
                    results.append(res)
                self._patcher.setenv(_env.ACTIVE, "1")
                self._pass_on(selected, strict)
                if _batch_invariant.requested():
                    logger.info("speculators-compat: batch-invariant kernels on: %s",
                                _batch_invariant.enable(self._patcher))
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
                self.report_path = path  # rewritten once a generator has run (its folder
                try:                     # may only exist by then)
                    report.to_json(path)
                except OSError as exc:
                    logger.warning("speculators-compat: could not write the report to %s=%s: %s",
                                   _env.REPORT_FILE, path, exc)
            return report

    def _pass_on(self, selected: set[str] | None, strict: bool) -> None:
        """Make the processes started from this one (vLLM's workers, through the plugin
        and the interpreter-start hook) activate with the same ``only`` and ``strict``:
        through the environment they inherit, restored by ``deactivate()``."""
        if selected is not None and _env.names(os.environ.get(_env.ONLY)) != selected:
            self._patcher.setenv(_env.ONLY, ",".join(sorted(selected)))
        if strict != _env.flag(os.environ.get(_env.STRICT)):
            self._patcher.setenv(_env.STRICT, "1" if strict else "0")

    def _run_one(self, adapter: Adapter, ctx: Context, selected: set[str] | None,
                 disabled: frozenset[str], done: dict[str, AdapterResult]) -> AdapterResult:
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
        unmet = _unmet(adapter, done)
        if unmet is not None:
            return result(Status.NOT_NEEDED, unmet)
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
            self.report_path = None
            self.touched = {}


def check_order(adapters: Sequence[Adapter]) -> None:
    """Raise ``ValueError`` where the registry ``adapters`` breaks a declared order: a
    stage after a later one, or an adapter before one it ``requires`` or comes ``after``
    (the engine decides a dependent from its requirements' results, so those must exist;
    wrappers and executor hooks stack in registry order). Names the registry does not
    hold constrain nothing (a registry of a single adapter, as the contract suite builds)."""
    position = {a.name: i for i, a in enumerate(adapters)}
    stages = list(Stage)
    for i, a in enumerate(adapters):
        late = [r for r in a.requires if position.get(r, -1) >= i]
        if late:
            raise ValueError(f"speculators-compat: adapter {a.name} requires {late}, which the "
                             "registry lists after it (or is the adapter itself); a requirement "
                             "must come earlier")
        late = [r for r in a.after if position.get(r, -1) >= i]
        if late:
            raise ValueError(f"speculators-compat: adapter {a.name} declares after={late}, but "
                             f"the registry lists {late} after it (or it is the adapter "
                             "itself); move it below them")
        if i and stages.index(adapters[i - 1].stage) > stages.index(a.stage):
            raise ValueError(f"speculators-compat: adapter {a.name} (stage {a.stage.value}) "
                             f"comes after {adapters[i - 1].name} (stage "
                             f"{adapters[i - 1].stage.value}); the registry is ordered by stage")


def _unmet(adapter: Adapter, done: dict[str, AdapterResult]) -> str | None:
    """Why ``adapter`` must not act: the first of its requirements that did not apply in
    this activation (``None``: all of those the registry holds applied)."""
    for name in adapter.requires:
        dep = done.get(name)
        if dep is not None and dep.status is not Status.APPLIED:
            return f"requires {name}, which is {dep.status.value} here ({dep.reason})"
    return None
