"""Which target layers an EAGLE-3 draft reads: what its training data holds, what vLLM feeds.

Why: the two sides number layers differently. speculators 0.3/0.4's generator captures
the *output* of decoder layer ``k`` (the residual stream ``hidden_states + residual``
right after ``layer(...)``, before the final norm; ``data_generation/custom_worker.py``),
by default ``[2, n//2, n-3, n-1]``; speculators' EAGLE-3 training feeds all of them but
the last to the draft and predicts the target's tokens from the last
(``train/data.py``, ``standardize_data_v1``). vLLM's EAGLE-3 serving numbers its
auxiliary hidden states by the layer whose *input* they are: id ``k`` is the output of
layer ``k - 1`` (``_maybe_add_hidden_state(aux, idx + 1, ...)`` after layer ``idx`` in
``vllm/model_executor/models/llama.py``; taken before layer ``idx`` in older releases);
it reads them from the draft config's ``eagle_aux_hidden_state_layer_ids`` and otherwise
uses ``(2, n//2, n-3)`` (``get_eagle3_default_aux_hidden_state_layers``). So a draft
trained on speculators' layer ``k`` must be served with vLLM id ``k + 1``.

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
    def aux(self) -> tuple[int, ...]:
        """The draft's inputs (``standardize_data_v1``: every layer but the last)."""
        return self.layer_ids[:-1]

    @property
    def target(self) -> int:
        """The layer the draft's training targets are computed from."""
        return self.layer_ids[-1]

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
    return {"model": None if model is None else str(model), "num_hidden_layers": num_hidden_layers,
            "layer_ids": ids, "captured": CAPTURED, "draft_inputs": ids[:-1],
            "target_layer": ids[-1] if ids else None,
            FIELD: list(vllm_ids(ids[:-1])), "pid": os.getpid(),
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
    distinct = sorted({dl.layer_ids for dl in found})
    if len(distinct) > 1:
        said = "; ".join(f"{dl.source}: {list(dl.layer_ids)}" for dl in found)
        return Lookup(None, f"the metadata disagree on the layers ({said})", dirs)
    best = next((dl for dl in found if dl.num_hidden_layers is not None), found[0])
    return Lookup(best, f"layers {list(best.layer_ids)} from {best.source}", dirs)


# --------------------------------------------------------------------------------------
# A saved draft: what vLLM will read from it
# --------------------------------------------------------------------------------------


def named_layers(config: dict[str, Any]) -> tuple[int, ...] | None:
    """The auxiliary ids a draft config names where vLLM looks for them (speculators
    format: top level; EAGLE-3 checkpoints of other trainers: also ``eagle_config``)."""
    ids = config.get(FIELD)
    if not ids and isinstance(config.get("eagle_config"), dict):
        ids = config["eagle_config"].get(FIELD)
    if not ids:
        return None
    return tuple(int(k) for k in ids)


def verifier_of(config: dict[str, Any]) -> str | None:
    """The target model a speculators-format draft config names (its verifier)."""
    spec = config.get("speculators_config")
    verifier = spec.get("verifier") if isinstance(spec, dict) else None
    name = verifier.get("name_or_path") if isinstance(verifier, dict) else None
    return name if isinstance(name, str) and name else None


def num_hidden_layers(model: str | os.PathLike[str]) -> int | None:
    """The decoder layer count in a local model directory's ``config.json`` (text config
    of multimodal models too); ``None`` when there is no such local file."""
    path = os.path.join(os.fspath(model), "config.json")
    doc = _load(path) if os.path.isfile(path) else None
    if not isinstance(doc, dict):
        return None
    for cfg in (doc, doc.get("text_config")):
        if isinstance(cfg, dict) and isinstance(cfg.get("num_hidden_layers"), int):
            return cfg["num_hidden_layers"]
    return None
