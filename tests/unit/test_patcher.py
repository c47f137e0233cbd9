"""Patcher: every change is undone exactly (identity), last in first out."""

from __future__ import annotations

import logging
import os
import types

import pytest
import wrapt

from speculators_compat._patcher import Patcher
from speculators_compat._report import Status


def _tag(tag):
    def wrapper(wrapped, instance, args, kwargs):
        return (tag, wrapped(*args, **kwargs))

    return wrapper


# --------------------------------------------------------------------------- modules


@pytest.fixture
def modules():
    """A "provider" module and a "consumer" module holding a ``from provider import f``
    style alias (the same function object under a second name)."""
    provider = types.ModuleType("toy_provider")

    def f(x):
        return x + 1

    provider.f = f
    consumer = types.ModuleType("toy_consumer")
    consumer.f = provider.f  # from toy_provider import f
    consumer.g = provider.f  # from toy_provider import f as g
    return provider, consumer, f


def test_module_alias_rebound_and_restored_by_identity(modules):
    provider, consumer, f = modules
    p = Patcher()
    p.setattr(consumer, "f", lambda x: -x)
    assert consumer.f(1) == -1
    assert provider.f is f, "only the consumer's name is rebound"
    assert consumer.g is f
    p.revert()
    assert consumer.f is f
    assert provider.f is f
    assert len(p) == 0


def test_module_attribute_absent_before_is_deleted(modules):
    _, consumer, _ = modules
    p = Patcher()
    p.setattr(consumer, "new_name", 1)
    assert consumer.new_name == 1
    p.revert()
    assert not hasattr(consumer, "new_name")


def test_wrap_module_function_is_functionwrapper_and_reverted(modules):
    provider, consumer, f = modules
    p = Patcher()
    wrapped = p.wrap(consumer, "f", _tag("w"))
    assert isinstance(wrapped, wrapt.FunctionWrapper)
    assert consumer.f is wrapped
    assert wrapped.__wrapped__ is f
    assert consumer.f(1) == ("w", 2)
    assert provider.f(1) == 2
    p.revert()
    assert consumer.f is f
    assert consumer.f(1) == 2


def test_wrap_of_a_wrap_lifo_restores_original(modules):
    """Two adapters wrapping the same name: the second wraps the first's wrapper;
    reverting undoes both (LIFO) and the original object comes back."""
    _, consumer, f = modules
    p = Patcher()
    first = p.wrap(consumer, "f", _tag("inner"))
    second = p.wrap(consumer, "f", _tag("outer"))
    assert second.__wrapped__ is first
    assert consumer.f(1) == ("outer", ("inner", 2))
    assert p.changes() == ["toy_consumer.f", "toy_consumer.f"]
    p.revert(1)  # undo the outer one only
    assert consumer.f is first
    p.revert()
    assert consumer.f is f


def test_wrap_of_a_wrap_by_two_adapters_in_activation(modules, make_activation, toy):
    _, consumer, f = modules
    a = toy("a", change=lambda p, ctx: p.wrap(consumer, "f", _tag("a")))
    b = toy("b", change=lambda p, ctx: p.wrap(consumer, "f", _tag("b")))
    act = make_activation(a, b)
    rep = act.activate()
    assert rep.applied == ["a", "b"]
    assert consumer.f(1) == ("b", ("a", 2))
    act.deactivate()
    assert consumer.f is f


def test_revert_to_mark_keeps_earlier_changes(modules):
    _, consumer, f = modules
    p = Patcher()
    p.setattr(consumer, "x", 1)
    mark = len(p)
    p.setattr(consumer, "y", 2)
    p.setattr(consumer, "f", None)
    p.revert(mark)
    assert consumer.x == 1
    assert not hasattr(consumer, "y")
    assert consumer.f is f
    assert len(p) == mark
    p.revert()
    assert not hasattr(consumer, "x")


# --------------------------------------------------------------------------- classes


def _base_and_sub():
    class Base:
        inherited = "base-value"

        def method(self):
            return "base"

        @staticmethod
        def static():
            return "base-static"

        @classmethod
        def klass(cls):
            return cls.__name__

    class Sub(Base):
        own = "own-value"

        def method(self):
            return "sub"

        @staticmethod
        def static():
            return "sub-static"

        @classmethod
        def klass(cls):
            return "sub:" + cls.__name__

    return Base, Sub


def test_own_class_attributes_restored_by_identity_including_raw_descriptors():
    _, Sub = _base_and_sub()
    names = ["own", "method", "static", "klass"]
    before = {n: vars(Sub)[n] for n in names}
    assert isinstance(before["static"], staticmethod)
    assert isinstance(before["klass"], classmethod)
    p = Patcher()
    for n in names:
        p.setattr(Sub, n, f"patched-{n}")
    assert all(getattr(Sub, n) == f"patched-{n}" for n in names)
    p.revert()
    for n in names:
        assert vars(Sub)[n] is before[n], n
    assert Sub.static() == "sub-static"
    assert Sub().static() == "sub-static"
    assert Sub.klass() == "sub:Sub"
    assert Sub().method() == "sub"


def test_inherited_class_attribute_is_deleted_again_on_revert():
    Base, _ = _base_and_sub()

    class Leaf(Base):
        pass

    base_before = {n: vars(Base)[n] for n in ("inherited", "method", "static", "klass")}
    p = Patcher()
    p.setattr(Leaf, "inherited", "patched")
    p.setattr(Leaf, "method", lambda self: "patched")
    p.wrap(Leaf, "static", _tag("w"))
    assert "inherited" in vars(Leaf) and "method" in vars(Leaf) and "static" in vars(Leaf)
    assert Leaf.inherited == "patched"
    assert Base.inherited == "base-value"
    p.revert()
    for n in ("inherited", "method", "static"):
        assert n not in vars(Leaf), n
    assert Leaf.inherited == "base-value"
    assert Leaf().method() == "base"
    assert Leaf.static() == "base-static"
    for n, v in base_before.items():
        assert vars(Base)[n] is v
    # later changes to the base show through (the value was not copied onto Leaf)
    Base.inherited = "changed-on-base"
    assert Leaf.inherited == "changed-on-base"


def test_wrap_own_method_reverted_to_original():
    Base, _ = _base_and_sub()
    original = vars(Base)["method"]
    p = Patcher()
    p.wrap(Base, "method", _tag("w"))
    assert Base().method() == ("w", "base")
    p.revert()
    assert vars(Base)["method"] is original


def test_wrap_own_staticmethod_and_classmethod_reverted_to_raw_descriptors():
    Base, _ = _base_and_sub()
    raw_static, raw_klass = vars(Base)["static"], vars(Base)["klass"]
    p = Patcher()
    p.wrap(Base, "static", _tag("s"))
    p.wrap(Base, "klass", _tag("k"))
    assert Base.static() == ("s", "base-static")
    assert Base.klass() == ("k", "Base")
    p.revert()
    assert vars(Base)["static"] is raw_static
    assert vars(Base)["klass"] is raw_klass


def test_wrapped_staticmethod_still_static_through_instance():
    Base, _ = _base_and_sub()
    p = Patcher()
    p.wrap(Base, "static", _tag("s"))
    try:
        assert Base().static() == ("s", "base-static")
    finally:
        p.revert()


def test_wrapped_classmethod_still_receives_subclass():
    Base, _ = _base_and_sub()

    class Leaf(Base):
        pass

    p = Patcher()
    p.wrap(Base, "klass", _tag("k"))
    try:
        assert Leaf.klass() == ("k", "Leaf")
    finally:
        p.revert()


def test_wrapped_inherited_staticmethod_stays_static_through_instance():
    """The wrapped name is an *inherited* staticmethod: looked up along the MRO (as
    ``wrapt.resolve_path`` does), the raw descriptor is wrapped, so an instance call
    passes no ``self`` (before: ``TypeError: static() takes 0 positional arguments but
    1 was given``)."""
    Base, _ = _base_and_sub()

    class Leaf(Base):
        pass

    p = Patcher()
    p.wrap(Leaf, "static", _tag("s"))
    try:
        assert Leaf().static() == ("s", "base-static")
        assert Leaf.static() == ("s", "base-static")
        assert vars(Base)["static"].__func__() == "base-static"  # Base untouched
    finally:
        p.revert()
    assert "static" not in vars(Leaf)


def test_wrapped_inherited_classmethod_still_receives_the_class():
    Base, _ = _base_and_sub()

    class Leaf(Base):
        pass

    class Deeper(Leaf):
        pass

    p = Patcher()
    p.wrap(Leaf, "klass", _tag("k"))
    try:
        assert Leaf.klass() == ("k", "Leaf")
        assert Leaf().klass() == ("k", "Leaf")
        assert Deeper.klass() == ("k", "Deeper")
        assert Base.klass() == "Base"
    finally:
        p.revert()
    assert "klass" not in vars(Leaf)


def test_wrapped_inherited_method_binds_the_instance():
    Base, _ = _base_and_sub()

    class Leaf(Base):
        pass

    p = Patcher()
    p.wrap(Leaf, "method", _tag("m"))
    try:
        assert Leaf().method() == ("m", "base")
        assert Base().method() == "base"
    finally:
        p.revert()


# --------------------------------------------------------------------------- instances


def test_instance_attribute_absent_before_is_deleted():
    class C:
        attr = "class-value"

    obj = C()
    p = Patcher()
    p.setattr(obj, "attr", "instance-value")
    p.setattr(obj, "brand_new", 1)
    assert obj.attr == "instance-value"
    p.revert()
    assert "attr" not in vars(obj)
    assert "brand_new" not in vars(obj)
    assert obj.attr == "class-value"


def test_instance_attribute_own_before_restored_by_identity():
    class C:
        pass

    obj = C()
    sentinel = object()
    obj.attr = sentinel
    p = Patcher()
    p.setattr(obj, "attr", "x")
    p.revert()
    assert obj.attr is sentinel


def test_slot_attribute_restored():
    class S:
        __slots__ = ("x",)

    obj = S()
    obj.x = 1
    p = Patcher()
    p.setattr(obj, "x", 2)
    p.revert()
    assert obj.x == 1


# --------------------------------------------------------------------------- environment


def test_setenv_restores_previous_value(monkeypatch):
    monkeypatch.setenv("SPECULATORS_COMPAT_TEST_VAR", "before")
    p = Patcher()
    p.setenv("SPECULATORS_COMPAT_TEST_VAR", "during")
    assert os.environ["SPECULATORS_COMPAT_TEST_VAR"] == "during"
    p.revert()
    assert os.environ["SPECULATORS_COMPAT_TEST_VAR"] == "before"


def test_setenv_removes_variable_absent_before():
    assert "SPECULATORS_COMPAT_TEST_VAR" not in os.environ
    p = Patcher()
    p.setenv("SPECULATORS_COMPAT_TEST_VAR", "during")
    p.setenv("SPECULATORS_COMPAT_TEST_VAR", "again")
    p.revert()
    assert "SPECULATORS_COMPAT_TEST_VAR" not in os.environ


# --------------------------------------------------------------------------- misc


def test_on_revert_runs_in_lifo_order_with_labels():
    order = []
    p = Patcher()
    p.on_revert("one", lambda: order.append(1))
    p.on_revert("two", lambda: order.append(2))
    p.on_revert("three", lambda: order.append(3))
    assert p.changes() == ["one", "two", "three"]
    p.revert()
    assert order == [3, 2, 1]
    assert p.changes() == []


def test_revert_runs_every_undo_even_if_one_fails_then_raises_first(caplog):
    order = []
    p = Patcher()

    def boom(msg):
        def undo():
            order.append(msg)
            raise RuntimeError(msg)

        return undo

    p.on_revert("ok-1", lambda: order.append("ok-1"))
    p.on_revert("bad-1", boom("bad-1"))
    p.on_revert("bad-2", boom("bad-2"))
    p.on_revert("ok-2", lambda: order.append("ok-2"))
    caplog.set_level(logging.WARNING, logger="speculators_compat")
    with pytest.raises(RuntimeError, match="bad-2"):
        p.revert()
    assert order == ["ok-2", "bad-2", "bad-1", "ok-1"]
    assert len(p) == 0
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("bad-1" in m for m in warnings) and any("bad-2" in m for m in warnings)


def test_change_labels_name_the_target(modules):
    _, consumer, _ = modules

    class Klass:
        pass

    p = Patcher()
    p.setattr(consumer, "f", None)
    p.setattr(Klass, "attr", 1)
    p.setenv("SPECULATORS_COMPAT_TEST_VAR", "1")
    labels = p.changes()
    p.revert()
    assert labels[0] == "toy_consumer.f"
    assert labels[1].endswith("Klass.attr")
    assert labels[2] == "os.environ['SPECULATORS_COMPAT_TEST_VAR']"


def test_applied_result_lists_changes(modules, make_activation, toy):
    _, consumer, _ = modules

    def change(p, ctx):
        p.setattr(consumer, "f", None)
        p.setattr(consumer, "h", None)

    act = make_activation(toy("a", change=change))
    rep = act.activate()
    assert rep["a"].status is Status.APPLIED
    assert rep["a"].changes == ["toy_consumer.f", "toy_consumer.h"]


# --------------------------------------------------------------------------- scoped env

ENV_KEY = "SPECULATORS_COMPAT_TEST_SCOPED"


def test_env_default_sets_for_the_call_only_and_keeps_a_users_value(monkeypatch):
    from speculators_compat._patcher import env_default, with_env_default

    monkeypatch.delenv(ENV_KEY, raising=False)
    with env_default(ENV_KEY, "on"):
        assert os.environ[ENV_KEY] == "on"
    assert ENV_KEY not in os.environ
    seen = []

    def build():
        seen.append(os.environ.get(ENV_KEY))
        raise RuntimeError("boom")

    wrapped = wrapt.FunctionWrapper(build, with_env_default(ENV_KEY, "on"))
    with pytest.raises(RuntimeError):
        wrapped()
    assert seen == ["on"] and ENV_KEY not in os.environ  # removed after a failure too
    monkeypatch.setenv(ENV_KEY, "user")
    with pytest.raises(RuntimeError):
        wrapped()
    assert seen[-1] == "user" and os.environ[ENV_KEY] == "user"


def test_targets_name_module_class_and_environment(modules):
    _, consumer, _ = modules

    class Klass:
        @staticmethod
        def s():
            return 1

    p = Patcher()
    p.setattr(consumer, "f", None)
    p.wrap(Klass, "s", _tag("t"))
    p.setattr(consumer, "f", 1)
    p.setenv(ENV_KEY, "1")
    mark = len(p)
    p.on_revert("label only", lambda: None)
    assert p.targets() == ["toy_consumer:f", f"{__name__}:{Klass.__qualname__}.s",
                           f"os.environ:{ENV_KEY}"]
    assert p.targets(mark) == []
    p.revert()
