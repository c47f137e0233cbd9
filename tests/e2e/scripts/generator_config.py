"""Give speculators' generator an ``additional_config`` for the ``VllmConfig`` it builds.

Why: speculators 0.3/0.4 build their ``VllmConfig`` themselves
(``VllmHiddenStatesGenerator._create_vllm_config``) and take no such argument; a device run
needs one where the installed kernels do (e.g. ``gdn_prefill_backend: triton`` for Qwen3.5
where FlashInfer has no ``gdn_prefill``). How: rebind ``VllmConfig`` in speculators'
generator module, the name its method looks up. Call it after ``activate()``, which must
precede importing speculators. Used by ``generate.py`` and ``gpu_models.py``.
"""

from __future__ import annotations

from typing import Any


def give_generator_additional_config(extra: dict[str, Any]) -> None:
    import speculators.data_generation.vllm_hidden_states_generator as gen_module

    vllm_config_cls = gen_module.VllmConfig

    def vllm_config_with_extra(*args, **kw):
        kw.setdefault("additional_config", extra)
        return vllm_config_cls(*args, **kw)

    gen_module.VllmConfig = vllm_config_with_extra
