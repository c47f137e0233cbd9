"""speculators-compat's interpreter-start hook (the technique ``ddtrace-run`` uses).

Why: vLLM's worker processes are spawned. Python then re-runs the parent's main script
(as ``__mp_main__``) in each worker before any vLLM code runs there, so a script that
imports speculators at module level needs the import-time adapters (transformers 5's
``torch`` annotation, vLLM 0.33's relocated KV helpers) BEFORE that re-run. The
``vllm.general_plugins`` entry point runs too late for that.

How: ``activate()`` prepends this folder to ``PYTHONPATH`` (through its Patcher, so
``deactivate()`` restores it) and sets ``SPECULATORS_COMPAT_ACTIVE``; every child
Python inherits both. Python imports ``sitecustomize`` after site processing (full
``sys.path``, ``.pth`` files done, ``sys.argv`` set) and before the main script or
``multiprocessing``'s spawn entry runs. This module

1. runs the ``sitecustomize`` it shadows, if any (the first one in a ``sys.path``
   entry after this folder), so the environment behaves as without us;
2. only if the flag is set (otherwise it costs one ``os.environ`` look-up), puts a
   ``sys.meta_path`` finder first that activates speculators-compat (choosing the
   process kind in :func:`speculators_compat._process.start`) on the first import
   of ``speculators`` or ``vllm``, before that import runs. Import-time adapters only
   have to precede those imports, so activating there is as good as at start, and a
   child that never imports them (a compiler, ``python -c 'print(1)'``, a tool
   that only uses numpy) costs milliseconds instead of a full activation.

It never stops the interpreter: any failure is printed as one warning line. Standard
library only, so it also works in an interpreter where the package is not installed
(it then only chains, and warns if that interpreter imports speculators or vLLM).
"""

import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))


def _same_dir(entry):
    try:
        return os.path.samefile(entry or os.curdir, _HERE)
    except OSError:
        return False


def _chain():
    """Execute the ``sitecustomize`` this one shadows, if any: the first one in a
    ``sys.path`` entry AFTER this folder (what Python would have imported without us).
    Only later entries, so that two hooks of this kind that chain (another tool's and
    ours) can never run each other in a loop."""
    import importlib.machinery
    import importlib.util

    mine = [i for i, p in enumerate(sys.path) if _same_dir(p)]
    rest = sys.path[mine[0] + 1:] if mine else list(sys.path)
    rest = [p for p in rest if not _same_dir(p)]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is None or spec.loader is None:
        return
    ours = sys.modules.get("sitecustomize")
    module = importlib.util.module_from_spec(spec)
    sys.modules["sitecustomize"] = module
    try:
        spec.loader.exec_module(module)
    except Exception as exc:  # what site.py does for a failing sitecustomize
        sys.modules["sitecustomize"] = ours
        sys.stderr.write(f"Error in sitecustomize ({spec.origin}, run by speculators-compat's "
                         f"bootstrap): {type(exc).__name__}: {exc}\n")


#: Top-level packages whose first import activates the shim first (everything the
#: adapters patch is reached through one of them).
_TRIGGERS = ("speculators", "vllm")


def _flag_set():
    return (os.environ.get("SPECULATORS_COMPAT_ACTIVE") or "").strip().lower() in (
        "1", "true", "yes", "on")


def _activate():
    try:
        from speculators_compat._process import start
    except Exception as exc:
        sys.stderr.write(
            f"speculators-compat: WARNING: SPECULATORS_COMPAT_ACTIVE is set but the package "
            f"cannot be imported by {sys.executable} (pid {os.getpid()}): "
            f"{type(exc).__name__}: {exc}; this process runs without the shim\n")
        return
    start()


class _ActivateFirst:
    """Loader of a trigger package's first import: activate, then import the real
    package in its place (``_load_unlocked`` returns what ``sys.modules`` holds after
    ``exec_module``, so the placeholder module is never seen)."""

    def create_module(self, spec):
        return None

    def exec_module(self, module):
        import importlib

        name = module.__name__
        sys.modules.pop(name, None)
        _activate()  # imports the trigger packages itself, with the patches in place
        if name not in sys.modules:
            importlib.import_module(name)


class ActivateOnImport:
    """``sys.meta_path`` finder: the first import of speculators or vLLM activates the
    shim before that import runs, then the finder leaves ``sys.meta_path``. A process
    that never imports either (a tool's helper, ``python -c 'print(1)'``) pays nothing
    beyond this finder."""

    def find_spec(self, name, path=None, target=None):
        if path is not None or name not in _TRIGGERS:
            return None
        for finder in sys.meta_path:  # only where the package exists
            find = getattr(finder, "find_spec", None)
            if finder is not self and find is not None and find(name, path) is not None:
                import importlib.machinery

                if self in sys.meta_path:
                    sys.meta_path.remove(self)
                return importlib.machinery.ModuleSpec(name, _ActivateFirst())
        return None


try:
    _chain()
except Exception as _exc:
    sys.stderr.write(f"speculators-compat: WARNING: could not run the shadowed sitecustomize: "
                     f"{type(_exc).__name__}: {_exc}\n")
if _flag_set():
    sys.meta_path.insert(0, ActivateOnImport())
