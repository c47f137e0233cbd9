"""The one executor speculators' generator starts: ``GeneratorExecutor``, with the
executor features of the registry as its hooks.

Why one class: speculators 0.3/0.4 build ``MultiprocExecutor(vllm_config)`` by the name
bound in their generator module, and several upstream changes are answered there (a step
split in two, a reply convention, a warm-up and a KV-cache layout the engine core now
does, the step overlap and the shared-memory transport). Each of those is still one
adapter, with its own why, probe and remove-when, but none subclasses the executor: each
is an :class:`ExecutorFeature`, a set of hooks of this one class, which owns the state
they share as its own attributes (:attr:`GeneratorExecutor.compat_receiver`,
:attr:`~GeneratorExecutor.compat_steps`, :attr:`~GeneratorExecutor.compat_generator`).

How: :func:`install` (called by each executor feature's ``apply()``) binds, in
speculators' generator module, ``GeneratorExecutor`` specialised with the features applied
so far, over vLLM's own ``MultiprocExecutor``: the first feature subclasses vLLM's class,
each later one rebinds the name to the same class built with one more feature (through
the patcher, so ``deactivate()`` and a failed ``apply()`` restore the previous binding
exactly). There is therefore always exactly one class between speculators and vLLM's
executor, whatever applies; vLLM's own modules and engines keep vLLM's class.

Why each feature binds, rather than one installer adapter binding once: every feature's
change has to be its own entry in the patcher, so that the guarantees every adapter has
hold for features too. A failed feature rolls back alone (the binding returns to the
class of the features before it, which keep acting), its report lists exactly the change
it made, and the contract suite checks, feature by feature, that applying it alone
changes only its declared target. The two single-installer designs each lose one of
these: an installer *after* the features (features only register hooks) would report
them applied before anything acts, and a failure to bind would leave every one of them
"applied" and inert, or would have to refuse the generator for a performance feature's
fault; an installer *before* them (features register into the class it bound) binds a
class on releases where no feature applies (speculators gets vLLM's own class there
today), and when it fails the features become "not needed", a status that never fails
closed. The result is the same either way: at every moment exactly one class, built by
:func:`build` with every feature applied so far, stands between speculators and vLLM's
executor; only :func:`install`, called only by ``ExecutorFeature.patch``, binds it
(``tests/unit/test_executor.py`` checks both, and that no module subclasses an executor
in a ``class`` statement).

Hook order: features run in registry order; for the call hooks (``rpc``,
``execute_model``, ``sample_tokens``) the later feature is the outer one, and gets the
inner chain as ``call`` (ending in vLLM's method). Where that order matters, the feature
declares it (``after``), and the activation checks the registry against it.
"""

from __future__ import annotations

import functools
import weakref
from collections.abc import Callable
from typing import Any

#: ``GeneratorExecutor.compat_sampled`` / ``compat_step_answer`` when nothing is held.
NOTHING: Any = object()


class ExecutorHooks:
    """What a feature adds to :class:`GeneratorExecutor` (each default does nothing).

    ``started`` runs after vLLM's ``__init__`` (workers up), ``initialized`` after
    ``initialize_from_config``; the call hooks get the next inner implementation as
    ``call`` and decide whether and how to call it.
    """

    def started(self, executor: GeneratorExecutor) -> None:
        """After vLLM's ``__init__``: the workers are up."""

    def initialized(self, executor: GeneratorExecutor) -> None:
        """After ``initialize_from_config`` (KV caches allocated)."""

    def rpc(self, executor: GeneratorExecutor, call: Callable[..., Any], method: Any,
            *args: Any, **kwargs: Any) -> Any:
        """``collective_rpc(method, *args, **kwargs)``."""
        return call(method, *args, **kwargs)

    def execute_model(self, executor: GeneratorExecutor, call: Callable[..., Any],
                      scheduler_output: Any, *args: Any, **kwargs: Any) -> Any:
        """``execute_model(scheduler_output, *args, **kwargs)``."""
        return call(scheduler_output, *args, **kwargs)

    def sample_tokens(self, executor: GeneratorExecutor, call: Callable[..., Any],
                      grammar_output: Any = None, *args: Any, **kwargs: Any) -> Any:
        """``sample_tokens(grammar_output, *args, **kwargs)``."""
        return call(grammar_output, *args, **kwargs)


#: executor method -> the hook that answers it.
_CALL_HOOKS = {"collective_rpc": "rpc", "execute_model": "execute_model",
               "sample_tokens": "sample_tokens"}


def _overrides(hooks: ExecutorHooks, hook: str) -> bool:
    return getattr(type(hooks), hook) is not getattr(ExecutorHooks, hook)


class GeneratorExecutor:
    """The executor speculators' generator gets (mixed in over vLLM's
    ``MultiprocExecutor`` by :func:`build`). It owns the state its features share."""

    #: The features installed, in registry order, and their adapters' names.
    compat_features: tuple[ExecutorHooks, ...] = ()
    compat_feature_names: tuple[str, ...] = ()
    #: Executor method -> the features hooking it, innermost first.
    compat_chains: dict[str, tuple[ExecutorHooks, ...]] = {}  # noqa: RUF012 - per class
    #: vLLM's executor class under this one.
    compat_vllm_class: type | None = None
    #: ``shm_transport``: the driver side of the transport (created at the first call).
    compat_receiver: Any = None
    #: ``step_overlap``: the steps sent and not yet waited for, oldest first (a new list
    #: is assigned each time, never mutated in place).
    compat_steps: tuple | list = ()
    #: ``shm_transport``: a weak reference to the generator that owns this executor.
    compat_generator: Callable[[], Any] | None = None
    #: ``executor_sample_tokens``: the output sampled inside this step's execute_model.
    compat_sampled: Any = NOTHING
    #: ``step_overlap``: the answer to this step's sample_tokens call (sent with the step).
    compat_step_answer: Any = NOTHING

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        # Before vLLM's __init__: it already sends RPCs (device init, model load).
        self.compat_receiver = None
        self.compat_steps = []
        self.compat_generator = None
        self.compat_sampled = NOTHING
        self.compat_step_answer = NOTHING
        super().__init__(*args, **kwargs)
        for feature in self.compat_features:
            feature.started(self)

    def compat_link(self, generator: Any) -> None:
        """Remember (weakly) the generator this executor serves."""
        self.compat_generator = weakref.ref(generator)

    def compat_linked(self) -> Any:
        """The generator this executor serves, if linked and alive."""
        ref = self.compat_generator
        return ref() if ref is not None else None

    def compat_vllm(self, name: str) -> Callable[..., Any]:
        """vLLM's own method ``name`` of this executor, under every feature's hook."""
        return getattr(super(), name)

    def _compat_call(self, name: str, *args: Any, **kwargs: Any) -> Any:
        """Executor method ``name`` through its features' hooks (the last one outermost)
        down to vLLM's."""
        call = getattr(super(), name)
        hook = _CALL_HOOKS[name]
        for feature in self.compat_chains.get(name, ()):
            call = functools.partial(getattr(feature, hook), self, call)
        return call(*args, **kwargs)

    def _compat_initialize(self, *args: Any, **kwargs: Any) -> Any:
        out = super().initialize_from_config(*args, **kwargs)  # type: ignore[misc]
        for feature in self.compat_features:
            feature.initialized(self)
        return out


def _method(impl: Callable[..., Any], like: Any, *bound: Any) -> Callable[..., Any]:
    """A method of the built class that runs ``impl`` with vLLM's signature and docstring
    (probes and callers read them: ``unique_reply_rank``, ``timeout``)."""

    @functools.wraps(like)
    def method(self: GeneratorExecutor, *args: Any, **kwargs: Any) -> Any:
        return impl(self, *bound, *args, **kwargs)

    return method


def is_installed(cls: Any) -> bool:
    return isinstance(cls, type) and issubclass(cls, GeneratorExecutor)


def vllm_class(cls: type) -> type:
    """vLLM's executor class under ``cls`` (``cls`` itself where nothing is installed):
    what probes look at, so that a feature installed earlier hides nothing."""
    return cls.compat_vllm_class if is_installed(cls) else cls  # type: ignore[return-value]


def build(base: type, features: tuple[tuple[str, ExecutorHooks], ...]) -> type:
    """``GeneratorExecutor`` over vLLM's ``base`` with ``features`` ((adapter name, hooks),
    in registry order). Only what a feature hooks is overridden, and only where vLLM's
    class has it."""
    hooks = tuple(h for _, h in features)
    chains = {name: tuple(h for h in hooks if _overrides(h, hook))
              for name, hook in _CALL_HOOKS.items()}
    ns: dict[str, Any] = {"__module__": __name__, "__doc__": base.__doc__,
                          "compat_features": hooks, "compat_vllm_class": base,
                          "compat_feature_names": tuple(n for n, _ in features),
                          "compat_chains": {k: v for k, v in chains.items() if v}}
    for name in ns["compat_chains"]:
        if hasattr(base, name):
            ns[name] = _method(GeneratorExecutor._compat_call, getattr(base, name), name)
    if any(_overrides(h, "initialized") for h in hooks) and hasattr(
            base, "initialize_from_config"):
        ns["initialize_from_config"] = _method(GeneratorExecutor._compat_initialize,
                                               base.initialize_from_config)
    cls = type(base.__name__, (GeneratorExecutor, base), ns)
    cls.__qualname__ = f"{base.__qualname__}[compat:{'+'.join(n for n, _ in features)}]"
    return cls


def install(patcher: Any, gen: Any, name: str, hooks: ExecutorHooks) -> type:
    """Bind ``gen.MultiprocExecutor`` to ``GeneratorExecutor`` with feature ``name``'s
    ``hooks`` added (the first feature builds it over vLLM's class); undone by
    ``patcher``. Returns the class bound."""
    current = gen.MultiprocExecutor
    if is_installed(current):
        features = (*zip(current.compat_feature_names, current.compat_features,
                         strict=True), (name, hooks))
    else:
        features = ((name, hooks),)
    cls = build(vllm_class(current), features)
    patcher.setattr(gen, "MultiprocExecutor", cls)
    return cls


def of(executor: Any) -> GeneratorExecutor | None:
    """``executor`` when it is a :class:`GeneratorExecutor` (else ``None``): for readers
    of its state (the demo, the e2e scripts, the benchmarks)."""
    return executor if isinstance(executor, GeneratorExecutor) else None
