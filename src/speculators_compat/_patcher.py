"""The undo log: every change the shim makes, recorded so it can be undone exactly.

Why one recorder: ``deactivate()`` must restore the exact original objects
(identity), including attributes that were inherited rather than own (those are
deleted again, not overwritten with the inherited value) and names rebound in
consumer modules; and an adapter that fails halfway must leave nothing behind.
Every change therefore goes through :class:`Patcher`, which keeps an undo log
replayed last-in-first-out. Each entry also names its target as
``"module.path:Qualified.name"``, the form adapters declare theirs in
(``Adapter.targets``), so a test can check that an adapter touched nothing else.

Also here: :func:`env_default`, the one helper for "set an environment variable for
the duration of one call, unless the user set it".
"""

from __future__ import annotations

import contextlib
import inspect
import logging
import os
from collections.abc import Callable, Iterator
from types import ModuleType
from typing import Any

import wrapt

logger = logging.getLogger("speculators_compat")

_MISSING = object()

#: Target prefix of environment variables (``"os.environ:NAME"``).
ENVIRON = "os.environ"


def _label(obj: Any) -> str:
    return getattr(obj, "__qualname__", None) or getattr(obj, "__name__", None) or type(
        obj).__name__


def target_of(obj: Any, name: str) -> str:
    """``"module.path:Qualified.name"`` of attribute ``name`` of ``obj``."""
    if isinstance(obj, ModuleType):
        return f"{obj.__name__}:{name}"
    if isinstance(obj, type):
        return f"{obj.__module__}:{obj.__qualname__}.{name}"
    cls = type(obj)
    return f"{cls.__module__}:{cls.__qualname__}().{name}"


def _lookup(obj: Any, name: str) -> Any:
    """The raw value ``obj.name`` resolves to, as ``wrapt.resolve_path`` finds it: on a
    class, the first ``__dict__`` along the MRO that has it (so an inherited
    ``staticmethod``/``classmethod`` is found as the descriptor, not as what it binds
    to); otherwise the attribute as ``getattr`` sees it."""
    if inspect.isclass(obj):
        for klass in inspect.getmro(obj):
            if name in vars(klass):
                return vars(klass)[name]
    return getattr(obj, name)


class Patcher:
    """Records every change so it can be undone exactly, last in first out."""

    def __init__(self) -> None:
        #: (label, undo, target) per change, in the order made.
        self._undo: list[tuple[str, Callable[[], None], str | None]] = []

    def __len__(self) -> int:
        return len(self._undo)

    def setattr(self, obj: Any, name: str, value: Any) -> None:
        """Set ``obj.name``; undo restores the own attribute, or deletes it if it was
        inherited/absent (so the class attribute shows through again)."""
        try:
            namespace = vars(obj)
        except TypeError:  # no __dict__ (slots): what getattr sees is the object's own value
            namespace = None
        if namespace is None:
            previous = getattr(obj, name, _MISSING)
        else:
            previous = namespace.get(name, _MISSING)
        setattr(obj, name, value)

        def undo() -> None:
            if previous is _MISSING:
                try:
                    delattr(obj, name)
                except AttributeError:
                    pass
            else:
                setattr(obj, name, previous)

        self._undo.append((f"{_label(obj)}.{name}", undo, target_of(obj, name)))

    def wrap(self, obj: Any, name: str, wrapper: Callable[..., Any]) -> Any:
        """Replace ``obj.name`` by a ``wrapt.FunctionWrapper`` around the current value.

        The current value is looked up along the MRO (:func:`_lookup`): a
        ``staticmethod``/``classmethod`` descriptor, own or inherited, is wrapped as the
        descriptor, so it keeps binding as such (wrapping what an inherited staticmethod
        binds to would turn it into an instance method on ``obj``).
        """
        wrapped = wrapt.FunctionWrapper(_lookup(obj, name), wrapper)
        self.setattr(obj, name, wrapped)
        return wrapped

    def setenv(self, key: str, value: str) -> None:
        previous = os.environ.get(key)
        os.environ[key] = value

        def undo() -> None:
            if previous is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = previous

        self._undo.append((f"os.environ[{key!r}]", undo, f"{ENVIRON}:{key}"))

    def on_revert(self, label: str, undo: Callable[[], None], target: str | None = None) -> None:
        """Register an arbitrary undo step (for changes not expressible as setattr);
        ``target``: what it changes, when that is a declared target."""
        self._undo.append((label, undo, target))

    def changes(self) -> list[str]:
        return [label for label, _, _ in self._undo]

    def targets(self, since: int = 0) -> list[str]:
        """The targets changed after mark ``since``, in order, each once."""
        seen: dict[str, None] = {}
        for _, _, target in self._undo[since:]:
            if target is not None:
                seen.setdefault(target)
        return list(seen)

    def revert(self, to: int = 0) -> None:
        """Undo changes made after mark ``to`` (LIFO). Every undo runs even if one fails."""
        errors: list[BaseException] = []
        while len(self._undo) > to:
            label, undo, _ = self._undo.pop()
            try:
                undo()
            except BaseException as exc:  # noqa: BLE001 - keep undoing, report at the end
                errors.append(exc)
                logger.warning("speculators-compat: could not revert %s: %r", label, exc)
        if errors:
            raise errors[0]


@contextlib.contextmanager
def env_default(key: str, value: str) -> Iterator[None]:
    """``os.environ[key] = value`` for the duration, unless the user set ``key``.

    Restored (removed) afterwards, so that vLLM's own engines built later in the same
    process keep their behaviour. A value the user set is left as it is.
    """
    if key in os.environ:
        yield
        return
    os.environ[key] = value
    try:
        yield
    finally:
        os.environ.pop(key, None)


def with_env_default(key: str, value: str) -> Callable[..., Any]:
    """A ``wrapt`` wrapper that runs the wrapped call inside :func:`env_default`."""

    def wrapper(wrapped, instance, args, kwargs):
        with env_default(key, value):
            return wrapped(*args, **kwargs)

    wrapper.__name__ = wrapper.__qualname__ = f"with_{key}={value}"
    return wrapper
