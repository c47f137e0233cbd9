"""The one executor class speculators' generator gets (``_executor``), over a toy vLLM
executor: features are hooks of one class (never stacked subclasses), hooks run in
registry order with the later one outside, the state they share is the executor's own
and set before vLLM's ``__init__`` sends its first RPC, vLLM's signatures show through,
and the patcher restores every earlier binding exactly.

The real executor, features and speculators' calls are checked on every vLLM release by
the contract suite (tests/contract/adapters/test_<feature>.py, test_registry.py).
"""

from __future__ import annotations

import inspect
import types

from speculators_compat import _executor
from speculators_compat._patcher import Patcher


class ToyExecutor:
    """vLLM's shape: ``__init__`` already sends RPCs; replies are logged."""

    def __init__(self, log):
        self.log = log
        self.collective_rpc("init_device")

    def collective_rpc(self, method, timeout=None, args=(), kwargs=None, non_block=False,
                       unique_reply_rank=None):
        """Returns a single result when unique_reply_rank is given."""
        self.log.append(("rpc", method))
        return f"vllm:{method}"

    def execute_model(self, scheduler_output, non_block=False):
        self.log.append(("execute_model", scheduler_output))
        return None

    def initialize_from_config(self, configs):
        self.log.append(("initialize_from_config", configs))


class Tag(_executor.ExecutorHooks):
    """Wraps every reply in its tag: shows which hook is outside which."""

    def __init__(self, tag):
        self.tag = tag

    def rpc(self, executor, call, method, *args, **kwargs):
        assert executor.compat_receiver is None and executor.compat_steps == []
        return f"{self.tag}({call(method, *args, **kwargs)})"


class Started(_executor.ExecutorHooks):
    def started(self, executor):
        executor.log.append(("started",))

    def initialized(self, executor):
        executor.log.append(("initialized",))


def test_one_class_whatever_applies_later_hooks_outside():
    gen = types.SimpleNamespace(MultiprocExecutor=ToyExecutor)
    patcher = Patcher()
    first = _executor.install(patcher, gen, "inner", Tag("inner"))
    second = _executor.install(patcher, gen, "outer", Tag("outer"))
    cls = gen.MultiprocExecutor
    assert cls is second and cls.__mro__[1:3] == (_executor.GeneratorExecutor, ToyExecutor)
    assert cls.compat_feature_names == ("inner", "outer")
    assert first.__mro__[1:3] == second.__mro__[1:3]  # rebuilt, never stacked
    log = []
    ex = cls(log)
    assert log == [("rpc", "init_device")]  # state was there before vLLM's first RPC
    assert ex.collective_rpc("x", unique_reply_rank=0) == "outer(inner(vllm:x))"
    # vLLM's signature and docstring show through (probes and callers read them)
    assert "unique_reply_rank" in inspect.signature(cls.collective_rpc).parameters
    assert "single result" in cls.collective_rpc.__doc__
    assert _executor.vllm_class(cls) is ToyExecutor
    assert set(vars(cls)) >= {"collective_rpc"} and "execute_model" not in vars(cls)
    patcher.revert(1)
    assert gen.MultiprocExecutor is first
    patcher.revert(0)
    assert gen.MultiprocExecutor is ToyExecutor


def test_lifecycle_hooks_and_generator_link():
    gen = types.SimpleNamespace(MultiprocExecutor=ToyExecutor)
    patcher = Patcher()
    cls = _executor.install(patcher, gen, "started", Started())
    assert set(vars(cls)) & {"collective_rpc", "execute_model"} == set()
    log = []
    ex = cls(log)
    ex.initialize_from_config("cfg")
    assert log == [("rpc", "init_device"), ("started",), ("initialize_from_config", "cfg"),
                   ("initialized",)]

    class Generator:
        pass

    g = Generator()
    ex.compat_link(g)
    assert ex.compat_linked() is g and _executor.of(ex) is ex
    del g
    assert ex.compat_linked() is None  # a weak link: the executor keeps no generator alive
    assert _executor.of(object()) is None
    patcher.revert(0)
    assert gen.MultiprocExecutor is ToyExecutor


def test_vllm_methods_are_reachable_under_the_hooks():
    gen = types.SimpleNamespace(MultiprocExecutor=ToyExecutor)
    cls = _executor.install(Patcher(), gen, "tag", Tag("tag"))
    log = []
    ex = cls(log)
    assert ex.compat_vllm("collective_rpc")("y") == "vllm:y"
    assert ex.collective_rpc("y") == "tag(vllm:y)"


def test_one_place_builds_and_binds_the_executor():
    """No module of the package subclasses an executor in a ``class`` statement, and
    ``_executor.install`` (the one binding of ``MultiprocExecutor``) is called only by
    ``ExecutorFeature.patch`` (adapters/_base.py)."""
    import ast
    from pathlib import Path

    src = Path(_executor.__file__).parent
    subclasses, callers = [], []
    for path in sorted(src.rglob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef) and any(
                    "Executor" in ast.unparse(b) and "ExecutorHooks" not in ast.unparse(b)
                    and "ExecutorFeature" not in ast.unparse(b) for b in node.bases):
                subclasses.append(f"{path.relative_to(src)}:{node.name}")
            if isinstance(node, ast.Attribute) and node.attr == "install" and \
                    ast.unparse(node.value) == "_executor":
                callers.append(path.relative_to(src).as_posix())
    assert subclasses == [], subclasses
    assert callers == ["adapters/_base.py"], callers
