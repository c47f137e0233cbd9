"""Run speculators' OWN unit suites (0.3.0, 0.4.0.1) in the project's vLLM envs, with the
shim active and without, and record the counts.

Why: the claim "speculators' configs, models, conversion and training behave on
transformers 5 as on their pinned stack" is checked against speculators' own tests, not
ours. The tests come from speculators' repository at the release tag (``git archive``
from a bare clone whose path you pass; nothing of speculators is copied into this
project); speculators itself is the release folder of ``.envs/`` on ``PYTHONPATH``.

Per release x env x mode (``shim`` = ``python -m speculators_compat run -m pytest``,
``bare`` = ``python -m pytest``) it writes passed / failed / errors / skipped, the failing
test ids, and which failures are hub downloads (the machine is offline:
``HF_HUB_OFFLINE=1``, so those fail fast). The verdict per release: every test that
passes on the pinned stack (the vLLM 0.16 env, transformers 4.57, bare) passes on every
other env with the shim, hub tests aside.

Usage: python3 tools/matrix/speculators_suites.py GIT_DIR [--tags v0.3.0 v0.4.0.1]
       [--envs 0.16.0 0.32.0] [--modes bare shim] [--out docs/results/...json]
       [--timeout 2400] [-- PYTEST ARGS]
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PINNED_ENV = "0.16.0"  # transformers 4.57: the stack speculators 0.3/0.4 were released on
#: Failure texts that mean "needed the model hub" (offline machine).
HUB_MARKERS = ("LocalEntryNotFoundError", "OfflineModeIsEnabled", "HF_HUB_OFFLINE",
               "huggingface.co", "outgoing traffic has been disabled",
               "We couldn't connect to", "Cannot find the requested files in the disk cache",
               "offline mode is enabled", "RepositoryNotFoundError", "hf_hub_download")


def export_tests(git_dir: str, tag: str, dest: Path) -> Path:
    """``tests/`` and ``pyproject.toml`` of speculators at ``tag`` into ``dest``."""
    dest.mkdir(parents=True, exist_ok=True)
    archive = subprocess.run(["git", "--git-dir", git_dir, "archive", tag, "tests",
                              "pyproject.toml"], check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive, check=True)
    return dest


def run_suite(workdir: Path, env_version: str, release: str, mode: str, junit: Path,
              timeout: int, extra: list[str]) -> dict:
    python = ROOT / ".envs" / f"vllm-{env_version}" / "bin" / "python"
    pytest_args = ["-m", "pytest", "tests/unit", "-q", "-o", "addopts=", "-p",
                   "no:cacheprovider", f"--junitxml={junit}", *extra]
    cmd = [str(python), *(["-m", "speculators_compat", "run"] if mode == "shim" else []),
           *pytest_args]
    env = dict(os.environ)
    env.pop("SPECULATORS_COMPAT_ACTIVE", None)
    env.update(PYTHONPATH=str(ROOT / ".envs" / f"speculators-{release}"),
               HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(cmd, cwd=workdir, env=env, capture_output=True, text=True,
                              timeout=timeout)
        rc, tail = proc.returncode, (proc.stdout + proc.stderr)[-3000:]
    except subprocess.TimeoutExpired as exc:
        rc, tail = None, f"timed out after {timeout} s: {str(exc.stdout or '')[-2000:]}"
    result = {"command": " ".join(["python", *cmd[1:]]), "rc": rc,
              "seconds": round(time.perf_counter() - t0, 1)}
    result.update(parse_junit(junit) if junit.exists() else {"error": tail})
    if rc not in (0, 1):
        result["tail"] = tail
    return result


def parse_junit(path: Path) -> dict:
    outcomes: dict[str, str] = {}
    hub: list[str] = []
    for case in ET.parse(path).getroot().iter("testcase"):
        tid = f"{case.get('classname', '')}::{case.get('name', '')}"
        outcome = "passed"
        for child in case:
            if child.tag in ("failure", "error", "skipped"):
                outcome = {"failure": "failed", "error": "error", "skipped": "skipped"}[
                    child.tag]
                text = (child.get("message") or "") + (child.text or "")
                if outcome in ("failed", "error") and any(m in text for m in HUB_MARKERS):
                    hub.append(tid)
                break
        outcomes[tid] = outcome
    return _summary(outcomes, hub)


def _summary(outcomes: dict, hub) -> dict:
    """Counts per outcome, hub failures apart from the others, and every outcome."""
    counts = {k: sum(1 for v in outcomes.values() if v == k)
              for k in ("passed", "failed", "error", "skipped")}
    return {**counts, "hub_failures": sorted(hub),
            "non_hub_failures": sorted(t for t, v in outcomes.items()
                                       if v in ("failed", "error") and t not in hub),
            "outcomes": outcomes}


def merge_junit(paths: list[Path]) -> dict:
    merged: dict = {"outcomes": {}, "hub_failures": set()}
    for path in paths:
        part = parse_junit(path)
        merged["outcomes"].update({t: v for t, v in part["outcomes"].items()
                                   if not t.startswith("::")})
        merged["hub_failures"].update(part["hub_failures"])
    outcomes, hub = merged["outcomes"], merged["hub_failures"]
    hub = {t for t in hub if outcomes.get(t) in ("failed", "error")}
    return _summary(outcomes, hub)


def verdicts(results: dict) -> dict:
    """Per release: tests passing on the pinned stack (bare) that do not pass elsewhere
    with the shim, hub failures aside."""
    out = {}
    for release, by_env in results.items():
        pinned = by_env.get(PINNED_ENV, {}).get("bare") or by_env.get(PINNED_ENV, {}).get("shim")
        if not pinned or "outcomes" not in pinned:
            continue
        passing = {t for t, v in pinned["outcomes"].items() if v == "passed"}
        for env_version, modes in by_env.items():
            shim = modes.get("shim")
            if not shim or "outcomes" not in shim:
                continue
            regressed = sorted(t for t in passing if shim["outcomes"].get(t) != "passed"
                               and t not in shim["hub_failures"])
            out[f"{release} on vLLM {env_version} with the shim"] = {
                "pinned_passing": len(passing), "regressed": regressed,
                "ok": not regressed}
    return out


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    extra: list[str] = []
    if "--" in argv:
        i = argv.index("--")
        argv, extra = argv[:i], argv[i + 1:]
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("git_dir", help="a (bare) clone of vllm-project/speculators")
    p.add_argument("--tags", nargs="+", default=["v0.3.0", "v0.4.0.1"])
    p.add_argument("--envs", nargs="+", default=["0.16.0", "0.32.0"])
    p.add_argument("--modes", nargs="+", default=["bare", "shim"], choices=["bare", "shim"])
    p.add_argument("--timeout", type=int, default=2400)
    p.add_argument("--junit", action="append", default=[], metavar="RELEASE:ENV:MODE=XML",
                   help="record a junit file of an earlier run of the same command instead "
                        "of running that combination again")
    p.add_argument("--note", action="append", default=[], help="a line for the docs")
    p.add_argument("--out", default=str(
        ROOT / "docs" / "results" / f"speculators-suites-{dt.date.today().isoformat()}.json"))
    args = p.parse_args(argv)
    results: dict = {}
    given = {}
    for item in args.junit:
        key, _, path = item.partition("=")
        release, env_version, mode = key.split(":")
        given[(release, env_version, mode)] = Path(path)
        paths = [Path(x) for x in path.split(",")]  # parts of one suite (an interrupted
        # run's junit + a run of the tests it had not reached), merged by test id
        results.setdefault(release, {}).setdefault(env_version, {})[mode] = {
            "command": "python[ -m speculators_compat run] -m pytest tests/unit -q -o addopts= "
                       "-p no:cacheprovider", "junit": [x.name for x in paths],
            **merge_junit(paths)}
    with tempfile.TemporaryDirectory() as tmp:
        for tag in args.tags:
            release = tag.lstrip("v")
            if all((release, e, m) in given for e in args.envs for m in args.modes):
                continue
            work = export_tests(args.git_dir, tag, Path(tmp) / tag)
            for env_version in args.envs:
                for mode in args.modes:
                    if (release, env_version, mode) in given:
                        continue
                    junit = Path(tmp) / f"{tag}-{env_version}-{mode}.xml"
                    r = run_suite(work, env_version, release, mode, junit, args.timeout, extra)
                    results.setdefault(release, {}).setdefault(env_version, {})[mode] = r
                    print(f"speculators {release} on vLLM {env_version} ({mode}): "
                          f"{r.get('passed')} passed, {r.get('failed')} failed, "
                          f"{r.get('error')} errors, {len(r.get('hub_failures', []))} hub "
                          f"[{r['seconds']} s]", flush=True)
    doc = {"date": dt.date.today().isoformat(), "pinned_env": PINNED_ENV,
           "pytest_args": extra, "results": results, "verdicts": verdicts(results),
           "notes": args.note}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
    for name, v in doc["verdicts"].items():
        print(f"{name}: {'ok' if v['ok'] else 'REGRESSED'} "
              f"({v['pinned_passing']} pass pinned; regressed: {v['regressed'][:10]})")
    print(f"wrote {out}")
    return 0 if all(v["ok"] for v in doc["verdicts"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
