"""transformers 5: an EAGLE/HASS draft over a layer config without ``pad_token_id`` fails.

Why: transformers 4's ``PretrainedConfig`` gave every config ``pad_token_id = None``;
transformers 5 moved the token ids into the model configs that declare them, so a config
class that does not (a custom or generic ``PretrainedConfig`` subclass) has no such
attribute. speculators 0.3/0.4's ``EagleSpeculator.__init__`` reads
``config.transformer_layer_config.pad_token_id`` first thing, so such a draft raises
``AttributeError: ... has no attribute 'pad_token_id'`` instead of being built (or
refused with speculators' own error, e.g. "is not a valid causal language model config
class" for an unknown architecture).
How: wrap ``EagleSpeculator.__init__``: when its layer config has no ``pad_token_id``,
give it transformers 4's default (``None``) for the duration of the call and remove it
again afterwards, so the user's config object is left as it was. Configs that have the
attribute (Llama, Qwen3, ...) are not touched.
Applies when: a plain transformers config instance has no ``pad_token_id`` and
speculators' ``EagleSpeculator`` reads it. Never on transformers 4.
Remove when: speculators 0.3/0.4 are no longer supported.
"""

from __future__ import annotations

import inspect

from .._adapter import Adapter, Context, Phase, Stage, Verdict
from .._patcher import Patcher
from . import _probes
from ._probes import speculators_class

EAGLE = "speculators.models.eagle"
READ = "transformer_layer_config.pad_token_id"


def eagle_class(ctx: Context) -> type | None:
    return speculators_class(ctx, EAGLE, "EagleSpeculator")


class Transformers5ConfigPadToken(Adapter):
    name = "transformers5_config_pad_token"
    summary = "EAGLE/HASS drafts over a layer config without pad_token_id (transformers 4 default)"
    upstream = ("transformers 5.0: pad/bos/eos token ids are no longer attributes of every "
                "PreTrainedConfig, only of model configs that declare them")
    vllm_range = None  # keyed on transformers 5, not on vLLM
    phase = Phase.DRIVER
    remove_when = "speculators < 0.5 support is dropped"
    stage = Stage.BEFORE_GENERATOR_IMPORT  # imports speculators.models.eagle, not the generator
    targets = (f"{EAGLE}:EagleSpeculator.__init__",)
    #: It imports speculators' configs, which only the fixes of these build.
    after = ("transformers5_config_torch", "transformers5_config_dataclass")

    def probe(self, ctx: Context) -> Verdict:
        base, early = _probes.config_base(ctx)
        if early is not None:
            return early
        if hasattr(base(), "pad_token_id"):
            return Verdict.not_needed("every PretrainedConfig has pad_token_id")
        cls = eagle_class(ctx)
        if cls is None:
            return Verdict.not_needed("speculators' EagleSpeculator is not importable")
        try:
            source = inspect.getsource(cls.__init__)
        except (OSError, TypeError):
            return Verdict.mismatch("EagleSpeculator.__init__ has no readable source")
        if READ not in source:
            return Verdict.not_needed(f"EagleSpeculator.__init__ does not read {READ}")
        return Verdict.needed(
            f"transformers {ctx.versions.get('transformers')}: PretrainedConfig has no "
            f"pad_token_id; EagleSpeculator.__init__ reads {READ}")

    def apply(self, patcher: Patcher, ctx: Context) -> None:
        cls = eagle_class(ctx)
        assert cls is not None

        def init(wrapped, instance, args, kwargs):
            config = args[0] if args else kwargs.get("config")
            layer = getattr(config, "transformer_layer_config", None)
            if layer is None or hasattr(layer, "pad_token_id"):
                return wrapped(*args, **kwargs)
            layer.__dict__["pad_token_id"] = None  # transformers 4's default, this call only
            try:
                return wrapped(*args, **kwargs)
            finally:
                layer.__dict__.pop("pad_token_id", None)

        patcher.wrap(cls, "__init__", init)
