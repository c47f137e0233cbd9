"""Stop a generator's vLLM workers when the interpreter exits, while modules still work.

Why: speculators 0.3/0.4 stop the generator's ``MultiprocExecutor`` only in
``VllmHiddenStatesGenerator.__del__``. A generator still alive when the script ends
(held by a module-level name, as in a script that builds it under ``if __name__ ==
"__main__":``, or by a reference cycle; speculators' offline script builds it inside a
function and drops it on return) is collected during interpreter teardown, after Python
has set module globals to ``None``. Whether that works depends on vLLM's shutdown code,
which does not promise to run at teardown: on vLLM 0.32 ``MultiprocExecutor.shutdown``
fails at its closing ``logger.debug_once`` (after the workers are stopped), and
speculators' handler fails in turn on its own ``log.warning``, so the run ends with
``Exception ignored in: <function VllmHiddenStatesGenerator.__del__ ...>
AttributeError: 'NoneType' object has no attribute 'warning'``; vLLM 0.16's shutdown uses
no module global there and exits cleanly (both seen on CPU builds, 2026-12-05). The
handler acts on every release: stopping the workers before teardown is what ``__del__``
would do, only earlier.
How: wrap ``VllmHiddenStatesGenerator.__init__`` to remember (weakly) each generator
built while active, and register one ``atexit`` handler. At exit it shuts down the
executor of every remembered generator still alive, in full, before teardown begins;
then the executor's ``shutdown`` becomes a no-op on that instance, so the ``__del__``
that runs during teardown has nothing left to do. A shutdown that fails is logged, never
raised (exit goes on). ``deactivate()`` unregisters the handler; generators built
while active then end as upstream ends them.
Applies when: speculators' generator stops its executor in ``__del__`` (0.3/0.4).
Remove when: speculators < 0.5 support is dropped.
"""

from __future__ import annotations

import atexit
import inspect
import logging
import weakref
from types import ModuleType

from .._adapter import Context, Verdict
from .._patcher import Patcher, _label, target_of
from .._report import Kind
from . import _targets
from ._base import GeneratorAdapter

logger = logging.getLogger("speculators_compat")


def _noop_shutdown() -> None:
    """An executor's ``shutdown`` once it has been shut down at exit."""


def shut_down(generators) -> int:
    """Shut down the executor of each generator in ``generators`` (once), then make its
    ``shutdown`` a no-op; returns how many were shut down. Never raises."""
    done = 0
    for generator in list(generators):
        executor = getattr(generator, "executor", None)
        if executor is None or vars(executor).get("shutdown") is _noop_shutdown:
            continue
        try:
            executor.shutdown()
            done += 1
        except Exception as exc:  # noqa: BLE001 - exiting: report, go on
            logger.warning("speculators-compat: stopping a generator's vLLM workers at "
                           "exit failed: %r", exc)
        try:
            vars(executor)["shutdown"] = _noop_shutdown
        except TypeError:  # no instance __dict__: __del__ then runs vLLM's shutdown again
            pass
    return done


class ShutdownAtExit(GeneratorAdapter):
    name = "shutdown_at_exit"
    kind = Kind.SAFEGUARD
    summary = ("stop a generator's vLLM workers at interpreter exit, before teardown "
               "breaks vLLM's shutdown")
    upstream = ("speculators 0.3/0.4 stop the executor only in __del__, which runs during "
                "teardown for a generator alive at exit")
    vllm_range = None
    remove_when = "speculators < 0.5 support is dropped"
    targets = _targets.in_generator("VllmHiddenStatesGenerator.__init__")

    def check(self, ctx: Context, gen: ModuleType) -> Verdict:
        cls = gen.VllmHiddenStatesGenerator
        finalizer = getattr(cls, "__del__", None)
        try:
            stops_executor = finalizer is not None and "shutdown" in inspect.getsource(finalizer)
        except (OSError, TypeError):
            stops_executor = False
        if not stops_executor:
            return Verdict.not_needed("the generator does not stop its executor in __del__")
        return Verdict.needed("the generator stops its executor only in __del__, which runs "
                              "during interpreter teardown for a generator alive at exit")

    def patch(self, patcher: Patcher, ctx: Context, gen: ModuleType) -> None:
        cls = gen.VllmHiddenStatesGenerator
        alive: weakref.WeakSet = weakref.WeakSet()

        def at_exit() -> None:
            shut_down(alive)

        def init(wrapped, instance, args, kwargs):
            out = wrapped(*args, **kwargs)
            alive.add(instance)
            return out

        patcher.wrap(cls, "__init__", init)
        atexit.register(at_exit)
        # Same label as the __init__ wrap: both belong to what building a generator leaves.
        patcher.on_revert(f"{_label(cls)}.__init__", lambda: atexit.unregister(at_exit),
                          target_of(cls, "__init__"))
