#!/usr/bin/env python3
"""Build, carry and install the kit that runs real vLLM 0.26.0 on the lent H200 machine.

The device machine (Python 3.12, torch 2.11.0+cu130, transformers 5.17) has no vLLM and no
network, and one call of the device tool carries at most 64 MiB. This tool packs what is
missing into parts of at most 58 MB under ``.gpu-kit/`` (git-ignored: nothing of the kit is
committed), which consecutive device calls carry one by one; the last call installs.

Here (any machine with pip and network)::

    python3 tools/gpu_kit.py build            # idempotent; downloads are cached
    python3 tools/gpu_kit.py plan             # the device commands, one per call

On the device (stdlib only; run by the commands ``plan`` prints)::

    python3 tools/gpu_kit.py stash .gpu-kit/parts/kit.part00   # copy a part out of the checkout
    python3 tools/gpu_kit.py install                           # assemble, extract, pip install

What the kit holds (see docs/gpu.md for why):

- ``vllm-slim.tar.xz``: the vllm 0.26.0 wheel (CUDA 13, pins torch 2.11.0) unpacked, without
  the FlashAttention-2 library (305 MB, not needed on Hopper), the FlashAttention-3 library
  (carried separately as ``fa3.so.xz``), the Rust frontend binary ``vllm-rs`` and DeepGEMM's
  extension builds for other Python versions.
- ``site.tar.xz``: vLLM's dependencies that the machine lacks (cp312, manylinux), pydantic
  pinned below 2.13 for speculators, the extra GPU packages vLLM imports; installed here with
  ``pip install --target`` for the machine's Python and packed (42 MB instead of 78 MB of
  wheels: one part fewer).
- ``wheels/``: our own wheel (it registers the ``vllm.general_plugins`` entry point).
- ``spec/``: the speculators 0.3.0 and 0.4.0.1 wheels, installed into one folder each
  (``PYTHONPATH`` selects the release).
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import lzma
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
KIT = ROOT / ".gpu-kit"
DL = KIT / "dl"            # cached downloads (not carried)
STAGE = KIT / "stage"      # what the bundle holds
PARTS = KIT / "parts"      # what is carried, one part a call
PART_SIZE = 58_000_000

VLLM = "vllm==0.26.0"
SPECULATORS = ["speculators==0.3.0", "speculators==0.4.0.1"]
PINNED = ["pydantic==2.12.5", "pydantic-core==2.41.5"]  # speculators needs pydantic < 2.13
# Imported by vLLM on the GPU path, but left out of the resolved set below (their own
# dependencies are torch/nvidia wheels the machine already has).
EXTRA_NO_DEPS = ["flashinfer-python==0.6.14",
                 "nvidia-cudnn-frontend>=1.19.1", "nvtx==0.2.15", "cuda-tile",
                 # speculators' training code (train/vocab_mapping.py imports datasets;
                 # their other dependencies are on the machine): tests/e2e/scripts/gpu_train.py
                 "datasets==4.6.0", "multiprocess==0.70.18"]
# Requirements of vLLM that are not resolved: on the machine already, or GPU kernel packages
# the tiny-checkpoint path does not import (torchcodec, tilelang, cutlass-dsl, ...).
SKIP_REQS = re.compile(
    r"^(torch|torchaudio|torchvision|torchcodec|nvidia-.*|transformers|numpy|opencv-.*|numba"
    r"|pynvvideocodec|flashinfer-python|tilelang|nvidia-cutlass-dsl"
    r"|quack-kernels|tokenspeed-mla|humming-kernels|fastsafetensors|nvtx|pydantic)$", re.I)
# Projects the device image already holds (KINDS.md of the device tool, read 2026-11-17):
# their wheels are dropped from the kit.
_ON_MACHINE = """
absl-py accelerate aiofiles aiohappyeyeballs aiohttp aiosignal annotated-doc anyio attrs botorch
build certifi charset-normalizer chex click cloudpickle cmake colorama contourpy coverage
cuda-bindings cuda-core cuda-pathfinder cuda-toolkit cupy-cuda13x cycler cython diffrax e3nn
einops equinox etils execnet filelock flatbuffers flax fonttools formulaic frozenlist fsspec
gpytorch grpcio h11 h5py hf-xet httpcore httpx huggingface-hub humanize hypothesis idna imageio
iniconfig interface-meta jax jax-cuda13-pjrt jax-cuda13-plugin jaxlib jaxtyping jinja2 joblib
kiwisolver lazy-loader lightning lightning-utilities linear-operator lineax llvmlite lxml
markdown markdown-it-py markupsafe matplotlib mdurl meson ml-dtypes mpi4py mpmath msgpack
multidict multipledispatch mypy-extensions nanobind narwhals networkx ninja numba numba-cuda
numpy numpyro onnx onnx-ir onnxruntime onnxscript opencv-python-headless optax opt-einsum
opt-einsum-fx optimistix orbax-checkpoint packaging pandas pathspec patsy peft pillow pip pluggy
portalocker prometheus-client propcache protobuf psutil pyarrow pybind11 py-cpuinfo pygments
pyparsing pyproject-hooks pyre-extensions pytest pytest-benchmark pytest-cov pytest-mock
pytest-timeout pytest-xdist python-dateutil pytorch-lightning pyyaml regex requests rich
sacrebleu safetensors scikit-build-core scikit-image scikit-learn scipy seaborn sentencepiece
sentence-transformers setuptools shellingham simplejson six sortedcontainers statsmodels sympy
tabulate tensorboard tensorboard-data-server tensorstore threadpoolctl tifffile tiktoken timm
tokenizers toolz torch torchaudio torchdiffeq torch-geometric torchmetrics torchvision tqdm
transformers treescope triton typer typing-extensions typing-inspect urllib3 uvloop
wadler-lindig werkzeug wheel wrapt xarray xxhash yarl zipp
"""
ON_MACHINE = set(_ON_MACHINE.split())
PLATFORMS = ["manylinux2014_x86_64"] + [f"manylinux_2_{v}_x86_64" for v in
                                        (17, 24, 27, 28, 31, 34, 35, 38, 39)]
PIP_TARGET = ["--only-binary=:all:", "--python-version", "3.12", "--implementation", "cp",
              "--abi", "cp312", "--abi", "abi3", "--abi", "none"] + [
                  a for p in PLATFORMS for a in ("--platform", p)] + ["--platform", "any"]

# Device side.
DEV_KIT = Path(os.environ.get("GPU_KIT_DIR", "/root/kit"))
DEV_SITE = Path(os.environ.get("GPU_KIT_SITE", "/root/site"))


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _on_machine(project: str) -> bool:
    """Whether the device image has the project (or it is torch's own CUDA runtime)."""
    if project == "nvidia-cudnn-frontend":
        return False
    return project in ON_MACHINE or project.startswith("nvidia-") or project in (
        "torch", "triton")


def _wheel_project(filename: str) -> str:
    return _norm(filename.split("-")[0])


def _pip(*args: str) -> None:
    cmd = [sys.executable, "-m", "pip", *args]
    print("+", " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True)


def _download(reqs: list[str], dest: Path, *, deps: bool) -> None:
    dest.mkdir(parents=True, exist_ok=True)
    _pip("download", "-q", "--disable-pip-version-check", *([] if deps else ["--no-deps"]),
         *PIP_TARGET, "-d", str(dest), *reqs)


def _vllm_wheel() -> Path:
    d = DL / "vllm"
    found = sorted(d.glob("vllm-0.26.0-*.whl")) if d.exists() else []
    if not found:
        _download([VLLM], d, deps=False)
        found = sorted(d.glob("vllm-0.26.0-*.whl"))
    return found[0]


def _vllm_requirements(whl: Path) -> list[str]:
    with zipfile.ZipFile(whl) as z:
        meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        text = z.read(meta).decode()
    reqs = []
    for line in text.splitlines():
        if not line.startswith("Requires-Dist:"):
            continue
        req = line.split(":", 1)[1].strip()
        if "extra ==" in req:
            continue
        req = req.split(";")[0].strip()
        name = re.match(r"[A-Za-z0-9_.\-]+", req).group(0)
        if not SKIP_REQS.match(name):
            reqs.append(req)
    return reqs


def _drop_from_vllm(name: str) -> bool:
    """Members of the vllm wheel the kit leaves out (or carries separately)."""
    if name.startswith("vllm/vllm_flash_attn/_vllm_fa2_C") or name.startswith(
            "vllm/vllm_flash_attn/_vllm_fa3_C"):
        return True
    if name == "vllm/vllm-rs":  # Rust frontend binary (VLLM_RUST_FRONTEND_PATH only)
        return True
    return bool(re.match(r"vllm/third_party/deep_gemm/_C\.cpython-3(10|11|13|14)-", name))


def _build_vllm(whl: Path) -> None:
    STAGE.mkdir(parents=True, exist_ok=True)
    out = STAGE / "vllm-slim.tar.xz"
    fa3 = STAGE / "fa3.so.xz"
    if out.exists() and fa3.exists():
        return
    print(f"slimming {whl.name} ...", flush=True)
    tmp = out.with_suffix(".tmp")
    with zipfile.ZipFile(whl) as z, lzma.open(tmp, "wb", preset=6) as xz, \
            tarfile.open(fileobj=xz, mode="w") as tar:
        for info in z.infolist():
            if info.is_dir():
                continue
            if _drop_from_vllm(info.filename):
                if "_vllm_fa3_C" in info.filename:
                    with lzma.open(fa3, "wb", preset=6) as f:
                        f.write(z.read(info))
                continue
            data = z.read(info)
            ti = tarfile.TarInfo(info.filename)
            ti.size = len(data)
            ti.mode = 0o755 if (info.external_attr >> 16) & 0o111 else 0o644
            tar.addfile(ti, io.BytesIO(data))
    tmp.rename(out)


def _build_wheels(whl: Path) -> None:
    wheels = STAGE / "wheels"
    spec = STAGE / "spec"
    deps = DL / "deps"
    if not (deps / ".done").exists():
        with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as f:
            f.write("\n".join(_vllm_requirements(whl) + PINNED) + "\n")
            reqs = f.name
        # Resolve from metadata only (a resolving download would fetch torch and the
        # nvidia-* wheels, gigabytes the machine already has), then download the kept set.
        report = DL / "deps-report.json"
        _pip("install", "--dry-run", "--ignore-installed", "-q", "--disable-pip-version-check",
             "--report", str(report), "--target", str(DL / "dry-run-target"), *PIP_TARGET,
             "-r", reqs)
        resolved = [(i["metadata"]["name"], i["metadata"]["version"])
                    for i in json.loads(report.read_text())["install"]]
        wanted = [f"{n}=={v}" for n, v in resolved if not _on_machine(_norm(n))]
        _download(wanted + EXTRA_NO_DEPS, deps, deps=False)
        (deps / ".done").write_text("ok\n")
    if not (DL / "spec" / ".done").exists():
        for req in SPECULATORS:  # one at a time: pip treats one command as one environment
            _download([req], DL / "spec", deps=False)
        (DL / "spec" / ".done").write_text("ok\n")
    ours = DL / "ours"
    shutil.rmtree(ours, ignore_errors=True)  # always rebuilt: the working tree changes
    _pip("wheel", "-q", "--no-deps", "--disable-pip-version-check", "-w", str(ours), str(ROOT))

    for d in (wheels, spec):
        shutil.rmtree(d, ignore_errors=True)
        d.mkdir(parents=True)
    for w in sorted(ours.glob("*.whl")):
        shutil.copy2(w, wheels / w.name)
    for w in sorted((DL / "spec").glob("*.whl")):
        shutil.copy2(w, spec / w.name)

    # The dependencies are installed here (pip --target for the machine's Python and
    # platform) and carried as one tar.xz: 78 MB of wheels become 42 MB, one part fewer.
    deps_wheels = sorted(w for w in deps.glob("*.whl") if not _on_machine(_wheel_project(w.name)))
    key = hashlib.sha256("\n".join(w.name for w in deps_wheels).encode()).hexdigest()[:16]
    site_xz = STAGE / "site.tar.xz"
    site_key = STAGE / "site.key"
    if not (site_xz.exists() and site_key.exists() and site_key.read_text() == key):
        tgt = DL / "site"
        shutil.rmtree(tgt, ignore_errors=True)
        _pip("install", "-q", "--no-deps", "--no-index", "--no-compile",
             "--disable-pip-version-check", "--target", str(tgt), *PIP_TARGET,
             *map(str, deps_wheels))
        shutil.rmtree(tgt / "bin", ignore_errors=True)  # console scripts: not used
        print(f"packing {len(deps_wheels)} installed dependencies (xz, a few minutes) ...",
              flush=True)
        tmp = site_xz.with_suffix(".tmp")
        with lzma.open(tmp, "wb", preset=6) as xz, tarfile.open(fileobj=xz, mode="w") as tar:
            for p in sorted(tgt.iterdir()):
                tar.add(p, arcname=p.name)
        tmp.rename(site_xz)
        site_key.write_text(key)
        shutil.rmtree(tgt, ignore_errors=True)
    print(f"dependencies: {len(deps_wheels)} wheels -> site.tar.xz "
          f"{site_xz.stat().st_size / 1e6:.1f} MB", flush=True)


def _pack() -> list[Path]:
    """One uncompressed tar of the stage (its members are compressed), split into parts."""
    manifest = {}
    members = sorted(p for p in STAGE.rglob("*") if p.is_file() and p.suffix != ".key")
    h = hashlib.sha256()
    for p in members:
        rel = p.relative_to(STAGE).as_posix()
        manifest[rel] = p.stat().st_size
        h.update(rel.encode())
        h.update(hashlib.sha256(p.read_bytes()).digest())
    digest = h.hexdigest()[:16]
    stamp = PARTS / "kit.json"
    if stamp.exists() and json.loads(stamp.read_text()).get("digest") == digest:
        return sorted(PARTS.glob("kit.part*"))
    shutil.rmtree(PARTS, ignore_errors=True)
    PARTS.mkdir(parents=True)
    bundle = KIT / "kit.tar"
    with tarfile.open(bundle, "w") as tar:
        for p in members:
            tar.add(p, arcname=p.relative_to(STAGE).as_posix())
    parts = []
    with open(bundle, "rb") as f:
        i = 0
        while chunk := f.read(PART_SIZE):
            part = PARTS / f"kit.part{i:02d}"
            part.write_bytes(chunk)
            parts.append(part)
            i += 1
    total = bundle.stat().st_size
    stamp.write_text(json.dumps({"digest": digest, "parts": [p.name for p in parts],
                                 "bytes": total,
                                 "sha256": hashlib.sha256(bundle.read_bytes()).hexdigest(),
                                 "members": manifest}, indent=1) + "\n")
    bundle.unlink()
    return parts


def build(args) -> None:
    KIT.mkdir(exist_ok=True)
    whl = _vllm_wheel()
    _build_vllm(whl)
    _build_wheels(whl)
    parts = _pack()
    for p in parts:
        print(f"{p.relative_to(ROOT)}  {p.stat().st_size / 1e6:.1f} MB")
    plan(args)


def plan(args) -> None:
    parts = sorted(PARTS.glob("kit.part*"))
    if not parts:
        sys.exit("no parts: run `python3 tools/gpu_kit.py build` first")
    print("\nDevice calls (back to back: the machine stays warm 30 s after a call):")
    for i, p in enumerate(parts):
        rel = p.relative_to(ROOT).as_posix()
        cmd = f"python3 tools/gpu_kit.py stash {rel}"
        if i == len(parts) - 1:  # stash, install, run the matrix (see docs/gpu.md)
            cmd = f"bash tools/gpu_run.sh {rel} -- --tp2 --parallel 16"
        print(f"  call {i + 1}: carry=[{rel!r}, '.gpu-kit/parts/kit.json'] command: {cmd}")


# --------------------------------------------------------------------------- device side
def stash(args) -> None:
    DEV_KIT.mkdir(parents=True, exist_ok=True)
    for src in args.parts:
        shutil.copy(src, DEV_KIT / Path(src).name)
    meta = PARTS / "kit.json"
    if meta.exists():
        shutil.copy(meta, DEV_KIT / "kit.json")
    print("stashed:", sorted(p.name for p in DEV_KIT.glob("kit.part*")), flush=True)


def install(args) -> None:
    done = DEV_SITE / ".gpu-kit-installed"
    meta = json.loads((DEV_KIT / "kit.json").read_text())
    if done.exists() and done.read_text().strip() == meta["digest"]:
        print(f"kit {meta['digest']} already installed in {DEV_SITE}")
        return
    missing = [p for p in meta["parts"] if not (DEV_KIT / p).exists()]
    if missing:
        sys.exit(f"parts not stashed yet: {missing}")
    h = hashlib.sha256()
    bundle = DEV_KIT / "kit.tar"
    with open(bundle, "wb") as out:
        for p in meta["parts"]:
            data = (DEV_KIT / p).read_bytes()
            h.update(data)
            out.write(data)
    if h.hexdigest() != meta["sha256"]:
        sys.exit("kit parts do not add up (sha256 mismatch): carry them again")
    stage = DEV_KIT / "stage"
    shutil.rmtree(stage, ignore_errors=True)
    with tarfile.open(bundle) as tar:
        tar.extractall(stage)
    bundle.unlink()
    shutil.rmtree(DEV_SITE, ignore_errors=True)
    DEV_SITE.mkdir(parents=True)
    print("extracting dependencies ...", flush=True)
    with lzma.open(stage / "site.tar.xz") as xz, tarfile.open(fileobj=xz) as tar:
        tar.extractall(DEV_SITE)
    wheels = sorted(str(p) for p in (stage / "wheels").glob("*.whl"))  # ours
    _pip("install", "-q", "--no-index", "--no-deps", "--no-cache-dir", "--upgrade",
         "--disable-pip-version-check", "--target", str(DEV_SITE), *wheels)
    for w in sorted((stage / "spec").glob("*.whl")):
        ver = w.name.split("-")[1]
        _pip("install", "-q", "--no-index", "--no-deps", "--no-cache-dir", "--upgrade",
             "--disable-pip-version-check", "--target", str(DEV_KIT.parent / f"spec-{ver}"),
             str(w))
    print("extracting vllm ...", flush=True)
    with lzma.open(stage / "vllm-slim.tar.xz") as xz, tarfile.open(fileobj=xz) as tar:
        tar.extractall(DEV_SITE)
    with lzma.open(stage / "fa3.so.xz") as xz, \
            open(DEV_SITE / "vllm/vllm_flash_attn/_vllm_fa3_C.abi3.so", "wb") as f:
        shutil.copyfileobj(xz, f)
    shutil.rmtree(stage, ignore_errors=True)
    done.write_text(meta["digest"] + "\n")
    print(f"installed kit {meta['digest']} into {DEV_SITE}; speculators in "
          f"{DEV_KIT.parent}/spec-<version>", flush=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    sub.add_parser("build", help="download, slim, pack and split (here)").set_defaults(fn=build)
    sub.add_parser("plan", help="print the device calls (here)").set_defaults(fn=plan)
    s = sub.add_parser("stash", help="copy carried parts out of the checkout (device)")
    s.add_argument("parts", nargs="+")
    s.set_defaults(fn=stash)
    sub.add_parser("install", help="assemble and install the kit (device)").set_defaults(
        fn=install)
    a = p.parse_args()
    a.fn(a)


if __name__ == "__main__":
    main()
