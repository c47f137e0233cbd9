"""The draft-layer bookkeeping (``speculators_compat._draft_layers``) against the installed
vLLM's and transformers' own code, on the same inputs.

- Which ids a draft config names: vLLM's ``get_eagle3_aux_layers_from_config`` (the
  ``v1/worker/gpu`` model runner's; identical in vLLM 0.32 and 0.34) on the config its
  speculators-format loader builds (``SpeculatorsConfig.extract_transformers_pre_trained_config``)
  or on the checkpoint's own config.
  Older releases read fewer keys; which ones is read from the reader's own source
  (``_draft_layers.reads_of_source``), as ``check-draft`` does.
- Which order they arrive in: ``EagleModelMixin._set_aux_hidden_state_layers`` then the
  layer walk's ``_maybe_add_hidden_state`` (vLLM 0.24 / 0.28 store the ids as given and
  collect by membership; 0.32+ store them sorted and de-duplicated).
- How many layers vLLM's default counts: transformers' ``get_text_config()`` of the composite
  configs (Gemma 4, Qwen3.5 dense / MoE wrappers) and its ``NemotronHConfig``, built from
  the tiny checkpoint recipes' fields and from a config.json as transformers 5 saves it.
"""

from __future__ import annotations

import copy
import importlib
import inspect
import types

import pytest

from speculators_compat import _draft_layers
from speculators_compat._draft_layers import FIELD

transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

DRAFT_CONFIGS = [
    {FIELD: [3, 17, 30]},
    {FIELD: [30, 3, 17], "eagle_config": {"layer_ids": [1, 2]}},
    {"eagle_config": {FIELD: [3, 17, 30]}},
    {"eagle_config": {"layer_ids": [3, 17, 30]}},
    {"dflash_config": {"target_layer_ids": [2, 16]}, "eagle_config": {"layer_ids": [9]}},
    {"dflash_config": {"target_layer_ids": []}, "eagle_config": {"layer_ids": [9]}},
    {"dflash_config": {"layer_ids": [4, 5]}, "eagle_config": {"layer_ids": [9]}},
    {"target_layer_ids": [2, 16, 29]},
    {"dspark_target_layer_ids": [2, 16]},
    {"dspark_target_layer_ids": [2, 16], "model_type": "deepseek_v41"},
    {FIELD: [], "target_layer_ids": [1]},
    {},
]

SPECULATORS_CONFIGS = [
    {"speculators_model_type": "eagle3", "transformer_layer_config": {"model_type": "llama"},
     FIELD: [3, 17, 30]},
    {"speculators_model_type": "eagle3", "transformer_layer_config": {"model_type": "llama"},
     FIELD: None, "eagle_config": {"layer_ids": [5, 6, 7]}},
    {"speculators_model_type": "eagle3", "transformer_layer_config": {"model_type": "llama"}},
]


def _vllm_reader():
    try:
        mod = importlib.import_module("vllm.v1.worker.gpu.spec_decode.eagle.eagle3_utils")
    except ImportError as exc:
        pytest.skip(f"this vLLM has no v1/worker/gpu EAGLE-3 utilities ({exc})")
    read = getattr(mod, "get_eagle3_aux_layers_from_config", None)
    if read is None:
        pytest.skip("this vLLM has no get_eagle3_aux_layers_from_config")
    return read


def _spec_config(hf: dict):
    return types.SimpleNamespace(draft_model_config=types.SimpleNamespace(
        hf_config=types.SimpleNamespace(**hf)))


def _reads(read) -> frozenset[str]:
    return _draft_layers.reads_of_source(inspect.getsource(inspect.getmodule(read)))


@pytest.mark.parametrize("config", DRAFT_CONFIGS)
def test_named_ids_equal_vllms_reading(config):
    read = _vllm_reader()
    assert _draft_layers.named_layers(config, _reads(read)) == read(_spec_config(config))


def test_check_draft_probes_the_reader_it_is_given():
    read = _vllm_reader()
    from speculators_compat import _check_draft
    assert _check_draft.vllm_id_reads() == _reads(read)


@pytest.mark.parametrize("config", SPECULATORS_CONFIGS)
def test_named_ids_of_speculators_format_equal_vllms_reading(config):
    read = _vllm_reader()
    base = pytest.importorskip("vllm.transformers_utils.configs.speculators.base")
    # the loader fills transformer_layer_config in place: give it a copy
    hf = base.SpeculatorsConfig.extract_transformers_pre_trained_config(copy.deepcopy(config))
    assert _draft_layers.draft_hf_config(config).get(FIELD) == hf.get(FIELD)
    assert _draft_layers.named_layers(config) == read(_spec_config(hf))


def test_fed_order_equals_vllms():
    interfaces = importlib.import_module("vllm.model_executor.models.interfaces")
    mixin = getattr(interfaces, "EagleModelMixin", None)
    if mixin is None:
        pytest.skip("this vLLM has no EagleModelMixin")
    holder = mixin.__new__(mixin)
    asked = (30, 3, 17, 17)
    holder._set_aux_hidden_state_layers(asked)
    collected: list = []
    for idx in range(40):  # the model's layer walk; each "hidden state" is its layer id
        collected = holder._maybe_add_hidden_state(collected, idx, torch.tensor(float(idx)), None)
    assert tuple(int(t) for t in collected) == _draft_layers.fed(asked) == (3, 17, 30)


def _config(model_type: str, **params):
    try:
        return transformers.AutoConfig.for_model(model_type, **params)
    except ValueError as exc:  # "Unrecognized model identifier": an older transformers
        pytest.skip(f"transformers {transformers.__version__} has no {model_type} ({exc!s:.60})")


@pytest.mark.parametrize("model_type", ["gemma4", "qwen3_5", "qwen3_5_moe"])
def test_wrapper_layer_count_is_the_text_configs(model_type):
    config = _config(model_type)
    assert _draft_layers.layer_count(config.to_dict()) == \
        config.get_text_config().num_hidden_layers


def test_nemotron_h_layer_count_equals_transformers(tmp_path):
    cls = _config("nemotron_h").__class__
    if not hasattr(cls, "layers_block_type") and "layers_block_type" not in getattr(
            cls, "__dataclass_fields__", {}):
        pytest.skip("this transformers' NemotronHConfig predates layers_block_type")
    recipe = cls(hybrid_override_pattern="MEM*E")  # the tiny recipe's pattern
    assert _draft_layers.layer_count(recipe.to_dict()) == recipe.num_hidden_layers == 5
    recipe.save_pretrained(tmp_path)
    assert _draft_layers.num_hidden_layers(tmp_path) == 5  # saved with layers_block_type only
    stale = cls.from_dict({"num_hidden_layers": 52, "hybrid_override_pattern": "MEM*E" * 8})
    assert _draft_layers.layer_count({"model_type": "nemotron_h", "num_hidden_layers": 52,
                                      "hybrid_override_pattern": "MEM*E" * 8}) \
        == stale.num_hidden_layers == len(stale.hybrid_override_pattern) == 40
