"""Random-weight checkpoints of the models people train drafts for, at their published shapes.

Why: every other end-to-end check uses tiny checkpoints (hidden 128-256). These builders write
checkpoints with the published configuration of each family (hidden sizes, head layouts, MLA
ranks, expert sizes, vocabularies, attention patterns) so that the GPU run (``gpu_models.py``)
exercises the real kernels, shapes and weight formats; only the number of decoder layers and,
where memory needs it (DeepSeek-V3 / Kimi-K2.5: 256 / 384 experts of 44 M parameters each), the
number of routed experts are reduced. ``tiny=True`` shrinks every dimension (same structure,
same files) so that the builders and the device script can be tested on a CPU first.

Models (``MODELS``):

- ``kimi_k25``: ``KimiK25ForConditionalGeneration`` -- a DeepSeek-V3 text model (Kimi-K2's text
  configuration) under ``language_model.`` plus a small MoonViT vision tower and projector;
  ``config.json`` names its own config class through ``auto_map``
  (``configuration_kimi_k25.py``, written here), as the published checkpoint does. The
  published weights are INT4 (compressed-tensors); these are bf16.
- ``deepseek_v3`` (bf16) and ``deepseek_v3_fp8``: DeepSeek-V3's configuration; the FP8 one has
  block-FP8 weights as DeepSeek-V3 ships them (``quant_method`` fp8, e4m3, dynamic activation
  scales, ``weight_block_size`` [128, 128], a float32 ``weight_scale_inv`` per 128 x 128 block)
  and the bf16 one holds exactly those weights dequantized: both describe the same function up
  to the FP8 activation quantization.
- ``qwen3_moe``: Qwen3-30B-A3B's configuration (128 experts, 8 active).
- ``gpt_oss``: gpt-oss-20b's configuration (bf16 weights instead of MXFP4; sliding-window and
  full attention alternating, attention sinks, 32 experts with biases).

Hybrid-attention models (the text models of today's EAGLE-3 targets; checked against
transformers only, see ``gpu_models.py``):

- ``qwen3_5_moe``: Qwen3.5-35B-A3B's text configuration (``Qwen3_5MoeForCausalLM``), 8 layers
  in the published 3:1 pattern (gated-delta-net linear attention x 3, gated full attention),
  every layer MoE with a gated shared expert. 8 routed experts of the published 256, which
  with the published top-8 selects every expert: with a transformers-only oracle a top-8 of
  256 random router would flip near-tied experts between vLLM and transformers (Qwen3-MoE's
  layer 0 reached cosine 0.91 that way, docs/gpu.md) and blame nobody.
- ``deepseek_v32``: DeepSeek-V3.2's configuration (``DeepseekV32ForCausalLM``): DeepSeek-V3's
  MLA and MoE plus the DSA lightning indexer at its published shape (64 heads of 128,
  ``index_topk`` 2048). 4 layers (3 dense, 1 MoE, as published), 8 routed experts in one group,
  all selected (same reason). ``index_topk`` 2048 is at least every sequence the run uses, so
  the sparse attention keeps every causal token and transformers' forward stays the oracle
  whatever the indexer scores.
- ``gemma4``: Gemma 4 31B's text configuration (``Gemma4ForCausalLM``): 6 layers, 5 sliding
  (window 1024, head dim 256, 16 KV heads) then 1 full (head dim 512, 4 KV heads sharing K
  as V), tied embeddings, final soft-capping 30; q/k norm weights tempered as in
  ``speculators_compat.demo.checkpoints._temper_qk_norms`` (untrained Gemma 4 attention is
  otherwise nearly one-hot and bf16 rounding alone moves the states).

The tiny (``tiny=True``) versions of these three take their dimensions from the recipes of
``speculators_compat.demo.checkpoints`` (same kinds), with the layer counts and patterns here.
DeepSeek-V4 and Kimi-K3 are not built: see docs/gpu.md ("Real-shape models").

Weights: normal(0, initializer_range) for matrices, ones for norm weights, zeros for other
vectors (routing biases, attention sinks, linear biases), made directly on ``device`` in bf16
(``speculators_compat.demo.checkpoints``' fast init). Tokenizer: a word-level tokenizer of the
model's vocabulary size (the data are token ids).
"""

from __future__ import annotations

import copy
import json
import math
import os
import shutil
from pathlib import Path
from typing import Any

# --------------------------------------------------------------------------- published configs
#: DeepSeek-V3 (deepseek-ai/DeepSeek-V3 config.json); 61 layers, 256 experts published.
DEEPSEEK_V3: dict[str, Any] = {
    "model_type": "deepseek_v3", "architectures": ["DeepseekV3ForCausalLM"],
    "vocab_size": 129280, "hidden_size": 7168, "intermediate_size": 18432,
    "moe_intermediate_size": 2048, "num_attention_heads": 128, "num_key_value_heads": 128,
    "q_lora_rank": 1536, "kv_lora_rank": 512, "qk_rope_head_dim": 64, "qk_nope_head_dim": 128,
    "v_head_dim": 128, "n_shared_experts": 1, "n_routed_experts": 256,
    "num_experts_per_tok": 8, "n_group": 8, "topk_group": 4, "topk_method": "noaux_tc",
    "scoring_func": "sigmoid", "norm_topk_prob": True, "routed_scaling_factor": 2.5,
    "first_k_dense_replace": 3, "moe_layer_freq": 1, "hidden_act": "silu",
    "max_position_embeddings": 163840, "rms_norm_eps": 1e-6, "initializer_range": 0.02,
    "tie_word_embeddings": False, "attention_bias": False, "bos_token_id": 0,
    "eos_token_id": 1, "num_hidden_layers": 61,
    "rope_scaling": {"type": "yarn", "factor": 40, "original_max_position_embeddings": 4096,
                     "beta_fast": 32, "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 1.0},
    "rope_theta": 10000,
}
#: Kimi-K2 / K2.5 text model (moonshotai/Kimi-K2.5 text_config): DeepSeek-V3 with 384 experts,
#: one dense layer, 64 heads, routed_scaling_factor 2.827, a 163,840-token vocabulary.
KIMI_K25_TEXT: dict[str, Any] = {
    **DEEPSEEK_V3, "vocab_size": 163840, "num_attention_heads": 64, "num_key_value_heads": 64,
    "n_routed_experts": 384, "n_group": 1, "topk_group": 1, "routed_scaling_factor": 2.827,
    "first_k_dense_replace": 1, "bos_token_id": 163584, "eos_token_id": 163585,
    "max_position_embeddings": 262144,
    "rope_scaling": {"type": "yarn", "factor": 64.0, "original_max_position_embeddings": 4096,
                     "beta_fast": 1.0, "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 1.0},
    "rope_theta": 50000.0,
}
#: Kimi-K2.5's MoonViT vision tower and projector (published: 27 layers of hidden 1152).
KIMI_K25_VISION: dict[str, Any] = {
    "patch_size": 14, "init_pos_emb_height": 64, "init_pos_emb_width": 64,
    "init_pos_emb_time": 4, "pos_emb_type": "divided_fixed", "num_attention_heads": 16,
    "num_hidden_layers": 27, "hidden_size": 1152, "intermediate_size": 4304,
    "merge_kernel_size": [2, 2], "video_attn_type": "spatial_temporal",
    "merge_type": "sd2_tpool", "mm_projector_type": "patchmerger",
    "projector_hidden_act": "gelu", "projector_ln_eps": 1e-5,
}
#: Kimi-K2.5's media preprocessing (preprocessor_config.json; vLLM's fused processor reads it).
KIMI_K25_MEDIA = {
    "in_patch_limit": 16384, "patch_size": 14, "image_mean": [0.5, 0.5, 0.5],
    "image_std": [0.5, 0.5, 0.5], "merge_kernel_size": 2, "fixed_output_tokens": None,
    "patch_limit_on_one_side": 512, "in_patch_limit_each_frame": 4096,
    "in_patch_limit_video": None, "sample_fps": 2.0, "max_num_frames_each_video": None,
    "temporal_merge_kernel_size": 4, "timestamp_mode": "hh:mm:ss.fff",
    "config_type": "media_proc",
}
#: Qwen3-30B-A3B (Qwen/Qwen3-30B-A3B config.json); 48 layers published.
QWEN3_30B_A3B: dict[str, Any] = {
    "model_type": "qwen3_moe", "architectures": ["Qwen3MoeForCausalLM"],
    "vocab_size": 151936, "hidden_size": 2048, "intermediate_size": 6144,
    "moe_intermediate_size": 768, "num_attention_heads": 32, "num_key_value_heads": 4,
    "head_dim": 128, "num_experts": 128, "num_experts_per_tok": 8, "norm_topk_prob": True,
    "decoder_sparse_step": 1, "mlp_only_layers": [], "hidden_act": "silu",
    "max_position_embeddings": 40960, "rms_norm_eps": 1e-6, "rope_theta": 1000000.0,
    "initializer_range": 0.02, "tie_word_embeddings": False, "attention_bias": False,
    "bos_token_id": 151643, "eos_token_id": 151645, "num_hidden_layers": 48,
}
#: gpt-oss-20b (openai/gpt-oss-20b config.json; weights MXFP4 there, bf16 here); 24 layers.
GPT_OSS_20B: dict[str, Any] = {
    "model_type": "gpt_oss", "architectures": ["GptOssForCausalLM"],
    "vocab_size": 201088, "hidden_size": 2880, "intermediate_size": 2880,
    "num_attention_heads": 64, "num_key_value_heads": 8, "head_dim": 64,
    "num_local_experts": 32, "num_experts_per_tok": 4, "experts_per_token": 4,
    "sliding_window": 128, "attention_bias": True, "swiglu_limit": 7.0,
    "max_position_embeddings": 131072, "rms_norm_eps": 1e-5, "initializer_range": 0.02,
    "tie_word_embeddings": False, "hidden_act": "silu", "router_aux_loss_coef": 0.9,
    "rope_scaling": {"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0,
                     "truncate": False, "original_max_position_embeddings": 4096},
    "rope_theta": 150000, "bos_token_id": 199998, "eos_token_id": 200002,
    "pad_token_id": 199999, "num_hidden_layers": 24,
}
#: Qwen3.5-35B-A3B text model (Qwen/Qwen3.5-35B-A3B config.json ``text_config``); 40 layers,
#: 256 experts published. ``mrope_section`` / ``mrope_interleaved`` are left out of
#: ``rope_parameters``: the text-only ``Qwen3_5MoeForCausalLM`` takes 1-D positions, and for
#: text the three interleaved M-RoPE sections share one position, which is plain RoPE. The
#: MTP head (``mtp_num_hidden_layers``) is not built (no causal-LM class loads it).
QWEN3_5_35B_A3B_TEXT: dict[str, Any] = {
    "model_type": "qwen3_5_moe_text", "architectures": ["Qwen3_5MoeForCausalLM"],
    "vocab_size": 248320, "hidden_size": 2048, "num_attention_heads": 16,
    "num_key_value_heads": 2, "head_dim": 256, "linear_conv_kernel_dim": 4,
    "linear_key_head_dim": 128, "linear_value_head_dim": 128, "linear_num_key_heads": 16,
    "linear_num_value_heads": 32, "moe_intermediate_size": 512,
    "shared_expert_intermediate_size": 512, "num_experts": 256, "num_experts_per_tok": 8,
    "attn_output_gate": True, "full_attention_interval": 4, "hidden_act": "silu",
    "max_position_embeddings": 262144, "rms_norm_eps": 1e-6, "initializer_range": 0.02,
    "tie_word_embeddings": False, "attention_bias": False, "mamba_ssm_dtype": "float32",
    "bos_token_id": 248044, "eos_token_id": 248044, "num_hidden_layers": 40,
    "rope_parameters": {"rope_type": "default", "rope_theta": 10000000,
                        "partial_rotary_factor": 0.25},
}
#: DeepSeek-V3.2 (deepseek-ai/DeepSeek-V3.2 config.json): DeepSeek-V3's plus the indexer.
DEEPSEEK_V32: dict[str, Any] = {
    **DEEPSEEK_V3, "model_type": "deepseek_v32", "architectures": ["DeepseekV32ForCausalLM"],
    "index_n_heads": 64, "index_head_dim": 128, "index_topk": 2048,
}
#: Gemma 4 31B text model (google/gemma-4-31B config.json ``text_config``); 60 layers
#: published (5 sliding : 1 full).
GEMMA4_31B_TEXT: dict[str, Any] = {
    "model_type": "gemma4_text", "architectures": ["Gemma4ForCausalLM"],
    "vocab_size": 262144, "hidden_size": 5376, "intermediate_size": 21504,
    "num_attention_heads": 32, "num_key_value_heads": 16, "head_dim": 256,
    "global_head_dim": 512, "num_global_key_value_heads": 4, "attention_k_eq_v": True,
    "sliding_window": 1024, "final_logit_softcapping": 30.0,
    "hidden_activation": "gelu_pytorch_tanh", "hidden_size_per_layer_input": 0,
    "vocab_size_per_layer_input": 262144, "num_kv_shared_layers": 0,
    "enable_moe_block": False, "use_double_wide_mlp": False,
    "max_position_embeddings": 262144, "rms_norm_eps": 1e-6, "initializer_range": 0.02,
    "tie_word_embeddings": True, "attention_bias": False, "bos_token_id": 2,
    "eos_token_id": 1, "pad_token_id": 0, "num_hidden_layers": 60,
    "rope_parameters": {
        "full_attention": {"rope_type": "proportional", "rope_theta": 1000000.0,
                           "partial_rotary_factor": 0.25},
        "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}},
}
#: Each layer's attention kind, by model type, from the layer index and the layer count
#: (the published patterns: Qwen3.5 every 4th layer full; Gemma 4 every 6th and the last).
_LAYER_PATTERNS = {
    "qwen3_5_moe_text": lambda i, n: "full_attention" if (i + 1) % 4 == 0
    else "linear_attention",
    "gemma4_text": lambda i, n: "full_attention" if (i + 1) % 6 == 0 or i == n - 1
    else "sliding_attention",
    "gpt_oss": lambda i, n: "sliding_attention" if i % 2 == 0 else "full_attention",
}

#: What each model keeps of the published shape. ``layers``: decoder layers built (published
#: counts above); ``experts``: routed experts built (None: all); ``capture``: the layer ids
#: the GPU run asks for (the native oracle cannot return the last layer's output: vLLM collects
#: an auxiliary layer k+1 at the input of decoder layer k+1, which the last layer has not).
MODELS: dict[str, dict[str, Any]] = {
    "kimi_k25": {"text": KIMI_K25_TEXT, "layers": 4, "experts": 16, "capture": [0, 1, 2],
                 "oracle": "native"},
    "deepseek_v3_fp8": {"text": DEEPSEEK_V3, "layers": 5, "experts": 16, "capture": [0, 2, 3],
                        "oracle": "native+bf16_twin", "twin": "deepseek_v3"},
    # The bf16 twin of deepseek_v3_fp8 (built with it: its FP8 weights dequantized).
    # transformers and vLLM's native path both: a MoE layer that misses transformers but
    # matches the native path is vLLM-vs-transformers numerics (e.g. routing), not the shim.
    "deepseek_v3": {"text": DEEPSEEK_V3, "layers": 5, "experts": 16, "capture": [0, 2, 3],
                    "oracle": "transformers+native"},
    "qwen3_moe": {"text": QWEN3_30B_A3B, "layers": 5, "experts": None, "capture": [0, 1, 3],
                  "oracle": "transformers+native"},
    "gpt_oss": {"text": GPT_OSS_20B, "layers": 4, "experts": None, "capture": [0, 1, 3],
                "oracle": "transformers"},
    # Hybrid attention: transformers is the only oracle (gpu_models.py says why). Captured:
    # linear, full, linear after a full layer, the last (full) layer.
    "qwen3_5_moe": {"text": QWEN3_5_35B_A3B_TEXT, "layers": 8, "experts": 8,
                    "capture": [0, 3, 4, 7], "oracle": "transformers"},
    # dense MLA+indexer, dense, the MoE layer
    "deepseek_v32": {"text": DEEPSEEK_V32, "layers": 4, "experts": 8, "capture": [0, 2, 3],
                     "oracle": "transformers"},
    # sliding, the last sliding, the full layer
    "gemma4": {"text": GEMMA4_31B_TEXT, "layers": 6, "experts": None, "capture": [0, 4, 5],
               "oracle": "transformers"},
}
#: Models whose routed experts are all selected (``experts`` = the published top-k): the
#: transformers-only oracle must not depend on near-tied routing (see the module docstring).
#: DeepSeek-style grouped routing then needs one group (``n_group`` / ``topk_group`` 1).
_ALL_EXPERTS_SELECTED = ("qwen3_5_moe", "deepseek_v32")
#: Models whose tiny dimensions come from ``speculators_compat.demo.checkpoints``' recipes.
_TINY_FROM_RECIPE = ("qwen3_5_moe", "deepseek_v32", "gemma4")

#: CPU-test dimensions (same structure; vLLM's CPU attention needs head sizes 64/128, MLA
#: kv_lora_rank 512 + rope 64).
_TINY = {
    "deepseek_v3": {"vocab_size": 1024, "hidden_size": 256, "intermediate_size": 512,
                    "moe_intermediate_size": 128, "num_attention_heads": 2,
                    "num_key_value_heads": 2, "q_lora_rank": 64, "n_group": 1,
                    "topk_group": 1, "max_position_embeddings": 4096,
                    "bos_token_id": 0, "eos_token_id": 1},
    "qwen3_moe": {"vocab_size": 1024, "hidden_size": 128, "intermediate_size": 256,
                  "moe_intermediate_size": 128, "num_attention_heads": 2,
                  "num_key_value_heads": 1, "head_dim": 64, "num_experts": 8,
                  "bos_token_id": 0, "eos_token_id": 1},
    "gpt_oss": {"vocab_size": 1024, "hidden_size": 128, "intermediate_size": 128,
                "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64,
                "num_local_experts": 8, "sliding_window": 16, "bos_token_id": 0,
                "eos_token_id": 1, "pad_token_id": 2, "max_position_embeddings": 4096},
}
_TINY_EXPERTS = 8
_TINY_VISION = {"num_attention_heads": 2, "num_hidden_layers": 1, "hidden_size": 128,
                "intermediate_size": 256, "init_pos_emb_height": 16, "init_pos_emb_width": 16}

FP8_BLOCK = 128
FP8_MAX = 448.0  # float8_e4m3fn
FP8_QUANT = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
             "weight_block_size": [FP8_BLOCK, FP8_BLOCK]}
#: DeepSeek-V3's FP8 checkpoint quantizes every projection of attention and MLP (dense,
#: shared and routed experts); embeddings, lm_head, the router (``mlp.gate``) and norms stay.
FP8_MODULES = ("q_a_proj", "q_b_proj", "kv_a_proj_with_mqa", "kv_b_proj", "o_proj",
               "gate_proj", "up_proj", "down_proj")


def text_config(name: str, tiny: bool = False) -> dict[str, Any]:
    """The text-model config of ``name`` as built: published values, fewer layers/experts."""
    spec = MODELS[name]
    cfg = copy.deepcopy(spec["text"])
    cfg["num_hidden_layers"] = spec["layers"]
    n_exp = _TINY_EXPERTS if tiny else spec["experts"]
    if name in _TINY_FROM_RECIPE:
        return _hybrid_text_config(name, cfg, n_exp, tiny)
    if cfg["model_type"] == "deepseek_v3":
        if n_exp:
            cfg["n_routed_experts"] = n_exp
        if tiny:
            cfg.update(_TINY["deepseek_v3"])
            cfg["vocab_size"] = 1024
            cfg["num_experts_per_tok"] = n_exp  # all selected: no routing ties at tiny dims
    elif tiny:
        cfg.update(_TINY[cfg["model_type"]])
        if cfg["model_type"] == "qwen3_moe":
            cfg["num_experts_per_tok"] = cfg["num_experts"]
        if cfg["model_type"] == "gpt_oss":
            cfg["num_experts_per_tok"] = cfg["experts_per_token"] = cfg["num_local_experts"]
    if cfg["model_type"] == "gpt_oss":
        cfg["layer_types"] = _layer_types(cfg)
    return _rope_parameters(cfg)


def _layer_types(cfg: dict[str, Any]) -> list[str]:
    n = cfg["num_hidden_layers"]
    return [_LAYER_PATTERNS[cfg["model_type"]](i, n) for i in range(n)]


def _hybrid_text_config(name: str, cfg: dict[str, Any], n_exp: int | None,
                        tiny: bool) -> dict[str, Any]:
    """``qwen3_5_moe`` / ``deepseek_v32`` / ``gemma4``: published values (``tiny``: the
    demo recipe's dimensions over them), the built layer count with the published attention
    pattern, ``n_exp`` routed experts all selected where :data:`_ALL_EXPERTS_SELECTED`."""
    if tiny:
        from speculators_compat.demo.checkpoints import _RECIPES

        layers = cfg["num_hidden_layers"]
        recipe = {k: v for k, v in _RECIPES[name].items()
                  if k not in ("model_type", "layer_types", "num_hidden_layers")}
        cfg.update(recipe, vocab_size=1024, max_position_embeddings=4096, bos_token_id=0,
                   eos_token_id=1, pad_token_id=2, num_hidden_layers=layers)
        if name == "gemma4":
            cfg["vocab_size_per_layer_input"] = cfg["vocab_size"]
            cfg["sliding_window"] = 16  # the tiny sequences (--max-len 64) cross it
    if name in _ALL_EXPERTS_SELECTED and n_exp:
        if cfg["model_type"] == "qwen3_5_moe_text":
            cfg["num_experts"] = cfg["num_experts_per_tok"] = n_exp
        else:
            cfg.update(n_routed_experts=n_exp, num_experts_per_tok=n_exp, n_group=1,
                       topk_group=1)
    if cfg["model_type"] in _LAYER_PATTERNS:
        cfg.pop("full_attention_interval", None)
        cfg["layer_types"] = _layer_types(cfg)
    return _rope_parameters(cfg)


def _rope_parameters(cfg: dict[str, Any]) -> dict[str, Any]:
    """transformers 5 reads ``rope_parameters`` (``rope_theta`` inside)."""
    if "rope_scaling" in cfg:  # transformers 5 reads rope_parameters (rope_theta inside)
        rp = dict(cfg.pop("rope_scaling"))
        rp["rope_type"] = rp.pop("type", rp.get("rope_type"))
        rp["rope_theta"] = cfg.pop("rope_theta")
        cfg["rope_parameters"] = rp
    elif "rope_theta" in cfg:
        cfg["rope_parameters"] = {"rope_type": "default", "rope_theta": cfg.pop("rope_theta")}
    return cfg


def _hf_config(cfg: dict[str, Any]):
    import transformers

    params = dict(cfg)
    params.pop("architectures", None)
    return transformers.AutoConfig.for_model(params.pop("model_type"), **params)


def _save_text_model(cfg: dict[str, Any], out: Path, device: str, seed: int,
                     kind: str | None = None) -> Any:
    """Random bf16 weights of the text model, saved with transformers' own names.

    The demo checkpoints' weight and config handling applies (``kind``: their recipe name):
    tied embeddings tied again after ``to_empty`` (Gemma 4), Gemma 4's q/k norms tempered,
    DeepSeek's zero routing bias ensured, and the config keys other transformers / vLLM
    versions reject dropped (DSA models' ``layer_types``)."""
    import torch
    import transformers

    from speculators_compat.demo.checkpoints import (
        _add_config_keys,
        _drop_config_keys,
        _ensure_routing_bias,
        _init_fast,
        _temper_qk_norms,
    )

    config = _hf_config(cfg)
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    model = model.to_empty(device=device)
    model.tie_weights()  # to_empty gives tied parameters separate storage (no-op if untied)
    _init_fast(model, float(config.initializer_range), seed, device)
    _temper_qk_norms(model)  # Gemma 4 only
    model.eval().save_pretrained(str(out), safe_serialization=True, max_shard_size="5GB")
    del model
    if device != "cpu":
        torch.cuda.empty_cache()
    _ensure_routing_bias(out, config)
    if kind:
        _drop_config_keys(out, kind)
        _add_config_keys(out, config)
    return config


#: Kimi-K2.5's media tokens, at the top of the vocabulary (``<|media_pad|>`` = the config's
#: ``media_placeholder_token_id``): vLLM's multimodal processor inserts them into the dummy
#: prompts it measures the encoder budget with, in every worker, even for text-only use.
KIMI_MEDIA_TOKENS = ["<|media_pad|>", "<|media_begin|>", "<|media_content|>", "<|media_end|>",
                     "<|kimi_k25_video_placeholder|>"]


def _tokenizer(out: Path, vocab: int, max_len: int, extra_top: list[str] | None = None) -> None:
    """``build_word_tokenizer``'s layout; ``extra_top`` special tokens take the highest ids
    (``vocab - 1``, ``vocab - 2``, ...)."""
    import transformers
    from tokenizers import Tokenizer, models, pre_tokenizers

    from speculators_compat.demo.checkpoints import (
        CHAT_TEMPLATE,
        SPECIAL_TOKENS,
        _make_tokenizer_config_portable,
    )

    top = {t: vocab - 1 - i for i, t in enumerate(extra_top or [])}
    words = {t: i for i, t in enumerate(SPECIAL_TOKENS)}
    taken = set(top.values())
    words.update((f"t{i}", i) for i in range(len(SPECIAL_TOKENS), vocab) if i not in taken)
    words.update(top)
    tok = Tokenizer(models.WordLevel(vocab=words, unk_token=SPECIAL_TOKENS[2]))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.add_special_tokens(SPECIAL_TOKENS + list(top))
    fast = transformers.PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token=SPECIAL_TOKENS[0], eos_token=SPECIAL_TOKENS[1],
        pad_token=SPECIAL_TOKENS[2], unk_token=SPECIAL_TOKENS[2],
        additional_special_tokens=SPECIAL_TOKENS[3:] + list(top),
        model_max_length=min(max_len, 1 << 20), clean_up_tokenization_spaces=False)
    fast.chat_template = CHAT_TEMPLATE
    if len(fast) != vocab:
        raise RuntimeError(f"tokenizer has {len(fast)} tokens, expected {vocab}")
    fast.save_pretrained(str(out))
    _make_tokenizer_config_portable(out)


def _shards(out: Path) -> list[Path]:
    return sorted(out.glob("*.safetensors"))


def _rewrite(out: Path, fn) -> None:
    """Apply ``fn(name, tensor) -> {name: tensor}`` to every tensor, shard by shard; rewrite
    the index (or write one for a single file)."""
    from safetensors.torch import load_file, save_file

    weight_map: dict[str, str] = {}
    for shard in _shards(out):
        new: dict[str, Any] = {}
        for name, t in load_file(str(shard)).items():
            new.update(fn(name, t))
        save_file(new, str(shard), metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(new, shard.name))
    idx = out / "model.safetensors.index.json"
    total = sum(p.stat().st_size for p in _shards(out))
    idx.write_text(json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map},
                              indent=1, sort_keys=True) + "\n")


# ------------------------------------------------------------------------------------- FP8
def quantize_block_fp8(w, block: int = FP8_BLOCK):
    """``w`` [out, in] -> (float8_e4m3fn weight, float32 ``weight_scale_inv`` per block).

    ``weight_scale_inv[i, j]`` is the factor that turns block (i, j) of the FP8 weight back into
    real values (``w ~= fp8 * scale``), DeepSeek-V3's convention (``amax / 448``)."""
    import torch

    out_f, in_f = w.shape
    nb_o, nb_i = math.ceil(out_f / block), math.ceil(in_f / block)
    pad = torch.zeros(nb_o * block, nb_i * block, dtype=torch.float32, device=w.device)
    pad[:out_f, :in_f] = w.float()
    blocks = pad.view(nb_o, block, nb_i, block)
    amax = blocks.abs().amax(dim=(1, 3)).clamp(min=1e-12)
    scale = amax / FP8_MAX
    q = (blocks / scale[:, None, :, None]).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    q = q.view(nb_o * block, nb_i * block)[:out_f, :in_f].contiguous()
    return q, scale.contiguous()


def dequantize_block_fp8(q, scale, block: int = FP8_BLOCK):
    """Inverse of :func:`quantize_block_fp8` (float32)."""
    s = scale.repeat_interleave(block, 0).repeat_interleave(block, 1)
    return q.float() * s[: q.shape[0], : q.shape[1]]


def _is_fp8_target(name: str, t) -> bool:
    if not name.endswith(".weight") or t.dim() != 2:
        return False
    return name.rsplit(".", 2)[-2] in FP8_MODULES


def _build_deepseek_pair(fp8_out: Path, bf16_out: Path, cfg: dict, device: str,
                         seed: int) -> dict[str, Any]:
    """Build the bf16 model, quantize to block FP8 (-> ``fp8_out``) and write the dequantized
    weights as the bf16 twin (-> ``bf16_out``): the twin's matrices are exactly the FP8 ones."""
    import torch

    _save_text_model(cfg, bf16_out, device, seed)
    for f in bf16_out.iterdir():
        if f.is_file() and not f.name.endswith(".safetensors") and f.name != \
                "model.safetensors.index.json":
            shutil.copy2(f, fp8_out / f.name)
    stats = {"quantized": 0, "max_rel_err": 0.0}
    from safetensors.torch import load_file, save_file

    for shard in _shards(bf16_out):
        fp8_t: dict[str, Any] = {}
        twin_t: dict[str, Any] = {}
        for name, t in load_file(str(shard), device=device if device != "cpu" else "cpu").items():
            if _is_fp8_target(name, t):
                q, s = quantize_block_fp8(t)
                deq = dequantize_block_fp8(q, s)
                err = float((deq - t.float()).norm() / t.float().norm().clamp(min=1e-12))
                stats["max_rel_err"] = max(stats["max_rel_err"], err)
                stats["quantized"] += 1
                fp8_t[name] = q.cpu()
                fp8_t[name.removesuffix("weight") + "weight_scale_inv"] = s.cpu()
                twin_t[name] = deq.to(torch.bfloat16).cpu()
            else:
                fp8_t[name] = twin_t[name] = t.cpu()
        save_file(fp8_t, str(fp8_out / shard.name), metadata={"format": "pt"})
        save_file(twin_t, str(shard), metadata={"format": "pt"})
    for out in (fp8_out, bf16_out):
        _rewrite_index_only(out)
    cfg_path = fp8_out / "config.json"
    c = json.loads(cfg_path.read_text())
    c["quantization_config"] = dict(FP8_QUANT)
    cfg_path.write_text(json.dumps(c, indent=2, sort_keys=True) + "\n")
    return stats


def _rewrite_index_only(out: Path) -> None:
    from safetensors import safe_open

    weight_map = {}
    for shard in _shards(out):
        with safe_open(str(shard), "pt") as fh:
            weight_map.update(dict.fromkeys(fh.keys(), shard.name))
    total = sum(p.stat().st_size for p in _shards(out))
    (out / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {"total_size": total}, "weight_map": weight_map}, indent=1,
        sort_keys=True) + "\n")


# ------------------------------------------------------------------------------------- Kimi
KIMI_CONFIG_PY = '''"""Kimi-K2.5 configuration (``auto_map`` class of this test checkpoint).

Written for speculators-compat's real-shape GPU checks: a vision config (MoonViT + patch-merger
projector) and a DeepSeek-V3 text config, as the published checkpoint's own class has them.
"""

from transformers import DeepseekV3Config, PretrainedConfig


class KimiK25VisionConfig(PretrainedConfig):
    model_type = "kimi_k25_vision"

    def __init__(self, patch_size=14, init_pos_emb_height=64, init_pos_emb_width=64,
                 init_pos_emb_time=4, pos_emb_type="divided_fixed", num_attention_heads=16,
                 num_hidden_layers=27, hidden_size=1152, intermediate_size=4304,
                 merge_kernel_size=(2, 2), video_attn_type="spatial_temporal",
                 merge_type="sd2_tpool", mm_projector_type="patchmerger", mm_hidden_size=None,
                 projector_hidden_act="gelu", projector_ln_eps=1e-5, **kwargs):
        super().__init__(**kwargs)
        self.patch_size = patch_size
        self.init_pos_emb_height = init_pos_emb_height
        self.init_pos_emb_width = init_pos_emb_width
        self.init_pos_emb_time = init_pos_emb_time
        self.pos_emb_type = pos_emb_type
        self.num_attention_heads = num_attention_heads
        self.num_hidden_layers = num_hidden_layers
        self.hidden_size = hidden_size
        self.intermediate_size = intermediate_size
        self.merge_kernel_size = merge_kernel_size
        self.video_attn_type = video_attn_type
        self.merge_type = merge_type
        self.mm_projector_type = mm_projector_type
        self.mm_hidden_size = hidden_size if mm_hidden_size is None else mm_hidden_size
        self.projector_hidden_act = projector_hidden_act
        self.projector_ln_eps = projector_ln_eps


class KimiK25Config(PretrainedConfig):
    model_type = "kimi_k25"

    def __init__(self, vision_config=None, text_config=None, ignore_index=-100,
                 media_placeholder_token_id=163605, pad_token_id=0,
                 use_unified_vision_chunk=False,
                 video_placeholder="<|kimi_k25_video_placeholder|>", **kwargs):
        if isinstance(vision_config, dict) or vision_config is None:
            vision_config = KimiK25VisionConfig(**(vision_config or {}))
        if isinstance(text_config, dict) or text_config is None:
            text_config = DeepseekV3Config(**(text_config or {}))
        self.vision_config = vision_config
        self.text_config = text_config
        if self.vision_config.mm_hidden_size == self.vision_config.hidden_size:
            self.vision_config.mm_hidden_size = self.text_config.hidden_size
        self.ignore_index = ignore_index
        self.media_placeholder_token_id = media_placeholder_token_id
        self.use_unified_vision_chunk = use_unified_vision_chunk
        self.video_placeholder = video_placeholder
        if getattr(self.text_config, "quantization_config", None) is not None:
            self.quantization_config = self.text_config.quantization_config
        super().__init__(pad_token_id=pad_token_id, **kwargs)

    @property
    def hidden_size(self):
        return self.text_config.hidden_size

    @property
    def vocab_size(self):
        return self.text_config.vocab_size
'''


def _vision_tensors(v: dict[str, Any], text_hidden: int, device: str, seed: int) -> dict:
    """MoonViT tower + patch-merger projector weights, in the published checkpoint's names."""
    import torch

    g = torch.Generator(device=device).manual_seed(seed + 1)
    h, mlp, p = v["hidden_size"], v["intermediate_size"], v["patch_size"]
    merged = h * v["merge_kernel_size"][0] * v["merge_kernel_size"][1]

    def rnd(*shape):
        return (torch.randn(*shape, generator=g, device=device) * 0.02).to(torch.bfloat16)

    def ones(n):
        return torch.ones(n, dtype=torch.bfloat16, device=device)

    def zeros(n):
        return torch.zeros(n, dtype=torch.bfloat16, device=device)

    t = {"vision_tower.patch_embed.proj.weight": rnd(h, 3, p, p),
         "vision_tower.patch_embed.proj.bias": zeros(h),
         "vision_tower.patch_embed.pos_emb.weight": rnd(v["init_pos_emb_height"],
                                                        v["init_pos_emb_width"], h),
         "vision_tower.encoder.final_layernorm.weight": ones(h),
         "vision_tower.encoder.final_layernorm.bias": zeros(h),
         "mm_projector.pre_norm.weight": ones(h), "mm_projector.pre_norm.bias": zeros(h),
         "mm_projector.proj.0.weight": rnd(merged, merged), "mm_projector.proj.0.bias":
             zeros(merged),
         "mm_projector.proj.2.weight": rnd(text_hidden, merged),
         "mm_projector.proj.2.bias": zeros(text_hidden)}
    for i in range(v["num_hidden_layers"]):
        b = f"vision_tower.encoder.blocks.{i}."
        t.update({b + "norm0.weight": ones(h), b + "norm0.bias": zeros(h),
                  b + "norm1.weight": ones(h), b + "norm1.bias": zeros(h),
                  b + "wqkv.weight": rnd(3 * h, h), b + "wqkv.bias": zeros(3 * h),
                  b + "wo.weight": rnd(h, h), b + "wo.bias": zeros(h),
                  b + "mlp.fc0.weight": rnd(mlp, h), b + "mlp.fc0.bias": zeros(mlp),
                  b + "mlp.fc1.weight": rnd(h, mlp), b + "mlp.fc1.bias": zeros(h)})
    return {k: x.cpu() for k, x in t.items()}


def _build_kimi(out: Path, tiny: bool, device: str, seed: int) -> None:
    from safetensors.torch import save_file

    text = text_config("kimi_k25", tiny)
    _save_text_model(text, out, device, seed)
    text_cfg = json.loads((out / "config.json").read_text())
    for k in ("architectures", "auto_map", "transformers_version"):
        text_cfg.pop(k, None)
    # language_model.model.* / language_model.lm_head.* (the published names)
    _rewrite(out, lambda name, t: {f"language_model.{name}": t})
    vision = dict(KIMI_K25_VISION, **(_TINY_VISION if tiny else {"num_hidden_layers": 1}))
    save_file(_vision_tensors(vision, text["hidden_size"], device, seed),
              str(out / "model-vision.safetensors"), metadata={"format": "pt"})
    _rewrite_index_only(out)
    vocab = text["vocab_size"]
    config = {
        "architectures": ["KimiK25ForConditionalGeneration"], "model_type": "kimi_k25",
        "auto_map": {"AutoConfig": "configuration_kimi_k25.KimiK25Config"},
        "text_config": text_cfg, "vision_config": vision,
        "media_placeholder_token_id": vocab - 1, "image_token_id": vocab - 1, "pad_token_id": 2,
        "use_unified_vision_chunk": True,
        "video_placeholder": "<|kimi_k25_video_placeholder|>",
        "dtype": "bfloat16", "torch_dtype": "bfloat16", "tie_word_embeddings": False,
        "bos_token_id": text_cfg.get("bos_token_id"), "eos_token_id": text_cfg.get("eos_token_id"),
    }
    (out / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    (out / "configuration_kimi_k25.py").write_text(KIMI_CONFIG_PY)
    (out / "preprocessor_config.json").write_text(json.dumps(
        {"media_proc_cfg": KIMI_K25_MEDIA}, indent=2) + "\n")


# ----------------------------------------------------------------------------------- entry
def build(name: str, root: str | os.PathLike[str], *, device: str = "cpu", tiny: bool = False,
          seed: int = 0) -> dict[str, Any]:
    """Build ``name`` (a key of :data:`MODELS`) under ``root/<name>``; reuse a finished build.

    ``deepseek_v3_fp8`` and ``deepseek_v3`` are built together (the bf16 one is the FP8 one
    dequantized). Returns ``{"path", "files", "bytes", "seconds", ...}``; a ``.done`` file
    (written last) marks a complete build with the same parameters.
    """
    import time

    root = Path(root)
    out = root / name
    done = out / ".done"
    key = {"name": name, "tiny": tiny, "seed": seed, "device_type": device.split(":")[0],
           "config": text_config(name, tiny), "recipe": 1}  # a changed recipe rebuilds
    if done.exists() and json.loads(done.read_text()).get("key") == key:
        return json.loads(done.read_text())
    pair = name in ("deepseek_v3", "deepseek_v3_fp8")
    dirs = [root / "deepseek_v3_fp8", root / "deepseek_v3"] if pair else [out]
    for d in dirs:
        shutil.rmtree(d, ignore_errors=True)
        d.mkdir(parents=True)
    t = time.time()
    fp8 = None
    if name == "kimi_k25":
        _build_kimi(out, tiny, device, seed)
    elif pair:
        fp8 = _build_deepseek_pair(dirs[0], dirs[1], text_config(name, tiny), device, seed)
    else:
        _save_text_model(text_config(name, tiny), out, device, seed,
                         kind=name if name in _TINY_FROM_RECIPE else None)
    seconds = time.time() - t
    result = None
    for d in dirs:
        cfg = text_config(d.name, tiny)
        _tokenizer(d, cfg["vocab_size"], cfg["max_position_embeddings"],
                   KIMI_MEDIA_TOKENS if d.name == "kimi_k25" else None)
        info = {"key": {**key, "name": d.name}, "path": str(d), "seconds": seconds,
                "files": sorted(p.name for p in d.iterdir()),
                "bytes": sum(p.stat().st_size for p in d.glob("*.safetensors")),
                "vocab_size": cfg["vocab_size"], "capture": MODELS[d.name]["capture"],
                "oracle": MODELS[d.name]["oracle"], "text_config": cfg}
        if fp8 is not None:
            info["fp8_roundtrip"] = fp8
        (d / ".done").write_text(json.dumps(info, indent=1))
        if d == out:
            result = info
    return result
