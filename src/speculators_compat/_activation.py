"""Activation: run the adapters in one process, and the process-wide activation state.

:class:`Activation` probes and applies a registry of adapters through one
:class:`~speculators_compat._patcher.Patcher` (so ``deactivate()`` undoes everything)
and builds the :class:`~speculators_compat._report.Report`. :data:`ACTIVATION` is the
one instance of this process (what ``speculators_compat.activate()``, vLLM's worker
plugin and the interpreter-start hook all act on); the selection it was activated
with (``only=``, ``strict=``) travels to child processes through the environment.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable, Iterable, Sequence

from . import _env, _versions
from ._adapter import Adapter, Context, Phase
from ._errors import CompatError, UnsupportedError
from ._patcher import Patcher
from ._report import AdapterResult, Kind, Report, Status

logger = logging.getLogger("speculators_compat")


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
            ctx = Context(process)
            self.touched = {}
            results = []
            try:
                for a in adapters:
                    results.append(self._run_one(a, ctx, selected, disabled))
                self._patcher.setenv(_env.ACTIVE, "1")
                self._pass_on(selected, strict)
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

    def _pass_on(self, selected: set[str] | None, strict: bool) -> None:
        """Make the processes started from this one (vLLM's workers, through the plugin
        and the interpreter-start hook) activate with the same ``only`` and ``strict``:
        through the environment they inherit, restored by ``deactivate()``."""
        if selected is not None and _env.names(os.environ.get(_env.ONLY)) != selected:
            self._patcher.setenv(_env.ONLY, ",".join(sorted(selected)))
        if strict != _env.flag(os.environ.get(_env.STRICT)):
            self._patcher.setenv(_env.STRICT, "1" if strict else "0")

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


# --------------------------------------------------------------------------------------
# The process-wide activation (one per process)
# --------------------------------------------------------------------------------------


def _registry() -> Sequence[Adapter]:
    from .adapters import ADAPTERS

    return ADAPTERS


def _bootstrap_hook(patcher: Patcher, process: str) -> None:
    from ._bootstrap import install

    install(patcher, process)


#: This process's activation: ``speculators_compat.activate()`` in the user's process,
#: the ``vllm.general_plugins`` entry point and the interpreter-start hook in children.
ACTIVATION = Activation(_registry, on_activate=_bootstrap_hook)


def activate(*, only: Iterable[str] | None = None, strict: bool | None = None) -> Report:
    """Apply every adapter the installed vLLM / speculators need, in this process.

    Idempotent and thread-safe: a second call returns the first call's report.
    ``only`` restricts activation to the named adapters (others are reported
    ``disabled``). ``strict=True`` (or ``SPECULATORS_COMPAT_STRICT=1``) raises
    :class:`CompatError` and patches nothing if an adapter finds an API it does not
    know (``mismatch``) or fails. ``SPECULATORS_COMPAT_DISABLE=a,b`` disables
    adapters by name. ``only`` and ``strict`` hold in every process started from here
    on as well (vLLM's workers included). Raises :class:`CompatError` (and patches
    nothing) when a speculators import that an import-time adapter had to precede
    already happened in this process (``_order``). Every Python process started from
    here on activates at interpreter start (``_bootstrap``).
    """
    from ._order import check_import_order, imported_before

    already = ACTIVATION.active
    before = imported_before()
    result = ACTIVATION.activate(only=only, strict=strict, process="driver")
    if not already:
        try:
            check_import_order(result, before)
        except CompatError:
            ACTIVATION.deactivate()
            raise
    return result


def deactivate() -> None:
    """Undo everything :func:`activate` changed, restoring the original objects."""
    if ACTIVATION.active:
        from ._order import remember_built_with_fix

        remember_built_with_fix()
    ACTIVATION.deactivate()


def report() -> Report | None:
    """The current activation's report, or ``None`` when not active."""
    return ACTIVATION.report


def save_report(path) -> str:
    """Write the activation report as JSON to ``path`` (keep it next to generated data).

    Raises :class:`CompatError` when the shim is not active, so provenance is never
    silently missing.
    """
    current = ACTIVATION.report
    if current is None:
        raise CompatError("speculators-compat is not active: call speculators_compat.activate() "
                          "before generating data, then save_report(path).")
    return current.to_json(path)
