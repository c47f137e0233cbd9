"""Contract of the ``spawn_main_guard`` adapter, on the installed vLLM and speculators.

speculators' real generator built by a main script's top-level code (``runpy`` runs a
script as ``__main__``, as ``python script.py`` does): outside ``if __name__ ==
"__main__":`` the adapter refuses before speculators' ``__init__`` runs; under the guard
(or from a function called there) speculators' ``__init__`` runs as before. The refusal
runs end to end in the e2e suite (tests/e2e/test_errors.py).

The checks every adapter shares are in tests/contract/test_every_adapter.py.
"""

from __future__ import annotations

import runpy

import pytest
from helpers import checkpoint

from speculators_compat._errors import CompatError
from speculators_compat.adapters import _probes

from ..expectations import V, applied_if
from ..support import BY_NAME, one

NAME = "spawn_main_guard"

#: Its expected status on the installed release, and why (read by ``expectations.py``).
EXPECTED = (
    # The generator starts MultiprocExecutor itself on every release; whether its
    # workers spawn is decided per construction (the adapter checks it there).
    lambda e: applied_if(e.speculators < V("0.5.0.dev0")),
    "spawned workers run the main script again; an unguarded one builds a generator "
    "in every worker")

# Out-of-range layer ids: speculators' __init__ raises ValueError before it builds anything.
BUILD = ("from speculators.data_generation.vllm_hidden_states_generator import "
         "VllmHiddenStatesGenerator as G\n")
CALL = "G(model_path={path!r}, layer_ids=[10_000])"


def run_as_main(tmp_path, body: str):
    script = tmp_path / "user_script.py"
    script.write_text(BUILD + body.format(path=checkpoint("llama")))
    return runpy.run_path(str(script), run_name="__main__")


@pytest.fixture
def spawn(monkeypatch):
    if not _probes.is_cpu_platform():  # the GPU path: worker_spawn_method sets it
        monkeypatch.setenv("VLLM_WORKER_MULTIPROC_METHOD", "spawn")


SCRIPTS = {
    "unguarded": CALL + "\n",
    "unguarded_function": f"def main():\n    {CALL}\n\nmain()\n",
    "guarded": f"if __name__ == '__main__':\n    {CALL}\n",
    "guarded_function": f"def main():\n    {CALL}\n\nif '__main__' == __name__:\n    main()\n",
    "guarded_else": f"if __name__ != '__main__':\n    pass\nelse:\n    {CALL}\n",
    "guarded_and": f"quick = True\nif quick and __name__ == '__main__':\n    {CALL}\n",
    "guarded_or_else": f"if len('') or not __name__ == '__main__':\n    pass\nelse:\n    {CALL}\n",
    # true also outside the main process: not a guard
    "unguarded_or": f"if __name__ == '__main__' or len('x'):\n    {CALL}\n",
}


@pytest.mark.parametrize("case", sorted(SCRIPTS))
def test_bare_reaches_speculators_init(base, tmp_path, spawn, case):
    with pytest.raises(ValueError, match="out of bounds"):
        run_as_main(tmp_path, SCRIPTS[case])


@pytest.mark.parametrize("case", sorted(SCRIPTS))
def test_unguarded_top_level_refused_first(base, tmp_path, spawn, case):
    with one(base, BY_NAME[NAME]) as applied:
        assert applied
        if case.startswith("unguarded"):
            with pytest.raises(CompatError) as info:
                run_as_main(tmp_path, SCRIPTS[case])
            msg = str(info.value)
            assert "user_script.py (line " in msg and "__name__" in msg, msg
            assert "Nothing was started" in msg, msg
            assert "SPECULATORS_COMPAT_DISABLE=spawn_main_guard" in msg, msg
        else:
            with pytest.raises(ValueError, match="out of bounds"):
                run_as_main(tmp_path, SCRIPTS[case])


def test_fork_chosen_by_the_user_is_not_refused(base, tmp_path, monkeypatch):
    monkeypatch.setenv("VLLM_WORKER_MULTIPROC_METHOD", "fork")
    with one(base, BY_NAME[NAME]), pytest.raises(ValueError, match="out of bounds"):
        run_as_main(tmp_path, SCRIPTS["unguarded"])
