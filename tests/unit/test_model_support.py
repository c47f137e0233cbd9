"""Models refused before any weights load (speculators_compat._model_support).

The refusal's cause was measured on an H200 (vLLM 0.26.0, docs/gpu.md "Real-shape
models"): GPT-OSS through speculators' generator fails after the weights load in vLLM's KV
cache grouping. Here: the decision (pure), the probes against the installed vLLM, and the
wrapper the hook_capture adapter puts on the generator's constructor.
"""

from types import SimpleNamespace

import pytest

from speculators_compat import _model_support as ms
from speculators_compat._errors import CompatError

GPT_OSS = SimpleNamespace(architectures=["GptOssForCausalLM"],
                          layer_types=["sliding_attention", "full_attention"] * 2)
LLAMA = SimpleNamespace(architectures=["LlamaForCausalLM"], layer_types=None)


def test_mixed_attention_is_found_also_under_a_text_config():
    assert ms.mixed_attention_kinds(GPT_OSS) == ["full_attention", "sliding_attention"]
    wrapper = SimpleNamespace(architectures=["X"], text_config=GPT_OSS)
    assert ms.mixed_attention_kinds(wrapper) == ["full_attention", "sliding_attention"]
    assert ms.mixed_attention_kinds(LLAMA) is None
    only_sliding = SimpleNamespace(layer_types=["sliding_attention"] * 4)
    assert ms.mixed_attention_kinds(only_sliding) is None


def test_refused_only_where_it_fails():
    why = ms.refusal(GPT_OSS, gpu=True, drops_block_stride=True)
    assert why and "GptOssForCausalLM" in why and "sliding-window and full attention" in why
    assert "extract_hidden_states" in why and "CPU build" in why  # what to use instead
    assert ms.refusal(GPT_OSS, gpu=False, drops_block_stride=True) is None  # CPU: passes
    assert ms.refusal(GPT_OSS, gpu=True, drops_block_stride=False) is None
    assert ms.refusal(LLAMA, gpu=True, drops_block_stride=True) is None


def test_probes_run_against_the_installed_vllm():
    assert ms.gpu_platform() in (True, False)
    assert ms.unify_drops_block_stride() in (True, False)


def test_check_raises_before_the_wrapped_constructor(monkeypatch, tmp_path):
    from speculators_compat.adapters import hook_capture

    monkeypatch.setattr(ms, "gpu_platform", lambda: True)
    monkeypatch.setattr(ms, "unify_drops_block_stride", lambda: True)
    import transformers

    monkeypatch.setattr(transformers.AutoConfig, "from_pretrained",
                        classmethod(lambda cls, *a, **k: GPT_OSS))
    called = []
    with pytest.raises(CompatError, match="sliding-window and full attention"):
        hook_capture._refuse_unsupported_models(lambda *a, **k: called.append(1), None,
                                                (str(tmp_path),), {})
    assert not called  # nothing was built
    monkeypatch.setattr(transformers.AutoConfig, "from_pretrained",
                        classmethod(lambda cls, *a, **k: LLAMA))
    hook_capture._refuse_unsupported_models(lambda *a, **k: called.append(1), None,
                                            (str(tmp_path),), {})
    assert called == [1]


def test_attention_residual_blocks_are_refused_before_loading():
    """Kimi-K3 configs with ``attn_res_block_size``: refused on every platform, naming the
    setting and what to use instead; the same config without it is not."""
    from types import SimpleNamespace

    from speculators_compat._model_support import refusal

    cfg = SimpleNamespace(architectures=["KimiK3ForCausalLM"], attn_res_block_size=8)
    for gpu in (True, False):
        why = refusal(cfg, gpu=gpu, drops_block_stride=False)
        assert why and "attn_res_block_size" in why and "extract_hidden_states" in why
    wrapped = SimpleNamespace(architectures=["KimiK3ForConditionalGeneration"],
                              text_config=SimpleNamespace(attn_res_block_size=4))
    assert refusal(wrapped, gpu=True, drops_block_stride=False)
    plain = SimpleNamespace(architectures=["KimiLinearForCausalLM"], attn_res_block_size=None)
    assert refusal(plain, gpu=True, drops_block_stride=True) is None


def test_hyper_connections_are_refused_before_loading():
    """DeepSeek-V4-style configs (``hc_mult`` > 1, read with transformers' own config class
    where it has one): refused on every platform, naming the streams and what to use
    instead; ``hc_mult`` 1 is a plain residual and is not refused."""
    transformers = pytest.importorskip("transformers")
    config_class = getattr(transformers, "DeepseekV4Config", None)
    cfg = (config_class(architectures=["DeepseekV4ForCausalLM"]) if config_class else
           SimpleNamespace(architectures=["DeepseekV4ForCausalLM"], hc_mult=4))
    assert ms.hyper_connection_streams(cfg) == 4
    for gpu in (True, False):
        why = ms.refusal(cfg, gpu=gpu, drops_block_stride=False)
        assert why and "DeepseekV4ForCausalLM" in why and "4 residual streams" in why
        assert "extract_hidden_states" in why
    wrapped = SimpleNamespace(architectures=["DeepseekV4ForConditionalGeneration"],
                              text_config=SimpleNamespace(hc_mult=4))
    assert ms.refusal(wrapped, gpu=True, drops_block_stride=False)
    one = SimpleNamespace(architectures=["X"], hc_mult=1)
    assert ms.refusal(one, gpu=True, drops_block_stride=True) is None


def test_minimax_m3_sparse_is_refused_before_loading():
    """vLLM runs MiniMax-M3's decoder layers through two methods, never the layer module, so a
    hook on the layer sees nothing: refused on every platform, the wrapper too."""
    for cfg in (SimpleNamespace(architectures=["MiniMaxM3SparseForCausalLM"]),
                SimpleNamespace(architectures=["MiniMaxM3SparseForConditionalGeneration"],
                                text_config=SimpleNamespace(architectures=None))):
        for gpu in (True, False):
            why = ms.refusal(cfg, gpu=gpu, drops_block_stride=False)
            assert why and "forward_after_input_norm" in why and "extract_hidden_states" in why
    assert ms.refusal(SimpleNamespace(architectures=["MiniMaxM2ForCausalLM"]),
                      gpu=True, drops_block_stride=True) is None


def test_a_config_transformers_cannot_build_is_read_as_json(tmp_path):
    """A Kimi-K3 checkpoint without remote code: transformers does not know ``kimi_k3`` (only
    vLLM registers it), so the refusal reads ``config.json`` itself; an unreadable or
    unrefused config still leaves the error to speculators."""
    import json

    (tmp_path / "config.json").write_text(json.dumps({
        "model_type": "kimi_k3_unknown_to_transformers",
        "architectures": ["KimiK3ForConditionalGeneration"],
        "text_config": {"model_type": "kimi_k3_text", "attn_res_block_size": 8}}))
    with pytest.raises(CompatError, match="attn_res_block_size"):
        ms.check_generator_model(str(tmp_path))
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "nothing_known"}))
    ms.check_generator_model(str(tmp_path))  # not refused: speculators reports it
    ms.check_generator_model(str(tmp_path / "missing"))
