"""The wrappers and thin subclasses adapters state their changes with (one line each).

``default_kwarg`` / ``drop_kwarg``: wrappers for a callable the consumer calls with
keyword arguments; ``argument``: read an argument however the caller passed it;
``subclass``: a thin subclass of whatever the consumer binds now (adapters that
rebind the same name stack, registry order, last one outermost); ``with_env_default``:
run a call with an environment variable set unless the user set it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .._patcher import env_default, with_env_default

__all__ = ["argument", "default_kwarg", "drop_kwarg", "env_default", "subclass",
           "with_env_default"]

_ABSENT = object()


def argument(args: tuple, kwargs: dict, name: str, position: int, default: Any = None) -> Any:
    """The argument ``name`` (positional index ``position``) of a call, or ``default``."""
    if name in kwargs:
        return kwargs[name]
    return args[position] if len(args) > position else default


def default_kwarg(name: str, value: Any) -> Callable[..., Any]:
    """A ``wrapt`` wrapper that passes ``name=value`` when the caller left it out."""

    def wrapper(wrapped, instance, args, kwargs):
        kwargs.setdefault(name, value)
        return wrapped(*args, **kwargs)

    wrapper.__name__ = wrapper.__qualname__ = f"default_{name}"
    return wrapper


def drop_kwarg(name: str) -> Callable[..., Any]:
    """A ``wrapt`` wrapper that drops keyword argument ``name`` (the callee lost it)."""

    def wrapper(wrapped, instance, args, kwargs):
        kwargs.pop(name, None)
        return wrapped(*args, **kwargs)

    wrapper.__name__ = wrapper.__qualname__ = f"drop_{name}"
    return wrapper


def subclass(base: type, name_suffix: str, namespace: dict[str, Any]) -> type:
    """A thin subclass of ``base`` (whatever is currently bound in the consumer)."""
    ns = dict(namespace)
    ns.setdefault("__module__", "speculators_compat.adapters")
    ns.setdefault("__doc__", base.__doc__)
    cls = type(base.__name__, (base,), ns)
    cls.__qualname__ = f"{base.__qualname__}[compat:{name_suffix}]"
    return cls
