"""``speculators-compat check-draft``: which target layers vLLM will feed a saved EAGLE-3
draft, and whether they are the ones its training data holds.

Why: vLLM never says. A draft config without ``eagle_aux_hidden_state_layer_ids`` is
served with vLLM's default ids ``(2, n//2, n-3)``, the outputs of layers ``1, n//2-1,
n-4``; a draft trained on speculators 0.3/0.4's default capture (layers ``2, n//2, n-3``)
then runs one layer off with no error (:mod:`speculators_compat._draft_layers`). This
reads the draft's ``config.json`` the way the installed vLLM does (the keys of its
``get_eagle3_aux_layers_from_config``, in its order, vLLM 0.34's where it is not found;
each id once, in layer order), the
target's layer count as vLLM counts it (a wrapper's ``text_config``, Nemotron-H's layer
pattern) from the verifier the draft names (or ``--target``), and the data folder's layer
metadata (``--data``), and says what vLLM will feed, including ids the target's vLLM
model never captures. No torch, transformers or vLLM import: where
vLLM is installed, its speculators-format loader and its id reader are read as text to
learn whether it passes the draft's layer ids on at all (vLLM 0.11's does not: it feeds
every EAGLE-3 draft its default layers) and which keys it reads.

Exit status: 0 when vLLM feeds the layers the data holds (or the config names layers
and there is no data to compare with), 1 when it does not or cannot be confirmed (the
config names none), 2 when the folder holds no readable draft config.
"""

from __future__ import annotations

import importlib.util
import json
import os
from typing import Any

from . import _draft_layers as dl

OK, MISMATCH, ERROR = 0, 1, 2


#: vLLM's loader of speculators-format draft configs, below the package's folder.
_LOADER = os.path.join("transformers_utils", "configs", "speculators", "algos.py")
#: vLLM's reader of a draft's auxiliary ids (``get_eagle3_aux_layers_from_config``).
_READER = os.path.join("v1", "worker", "gpu", "spec_decode", "eagle", "eagle3_utils.py")


def _vllm_source(relative: str, vllm_dir: str | None = None) -> str | None:
    """The text of a file of the installed vLLM package, read without importing vLLM
    (``find_spec`` of a top-level package only locates it); ``None`` where vLLM or the
    file is not found."""
    if vllm_dir is None:
        try:
            spec = importlib.util.find_spec("vllm")
        except (ImportError, ValueError):
            return None
        locations = list(spec.submodule_search_locations or []) if spec else []
        if not locations:
            return None
        vllm_dir = locations[0]
    try:
        with open(os.path.join(vllm_dir, relative), encoding="utf-8") as f:
            return f.read()
    except OSError:
        return None


def vllm_reads_named_layers(vllm_dir: str | None = None) -> bool | None:
    """Whether the installed vLLM's speculators-format loader passes a draft's
    ``eagle_aux_hidden_state_layer_ids`` on (0.12+), ``False`` where it drops them (0.11),
    ``None`` where vLLM or its loader is not found."""
    source = _vllm_source(_LOADER, vllm_dir)
    return None if source is None else dl.FIELD in source


def vllm_id_reads(vllm_dir: str | None = None) -> frozenset[str]:
    """Where the installed vLLM's reader looks for a draft's auxiliary ids after
    :data:`~speculators_compat._draft_layers.FIELD` (:func:`~speculators_compat._draft_layers.
    reads_of_source`: vLLM 0.24 reads fewer places than 0.34); vLLM 0.34's places where vLLM
    or that reader is not found."""
    source = _vllm_source(_READER, vllm_dir)
    return dl.READS_0_34 if source is None else dl.reads_of_source(source)


def _target_layers(config: dict[str, Any], target: str | None, data: dl.DataLayers | None
                   ) -> tuple[int | None, str | None, str | None]:
    """The target's decoder layer count as vLLM counts it (:func:`~speculators_compat.
    _draft_layers.layer_count`), where it was read, and the target's architecture."""
    if target is not None and target.isdigit():
        return int(target), "--target", None
    for where in (target, dl.verifier_of(config), data.model if data else None):
        model = dl.read_model_config(where) if where else None
        n = dl.layer_count(model) if model is not None else None
        if n is not None:
            return n, os.path.join(where, "config.json"), dl.architecture_of(model)
    if data is not None and data.num_hidden_layers is not None:
        return data.num_hidden_layers, data.source, None
    return None, None, None


def check(draft: str, data: str | None = None, target: str | None = None) -> dict[str, Any]:
    """The verdict on ``draft`` (a folder with ``config.json``) as a dict (``--json``)."""
    path = os.path.join(draft, "config.json")
    try:
        with open(path, encoding="utf-8") as f:
            config = json.load(f)
    except (OSError, ValueError) as exc:
        return {"status": "error", "exit": ERROR, "draft": draft,
                "message": f"no readable draft config at {path}: {exc}"}
    kind = config.get("speculators_model_type")
    if kind not in (None, "eagle3") or (kind is None and "eagle_config" not in config
                                         and dl.FIELD not in config):
        return {"status": "error", "exit": ERROR, "draft": draft,
                "message": f"{path} is not an EAGLE-3 draft config (speculators_model_type="
                           f"{kind!r}): vLLM feeds auxiliary hidden states only to EAGLE-3"}
    lookup = None
    if data is not None:
        folder = data if os.path.isdir(data) else os.path.dirname(os.path.abspath(data))
        lookup = dl.for_dirs([folder])
    trained = lookup.layers if lookup is not None else None
    found = dl.named_in(config, vllm_id_reads())
    named, named_from = found if found else (None, None)
    legacy = dl.legacy_named_layers(config)
    reads_named = vllm_reads_named_layers()
    n, n_from, arch = _target_layers(config, target, trained)
    default = dl.vllm_default(n) if n is not None else None
    # vLLM takes each id once, in layer order (_set_aux_hidden_state_layers), its default's
    # too: (2, n//2, n-3) of a 6-layer target is fed as [2, 3]
    feeds = dl.fed(named) if named and reads_named is not False else (
        dl.fed(default) if default else None)
    missing, missing_why = dl.uncaptured(feeds, n, arch) if feeds and n else ([], None)
    result: dict[str, Any] = {
        "draft": draft, "config": path, "named": list(named) if named else None,
        "named_from": named_from,
        "eagle_config_ids_not_read": list(legacy) if legacy else None,
        "vllm_reads_named": reads_named,
        "num_hidden_layers": n, "num_hidden_layers_from": n_from, "architecture": arch,
        "vllm_default": list(default) if default else None,
        "vllm_feeds": list(feeds) if feeds else None,
        "uncaptured": missing or None, "uncaptured_why": missing_why,
        "vllm_feeds_outputs_of": list(dl.speculators_ids(feeds)) if feeds else None,
        "data": data, "data_reason": lookup.reason if lookup is not None else None,
        "trained_on": list(trained.aux) if trained else None,
        "target_layer": trained.target if trained else None,
        "expected": list(trained.vllm_aux_ids) if trained else None,
    }
    if trained is not None and feeds is not None:
        match = tuple(feeds) == trained.vllm_aux_ids and not missing
        result.update(status="match" if match else "mismatch", exit=OK if match else MISMATCH)
    elif trained is not None:
        result.update(status="unknown", exit=MISMATCH)  # names none, target size unknown
    elif named and reads_named is not False:
        result.update(status="uncaptured" if missing else "named",
                      exit=MISMATCH if missing else OK)
    else:
        result.update(status="default", exit=MISMATCH)
    return result


def lines(r: dict[str, Any]) -> list[str]:
    """What the command prints for the verdict ``r``."""
    if r["status"] == "error":
        return [f"error: {r['message']}"]
    out = [f"draft: {r['draft']}"]
    ignored = r["named"] and r.get("vllm_reads_named") is False
    if ignored:
        out.append(f"config.json names {r['named']}, but the installed vLLM's speculators-format "
                   f"loader drops {dl.FIELD} (vLLM 0.11): it feeds its default (2, n//2, n-3)"
                   + (f", {r['vllm_feeds']}: the outputs of target layers "
                      f"{r['vllm_feeds_outputs_of']}" if r["vllm_feeds"] else ""))
    elif r["named"]:
        where = r.get("named_from") or dl.FIELD
        how = "" if where == dl.FIELD and r["named"] == r["vllm_feeds"] else (
            f" as {where}: {r['named']}; each id once, in layer order")
        out.append(f"vLLM feeds auxiliary hidden states {r['vllm_feeds']} (named in "
                   f"config.json{how}): the outputs of target layers "
                   f"{r['vllm_feeds_outputs_of']}")
    elif r["vllm_feeds"]:
        raw = r.get("vllm_default") or r["vllm_feeds"]
        rule = "(2, n//2, n-3)" if raw == r["vllm_feeds"] else (
            f"((2, n//2, n-3) = {raw}, each id once)")
        out.append(f"config.json names no {dl.FIELD}: vLLM feeds its default for a "
                   f"{r['num_hidden_layers']}-layer target, {r['vllm_feeds']} {rule}: "
                   f"the outputs of target layers {r['vllm_feeds_outputs_of']}")
    else:
        out.append(f"config.json names no {dl.FIELD}: vLLM feeds its default (2, n//2, n-3); "
                   "the target's layer count is unknown (pass --target MODEL_DIR or N)")
    if r.get("eagle_config_ids_not_read"):
        out.append(f"note: eagle_config.{dl.FIELD}={r['eagle_config_ids_not_read']} is read by "
                   f"vLLM 0.32's V1 model runner only; vLLM 0.34 feeds the default instead "
                   f"(name the ids at the top level as {dl.FIELD})")
    if r.get("uncaptured"):
        out.append(f"vLLM captures nothing for aux ids {r['uncaptured']} of this target "
                   f"({r['uncaptured_why']}): the draft gets fewer hidden states than it was "
                   "built for")
    if r["data"] is not None:
        if r["trained_on"] is not None:
            out.append(f"training data: {r['data_reason']}: the draft learned from the outputs "
                       f"of layers {r['trained_on']} (target layer {r['target_layer']}), "
                       f"vLLM ids {r['expected']}")
        else:
            out.append(f"training data: {r['data']}: {r['data_reason']}")
    fix = (f"set \"{dl.FIELD}\": {r['expected']} in {r['config']}" if r["expected"] else
           f"set \"{dl.FIELD}\" in {r['config']} to the layers the training data holds + 1")
    if ignored:
        fix = f"serve with vLLM 0.12 or newer, whose loader reads {dl.FIELD}"
    verdicts = {
        "match": "OK: vLLM feeds the draft the layers it was trained on",
        "mismatch": f"MISMATCH: vLLM feeds other layers than the draft was trained on; {fix}",
        "unknown": f"UNCONFIRMED: the target's layer count is unknown; {fix}",
        "named": "OK: the config names its layers (pass --data DIR to compare them with the "
                 "training data)",
        "uncaptured": f"MISMATCH: the config names layers vLLM does not capture for this "
                      f"target; {fix}",
        "default": "UNCONFIRMED: the draft relies on vLLM's default layers; a draft trained on "
                   "speculators 0.3/0.4's default capture (layers 2, n//2, n-3) is then fed "
                   f"the layers one below; {fix}",
    }
    out.append(verdicts[r["status"]])
    return out
