"""Which target layers an EAGLE-3 draft reads: what its training data holds, what vLLM feeds.

Why: the two sides number layers differently. speculators 0.3/0.4's generator captures
the *output* of decoder layer ``k`` (the residual stream ``hidden_states + residual``
right after ``layer(...)``, before the final norm; ``data_generation/custom_worker.py``),
by default ``[2, n//2, n-3, n-1]``; speculators' EAGLE-3 training feeds all of them but
the last to the draft and predicts the target's tokens from the last
(``train/data.py``, ``standardize_data_v1``). vLLM's EAGLE-3 serving numbers its
auxiliary hidden states by the layer whose *input* they are: id ``k`` is the output of
layer ``k - 1`` (``_maybe_add_hidden_state(aux, idx + 1, ...)`` after layer ``idx`` in
``vllm/model_executor/models/llama.py``; taken before layer ``idx`` in older releases and
in vLLM 0.34's DeepSeek-V2/V3/V3.2 and GLM-5 models, the same stream for ``0 < k < n``);
it reads them from the draft config (:func:`named_layers`) and otherwise uses
``(2, n//2, n-3)`` with ``n`` the language model's decoder layer count
(``get_eagle3_default_aux_hidden_state_layers``, :func:`layer_count`). So a draft trained
on speculators' layer ``k`` must be served with vLLM id ``k + 1``.

Order: both sides use each layer once, in layer order. speculators' worker (and the
shim's capture) walk the layers and keep those whose id is in the set asked for, so the
samples hold ``sorted(set(layer_ids))`` whatever order the ids were given in
(:func:`captured`); vLLM keeps ``tuple(sorted(set(ids)))`` (``EagleModelMixin.
_set_aux_hidden_state_layers``; DeepSeek's and Qwen3.5's own ``set_aux_hidden_state_layers``
keep the tuple but collect by membership while walking the layers, the same result;
vLLM 0.24 / 0.28 store the tuple as given, repeats and all, and collect the same way in
``_maybe_add_hidden_state``, so every release feeds the draft the same states).

This module holds that mapping, the files the layers of a data directory are read from
(speculators' own ``data_config.json``, and :data:`LAYERS_FILE`, which the shim writes
next to its report), and what a saved draft config says. No torch, no vLLM: the
``check-draft`` command and the ``draft_aux_layers`` adapter both read it.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from ._files import write_text_atomic

#: Written by the shim next to its report file when speculators' generator starts: the
#: layers the generated data holds (one record per generator the process built).
LAYERS_FILE = "speculators-compat-layers.json"
#: Written by speculators 0.3/0.4's own offline script next to the data files
#: (``DataGenerationConfig``: ``hidden_states.layer_ids`` in speculators' numbering).
DATA_CONFIG_FILE = "data_config.json"
#: The draft config field vLLM reads (speculators-format configs: top level).
FIELD = "eagle_aux_hidden_state_layer_ids"
#: What speculators 0.3/0.4's generator captures for layer id ``k``.
CAPTURED = ("output of decoder layer k (hidden_states + residual after the layer, before "
            "the final norm); vLLM's EAGLE-3 id for it is k + 1")
#: Metadata files larger than this are not layer metadata (never parsed).
MAX_METADATA_BYTES = 1 << 20


def captured(layer_ids: Iterable[int]) -> tuple[int, ...]:
    """The layers speculators' generator stores for ``layer_ids``, in the samples' order:
    each once, ascending (its worker tests membership while walking the layers)."""
    return tuple(sorted({int(k) for k in layer_ids}))


def fed(aux_ids: Iterable[int]) -> tuple[int, ...]:
    """The auxiliary ids vLLM captures for ``aux_ids``, in the order the draft receives
    them: each once, ascending (the model walks its layers and keeps a layer whose id is
    among them, ``EagleModelMixin._maybe_add_hidden_state``; vLLM 0.32+ also stores
    ``sorted(set(...))``)."""
    return tuple(sorted({int(k) for k in aux_ids}))


def vllm_ids(layer_ids: Iterable[int]) -> tuple[int, ...]:
    """vLLM's auxiliary hidden-state ids of speculators' captured layers ``layer_ids``."""
    return tuple(int(k) + 1 for k in layer_ids)


def speculators_ids(aux_ids: Iterable[int]) -> tuple[int, ...]:
    """The layers whose outputs vLLM's auxiliary ids ``aux_ids`` are, in speculators'
    numbering (``-1``: the embeddings)."""
    return tuple(int(k) - 1 for k in aux_ids)


def vllm_default(num_hidden_layers: int) -> tuple[int, ...]:
    """vLLM's auxiliary ids for a draft config that names none (every model of vLLM
    0.16-0.34 that supports EAGLE-3 returns this)."""
    n = int(num_hidden_layers)
    return (2, n // 2, n - 3)


def speculators_default(num_hidden_layers: int) -> tuple[int, ...]:
    """speculators 0.3/0.4's generator's layers when none are given."""
    n = int(num_hidden_layers)
    return (2, n // 2, n - 3, n - 1)


@dataclass(frozen=True)
class DataLayers:
    """The layers a data directory's samples hold, in speculators' numbering."""

    layer_ids: tuple[int, ...]
    #: The file this was read from.
    source: str
    num_hidden_layers: int | None = None
    model: str | None = None

    @property
    def captured(self) -> tuple[int, ...]:
        """The layers in the samples, in their order (:func:`captured`)."""
        return captured(self.layer_ids)

    @property
    def aux(self) -> tuple[int, ...]:
        """The draft's inputs (``standardize_data_v1``: every captured layer but the last,
        in layer order whatever order ``layer_ids`` was given in)."""
        return self.captured[:-1]

    @property
    def target(self) -> int:
        """The layer the draft's training targets are computed from (the highest)."""
        return self.captured[-1]

    @property
    def vllm_aux_ids(self) -> tuple[int, ...]:
        """What the draft config must name for vLLM to feed what the draft learned from."""
        return vllm_ids(self.aux)


@dataclass(frozen=True)
class Lookup:
    """The layers of some data directories, or why they cannot be told."""

    layers: DataLayers | None
    reason: str
    dirs: tuple[str, ...] = ()


def generator_record(model: str | None, layer_ids: Sequence[int],
                     num_hidden_layers: int | None) -> dict[str, Any]:
    """What is recorded about one generator (the report's ``data`` section, :data:`LAYERS_FILE`)."""
    ids = [int(k) for k in layer_ids]
    held = list(captured(ids))
    return {"model": None if model is None else str(model), "num_hidden_layers": num_hidden_layers,
            "layer_ids": ids, "captured": CAPTURED, "draft_inputs": held[:-1],
            "target_layer": held[-1] if held else None,
            FIELD: list(vllm_ids(held[:-1])), "pid": os.getpid(),
            "time": time.strftime("%Y-%m-%dT%H:%M:%S%z")}


def write_layers_file(directory: str | os.PathLike[str], records: list[dict[str, Any]],
                      version: str | None = None) -> str:
    """Write :data:`LAYERS_FILE` into ``directory`` (atomically); returns its path."""
    path = os.path.join(os.fspath(directory), LAYERS_FILE)
    text = json.dumps({"speculators_compat": version, "format": 1, "generators": records},
                      indent=2)
    write_text_atomic(path, text + "\n")
    return path


def _load(path: str) -> Any:
    try:
        if os.path.getsize(path) > MAX_METADATA_BYTES:
            return None
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def _ids(value: Any) -> tuple[int, ...] | None:
    if (isinstance(value, list) and len(value) >= 2
            and all(isinstance(k, int) and not isinstance(k, bool) for k in value)):
        return tuple(value)
    return None


def read_dir(directory: str | os.PathLike[str]) -> list[DataLayers]:
    """Every statement about the layers of the samples in ``directory`` (from
    :data:`LAYERS_FILE` and :data:`DATA_CONFIG_FILE`; unreadable files say nothing)."""
    directory = os.fspath(directory)
    found: list[DataLayers] = []
    path = os.path.join(directory, LAYERS_FILE)
    doc = _load(path) if os.path.isfile(path) else None
    if isinstance(doc, dict) and isinstance(doc.get("generators"), list):
        for rec in doc["generators"]:
            ids = _ids(rec.get("layer_ids")) if isinstance(rec, dict) else None
            if ids is not None:
                n = rec.get("num_hidden_layers")
                found.append(DataLayers(ids, path, n if isinstance(n, int) else None,
                                        rec.get("model")))
    path = os.path.join(directory, DATA_CONFIG_FILE)
    doc = _load(path) if os.path.isfile(path) else None
    if isinstance(doc, dict):
        hs = doc.get("hidden_states")
        ids = _ids(hs.get("layer_ids")) if isinstance(hs, dict) else None
        model = doc.get("model")
        target = model.get("target_model_path") if isinstance(model, dict) else None
        if ids is not None:
            found.append(DataLayers(ids, path, None, target))
    return found


def for_dirs(dirs: Iterable[str | os.PathLike[str]]) -> Lookup:
    """The one set of layers the metadata in ``dirs`` names, or why there is none."""
    dirs = tuple(sorted({os.path.abspath(os.fspath(d)) for d in dirs}))
    found = [dl for d in dirs for dl in read_dir(d)]
    where = ", ".join(dirs) or "(no directory)"
    if not found:
        return Lookup(None, f"no {LAYERS_FILE} or {DATA_CONFIG_FILE} with layer ids in "
                            f"{where}", dirs)
    distinct = sorted({dl.captured for dl in found})  # the same samples, however ordered
    if len(distinct) > 1:
        said = "; ".join(f"{dl.source}: {list(dl.layer_ids)}" for dl in found)
        return Lookup(None, f"the metadata disagree on the layers ({said})", dirs)
    best = next((dl for dl in found if dl.num_hidden_layers is not None), found[0])
    return Lookup(best, f"layers {list(best.layer_ids)} from {best.source}", dirs)


# --------------------------------------------------------------------------------------
# A saved draft: what vLLM will read from it
# --------------------------------------------------------------------------------------

#: The draft config's sections whose ``layer_ids`` vLLM 0.34 reads last, in this order.
_DRAFTER_SECTIONS = ("dflash_config", "eagle_config")


def draft_hf_config(config: dict[str, Any]) -> dict[str, Any]:
    """The draft config as vLLM's model runner sees it. A speculators-format config
    (``speculators_model_type``) becomes its ``transformer_layer_config`` plus the top-level
    :data:`FIELD` when that is set (``SpeculatorsConfig.extract_transformers_pre_trained_config``
    and ``update_eagle3``, ``vllm/transformers_utils/configs/speculators/``): its other
    top-level keys (an ``eagle_config`` too) never reach the runner. Other EAGLE-3
    checkpoints are read as they are."""
    if "speculators_model_type" not in config:
        return config
    layer = config.get("transformer_layer_config")
    hf = dict(layer) if isinstance(layer, dict) else {}
    if config.get(FIELD):
        hf[FIELD] = config[FIELD]
    return hf


def _shifted(ids: Any) -> list[int]:
    return [int(k) + 1 for k in ids] if isinstance(ids, (list, tuple)) else []


#: The places after :data:`FIELD` where a vLLM reads a draft's auxiliary ids, each named by
#: a text its reader's source holds (:func:`reads_of_source`). vLLM 0.24 reads
#: ``dflash_config.target_layer_ids`` only; 0.28 adds ``dspark_target_layer_ids`` (+ 1),
#: ``target_layer_ids`` and the drafter sections' ``layer_ids``; 0.33 reads DSpark ids of a
#: ``deepseek_v41`` draft as they are.
READ_MARKERS: dict[str, str] = {
    "dflash_target_layer_ids": 'dflash_config.get("target_layer_ids")',
    "dspark_target_layer_ids": '"dspark_target_layer_ids"',
    "dspark_deepseek_v41": '"deepseek_v41"',
    "target_layer_ids": 'getattr(hf_config, "target_layer_ids"',
    "drafter_layer_ids": '("dflash_config", "eagle_config")',
}
#: What vLLM 0.34 reads (the default of :func:`named_in`).
READS_0_34 = frozenset(READ_MARKERS)


def reads_of_source(source: str) -> frozenset[str]:
    """The places of :data:`READ_MARKERS` a vLLM reader's source (``get_eagle3_aux_layers_
    from_config``) reads, told by the texts it holds."""
    return frozenset(name for name, text in READ_MARKERS.items() if text in source)


def named_in(config: dict[str, Any], reads: frozenset[str] = READS_0_34
             ) -> tuple[tuple[int, ...], str] | None:
    """The auxiliary ids a draft config names and the key they were read from, as vLLM
    0.34's ``get_eagle3_aux_layers_from_config`` (``v1/worker/gpu/spec_decode/eagle/
    eagle3_utils.py``) reads them from :func:`draft_hf_config`: the first non-empty of
    :data:`FIELD`; ``dflash_config.target_layer_ids`` + 1; ``dspark_target_layer_ids`` (+ 1,
    as they are for ``model_type`` deepseek_v41); ``target_layer_ids`` + 1;
    ``dflash_config.layer_ids``; ``eagle_config.layer_ids``. ``reads`` (names of
    :data:`READ_MARKERS`) leaves out the places an older vLLM does not read. ``eagle_config.``
    :data:`FIELD` is not among them (vLLM 0.32's V1 model runner read it:
    :func:`legacy_named_layers`)."""
    hf = draft_hf_config(config)
    steps: list[tuple[str, Any]] = [(FIELD, lambda: hf.get(FIELD))]
    dflash = hf.get("dflash_config")
    if isinstance(dflash, dict) and "dflash_target_layer_ids" in reads:
        steps.append(("dflash_config.target_layer_ids (+ 1)",
                      lambda: _shifted(dflash.get("target_layer_ids") or [])))
    dspark = hf.get("dspark_target_layer_ids")
    if "dspark_target_layer_ids" not in reads:
        pass
    elif hf.get("model_type") == "deepseek_v41" and "dspark_deepseek_v41" in reads:
        steps.append(("dspark_target_layer_ids", lambda: dspark))
    else:
        steps.append(("dspark_target_layer_ids (+ 1)", lambda: _shifted(dspark or [])))
    if "target_layer_ids" in reads:
        steps.append(("target_layer_ids (+ 1)",
                      lambda: _shifted(hf.get("target_layer_ids") or [])))
    for name in _DRAFTER_SECTIONS if "drafter_layer_ids" in reads else ():
        section = hf.get(name)
        if isinstance(section, dict) and section:
            steps.append((f"{name}.layer_ids", lambda section=section: section.get("layer_ids")))
    for where, read in steps:
        ids = read()
        if ids:  # the first truthy value ends the search, as in vLLM
            if isinstance(ids, (list, tuple)) and all(
                    isinstance(k, int) and not isinstance(k, bool) for k in ids):
                return tuple(int(k) for k in ids), where
            return None
    return None


def named_layers(config: dict[str, Any], reads: frozenset[str] = READS_0_34
                 ) -> tuple[int, ...] | None:
    """The auxiliary ids a draft config names where vLLM looks for them
    (:func:`named_in`), in the config's order; vLLM feeds :func:`fed` of them."""
    found = named_in(config, reads)
    return found[0] if found else None


def legacy_named_layers(config: dict[str, Any]) -> tuple[int, ...] | None:
    """``eagle_config.eagle_aux_hidden_state_layer_ids`` of a draft whose config names no
    ids where vLLM 0.34 reads them. vLLM 0.32's V1 model runner
    (``GPUModelRunner._get_eagle3_aux_layers_from_config``) used these; 0.34 feeds its
    default instead, while its Llama/DeepSeek EAGLE-3 drafts still size their input
    projection from the list's length."""
    if named_in(config) is not None:
        return None
    section = draft_hf_config(config).get("eagle_config")
    ids = section.get(FIELD) if isinstance(section, dict) else None
    if isinstance(ids, list) and ids and all(
            isinstance(k, int) and not isinstance(k, bool) for k in ids):
        return tuple(ids)
    return None


def verifier_of(config: dict[str, Any]) -> str | None:
    """The target model a speculators-format draft config names (its verifier)."""
    spec = config.get("speculators_config")
    verifier = spec.get("verifier") if isinstance(spec, dict) else None
    name = verifier.get("name_or_path") if isinstance(verifier, dict) else None
    return name if isinstance(name, str) and name else None


# --------------------------------------------------------------------------------------
# The target: how many layers vLLM's default counts, which ids its model captures
# --------------------------------------------------------------------------------------

#: Where transformers (``PretrainedConfig.get_text_config``), and so vLLM
#: (``get_hf_text_config``), finds the language model's config inside a composite one
#: (``...ForConditionalGeneration``: Qwen3.5, Gemma 4, Kimi-K3).
TEXT_CONFIG_KEYS = ("text_encoder", "decoder", "generator", "text_config")


def text_config(config: dict[str, Any]) -> dict[str, Any]:
    """The language model's section of a model's ``config.json`` (itself for text models)."""
    found = [config[k] for k in TEXT_CONFIG_KEYS if isinstance(config.get(k), dict)]
    return found[0] if len(found) == 1 else config


def layer_count(config: dict[str, Any]) -> int | None:
    """The decoder layer count ``n`` of vLLM's default ``(2, n//2, n-3)``: ``len(layers)``
    of the language model, which is built from its text config's ``num_hidden_layers``
    (wrappers: the text config's, never a top-level value), except Nemotron-H, which builds
    one layer per character of ``hybrid_override_pattern`` (``nemotron_h.py``). transformers
    5's ``NemotronHConfig`` (which vLLM 0.34 loads) takes ``layers_block_type`` first, else
    the pattern, derives ``num_hidden_layers`` from it and ignores a stale value; the pattern
    vLLM reads is then rebuilt from that list. ``None`` when the config does not say."""
    text = text_config(config)
    blocks = text.get("layers_block_type")
    if text.get("model_type") == "nemotron_h" and isinstance(blocks, list) and blocks:
        return len(blocks)
    pattern = text.get("hybrid_override_pattern")
    if isinstance(pattern, str) and pattern:
        return len(pattern)
    n = text.get("num_hidden_layers")
    return n if isinstance(n, int) and not isinstance(n, bool) and n > 0 else None


def read_model_config(model: str | os.PathLike[str]) -> dict[str, Any] | None:
    """A local model directory's ``config.json``; ``None`` when there is no such file."""
    path = os.path.join(os.fspath(model), "config.json")
    doc = _load(path) if os.path.isfile(path) else None
    return doc if isinstance(doc, dict) else None


def num_hidden_layers(model: str | os.PathLike[str]) -> int | None:
    """:func:`layer_count` of a local model directory's ``config.json``; ``None`` when
    there is no such local file or it does not say."""
    doc = read_model_config(model)
    return layer_count(doc) if doc is not None else None


def architecture_of(config: dict[str, Any]) -> str | None:
    """The first of a model config's ``architectures`` (the class vLLM builds)."""
    archs = config.get("architectures")
    return archs[0] if isinstance(archs, list) and archs and isinstance(archs[0], str) else None


#: Target classes of vLLM 0.34 that capture fewer ids than ``0..n`` (every other model that
#: supports EAGLE-3 captures the embeddings as id 0 and the output of layer ``k - 1`` as id
#: ``k``, up to ``n``): (lowest id, highest id as an offset from ``n``, why). Ids ``1..n-1``,
#: all that speculators' data can name (its last captured layer is the target's), are
#: captured by all of them.
_NARROWER: dict[str, tuple[int, int, str]] = {
    **dict.fromkeys(
        ("DeepseekV2ForCausalLM", "DeepseekV3ForCausalLM", "KimiK25ForConditionalGeneration"),
        (1, 0, "vLLM's DeepSeek-V2/V3 model adds the residual before layer k and has none "
               "before layer 0 (id 0 fails)")),
    **dict.fromkeys(
        ("DeepseekV32ForCausalLM", "GlmMoeDsaForCausalLM"),
        (1, -1, "vLLM 0.34's sparse-MLA model (vllm/models/deepseek_v32) captures before each "
                "layer, so on CUDA id n is never captured, and elsewhere the DeepSeek-V2 model "
                "serving it fails on id 0")),
    **dict.fromkeys(
        ("DeepseekV4ForCausalLM", "DeepseekV4ForConditionalGeneration"),
        (1, 0, "vLLM's DeepSeek-V4 captures after each layer only (the mean of its "
               "hyper-connection streams), never the embeddings (id 0)")),
}


def uncaptured(aux_ids: Iterable[int], n: int,
               architecture: str | None = None) -> tuple[list[int], str | None]:
    """The ids of ``aux_ids`` that vLLM's model of ``architecture`` with ``n`` layers
    captures nothing for (the draft then gets fewer states than it was built for), and why."""
    lo, hi, why = _NARROWER.get(architecture or "", (0, 0, None))
    bad = [k for k in fed(aux_ids) if not lo <= k <= n + hi]
    if not bad:
        return [], None
    if why is None or all(k < 0 or k > n for k in bad):
        why = f"a {n}-layer target has aux ids 0..{n} only (id k = output of layer k - 1)"
    return bad, why
