"""The architecture matrix: which model families ran through the shim, where, and what held.

Why: the support matrix proves vLLM releases on two tiny families (Llama, the DeepSeek-V3
layout); the models EAGLE-3 drafts are trained for now mix attention kinds (linear,
sliding-window, sparse MLA, Mamba) and each needs its own proof. The records are
``docs/results/families-{gpu-<card>|cpu}-vllm-<version>-<date>.json``, written by
``tests/e2e/scripts/gpu_families.py`` (every family x speculators release through the
unchanged generator against transformers, with transformers' own bf16-vs-float32 floor).
This module turns them into

* the ``families`` part of the package's ``_proven.json`` (``doctor --model DIR`` reads
  it): architecture -> vLLM release -> level -> the speculators releases that passed, the
  ones that failed, when, and whether the run's adapter code is the package's
  (``current``);
* ``docs/architectures.md`` (generated; ``tools/matrix/matrix.py render --check`` keeps it current).

For each (architecture, vLLM release, level, speculators release) the newest record counts.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

LEVEL = {"gpu": "gpu", "cpu": "cpu-e2e"}
NAME = re.compile(r"^families-(gpu|cpu)(?:-[a-z0-9]+)?-vllm-([0-9][^-]*)-(\d{4}-\d\d-\d\d)")


def _records(results: Path):
    """(architecture, vllm, level, speculators, date, ok, why, meta, file, stand-in) for every
    run; stand-in: the run replaced FlashInfer's norm kernels by the PyTorch stand-in
    (``tests/e2e/scripts/standins``), which the page says."""
    for f in sorted(results.glob("families-*.json")):
        m = NAME.match(f.name)
        if not m:
            continue
        data = json.loads(f.read_text())
        meta = data.get("meta") or {}
        for r in data.get("runs") or []:
            arch = r.get("architecture")
            if not arch or not r.get("release"):
                continue
            why = None if r.get("ok") else (r.get("why") or r.get("failed_step")
                                            or "hidden states differ from transformers")
            yield (arch, m.group(2), LEVEL[m.group(1)], r["release"], m.group(3),
                   bool(r.get("ok")), why, meta, f.name, bool(r.get("flashinfer_standin")))


def families(results: Path, digest: str | None) -> dict[str, Any]:
    """The ``families`` part of ``_proven.json``."""
    newest: dict[tuple, tuple] = {}
    for arch, vllm, level, spec, day, ok, why, meta, name, standin in _records(results):
        key = (arch, vllm, level, spec)
        if key not in newest or day >= newest[key][0]:
            newest[key] = (day, ok, why, meta, name, standin)
    out: dict[str, Any] = {}
    for (arch, vllm, level, spec), (day, ok, why, meta, _name, standin) in sorted(
            newest.items()):
        entry = out.setdefault(arch, {}).setdefault(vllm, {}).setdefault(
            level, {"passed": [], "failed": {}, "recorded": day, "current": True,
                    "older": []})
        if standin:
            entry["flashinfer_standin"] = True
        if ok:
            entry["passed"].append(spec)
        else:
            entry["failed"][spec] = why
        entry["recorded"] = max(entry["recorded"], day)
        if not (digest and meta.get("shim_src") == digest):
            entry["older"].append(spec)  # this release's newest record ran other code
        entry["current"] = not entry["older"]
    return out


def columns(fams: dict[str, Any]) -> list[tuple[str, str]]:
    """(vLLM release, level) of every record, GPU first: the tables' columns."""
    return sorted({(vllm, level) for a in fams.values() for vllm, lv in a.items() for level in lv},
                  key=lambda c: (c[1] != "gpu", c[0]))


def heading(col: tuple[str, str]) -> str:
    return f"{'GPU' if col[1] == 'gpu' else 'CPU'}, vLLM {col[0]}"


REAL_SHAPES = re.compile(r"^gpu-models-([a-z0-9]+)-vllm-([0-9][^-]*)-(\d{4}-\d\d-\d\d)")
#: The real-shape models (``tests/e2e/scripts/real_shapes.py``) of this page's families;
#: the others (Kimi-K2.5, DeepSeek-V3, Qwen3-MoE, GPT-OSS) are rendered with the GPU runs
#: of the support matrix.
FAMILY_REAL_SHAPES = ("qwen3_5_moe", "deepseek_v32", "gemma4")


def real_shapes(results: Path) -> list[str]:
    """One line per (real-shape model, speculators release): its newest generator run of
    ``docs/results/gpu-models-*.json`` (``tests/e2e/scripts/gpu_models.py``: published
    widths, fewer layers), with the lowest cosine of its checks or its error."""
    newest: dict[tuple[str, str], tuple[tuple[str, str], str]] = {}
    for f in results.glob("gpu-models-*.json"):
        m = REAL_SHAPES.match(f.name)
        if not m:
            continue
        card, vllm, day = m.groups()
        data = json.loads(f.read_text())
        for run in data.get("runs") or []:
            if (run.get("kind") != "gen" or run.get("tp", 1) != 1
                    or run.get("model") not in FAMILY_REAL_SHAPES):
                continue
            checks = {k: c for k, c in (run.get("checks") or {}).items() if isinstance(c, dict)}
            if run.get("ok") and checks:
                said = "pass, lowest cosine " + ", ".join(
                    f"{c['min_cosine']:.5f} against {k}" for k, c in sorted(checks.items())
                    if c.get("min_cosine") is not None)
            elif run.get("ok"):
                said = "pass"
            else:
                error = (run.get("error") or "failed").splitlines()[0][:160]
                said = f"**did not pass**: `{error}`"
            line = (f"- `{run['model']}`, speculators {run['spec']}: {said} "
                    f"({card.upper()}, vLLM {vllm}, {day}, [`{f.name}`](results/{f.name}))")
            key = (run["model"], run["spec"])
            if key not in newest or (day, f.name) > newest[key][0]:
                newest[key] = ((day, f.name), line)
    return [line for _, (_, line) in sorted(newest.items())]


def render_page(results: Path, digest: str | None) -> str:
    """``docs/architectures.md``."""
    fams = families(results, digest)
    cols = columns(fams)
    head = [heading(c) for c in cols]
    lines = [
        "# Architecture matrix",
        "",
        "<!-- generated by tools/matrix/matrix.py render from docs/results/families-*.json; "
        "do not edit -->",
        "",
        "Which model families ran through speculators' unchanged generator with the shim, "
        "and what held. Each record is a tiny random checkpoint of the family "
        "(`speculators_compat.demo.checkpoints`: the published layer mix and head shapes, "
        "fewer and narrower layers) run by `tests/e2e/scripts/gpu_families.py`: batches of 1 "
        "and 11 sequences of 70-200 tokens, both speculators releases (0.4.x with a 256-token "
        "step budget, so prompts are prefilled over several steps), every captured layer "
        "compared with transformers' `output_hidden_states[k + 1]` (pass: min per-token cosine "
        "≥ 0.998, relative L2 ≤ 4 %, max error ≤ 5 % of the reference's max; every sequence "
        "whole and in input order; deliberately wrong results must fail the same check). "
        "The multimodal wrappers (`Qwen3_5ForConditionalGeneration`, "
        "`Gemma4ForConditionalGeneration`: checkpoint kinds `qwen3_5_mm`, `gemma4_mm`) are "
        "checkpoints of the wrapper class with a one-layer vision tower, the same language "
        "model as the text family and the processor files vLLM reads at start-up; prompts "
        "are text only, and the captured layers are compared with the wrapper's language "
        "model in transformers. "
        "`doctor --model DIR` reads the same records.",
        "",
        "| architecture | " + " | ".join(head) + " |",
        "|---|" + "---|" * len(cols),
    ]
    notes: list[str] = []
    for arch in sorted(fams):
        cells = []
        for vllm, level in cols:
            e = fams[arch].get(vllm, {}).get(level)
            if not e:
                cells.append("–")
                continue
            text = []
            older = set(e.get("older", ()))
            today = [spec for spec in e["passed"] if spec not in older]
            before = [spec for spec in e["passed"] if spec in older]
            if today:
                text.append("pass " + ", ".join(today))
            if before:
                text.append("pass " + ", ".join(before) + " (earlier adapter code)")
            # a run vLLM stopped before any shim code ran is no failure of the shim
            unstarted = [spec for spec, why in e["failed"].items()
                         if str(why).startswith("could not start")]
            failed = [spec for spec in e["failed"] if spec not in unstarted]
            if failed:
                text.append("**fail** " + ", ".join(failed))
            if unstarted:
                text.append("could not start " + ", ".join(unstarted))
            for spec, why in e["failed"].items():
                notes.append(f"- {arch}, {'GPU' if level == 'gpu' else 'CPU'} vLLM {vllm}, "
                             f"speculators {spec}: {why}")
            if e.get("flashinfer_standin"):
                notes.append(f"- {arch}, {'GPU' if level == 'gpu' else 'CPU'} vLLM {vllm}: "
                             "FlashInfer's two Gemma-norm kernels replaced by a PyTorch "
                             "stand-in (`tests/e2e/scripts/standins`: the project's GPU kit "
                             "has no FlashInfer); the check is of the shim, not FlashInfer")
            stale_failures = [spec for spec in e["failed"] if spec in older]
            age = f" (earlier adapter code: {', '.join(stale_failures)})" if stale_failures else ""
            cells.append("; ".join(text) + f" ({e['recorded']}){age}")
        lines.append(f"| `{arch}` | " + " | ".join(cells) + " |")
    lines += ["", "Failures, runs that could not start (with the recorded reason), and runs with "
              "a stand-in kernel:", ""]
    lines += sorted(set(notes)) or ["- none"]
    lines += ["", "Refused when speculators' generator is built, before any worker starts or "
              "weight loads (`speculators_compat/_model_support.py`; `doctor --model` names "
              "them too): models with hyper-connections (`hc_mult` > 1: DeepSeek-V4, "
              "DeepSeek-V4.1, HY-V4), whose layer output is several residual streams that "
              "speculators 0.3/0.4's one tensor per layer cannot hold; Kimi-K3 / K3.1 configs "
              "with attention-residual blocks (`attn_res_block_size`: a layer returns a "
              "per-block residual bank, not one stream); MiniMax-M3 sparse "
              "(`MiniMaxM3Sparse...`: vLLM runs each layer through two methods, never the "
              "layer module, so a hook on the layer sees nothing). All point to vLLM's own "
              "`extract_hidden_states` (speculators >= 0.5). A config transformers cannot "
              "build (a `model_type` only vLLM registers) is read as JSON for this."]
    shapes = real_shapes(results)
    if shapes:
        lines += ["", "## Real shapes on the GPU", "",
                  "The same generator on the models' published widths with fewer decoder "
                  "layers (random weights; [gpu.md](gpu.md#real-shape-models) says how each "
                  "is built and checked), the newest run of each model and release (the other "
                  "real-shape models: [support-matrix.md](support-matrix.md#gpu-runs)):", "",
                  *shapes]
    lines += ["", "Raw records: "
              + ", ".join(f"[`{f.name}`](results/{f.name})"
                          for f in sorted(results.glob("families-*.json"))) + "."]
    return "\n".join(lines) + "\n"
