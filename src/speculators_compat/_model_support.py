"""Models the shim refuses before any weights load, and why.

Why: some combinations fail only after vLLM has loaded the weights (minutes for a real
checkpoint), deep inside vLLM, with a message that names neither the model nor a way out.
Where the cause is known, the generator's construction is refused up front with a
``CompatError`` that says what is unsupported and what to use instead.

Known today:

- **Attention-residual blocks** (Kimi-K3 configs with ``attn_res_block_size``): vLLM 0.34's
  decoder layers then return ``(hidden_states, prefix_sum, residual)`` with a per-block
  residual; a layer's output is not their sum, and the capture cannot read it (read from
  vLLM 0.34's ``vllm/models/kimi_k3``; ``_capture.layer_output`` refuses it at run time too).
- **Layers not called as modules** (MiniMax-M3 sparse, ``MiniMaxM3SparseForCausalLM`` and its
  ``...ForConditionalGeneration`` wrapper): vLLM 0.34's ``MiniMaxM3Model.forward`` calls each
  layer's ``forward_input_norm`` and ``forward_after_input_norm`` instead of the layer itself
  (``vllm/models/minimax_m3/nvidia/model.py`` and ``amd/model.py``), so the forward hook the
  capture puts on each decoder layer never fires and the generator would fail after loading
  with no hidden states at all.
- **Hyper-connections** (DeepSeek-V4, DeepSeek-V4.1, HY-V4: ``hc_mult`` > 1 residual
  streams): vLLM 0.34's decoder layers return ``(x, residual, post_mix, res_mix)``; a
  layer's output is ``hc_mult`` streams, which transformers' ``output_hidden_states``
  returns as they are (``[batch, seq, hc_mult, hidden]``) and vLLM's own EAGLE-3 path
  collapses with its ``mhc_post`` kernel and a mean over the streams
  (``vllm/models/deepseek_v4/nvidia/model.py``). speculators 0.3/0.4 store one
  ``[tokens, hidden]`` tensor per layer and the capture computes neither, so these models
  are refused rather than given a third meaning (``_capture.layer_output`` refuses the
  four-value return at run time too).

Measured on an H200 with vLLM 0.26.0 (docs/gpu.md "Real-shape models"):

- **Sliding-window + full attention in one model** (GPT-OSS, Gemma 2/3, ...: ``layer_types``
  mixes ``sliding_attention`` with another kind) **on a GPU build**: speculators' generator
  puts every layer in one KV cache group. vLLM's GPU model runner marks each layer's spec with
  its backend's ``indexes_kv_by_block_stride``; ``unify_hybrid_kv_cache_specs`` (speculators
  0.4 calls it) rebuilds the sliding-window specs without that field, and merging them fails
  ("All attention layers in the same KV cache group must have the same attention spec"), as
  it does with speculators 0.3 (no unification at all). The CPU build does not mark the field
  and the same models pass there (vLLM 0.32, both releases). Probed from vLLM's sources, not
  keyed on versions.
"""

from __future__ import annotations

import inspect
from typing import Any

from ._errors import CompatError

SLIDING = "sliding_attention"
#: Architectures whose decoder layers vLLM never calls as modules (see the module docstring).
UNCALLED_LAYERS = frozenset({"MiniMaxM3SparseForCausalLM",
                             "MiniMaxM3SparseForConditionalGeneration"})


def _text_config(config: Any) -> Any:
    text = getattr(config, "text_config", None)
    return text if text is not None and not isinstance(text, dict) else config


def mixed_attention_kinds(config: Any) -> list[str] | None:
    """The attention kinds of a config that mixes sliding-window with other layers, else None."""
    kinds = list(getattr(_text_config(config), "layer_types", None) or [])
    distinct = sorted(set(kinds))
    return distinct if SLIDING in distinct and len(distinct) > 1 else None


def _source(module: str, name: str | None = None) -> str | None:
    import importlib

    try:
        mod = importlib.import_module(module)
        return inspect.getsource(getattr(mod, name) if name else mod)
    except Exception:  # noqa: BLE001 - a probe: unknown means "not this shape"
        return None


def unify_drops_block_stride() -> bool:
    """vLLM's GPU runner marks specs with ``indexes_kv_by_block_stride`` and
    ``unify_hybrid_kv_cache_specs`` does not carry the field over (the failing shape)."""
    runner = _source("vllm.v1.worker.gpu_model_runner") or ""
    unify = _source("vllm.v1.core.kv_cache_utils", "unify_hybrid_kv_cache_specs")
    return ("indexes_kv_by_block_stride" in runner and unify is not None
            and "indexes_kv_by_block_stride" not in unify)


def gpu_platform() -> bool:
    try:
        from vllm.platforms import current_platform

        return bool(current_platform.is_cuda_alike())
    except Exception:  # noqa: BLE001
        return False


def hyper_connection_streams(config: Any) -> int:
    """How many residual streams a config keeps (``hc_mult``; 1 without hyper-connections)."""
    try:
        return int(getattr(_text_config(config), "hc_mult", None) or 1)
    except (TypeError, ValueError):
        return 1


def refusal(config: Any, *, gpu: bool, drops_block_stride: bool) -> str | None:
    """Why the generator cannot run this model here, or None (pure: the probes are arguments)."""
    streams = hyper_connection_streams(config)
    if streams > 1:
        arch = ",".join(getattr(config, "architectures", None) or []) or "this model"
        return (f"speculators-compat: {arch} keeps {streams} residual streams "
                "(hyper-connections, hc_mult): its decoder layers' output is not one "
                "hidden-state tensor (transformers returns all streams; vLLM's EAGLE-3 path "
                "collapses them with its mhc_post kernel and a mean), and speculators 0.3/0.4's "
                "capture cannot read it. Not supported by the shim: extract this model's "
                "hidden states with vLLM's own extract_hidden_states (what speculators >= 0.5 "
                "uses).")
    archs = set(getattr(config, "architectures", None) or []) | set(
        getattr(_text_config(config), "architectures", None) or [])
    if archs & UNCALLED_LAYERS:
        return (f"speculators-compat: {', '.join(sorted(archs & UNCALLED_LAYERS))}: vLLM's "
                "model runs each decoder layer through its forward_input_norm and "
                "forward_after_input_norm methods, never the layer module itself, so the "
                "hidden-state capture (a hook on each layer) would see no layer output. Not "
                "supported by the shim: extract this model's hidden states with vLLM's own "
                "extract_hidden_states (what speculators >= 0.5 uses).")
    if getattr(_text_config(config), "attn_res_block_size", None) is not None:
        arch = ",".join(getattr(config, "architectures", None) or []) or "this model"
        return (f"speculators-compat: {arch} uses attention-residual blocks "
                "(attn_res_block_size): vLLM's decoder layers then return a per-block "
                "residual, not hidden_states + residual, and the hidden-state capture cannot "
                "read a layer's output. Not supported by the shim: extract this model's "
                "hidden states with vLLM's own extract_hidden_states (what speculators >= 0.5 "
                "uses).")
    kinds = mixed_attention_kinds(config)
    if kinds and gpu and drops_block_stride:
        arch = ",".join(getattr(config, "architectures", None) or []) or "this model"
        return (
            f"speculators-compat: {arch} mixes sliding-window and full attention layers "
            f"(layer_types: {', '.join(kinds)}). speculators' generator puts all layers in "
            "one KV cache group, which this vLLM's GPU build cannot form (its "
            "unify_hybrid_kv_cache_specs drops the layers' indexes_kv_by_block_stride; vLLM "
            "fails after loading the weights with 'All attention layers in the same KV cache "
            "group must have the same attention spec'). Not supported by the shim on GPU: "
            "extract this model's hidden states with vLLM's own extract_hidden_states "
            "(what speculators >= 0.5 uses), or with a CPU build of vLLM.")
    return None


def refusal_of_config_file(config: dict[str, Any]) -> str | None:
    """:func:`refusal` for a ``config.json`` read as JSON (``doctor --model``: nothing is
    imported or loaded), with this platform's probes where the config needs them."""
    from types import SimpleNamespace

    text = config.get("text_config")
    ns = SimpleNamespace(**{k: v for k, v in config.items() if k != "text_config"},
                         text_config=SimpleNamespace(**text) if isinstance(text, dict) else None)
    mixed = mixed_attention_kinds(ns) is not None
    return refusal(ns, gpu=mixed and gpu_platform(),
                   drops_block_stride=mixed and unify_drops_block_stride())


def _local_config_json(model_path: str) -> dict[str, Any] | None:
    """A local model directory's ``config.json`` as JSON; ``None`` when there is none."""
    import json
    import os

    try:
        with open(os.path.join(model_path, "config.json"), encoding="utf-8") as f:
            doc = json.load(f)
    except (OSError, ValueError, TypeError):
        return None
    return doc if isinstance(doc, dict) else None


def check_generator_model(model_path: str) -> None:
    """Raise ``CompatError`` before the generator loads anything it cannot run. A config
    transformers cannot build (a ``model_type`` only vLLM registers, such as Kimi-K3's, in a
    checkpoint without remote code) is read from the local ``config.json`` as JSON."""
    from transformers import AutoConfig

    try:
        config = AutoConfig.from_pretrained(model_path, trust_remote_code=True)
    except Exception:  # noqa: BLE001 - speculators itself reports an unreadable config
        raw = _local_config_json(model_path)
        why = refusal_of_config_file(raw) if raw is not None else None
        if why:
            raise CompatError(why) from None
        return
    mixed = mixed_attention_kinds(config) is not None  # the probes only where they matter
    why = refusal(config, gpu=mixed and gpu_platform(),
                  drops_block_stride=mixed and unify_drops_block_stride())
    if why:
        raise CompatError(why)
