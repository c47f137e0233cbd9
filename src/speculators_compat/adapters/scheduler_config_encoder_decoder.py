"""``SchedulerConfig(is_encoder_decoder=...)`` became a required init field.

Why: vLLM 0.11.1/0.12.0 turned ``is_encoder_decoder`` and ``max_model_len`` into
``InitVar``s, required from 0.12 (``SchedulerConfig.default_factory`` fills them for
vLLM's own callers). speculators 0.3.0 does not pass it:
``ValidationError ... SchedulerConfig ... is_encoder_decoder Field required``.
How: speculators' module calls ``SchedulerConfig(...)``; rebind that name to a wrapper
that adds ``is_encoder_decoder=False`` when the caller left it out.
Applies when: the installed ``SchedulerConfig`` requires ``is_encoder_decoder`` and the
installed speculators' generator does not pass it (0.3.x).
Remove when: speculators 0.3.x support is dropped (0.4 passes it).
"""

from __future__ import annotations

from types import ModuleType

from .._adapter import Context, Verdict
from .._patcher import Patcher
from . import _probes, _targets, _wrappers
from ._base import GeneratorAdapter


class SchedulerConfigEncoderDecoder(GeneratorAdapter):
    name = "scheduler_config_encoder_decoder"
    summary = "pass is_encoder_decoder=False to SchedulerConfig"
    upstream = "vLLM 0.12.0: SchedulerConfig.is_encoder_decoder is a required InitVar"
    vllm_range = ">=0.11.1.dev0"
    remove_when = "speculators 0.3.x support is dropped"
    targets = _targets.in_generator("SchedulerConfig")

    def check(self, ctx: Context, gen: ModuleType) -> Verdict:
        params = _probes.parameters(gen.SchedulerConfig)
        if params is None:
            return Verdict.mismatch("SchedulerConfig signature is not inspectable")
        p = params.get("is_encoder_decoder")
        if p is None:
            return Verdict.not_needed("SchedulerConfig has no is_encoder_decoder field")
        if not _probes.required(p):
            return Verdict.not_needed("SchedulerConfig.is_encoder_decoder has a default")
        if _probes.consumer_passes(gen, "is_encoder_decoder="):
            return Verdict.not_needed("SchedulerConfig requires is_encoder_decoder; this "
                                      "speculators passes it itself")
        return Verdict.needed("SchedulerConfig requires is_encoder_decoder")

    def patch(self, patcher: Patcher, ctx: Context, gen: ModuleType) -> None:
        patcher.wrap(gen, "SchedulerConfig", _wrappers.default_kwarg("is_encoder_decoder", False))
