#!/usr/bin/env python3
"""Build, carry and install the kit that runs real vLLM 0.26.0 or 0.34.0 on the lent H200.

The device machine (Python 3.12, torch 2.11.0+cu130, transformers 5.17) has no vLLM and no
network, and one call of the device tool carries at most 64 MiB. This tool packs what is
missing into parts of at most 58 MB under ``.gpu-kit/`` (git-ignored: nothing of the kit is
committed), which consecutive device calls carry one by one; the last call installs.

Here (any machine with pip and network)::

    python3 tools/gpu/gpu_kit.py build [--vllm 0.34.0]   # idempotent; downloads are cached
    python3 tools/gpu/gpu_kit.py plan [--vllm 0.34.0]    # the device commands, one per call

On the device (stdlib only; run by the commands ``plan`` prints)::

    python3 tools/gpu/gpu_kit.py stash .gpu-kit/parts/kit.part00   # copy a part out of the checkout
    python3 tools/gpu/gpu_kit.py install                           # assemble, extract, pip install
    python3 tools/gpu/gpu_kit.py smoke                             # check the installed kit

``install`` installs whichever kit ``kit.json`` describes. What the 0.26.0 kit
(``.gpu-kit/parts/``) holds (see docs/gpu.md for why):

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

The 0.34.0 kit (``.gpu-kit/0.34.0/parts/``) carries torch 2.14.0 as well, as slimmed
wheels (``torch.zip``, ``vllm.zip``) and ``site.zip``, an NCCL stub library, and two
fallback part sets (``triton``, ``nccl``) carried only when needed: see the section
"vLLM 0.34.0" below and docs/gpu.md.
"""

from __future__ import annotations

import argparse
import copy
import hashlib
import io
import json
import lzma
import os
import re
import shutil
import struct
import subprocess
import sys
import tarfile
import tempfile
import time
import zipfile
import zlib
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import fatbin_prune  # noqa: E402  (tools/gpu/fatbin_prune.py, beside this file)

ROOT = Path(__file__).resolve().parents[2]
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
    if project == "nvidia-cudnn-frontend" or project.startswith("nvidia-cutlass-dsl"):
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


def _vllm_requirements(whl: Path, skip: re.Pattern = SKIP_REQS) -> list[str]:
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
        if not skip.match(name):
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


def _pack(stage: Path = STAGE, parts_dir: Path = PARTS, name: str = "kit",
          extra: dict | None = None) -> list[Path]:
    """One uncompressed tar of ``stage`` (its members are compressed), split into parts
    ``<name>.partNN`` beside ``<name>.json`` (digest, sha256, members; ``extra`` is merged
    in). Other part sets in ``parts_dir`` are left alone."""
    manifest = {}
    members = sorted(p for p in stage.rglob("*") if p.is_file() and p.suffix != ".key")
    h = hashlib.sha256()
    for p in members:
        rel = p.relative_to(stage).as_posix()
        manifest[rel] = p.stat().st_size
        h.update(rel.encode())
        h.update(_file_sha256(p))
    digest = h.hexdigest()[:16]
    stamp = parts_dir / f"{name}.json"
    if stamp.exists() and json.loads(stamp.read_text()).get("digest") == digest and all(
            (parts_dir / n).exists() for n in json.loads(stamp.read_text())["parts"]):
        return sorted(parts_dir.glob(f"{name}.part*"))
    parts_dir.mkdir(parents=True, exist_ok=True)
    for old in [*parts_dir.glob(f"{name}.part*"), stamp]:
        old.unlink(missing_ok=True)
    bundle = parts_dir.parent / f"{name}.tar"
    with tarfile.open(bundle, "w") as tar:
        for p in members:
            tar.add(p, arcname=p.relative_to(stage).as_posix())
    parts = []
    whole = hashlib.sha256()
    with open(bundle, "rb") as f:
        i = 0
        while chunk := f.read(PART_SIZE):
            whole.update(chunk)
            part = parts_dir / f"{name}.part{i:02d}"
            part.write_bytes(chunk)
            parts.append(part)
            i += 1
    total = bundle.stat().st_size
    stamp.write_text(json.dumps({"digest": digest, "parts": [p.name for p in parts],
                                 "bytes": total, "sha256": whole.hexdigest(),
                                 "members": manifest, **(extra or {})}, indent=1) + "\n")
    bundle.unlink()
    return parts


def _file_sha256(path: Path) -> bytes:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 24):
            h.update(chunk)
    return h.digest()


# --------------------------------------------------------------------------- vLLM 0.34.0
# vLLM 0.34.0 pins torch 2.14.0; the machine has torch 2.11.0. The kit therefore carries
# torch 2.14.0 itself (in the kit's site, which comes first on PYTHONPATH and so shadows the
# image's torch), and relies on the image for everything torch loads from nvidia-* wheels.
# Measured on the machine (2026-12-02, dlsym): of every NCCL / cuDNN / cuBLAS / cusparseLt /
# cuFile / cudart symbol torch 2.14 and vLLM 0.34 need, only eleven NCCL symbols are missing
# from the image's NCCL 2.28.9 (torch pins 2.30.7). libtorch_cuda.so binds them at load, so
# a tiny stub library defines them (preloaded; a single GPU never calls them), and torch's
# cuDNN version check (built with 9.24, image 9.19) is skipped by its own switch. Triton 3.8
# (the image has 3.6) and the real NCCL 2.32.3 are built as separate fallback part sets.
R34 = KIT / "0.34.0"
DL34 = R34 / "dl"
STAGE34 = R34 / "stage"        # the primary kit
PARTS34 = R34 / "parts"        # kit.partNN, triton.partNN, nccl.partNN and their json
VLLM34 = "vllm==0.34.0"
# CuTe DSL: vLLM 0.34's kernel warm-up imports the MiniMax-M3 sparse-attention module on
# every CUDA platform, and that imports ``cutlass`` (seen on the H200, 2026-12-03:
# "No module named 'cutlass'" in every worker). The CUDA 13 libraries only (the cu12 ones
# are the default extra, not needed here). Its wheel adds ``dsl_packages`` to sys.path
# with a .pth file, which a PYTHONPATH folder does not read: ``install`` links the folder's
# entries into the site instead.
CUTLASS34 = ["nvidia-cutlass-dsl==4.8.0", "nvidia-cutlass-dsl-libs-base==4.8.0",
             "nvidia-cutlass-dsl-libs-core==4.8.0", "nvidia-cutlass-dsl-libs-cu13==4.8.0",
             # the same module imports QuACK's kernels too ("No module named 'quack'")
             "quack-kernels==0.6.5"]
TORCH34 = "torch==2.14.0"
FALLBACKS = {"triton": "triton==3.8.0", "nccl": "nvidia-nccl-cu13==2.32.3"}
# flashinfer-python 0.7.3 (vLLM's pin) is not on the registry: 0.7.4. torchvision 0.29.0 is
# vLLM's pin for torch 2.14 (the image's torchvision is built for torch 2.11).
# datasets 5.2.0: 4.x requires huggingface_hub < 2 and imports torchvision.io.VideoReader,
# which torchvision 0.29 no longer has (speculators' token-frequency count failed with an
# ImportError, 2026-12-04); 5.x catches that import, and 5.2.0 allows huggingface_hub 2.
EXTRA_NO_DEPS34 = ["transformers==5.20.2", "huggingface-hub==2.4.0", "nvtx==0.2.15",
                   "cuda-tile", "torchvision==0.29.0",
                   "datasets==5.2.0", "multiprocess==0.70.18", *CUTLASS34]
# Left out of the 0.34 kit (101 + 12 MB of wheels): vLLM imports flashinfer only in its
# FlashInfer attention backends and in models this kit does not run; without it vLLM picks
# FLASH_ATTN (Llama) / FLASH_ATTN_MLA (DeepSeek) on Hopper and samples with PyTorch.
LEAVE_OUT34 = {"flashinfer-python", "nvidia-cudnn-frontend"}
# Projects the image has, but in a release vLLM 0.34 refuses (tokenizers 0.23.2 < 0.23.3)
# or built for the image's torch: carried anyway.
# transformers 5.20.2 + huggingface_hub 2.4.0: the pair the vLLM 0.34 contract env runs
# (vLLM 0.34 requires huggingface_hub >= 2.0; the image has 1.33 beside transformers 5.17).
FORCE34 = {"tokenizers", "torchvision", "transformers", "huggingface-hub"}
PINNED34 = {"transformers", "huggingface-hub"}  # taken from EXTRA_NO_DEPS34, not resolved
SKIP_REQS34 = re.compile(SKIP_REQS.pattern.replace("^(", "^(instanttensor|", 1), re.I)
# Trees are carried as slimmed wheels (``<name>.zip``): the kept members' deflate data is
# copied from the wheel as it is, not recompressed. Measured here (2 cores shared with other
# jobs, load ~10, 2026-12-02): xz at preset 1 ran at ~0.3 MB/s of input per process, and
# ~330 MB of libtorch_cuda.so (CUDA fatbins) do not compress at all; xz would save ~2 parts
# of ~13 for ~1.7 GB of input. The device extracts the members in parallel threads.
# libtorch_cpu.so is recompressed with LZMA preset 0 (measured on 8 MB of it: 13.6 % at
# 5 MB/s; deflate in the wheel: 27 %), one part fewer.
RELZMA_PRESET = 0
#: The H200's architecture: the only device code the 0.34 kit's libraries keep (every other
#: architecture's cubins are blanked: libtorch_cuda.so 503 MB -> 65 MB as xz, measured
#: 2026-12-02).
PRUNE_KEEP = {90}
PRUNE_MIN_BYTES = 8_000_000
TORCH_RELZMA = ("torch/lib/libtorch_cpu.so",)
ZIP_LEVEL = 6  # the installed dependencies (``site.zip``), compressed here with zlib
STUB_SYMBOLS = ["ncclCommGetUniqueId", "ncclCommGrow", "ncclCommMemStats", "ncclCommResume",
                "ncclCommSuspend", "ncclGetLsaMultimemDevicePointer",
                "ncclGetPeerDevicePointer", "ncclPutSignal", "ncclSignal", "ncclWaitSignal",
                "ncclWinGetUserPtr"]
STUB_NAME = "libnccl_compat_stub.so"


def _drop_from_torch(name: str) -> bool:
    """protoc (a code generator torch ships, not imported) is the only part left out."""
    return name.startswith("torch/bin/protoc")


def _drop_from_vllm34(name: str) -> bool:
    """As for 0.26 (FA2, vllm-rs, DeepGEMM for other Pythons); FA3 stays inside the tree."""
    if name.startswith("vllm/vllm_flash_attn/_vllm_fa2_C") or name == "vllm/vllm-rs":
        return True
    return bool(re.match(r"vllm/third_party/deep_gemm/_C\.cpython-3(10|11|13|14)-", name))


def _drop_from_triton(name: str) -> bool:
    """Blackwell-only tools, static libraries, profiler libraries, test libraries. The AMD
    backend stays (3 MB): triton imports every backend its entry points name."""
    return (name.startswith(("triton/backends/nvidia/lib/cupti-blackwell/",
                             "triton/backends/nvidia/bin/ptxas-blackwell"))
            or name == "triton/FileCheck"  # LLVM's test tool
            or name.endswith("_static.a") or "/libnvperf" in name
            or "TestLib" in name)


def _keep_nccl(name: str) -> bool:
    return name == "nvidia/nccl/lib/libnccl.so.2"


def _prunable(info: zipfile.ZipInfo) -> bool:
    """Shared libraries large enough to hold CUDA fat binaries worth blanking."""
    name = info.filename.rsplit("/", 1)[-1]
    return info.file_size > PRUNE_MIN_BYTES and (name.endswith(".so") or ".so." in name)


def _slim_wheel(whl: Path, keep, out: Path, tag: str, relzma: tuple[str, ...] = (),
                prune: bool = False) -> Path:
    """Write ``out``: a zip of the members of ``whl`` that ``keep`` accepts, their
    compressed bytes copied unchanged, except the members named in ``relzma``, which are
    recompressed with LZMA (zip method 14, which Python's zipfile reads), and, with
    ``prune``, the shared libraries whose fat binaries hold device code for other GPUs than
    the H200's sm_90 (``tools/gpu/fatbin_prune.py``: blanked, then recompressed with LZMA);
    CRCs checked afterwards."""
    key = out.with_suffix(".key")
    tag = f"{tag} {RELZMA_PRESET} {','.join(relzma)} prune={sorted(PRUNE_KEEP) if prune else 0}"
    if out.exists() and key.exists() and key.read_text() == f"{whl.name} {tag}":
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".tmp")
    with zipfile.ZipFile(whl) as src, open(whl, "rb") as raw, \
            zipfile.ZipFile(tmp, "w") as dst:
        for info in src.infolist():
            if info.is_dir() or not keep(info.filename):
                continue
            if info.flag_bits & 0x08:
                raise SystemExit(f"{whl.name}: {info.filename} has a data descriptor")
            if info.filename in relzma:
                _write_lzma_member(dst, info, src.read(info))
                continue
            if prune and _prunable(info):
                data = bytearray(src.read(info))
                blanked = fatbin_prune.blanked_bytes(fatbin_prune.prune_buffer(data, PRUNE_KEEP))
                if blanked:
                    print(f"  {info.filename}: {blanked / 1e6:.0f} MB of other GPUs' code "
                          "blanked", flush=True)
                    _write_lzma_member(dst, info, bytes(data))
                    continue
            raw.seek(info.header_offset)  # local header, name, extra field, data
            head = raw.read(30)
            name_len, extra_len = struct.unpack("<HH", head[26:30])
            rest = raw.read(name_len + extra_len + info.compress_size)
            new = copy.copy(info)
            new.header_offset = dst.fp.tell()
            dst.fp.write(head + rest)
            dst.filelist.append(new)
            dst.NameToInfo[new.filename] = new
            dst.start_dir = dst.fp.tell()
    with zipfile.ZipFile(tmp) as z:
        bad = z.testzip()
        if bad:
            raise SystemExit(f"{tmp}: {bad} does not check out")
    tmp.rename(out)
    key.write_text(f"{whl.name} {tag}")
    print(f"{out.name}: {out.stat().st_size / 1e6:.1f} MB (from {whl.name}, "
          f"{whl.stat().st_size / 1e6:.1f} MB)", flush=True)
    return out


def _write_lzma_member(dst: zipfile.ZipFile, info: zipfile.ZipInfo, data: bytes) -> None:
    """Append ``data`` as an LZMA member: zip's LZMA data is a 4-byte header (version,
    properties size), the LZMA1 properties, then the raw LZMA1 stream."""
    t0 = time.time()
    filt = {"id": lzma.FILTER_LZMA1, "preset": RELZMA_PRESET}
    comp = lzma.compress(data, format=lzma.FORMAT_RAW, filters=[filt])
    props = lzma._encode_filter_properties(filt)
    blob = struct.pack("<BBH", 9, 4, len(props)) + props + comp
    new = copy.copy(info)
    new.compress_type = zipfile.ZIP_LZMA
    new.compress_size = len(blob)
    new.file_size = len(data)
    new.CRC = zlib.crc32(data)
    new.flag_bits = 0x02  # LZMA: end-of-stream marker present
    new.extra = b""
    new.header_offset = dst.fp.tell()
    dst.fp.write(new.FileHeader(zip64=False) + blob)
    dst.filelist.append(new)
    dst.NameToInfo[new.filename] = new
    dst.start_dir = dst.fp.tell()
    print(f"  {info.filename}: {len(data) / 1e6:.0f} MB -> lzma {len(blob) / 1e6:.1f} MB "
          f"(deflate {info.compress_size / 1e6:.1f} MB), {time.time() - t0:.0f} s", flush=True)


def _zip_dir(root: Path, out: Path) -> None:
    with zipfile.ZipFile(out.with_suffix(".tmp"), "w", zipfile.ZIP_DEFLATED,
                         compresslevel=ZIP_LEVEL) as z:
        for p in sorted(root.rglob("*")):
            if p.is_file() and not p.is_symlink():
                z.write(p, p.relative_to(root).as_posix())
    out.with_suffix(".tmp").rename(out)


def _key(*items) -> str:
    return hashlib.sha256(repr(items).encode()).hexdigest()[:16]


def _wheel(dest: Path, req: str) -> Path:
    name, ver = req.split("==")
    pat = f"{name.replace('-', '_')}-{ver}-*.whl"
    found = sorted(dest.glob(pat)) if dest.exists() else []
    if not found:
        _download([req], dest, deps=False)
        found = sorted(dest.glob(pat))
    return found[0]


def _build_stub(stage: Path) -> None:
    """Compile the NCCL stub: each missing symbol returns ncclInvalidUsage (5)."""
    src = "".join(f"int {s}(void) {{ return 5; }}\n" for s in STUB_SYMBOLS)
    out = stage / "lib" / STUB_NAME
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as d:
        c = Path(d) / "stub.c"
        c.write_text("/* NCCL symbols torch 2.14 binds but a single GPU never calls;\n"
                     " * every one returns ncclInvalidUsage. */\n" + src)
        tmp = Path(d) / STUB_NAME
        subprocess.run(["gcc", "-O2", "-shared", "-fPIC", "-Wl,-soname," + STUB_NAME,
                        "-o", str(tmp), str(c)], check=True)
        nm = subprocess.run(["nm", "-D", "--defined-only", str(tmp)], check=True,
                            capture_output=True, text=True).stdout
        missing = [s for s in STUB_SYMBOLS if f" T {s}\n" not in nm + "\n"]
        if missing:
            sys.exit(f"stub lacks {missing}")
        if not out.exists() or out.read_bytes() != tmp.read_bytes():
            shutil.copy2(tmp, out)


def _replace_pinned(deps: Path, pins: list[str]) -> None:
    """Download the ``name==version`` pins into ``deps`` and delete the wheels of the same
    projects at other versions."""
    exact = {_norm(r.split("==")[0]): r.split("==")[1] for r in pins if "==" in r}
    for wheel in deps.glob("*.whl"):
        project = _wheel_project(wheel.name)
        if project in exact and wheel.name.split("-")[1] != exact[project]:
            wheel.unlink()
    _download(pins, deps, deps=False)


def _build_site34(vllm_whl: Path) -> Path:
    """vLLM 0.34's dependencies the image lacks, installed for the machine's Python."""
    deps = DL34 / "deps"
    done = deps / ".done"
    if not done.exists():
        resolved = _resolve(vllm_whl, SKIP_REQS34, DL34, "2.14.0")
        wanted = [f"{n}=={v}" for n, v in resolved
                  if (not _on_machine(_norm(n)) or _norm(n) in FORCE34)
                  and _norm(n) not in PINNED34]
        _download(wanted + EXTRA_NO_DEPS34, deps, deps=False)
        done.write_text("\n".join(EXTRA_NO_DEPS34) + "\n")
    elif done.read_text().split() != EXTRA_NO_DEPS34:
        # a pin changed since the download: the pinned wheels again, other versions of
        # those projects removed (one wheel per project goes into the site)
        _replace_pinned(deps, EXTRA_NO_DEPS34)
        done.write_text("\n".join(EXTRA_NO_DEPS34) + "\n")
    deps_wheels = sorted(w for w in deps.glob("*.whl") if (not _on_machine(
        _wheel_project(w.name)) or _wheel_project(w.name) in FORCE34)
        and _wheel_project(w.name) not in LEAVE_OUT34)
    key = _key("site", [w.name for w in deps_wheels], ZIP_LEVEL)
    out = STAGE34 / "site.zip"
    if out.exists() and (STAGE34 / "site.key").exists() and (
            STAGE34 / "site.key").read_text() == key:
        return out
    tgt = DL34 / "site"
    shutil.rmtree(tgt, ignore_errors=True)
    _pip("install", "-q", "--no-deps", "--no-index", "--no-compile",
         "--disable-pip-version-check", "--target", str(tgt), *PIP_TARGET,
         *map(str, deps_wheels))
    shutil.rmtree(tgt / "bin", ignore_errors=True)  # console scripts: not used
    print(f"dependencies: {len(deps_wheels)} wheels: "
          + " ".join(w.name.split("-")[0] + "-" + w.name.split("-")[1] for w in deps_wheels),
          flush=True)
    _zip_dir(tgt, out)
    (STAGE34 / "site.key").write_text(key)
    print(f"site.zip: {out.stat().st_size / 1e6:.1f} MB", flush=True)
    shutil.rmtree(tgt, ignore_errors=True)
    return out


def _resolve(whl: Path, skip: re.Pattern, dl: Path, torch_stub: str) -> list[tuple[str, str]]:
    """vLLM's Requires-Dist (minus ``skip``) + PINNED, resolved from metadata only. The
    packages that depend on torch see a metadata-only stand-in of ``torch_stub`` (no
    dependencies): the real torch 2.14 pins nvidia-nccl-cu13 2.30.7, which the registry
    does not serve, and resolving it would fetch the nvidia-* wheels."""
    stubs = dl / "stub-wheels"
    stubs.mkdir(parents=True, exist_ok=True)
    ver = f"{torch_stub}+kitstub"
    di = f"torch-{ver}.dist-info"
    with zipfile.ZipFile(stubs / f"torch-{ver}-py3-none-any.whl", "w") as z:
        z.writestr(f"{di}/METADATA", f"Metadata-Version: 2.1\nName: torch\nVersion: {ver}\n")
        z.writestr(f"{di}/WHEEL", "Wheel-Version: 1.0\nGenerator: gpu_kit\n"
                   "Root-Is-Purelib: true\nTag: py3-none-any\n")
        z.writestr(f"{di}/RECORD", "")
    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as f:
        f.write("\n".join(_vllm_requirements(whl, skip) + PINNED + [f"torch=={ver}"]) + "\n")
        reqs = f.name
    report = dl / "deps-report.json"
    _pip("install", "--dry-run", "--ignore-installed", "-q", "--disable-pip-version-check",
         "--report", str(report), "--target", str(dl / "dry-run-target"), *PIP_TARGET,
         "--find-links", str(stubs), "-r", reqs)
    return [(i["metadata"]["name"], i["metadata"]["version"])
            for i in json.loads(report.read_text())["install"]]


def build34(args) -> None:
    torch_whl = _wheel(DL34 / "torch", TORCH34)
    vllm_whl = _wheel(DL34 / "vllm", VLLM34)
    STAGE34.mkdir(parents=True, exist_ok=True)
    _build_stub(STAGE34)
    _slim_wheel(torch_whl, lambda n: not _drop_from_torch(n), STAGE34 / "torch.zip",
                "drop-protoc", TORCH_RELZMA, prune=True)
    _slim_wheel(vllm_whl, lambda n: not _drop_from_vllm34(n), STAGE34 / "vllm.zip",
                "drop-fa2-rs-dg", prune=True)
    _build_site34(vllm_whl)
    _stage_wheels(STAGE34)
    expect = {"vllm": "0.34.0", "torch": "2.14.0"}
    parts = _pack(STAGE34, PARTS34, "kit", {"vllm": "0.34.0", "layout": "zips",
                                            "expect": expect})
    sets = {"kit": parts}
    for name, req in FALLBACKS.items():
        whl = _wheel(DL34 / name, req)
        stage = R34 / f"stage-{name}"
        keep = _keep_nccl if name == "nccl" else (lambda n: not _drop_from_triton(n))
        _slim_wheel(whl, keep, stage / f"{name}.zip", "v3", prune=True)
        ver = req.split("==")[1]
        sets[name] = _pack(stage, PARTS34, name, {"vllm": "0.34.0", "layout": "zips",
                                                  "fallback": name,
                                                  "expect": {name: ver}})
    for name, ps in sets.items():
        total = sum(p.stat().st_size for p in ps)
        print(f"{name}: {len(ps)} parts, {total / 1e6:.1f} MB: "
              + ", ".join(f"{p.name} {p.stat().st_size / 1e6:.1f} MB" for p in ps))
    plan(args)


def _stage_wheels(stage: Path) -> None:
    """Our wheel (always rebuilt: the working tree changes) and the speculators wheels."""
    if not (DL / "spec" / ".done").exists():
        for req in SPECULATORS:  # one at a time: pip treats one command as one environment
            _download([req], DL / "spec", deps=False)
        (DL / "spec" / ".done").write_text("ok\n")
    ours = DL / "ours"
    shutil.rmtree(ours, ignore_errors=True)
    _pip("wheel", "-q", "--no-deps", "--disable-pip-version-check", "-w", str(ours), str(ROOT))
    for sub, src in (("wheels", ours), ("spec", DL / "spec")):
        d = stage / sub
        shutil.rmtree(d, ignore_errors=True)
        d.mkdir(parents=True)
        for w in sorted(src.glob("*.whl")):
            shutil.copy2(w, d / w.name)


def build(args) -> None:
    KIT.mkdir(exist_ok=True)
    if args.vllm == "0.34.0":
        build34(args)
        return
    whl = _vllm_wheel()
    _build_vllm(whl)
    _build_wheels(whl)
    parts = _pack()
    for p in parts:
        print(f"{p.relative_to(ROOT)}  {p.stat().st_size / 1e6:.1f} MB")
    plan(args)


def plan(args) -> None:
    if args.vllm == "0.34.0":
        plan34(args)
        return
    parts = sorted(PARTS.glob("kit.part*"))
    if not parts:
        sys.exit("no parts: run `python3 tools/gpu/gpu_kit.py build` first")
    print("\nDevice calls (back to back: the machine stays warm 30 s after a call):")
    for i, p in enumerate(parts):
        rel = p.relative_to(ROOT).as_posix()
        cmd = f"python3 tools/gpu/gpu_kit.py stash {rel}"
        if i == len(parts) - 1:  # stash, install, run the matrix (see docs/gpu.md)
            cmd = f"bash tools/gpu/gpu_run.sh {rel} -- --tp2 --parallel 16"
        print(f"  call {i + 1}: carry=[{rel!r}, '.gpu-kit/parts/kit.json'] command: {cmd}")


def plan34(args) -> None:
    sets = {n: sorted(PARTS34.glob(f"{n}.part*")) for n in ("kit", *FALLBACKS)}
    if not sets["kit"]:
        sys.exit("no parts: run `python3 tools/gpu/gpu_kit.py build --vllm 0.34.0` first")

    def carry(p: Path) -> str:
        rel = p.relative_to(ROOT).as_posix()
        meta = (p.parent / (p.name.split(".part")[0] + ".json")).relative_to(ROOT).as_posix()
        return f"carry=[{rel!r}, {meta!r}]"

    def size(ps):
        return f"{len(ps)} parts, {sum(p.stat().st_size for p in ps) / 1e6:.0f} MB"

    n = 0
    print(f"\nDevice calls for the vLLM 0.34.0 kit ({size(sets['kit'])}), back to back "
          "(the machine stays warm 30 s after a call):")
    for i, p in enumerate(sets["kit"]):
        n += 1
        rel = p.relative_to(ROOT).as_posix()
        cmd = f"python3 tools/gpu/gpu_kit.py stash {rel}"
        if i == len(sets["kit"]) - 1:  # stash, install, smoke test
            cmd += " && python3 tools/gpu/gpu_kit.py install && python3 tools/gpu/gpu_kit.py smoke"
        print(f"  call {n}: {carry(p)} command: {cmd}")
    print(f"  call {n + 1}: carry=[] command: bash tools/gpu/gpu_run.sh -- --tp2 --parallel 16"
          "   (or gpu_bench.sh / gpu_models.sh: the preamble applies the kit's environment)")
    for name, ps in sets.items():
        if name == "kit" or not ps:
            continue
        why = ("the smoke test fails in 'triton kernel' or a vLLM / inductor Triton import"
               if name == "triton" else
               "the smoke test fails in 'nccl one rank' or 'cuda', or a run fails in NCCL")
        print(f"\nFallback {name} ({size(ps)}; only if {why}), same machine, after the kit:")
        for i, p in enumerate(ps):
            rel = p.relative_to(ROOT).as_posix()
            cmd = f"python3 tools/gpu/gpu_kit.py stash {rel}"
            if i == len(ps) - 1:
                cmd += (f" && python3 tools/gpu/gpu_kit.py install --with {name}"
                        " && python3 tools/gpu/gpu_kit.py smoke")
            print(f"  {carry(p)} command: {cmd}")


# --------------------------------------------------------------------------- device side
def stash(args) -> None:
    """Copy carried parts to DEV_KIT with the ``<name>.json`` beside them; stashed parts of
    another kit of the same name (another digest) are removed first."""
    DEV_KIT.mkdir(parents=True, exist_ok=True)
    for src in args.parts:
        name = Path(src).name.split(".part")[0]
        meta = Path(src).parent / f"{name}.json"
        if meta.exists():
            dest = DEV_KIT / f"{name}.json"
            new = json.loads(meta.read_text())["digest"]
            if dest.exists() and json.loads(dest.read_text()).get("digest") != new:
                for old in DEV_KIT.glob(f"{name}.part*"):
                    old.unlink()
            shutil.copy(meta, dest)
        shutil.copy(src, DEV_KIT / Path(src).name)
    print("stashed:", sorted(p.name for p in DEV_KIT.glob("*.part*")), flush=True)


def install(args) -> None:
    meta = json.loads((DEV_KIT / "kit.json").read_text())
    if meta.get("layout") == "zips":
        _install_zips(args, meta)
        return
    done = DEV_SITE / ".gpu-kit-installed"
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


def _assemble(name: str) -> tuple[dict, Path]:
    """Check the stashed ``<name>.partNN`` against ``<name>.json`` and unpack the bundle."""
    meta = json.loads((DEV_KIT / f"{name}.json").read_text())
    missing = [p for p in meta["parts"] if not (DEV_KIT / p).exists()]
    if missing:
        sys.exit(f"parts not stashed yet: {missing}")
    h = hashlib.sha256()
    bundle = DEV_KIT / f"{name}.tar"
    with open(bundle, "wb") as out:
        for p in meta["parts"]:
            data = (DEV_KIT / p).read_bytes()
            h.update(data)
            out.write(data)
    if h.hexdigest() != meta["sha256"]:
        sys.exit(f"{name} parts do not add up (sha256 mismatch): carry them again")
    stage = DEV_KIT / f"stage-{name}"
    shutil.rmtree(stage, ignore_errors=True)
    with tarfile.open(bundle) as tar:
        tar.extractall(stage)
    bundle.unlink()
    return meta, stage


def _extract_zips(stage: Path, dest: Path) -> None:
    """Extract every ``*.zip`` of ``stage`` into ``dest``, members spread over threads
    (zlib releases the GIL), executable bits restored."""
    from concurrent.futures import ThreadPoolExecutor
    jobs = []
    for zf in sorted(stage.glob("*.zip")):
        with zipfile.ZipFile(zf) as z:
            jobs += [(zf, i.filename, i.file_size) for i in z.infolist() if not i.is_dir()]
    n = max(1, min(16, os.cpu_count() or 1))
    groups: list[list] = [[] for _ in range(n)]
    loads = [0] * n
    for job in sorted(jobs, key=lambda j: -j[2]):  # biggest first, to the least loaded
        k = loads.index(min(loads))
        groups[k].append(job)
        loads[k] += job[2]

    def one(group) -> int:
        opened: dict[Path, zipfile.ZipFile] = {}
        for zf, name, _ in group:
            if zf not in opened:  # one ZipFile per zip and thread (reads the directory once)
                opened[zf] = zipfile.ZipFile(zf)
            z = opened[zf]
            info = z.getinfo(name)
            path = z.extract(info, dest)
            if (info.external_attr >> 16) & 0o111:
                os.chmod(path, 0o755)
        for z in opened.values():
            z.close()
        return len(group)

    dest.mkdir(parents=True, exist_ok=True)
    # Every folder first, here: zipfile's extract() creates a member's folders without
    # exist_ok, so two threads extracting into one new folder race (FileExistsError).
    for folder in sorted({os.path.dirname(name) for _, name, _ in jobs} - {""}):
        (dest / folder).mkdir(parents=True, exist_ok=True)
    with ThreadPoolExecutor(n) as pool:
        done = sum(pool.map(one, groups))
    print(f"extracted {done} files from {len(list(stage.glob('*.zip')))} zips", flush=True)


def _env34(installed: set[str]) -> dict[str, str]:
    """The environment every process of the 0.34 kit needs (written to the site as
    ``.gpu-kit-env.sh`` / ``.json``; tools/gpu/gpu_preamble.sh sources it)."""
    nccl = DEV_SITE / "nvidia" / "nccl" / "lib"
    env = {"PYTORCH_SKIP_CUDNN_COMPATIBILITY_CHECK": "1",
           # The kit carries no FlashInfer; vLLM 0.34's sampler imports its backend unless
           # told not to use it ("No module named 'flashinfer'" in every worker).
           "VLLM_USE_FLASHINFER_SAMPLER": "0",
           "PYTHONPATH": str(DEV_SITE),
           # Reaches vLLM's spawned workers through the environment.
           "LD_PRELOAD": str(nccl / "libnccl.so.2") if "nccl" in installed
           else str(DEV_SITE / "_gpu_kit" / STUB_NAME)}
    if "nccl" in installed:
        env["LD_LIBRARY_PATH"] = str(nccl)
    env["GPU_KIT_ENV"] = ",".join(sorted(installed))
    return env


def _write_env(env: dict[str, str]) -> None:
    lines = [f'export GPU_KIT_ENV="{env["GPU_KIT_ENV"]}"']
    for k, v in env.items():
        if k == "GPU_KIT_ENV":
            continue
        if k in ("PYTORCH_SKIP_CUDNN_COMPATIBILITY_CHECK", "VLLM_USE_FLASHINFER_SAMPLER"):
            lines.append(f"export {k}={v}")
        else:  # prepended to what is there
            lines.append(f'export {k}="{v}${{{k}:+:${k}}}"')
    (DEV_SITE / ".gpu-kit-env.sh").write_text("\n".join(lines) + "\n")
    (DEV_SITE / ".gpu-kit-env.json").write_text(json.dumps(env, indent=1) + "\n")


def _link_dsl_packages(site: Path) -> None:
    """What the CuTe DSL's .pth file would put on sys.path, linked into the site (see
    :data:`CUTLASS34`)."""
    dsl = site / "nvidia_cutlass_dsl" / "dsl_packages"
    if not dsl.is_dir():
        return
    for entry in dsl.iterdir():
        link = site / entry.name
        if not link.exists():
            link.symlink_to(entry)


def _install_zips(args, meta: dict) -> None:
    """Install a zip-layout kit (vLLM 0.34) and whichever fallbacks are stashed."""
    done = DEV_SITE / ".gpu-kit-installed"
    if not (done.exists() and done.read_text().split() == [meta["digest"]]):
        _, stage = _assemble("kit")
        shutil.rmtree(DEV_SITE, ignore_errors=True)
        DEV_SITE.mkdir(parents=True)
        t0 = time.time()
        print("extracting torch, vllm, dependencies ...", flush=True)
        _extract_zips(stage, DEV_SITE)
        print(f"extracted in {time.time() - t0:.0f} s", flush=True)
        (DEV_SITE / "_gpu_kit").mkdir()
        shutil.copy2(stage / "lib" / STUB_NAME, DEV_SITE / "_gpu_kit" / STUB_NAME)
        _install_wheels(stage)
        _link_dsl_packages(DEV_SITE)
        shutil.rmtree(stage, ignore_errors=True)
        done.write_text(meta["digest"] + "\n")
        print(f"installed kit {meta['digest']} (vLLM {meta.get('vllm')}) into {DEV_SITE}",
              flush=True)
    else:
        print(f"kit {meta['digest']} already installed in {DEV_SITE}")
    wanted = [w for w in (args.with_ or "").split(",") if w]
    unknown = [w for w in wanted if w not in FALLBACKS]
    if unknown:
        sys.exit(f"unknown fallback {unknown}: choose from {sorted(FALLBACKS)}")
    installed = set()
    for name in FALLBACKS:
        mark = DEV_SITE / f".gpu-kit-{name}-installed"
        jf = DEV_KIT / f"{name}.json"
        if not jf.exists():
            if name in wanted:
                sys.exit(f"--with {name}: {name}.json not stashed (carry the {name} parts)")
            continue
        fmeta = json.loads(jf.read_text())
        if fmeta.get("vllm") != meta.get("vllm"):
            print(f"{name}.json belongs to the vLLM {fmeta.get('vllm')} kit; ignored",
                  flush=True)
            continue
        if mark.exists() and mark.read_text().strip() == fmeta["digest"]:
            installed.add(name)
            continue
        complete = all((DEV_KIT / p).exists() for p in fmeta["parts"])
        if not complete and name not in wanted:
            print(f"{name}: not all parts stashed; not installed", flush=True)
            continue
        _, stage = _assemble(name)
        if name == "triton":  # replaces the whole package, never a mix of two releases
            shutil.rmtree(DEV_SITE / "triton", ignore_errors=True)
        _extract_zips(stage, DEV_SITE)
        shutil.rmtree(stage, ignore_errors=True)
        mark.write_text(fmeta["digest"] + "\n")
        installed.add(name)
        print(f"installed fallback {name} {fmeta.get('expect')} into {DEV_SITE}", flush=True)
    _write_env(_env34(installed))
    print(f"environment: source {DEV_SITE}/.gpu-kit-env.sh (fallbacks: "
          f"{sorted(installed) or 'none'})", flush=True)


def _install_wheels(stage: Path) -> None:
    wheels = sorted(str(p) for p in (stage / "wheels").glob("*.whl"))  # ours
    _pip("install", "-q", "--no-index", "--no-deps", "--no-cache-dir", "--upgrade",
         "--disable-pip-version-check", "--target", str(DEV_SITE), *wheels)
    for w in sorted((stage / "spec").glob("*.whl")):
        ver = w.name.split("-")[1]
        _pip("install", "-q", "--no-index", "--no-deps", "--no-cache-dir", "--upgrade",
             "--disable-pip-version-check", "--target", str(DEV_KIT.parent / f"spec-{ver}"),
             str(w))


SMOKE_TRITON = '''
import torch, triton, triton.language as tl

@triton.jit
def add_one(x_ptr, n, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = i < n
    tl.store(x_ptr + i, tl.load(x_ptr + i, mask=m) + 1, mask=m)

def run():
    x = torch.zeros(1000, device="cuda")
    add_one[(4,)](x, 1000, BLOCK=256)
    torch.cuda.synchronize()
    assert float(x.sum()) == 1000.0, float(x.sum())
'''


def smoke(args) -> None:
    """Device: check the installed kit in this process (re-executed with the kit's
    environment when it is not applied yet): versions, CUDA, a matmul, NCCL on one rank,
    a Triton kernel, vLLM's V2 model runner module. Non-zero exit on any failure."""
    env_file = DEV_SITE / ".gpu-kit-env.json"
    if env_file.exists():
        env = json.loads(env_file.read_text())
        if os.environ.get("GPU_KIT_ENV") != env["GPU_KIT_ENV"]:
            new = dict(os.environ)
            for k, v in env.items():
                keep = k not in ("GPU_KIT_ENV", "PYTORCH_SKIP_CUDNN_COMPATIBILITY_CHECK",
                                 "VLLM_USE_FLASHINFER_SAMPLER")
                new[k] = v + (f":{new[k]}" if keep and new.get(k) else "")
            os.execve(sys.executable, [sys.executable, os.path.abspath(__file__), *sys.argv[1:]],
                      new)
    results: dict[str, object] = {}
    failed: list[str] = []

    def check(name, fn):
        try:
            results[name] = fn()
            print(f"ok    {name}: {results[name]}", flush=True)
        except BaseException as e:  # noqa: BLE001 - report every failure, then exit 1
            results[name] = f"FAIL {type(e).__name__}: {e}"
            failed.append(name)
            print(f"FAIL  {name}: {type(e).__name__}: {e}", flush=True)

    def versions():
        import importlib
        out = {}
        for mod in ("torch", "triton", "transformers", "tokenizers", "vllm", "flashinfer"):
            try:
                m = importlib.import_module(mod)
                out[mod] = f"{getattr(m, '__version__', '?')} ({Path(m.__file__).parent})"
            except Exception as e:  # noqa: BLE001
                out[mod] = f"import failed: {type(e).__name__}: {e}"
        return out

    def expected():
        import importlib
        meta = json.loads((DEV_KIT / "kit.json").read_text())
        for mod, ver in meta.get("expect", {}).items():
            got = importlib.import_module(mod).__version__.split("+")[0]
            if got != ver:
                raise RuntimeError(f"{mod} {got}, the kit carries {ver}: is {DEV_SITE} "
                                   "first on PYTHONPATH?")
        return meta.get("expect")

    def cuda():
        import torch
        assert torch.cuda.is_available(), "torch.cuda.is_available() is False"
        a = torch.randn(512, 512, device="cuda", dtype=torch.bfloat16)
        err = float((a.float() @ a.float() - (a @ a).float()).abs().max())
        return {"device": torch.cuda.get_device_name(0), "count": torch.cuda.device_count(),
                "cuda": torch.version.cuda, "cudnn": torch.backends.cudnn.version(),
                "nccl": ".".join(map(str, torch.cuda.nccl.version())), "matmul_err": err}

    def nccl_one_rank():
        import tempfile as tf

        import torch
        import torch.distributed as dist
        with tf.NamedTemporaryFile() as f:
            dist.init_process_group("nccl", init_method=f"file://{f.name}", rank=0,
                                    world_size=1, device_id=torch.device("cuda:0"))
            t = torch.ones(4, device="cuda")
            dist.all_reduce(t)
            dist.destroy_process_group()
        return float(t.sum())

    def triton_kernel():
        import importlib.util
        import tempfile as tf
        with tf.TemporaryDirectory() as d:
            p = Path(d) / "kit_smoke_triton.py"
            p.write_text(SMOKE_TRITON)
            spec = importlib.util.spec_from_file_location("kit_smoke_triton", p)
            mod = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(mod)
            mod.run()
        return "add_one ok"

    def vllm_modules():
        import importlib
        import importlib.util
        # (vLLM 0.34 has no V1 ``vllm.v1.worker.gpu_model_runner`` any more.)
        for mod in ("vllm", "vllm._custom_ops", "vllm.v1.worker.gpu_worker",
                    "vllm.v1.worker.gpu.model_runner", "vllm.vllm_flash_attn"):
            importlib.import_module(mod)
        if importlib.util.find_spec("vllm.model_executor.warmup.minimax_m3_msa_warmup"):
            # imported by every CUDA worker's kernel warm-up (0.34): needs the CuTe DSL
            importlib.import_module("vllm.model_executor.warmup.minimax_m3_msa_warmup")
        from vllm.v1.sample.ops.topk_topp_sampler import flashinfer_sampler_supported

        flashinfer_sampler_supported()  # imports FlashInfer unless the sampler is told not to
        import torch
        from vllm import _custom_ops as ops
        # one of vLLM's own kernels on the GPU (its libraries carry sm_90 code only)
        x = torch.randn(8, 256, device="cuda", dtype=torch.bfloat16)
        w = torch.ones(256, device="cuda", dtype=torch.bfloat16)
        y = torch.empty_like(x)
        ops.rms_norm(y, x, w, 1e-6)
        ref = x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-6)
        err = float((y.float() - ref).abs().max())
        assert err < 0.05, f"rms_norm differs by {err}"
        return {"_C ops": hasattr(torch.ops, "_C"), "rms_norm_err": err,
                "LD_PRELOAD": os.environ.get("LD_PRELOAD")}

    check("versions", versions)
    check("expected versions", expected)
    check("cuda", cuda)
    check("nccl one rank", nccl_one_rank)
    check("triton kernel", triton_kernel)
    check("vllm modules", vllm_modules)
    out = os.environ.get("OUT")
    if out:
        Path(out, "smoke.json").write_text(json.dumps(results, indent=1, default=str) + "\n")
    print("smoke:", "FAILED " + ", ".join(failed) if failed else "all ok", flush=True)
    sys.exit(1 if failed else 0)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    for name, fn, what in (("build", build, "download, slim, pack and split (here)"),
                           ("plan", plan, "print the device calls (here)")):
        s = sub.add_parser(name, help=what)
        s.add_argument("--vllm", choices=("0.26.0", "0.34.0"), default="0.26.0",
                       help="which kit (default 0.26.0)")
        s.set_defaults(fn=fn)
    s = sub.add_parser("stash", help="copy carried parts out of the checkout (device)")
    s.add_argument("parts", nargs="+")
    s.set_defaults(fn=stash)
    s = sub.add_parser("install", help="assemble and install the stashed kit (device)")
    s.add_argument("--with", dest="with_", default="",
                   help="fallbacks of the 0.34 kit that must be installed: triton,nccl "
                        "(default: those stashed whole)")
    s.set_defaults(fn=install)
    sub.add_parser("smoke", help="check the installed kit: versions, CUDA, NCCL, Triton, "
                   "vLLM imports (device)").set_defaults(fn=smoke)
    a = p.parse_args()
    a.fn(a)


if __name__ == "__main__":
    main()
