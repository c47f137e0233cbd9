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
