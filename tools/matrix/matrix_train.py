"""The matrix's training-side step: where the draft build/train/reload chain runs.

Why: speculators' training code (configs, ``Eagle3DraftModel``, ``speculators.train``,
save/reload) depends on transformers and torch, not on vLLM; the shim's
``transformers5_config_*`` adapters make it run on transformers 5. So the chain
(``tests/e2e/test_offline_script.py``: speculators' offline generation through
``speculators-compat run``, then an EAGLE-3 draft trained one step on those files, saved,
reloaded and compared exactly) runs once per transformers version the e2e envs install:
in the newest ``e2e`` env (by vLLM version; a release before the nightly) with that
version. The other e2e envs record which env trained for them.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tools/, for envs.py
import envs  # noqa: E402  (tools/envs.py)

#: The suite of the step (run like ``tests/contract``: real speculators, junit counts).
TRAIN_TESTS = "tests/e2e/test_offline_script.py"


def trains_for(data: dict[str, Any], name: str) -> str | None:
    """The env whose training-chain result stands for ``name``'s transformers (``name``
    itself when it is the newest e2e env with that version); ``None`` when ``name``'s
    transformers is not recorded (doctor has not run) or it is not an e2e env."""
    recs = data.get("envs") or {}
    tf = ((recs.get(name) or {}).get("versions") or {}).get("transformers")
    recipe = envs.RECIPES.get(name)
    if not tf or recipe is None or recipe.level != "e2e":
        return None
    same = [n for n, r in recs.items()
            if n in envs.RECIPES and envs.RECIPES[n].level == "e2e"
            and ((r.get("versions") or {}).get("transformers")) == tf]
    return max(same, key=lambda n: (envs.version_key(n)[0] == 0, envs.version_key(n)))
