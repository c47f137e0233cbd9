"""Contract of the ``draft_aux_layers`` adapter, on the installed vLLM and speculators.

The probe agrees with the expectation table; apply/revert restores identity and changes
only the declared targets. The premises, on the installed releases: speculators' worker
captures a layer's output, its standardisation feeds every captured layer but the last
to the draft, its ``Eagle3SpeculatorConfig`` leaves ``eagle_aux_hidden_state_layer_ids``
``None``; vLLM's Llama takes auxiliary id ``k`` at the input of layer ``k``, defaults to
``(2, n//2, n-3)``, and its speculators-format config loader passes the field through.
The legacy call shape: speculators' own dataset over files whose folder holds
speculators' own ``data_config.json`` (written by its ``DataGenerationConfig``), then
the draft's config saved: bare, ``config.json`` names no layers (vLLM would feed its
defaults); through the adapter it names the captured layers + 1, and vLLM's loader reads
them. Data that says nothing, a custom standardisation, and an explicit value that
disagrees give a ``DraftLayersWarning``; an explicit value is never replaced.
"""

from __future__ import annotations

import importlib
import inspect
import json
import types
import warnings

import pytest
import torch
from helpers import checkpoint

from speculators_compat import _draft_layers
from speculators_compat._errors import DraftLayersWarning
from speculators_compat.adapters.draft_aux_layers import captures_layer_output

from ..expectations import V, applied_if
from ..support import (
    BY_NAME,
    activated,
    check_apply_then_revert,
    check_probe_agrees_with_release,
    one,
)

NAME = "draft_aux_layers"

#: Its expected status on the installed release, and why (read by ``expectations.py``).
EXPECTED = (
    # speculators' own numbering vs. vLLM's (output of layer k = vLLM id k + 1) and a
    # draft config that names no layers: every vLLM release, both speculators releases.
    lambda e: applied_if(e.speculators < V("0.5.0.dev0")),
    "the generator captures layer outputs and Eagle3SpeculatorConfig leaves "
    "eagle_aux_hidden_state_layer_ids None; vLLM feeds the layer inputs (ids k + 1)")
LAYERS = [0, 2, 4, 5]  # the tiny Llama has 6 layers; its vLLM default (2, 3, 3) differs


def test_probe_agrees_with_release(base):
    check_probe_agrees_with_release(base, NAME)


def test_apply_then_revert_restores_identity(base):
    check_apply_then_revert(base, NAME)


def test_premises_on_the_installed_releases(base):
    from speculators.models.eagle3 import Eagle3SpeculatorConfig
    from speculators.train import data

    from speculators_compat._speculators import WORKER_MODULE
    from speculators_compat.adapters._probes import module_source

    # speculators: output of layer k captured; all captured layers but the last are inputs
    assert captures_layer_output(module_source(WORKER_MODULE)) is True
    sample = {"input_ids": torch.arange(3), "loss_mask": torch.ones(3),
              "hidden_states": [torch.full((3, 2), float(i)) for i in range(4)]}
    std = data.standardize_data_v1(sample)
    assert std["hidden_states"][0].tolist() == [0.0, 0.0, 1.0, 1.0, 2.0, 2.0]
    assert std["verifier_last_hidden_states"][0].tolist() == [3.0, 3.0]
    assert Eagle3SpeculatorConfig.model_fields[_draft_layers.FIELD].default is None
    # vLLM: aux id k is the input of layer k (taken before layer k, or after layer k - 1)
    src = inspect.getsource(importlib.import_module(
        "vllm.model_executor.models.llama").LlamaModel.forward)
    before = "if idx in self.aux_hidden_state_layers" in src and (
        src.index("if idx in self.aux_hidden_state_layers") < src.index("= layer("))
    after = "aux_hidden_states, idx + 1, hidden_states, residual" in src and (
        src.index("= layer(") < src.index("aux_hidden_states, idx + 1"))
    assert before or after, "vLLM's Llama takes auxiliary hidden states some other way"
    interfaces = importlib.import_module("vllm.model_executor.models.interfaces")
    default = "\n".join(inspect.getsource(getattr(cls, m)) for cls in vars(interfaces).values()
                        if isinstance(cls, type)
                        for m in ("get_eagle3_default_aux_hidden_state_layers",
                                  "get_eagle3_aux_hidden_state_layers")
                        if m in vars(cls))
    llama = importlib.import_module("vllm.model_executor.models.llama").LlamaForCausalLM
    default += inspect.getsource(llama)
    assert "(2, num_layers // 2, num_layers - 3)" in default


@pytest.fixture
def savable(base, monkeypatch):
    """speculators' configs save on transformers 5 only through their own adapter
    (``transformers5_config_validate``), and its data config asks a GPU-less torch for
    a device name only through ``no_gpu_kv_sizing``; the shapes here are about the layers.
    Where vLLM is a CUDA build on a machine without a GPU (the contract-level envs), that
    adapter rightly stands aside (the generator cannot run there), so the device name is
    speculators' own answer for no accelerator."""
    if not torch.cuda.is_available():
        config_generator = importlib.import_module("speculators.data_generation.config_generator")
        if hasattr(config_generator, "get_device_name"):
            monkeypatch.setattr(config_generator, "get_device_name", lambda idx: "NO ACCELERATOR")
    with activated(BY_NAME["transformers5_config_validate"], BY_NAME["no_gpu_kv_sizing"]):
        yield


def write_samples(folder, n: int = 3, hidden: int = 8) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for i in range(n):
        length = 5 + i
        torch.save({"input_ids": torch.arange(length),
                    "hidden_states": [torch.randn(length, hidden) for _ in LAYERS],
                    "loss_mask": torch.ones(length, dtype=torch.long)}, folder / f"data_{i}.pt")


def speculators_data_config(folder) -> None:
    """speculators' own ``data_config.json``, written by its ``DataGenerationConfig``
    from a generator's attributes (the ones ``from_generator`` reads)."""
    from speculators.data_generation.config_generator import DataGenerationConfig

    gen = types.SimpleNamespace(
        model_path=checkpoint("llama"), tensor_parallel_size=1, layer_ids=list(LAYERS),
        vllm_config=types.SimpleNamespace(
            cache_config=types.SimpleNamespace(gpu_memory_utilization=0.8)))
    cfg = DataGenerationConfig.from_generator(gen, train_data_path="x.jsonl", seq_length=64,
                                              cache_dir=str(folder), num_samples=3)
    (folder / _draft_layers.DATA_CONFIG_FILE).write_text(json.dumps(cfg.to_dict()))


def draft_config(layer_ids=None):
    from speculators import SpeculatorsConfig, VerifierConfig
    from speculators.models.eagle3 import Eagle3SpeculatorConfig
    from speculators.proposals.greedy import GreedyTokenProposalConfig
    from transformers import AutoConfig, LlamaConfig

    verifier = AutoConfig.from_pretrained(checkpoint("llama"))
    return Eagle3SpeculatorConfig(
        transformer_layer_config=LlamaConfig(
            vocab_size=verifier.vocab_size, hidden_size=verifier.hidden_size,
            intermediate_size=verifier.intermediate_size, num_hidden_layers=1,
            num_attention_heads=verifier.num_attention_heads,
            num_key_value_heads=verifier.num_key_value_heads),
        draft_vocab_size=64, eagle_aux_hidden_state_layer_ids=layer_ids,
        speculators_config=SpeculatorsConfig(
            algorithm="eagle3", proposal_methods=[GreedyTokenProposalConfig(speculative_tokens=2)],
            default_proposal_method="greedy",
            verifier=VerifierConfig.from_config(verifier, name_or_path=checkpoint("llama"))))


def train_and_save(folder, out, layer_ids=None, **dataset_kwargs) -> dict:
    """speculators' dataset over ``folder``, then the draft's config saved to ``out``."""
    from speculators.train.data import Eagle3SampleFileDataset

    Eagle3SampleFileDataset(max_len=64, datapath=str(folder), **dataset_kwargs)
    draft_config(layer_ids).save_pretrained(out)
    return json.loads((out / "config.json").read_text())


def vllm_reads(saved: dict):
    """What vLLM's speculators-format config loader hands its EAGLE-3 model (0.16+:
    ``extract_transformers_pre_trained_config``; 0.11-0.14: ``extract_vllm_speculative_config``)."""
    from vllm.transformers_utils.configs.speculators.base import SpeculatorsConfig

    extract = getattr(SpeculatorsConfig, "extract_transformers_pre_trained_config", None)
    extract = extract or SpeculatorsConfig.extract_vllm_speculative_config
    return extract(dict(saved)).get(_draft_layers.FIELD)


def vllm_loader_carries_layers() -> bool:
    """Whether the installed vLLM's speculators-format loader passes the draft's layer ids
    on at all: vLLM 0.11's ``update_eagle3`` drops them, so that release feeds every
    EAGLE-3 draft its default layers whatever the draft's config names (0.12+ carry them)."""
    from vllm.transformers_utils.configs.speculators import algos

    return _draft_layers.FIELD in inspect.getsource(algos.update_eagle3)


def test_legacy_call_shape(base, savable, tmp_path):
    adapter = BY_NAME[NAME]
    data = tmp_path / "data"
    write_samples(data)
    speculators_data_config(data)
    want = [k + 1 for k in LAYERS[:-1]]  # [1, 3, 5]

    # Bare: the draft's config names no layers; vLLM then feeds its default ids.
    bare = train_and_save(data, tmp_path / "bare")
    assert bare.get(_draft_layers.FIELD) is None
    assert vllm_reads(bare) is None
    assert _draft_layers.vllm_default(6) == (2, 3, 3) != tuple(want)

    with one(base, adapter) as applied:
        if not applied:
            return
        with warnings.catch_warnings():
            warnings.simplefilter("error", DraftLayersWarning)
            saved = train_and_save(data, tmp_path / "fixed")
        assert saved[_draft_layers.FIELD] == want
        assert vllm_reads(saved) == (want if vllm_loader_carries_layers() else None)

        # The shim's own layers file (what a generator run writes next to its report).
        shim = tmp_path / "shim"
        write_samples(shim)
        _draft_layers.write_layers_file(
            shim, [_draft_layers.generator_record(checkpoint("llama"), LAYERS, 6)])
        assert train_and_save(shim, tmp_path / "from-shim")[_draft_layers.FIELD] == want

    # deactivated: what the datasets said is forgotten, and saving is upstream's again
    assert train_and_save(data, tmp_path / "after")[_draft_layers.FIELD] is None


def test_unknown_or_disagreeing_layers_warn(base, savable, tmp_path):
    adapter = BY_NAME[NAME]
    bare = tmp_path / "bare-data"
    write_samples(bare)
    with one(base, adapter) as applied:
        if not applied:
            return
        with pytest.warns(DraftLayersWarning, match="does not say which target layers"):
            from speculators.train.data import Eagle3SampleFileDataset

            Eagle3SampleFileDataset(max_len=64, datapath=str(bare))
        with pytest.warns(DraftLayersWarning, match="without eagle_aux_hidden_state_layer_ids"):
            draft_config().save_pretrained(tmp_path / "unknown")
        saved = json.loads((tmp_path / "unknown" / "config.json").read_text())
        assert saved[_draft_layers.FIELD] is None
    with one(base, adapter):
        known = tmp_path / "data"
        write_samples(known)
        speculators_data_config(known)
        with pytest.warns(DraftLayersWarning, match="vLLM will feed the draft other layers"):
            saved = train_and_save(known, tmp_path / "explicit", layer_ids=[0, 2, 4])
        assert saved[_draft_layers.FIELD] == [0, 2, 4]  # the user's value is kept
    with one(base, adapter):
        from speculators.train.data import standardize_data_v1

        def own(sample):
            return standardize_data_v1(sample)

        with pytest.warns(DraftLayersWarning, match="its own standardize_fn"):
            saved = train_and_save(known, tmp_path / "custom", standardize_fn=own)
        assert saved[_draft_layers.FIELD] is None
