"""The layer ids vLLM 0.34's EAGLE-3 serving uses for today's hybrid-attention families, as
``draft_aux_layers`` and ``check-draft`` name them.

What is pinned (read from vLLM 0.34's sources): the draft config's ids come from
``get_eagle3_aux_layers_from_config`` (``v1/worker/gpu/spec_decode/eagle/eagle3_utils.py``);
without them every family below uses ``(2, n//2, n-3)`` with ``n = len(layers)`` of the
language model (``SupportsEagle3.get_eagle3_default_aux_hidden_state_layers``), which the
``...ForConditionalGeneration`` wrappers build from ``text_config`` and Nemotron-H from
``hybrid_override_pattern``; the model keeps each id once, in layer order
(``EagleModelMixin._set_aux_hidden_state_layers``). Configs are dicts shaped like the
published ``config.json`` files (the fields that decide the layer count, as the tiny
checkpoint recipes in ``speculators_compat.demo.checkpoints`` write them); layer counts are
the published ones where tests/e2e/scripts/real_shapes.py records them (Qwen3.5-35B-A3B 40,
Gemma 4 31B 60, DeepSeek-V3.x 61) and otherwise only need to be plausible.

Each ``*_before`` test shows an input the code before this change got wrong.
Pure Python: no torch, transformers or vLLM.
"""

from __future__ import annotations

import json
import types
import warnings

import pytest

from speculators_compat import _check_draft, _draft_layers
from speculators_compat._draft_layers import FIELD, DataLayers, Lookup
from speculators_compat.adapters.draft_aux_layers import _num_layers, settle


def _gdn_mix(n: int) -> list[str]:
    """Qwen3-Next / Qwen3.5's ``layer_types``: three gated-delta-net layers, one full."""
    return [("full_attention" if (i + 1) % 4 == 0 else "linear_attention") for i in range(n)]


def _nemotron_pattern(n: int) -> str:
    """A Nemotron-H ``hybrid_override_pattern`` of ``n`` blocks (the recipe's "MEM*E", repeated)."""
    return ("MEM*E" * n)[:n]


#: (family, target config.json, n as vLLM 0.34 counts it)
FAMILIES = [
    ("Gemma4ForCausalLM", {
        "architectures": ["Gemma4ForCausalLM"], "model_type": "gemma4_text",
        "num_hidden_layers": 60,
        "layer_types": (["sliding_attention"] * 5 + ["full_attention"]) * 10}, 60),
    ("Gemma4ForConditionalGeneration", {
        "architectures": ["Gemma4ForConditionalGeneration"], "model_type": "gemma4",
        "text_config": {"model_type": "gemma4_text", "num_hidden_layers": 60,
                        "layer_types": (["sliding_attention"] * 5 + ["full_attention"]) * 10},
        "vision_config": {"model_type": "gemma4_vision", "num_hidden_layers": 27},
        "audio_config": {"model_type": "gemma4_audio", "num_hidden_layers": 12}}, 60),
    ("Qwen3NextForCausalLM", {
        "architectures": ["Qwen3NextForCausalLM"], "model_type": "qwen3_next",
        "num_hidden_layers": 48, "layer_types": _gdn_mix(48)}, 48),
    ("Qwen3_5ForCausalLM", {
        "architectures": ["Qwen3_5ForCausalLM"], "model_type": "qwen3_5_text",
        "num_hidden_layers": 64, "layer_types": _gdn_mix(64)}, 64),
    ("Qwen3_5ForConditionalGeneration", {
        "architectures": ["Qwen3_5ForConditionalGeneration"], "model_type": "qwen3_5",
        "text_config": {"model_type": "qwen3_5_text", "num_hidden_layers": 64,
                        "layer_types": _gdn_mix(64)},
        "vision_config": {"model_type": "qwen3_5", "depth": 27}}, 64),
    ("Qwen3_5MoeForConditionalGeneration", {
        "architectures": ["Qwen3_5MoeForConditionalGeneration"], "model_type": "qwen3_5_moe",
        "text_config": {"model_type": "qwen3_5_moe_text", "num_hidden_layers": 40,
                        "layer_types": _gdn_mix(40), "mtp_num_hidden_layers": 1},
        "vision_config": {"model_type": "qwen3_5_moe", "depth": 27}}, 40),
    ("DeepseekV32ForCausalLM", {
        "architectures": ["DeepseekV32ForCausalLM"], "model_type": "deepseek_v32",
        "num_hidden_layers": 61, "num_nextn_predict_layers": 1, "index_topk": 2048}, 61),
    ("GlmMoeDsaForCausalLM", {
        "architectures": ["GlmMoeDsaForCausalLM"], "model_type": "glm_moe_dsa",
        "num_hidden_layers": 78, "num_nextn_predict_layers": 1, "index_topk_freq": 4}, 78),
    ("KimiLinearForCausalLM", {
        "architectures": ["KimiLinearForCausalLM"], "model_type": "kimi_linear",
        "num_hidden_layers": 27,
        "linear_attn_config": {"kda_layers": [i for i in range(1, 28) if i % 4],
                               "full_attn_layers": [4, 8, 12, 16, 20, 24]}}, 27),
    ("NemotronHForCausalLM", {
        "architectures": ["NemotronHForCausalLM"], "model_type": "nemotron_h",
        "num_hidden_layers": 52, "hybrid_override_pattern": _nemotron_pattern(52)}, 52),
    ("KimiK3ForConditionalGeneration", {
        "architectures": ["KimiK3ForConditionalGeneration"], "model_type": "kimi_k3",
        "text_config": {"model_type": "kimi_k3_text", "num_hidden_layers": 61},
        "vision_config": {"num_hidden_layers": 27}}, 61),
    ("DeepseekV4ForCausalLM", {
        "architectures": ["DeepseekV4ForCausalLM"], "model_type": "deepseek_v4",
        "num_hidden_layers": 61, "hc_mult": 4}, 61),
]


def _target(folder, config):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def _data(folder, ids):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / _draft_layers.DATA_CONFIG_FILE).write_text(json.dumps(
        {"model": {"target_model_path": "t"}, "hidden_states": {"layer_ids": list(ids)}}))
    return str(folder)


def _draft(folder, verifier, **fields):
    folder.mkdir(parents=True, exist_ok=True)
    cfg = {"speculators_model_type": "eagle3",
           "transformer_layer_config": {"model_type": "llama"},
           "speculators_config": {"verifier": {"name_or_path": str(verifier)}}, **fields}
    (folder / "config.json").write_text(json.dumps(cfg))
    return str(folder)


@pytest.fixture(autouse=True)
def _vllm_reads_named_layers(monkeypatch):
    """check-draft as against vLLM 0.12+ (whose speculators loader passes the ids on),
    whichever vLLM this environment has."""
    monkeypatch.setattr(_check_draft, "vllm_reads_named_layers", lambda: True)


@pytest.mark.parametrize("family, config, n", FAMILIES, ids=[f[0] for f in FAMILIES])
def test_family_layer_count_default_and_check_draft(tmp_path, family, config, n):
    assert _draft_layers.layer_count(config) == n
    assert _draft_layers.architecture_of(config) == family
    tgt = _target(tmp_path / "target", config)
    assert _draft_layers.num_hidden_layers(tgt) == n
    layers = _draft_layers.speculators_default(n)  # what the generator captures by default
    data = _data(tmp_path / "data", layers)
    want = [k + 1 for k in layers[:-1]]
    unnamed = _check_draft.check(_draft(tmp_path / "unnamed", tgt), data)
    assert unnamed["num_hidden_layers"] == n and unnamed["architecture"] == family
    assert unnamed["vllm_feeds"] == list(_draft_layers.vllm_default(n)) == [2, n // 2, n - 3]
    assert (unnamed["status"], unnamed["expected"]) == ("mismatch", want)
    named = _check_draft.check(_draft(tmp_path / "named", tgt, **{FIELD: want}), data)
    assert (named["status"], named["exit"], named["uncaptured"]) == ("match", 0, None)


# --------------------------------------------------------------------------- the layer count


def test_layer_count_prefers_the_text_config_before():
    """A wrapper whose config.json also has a top-level ``num_hidden_layers`` (here the vision
    tower's, as some conversion tools write it): vLLM builds the language model from
    ``text_config`` (``get_hf_text_config``); the code before read the top-level value."""
    cfg = {"architectures": ["Qwen3_5ForConditionalGeneration"], "num_hidden_layers": 27,
           "text_config": {"num_hidden_layers": 64}, "vision_config": {"depth": 27}}
    assert _draft_layers.layer_count(cfg) == 64
    # a text config that does not say: unknown, not the wrapper's number
    assert _draft_layers.layer_count({"num_hidden_layers": 27, "text_config": {}}) is None


def test_nemotron_h_counts_the_pattern_before(tmp_path):
    """vLLM builds ``len(hybrid_override_pattern)`` Nemotron-H layers whatever
    ``num_hidden_layers`` says (transformers 5 ignores a stale value too), and a config.json
    saved by transformers 5 has only ``layers_block_type``: the code before read
    ``num_hidden_layers``, wrong for the first and absent in the second."""
    stale = {"model_type": "nemotron_h", "num_hidden_layers": 52,
             "hybrid_override_pattern": _nemotron_pattern(42)}
    assert _draft_layers.layer_count(stale) == 42
    saved = {"model_type": "nemotron_h", "architectures": ["NemotronHForCausalLM"],
             "layers_block_type": ["mamba", "moe", "mamba", "attention", "moe"] * 10}
    assert _draft_layers.layer_count(saved) == 50
    tgt = _target(tmp_path / "t", saved)
    data = _data(tmp_path / "d", _draft_layers.speculators_default(50))
    r = _check_draft.check(_draft(tmp_path / "draft", tgt), data)
    assert (r["status"], r["vllm_feeds"]) == ("mismatch", [2, 25, 47])  # not "unknown"
    # a nested Nemotron-H text config (Nemotron-H VL wrappers) counts the same way
    assert _draft_layers.layer_count({"text_config": stale}) == 42
    # both spellings: transformers 5 builds the layers from layers_block_type
    both = {**saved, "hybrid_override_pattern": _nemotron_pattern(42)}
    assert _draft_layers.layer_count(both) == 50


def test_generator_record_counts_like_vllm():
    """The generator's record of the target's size (read back by check-draft) uses the same
    count: the serialised vLLM config, text config first, Nemotron-H's pattern."""
    def generator(hf):
        return types.SimpleNamespace(vllm_config=types.SimpleNamespace(
            model_config=types.SimpleNamespace(hf_config=hf)))

    class Config(types.SimpleNamespace):
        def to_dict(self):
            return dict(vars(self))

    assert _num_layers(generator(Config(num_hidden_layers=27,
                                        text_config={"num_hidden_layers": 64}))) == 64
    assert _num_layers(generator(Config(model_type="nemotron_h", num_hidden_layers=52,
                                        hybrid_override_pattern="MEM*E"))) == 5
    # objects without to_dict: their attributes, the text config first
    plain = types.SimpleNamespace(num_hidden_layers=27,
                                  text_config=types.SimpleNamespace(num_hidden_layers=64))
    assert _num_layers(generator(plain)) == 64
    assert _num_layers(types.SimpleNamespace()) is None


# ----------------------------------------------------------------------- order and duplicates


def test_data_layers_in_capture_order_before():
    """speculators' worker keeps the layers whose id is in the set asked for while walking
    the layers, so ``layer_ids=[31, 2, 16, 29]`` stores layers 2, 16, 29, 31 in that order
    and the draft learns from 2, 16, 29 with 31 as the target; the code before took the
    list as given ([31, 2, 16] as inputs, 29 as the target)."""
    dl = DataLayers((31, 2, 16, 29, 16), "x")
    assert dl.captured == (2, 16, 29, 31)
    assert (dl.aux, dl.target, dl.vllm_aux_ids) == ((2, 16, 29), 31, (3, 17, 30))
    rec = _draft_layers.generator_record("m", [31, 2, 16, 29], 32)
    assert rec["layer_ids"] == [31, 2, 16, 29]  # as given
    assert (rec["draft_inputs"], rec["target_layer"], rec[FIELD]) == ([2, 16, 29], 31,
                                                                      [3, 17, 30])


def test_metadata_in_other_orders_agree(tmp_path):
    a = tmp_path / "a"
    _data(a, [2, 16, 29, 31])
    _draft_layers.write_layers_file(a, [_draft_layers.generator_record("m", [31, 29, 16, 2], 32)])
    got = _draft_layers.for_dirs([a])
    assert got.layers is not None and got.layers.vllm_aux_ids == (3, 17, 30)


def test_check_draft_compares_what_vllm_feeds_before(tmp_path):
    """A config naming ``[30, 3, 17, 17]``: vLLM keeps ``(3, 17, 30)`` and feeds them in
    layer order, which is what data at layers 2, 16, 29 (+ 31) needs. The code before
    compared the list as written and reported a mismatch."""
    tgt = _target(tmp_path / "t", {"num_hidden_layers": 32})
    data = _data(tmp_path / "d", [31, 2, 16, 29])
    r = _check_draft.check(_draft(tmp_path / "draft", tgt, **{FIELD: [30, 3, 17, 17]}), data)
    assert (r["status"], r["vllm_feeds"], r["expected"]) == ("match", [3, 17, 30], [3, 17, 30])
    assert r["named"] == [30, 3, 17, 17]
    assert "vLLM feeds auxiliary hidden states [3, 17, 30]" in "\n".join(_check_draft.lines(r))


def test_settle_accepts_the_same_layers_in_another_order():
    c = types.SimpleNamespace(**{FIELD: [30, 3, 17]})
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        settle(c, [Lookup(DataLayers((31, 2, 16, 29), "d/data_config.json"), "ok")])
    assert getattr(c, FIELD) == [30, 3, 17]  # the user's value is kept as written


# ---------------------------------------------------------------------- where the ids are read


def test_named_layers_follow_vllm_034_before():
    """vLLM 0.34 reads the ids of a draft config in ``get_eagle3_aux_layers_from_config``'s
    order and never ``eagle_config.eagle_aux_hidden_state_layer_ids`` (vLLM 0.32's V1 model
    runner did); the code before read that key and missed the others."""
    named = _draft_layers.named_in
    assert named({FIELD: [3, 17, 30], "eagle_config": {FIELD: [1, 2, 3]}}) == (
        (3, 17, 30), FIELD)
    legacy = {"eagle_config": {FIELD: [3, 17, 30]}}
    assert named(legacy) is None and _draft_layers.named_layers(legacy) is None
    assert _draft_layers.legacy_named_layers(legacy) == (3, 17, 30)
    assert named({"eagle_config": {"layer_ids": [3, 17, 30]}}) == (
        (3, 17, 30), "eagle_config.layer_ids")
    assert named({"dflash_config": {"target_layer_ids": [2, 16]},
                  "eagle_config": {"layer_ids": [9]}}) == (
        (3, 17), "dflash_config.target_layer_ids (+ 1)")
    assert named({"target_layer_ids": [2, 16, 29]}) == ((3, 17, 30), "target_layer_ids (+ 1)")
    assert named({"dspark_target_layer_ids": [2, 16]})[0] == (3, 17)
    assert named({"dspark_target_layer_ids": [2, 16], "model_type": "deepseek_v41"})[0] == (2, 16)
    # a speculators-format config: only transformer_layer_config and the top-level field reach
    # vLLM's runner (an eagle_config beside them does not)
    spec = {"speculators_model_type": "eagle3", "eagle_config": {"layer_ids": [5, 6, 7]},
            "transformer_layer_config": {"model_type": "llama"}}
    assert named(spec) is None
    assert named({**spec, FIELD: [3, 17, 30]}) == ((3, 17, 30), FIELD)
    # the first truthy value decides, as in vLLM: a malformed one names nothing
    assert named({FIELD: "3,17,30", "eagle_config": {"layer_ids": [1]}}) is None


def test_check_draft_eagle_config_ids_are_not_read_by_034(tmp_path):
    tgt = _target(tmp_path / "t", {"num_hidden_layers": 32})
    data = _data(tmp_path / "d", [2, 16, 29, 31])
    folder = tmp_path / "draft"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLMEagle3"], "eagle_config": {FIELD: [3, 17, 30]}}))
    r = _check_draft.check(str(folder), data, target=str(tgt))
    assert (r["status"], r["vllm_feeds"]) == ("mismatch", [2, 16, 29])
    assert r["eagle_config_ids_not_read"] == [3, 17, 30]
    text = "\n".join(_check_draft.lines(r))
    assert "read by vLLM 0.32's V1 model runner only" in text


# ----------------------------------------------------------------- ids a model never captures


def test_ids_the_target_never_captures(tmp_path):
    """vLLM 0.34's sparse-MLA model (DeepSeek-V3.2, GLM-5) captures before each layer, so on
    CUDA id n never arrives; DeepSeek-V4 captures after each layer only, so id 0 never
    does; ids above n exist for no model. speculators' data never names them (its highest
    captured layer is the target's), a hand-written config can."""
    v32 = dict(FAMILIES[6][1])
    tgt = _target(tmp_path / "v32", v32)
    r = _check_draft.check(_draft(tmp_path / "a", tgt, **{FIELD: [3, 31, 61]}))
    assert (r["status"], r["exit"], r["uncaptured"]) == ("uncaptured", 1, [61])
    assert "captures nothing for aux ids [61]" in "\n".join(_check_draft.lines(r))
    v4 = _target(tmp_path / "v4", dict(FAMILIES[-1][1]))
    r = _check_draft.check(_draft(tmp_path / "b", v4, **{FIELD: [0, 31, 61]}))
    assert r["uncaptured"] == [0] and "embeddings" in r["uncaptured_why"]
    llama = _target(tmp_path / "llama", {"architectures": ["LlamaForCausalLM"],
                                         "num_hidden_layers": 32})
    assert _check_draft.check(_draft(tmp_path / "c", llama, **{FIELD: [0, 32]}))["status"] \
        == "named"
    r = _check_draft.check(_draft(tmp_path / "d", llama, **{FIELD: [3, 40]}),
                           _data(tmp_path / "data", [2, 39]))
    assert (r["status"], r["uncaptured"]) == ("mismatch", [40])
    assert _draft_layers.uncaptured([3, 17, 30], 32) == ([], None)


def test_a_small_targets_default_is_fed_once_each(tmp_path):
    """(2, n//2, n-3) of a 6-layer target repeats id 3; vLLM keeps it once, so the draft
    gets two states. The code before reported [2, 3, 3]."""
    tgt = _target(tmp_path / "t", {"num_hidden_layers": 6})
    r = _check_draft.check(_draft(tmp_path / "draft", tgt), _data(tmp_path / "d", [2, 3, 5]))
    assert (r["vllm_default"], r["vllm_feeds"], r["status"]) == ([2, 3, 3], [2, 3], "mismatch")
    assert "6-layer target, [2, 3] ((2, n//2, n-3) = [2, 3, 3], each id once)" in \
        "\n".join(_check_draft.lines(r))
