"""Whether the installed vLLM is a release the support matrix proved, and how far.

Why: "version-detected" adapters make the shim run on releases nobody tried; a user
should see at once whether theirs was run end to end, only probed, or never, and which
release was proven last. ``_proven.json`` beside this module is a copy of the matrix's
results (docs/support-matrix.json and the GPU result files), written by the matrix
renderer (``tools/matrix/matrix_render.py``); a unit test keeps it current. (The data file keeps
the name it shipped with: the matrix tools, the package data entry and the records'
stamps name it, and a rename would change nothing it says.) Only the standard
library and ``packaging`` are imported: ``doctor`` and every report use this.

Levels, best first: ``gpu`` (vLLM's CUDA build on a GPU, speculators' generator compared
with transformers), ``cpu-e2e`` (a vLLM CPU build, the same comparison on CPU),
``contract`` (PyPI's CUDA build on a machine without a GPU: imports and probes only).
An entry with ``"current": false`` ran older adapter code than this package's: it is named
as such and does not count as the release's level (a full matrix run takes about 100
minutes and a GPU run needs a lent GPU machine: between releases the matrix is not
re-recorded at every adapter change; a release is made only with current records).
"""

from __future__ import annotations

import json
import os
from functools import cache
from typing import Any

from . import _versions

FILE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_proven.json")
LEVELS = ("gpu", "cpu-e2e", "contract")
LEVEL_TEXT = {"gpu": "GPU", "cpu-e2e": "CPU e2e", "contract": "contract: probes only"}


@cache
def releases() -> dict[str, dict[str, Any]]:
    """vLLM release (public version) -> level -> {speculators, recorded, shim}."""
    try:
        with open(FILE, encoding="utf-8") as f:
            return json.load(f).get("releases") or {}
    except (OSError, ValueError):
        return {}


@cache
def families() -> dict[str, dict[str, Any]]:
    """Architecture -> vLLM release -> level -> {passed, failed, recorded, current}: the
    architecture matrix (docs/architectures.md)."""
    try:
        with open(FILE, encoding="utf-8") as f:
            return json.load(f).get("families") or {}
    except (OSError, ValueError):
        return {}


def family_verdict(architectures: list[str], vllm: str | None,
                   speculators: str | None) -> dict[str, Any]:
    """What the architecture matrix proved for a model's architecture on this vLLM."""
    release, spec = _public(vllm), _public(speculators)
    arch = next((a for a in architectures if a in families()), None)
    out: dict[str, Any] = {"architectures": list(architectures), "architecture": arch,
                           "vllm": release, "proven": False, "level": None}
    if arch is None:
        out["text"] = (f"{', '.join(architectures) or 'this model'}: not in the architecture "
                       "matrix (docs/architectures.md); run the demo's comparison on a tiny "
                       "checkpoint of it before trusting its data")
        return out
    here = families()[arch].get(release or "") or {}
    for level in LEVELS:
        e = here.get(level)
        if e and spec in e.get("passed", ()) and (
                spec not in e["older"] if "older" in e else e.get("current")):
            out.update(proven=True, level=level, recorded=e.get("recorded"))
            out["text"] = (f"{arch}: proven by the architecture matrix on vLLM {release}, "
                           f"{LEVEL_TEXT[level]} (speculators {spec}; recorded "
                           f"{e.get('recorded')})")
            return out
    seen = [f"vLLM {v} {LEVEL_TEXT[lv]}" + ("" if e.get("current") or spec not in e.get(
                "older", [spec]) else ", earlier adapter code")
            + (f": failed ({e['failed'][spec]})" if spec in e.get("failed", {}) else
               f": passed with speculators {', '.join(e.get('passed', ())) or 'none'}")
            for v, levels in families()[arch].items() for lv, e in levels.items()]
    out["text"] = (f"{arch}: not proven on vLLM {release} with speculators {spec}; "
                   "recorded: " + "; ".join(seen))
    return out


def _public(version: str | None) -> str | None:
    v = _versions.parse(version)
    return None if v is None else v.public


def _best(levels: dict[str, Any], speculators: str | None = None) -> str | None:
    """The best level of a release (for ``speculators``, when given)."""
    for level in LEVELS:
        entry = levels.get(level)
        if entry and entry.get("current", True) and (
                speculators is None or speculators in entry.get("speculators", ())):
            return level
    return None


def _older(levels: dict[str, Any], speculators: str | None) -> dict[str, Any] | None:
    """The best level that passed with older adapter code (for ``speculators``), if any."""
    for level in LEVELS:
        entry = levels.get(level)
        if entry and entry.get("current") is False and (
                speculators is None or speculators in entry.get("speculators", ())):
            return {"level": level,
                    **{k: entry.get(k) for k in ("speculators", "recorded", "shim")}}
    return None


def newest(end_to_end: bool = False) -> tuple[str, str] | None:
    """(release, best level) of the newest proven release (run end to end, if asked)."""
    found = []
    for release, levels in releases().items():
        level = _best({k: v for k, v in levels.items() if not end_to_end or k != "contract"})
        v = _versions.parse(release)
        if level and v is not None:
            found.append((v, release, level))
    return max(found)[1:] if found else None


def verdict(vllm: str | None, speculators: str | None) -> dict[str, Any]:
    """What the matrix proved for this vLLM (and speculators) release."""
    release = _public(vllm)
    levels = releases().get(release or "") or {}
    spec = _public(speculators)
    level = _best(levels, spec) if spec else _best(levels)
    out: dict[str, Any] = {"vllm": release, "proven": level is not None, "level": level}
    older = _older(levels, spec)
    if older:
        out["older"] = older
        if older["level"] == "gpu":
            out["older_gpu"] = {k: v for k, v in older.items() if k != "level"}
    others = sorted({s for e in levels.values() if e.get("current", True)
                     for s in e.get("speculators", ())})
    if level:
        out.update(levels[level])
    elif others:  # proven, but not with the installed speculators release
        out["other_speculators"] = others
    if not level or level == "contract":
        top, e2e = newest(), newest(end_to_end=True)
        out["newest_proven"] = {"vllm": top[0], "level": top[1]} if top else None
        out["newest_end_to_end"] = {"vllm": e2e[0], "level": e2e[1]} if e2e else None
    out["text"] = _text(out, spec)
    return out


def _text(v: dict[str, Any], speculators: str | None) -> str:
    def named(entry: dict[str, Any] | None) -> str:
        return f"{entry['vllm']} ({LEVEL_TEXT[entry['level']]})" if entry else "none"

    if v["vllm"] is None:
        return "vLLM is not installed"
    if v["proven"]:
        specs = ", ".join(v.get("speculators") or ())
        text = (f"vLLM {v['vllm']} is proven by the support matrix: "
                f"{LEVEL_TEXT[v['level']]} (speculators {specs}; recorded {v.get('recorded')}"
                f" at shim commit {v.get('shim')})")
        if v["level"] == "contract":
            text += f"; newest run end to end: {named(v.get('newest_end_to_end'))}"
        return text + _older_text(v)
    if v.get("other_speculators"):
        return (f"vLLM {v['vllm']} was proven by the support matrix only with speculators "
                f"{', '.join(v['other_speculators'])}, not {speculators}") + _older_text(v)
    return (f"vLLM {v['vllm']} is not a release the support matrix proved; newest proven: "
            f"{named(v.get('newest_proven'))}; newest run end to end: "
            f"{named(v.get('newest_end_to_end'))}") + _older_text(v)


def _older_text(v: dict[str, Any]) -> str:
    older = v.get("older")
    if not older or (v["proven"] and LEVELS.index(v["level"]) <= LEVELS.index(older["level"])):
        return ""
    return (f"; a {LEVEL_TEXT[older['level']]} run passed on {older.get('recorded')} at shim "
            f"commit {older.get('shim')}, with older adapter code than this release of "
            "speculators-compat (not counted)")


def short(vllm: str | None, speculators: str | None) -> str:
    """A few words for the report's summary line."""
    v = verdict(vllm, speculators)
    if v["proven"]:
        return f"matrix: proven, {LEVEL_TEXT[v['level']]}"
    top = v.get("newest_proven")
    return ("matrix: not proven" + (f" (newest proven: {top['vllm']}, "
                                    f"{LEVEL_TEXT[top['level']]})" if top else ""))
