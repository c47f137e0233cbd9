"""Contract of the ``shutdown_at_exit`` adapter, on the installed vLLM and speculators.

The installed speculators' generator stops its executor only in ``__del__`` (what the
adapter relies on); through the adapter an ``atexit`` handler is registered while active
(and unregistered by ``deactivate()``), and at exit it shuts each live generator's
executor down once, leaving ``__del__`` nothing to do. A generator alive at interpreter
exit runs end to end in the e2e suite (tests/e2e/test_reliability.py: no "Exception
ignored", no worker left).

The checks every adapter shares are in tests/contract/test_every_adapter.py.
"""

from __future__ import annotations

import atexit
import inspect

from ..expectations import V, applied_if
from ..support import BY_NAME, one

NAME = "shutdown_at_exit"

#: Its expected status on the installed release, and why (read by ``expectations.py``).
EXPECTED = (
    # speculators' own __del__ (both releases) is its only shutdown, independent of the
    # vLLM release.
    lambda e: applied_if(e.speculators < V("0.5.0.dev0")),
    "speculators 0.3/0.4 stop the executor only in __del__ (teardown, at exit)")


class _Executor:
    def __init__(self):
        self.shutdowns = 0

    def shutdown(self):
        self.shutdowns += 1


def test_upstream_stops_the_executor_only_in_del(base):
    cls = base.gen.VllmHiddenStatesGenerator
    assert "self.executor.shutdown()" in inspect.getsource(cls.__del__)
    assert not hasattr(cls, "shutdown") and not hasattr(cls, "close")


def test_handler_registered_while_active(base, monkeypatch):
    handlers = []
    monkeypatch.setattr(atexit, "register", handlers.append)
    monkeypatch.setattr(atexit, "unregister", handlers.remove)
    with one(base, BY_NAME[NAME]) as applied:
        assert applied
        assert len(handlers) == 1
    assert handlers == []


def test_exit_shuts_each_live_generator_down_once(base):
    from speculators_compat.adapters.shutdown_at_exit import shut_down

    cls = base.gen.VllmHiddenStatesGenerator
    gens = [object.__new__(cls) for _ in range(2)]
    for g in gens:
        g.executor = _Executor()
    failing = object.__new__(cls)
    failing.executor = _Executor()
    failing.executor.shutdown = None  # calling it raises TypeError: logged, exit goes on
    assert shut_down([*gens, failing]) == 2
    assert shut_down(gens) == 0  # already done
    for g in gens:
        g.__del__()  # upstream's finalizer at teardown: nothing left to do
        assert g.executor.shutdowns == 1
