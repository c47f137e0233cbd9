"""generate_guard's error paths with a fake generator module (no vLLM): cleanup after a
failure, interrupts, stale replies, half-patched generators, token-id ranges.

The real-vLLM counterparts are in tests/e2e/test_errors.py; these pin the logic down
(and show each check refusing a known-wrong state) where no engine is needed.
"""

from __future__ import annotations

import logging
import sys
import types

import pytest

from speculators_compat import worker_extension
from speculators_compat._adapter import Context
from speculators_compat._errors import CompatError
from speculators_compat._patcher import Patcher
from speculators_compat.adapters import generate_guard
from speculators_compat.adapters._worker_extensions import WORKER_EXTENSION_KEY, running_extensions
from speculators_compat.adapters.generate_guard import GenerateGuard, validate_batch

OURS = worker_extension.EXTENSIONS["by_request"]


class SpeculatorsOwn:
    """Stands for speculators' HiddenStatesWorkerExtension (same qualified name)."""


SpeculatorsOwn.__module__ = "speculators.data_generation.custom_worker"
SpeculatorsOwn.__qualname__ = "HiddenStatesWorkerExtension"


class Worker(worker_extension.ByRequestContractExtension):
    pass


class OwnWorker(SpeculatorsOwn):
    pass


class Executor:
    def __init__(self, worker=None, stale=None):
        self.worker = worker or Worker()
        self.stale = stale  # a reply left in the queue by an earlier call
        self.calls: list[tuple[str, float | None]] = []

    def collective_rpc(self, method, timeout=None, args=(), kwargs=None):
        self.calls.append((getattr(method, "__name__", method), timeout))
        if self.stale is not None:
            reply, self.stale = self.stale, None
            return [reply]
        if callable(method):
            return [method(self.worker, *args)]
        return [None]


class Scheduler:
    def __init__(self):
        self.requests, self.running, self.waiting = {}, [], []
        self.aborted: list[str] = []

    def _compat_abort_all(self):
        self.aborted += list(self.requests)
        self.requests, self.running, self.waiting = {}, [], []


class ModelConfig:
    def get_vocab_size(self):
        return 100


class Generator:
    def __init__(self, executor=None, scheduler=None, fail=None):
        self.vllm_config = types.SimpleNamespace(model_config=ModelConfig())
        self.executor = executor or gen_module.MultiprocExecutor()
        self.scheduler = scheduler or gen_module.Scheduler()
        self._request_counter = 0
        self.fail = fail
        self.generated = 0

    def generate(self, token_ids):
        for i, _ in enumerate(token_ids):
            self.scheduler.requests[f"req_{self._request_counter}_{i}"] = object()
        self._request_counter += 1
        if self.fail is not None:
            raise self.fail
        self.scheduler.requests.clear()
        self.generated += 1
        return [{"input_ids": t} for t in token_ids]


gen_module = types.ModuleType("fake_generator_module")
gen_module.Scheduler = Scheduler
gen_module.MultiprocExecutor = Executor
gen_module.VllmHiddenStatesGenerator = Generator


@pytest.fixture
def guard():
    """Patch the fake module's generator as activation would; undone afterwards."""
    patcher = Patcher()
    ctx = Context()
    ctx.memo(WORKER_EXTENSION_KEY, lambda: OURS)  # what hook_capture names when applied
    GenerateGuard().patch(patcher, ctx, gen_module)
    yield patcher
    patcher.revert(0)


def test_token_ids_out_of_range_name_sequence_and_position():
    validate_batch([[0, 99]], 100)
    with pytest.raises(CompatError, match=r"sequence 1 has token id 100 at position 2, .*0\.\.99"):
        validate_batch([[1], [5, 6, 100]], 100)
    with pytest.raises(CompatError, match="sequence 0 has token id -3 at position 1"):
        validate_batch([[1, -3]], 100)
    validate_batch([[10**6]], None)  # no vocabulary known: types only


def test_out_of_range_token_is_refused_before_anything_is_added(guard):
    g = Generator()
    with pytest.raises(CompatError, match="token id 100"):
        g.generate([[1, 2], [100]])
    assert g.scheduler.requests == {} and g.executor.calls == []


def test_failed_call_aborts_everything_and_resyncs_the_workers(guard):
    g = Generator(fail=RuntimeError("step failed"))
    with pytest.raises(RuntimeError, match="step failed"):
        g.generate([[1, 2]] * 3)
    assert g.scheduler.aborted == ["req_0_0", "req_0_1", "req_0_2"]
    assert g.scheduler.requests == {}
    # checked first (the worker list), then echo + reset, each with a timeout
    names = [name for name, _ in g.executor.calls]
    assert names == ["worker_classes", "echo", "_reset_capture"], names
    assert all(t == generate_guard.RPC_TIMEOUT_S for _, t in g.executor.calls)
    g.fail = None
    assert g.generate([[3]]) == [{"input_ids": [3]}]  # still usable


def test_stale_reply_is_detected_logged_and_retires_the_generator(guard, caplog):
    g = Generator()
    g.generate([[1]])  # first call: instance checked
    g.fail = RuntimeError("step failed")
    g.executor.stale = "reply of the failed step"
    with caplog.at_level(logging.WARNING, "speculators_compat"), \
            pytest.raises(RuntimeError, match="step failed") as exc:
        g.generate([[1]])
    assert "out of step" in caplog.text
    if sys.version_info >= (3, 11):  # BaseException.add_note
        assert "out of step" in exc.value.__notes__[0]
    g.fail = None
    with pytest.raises(CompatError, match="cleaning up after a failed generate"):
        g.generate([[1]])


def test_interrupt_issues_no_rpc_and_retires_the_generator(guard):
    g = Generator()
    g.generate([[1]])
    before = list(g.executor.calls)
    g.fail = KeyboardInterrupt()
    with pytest.raises(KeyboardInterrupt):
        g.generate([[1]])
    assert g.executor.calls == before  # no RPC after the interrupt
    g.fail = None
    with pytest.raises(CompatError, match="interrupted .*KeyboardInterrupt.*new Vllm"):
        g.generate([[1]])


def test_workers_running_another_extension_are_refused(guard):
    g = Generator(executor=Executor(worker=OwnWorker()))
    assert running_extensions(g.executor) == [["speculators.data_generation.custom_worker."
                                               "HiddenStatesWorkerExtension"]]
    with pytest.raises(CompatError, match=r"not built under the current activation.*workers "
                                          r"run \[\['speculators\.data_generation"):
        g.generate([[1]])
    assert g.generated == 0
    with pytest.raises(CompatError, match="not built under the current activation"):
        g.generate([[1]])  # and stays refused


def test_parts_built_outside_the_activation_are_refused(guard):
    class OldScheduler(Scheduler):
        pass

    g = Generator(scheduler=OldScheduler())
    with pytest.raises(CompatError, match="its scheduler is a .*OldScheduler"):
        g.generate([[1]])


def test_deactivate_retires_generators_built_while_active():
    patcher = Patcher()
    ctx = Context()
    ctx.memo(WORKER_EXTENSION_KEY, lambda: OURS)
    GenerateGuard().patch(patcher, ctx, gen_module)
    g = Generator()
    g.generate([[1]])
    patcher.revert(0)
    assert not hasattr(vars(Generator)["generate"], "__wrapped__")  # unwrapped
    with pytest.raises(CompatError, match=r"deactivate\(\) has since removed"):
        g.generate([[1]])
    assert Generator().generate([[2]]) == [{"input_ids": [2]}]  # built after: plain class
