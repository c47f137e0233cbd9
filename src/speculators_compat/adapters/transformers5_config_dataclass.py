"""transformers 5: speculators' config classes cannot be constructed.

Why: transformers 5's ``PreTrainedConfig.__init_subclass__`` turns every subclass into a
dataclass and, for a subclass without its own ``__init__``, installs a generated
``__init__`` that ``setattr``s every field default *before* anything else runs.
speculators 0.3/0.4's configs (``Eagle3SpeculatorConfig``, ``EagleSpeculatorConfig``,
``MLPSpeculatorConfig``, ...) are pydantic models that subclass ``PretrainedConfig`` and
inherit ``SpeculatorModelConfig.__init__`` (pydantic first, then ``PretrainedConfig``).
The generated ``__init__`` shadows it, so the first ``setattr`` reaches pydantic before
pydantic initialised the instance: ``AttributeError: 'Eagle3SpeculatorConfig' object has
no attribute '__pydantic_fields_set__'``. The dataclass step also adds ``__eq__``,
``__hash__`` and ``__match_args__`` to each such class, which would shadow pydantic's.
How: wrap ``PreTrainedConfig.__init_subclass__``: for a class that is a pydantic model
*and* has a speculators class in its MRO, skip transformers' dataclass step (call the
next ``__init_subclass__`` in the MRO instead), so the class is built as on transformers
4; every other subclass (all of transformers' own configs, any user config) goes through
transformers' hook unchanged. Applies to classes created while active (speculators'
configs are created by ``import speculators``, which on transformers 5 only works after
activation); the wrapper is removed on revert, classes created meanwhile keep their
transformers-4 shape.
Applies when: a plain ``PretrainedConfig`` subclass gets an ``__init__`` of its own from
transformers (the dataclass hook). Never on transformers 4.
Remove when: speculators 0.3/0.4 are no longer supported (0.5+ configs are not pydantic
subclasses of ``PretrainedConfig``).
"""

from __future__ import annotations

from typing import Any

from .._adapter import Adapter, Context, Phase, Stage, Verdict
from .._patcher import Patcher
from . import _probes

MODULE = _probes.TRANSFORMERS_CONFIG


def is_speculators_model(cls: type) -> bool:
    """A pydantic model with a speculators class in its MRO (speculators' configs and
    users' subclasses of them); nothing else is treated differently."""
    try:
        from pydantic import BaseModel
    except ImportError:  # pragma: no cover - speculators needs pydantic
        return False
    if not (isinstance(cls, type) and issubclass(cls, BaseModel)):
        return False
    return any(getattr(c, "__module__", "").split(".")[0] == "speculators" for c in cls.__mro__)


def generates_init(base: type) -> bool:
    """Whether transformers gives a plain subclass an ``__init__`` of its own."""
    probe = type("_SpeculatorsCompatProbeConfig", (base,), {"__module__": __name__})
    return "__init__" in vars(probe)


class Transformers5ConfigDataclass(Adapter):
    name = "transformers5_config_dataclass"
    summary = "build speculators' pydantic configs as on transformers 4 (no dataclass __init__)"
    upstream = ("transformers 5.0: PreTrainedConfig.__init_subclass__ makes every subclass a "
                "dataclass with a generated __init__ (transformers/configuration_utils.py)")
    vllm_range = None  # keyed on transformers 5 (which vLLM >= 0.24 requires), not on vLLM
    phase = Phase.BOTH
    remove_when = "speculators < 0.5 support is dropped"
    stage = Stage.BEFORE_SPECULATORS_IMPORT  # speculators' config classes are built at import
    targets = (f"{MODULE}:PreTrainedConfig.__init_subclass__",)

    def probe(self, ctx: Context) -> Verdict:
        base, early = _probes.config_base(ctx)
        if early is not None:
            return early
        if "__init_subclass__" not in vars(base):
            return Verdict.not_needed("PretrainedConfig has no __init_subclass__ hook")
        if not generates_init(base):
            return Verdict.not_needed("PretrainedConfig subclasses keep the inherited __init__")
        return Verdict.needed(
            f"transformers {ctx.versions.get('transformers')}: PreTrainedConfig subclasses get a "
            "generated dataclass __init__ that runs before pydantic's")

    def apply(self, patcher: Patcher, ctx: Context) -> None:
        base = _probes.config_class()
        assert base is not None
        hook = vars(base)["__init_subclass__"]
        original = hook.__func__ if isinstance(hook, classmethod) else hook

        def __init_subclass__(cls: type, *args: Any, **kwargs: Any) -> None:
            if is_speculators_model(cls):
                # What transformers 4 did: no dataclass step, the MRO's next hook only.
                super(base, cls).__init_subclass__(*args, **kwargs)
                return
            original(cls, *args, **kwargs)

        __init_subclass__.__wrapped__ = original  # type: ignore[attr-defined]
        patcher.setattr(base, "__init_subclass__", classmethod(__init_subclass__))
