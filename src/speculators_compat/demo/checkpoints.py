"""Build tiny, randomly initialised checkpoints on local disk.

Why: the demos and end-to-end tests must run real vLLM (CPU builds) and real speculators without any
model hub access, on a 2-core machine.  The checkpoints built here are the smallest layouts that the
CPU backends of both old (0.16) and new (0.32) vLLM accept, and that match transformers' forward
closely enough in bf16 to compare hidden states layer by layer.

Every checkpoint is built with the transformers of the *running* environment, because a tokenizer
saved by transformers 5 does not load in transformers 4 (``Tokenizer class TokenizersBackend does
not exist``) and config/weight conventions drift between major versions.  Use one directory per
environment: the stamp file records the transformers version, so building the same path from another
environment rebuilds it.
"""

from __future__ import annotations

import json
import os
import pathlib
import random
import re
import shutil
import tempfile
from typing import Any

import torch
import transformers

__all__ = [
    "KINDS",
    "STAMP_NAME",
    "build_checkpoint",
    "build_fast_checkpoint",
    "build_tokenizer",
    "build_word_tokenizer",
]

#: Name of the file that records how a checkpoint directory was built (written last).
STAMP_NAME = "speculators_compat_checkpoint.json"

#: Bumped whenever the recipe changes in a way that alters the files, so old builds are redone.
_RECIPE_VERSION = 1

VOCAB_SIZE = 512
BOS_TOKEN, EOS_TOKEN, PAD_TOKEN = "<s>", "</s>", "<pad>"
IM_START, IM_END = "<|im_start|>", "<|im_end|>"
#: Special tokens in id order: ids 0..4.  ``bos/eos/pad_token_id`` of every config refer to these.
SPECIAL_TOKENS = [BOS_TOKEN, EOS_TOKEN, PAD_TOKEN, IM_START, IM_END]
BOS_ID, EOS_ID, PAD_ID = 0, 1, 2

# ChatML-like template.  The ``{% generation %}`` block lets transformers return an assistant-token
# mask (speculators' preprocessing prefers it and falls back to regex detection of the role marker).
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' }}"
    "{% if message['role'] == 'assistant' %}"
    "{% generation %}{{ message['content'] + '<|im_end|>' }}{% endgeneration %}"
    "{% else %}{{ message['content'] + '<|im_end|>' }}{% endif %}"
    "{{ '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

_COMMON: dict[str, Any] = {
    "vocab_size": VOCAB_SIZE,
    "max_position_embeddings": 2048,
    "bos_token_id": BOS_ID,
    "eos_token_id": EOS_ID,
    "pad_token_id": PAD_ID,
    "tie_word_embeddings": False,
    "initializer_range": 0.02,
    "rms_norm_eps": 1e-6,
    "hidden_act": "silu",
}

#: The Qwen3-Next / Qwen3.5 attention mix, shrunk: three gated-delta-net linear-attention
#: layers then one gated full-attention layer (see the recipes' comments).
_GATED_DELTA_NET_MIX: dict[str, Any] = {
    "hidden_size": 256,
    "num_hidden_layers": 4,
    "layer_types": ["linear_attention"] * 3 + ["full_attention"],
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "head_dim": 128,
    "partial_rotary_factor": 0.25,
    "linear_conv_kernel_dim": 4,
    "linear_key_head_dim": 128,
    "linear_value_head_dim": 128,
    "linear_num_key_heads": 2,
    "linear_num_value_heads": 4,
}
#: Their MoE: 8 experts, all selected, and a gated shared expert.
_QWEN_SHARED_EXPERT_MOE: dict[str, Any] = {
    "moe_intermediate_size": 128,
    "shared_expert_intermediate_size": 128,
    "num_experts": 8,
    "num_experts_per_tok": 8,
}

# Head dim 64: vLLM's CPU attention supports 64/128 but not e.g. 16.
_RECIPES: dict[str, dict[str, Any]] = {
    "llama": {
        "model_type": "llama",
        "hidden_size": 128,
        "intermediate_size": 256,
        "num_hidden_layers": 6,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "head_dim": 64,
    },
    # DeepSeek-V3 layout (what Kimi-K2.x uses).  DeepSeek's own MLA head dims: vLLM's GPU MLA
    # prefill rejects others; kv_lora_rank 512 + rope 64 is a head size the CPU backend (0.28+)
    # supports.  routed_scaling_factor 1.0 (DeepSeek uses 2.5) keeps the tiny model's activations
    # small with all experts selected; override it if the real value matters.
    # All 8 experts are selected so bf16 routing noise cannot flip an expert between vLLM and
    # transformers; the MoE path is still exercised.  vLLM only creates (and then requires) the
    # ``e_score_correction_bias`` tensor with ``topk_method == "noaux_tc"``, and defaults
    # ``scoring_func`` to softmax whereas transformers' DeepSeek-V3 always uses sigmoid.
    "deepseek_v3": {
        "model_type": "deepseek_v3",
        "hidden_size": 256,
        "intermediate_size": 512,
        "moe_intermediate_size": 128,
        "num_hidden_layers": 4,
        "num_attention_heads": 2,
        "num_key_value_heads": 2,
        "first_k_dense_replace": 1,
        "q_lora_rank": 64,
        "kv_lora_rank": 512,
        "qk_rope_head_dim": 64,
        "qk_nope_head_dim": 128,
        "v_head_dim": 128,
        "n_routed_experts": 8,
        "n_shared_experts": 1,
        "num_experts_per_tok": 8,
        "n_group": 1,
        "topk_group": 1,
        "topk_method": "noaux_tc",
        "scoring_func": "sigmoid",
        "norm_topk_prob": True,
        "routed_scaling_factor": 1.0,
    },
    "qwen3": {
        "model_type": "qwen3",
        "hidden_size": 128,
        "intermediate_size": 256,
        "num_hidden_layers": 6,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "head_dim": 64,
    },
    # All experts selected for the same reason as DeepSeek-V3.
    "qwen3_moe": {
        "model_type": "qwen3_moe",
        "hidden_size": 128,
        "intermediate_size": 256,
        "moe_intermediate_size": 128,
        "num_hidden_layers": 4,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "head_dim": 64,
        "num_experts": 8,
        "num_experts_per_tok": 8,
        "decoder_sparse_step": 1,
        "mlp_only_layers": [],
        "norm_topk_prob": True,
    },
    # Gemma 4 dense (google/gemma-4-31B's text config, shrunk): five sliding-window layers then one
    # full-attention layer (the published 5:1 pattern; transformers forces the last layer full),
    # and the full layers with twice the head dim (published 256 / 512, here 64 / 128: vLLM's
    # attention backends support both) and fewer KV heads that share K as V
    # (``attention_k_eq_v``, ``num_global_key_value_heads``).  The two head sizes put the layers in
    # two KV-cache groups in vLLM.  transformers 5.17+ turns ``global_head_dim`` /
    # ``num_global_key_value_heads`` into ``per_layer_config`` (saved in config.json), which is what
    # vLLM 0.34's Gemma 4 reads.  The 64-token window is shorter than the 70+ token sequences of
    # the comparisons, so the window is exercised.  Published RoPE (default theta 1e4 on sliding
    # layers, "proportional" with partial_rotary_factor 0.25 and theta 1e6 on full ones) and final
    # logit soft-capping 30 are the config defaults/values; no per-layer inputs (PLE) and no shared
    # KV layers, as in the 31B model.
    "gemma4": {
        "model_type": "gemma4_text",
        "hidden_size": 256,
        "intermediate_size": 512,
        "num_hidden_layers": 6,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 64,
        "global_head_dim": 128,
        "num_global_key_value_heads": 1,
        "attention_k_eq_v": True,
        "layer_types": ["sliding_attention"] * 5 + ["full_attention"],
        "sliding_window": 64,
        "hidden_size_per_layer_input": 0,
        "vocab_size_per_layer_input": VOCAB_SIZE,
        "num_kv_shared_layers": 0,
        "final_logit_softcapping": 30.0,
        "hidden_activation": "gelu_pytorch_tanh",
        "hidden_act": "gelu_pytorch_tanh",
        "tie_word_embeddings": True,
    },
    # Qwen3-Next (Qwen/Qwen3-Next-80B-A3B's layout, shrunk): three gated-delta-net linear-attention
    # layers then one gated full-attention layer (``full_attention_interval`` 4, spelled out as
    # ``layer_types``), every layer MoE with a gated shared expert.  Linear-attention head dims stay
    # at the published 128 (vLLM's FLA gated-delta-rule kernels), with twice as many value heads
    # as key heads as published (16 / 32, here 2 / 4); the full-attention head dim is 128 instead
    # of 256, RoPE on a quarter of it (partial_rotary_factor 0.25, the published value).  All 8
    # experts are selected for the same reason as DeepSeek-V3.
    "qwen3_next": {"model_type": "qwen3_next", **_GATED_DELTA_NET_MIX, "intermediate_size": 512,
                   "decoder_sparse_step": 1, "mlp_only_layers": [], **_QWEN_SHARED_EXPERT_MOE,
                   "norm_topk_prob": True},
    # Qwen3.5 dense text model (Qwen/Qwen3.5-27B's text_config, shrunk): the Qwen3-Next attention
    # mix (3 gated-delta-net layers, then 1 gated full-attention layer) with a dense MLP.
    # ``mamba_ssm_dtype`` float32 is copied from the published config: vLLM 0.34 takes its
    # recurrent-state cache dtype from it (transformers keeps that state in float32 too).
    "qwen3_5": {"model_type": "qwen3_5_text", **_GATED_DELTA_NET_MIX, "intermediate_size": 512,
                "mamba_ssm_dtype": "float32"},
    # Qwen3.5 MoE text model (Qwen/Qwen3.5-35B-A3B's text_config, shrunk): as ``qwen3_5`` with
    # every layer MoE plus a gated shared expert; all 8 experts selected (see DeepSeek-V3).
    "qwen3_5_moe": {"model_type": "qwen3_5_moe_text", **_GATED_DELTA_NET_MIX,
                    **_QWEN_SHARED_EXPERT_MOE, "mamba_ssm_dtype": "float32"},
    # Kimi-Linear (moonshotai/Kimi-Linear-48B-A3B's config, shrunk): three KDA (Kimi delta
    # attention) layers then one MLA layer, the published 3:1 mix, given as the published
    # ``linear_attn_config`` (1-based ``kda_layers`` / ``full_attn_layers``), which vLLM 0.34's own
    # KimiLinearConfig requires and transformers reads into ``layer_types``.  KDA head dim 128 (the
    # published value, which vLLM's fused KDA kernels want); MLA without RoPE (``mla_use_nope``,
    # vLLM asserts it; transformers' Kimi MLA never rotates) and without a query LoRA, with
    # DeepSeek's latent dims.  Layer 0 dense, the rest MoE with a shared expert, sigmoid routing
    # with a correction bias (vLLM's defaults for ``moe_router_activation_func`` / ``topk_method``);
    # all 8 experts selected as for DeepSeek-V3.  transformers saves the config keys in the
    # published spelling (``num_experts``, ``num_experts_per_token``, ...), and the weights too,
    # except that it also names the dense layer's MLP ``block_sparse_moe``: see
    # :data:`_TENSOR_RENAMES`.
    "kimi_linear": {
        "model_type": "kimi_linear",
        "hidden_size": 256,
        "intermediate_size": 512,
        "moe_intermediate_size": 128,
        "num_hidden_layers": 4,
        "num_attention_heads": 2,
        "num_key_value_heads": 2,
        "linear_attn_config": {
            "head_dim": 128,
            "num_heads": 2,
            "short_conv_kernel_size": 4,
            "kda_layers": [1, 2, 3],
            "full_attn_layers": [4],
        },
        "q_lora_rank": None,
        "kv_lora_rank": 512,
        "qk_rope_head_dim": 64,
        "qk_nope_head_dim": 128,
        "v_head_dim": 128,
        "mla_use_nope": True,
        "first_k_dense_replace": 1,
        "moe_layer_freq": 1,
        "num_experts": 8,
        "num_experts_per_token": 8,
        "num_shared_experts": 1,
        "moe_renormalize": True,
        "moe_router_activation_func": "sigmoid",
        "use_grouped_topk": True,
        "num_expert_group": 1,
        "topk_group": 1,
        "routed_scaling_factor": 1.0,
        "rms_norm_eps": 1e-5,
    },
    # Nemotron-H MoE hybrid (nvidia's Nemotron-3-Nano-30B-A3B config, shrunk): one block per layer,
    # "MEM*E" = Mamba-2, MoE, Mamba-2, attention, MoE, the start of the published pattern
    # ("MEMEM*E...") cut to show each block type once at least.  Mamba-2 with the published head
    # dim 64, state 128, conv 4, expand 2, chunk 128 (vLLM's Mamba-2 kernels) and 8 heads in 2
    # groups; attention head dim 128 (published); non-gated relu2 experts with a shared expert and
    # sigmoid routing with a correction bias, all 8 selected as for DeepSeek-V3.  transformers
    # stores the pattern as ``layers_block_type`` and derives ``num_hidden_layers`` from it, so
    # config.json gets ``num_hidden_layers`` and ``hybrid_override_pattern`` added back (published
    # configs carry both): see :func:`_add_config_keys`.
    "nemotron_h": {
        "model_type": "nemotron_h",
        "hidden_size": 256,
        "intermediate_size": 512,
        "hybrid_override_pattern": "MEM*E",
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "head_dim": 128,
        "mamba_num_heads": 8,
        "mamba_head_dim": 64,
        "n_groups": 2,
        "ssm_state_size": 128,
        "conv_kernel": 4,
        "expand": 2,
        "chunk_size": 128,
        "n_routed_experts": 8,
        "num_experts_per_tok": 8,
        "n_shared_experts": 1,
        "moe_intermediate_size": 128,
        "moe_shared_expert_intermediate_size": 256,
        "n_group": 1,
        "topk_group": 1,
        "norm_topk_prob": True,
        "routed_scaling_factor": 1.0,
        "mlp_hidden_act": "relu2",
        "layer_norm_epsilon": 1e-5,
    },
}

#: Regex renames applied to the saved tensor names, per kind.  transformers 5.19 saves Kimi-Linear
#: with the published names by reversing its load-time renames, and so also turns the dense
#: layers' ``mlp.*`` into ``block_sparse_moe.*``.  vLLM looks for the dense MLP under ``mlp`` (as in
#: the published checkpoint) and fails on the other name; transformers loads both.
_TENSOR_RENAMES: dict[str, tuple[tuple[str, str], ...]] = {
    "kimi_linear": (
        (
            r"^(model\.layers\.\d+)\.block_sparse_moe\.((?:gate|up|down)_proj\.weight)$",
            r"\1.mlp.\2",
        ),
    ),
}

#: config.json keys removed after saving, per kind.  transformers 5.19 saves DSA models'
#: ``layer_types`` as "indexed_attention", a value that transformers 5.17 rejects when it loads the
#: config (5.17 says "deepseek_sparse_attention"), and vLLM 0.34 loads ``deepseek_v32`` configs
#: with transformers' DeepseekV3Config, which validates it too.  Every layer of these models has the
#: same attention, and each version derives the list itself when it is absent (as in the published
#: configs).
_CONFIG_JSON_DROP: dict[str, tuple[str, ...]] = {
    "deepseek_v32": ("layer_types",),
    "glm_moe_dsa": ("layer_types",),
}

# DeepSeek-V3.2 (deepseek-ai/DeepSeek-V3.2's config, shrunk): the ``deepseek_v3`` recipe's MLA
# and MoE plus the DSA lightning indexer with the published indexer shape (64 heads of 128:
# vLLM's FP8 indexer kernels are built for it).  ``index_topk`` 2048 (published) is at least
# every sequence length the comparisons use (``max_position_embeddings`` is 2048), so the
# sparse attention keeps every causal token and equals dense MLA: transformers' forward stays
# a valid oracle whatever the indexer scores.
_RECIPES["deepseek_v32"] = {**_RECIPES["deepseek_v3"], "model_type": "deepseek_v32",
                            "index_n_heads": 64, "index_head_dim": 128, "index_topk": 2048}
# GLM-5 (``glm_moe_dsa``, zai-org's GLM-5.x configs, shrunk): DSA like DeepSeek-V3.2, which
# vLLM 0.34 serves with the same model class, but GLM's MLA head dims (qk_nope 192, v 256;
# latent 512 + rope 64 as in DeepSeek, which vLLM's sparse MLA kernels need), a 32-head
# indexer with interleaved RoPE (``indexer_rope_interleave``: transformers' GLM indexer always
# interleaves, vLLM's only when told), and indexer sharing with the published schedule
# (``index_topk_freq`` 4, ``index_skip_topk_offset`` 3), which on 4 layers makes the last one
# reuse layer 2's top-k (transformers saves it as ``indexer_types``).  ``index_topk`` 2048
# selects every token, as for ``deepseek_v32``.  transformers' GLM router is sigmoid with a
# correction bias, which vLLM only builds with ``topk_method`` noaux_tc and ``scoring_func``
# sigmoid; vLLM routes GLM in float32 (``moe_router_dtype``, copied from the published config).
_RECIPES["glm_moe_dsa"] = {
    **_RECIPES["deepseek_v3"],
    "model_type": "glm_moe_dsa",
    "qk_nope_head_dim": 192,
    "v_head_dim": 256,
    "moe_router_dtype": "float32",
    "index_n_heads": 32,
    "index_head_dim": 128,
    "index_topk": 2048,
    "index_topk_freq": 4,
    "index_skip_topk_offset": 3,
    "indexer_rope_interleave": True,
    "rms_norm_eps": 1e-5,
}

#: Multimodal wrappers (``...ForConditionalGeneration``), the classes the hybrid families ship
#: as: kind -> the wrapper's ``model_type``, the text recipe its ``text_config`` is built from
#: (the same tiny language model as that kind), a tiny vision tower (one layer, width 128, head
#: dim 64: a head size vLLM's vision attention backends take), the multimodal special tokens the
#: wrapper's processor looks up by attribute (added to the tokenizer after the 512 BPE tokens, so
#: ``vocab_size`` grows to hold them, and their ids go into the wrapper config) and the processor
#: files vLLM reads when it starts the model (it builds the multimodal processor even for
#: text-only prompts, and profiles the vision tower with dummy images).
#:
#: Qwen3.5 (Qwen/Qwen3.5-27B's layout): ``Qwen3_5ForConditionalGeneration``, the Qwen3-VL vision
#: tower (patch 16, temporal patch 2, 2x2 spatial merge, as published) and Qwen3-VL's processor
#: (``Qwen2VLImageProcessor`` + ``Qwen3VLVideoProcessor``).  Gemma 4 (google/gemma-4-31B's
#: layout): ``Gemma4ForConditionalGeneration`` with the Gemma 4 vision tower (patch 16, 3x3
#: pooling, as published) and no audio tower (the 31B model has none), Gemma 4's processor.
#: What the published image and video processor configs of each wrapper share.
_QWEN_PIXELS: dict[str, Any] = {
    "processor_class": "Qwen3VLProcessor", "do_resize": True, "do_rescale": True,
    "do_normalize": True, "do_convert_rgb": True, "rescale_factor": 1 / 255,
    "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5],
    "patch_size": 16, "temporal_patch_size": 2, "merge_size": 2}
_GEMMA4_PIXELS: dict[str, Any] = {
    "processor_class": "Gemma4Processor", "do_resize": True, "do_rescale": True,
    "do_normalize": False, "do_convert_rgb": True, "rescale_factor": 1 / 255,
    "image_mean": [0.0, 0.0, 0.0], "image_std": [1.0, 1.0, 1.0],
    "patch_size": 16, "pooling_kernel_size": 3}

_WRAPPERS: dict[str, dict[str, Any]] = {
    "qwen3_5_mm": {
        "model_type": "qwen3_5",
        "text": "qwen3_5",
        "vision_config": {"depth": 1, "hidden_size": 128, "intermediate_size": 256,
                          "num_heads": 2, "out_hidden_size": 256, "patch_size": 16,
                          "spatial_merge_size": 2, "temporal_patch_size": 2,
                          "num_position_embeddings": 2304, "initializer_range": 0.02},
        # token attribute -> text; config key -> token attribute (ids filled in at build time)
        "tokens": {"vision_start_token": "<|vision_start|>", "vision_end_token": "<|vision_end|>",
                   "image_token": "<|image_pad|>", "video_token": "<|video_pad|>"},
        "token_ids": {"vision_start_token_id": "vision_start_token",
                      "vision_end_token_id": "vision_end_token",
                      "image_token_id": "image_token", "video_token_id": "video_token"},
        "processor": {
            "processor_config.json": {"processor_class": "Qwen3VLProcessor"},
            "preprocessor_config.json": {
                "image_processor_type": "Qwen2VLImageProcessorFast", **_QWEN_PIXELS,
                "size": {"shortest_edge": 65536, "longest_edge": 16777216}},
            "video_preprocessor_config.json": {
                "video_processor_type": "Qwen3VLVideoProcessor", **_QWEN_PIXELS, "fps": 2,
                "min_frames": 4, "max_frames": 768, "do_sample_frames": True,
                "size": {"shortest_edge": 4096, "longest_edge": 25165824}},
        },
    },
    "gemma4_mm": {
        "model_type": "gemma4",
        "text": "gemma4",
        "vision_config": {"num_hidden_layers": 1, "hidden_size": 128, "intermediate_size": 256,
                          "num_attention_heads": 2, "num_key_value_heads": 2, "head_dim": 64,
                          "patch_size": 16, "pooling_kernel_size": 3,
                          # vLLM's Gemma 4 reads it (soft tokens per image; published: 280)
                          "default_output_length": 280, "initializer_range": 0.02},
        "audio_config": None,
        # The audio tokens too: Gemma4Processor refuses any input when the tokenizer lacks
        # ``boa_token`` / ``eoa_token`` (its check reads "audio given and no audio token, or no
        # boa token, or no eoa token"; transformers 5.19), as the published tokenizer has them.
        "tokens": {"boi_token": "<|image>", "eoi_token": "<image|>", "image_token": "<|image|>",
                   "video_token": "<|video|>", "audio_token": "<|audio|>",
                   "boa_token": "<|audio>", "eoa_token": "<audio|>"},
        "token_ids": {"boi_token_id": "boi_token", "eoi_token_id": "eoi_token",
                      "image_token_id": "image_token", "video_token_id": "video_token",
                      "audio_token_id": "audio_token", "boa_token_id": "boa_token",
                      "eoa_token_index": "eoa_token"},
        "processor": {
            "processor_config.json": {"processor_class": "Gemma4Processor",
                                      "image_seq_length": 280},
            "preprocessor_config.json": {
                "image_processor_type": "Gemma4ImageProcessor", **_GEMMA4_PIXELS,
                "max_soft_tokens": 280},
            "video_preprocessor_config.json": {
                "video_processor_type": "Gemma4VideoProcessor", **_GEMMA4_PIXELS,
                "max_soft_tokens": 70,
                "num_frames": 32, "do_sample_frames": True},
        },
    },
}

#: Checkpoint kinds that :func:`build_checkpoint` knows.
KINDS: tuple[str, ...] = tuple(_RECIPES) + tuple(_WRAPPERS)


def _stamp_key(kind: str, seed: int, overrides: dict[str, Any]) -> dict[str, Any]:
    """What identifies a build: equal keys mean byte-for-byte interchangeable checkpoints."""
    return {
        "recipe_version": _RECIPE_VERSION,
        "kind": kind,
        "seed": seed,
        # JSON round trip so that tuples/lists and key order compare equal to the stored stamp.
        "config_overrides": json.loads(json.dumps(overrides, sort_keys=True)),
        "transformers_version": transformers.__version__,
    }


def _read_stamp(path: pathlib.Path) -> dict[str, Any] | None:
    try:
        return json.loads((path / STAMP_NAME).read_text())
    except (OSError, ValueError):
        return None


def _is_complete(path: pathlib.Path, key: dict[str, Any]) -> bool:
    """A directory holds the wanted checkpoint if its stamp (written last) has the same key."""
    stamp = _read_stamp(path)
    if stamp is None or stamp.get("key") != key:
        return False
    return all((path / name).is_file() for name in stamp.get("files", ["config.json"]))


def _tokenizer_corpus() -> list[str]:
    """A fixed training corpus: some English plus seeded pseudo-words, so BPE reaches 512 tokens."""
    text = (
        "The quick brown fox jumps over the lazy dog. Speculative decoding drafts tokens with a "
        "small model and verifies them with the target model in one forward pass. Hidden states "
        "from intermediate layers of the verifier train the draft model. "
        "Hello, world! 0123456789 + - * / = ( ) [ ] { } < > : ; ' \" ? # @ & % $ _ ~ ^ | \\ `\n"
    )
    rng = random.Random(1234)
    letters = "etaoinshrdlucmfwypvbgkjqxz"
    weights = [len(letters) - i for i in range(len(letters))]
    words = [
        "".join(rng.choices(letters, weights=weights, k=rng.randint(2, 8))) for _ in range(4000)
    ]
    lines = [" ".join(words[i : i + 16]) for i in range(0, len(words), 16)]
    return [text] * 20 + lines


def build_tokenizer(
    vocab_size: int = VOCAB_SIZE, extra_special_tokens: dict[str, str] | None = None
) -> transformers.PreTrainedTokenizerFast:
    """Train a byte-level BPE tokenizer of exactly ``vocab_size`` tokens, deterministically.

    Byte-level BPE encodes and decodes any text losslessly (vLLM detokenises whatever ids the random
    model samples, so every id < vocab_size must be a real token).  Special tokens take ids 0..4:
    ``<s>`` bos, ``</s>`` eos, ``<pad>``, and the chat markers.  It is wrapped in
    ``PreTrainedTokenizerFast`` of the running transformers, so ``save_pretrained`` writes the files
    that this transformers (and vLLM on top of it) loads with ``AutoTokenizer``.

    ``extra_special_tokens`` (attribute -> token, e.g. ``{"image_token": "<|image_pad|>"}``) are
    added after the ``vocab_size`` trained tokens, in the given order, and become attributes of the
    tokenizer: the multimodal processors of the wrapper kinds look their tokens up that way.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_tokenizer_corpus(), trainer=trainer)
    if tok.get_vocab_size() != vocab_size:
        raise RuntimeError(
            f"tokenizer has {tok.get_vocab_size()} tokens, expected {vocab_size}: "
            "the training corpus is too small"
        )
    for i, t in enumerate(SPECIAL_TOKENS):
        if tok.token_to_id(t) != i:
            raise RuntimeError(f"special token {t!r} got id {tok.token_to_id(t)}, expected {i}")
    fast = transformers.PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=BOS_TOKEN,
        eos_token=EOS_TOKEN,
        pad_token=PAD_TOKEN,
        additional_special_tokens=[IM_START, IM_END],
        model_max_length=_COMMON["max_position_embeddings"],
        clean_up_tokenization_spaces=False,
        **({"extra_special_tokens": dict(extra_special_tokens)} if extra_special_tokens else {}),
    )
    fast.chat_template = CHAT_TEMPLATE
    return fast


def _make_config(kind: str, overrides: dict[str, Any]) -> transformers.PretrainedConfig:
    """The config of ``kind``; for a wrapper (:data:`_WRAPPERS`) ``overrides`` go into its
    ``text_config`` (the language model is what the comparisons read)."""
    if kind in _WRAPPERS:
        return _make_wrapper_config(kind, overrides)
    params = {**_COMMON, **_RECIPES[kind], **overrides}
    model_type = params.pop("model_type")
    return transformers.AutoConfig.for_model(model_type, **params)


def _wrapper_token_ids(kind: str) -> dict[str, int]:
    """Token attribute -> id of a wrapper's multimodal tokens: added after the BPE vocabulary."""
    return {name: VOCAB_SIZE + i for i, name in enumerate(_WRAPPERS[kind]["tokens"])}


def _make_wrapper_config(kind: str, overrides: dict[str, Any]) -> transformers.PretrainedConfig:
    spec = _WRAPPERS[kind]
    ids = _wrapper_token_ids(kind)
    # Room for the tokens a tokenizer class adds when it loads (Qwen's adds <|endoftext|>).
    vocab = VOCAB_SIZE + 8
    text = {**_COMMON, **_RECIPES[spec["text"]], "vocab_size": vocab, **overrides}
    if "vocab_size_per_layer_input" in text:
        text["vocab_size_per_layer_input"] = vocab
    params: dict[str, Any] = {"text_config": text, "vision_config": dict(spec["vision_config"]),
                              "tie_word_embeddings": text.get("tie_word_embeddings", False)}
    if "audio_config" in spec:
        params["audio_config"] = spec["audio_config"]
    params.update({key: ids[attr] for key, attr in spec["token_ids"].items()})
    return transformers.AutoConfig.for_model(spec["model_type"], **params)


def _zero_routing_bias(model: torch.nn.Module) -> None:
    """Zero DeepSeek-V3's aux-loss-free routing bias (vLLM requires the tensor; zeros = no bias)."""
    with torch.no_grad():
        for name, buf in model.named_buffers():
            if name.endswith("e_score_correction_bias"):
                buf.zero_()
        for name, param in model.named_parameters():
            if name.endswith("e_score_correction_bias"):
                param.zero_()


def _ensure_routing_bias(out: pathlib.Path, config: transformers.PretrainedConfig) -> None:
    """Add zero ``mlp.gate.e_score_correction_bias`` tensors if this transformers did not save them.

    vLLM's DeepSeek loader raises KeyError when one is missing for a MoE layer with noaux_tc.
    """
    if getattr(config, "topk_method", None) != "noaux_tc":
        return
    from safetensors import safe_open
    from safetensors.torch import load_file, save_file

    files = sorted(out.glob("*.safetensors"))
    names: set[str] = set()
    for f in files:
        with safe_open(str(f), "pt") as fh:
            names.update(fh.keys())
    first_moe = int(getattr(config, "first_k_dense_replace", 0))
    missing = [
        f"model.layers.{i}.mlp.gate.e_score_correction_bias"
        for i in range(first_moe, config.num_hidden_layers)
        if f"model.layers.{i}.mlp.gate.e_score_correction_bias" not in names
    ]
    if not missing:
        return
    if len(files) != 1:
        raise RuntimeError(f"cannot add {missing} to a sharded checkpoint in {out}")
    tensors = load_file(str(files[0]))
    for name in missing:
        tensors[name] = torch.zeros(config.n_routed_experts, dtype=torch.bfloat16)
    save_file(tensors, str(files[0]), metadata={"format": "pt"})


def _drop_config_keys(out: pathlib.Path, kind: str) -> None:
    """Remove the keys :data:`_CONFIG_JSON_DROP` lists for ``kind`` from ``out/config.json``."""
    drop = _CONFIG_JSON_DROP.get(kind, ())
    if not drop:
        return
    cfg_path = out / "config.json"
    cfg = json.loads(cfg_path.read_text())
    for key in drop:
        cfg.pop(key, None)
    cfg_path.write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")


def _add_config_keys(out: pathlib.Path, config: transformers.PretrainedConfig) -> None:
    """Write ``num_hidden_layers`` and ``max_position_embeddings`` (and Nemotron-H's
    ``hybrid_override_pattern``) into config.json where transformers derives or renames them
    instead of saving them: Nemotron-H derives the layer count from ``layers_block_type``,
    Kimi-Linear saves ``max_position_embeddings`` as ``model_max_length`` (vLLM's own
    KimiLinearConfig then defaults it to 4096).  Tools that read config.json see the real values;
    transformers and vLLM load either spelling."""
    cfg_path = out / "config.json"
    cfg = json.loads(cfg_path.read_text())
    extra = {
        "num_hidden_layers": config.num_hidden_layers,
        "max_position_embeddings": config.max_position_embeddings,
    }
    if cfg.get("model_type") == "nemotron_h":
        extra["hybrid_override_pattern"] = config.hybrid_override_pattern
    missing = {k: v for k, v in extra.items() if k not in cfg}
    if missing:
        cfg.update(missing)
        cfg_path.write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")


def _rename_tensors(out: pathlib.Path, kind: str) -> None:
    """Apply :data:`_TENSOR_RENAMES` for ``kind`` to the safetensors files in ``out``."""
    rules = [(re.compile(pat), repl) for pat, repl in _TENSOR_RENAMES.get(kind, ())]
    if not rules:
        return
    from safetensors import safe_open
    from safetensors.torch import load_file, save_file

    def renamed(name: str) -> str:
        for pat, repl in rules:
            name = pat.sub(repl, name)
        return name

    files = sorted(out.glob("*.safetensors"))
    for f in files:
        with safe_open(str(f), "pt") as fh:
            names = list(fh.keys())
            metadata = fh.metadata()
        if all(renamed(n) == n for n in names):
            continue
        tensors = load_file(str(f))
        save_file({renamed(n): t for n, t in tensors.items()}, str(f), metadata=metadata)
    index_path = out / "model.safetensors.index.json"
    if index_path.is_file():
        index = json.loads(index_path.read_text())
        index["weight_map"] = {renamed(n): f for n, f in index["weight_map"].items()}
        index_path.write_text(json.dumps(index, indent=2, sort_keys=True) + "\n")


def _make_tokenizer_config_portable(out: pathlib.Path) -> None:
    """Let a tokenizer saved by transformers 5 also load in transformers 4.x.

    transformers 5 writes ``"tokenizer_class": "TokenizersBackend"`` (unknown to 4.x: "Tokenizer
    class TokenizersBackend does not exist") and ``extra_special_tokens`` as a list (4.x expects a
    dict).  transformers 5 still loads the 4.x spelling (``PreTrainedTokenizerFast`` plus
    ``additional_special_tokens``) into the same tokenizer, so write that.  A checkpoint is still
    rebuilt per transformers version (the stamp records it); this only helps tools from another
    environment that read the directory.
    """
    cfg_path = out / "tokenizer_config.json"
    cfg = json.loads(cfg_path.read_text())
    if cfg.get("tokenizer_class") != "TokenizersBackend":
        return
    cfg["tokenizer_class"] = "PreTrainedTokenizerFast"
    extra = cfg.pop("extra_special_tokens", None)
    if isinstance(extra, list):
        cfg.setdefault("additional_special_tokens", extra)
    elif extra is not None:
        cfg["extra_special_tokens"] = extra
    cfg_path.write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")


def _temper_qk_norms(model: torch.nn.Module) -> None:
    """Scale query/key norm weights by ``head_dim ** -0.25`` in models without a
    ``1/sqrt(head_dim)`` attention scale (Gemma 4: scaling 1.0, q/k RMSNorm with weights of
    one at init).  Untrained, their logits have a standard deviation of ``sqrt(head_dim)``, the
    softmax is nearly one-hot, and bf16 rounding alone moves the hidden states: transformers'
    own bf16 forward of such a checkpoint reached cosine 0.73 against its float32 forward
    (layer 5, 2026-12-06), so no comparison with vLLM could pass.  Scaled, the logits are as a
    1/sqrt(d)-scaled model's (bf16 vs float32: 0.9998), as trained Gemma 4 norms make them.
    """
    if getattr(model.config, "model_type", None) not in ("gemma4", "gemma4_text"):
        return
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith(("q_norm.weight", "k_norm.weight")):
                param.mul_(param.shape[0] ** -0.25)


def _write_checkpoint(
    kind: str, out: pathlib.Path, seed: int, overrides: dict[str, Any]
) -> list[str]:
    """Write config, bf16 safetensors, tokenizer and generation config into ``out`` (exists)."""
    config = _make_config(kind, overrides)
    # Seeded init without disturbing the caller's global RNG state.  Initialise in float32 (the
    # documented std-0.02 init) and cast afterwards, so values do not depend on bf16 init kernels.
    auto = (transformers.AutoModelForImageTextToText if kind in _WRAPPERS
            else transformers.AutoModelForCausalLM)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = auto.from_config(config, dtype=torch.float32)
    _zero_routing_bias(model)
    _temper_qk_norms(model)
    # save_pretrained records the parameters' dtype in config.json ("dtype": "bfloat16").
    model = model.to(torch.bfloat16).eval()
    model.save_pretrained(str(out), safe_serialization=True)
    _ensure_routing_bias(out, model.config)
    _drop_config_keys(out, kind)
    if kind in _WRAPPERS:
        _write_processor_files(kind, out)
        return sorted(p.name for p in out.iterdir() if p.is_file())
    _add_config_keys(out, config)
    _rename_tensors(out, kind)

    tokenizer = build_tokenizer(config.vocab_size)
    tokenizer.save_pretrained(str(out))
    _make_tokenizer_config_portable(out)
    return sorted(p.name for p in out.iterdir() if p.is_file())


def _write_processor_files(kind: str, out: pathlib.Path) -> None:
    """The tokenizer (the BPE tokenizer plus the wrapper's named multimodal tokens), the chat
    template and the processor's JSON files (:data:`_WRAPPERS`) of a wrapper checkpoint.

    Written as JSON rather than by the processor classes' ``save_pretrained``: Qwen3-VL's and
    Gemma 4's processors import torchvision, which the CPU environments leave out (it breaks
    ``import transformers`` beside a CPU torch); the files hold what the published checkpoints'
    files hold for the settings that matter (patch size, merge/pooling size).
    """
    spec = _WRAPPERS[kind]
    tokenizer = build_tokenizer(VOCAB_SIZE, extra_special_tokens=spec["tokens"])
    ids = _wrapper_token_ids(kind)
    got = {name: tokenizer.convert_tokens_to_ids(tok) for name, tok in spec["tokens"].items()}
    if got != ids:
        raise RuntimeError(f"{kind}: multimodal token ids {got}, expected {ids}")
    tokenizer.save_pretrained(str(out))
    _make_tokenizer_config_portable(out)
    (out / "chat_template.jinja").write_text(CHAT_TEMPLATE)
    for name, content in spec["processor"].items():
        (out / name).write_text(json.dumps(content, indent=2, sort_keys=True) + "\n")


def build_checkpoint(
    kind: str,
    path: str | os.PathLike[str],
    *,
    seed: int = 0,
    overwrite: bool = False,
    **config_overrides: Any,
) -> pathlib.Path:
    """Build (or reuse) a tiny random checkpoint of ``kind`` in directory ``path``; return the path.

    ``kind`` is one of :data:`KINDS`: ``"llama"``, ``"deepseek_v3"``, ``"qwen3"``, ``"qwen3_moe"``
    (layouts the CPU builds of vLLM 0.16 and 0.32 run), and the hybrid-attention families that
    vLLM 0.34 serves on GPU: ``"gemma4"`` (sliding + full attention with two head dims),
    ``"qwen3_next"``, ``"qwen3_5"`` and ``"qwen3_5_moe"`` (gated delta net + full attention),
    ``"deepseek_v32"`` and ``"glm_moe_dsa"`` (MLA with the DSA indexer; ``index_topk`` 2048 keeps
    every token of shorter sequences, so transformers' dense result is the reference),
    ``"kimi_linear"`` (KDA + MLA) and ``"nemotron_h"`` (Mamba-2 + attention + MoE blocks).  The
    comments above each recipe in :data:`_RECIPES` say which published config it shrinks and
    which vLLM kernel constraints fix its sizes.  ``"qwen3_5_mm"`` and ``"gemma4_mm"`` are the
    multimodal wrappers those families ship as (``Qwen3_5ForConditionalGeneration``,
    ``Gemma4ForConditionalGeneration``): the ``qwen3_5`` / ``gemma4`` language model as
    ``text_config``, a one-layer vision tower, and the processor files (:data:`_WRAPPERS`);
    their ``config_overrides`` apply to the ``text_config``.
    ``config_overrides`` are merged over the recipe before the model is created (so e.g.
    ``num_hidden_layers=2`` changes the weights too; ``llama_4_scaling={...}`` just lands in
    config.json).  They must be JSON-serialisable because they are recorded in the stamp.

    The directory gets config.json, generation_config.json, bf16 ``model.safetensors`` in the
    parameter names transformers and vLLM load, a 512-token byte-level BPE tokenizer (bos ``<s>``,
    eos ``</s>``, pad ``<pad>``, a ChatML-like chat template) and a stamp file
    (:data:`STAMP_NAME`) with the build parameters and the transformers version.

    Idempotent: if ``path`` already holds a complete build with the same parameters and the same
    transformers version it is returned untouched.  A stale build of ours (stamp differs) is
    replaced.  A non-empty directory without our stamp raises ``FileExistsError`` unless
    ``overwrite=True``; ``overwrite=True`` also forces a rebuild of a matching build.  The build is
    written to a sibling temporary directory and renamed into place, so an interrupted build never
    looks complete.
    """
    _check_kind(kind, config_overrides)
    key = _stamp_key(kind, int(seed), config_overrides)

    def write(tmp: pathlib.Path) -> tuple[Any, dict[str, Any]]:
        files = _write_checkpoint(kind, tmp, int(seed), config_overrides)
        return files, {"torch_version": torch.__version__,
                       "tokenizers_version": _version("tokenizers"),
                       "safetensors_version": _version("safetensors")}

    return _build_atomically(path, key, overwrite, write)


def build_word_tokenizer(
    vocab_size: int, model_max_length: int = _COMMON["max_position_embeddings"]
) -> transformers.PreTrainedTokenizerFast:
    """A word-level tokenizer of exactly ``vocab_size`` tokens, built instantly, for any size.

    Why: :func:`build_tokenizer` trains byte-level BPE on a fixed corpus, which cannot reach a
    real model's vocabulary (Llama 3: 128,256).  Benchmarks feed token ids, so the tokenizer
    only has to exist and decode every id the model can sample.  Ids 0..4 are the special
    tokens of :data:`SPECIAL_TOKENS` (as in :func:`build_tokenizer`), id ``i >= 5`` is the word
    ``t<i>``; words split on whitespace, unknown words map to ``<pad>``.
    """
    from tokenizers import Tokenizer, models, pre_tokenizers

    if vocab_size <= len(SPECIAL_TOKENS):
        raise ValueError(f"vocab_size must exceed {len(SPECIAL_TOKENS)}, got {vocab_size}")
    vocab = {t: i for i, t in enumerate(SPECIAL_TOKENS)}
    vocab.update((f"t{i}", i) for i in range(len(SPECIAL_TOKENS), vocab_size))
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token=PAD_TOKEN))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.add_special_tokens(SPECIAL_TOKENS)
    fast = transformers.PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=BOS_TOKEN,
        eos_token=EOS_TOKEN,
        pad_token=PAD_TOKEN,
        unk_token=PAD_TOKEN,
        additional_special_tokens=[IM_START, IM_END],
        model_max_length=model_max_length,
        clean_up_tokenization_spaces=False,
    )
    fast.chat_template = CHAT_TEMPLATE
    if len(fast) != vocab_size:
        raise RuntimeError(f"word tokenizer has {len(fast)} tokens, expected {vocab_size}")
    return fast


def _init_fast(model: torch.nn.Module, std: float, seed: int, device: str) -> None:
    """Random weights in place: normal(0, std) for matrices, ones for norm weights, zeros for
    every other vector (biases, DeepSeek's routing bias).

    Persistent floating-point buffers (saved with the weights, left uninitialised by
    ``to_empty``) become zeros, except Gemma 4's per-layer output scale ``layer_scalar`` (ones):
    DeepSeek-style routing biases are buffers in transformers 5.
    """
    gen = torch.Generator(device=device).manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if param.dim() >= 2:
                param.normal_(0.0, std, generator=gen)
            elif "norm" in name.rsplit(".", 2)[-2]:
                param.fill_(1.0)
            else:
                param.zero_()
        saved = set(model.state_dict())
        for name, buf in model.named_buffers():
            if name in saved and buf.is_floating_point():
                buf.fill_(1.0 if name.endswith("layer_scalar") else 0.0)


def _write_fast_checkpoint(
    kind: str, out: pathlib.Path, seed: int, device: str, overrides: dict[str, Any]
) -> list[str]:
    """Like :func:`_write_checkpoint`, but weights made directly in bf16 on ``device`` and a
    word-level tokenizer (see :func:`build_fast_checkpoint`)."""
    config = _make_config(kind, overrides)
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    model = model.to_empty(device=device)
    # to_empty gives tied parameters separate storage; tie them again (no-op when untied).
    model.tie_weights()
    _init_fast(model, float(config.initializer_range), seed, device)
    # 5 GB shards, as published 8B checkpoints have (bounded host memory while saving).
    model.eval().save_pretrained(str(out), safe_serialization=True, max_shard_size="5GB")
    del model
    _ensure_routing_bias(out, config)
    _drop_config_keys(out, kind)
    _add_config_keys(out, config)
    _rename_tensors(out, kind)
    tokenizer = build_word_tokenizer(config.vocab_size, config.max_position_embeddings)
    tokenizer.save_pretrained(str(out))
    _make_tokenizer_config_portable(out)
    return sorted(p.name for p in out.iterdir() if p.is_file())


def build_fast_checkpoint(
    kind: str,
    path: str | os.PathLike[str],
    *,
    device: str = "cpu",
    seed: int = 0,
    overwrite: bool = False,
    **config_overrides: Any,
) -> pathlib.Path:
    """Build (or reuse) a random checkpoint of any size quickly; return its directory.

    Why: :func:`build_checkpoint` initialises in float32 on the CPU (transformers' own init),
    which for a benchmark-sized model (Llama-3-8B's shape: 8 B parameters, 16 GB of bf16)
    takes minutes and 32 GB of memory.  Here the model is created on the meta device and
    materialised in bf16 directly on ``device`` (``"cuda"`` on a GPU machine), then filled
    with seeded random values (normal(0, ``initializer_range``) for matrices, ones for norm
    weights, zeros for other vectors), and saved.  The tokenizer is
    :func:`build_word_tokenizer` of the config's ``vocab_size`` (BPE cannot reach real sizes).

    ``kind`` and ``config_overrides`` are as in :func:`build_checkpoint`.  The weights differ
    from :func:`build_checkpoint`'s for the same seed (another init), and the stamp says so:
    neither function reuses the other's directory.  Reuse, atomic replacement and
    ``overwrite`` behave as in :func:`build_checkpoint`.  The values depend on ``device`` (its
    random generator), which the stamp records too.
    """
    _check_kind(kind, config_overrides)
    if kind in _WRAPPERS:
        raise ValueError(f"build_fast_checkpoint builds text models only; {kind!r} is a "
                         "multimodal wrapper: use build_checkpoint")
    key = {**_stamp_key(kind, int(seed), config_overrides), "init": "fast-bf16-v2",
           "device_type": torch.device(device).type}

    def write(tmp: pathlib.Path) -> tuple[Any, dict[str, Any]]:
        files = _write_fast_checkpoint(kind, tmp, int(seed), device, config_overrides)
        return files, {"torch_version": torch.__version__}

    return _build_atomically(path, key, overwrite, write)


def _check_kind(kind: str, config_overrides: dict[str, Any]) -> None:
    if kind not in KINDS:
        raise ValueError(f"unknown checkpoint kind {kind!r}; expected one of {KINDS}")
    try:
        json.dumps(config_overrides)
    except TypeError as e:
        raise TypeError(f"config_overrides must be JSON-serialisable: {e}") from None


def _build_atomically(path, key: dict[str, Any], overwrite: bool, write) -> pathlib.Path:
    """Reuse a complete build with this ``key`` in ``path``, or build one with ``write(tmp)``
    (returns the file list and build info) in a sibling temporary directory, stamp it and
    rename it into place, so an interrupted build never looks complete."""
    path = pathlib.Path(path).expanduser().absolute()
    if path.exists():
        if not path.is_dir():
            raise FileExistsError(f"{path} exists and is not a directory")
        if not overwrite and _is_complete(path, key):
            return path
        if not overwrite and any(path.iterdir()) and _read_stamp(path) is None:
            raise FileExistsError(
                f"{path} is not empty and was not built by build_checkpoint; "
                "pass overwrite=True to replace it"
            )
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = pathlib.Path(tempfile.mkdtemp(prefix=f".{path.name}.building-", dir=path.parent))
    try:
        files, info = write(tmp)
        stamp = {"key": key, "files": files, "info": info}
        (tmp / STAMP_NAME).write_text(json.dumps(stamp, indent=2, sort_keys=True) + "\n")
        if path.exists():
            if not overwrite and _is_complete(path, key):  # a concurrent builder won the race
                return path
            trash = pathlib.Path(tempfile.mkdtemp(prefix=f".{path.name}.old-", dir=path.parent))
            os.replace(path, trash / path.name)
            shutil.rmtree(trash, ignore_errors=True)
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return path


def _version(dist: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(dist)
    except PackageNotFoundError:
        return None
