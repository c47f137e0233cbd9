"""The real-shape checkpoint builders of the GPU run (tests/e2e/scripts/real_shapes.py).

Cheap parts only (no model is built): the published dimensions survive the reductions, the
block-FP8 format is DeepSeek-V3's, and Kimi's media tokens sit where its config says.
"""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "e2e" / "scripts"))
import real_shapes as rs  # noqa: E402

torch = pytest.importorskip("torch")


def test_published_dims_kept_only_layers_and_experts_reduced():
    for name, spec in rs.MODELS.items():
        cfg = rs.text_config(name)
        assert cfg["num_hidden_layers"] == spec["layers"]
        for key in ("hidden_size", "vocab_size", "num_attention_heads", "intermediate_size"):
            if key in spec["text"]:  # Qwen3.5 MoE has no dense MLP
                assert cfg[key] == spec["text"][key], (name, key)
        assert max(spec["capture"]) < spec["layers"]
    kimi = rs.text_config("kimi_k25")
    assert (kimi["q_lora_rank"], kimi["kv_lora_rank"], kimi["qk_rope_head_dim"]) == (1536, 512, 64)
    assert kimi["routed_scaling_factor"] == 2.827 and kimi["first_k_dense_replace"] == 1
    assert kimi["n_routed_experts"] == 16  # of 384: memory
    gpt = rs.text_config("gpt_oss")
    assert gpt["layer_types"] == ["sliding_attention", "full_attention"] * 2
    # native-checked models cannot capture the last layer
    for name, spec in rs.MODELS.items():
        if "native" in spec["oracle"].split("+"):
            assert max(spec["capture"]) < spec["layers"] - 1, name


def test_hybrid_models_keep_published_patterns_and_select_every_expert():
    qwen = rs.text_config("qwen3_5_moe")
    assert qwen["layer_types"] == (["linear_attention"] * 3 + ["full_attention"]) * 2
    assert (qwen["linear_num_key_heads"], qwen["linear_num_value_heads"], qwen["head_dim"]) == (
        16, 32, 256)
    # top-8 as published, of 8 experts: routing cannot flip between vLLM and transformers
    assert qwen["num_experts"] == qwen["num_experts_per_tok"] == 8
    assert "mrope_section" not in qwen["rope_parameters"]
    dsa = rs.text_config("deepseek_v32")
    assert (dsa["index_n_heads"], dsa["index_head_dim"], dsa["index_topk"]) == (64, 128, 2048)
    assert (dsa["kv_lora_rank"], dsa["q_lora_rank"], dsa["first_k_dense_replace"]) == (
        512, 1536, 3)
    assert dsa["n_routed_experts"] == dsa["num_experts_per_tok"] == 8
    assert dsa["n_group"] == dsa["topk_group"] == 1
    gemma = rs.text_config("gemma4")
    assert gemma["layer_types"] == ["sliding_attention"] * 5 + ["full_attention"]
    assert (gemma["head_dim"], gemma["global_head_dim"], gemma["sliding_window"]) == (
        256, 512, 1024)
    # the hybrid models have transformers as their only oracle
    for name in ("qwen3_5_moe", "deepseek_v32", "gemma4"):
        assert rs.MODELS[name]["oracle"] == "transformers"
        tiny = rs.text_config(name, tiny=True)
        assert tiny["layer_types" if name != "deepseek_v32" else "num_hidden_layers"]
        assert tiny["hidden_size"] == 256 and tiny["vocab_size"] == 1024


def test_block_fp8_round_trip_and_layout():
    w = torch.randn(300, 200) * 0.02
    q, s = rs.quantize_block_fp8(w)
    assert q.dtype == torch.float8_e4m3fn and q.shape == w.shape
    assert s.dtype == torch.float32 and s.shape == (3, 2)  # ceil(300/128), ceil(200/128)
    deq = rs.dequantize_block_fp8(q, s)
    err = float((deq - w).norm() / w.norm())
    assert err < 0.04  # e4m3: 3 mantissa bits
    # a block's scale is its own: scaling one block leaves the others' codes unchanged
    w2 = w.clone()
    w2[:128, :128] *= 100
    q2, s2 = rs.quantize_block_fp8(w2)
    assert torch.equal(q2[128:].float(), q[128:].float()) and torch.equal(s2[1:], s[1:])
    assert rs._is_fp8_target("model.layers.3.mlp.experts.7.down_proj.weight", w)
    assert not rs._is_fp8_target("model.layers.3.mlp.gate.weight", w)  # the router
    assert not rs._is_fp8_target("model.embed_tokens.weight", w)


def test_kimi_media_tokens_at_the_top_ids(tmp_path):
    rs._tokenizer(tmp_path, 1024, 4096, rs.KIMI_MEDIA_TOKENS)
    import transformers

    tok = transformers.AutoTokenizer.from_pretrained(str(tmp_path))
    assert len(tok) == 1024
    assert tok.convert_tokens_to_ids("<|media_pad|>") == 1023  # media_placeholder_token_id
    ids = tok("<|media_begin|>image<|media_content|><|media_pad|><|media_end|>")["input_ids"]
    assert 1023 in ids and 1022 in ids
