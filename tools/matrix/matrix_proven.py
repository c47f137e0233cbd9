"""``src/speculators_compat/_proven.json``: the matrix's results as the package ships them.

Why: ``doctor`` and the activation report say whether the installed vLLM is a release
the matrix proved, and at which level (``speculators_compat._matrix_proof``). The package
cannot read docs/, so the renderer (``tools/matrix/matrix.py render``, and every save of a
``run``) writes this copy: per vLLM release (its public version), per level, the
speculators releases for which everything held, when, and at which shim commit.
``tests/unit/test_support_matrix_current.py`` checks the shipped file is current.

A row holds when doctor supported it with no adapter in ``mismatch``/``failed``, the
range check agreed, ``tests/contract`` had no failure, and (``e2e`` envs) every e2e run
passed or was not run for a stated reason (vLLM itself failing on the checkpoint, MLA on
an old CPU backend), the training chain (where it ran) passed, and, on speculators'
strictly pinned vLLM, no ``upstream-change`` adapter applied. GPU level: the newest
``docs/results/gpu-*.json`` (not ``gpu-models-*``) with runs of that speculators release,
every one of them ok. Every entry says whether it ran the adapter code of the package
that ships it (``current``): its records' ``shim_src`` equals that code's digest
(``tools/matrix/matrix_fresh.source_digest``). Re-running the whole matrix takes about 100
minutes and the GPU machine is lent now and then, so neither is repeated at every change
of adapter code: between releases the package reports a run of older adapter code as
such ("at earlier adapter code", not counted as the release's level) instead of as proof,
and a release is made only with current records (``tests/unit/test_support_matrix_fresh.py``).
"""

from __future__ import annotations

import datetime
import json
import re
from pathlib import Path
from typing import Any

SCHEMA = 1
LEVEL_OF_ENV = {"e2e": "cpu-e2e", "contract": "contract"}


def public(version: str | None) -> str | None:
    """``0.16.0+cpu`` -> ``0.16.0`` (what ``packaging.Version.public`` gives)."""
    return re.sub(r"\+.*$", "", version.strip()) if version else None


def _shims(s: dict[str, Any]) -> list[str]:
    parts = [s.get("doctor"), s.get("contract"), s.get("train"),
             *(s.get("e2e") or {}).values()]
    return sorted({p["shim"] for p in parts if p and p.get("shim")})


def row_holds(level: str, s: dict[str, Any] | None) -> bool:
    """Whether everything recorded for one env × speculators release held."""
    if not s:
        return False
    doc = s.get("doctor") or {}
    if doc.get("supported") is not True or s.get("range_disagreements"):
        return False
    if any(a["status"] in ("mismatch", "failed") for a in (doc.get("adapters") or {}).values()):
        return False
    contract = s.get("contract")
    if not contract or contract.get("failed"):
        return False
    pin = s.get("pinned") or {}
    if pin.get("strict") and (pin.get("upstream_change_applied") or (
            pin.get("e2e_without_safeguards") or {}).get("status", "pass") != "pass"):
        return False
    if (s.get("train") or {}).get("status", "pass") not in ("pass", "not-run"):
        return False
    if level == "e2e":
        e2e = s.get("e2e") or {}
        if (e2e.get("llama") or {}).get("status") != "pass":
            return False
        return all(e.get("status") in ("pass", "not-run", "vllm-fails") for e in e2e.values())
    return True


def _add(out: dict[str, Any], vllm: str, level: str, spec: str, recorded: str | None,
         shim: str | None, **more: Any) -> None:
    entry = out.setdefault(vllm, {}).setdefault(level, {"speculators": [], "recorded": None,
                                                        "shim": None, **more})
    entry["speculators"] = sorted({*entry["speculators"], spec})
    if recorded and (entry["recorded"] is None or recorded >= entry["recorded"]):
        entry.update(recorded=recorded, shim=shim, **more)


def matrix_digest(data: dict[str, Any]) -> str | None:
    """The adapter-code digest (``shim_src``) the matrix's CPU records carry, where they all
    carry the same one; else ``None``."""
    found = set()
    for rec in (data.get("envs") or {}).values():
        for s in (rec.get("speculators") or {}).values():
            pinned = (s.get("pinned") or {}).get("e2e_without_safeguards")
            for part in (s.get("doctor"), s.get("contract"), s.get("train"), pinned,
                         *(s.get("e2e") or {}).values()):
                if isinstance(part, dict) and part.get("status") != "not-run":
                    found.add(part.get("shim_src"))
    return found.pop() if len(found) == 1 else None


def _row_digests(s: dict[str, Any]) -> set[str | None]:
    pinned = (s.get("pinned") or {}).get("e2e_without_safeguards")
    return {part.get("shim_src") for part in (s.get("doctor"), s.get("contract"), s.get("train"),
                                               pinned, *(s.get("e2e") or {}).values())
            if isinstance(part, dict) and part.get("status") != "not-run"}


def _gpu(out: dict[str, Any], results: Path, digest: str | None) -> None:
    newest: dict[tuple[str, str], tuple[float, dict[str, Any], list[dict]]] = {}
    for f in sorted(results.glob("gpu-*.json")):
        if f.name.startswith("gpu-models-"):
            continue
        data = json.loads(f.read_text())
        meta = data.get("meta") or {}
        vllm = public(meta.get("vllm"))
        if not vllm:
            continue
        for spec in {r.get("spec") for r in data.get("runs") or [] if r.get("spec")}:
            runs = [r for r in data["runs"] if r.get("spec") == spec]
            key, started = (vllm, spec), float(meta.get("started") or 0)
            if key not in newest or started >= newest[key][0]:
                newest[key] = (started, meta, runs)
    for (vllm, spec), (started, meta, runs) in sorted(newest.items()):
        if runs and all(r.get("ok") for r in runs):
            day = (datetime.datetime.fromtimestamp(started, datetime.timezone.utc)
                   .date().isoformat() if started else None)
            shim = (meta.get("shim") or meta.get("shim_commit") or "").split(" ")[0] or None
            src = meta.get("shim_src")
            _add(out, vllm, "gpu", spec, day, shim,
                 current=bool(src) and digest is not None and src == digest)


def proven(data: dict[str, Any], results: Path, speculators: tuple[str, ...],
           digest: str | None = None) -> dict[str, Any]:
    """The shipped file's content (``speculators``: the supported releases; ``digest``: the
    adapter code of the package that ships it, which records must have run to be
    ``current``; ``None``: the digest the CPU records carry, CPU records all current)."""
    out: dict[str, Any] = {}
    for rec in data.get("envs", {}).values():
        vllm = public((rec.get("versions") or {}).get("vllm"))
        level = LEVEL_OF_ENV.get(rec.get("level"))
        if not vllm or not level:
            continue
        for spec in speculators:
            s = (rec.get("speculators") or {}).get(spec)
            if row_holds(rec["level"], s):
                more = {} if digest is None else {"current": _row_digests(s) == {digest}}
                _add(out, vllm, level, spec, rec.get("recorded"), ", ".join(_shims(s)) or None,
                     **more)
    _gpu(out, results, matrix_digest(data) if digest is None else digest)
    return {"schema": SCHEMA,
            "source": "docs/support-matrix.json and docs/results/gpu-*.json, written by "
                      "tools/matrix/matrix.py render; do not edit",
            "releases": {k: out[k] for k in sorted(out, key=_key)}}


def _key(version: str) -> tuple:
    return tuple(int(x) if x.isdigit() else -1 for x in re.split(r"[.]", version)[:3]) + (
        version,)


def text(content: dict[str, Any]) -> str:
    """The file's text: one line per release (stable: a unit test compares it byte for
    byte)."""
    def one(value: Any) -> str:
        return json.dumps(value, separators=(", ", ": "))

    head = {k: v for k, v in content.items() if k not in ("releases", "families")}
    lines = [f" {one(k)}: {one(v)}," for k, v in head.items()]
    rel = content.get("releases") or {}
    body = [f"  {one(k)}: {one(v)}" for k, v in rel.items()]
    out = "{\n" + "\n".join(lines) + '\n "releases": {\n' + ",\n".join(body) + "\n }"
    if "families" in content:
        fams = [f"  {one(k)}: {one(v)}" for k, v in content["families"].items()]
        out += ',\n "families": {\n' + ",\n".join(fams) + "\n }"
    return out + "\n}\n"
