"""transformers 5: ``import speculators`` fails with ``PydanticUndefinedAnnotation``.

Why: transformers 5's ``PretrainedConfig`` annotates ``dtype: str | torch.dtype | None``
while ``torch`` is imported only under ``TYPE_CHECKING`` in
``transformers.configuration_utils``. speculators 0.3/0.4 build pydantic models that
subclass it, and pydantic resolves the annotation in that module's globals:
``PydanticUndefinedAnnotation: name 'torch' is not defined``. vLLM 0.24+ requires
transformers 5, so every new vLLM hits this.
How: bind the real ``torch`` module as a global of ``transformers.configuration_utils``
(the namespace pydantic looks the name up in). Nothing else changes; removed on revert.
Applies when: ``PretrainedConfig``'s annotations name ``torch`` and that module has no
``torch`` global. Needed in workers too (anything importing speculators there).
Remove when: speculators 0.3/0.4 are no longer supported (0.5+ does not subclass it).
"""

from __future__ import annotations

import importlib

from .._adapter import Adapter, Context, Phase, Stage, Verdict
from .._patcher import Patcher

MODULE = "transformers.configuration_utils"


class Transformers5ConfigTorch(Adapter):
    name = "transformers5_config_torch"
    summary = "make `import speculators` work with transformers 5 (pydantic needs `torch`)"
    upstream = ("transformers 5.0: PretrainedConfig annotates `torch.dtype` with torch only "
                "imported under TYPE_CHECKING (transformers/configuration_utils.py)")
    vllm_range = None  # keyed on transformers 5 (which vLLM >= 0.24 requires), not on vLLM
    phase = Phase.BOTH
    remove_when = "speculators < 0.5 support is dropped"
    stage = Stage.BEFORE_SPECULATORS_IMPORT
    targets = (f"{MODULE}:torch",)

    def probe(self, ctx: Context) -> Verdict:
        if ctx.versions.get("transformers") is None:
            return Verdict.not_needed("transformers is not installed")
        mod = importlib.import_module(MODULE)
        cls = getattr(mod, "PretrainedConfig", None)
        if cls is None:
            return Verdict.mismatch(f"{MODULE} has no PretrainedConfig")
        if "torch" in vars(mod):
            return Verdict.not_needed(f"{MODULE} already has a `torch` global")
        annotations = getattr(cls, "__annotations__", {})
        if any("torch" in str(a) for a in annotations.values()):
            return Verdict.needed(
                f"transformers {ctx.versions.get('transformers')}: PretrainedConfig annotations "
                "name `torch`, which its module does not import at run time")
        return Verdict.not_needed("PretrainedConfig annotations do not reference torch")

    def apply(self, patcher: Patcher, ctx: Context) -> None:
        import torch

        patcher.setattr(importlib.import_module(MODULE), "torch", torch)
