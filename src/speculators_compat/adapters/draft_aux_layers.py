"""A draft trained on the generator's data is served by vLLM one layer below what it
learned from: no error anywhere, lower acceptance.

Why (a hazard between speculators 0.3/0.4 and vLLM's EAGLE-3 serving, silent):
speculators' generator captures the output of decoder layer ``k``
(``data_generation/custom_worker.py``: ``hidden_states + residual`` after ``layer(...)``),
by default layers ``[2, n//2, n-3, n-1]``; its EAGLE-3 training feeds every layer but the
last to the draft (``train/data.py``, ``standardize_data_v1``). vLLM numbers auxiliary
hidden states by the layer whose input they are (id ``k`` = output of layer ``k - 1``:
``_maybe_add_hidden_state(aux, idx + 1, ...)`` after layer ``idx`` in
``vllm/model_executor/models/llama.py``, 0.32 and 0.34; before layer ``idx`` in 0.16), takes
them from the draft config's ``eagle_aux_hidden_state_layer_ids`` and otherwise uses
``(2, n//2, n-3)`` (``get_eagle3_default_aux_hidden_state_layers``), ``n`` the language
model's layer count; both sides use each layer once, in layer order.
speculators 0.3/0.4's ``Eagle3SpeculatorConfig`` leaves that field ``None`` (``scripts/train.py``
and 0.4's ``Eagle3DraftModel.from_training_args`` never set it), so a draft trained on
the default layers is fed the outputs of layers ``1, n//2-1, n-4``.
How: each generator's layers are recorded when it is built (the report's ``data``
section, and ``speculators-compat-layers.json`` next to the report file; speculators'
own offline script also writes them, as ``data_config.json``). When speculators'
``Eagle3SampleFileDataset`` is built, the layers of its files are read from those files
in the files' folders (where speculators 0.4 reads ``sample_lengths.json`` too); a folder
that names none gets a ``DraftLayersWarning``. When an ``Eagle3SpeculatorConfig`` is saved
with the field unset and every dataset this process built names the same layers, the
field is set to vLLM's ids of the draft's inputs (speculators' id + 1) first. A value the
user set is kept; one that disagrees with the data gets a warning. This changes what
upstream saves (one field of the draft's config.json); the report says so.
Applies when: speculators' worker captures after the layer call, its EAGLE-3 config has
the field with default ``None``, and its data standardisation takes every layer but the
last as the draft's input (speculators 0.3/0.4).
Remove when: speculators < 0.5 support is dropped (0.5 takes data in vLLM's numbering and
writes the field from its training arguments).
"""

from __future__ import annotations

import importlib
import logging
import os
import warnings
from typing import Any

from .. import _draft_layers, _layer_record
from .._adapter import Adapter, Context, Phase, Verdict
from .._draft_layers import FIELD, Lookup
from .._errors import DraftLayersWarning
from .._patcher import Patcher, _label, target_of
from .._report import Kind
from .._speculators import EAGLE3_CONFIG_MODULE, TRAIN_DATA_MODULE, WORKER_MODULE
from . import _probes, _targets

logger = logging.getLogger("speculators_compat")

CONFIG = "Eagle3SpeculatorConfig"
DATASET = "Eagle3SampleFileDataset"
STANDARDIZE = "standardize_data_v1"
#: speculators' standardisation: every captured layer but the last is the draft's input,
#: the last one the target's (both releases, ``train/data.py``).
AUX_ALL_BUT_LAST = ('data["hidden_states"][:-1]', 'data["hidden_states"][-1]')

#: What the datasets built in this process said about their layers (cleared on revert).
SEEN: list[Lookup] = []


def captures_layer_output(worker_source: str) -> bool | None:
    """Whether speculators' worker appends ``hidden_states + residual`` after calling the
    layer (its output); ``None`` when the source shows neither order."""
    call, append = worker_source.find("layer("), worker_source.find("aux_hidden_states.append(")
    if call < 0 or append < 0:
        return None
    return call < append


def _warn(message: str) -> None:
    logger.warning(message)
    warnings.warn(message, DraftLayersWarning, stacklevel=3)


def _num_layers(generator: Any) -> int | None:
    """The target's layer count as vLLM's EAGLE-3 default counts it (the text config of a
    wrapper, Nemotron-H's pattern: :func:`speculators_compat._draft_layers.layer_count`)."""
    model_config = getattr(getattr(generator, "vllm_config", None), "model_config", None)
    hf = getattr(model_config, "hf_config", None)
    to_dict = getattr(hf, "to_dict", None)
    if callable(to_dict):
        try:
            n = _draft_layers.layer_count(to_dict())
        except Exception:  # a config that cannot be serialised: read its attributes below
            n = None
        if n is not None:
            return n
    for cfg in (getattr(hf, "text_config", None), hf):
        n = getattr(cfg, "num_hidden_layers", None)
        if isinstance(n, int):
            return n
    return None


def dataset_layers(dataset: Any, standardize: Any) -> Lookup:
    """The layers of ``dataset``'s files (speculators' ``Eagle3SampleFileDataset``)."""
    files = list(getattr(dataset, "data", None) or [])
    dirs = sorted({os.path.dirname(os.path.abspath(os.fspath(f))) for f in files})
    if getattr(dataset, "standardize_fn", standardize) is not standardize:
        return Lookup(None, "the dataset has its own standardize_fn: which captured layers "
                            "become the draft's input is not known", tuple(dirs))
    if not dirs:
        return Lookup(None, "the dataset has no files")
    return _draft_layers.for_dirs(dirs)


def settle(config: Any, seen: list[Lookup]) -> None:
    """Before ``config`` is saved: name the layers the data of this process holds."""
    if not seen:
        return  # no training data read here (a conversion, a config saved on its own)
    current = getattr(config, FIELD, None)
    known = {lk.layers.layer_ids for lk in seen if lk.layers is not None}
    unknown = [lk for lk in seen if lk.layers is None]
    if len(known) == 1 and not unknown:
        data = next(lk.layers for lk in seen if lk.layers is not None)
        want = list(data.vllm_aux_ids)
        if not current:
            setattr(config, FIELD, want)
            logger.info("speculators-compat: the draft's config names %s=%s (speculators' "
                        "layers %s + 1, from %s)", FIELD, want, list(data.aux), data.source)
        elif _draft_layers.fed(current) != tuple(want):  # vLLM sorts and de-duplicates
            _warn(f"speculators-compat: the draft's config names {FIELD}={list(current)}, "
                  f"but its training data ({data.source}) holds the outputs of layers "
                  f"{list(data.aux)}, which vLLM numbers {want} (speculators' layer k is "
                  f"vLLM's k + 1). vLLM will feed the draft other layers than it learned "
                  f"from; set {FIELD}={want} unless you know better.")
        return
    if current:
        return
    reasons = "; ".join(lk.reason for lk in unknown) or "datasets of this process disagree: " \
        + "; ".join(f"{list(ids)}" for ids in sorted(known))
    _warn(f"speculators-compat: saving an EAGLE-3 draft without {FIELD}: which target "
          f"layers it was trained on cannot be told ({reasons}). vLLM will feed it its "
          f"default (2, n//2, n-3), the outputs of layers 1, n//2-1, n-4, one below "
          f"speculators' default capture. Set {FIELD} to the captured layers + 1 (or keep "
          f"speculators' data_config.json or the shim's {_draft_layers.LAYERS_FILE} next to "
          f"the data), and check with `speculators-compat check-draft DRAFT --data DIR`.")


class DraftAuxLayers(Adapter):
    name = "draft_aux_layers"
    kind = Kind.SAFEGUARD
    summary = ("a draft trained on the generator's data names the layers vLLM must feed it "
               "(eagle_aux_hidden_state_layer_ids = captured layer + 1)")
    upstream = ("speculators 0.3/0.4: the generator captures layer outputs, "
                "Eagle3SpeculatorConfig.eagle_aux_hidden_state_layer_ids stays None; vLLM then "
                "feeds the inputs of layers (2, n//2, n-3) "
                "(vllm/model_executor/models/interfaces.py, "
                "get_eagle3_default_aux_hidden_state_layers)")
    vllm_range = None
    phase = Phase.DRIVER
    remove_when = "speculators < 0.5 support is dropped"
    targets = (*_targets.in_generator("VllmHiddenStatesGenerator.__init__"),
               f"{TRAIN_DATA_MODULE}:{DATASET}.__init__",
               f"{EAGLE3_CONFIG_MODULE}:{CONFIG}.save_pretrained")
    #: Outside spawn_main_guard's __init__ wrapper: only a generator that was built (not
    #: refused before building) is recorded.
    after = ("spawn_main_guard",)

    def probe(self, ctx: Context) -> Verdict:
        if ctx.versions.get("speculators") is None:
            return Verdict.not_needed("speculators is not installed")
        worker = _probes.module_source(WORKER_MODULE)
        if worker is None:
            return Verdict.not_needed(f"speculators {ctx.versions.get('speculators')} has no "
                                      f"in-process generator ({WORKER_MODULE}): its data is "
                                      "taken in vLLM's numbering")
        after = captures_layer_output(worker)
        if after is None:
            return Verdict.mismatch(f"{WORKER_MODULE}: cannot tell where it captures")
        if not after:
            return Verdict.not_needed("speculators' worker captures a layer's input, which is "
                                      "what vLLM's ids name")
        config = _probes.speculators_class(ctx, EAGLE3_CONFIG_MODULE, CONFIG)
        field = (getattr(config, "model_fields", None) or {}).get(FIELD)
        if field is None:
            return Verdict.mismatch(f"speculators' {CONFIG} has no {FIELD} field")
        if field.default is not None:
            return Verdict.not_needed(f"{CONFIG}.{FIELD} defaults to {field.default!r}")
        dataset = _probes.speculators_class(ctx, TRAIN_DATA_MODULE, DATASET)
        standardize = _probes.speculators_class(ctx, TRAIN_DATA_MODULE, STANDARDIZE)
        src = _probes.source(standardize) if standardize is not None else ""
        if dataset is None or not all(s in src for s in AUX_ALL_BUT_LAST):
            return Verdict.mismatch(f"{TRAIN_DATA_MODULE}: no {DATASET} with {STANDARDIZE} "
                                    "taking every captured layer but the last as the input")
        return Verdict.needed(
            f"speculators' worker captures layer outputs and {CONFIG}.{FIELD} defaults to "
            "None (vLLM then feeds the outputs of the layers below); a draft trained on "
            "recorded data is saved naming vLLM's ids (captured layer + 1): this adds the field "
            "to the saved config.json")

    def apply(self, patcher: Patcher, ctx: Context) -> None:
        data = importlib.import_module(TRAIN_DATA_MODULE)
        config_cls = _probes.speculators_class(ctx, EAGLE3_CONFIG_MODULE, CONFIG)
        standardize = getattr(data, STANDARDIZE)
        if ctx.versions.get("vllm") is not None:
            gen = _probes.generator_module(ctx)
            if gen is not None:
                patcher.wrap(gen.VllmHiddenStatesGenerator, "__init__", _record_generator)

        def dataset_init(wrapped, instance, args, kwargs):
            out = wrapped(*args, **kwargs)
            found = dataset_layers(instance, standardize)
            SEEN.append(found)
            if found.layers is None:
                _warn(f"speculators-compat: the EAGLE-3 training data in "
                      f"{', '.join(found.dirs) or '?'} does not say which target layers it "
                      f"holds ({found.reason}). A draft trained on it cannot name them in its "
                      f"config, and vLLM will then feed it its default layers (2, n//2, n-3), "
                      f"one below speculators' default capture. Keep speculators' "
                      f"{_draft_layers.DATA_CONFIG_FILE} or the shim's "
                      f"{_draft_layers.LAYERS_FILE} next to the data files, or set {FIELD} "
                      f"(captured layers + 1) in the draft's config.")
            return out

        def save(wrapped, instance, args, kwargs):
            settle(instance, SEEN)
            return wrapped(*args, **kwargs)

        patcher.wrap(data.Eagle3SampleFileDataset, "__init__", dataset_init)
        patcher.wrap(config_cls, "save_pretrained", save)
        # what the datasets said is forgotten with the wrapper that recorded it
        patcher.on_revert(f"{_label(data.Eagle3SampleFileDataset)}.__init__", SEEN.clear,
                          target_of(data.Eagle3SampleFileDataset, "__init__"))


def _record_generator(wrapped, instance, args, kwargs):
    out = wrapped(*args, **kwargs)
    layer_ids = list(getattr(instance, "layer_ids", None) or [])
    if layer_ids:
        _layer_record.record_generator(_draft_layers.generator_record(
            getattr(instance, "model_path", None), layer_ids, _num_layers(instance)))
    return out
