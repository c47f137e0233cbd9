"""transformers 5: ``save_pretrained`` of a speculators model or config raises ``TypeError``.

Why: transformers 5's ``PreTrainedConfig.save_pretrained`` calls ``self.validate()`` (the
class validators its ``@strict`` dataclass decorator installs) before writing
``config.json``. speculators 0.3/0.4's configs are pydantic models first in their MRO, so
``self.validate`` is pydantic's deprecated class method ``BaseModel.validate(value)``:
``TypeError: BaseModel.validate() missing 1 required positional argument: 'value'``; no
speculators checkpoint can be saved (``Eagle3DraftModel.save_pretrained``, the trainer's
checkpoints, ``speculators convert``).
How: give speculators' ``SpeculatorModelConfig`` a ``validate`` that dispatches on how it
is called: on an instance with no argument (transformers' call) it runs transformers'
validators; with a value (pydantic's v1-style ``Model.validate(obj)``) it is pydantic's,
unchanged. Only speculators' config classes see it; restored on revert.
Applies when: transformers' config base has a strict-decorator ``validate`` and
speculators' ``SpeculatorModelConfig.validate`` resolves to pydantic's. Never on
transformers 4 (no ``validate`` there).
Remove when: speculators 0.3/0.4 are no longer supported.
"""

from __future__ import annotations

from typing import Any

from .._adapter import Adapter, Context, Phase, Stage, Verdict
from .._patcher import Patcher
from . import _probes
from ._probes import speculators_class

SPECULATORS_CONFIG = "speculators.config"


class DualValidate:
    """``validate`` for speculators' configs: transformers' on ``obj.validate()``,
    pydantic's on ``Cls.validate(value)`` / ``obj.validate(value)``."""

    def __init__(self, transformers_validate: Any, pydantic_validate: Any) -> None:
        self.transformers_validate = transformers_validate
        self.pydantic_validate = pydantic_validate

    def __get__(self, obj: Any, owner: type | None = None) -> Any:
        pydantic_bound = self.pydantic_validate.__get__(obj, owner)
        if obj is None:
            return pydantic_bound

        def validate(*args: Any, **kwargs: Any) -> Any:
            if args or kwargs:
                return pydantic_bound(*args, **kwargs)
            return self.transformers_validate(obj)

        return validate


def speculators_config_class(ctx: Context) -> type | None:
    return speculators_class(ctx, SPECULATORS_CONFIG, "SpeculatorModelConfig")


class Transformers5ConfigValidate(Adapter):
    name = "transformers5_config_validate"
    summary = "let save_pretrained validate speculators' configs with transformers' validators"
    upstream = ("transformers 5.0: PreTrainedConfig.save_pretrained calls self.validate() "
                "(strict dataclass validators; transformers/configuration_utils.py)")
    vllm_range = None  # keyed on transformers 5, not on vLLM
    phase = Phase.DRIVER
    remove_when = "speculators < 0.5 support is dropped"
    stage = Stage.BEFORE_GENERATOR_IMPORT  # imports speculators.config, not the generator
    targets = (f"{SPECULATORS_CONFIG}:SpeculatorModelConfig.validate",)
    #: It imports speculators' configs, which only the fixes of these build.
    after = ("transformers5_config_torch", "transformers5_config_dataclass")

    def probe(self, ctx: Context) -> Verdict:
        base, early = _probes.config_base(ctx)
        if early is not None:
            return early
        theirs = vars(base).get("validate")
        if theirs is None or not getattr(theirs, "__is_defined_by_strict_decorator__", False):
            return Verdict.not_needed("PretrainedConfig has no strict-decorator validate()")
        spec = speculators_config_class(ctx)
        if spec is None:
            return Verdict.not_needed("speculators' SpeculatorModelConfig is not importable")
        from pydantic import BaseModel

        if getattr(spec.validate, "__func__", None) is not BaseModel.validate.__func__:
            return Verdict.not_needed("SpeculatorModelConfig.validate is not pydantic's")
        return Verdict.needed(
            f"transformers {ctx.versions.get('transformers')}: save_pretrained calls "
            "self.validate(), which is pydantic's BaseModel.validate(value) on speculators' "
            "configs")

    def apply(self, patcher: Patcher, ctx: Context) -> None:
        from pydantic import BaseModel

        base = _probes.config_class()
        spec = speculators_config_class(ctx)
        assert base is not None and spec is not None
        pydantic_validate = vars(BaseModel)["validate"]
        patcher.setattr(spec, "validate", DualValidate(vars(base)["validate"],
                                                       pydantic_validate))
