"""Refuse a generator built by a script's top-level code outside ``if __name__ == "__main__":``.

Why: the generator's vLLM workers start with ``spawn`` (vLLM's CPU platform sets it; on
GPUs ``worker_spawn_method`` does, since fork breaks once CUDA is initialised). A spawned
worker first runs the parent's main script again, as ``__mp_main__``. When the script
builds the generator in its top-level code, outside an ``if __name__ == "__main__":``
block, every worker builds a generator of its own while it starts, and fails there;
the user sees vLLM's ``WorkerProc initialization failed due to an exception in a
background process`` after the model's config and the first worker's imports, with the
cause (``An attempt has been made to start a new process before the current process has
finished its bootstrapping phase``) somewhere in a worker's traceback above it.
How: wrap ``VllmHiddenStatesGenerator.__init__``: before anything is built, find the
main script's top-level frame on the call stack and read the script's source (``ast``);
when the line running there is not inside an ``if __name__ == "__main__":`` block and
the workers will start with ``spawn``, raise ``CompatError`` naming the file and line and
the fix. Where the source cannot be read, or there is no main script (``python -c``, a
notebook, an interactive session: spawn runs nothing again there), it does nothing. A
script that keeps its workers from that line some other way (a condition on the process)
opts out with ``SPECULATORS_COMPAT_DISABLE=spawn_main_guard``, as the message says. A
guard is a branch that runs only when ``__name__ == "__main__"``: the body of ``if
__name__ == "__main__":`` (either order, also combined with ``and``, e.g. ``if __name__ ==
"__main__" and args.run:``) and the ``else`` of ``if __name__ != "__main__":`` (also
combined with ``or``); ``not`` is followed. A condition that does not imply it (``or``
with the main test, a helper function returning it) is not a guard.
Applies when: speculators' generator starts vLLM's ``MultiprocExecutor`` itself (0.3/0.4).
Remove when: speculators < 0.5 support is dropped.
"""

from __future__ import annotations

import ast
import os
import sys
import tokenize
from types import FrameType, ModuleType

from .. import _env
from .._adapter import Context, Verdict
from .._errors import CompatError
from .._patcher import Patcher
from .._report import Kind
from . import _probes, _targets
from ._base import GeneratorAdapter

VAR = "VLLM_WORKER_MULTIPROC_METHOD"


def _is_main_test(test: ast.expr, op: type) -> bool:
    """``__name__ <op> "__main__"`` (either side)."""
    if not (isinstance(test, ast.Compare) and len(test.ops) == 1
            and isinstance(test.ops[0], op)):
        return False
    sides = (test.left, test.comparators[0])
    names = [s for s in sides if isinstance(s, ast.Name) and s.id == "__name__"]
    consts = [s for s in sides if isinstance(s, ast.Constant) and s.value == "__main__"]
    return len(names) == 1 and len(consts) == 1


def _true_means_main(test: ast.expr) -> bool:
    """Whether ``test`` being true implies ``__name__ == "__main__"``."""
    if isinstance(test, ast.BoolOp) and isinstance(test.op, ast.And):
        return any(_true_means_main(v) for v in test.values)
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        return _false_means_main(test.operand)
    return _is_main_test(test, ast.Eq)


def _false_means_main(test: ast.expr) -> bool:
    """Whether ``test`` being false implies ``__name__ == "__main__"``."""
    if isinstance(test, ast.BoolOp) and isinstance(test.op, ast.Or):
        return any(_false_means_main(v) for v in test.values)
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        return _true_means_main(test.operand)
    return _is_main_test(test, ast.NotEq)


def _guarded_spans(tree: ast.Module) -> list[tuple[int, int]]:
    """Line spans that run only in the main process: the body of an ``if`` whose test
    implies ``__name__ == "__main__"`` and the ``else`` of one whose negation does."""
    spans = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.If):
            continue
        for block in ((node.body if _true_means_main(node.test) else None),
                      (node.orelse if _false_means_main(node.test) else None)):
            if block:
                spans.append((block[0].lineno, max(s.end_lineno or s.lineno for s in block)))
    return spans


def main_top_level_line(frame: FrameType | None) -> tuple[str, int] | None:
    """(path, line) of the main script's top-level code on the stack above ``frame``, or
    ``None`` when the call does not come from a main script's top-level code."""
    main = sys.modules.get("__main__")
    path = getattr(main, "__file__", None)
    if main is None or not path:
        return None
    namespace = vars(main)
    while frame is not None:
        if frame.f_globals is namespace and frame.f_code.co_name == "<module>":
            return str(path), frame.f_lineno
        frame = frame.f_back
    return None


def unguarded_line(frame: FrameType | None) -> tuple[str, int] | None:
    """(path, line) when the main script's top-level code that led here runs outside an
    ``if __name__ == "__main__":`` block; ``None`` when guarded or unknown."""
    where = main_top_level_line(frame)
    if where is None:
        return None
    path, line = where
    try:
        with tokenize.open(path) as f:
            tree = ast.parse(f.read(), filename=path)
    except (OSError, SyntaxError, ValueError, UnicodeDecodeError):
        return None  # cannot tell: never refuse on a guess
    if any(lo <= line <= hi for lo, hi in _guarded_spans(tree)):
        return None
    return where


def workers_spawn() -> bool:
    """Whether the generator's workers will start with ``spawn``: the method set now (the
    user's, or ``worker_spawn_method``'s while the generator is built), else what vLLM's
    CPU platform sets when the config is built; vLLM's default is ``fork``."""
    method = os.environ.get(VAR)
    if method:
        return method == "spawn"
    return _probes.is_cpu_platform()


def refusal(path: str, line: int) -> str:
    return (f"speculators-compat: VllmHiddenStatesGenerator is built by the top-level code of "
            f"{path} (line {line}), outside an `if __name__ == \"__main__\":` block. vLLM "
            "starts the generator's workers with spawn, which runs this script again in "
            "every worker: each would build a generator of its own and fail to start. Put "
            "the code that builds and runs the generator under `if __name__ == "
            "\"__main__\":` (as speculators' own scripts do). Nothing was started. (If the "
            "script already keeps its workers from reaching this line, set "
            f"{_env.DISABLE}=spawn_main_guard.)")


class SpawnMainGuard(GeneratorAdapter):
    name = "spawn_main_guard"
    kind = Kind.SAFEGUARD
    summary = ("refuse, before anything starts, a generator built by a script's top-level "
               "code outside `if __name__ == \"__main__\":` (spawned workers rerun it)")
    upstream = ("vLLM starts the workers of a MultiprocExecutor built directly with spawn "
                "on CPU (and the shim does on GPU); spawn reruns the main script")
    vllm_range = None
    remove_when = "speculators < 0.5 support is dropped"
    targets = _targets.in_generator("VllmHiddenStatesGenerator.__init__")

    def check(self, ctx: Context, gen: ModuleType) -> Verdict:
        return Verdict.needed("the generator starts vLLM's workers itself; spawned workers "
                              "run the main script again")

    def patch(self, patcher: Patcher, ctx: Context, gen: ModuleType) -> None:
        def init(wrapped, instance, args, kwargs):
            if workers_spawn():
                where = unguarded_line(sys._getframe(1))
                if where is not None:
                    raise CompatError(refusal(*where))
            return wrapped(*args, **kwargs)

        patcher.wrap(gen.VllmHiddenStatesGenerator, "__init__", init)
