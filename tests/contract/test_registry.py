"""The registry as a whole against the real vLLM and speculators: every adapter covered,
all of them at once leave vLLM's own objects identical (strict mode included), a foreign
API shape is a mismatch, and the package-global activation is never used here."""

from __future__ import annotations

import importlib
import importlib.util

import pytest

from speculators_compat._activation import Activation
from speculators_compat._errors import CompatError
from speculators_compat._executor import GeneratorExecutor
from speculators_compat._report import Status
from speculators_compat.adapters import ADAPTERS
from speculators_compat.adapters._base import ExecutorFeature

from .support import (
    ADAPTER_NAMES,
    APPLIED,
    BY_NAME,
    EXPECTED,
    KV_UTILS,
    PRE_IMPORT,
    Base,
    _consumer_owned,
    _deactivating,
    _vllm_owned,
    activated,
    diff,
    expected_status,
    report_changes,
    snapshot,
)


def test_every_adapter_has_an_expectation_and_a_contract_file():
    """Each adapter of the registry has its own contract file,
    ``tests/contract/adapters/test_<name>.py`` (copy one to add one), holding its row of
    ``expectations.EXPECTED``."""
    from pathlib import Path

    here = Path(__file__).resolve().parent / "adapters"
    assert set(EXPECTED) == set(ADAPTER_NAMES), (
        "adapters without EXPECTED in their contract file: "
        f"{sorted(set(ADAPTER_NAMES) - set(EXPECTED))}")
    missing = [n for n in ADAPTER_NAMES if not (here / f"test_{n}.py").is_file()]
    assert not missing, f"adapters without a contract file in {here}: {missing}"
    assert len(ADAPTER_NAMES) == len(set(ADAPTER_NAMES)), "duplicate adapter names"


def test_all_adapters_leave_vllm_untouched(base: Base):
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.executor.multiproc_executor import MultiprocExecutor
    from vllm.v1.request import Request

    with base.suspended():
        vllm_spaces = _vllm_owned()
        spaces = {**vllm_spaces, **_consumer_owned(base.gen)}
        before = snapshot(spaces)
        act = Activation(lambda: list(ADAPTERS))
        with _deactivating(act) as report:
            statuses = {r.name: r.status for r in report.results}
            assert statuses == {n: expected_status(n, base.env) for n in ADAPTER_NAMES}
            assert not report.problems
            during = snapshot(spaces)
            added_by_report = report_changes(report, "kv_cache_helpers_relocated")
            vllm_changed = {c for c in diff(before, during)
                            if c.rsplit(".", 1)[0] in vllm_spaces}
            assert vllm_changed == added_by_report, sorted(vllm_changed)
            assert all(c.rsplit(".", 1)[1] not in before[KV_UTILS] for c in added_by_report)
            listed = set().union(*(report_changes(report, n) for n in ADAPTER_NAMES))
            for n in ADAPTER_NAMES:  # everything at once: still only declared targets
                assert set(act.touched.get(n, [])) <= set(BY_NAME[n].targets), n
            assert {c for c in diff(before, during) if not c.startswith("os.environ")} == listed
            # vLLM's own engine sees vLLM's classes; speculators sees subclasses.
            mod = importlib.import_module
            assert mod("vllm.v1.core.sched.scheduler").Scheduler is Scheduler
            assert mod("vllm.v1.executor.multiproc_executor").MultiprocExecutor is MultiprocExecutor
            assert mod("vllm.v1.request").Request is Request
            gen = base.gen
            assert issubclass(gen.MultiprocExecutor, MultiprocExecutor)
            assert issubclass(gen.Scheduler, Scheduler)
            # one executor class over vLLM's whatever applies, its features' hooks in
            # registry order (the last one outermost)
            executor_features = [a.name for a in ADAPTERS
                                 if isinstance(a, ExecutorFeature) and statuses[a.name] is APPLIED]
            if executor_features:
                mro = gen.MultiprocExecutor.__mro__
                assert mro[1:3] == (GeneratorExecutor, MultiprocExecutor), mro
                assert list(gen.MultiprocExecutor.compat_feature_names) == executor_features
            else:
                assert gen.MultiprocExecutor is MultiprocExecutor
            sched_shims = [n for n in ("kv_cache_groups_hybrid", "scheduler_block_size",
                                          "scheduler_prefill_only")
                           if statuses[n] is APPLIED]
            assert gen.Scheduler.__mro__[len(sched_shims)] is Scheduler
        after = snapshot(spaces)
    assert diff(before, after) == set()

def test_strict_activation_raises_nothing(base: Base):
    with base.suspended(), activated(*ADAPTERS, strict=True) as report:
        assert report.active and report.strict
        assert report.problems == []
        assert not report.by_status(Status.FAILED) and not report.by_status(Status.MISMATCH)
        assert set(report.applied) == {n for n in ADAPTER_NAMES
                                       if expected_status(n, base.env) is APPLIED}

def test_foreign_api_shape_is_a_mismatch_and_strict_refuses(base: Base, monkeypatch):
    """An installed API of neither the old nor the known new shape (a future vLLM): the
    adapter reports ``mismatch`` and changes nothing; strict mode raises and leaves
    nothing patched. Simulated by rebinding, in speculators' real module, the KV helper to
    a function of another signature."""
    gen = base.gen

    def get_kv_cache_config_from_groups(vllm_config, groups, budget):  # foreign shape
        raise AssertionError("never called")

    monkeypatch.setattr(gen, "get_kv_cache_config_from_groups", get_kv_cache_config_from_groups)
    spaces = {**_vllm_owned(), **_consumer_owned(gen)}
    before = snapshot(spaces)
    adapter = BY_NAME["kv_cache_specs_kwarg"]
    with activated(adapter) as report:
        assert report[adapter.name].status is Status.MISMATCH, report[adapter.name]
        assert "get_kv_cache_config_from_groups" in report[adapter.name].reason
        assert gen.get_kv_cache_config_from_groups is get_kv_cache_config_from_groups
    others = [a for a in ADAPTERS if a.name not in PRE_IMPORT]  # all, as a user activates
    with pytest.raises(CompatError, match=r"strict.*kv_cache_specs_kwarg: mismatch"), \
            activated(*others, strict=True):
        pass  # pragma: no cover - activation raises
    assert gen.get_kv_cache_config_from_groups is get_kv_cache_config_from_groups
    assert diff(before, snapshot(spaces)) == set()

def test_global_activation_never_used(base: Base):
    import speculators_compat

    assert speculators_compat.report() is None
