"""GPU run: real-shape random-weight models through speculators' unchanged generator.

Models (``real_shapes.MODELS``): Kimi-K2.5 (``KimiK25ForConditionalGeneration``), DeepSeek-V3
with block-FP8 weights and its bf16 twin, Qwen3-MoE at Qwen3-30B-A3B's shape, GPT-OSS at
gpt-oss-20b's shape; published dimensions, fewer layers (and experts for DeepSeek/Kimi).
Hybrid attention: Qwen3.5 MoE (``qwen3_5_moe``: Qwen3.5-35B-A3B's text model, linear + full
attention), DeepSeek-V3.2 (``deepseek_v32``: sparse MLA with the lightning indexer) and
Gemma 4 (``gemma4``: Gemma 4 31B's text model, sliding + full attention).

The hybrid models are checked against transformers on the GPU only: no ``native`` /
``native_matched`` tasks. vLLM's native extraction is no trusted oracle on hybrid models (it
has returned all-zero hidden states, vllm#46301, and NaN, vllm#45849), so a shim-vs-native
agreement there would prove nothing and a disagreement would blame nobody. Their routed
experts are all selected (``real_shapes``) so that the transformers comparison does not hinge
on near-tied routing. vLLM 0.34's Qwen3.5 model imports ``flashinfer.norm``
unconditionally; where no FlashInfer is importable (the GPU kit has none) the Qwen3.5 tasks
get the PyTorch stand-in of ``standins/`` (its README) first on ``PYTHONPATH``, and their
results say ``"flashinfer_standin": true``.

Tasks, each in a fresh process (results kept in ``--work`` so a second call resumes):

- ``build:<model>``: the checkpoint, built on the GPU (``real_shapes.build``);
- ``native:<model>`` (models whose oracle names ``native``): vLLM's own
  ``extract_hidden_states`` on the same vLLM and tokens (``benchmarks/gpu/gpu_bench.native_llm``;
  speculators' layer k = auxiliary layer k + 1) with chunked prefill off, as vLLM's example
  runs it; saved;
- ``native_matched:<model>``: the same native path scheduled like speculators' generator
  (the decisive oracle): chunked prefill on, synchronous scheduling, the engine core in the
  same process (every request of a batch added before the first step), ``max_num_seqs`` 32,
  ``max_num_batched_tokens`` max(8192, max_model_len), KV block size 16 on CUDA, eager, no
  prefix caching (speculators 0.3.0 / 0.4.0.1's ``_create_vllm_config`` plus the shim's
  ``scheduling_sync`` / ``prefix_caching_off``), the same batches submitted in the same
  order. Every engine here records, in its workers, the tokens each step scheduled per
  request (``steps``) and its resolved scheduler / cache settings (``engine``); the
  generator's ``steps`` are compared with both native runs' (``composition``), so "same batch
  composition" is shown, not assumed;
- ``gen:<model>:<release>``: speculators' ``VllmHiddenStatesGenerator`` through the shim
  (``speculators_compat.activate()``), ``generate()`` on batches of 1, 11 and 33 sequences of
  mixed lengths (the longest batch holds one of ``--max-len`` tokens); every batch must come
  back whole and in input order; then the oracle: a transformers forward on the GPU of the
  same checkpoint (bf16 DeepSeek-V3, Qwen3-MoE, GPT-OSS), the native files, and for FP8 also
  the transformers forward of the bf16 twin (its dequantized weights). Per-layer minimum
  cosine, relative L2 and max error go to the JSON.

Pass criteria (where the native files exist):

1. ``native_matched``: the shim must equal vLLM's own path run with the generator's batch
   composition within ``--matched-tol`` (default: exactly, on the CPU and on the GPU, as
   observed on the H200: the kernels, weights and steps are the same). This is the check
   that can blame the shim; it is inconclusive, and says so, if the recorded steps differ.
2. ``native`` / ``transformers`` / ``bf16_twin``: each passes on the usual tolerance
   (``reference.compare``'s bf16 defaults; ``--twin-tol`` for the twin), or -- only if 1.
   passed -- when the shim's distance from that oracle is within vLLM's own distance from
   it (``native_matched`` vs the same oracle: the *floor*) plus the ``--matched-tol``
   margin, per layer (triangle inequality on the angle, the relative L2 and the max error).
   So a MoE / FP8 layer that misses transformers passes only where vLLM itself misses it by
   as much; the tolerances themselves are not loosened. Models without a native oracle
   (GPT-OSS, the hybrid models) have no such floor: their JSON rows hold
   ``transformers_float32_floor`` instead (transformers' bf16 forward against its float32
   forward, per layer), which judges nothing but tells bf16 noise of the random checkpoint
   from a miss. ``floors`` in the JSON holds every vLLM floor, including ``native`` vs
   ``native_matched`` (what batch composition alone moves).
3. Every criterion, the floor-judged ones included, must fail on deliberately wrong
   results (rows one position late; each layer against the next captured layer's
   reference) -- else it does not count.

``<out>/gpu_models.json`` is rewritten after every task. TP=2 runs only where 2 GPUs exist;
otherwise the JSON says "not run: no 2-GPU machine".

Device: ``bash tools/gpu/gpu_models.sh .gpu-kit/parts/kit.part02`` (after the two stash calls).
CPU test (tiny dimensions; FP8 skipped: vLLM's CPU build has no block-FP8 kernels; a
small ``--max-num-batched-tokens`` makes chunked prefill split prompts, so ``native`` and
``native_matched`` really differ in composition)::

    PYTHONPATH=src .envs/vllm-0.32.0/bin/python tests/e2e/scripts/gpu_models.py --tiny \\
        --out /tmp/gm --work /tmp/gm-work --spec 0.4.0.1=.envs/speculators-0.4.0.1 \\
        --models qwen3_moe,deepseek_v3 --max-len 64 --max-num-batched-tokens 160

The hybrid models on the CPU: the same command with ``--models gemma4`` (add ``--spec
0.3.0=.envs/speculators-0.3.0`` without ``--max-num-batched-tokens``, which 0.3.0 does not
take). vLLM 0.32's CPU build runs Gemma 4 only: its Qwen3.5 fails inspecting the
architecture (its processor imports torchvision, absent from the env) and DeepSeek-V3.2
stops with "Sparse Attention is not supported on CPU"; their ``--tiny`` builds still load
and run in transformers (5.19 and 5.20.2).

Device, the hybrid models only (see docs/gpu.md, "Real-shape models")::

    bash tools/gpu/gpu_models.sh .gpu-kit/parts/kit.part02 -- \\
        --models qwen3_5_moe,deepseek_v32,gemma4 --deadline 540 --min-start-left 120 \\
        --parallel 3 --parallel-builds 2 --gpu-mem 0.25
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import subprocess
import sys
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
HERE = Path(__file__).resolve().parent
BENCH = ROOT / "benchmarks" / "gpu"
STANDINS = HERE / "standins"
ALL_MODELS = ("kimi_k25,deepseek_v3_fp8,deepseek_v3,qwen3_moe,gpt_oss,qwen3_5_moe,deepseek_v32,"
              "gemma4")
#: What each layer of a correct result measured against its oracle must reach. The default
#: (``reference.compare``'s) is for bf16 vs bf16; the twin comparison adds FP8 activation
#: quantization and is set from the observed values (docs/gpu.md).
TWIN_DEFAULTS = {"min_cosine": 0.95, "max_rel_l2_err": 0.25, "max_rel_abs_err": 0.5}
#: The shim against vLLM's native path with the generator's own batch composition: the same
#: weights, kernels and steps. Exact on the CPU (``--tiny``) and on the GPU: the H200 run of
#: 2026-12-01 (docs/gpu.md, "Real-shape models", results) was bit-identical in every tensor
#: of all eight runs (DeepSeek-V3 bf16 / FP8, Qwen3-MoE, Kimi-K2.5; both speculators
#: releases), so the default allows nothing more.
MATCHED_EXACT = {"min_cosine": 0.999999, "max_rel_l2_err": 0.0, "max_rel_abs_err": 0.0}
MATCHED_DEFAULTS = dict(MATCHED_EXACT)
#: speculators 0.3.0 / 0.4.0.1 ``_create_vllm_config``: MAX_NUM_SEQS, MIN_MAX_BATCHED_TOKENS,
#: VLLM_BLOCK_SIZE (CUDA); the engines' resolved values are recorded and compared.
GEN_MAX_NUM_SEQS, GEN_MIN_BATCHED_TOKENS, GEN_BLOCK_SIZE = 32, 8192, 16


# ------------------------------------------------------------------------------ helpers
def sequences(vocab: int, batches: str, min_len: int, max_len: int) -> list[list[list[int]]]:
    """The batches' token ids, identical in every task of a model (seeded by batch index);
    ids avoid the special tokens (0..4) and the top 8 ids (Kimi's media placeholder); the
    largest batch's first sequence has exactly ``max_len`` tokens."""
    from speculators_compat.demo.runner import make_sequences

    out = [make_sequences(int(n), seed=i, min_len=min_len, max_len=max_len, vocab=vocab - 8)
           for i, n in enumerate(batches.split(","))]
    big = max(range(len(out)), key=lambda i: len(out[i]))
    first = out[big][0]
    out[big][0] = (first * (max_len // len(first) + 1))[:max_len]
    return out


def _write(path: Path, obj) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(obj, indent=1, default=str))
    tmp.replace(path)


def _layer_stats(cmp: dict, layers: list[int]) -> dict:
    per = cmp.get("per_layer") or []
    return {str(k): per[j] if j < len(per) else None for j, k in enumerate(layers)}


def _compare(actual, expected, layers, tol: dict | None = None) -> dict:
    from speculators_compat.demo.reference import compare

    if len(actual) != len(expected):
        return {"ok": False, "reasons": [f"{len(actual)} results vs {len(expected)} references"]}
    cmp = compare(actual, expected, **(tol or {}))
    return {"ok": cmp["ok"], "min_cosine": cmp["min_cosine"],
            "max_rel_l2_err": cmp["max_rel_l2_err"], "max_rel_abs_err": cmp["max_rel_abs_err"],
            "per_layer": _layer_stats(cmp, layers), "thresholds": cmp["thresholds"],
            "reasons": cmp["reasons"][:5]}


def _angle(cos: float) -> float:
    import math

    return math.acos(max(-1.0, min(1.0, cos)))


def within_floor(stats: dict, floor: dict, margin: dict) -> bool:
    """Whether every layer of ``stats`` (shim vs an oracle, ``_compare``'s ``per_layer``) is
    within vLLM's own distance from the same oracle (``floor``: native_matched vs it) plus
    ``margin`` (the shim-vs-native_matched tolerance): the triangle inequality on the
    per-token angle, the relative L2 error and the max error. A layer without values fails."""
    per, fl = stats.get("per_layer") or {}, floor.get("per_layer") or {}
    if not per or set(per) != set(fl):
        return False
    for k, st in per.items():
        f = fl[k]
        if not st or not f or any(st.get(x) is None or f.get(x) is None for x in (
                "min_cosine", "max_rel_l2_err", "max_rel_abs_err")):
            return False
        if _angle(st["min_cosine"]) > _angle(f["min_cosine"]) + _angle(
                margin["min_cosine"]) + 1e-6:
            return False
        for x in ("max_rel_l2_err", "max_rel_abs_err"):
            if st[x] > f[x] + margin[x] + 1e-6:
                return False
    return True


def _judge(tol: dict | None, floor: dict | None, margin: dict | None):
    """The pass criterion of a check: its tolerance, or (with a floor) within the floor."""
    def judge(actual, expected, layers) -> bool:
        c = _compare(actual, expected, layers, tol)
        return bool(c["ok"] or (floor is not None and c.get("per_layer") is not None
                                and within_floor(c, floor, margin)))
    return judge


def known_wrong(got, ref, layers, tol: dict | None = None, n: int = 8,
                judge=None) -> dict[str, bool]:
    """Whether deliberately wrong results of the first ``n`` sequences pass the same check
    (each must not): every layer compared with the next captured layer's reference
    (mislabelled layer), and every sequence's rows one position late (misattributed rows).
    ``judge(actual, expected, layers)`` is the check's criterion (default: ``tol``)."""
    import torch

    judge = judge or _judge(tol, None, None)
    g, r = got[:n], ref[:n]
    out = {"rows_one_late": judge([[torch.roll(h, 1, 0) for h in seq] for seq in g], r,
                                  layers)}
    if len(layers) > 1:
        out["neighbour_layer"] = judge(
            g, [[seq[(j + 1) % len(seq)] for j in range(len(seq))] for seq in r], layers)
    return out


def _worker_runner(worker):
    return getattr(worker, "model_runner", None) or getattr(
        getattr(worker, "worker", None), "model_runner", None)


def _steps(worker, action: str):
    """Runs in each vLLM worker: ``install`` wraps the model runner's ``execute_model`` to
    record, per step, the tokens scheduled for each request (scheduler order); ``pop``
    returns and clears the record. The same for the generator's and the native engines, so
    their batch compositions can be compared step by step."""
    runner = _worker_runner(worker)
    if action == "install":
        if not hasattr(runner, "_gm_steps"):
            orig = runner.execute_model
            runner._gm_steps = []

            def execute_model(scheduler_output, *args, **kwargs):
                n = getattr(scheduler_output, "num_scheduled_tokens", None) or {}
                if n:
                    runner._gm_steps.append([int(v) for v in n.values()])
                return orig(scheduler_output, *args, **kwargs)

            runner.execute_model = execute_model
        return True
    out = list(getattr(runner, "_gm_steps", None) or [])
    if hasattr(runner, "_gm_steps"):
        runner._gm_steps.clear()
    return out


def _engine_settings(worker) -> dict:
    """Runs in each vLLM worker: the resolved settings that decide batch composition."""
    cfg = getattr(worker, "vllm_config", None) or getattr(
        getattr(worker, "worker", None), "vllm_config", None)
    s, c = cfg.scheduler_config, cfg.cache_config
    out = {k: getattr(s, k, None) for k in (
        "max_num_batched_tokens", "max_num_seqs", "max_model_len", "enable_chunked_prefill",
        "chunked_prefill_enabled", "async_scheduling", "long_prefill_token_threshold",
        "max_num_partial_prefills")}
    out.update(block_size=c.block_size, enable_prefix_caching=c.enable_prefix_caching,
               enforce_eager=cfg.model_config.enforce_eager,
               dtype=str(cfg.model_config.dtype))
    return {k: (v if isinstance(v, (bool, int, float, str, type(None))) else str(v))
            for k, v in out.items()}


def _first(reply):
    return reply[0] if isinstance(reply, list) else reply


def _runner_info(worker) -> dict:
    r = getattr(worker, "model_runner", None)
    t = type(r)
    inner = type(getattr(worker, "worker", None) or worker)
    return {"runner": f"{t.__module__}.{t.__name__}",
            "model": type(getattr(r, "model", None)).__name__,
            "worker": f"{inner.__module__}.{inner.__name__}"}


# ------------------------------------------------------------------------------ children
def child_build(p: dict) -> dict:
    import real_shapes
    import torch

    device = "cuda" if torch.cuda.is_available() else "cpu"
    info = real_shapes.build(p["model"], p["ckpts"], device=device, tiny=p["tiny"])
    return {"ok": True, "device": device, **{k: info[k] for k in (
        "path", "bytes", "seconds", "capture", "oracle", "vocab_size", "text_config")},
        "fp8_roundtrip": info.get("fp8_roundtrip")}


def gen_batched_tokens(p: dict) -> int:
    """The generator's ``max_num_batched_tokens``: ``--max-num-batched-tokens`` (passed to
    speculators 0.4's generator) or speculators' own max(8192, max_model_len)."""
    return p.get("max_num_batched_tokens") or max(GEN_MIN_BATCHED_TOKENS, p["max_model_len"])


def _native_kwargs(p: dict, path: str, matched: bool = False) -> dict:
    """``vllm.LLM`` arguments of the native oracle. ``matched``: scheduled like speculators'
    generator (chunked prefill on, its step budget); otherwise chunked prefill off, as vLLM's
    ``extract_hidden_states`` example runs it. Everything else is the generator's in both
    (synchronous steps, block size, eager, no prefix caching), so the two native runs differ
    in batch composition only."""
    import torch

    kw = dict(model=path, trust_remote_code=True, enforce_eager=True,
              enable_prefix_caching=False, max_model_len=p["max_model_len"], seed=0,
              max_num_seqs=GEN_MAX_NUM_SEQS,
              max_num_batched_tokens=max(GEN_MIN_BATCHED_TOKENS, p["max_model_len"]),
              gpu_memory_utilization=p["native_gpu_mem"], enable_chunked_prefill=False,
              async_scheduling=False)
    if torch.cuda.is_available():  # the CPU platform picks its own (cpu_block_size)
        kw["block_size"] = GEN_BLOCK_SIZE
    if matched:
        kw.update(enable_chunked_prefill=True, max_num_batched_tokens=gen_batched_tokens(p))
    if p.get("native_kv_bytes") and torch.cuda.is_available():
        # A fixed KV budget instead of profiling against what other processes hold (at
        # gpu_memory_utilization 0.15 beside other runs: "Available KV cache memory: -17
        # GiB"); the size of the KV cache changes no hidden state.
        kw["kv_cache_memory_bytes"] = int(p["native_kv_bytes"])
    if p["model"] == "kimi_k25":
        kw["language_model_only"] = True  # text-only prompts; the vision tower is not built
    return kw


def _cpu_inprocess_workaround() -> None:
    """CPU builds only (vLLM 0.32): with the worker in this process, the CPU platform's
    Triton-kernel override scan walks every module in ``sys.modules`` and fails on
    llvmlite's lazy ffi wrapper (``'_lib_fn_wrapper' object has no attribute 'get'``),
    which Kimi's multimodal processor imports. Hide llvmlite's modules during that scan."""
    try:
        from vllm.platforms import current_platform
    except ImportError:
        return
    if current_platform.is_cuda_alike():
        return
    orig = getattr(current_platform, "register_triton_kernel_overrides", None)
    if orig is None:
        return

    def register_triton_kernel_overrides(*args, **kwargs):
        hidden = {n: m for n, m in sys.modules.items() if n.split(".")[0] == "llvmlite"}
        for n in hidden:
            del sys.modules[n]
        try:
            return orig(*args, **kwargs)
        finally:
            sys.modules.update(hidden)

    current_platform.register_triton_kernel_overrides = register_triton_kernel_overrides


def child_native(p: dict, matched: bool = False) -> dict:
    import torch
    from safetensors.torch import save_file

    sys.path.insert(0, str(BENCH))
    import gpu_bench

    build = p["build"]
    variant = "native_matched" if matched else "native"
    aux = [k + 1 for k in build["capture"]]
    store = Path(p["work"]) / f"{variant}-store-{p['model']}"
    store.mkdir(parents=True, exist_ok=True)
    res: dict = {"aux_layer_ids": aux, "variant": variant}
    os.environ.setdefault("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")  # collective_rpc(function)
    # The engine core in this process: LLM.generate then adds every request of a batch
    # before the first step, as speculators' generator does. With the core in its own
    # process it starts stepping while requests still arrive (a first step of 2 of 11
    # requests, measured on CPU), so the steps would differ from the generator's.
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    # The model runner the shim runs the generator with (hook_capture): V1 where it exists
    # (recorded in "workers"), not left to vLLM's choice. vLLM 0.34 removed V1 and refuses
    # any value but 1; there V2 runs both paths.
    import importlib.util

    if importlib.util.find_spec("vllm.v1.worker.gpu_model_runner") is not None:
        os.environ["VLLM_USE_V2_MODEL_RUNNER"] = "0"
    else:
        os.environ.pop("VLLM_USE_V2_MODEL_RUNNER", None)
    _cpu_inprocess_workaround()
    t = time.time()
    kw = _native_kwargs(p, build["path"], matched)
    res["llm_kwargs"] = {k: v for k, v in kw.items() if k != "model"}
    try:
        llm, res["connector"] = gpu_bench.native_llm(kw, aux, store)
    except TypeError as exc:  # a vLLM without language_model_only
        if "language_model_only" not in str(exc):
            raise
        kw.pop("language_model_only")
        llm, res["connector"] = gpu_bench.native_llm(kw, aux, store)
    res["startup_s"] = time.time() - t
    res["workers"] = gpu_bench._try(lambda: llm.collective_rpc(_runner_info))
    res["engine"] = _first(llm.collective_rpc(_engine_settings))
    generate = llm.generate

    def generate_and_flush(*args, **kwargs):
        # In-process, LLM.generate stops stepping once every request finished, but the
        # connector hands the last requests' saves to the worker in the *next* step (the
        # engine-core process keeps stepping for it): run empty steps so the files get
        # written before native_extract waits for them. Steps schedule no tokens.
        out = generate(*args, **kwargs)
        for _ in range(2):
            llm.llm_engine.step()
        return out

    llm.generate = generate_and_flush
    llm.collective_rpc(_steps, args=("install",))
    tensors = {}
    res["steps"] = []
    for b, batch in enumerate(sequences(build["vocab_size"], p["batches"], p["min_len"],
                                        p["max_len"])):
        llm.collective_rpc(_steps, args=("pop",))
        t = time.time()
        got = gpu_bench.native_extract(llm, batch, len(aux))
        res.setdefault("batch_s", []).append(time.time() - t)
        res["steps"].append(_first(llm.collective_rpc(_steps, args=("pop",))))
        if len(got) != len(batch):
            raise RuntimeError(f"{len(got)} native results for {len(batch)} sequences")
        for i, hs in enumerate(got):
            tensors[f"{b}.{i}"] = hs.to(torch.bfloat16).contiguous()
    path = Path(p["work"]) / f"{variant}-{p['model']}.safetensors"
    save_file(tensors, str(path), metadata={"aux": json.dumps(aux)})
    res.update(ok=True, file=str(path), sequences=len(tensors))
    return res


def _wait_for_native(p: dict, variant: str = "native") -> dict | None:
    """Wait for the ``variant`` task of this model (running beside this one) to finish;
    its result, or None if it failed or did not finish in time (recorded by the caller)."""
    res = Path(p["work"]) / "results" / f"{variant}_{p['model']}.json"
    native = Path(p["work"]) / f"{variant}-{p['model']}.safetensors"
    t = time.time()
    while time.time() - t < p.get("native_wait_s", 480):
        if res.exists():
            try:
                r = json.loads(res.read_text())
            except ValueError:  # being written
                r = {}
            if r and not r.get("ok"):
                return None
            if r and native.exists():
                return r
        time.sleep(2)
    return None


def _load_native(p: dict, variant: str, batches) -> list:
    """``[sequence][layer]`` tensors of a native file, in input order (lengths checked)."""
    from safetensors import safe_open

    native = Path(p["work"]) / f"{variant}-{p['model']}.safetensors"
    ref = []
    with safe_open(str(native), "pt") as fh:
        keys = [f"{b}.{i}" for b, batch in enumerate(batches) for i in range(len(batch))]
        names = set(fh.keys())  # noqa: SIM118 - safe_open is not iterable
        missing = [k for k in keys if k not in names]
        if missing:
            raise RuntimeError(f"{native.name} lacks {missing[:4]}")
        for k in keys:
            hs = fh.get_tensor(k)
            ref.append([hs[:, j, :] for j in range(hs.shape[1])])
    return ref


def _bitwise_equal(actual, expected) -> float:
    """Fraction of (sequence, layer) tensors that are bit-identical."""
    import torch

    pairs = [(a, e) for sa, se in zip(actual, expected, strict=True)
             for a, e in zip(sa, se, strict=True)]
    return sum(a.shape == e.shape and torch.equal(a.to(e.dtype), e) for a, e in pairs) / max(
        1, len(pairs))


def _shutdown(gen) -> None:
    ex = getattr(gen, "executor", None)
    if ex is not None and hasattr(ex, "shutdown"):
        ex.shutdown()


def child_gen(p: dict) -> dict:
    import torch

    import speculators_compat

    build = p["build"]
    layers = list(build["capture"])
    batches = sequences(build["vocab_size"], p["batches"], p["min_len"], p["max_len"])
    res: dict = {"layers": layers, "batches": []}
    res["report"] = {a["name"]: a["status"] for a in
                     speculators_compat.activate().as_dict().get("adapters", [])}
    from speculators.data_generation.vllm_hidden_states_generator import (
        VllmHiddenStatesGenerator,
    )

    if p.get("additional_config"):
        from generator_config import give_generator_additional_config

        give_generator_additional_config(p["additional_config"])
    t = time.time()
    kw = {"gpu_memory_utilization": p["gpu_mem"]}
    if p["tp"] != 1:
        kw["tensor_parallel_size"] = p["tp"]
    if p.get("max_num_batched_tokens"):  # speculators 0.4 takes it; 0.3.0 raises TypeError
        kw["max_num_batched_tokens"] = p["max_num_batched_tokens"]
    gen = VllmHiddenStatesGenerator(build["path"], layer_ids=layers,
                                    max_model_len=p["max_model_len"], **kw)
    res["startup_s"] = time.time() - t
    res["generator_layer_ids"] = list(gen.layer_ids)
    if p.get("additional_config"):  # what the generator's VllmConfig really carries
        res["additional_config"] = dict(gen.vllm_config.additional_config or {})
    try:
        res["workers"] = gen.executor.collective_rpc(_runner_info)
    except Exception as exc:  # noqa: BLE001 - informational
        res["workers"] = f"{type(exc).__name__}: {exc}"
    res["engine"] = _first(gen.executor.collective_rpc(_engine_settings))
    gen.executor.collective_rpc(_steps, args=("install",))
    res["steps"] = []
    outputs = []
    for batch in batches:
        gen.executor.collective_rpc(_steps, args=("pop",))
        t = time.time()
        out = gen.generate([list(s) for s in batch])
        dt = time.time() - t
        res["steps"].append(_first(gen.executor.collective_rpc(_steps, args=("pop",))))
        whole = len(out) == len(batch)
        order = whole and all(r["input_ids"].tolist() == list(s) for r, s in zip(out, batch))
        shapes = whole and all(
            len(r["hidden_states"]) == len(layers)
            and all(tuple(h.shape[:1]) == (len(s),) for h in r["hidden_states"])
            for r, s in zip(out, batch))
        res["batches"].append({"size": len(batch), "returned": len(out), "seconds": dt,
                               "tokens": sum(map(len, batch)), "max_len": max(map(len, batch)),
                               "input_order": bool(order), "shapes": bool(shapes),
                               "dtypes": sorted({str(h.dtype) for r in out
                                                 for h in r["hidden_states"]})})
        outputs.append([[h.to("cpu") for h in r["hidden_states"]] for r in out])
        del out
    _shutdown(gen)
    del gen
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    flat = [s for b in batches for s in b]
    got = [seq for b in outputs for seq in b]
    if len(flat) != len(got):
        raise RuntimeError(f"{len(got)} results for {len(flat)} sequences")
    oracle = build["oracle"]
    res["oracle"] = oracle
    checks: dict = {}
    floors: dict = {}
    kinds = oracle.split("+")  # "transformers", "native", "bf16_twin", combined with "+"
    mtol = p.get("matched_tol") or MATCHED_DEFAULTS
    nm = None
    matched_ok = False
    if "native" in kinds:
        # 1. The decisive check: vLLM's native path with the generator's batch composition.
        nm_res = _wait_for_native(p, "native_matched")
        if nm_res is None:
            checks["native_matched"] = {"ok": False, "reasons": [
                "the native_matched oracle failed or did not finish"]}
        else:
            nm = _load_native(p, "native_matched", batches)
            res["composition"] = {"same_as_native_matched": res["steps"] == nm_res.get("steps"),
                                  "native_matched_steps": nm_res.get("steps"),
                                  "native_matched_engine": nm_res.get("engine")}
            c = _compare(got, nm, layers, mtol)
            c["bitwise_equal_fraction"] = _bitwise_equal(got, nm)
            c["known_wrong_passed"] = known_wrong(got, nm, layers, mtol)
            c["passed"] = bool(c["ok"])
            if not res["composition"]["same_as_native_matched"]:
                c["note"] = ("inconclusive: the generator's steps differ from native_matched's "
                             "(see composition)")
            checks["native_matched"] = c
            matched_ok = bool(c["ok"] and not any(c["known_wrong_passed"].values()))
    refs: dict[str, tuple] = {}  # check name -> (reference, tolerance)
    if "transformers" in kinds:
        from speculators_compat.demo.reference import reference_hidden_states

        t = time.time()
        refs["transformers"] = (reference_hidden_states(build["path"], flat, layers,
                                                        device=device), None)
        res["reference_s"] = time.time() - t
        if "native" not in kinds:
            # No vLLM floor without a native oracle: record how far transformers' own bf16
            # forward is from its float32 forward (informational, judges nothing), so a
            # miss can be told from bf16 noise of the random checkpoint.
            fp32 = reference_hidden_states(build["path"], flat, layers, dtype=torch.float32,
                                           device=device)
            res["transformers_float32_floor"] = _compare(
                [[h.float() for h in seq] for seq in refs["transformers"][0]], fp32, layers)
            del fp32
    if "native" in kinds:
        n_res = _wait_for_native(p, "native")
        if n_res is None:
            checks["native"] = {"ok": False, "passed": False, "reasons": [
                "the native oracle failed or did not finish"]}
        else:
            refs["native"] = (_load_native(p, "native", batches), None)
            res.setdefault("composition", {})["same_as_native"] = (
                res["steps"] == n_res.get("steps"))
    if p.get("twin"):
        from speculators_compat.demo.reference import reference_hidden_states

        t = time.time()
        refs["bf16_twin"] = (reference_hidden_states(p["twin"], flat, layers, device=device),
                             p["twin_tol"])
        res["twin_reference_s"] = time.time() - t
    for name, (ref, tol) in refs.items():
        # 2. Each oracle: its tolerance, or -- only if 1. passed -- within vLLM's own
        # distance from it (the floor: native_matched vs the same oracle) plus the margin.
        c = _compare(got, ref, layers, tol)
        floor = _compare(nm, ref, layers, tol) if nm is not None else None
        if floor is not None:
            floors[f"native_matched_vs_{name}"] = floor
            c["within_floor"] = within_floor(c, floor, mtol)
        usable = floor if matched_ok else None
        c["passed"] = bool(c["ok"] or (usable is not None and c["within_floor"]))
        c["known_wrong_passed"] = known_wrong(got, ref, layers, tol,
                                              judge=_judge(tol, usable, mtol))
        checks[name] = c
    del refs
    res["checks"] = checks
    res["floors"] = floors
    ok_batches = all(b["returned"] == b["size"] and b["input_order"] and b["shapes"]
                     for b in res["batches"])
    # A check counts only if it fails every deliberately wrong result.
    res["ok"] = bool(ok_batches and checks and all(
        c.get("passed", c.get("ok")) and not any((c.get("known_wrong_passed") or {}).values())
        for c in checks.values()))
    return res


def child_native_matched(p: dict) -> dict:
    return child_native(p, matched=True)


CHILDREN = {"build": child_build, "native": child_native,
            "native_matched": child_native_matched, "gen": child_gen}


def child_main(params_file: str) -> None:
    p = json.loads(Path(params_file).read_text())
    sys.path[:0] = [str(HERE)]
    t = time.time()
    try:
        res = CHILDREN[p["kind"]](p)
    except BaseException as exc:  # noqa: BLE001 - recorded, then re-raised
        res = {"ok": False, "error": f"{type(exc).__name__}: {exc}",
               "traceback": traceback.format_exc()[-4000:]}
        res["wall_s"] = time.time() - t
        if p.get("flashinfer_standin"):
            res["flashinfer_standin"] = True
        _write(Path(p["result"]), res)
        raise
    res["wall_s"] = time.time() - t
    if p.get("flashinfer_standin"):  # vLLM ran on standins/' flashinfer.norm
        res["flashinfer_standin"] = True
    _write(Path(p["result"]), res)


# ------------------------------------------------------------------------------ parent
def _n_gpus() -> int:
    try:
        import torch

        return torch.cuda.device_count()
    except Exception:  # noqa: BLE001
        return 0


def plan(a, n_gpus: int) -> list[dict]:
    """Tasks with their dependencies (ids of tasks that must have passed first), in the
    order they start: the builds; then per model the decisive pair (``native_matched`` and
    the generator of the last ``--spec`` release); then the ``native`` runs (chunked prefill
    off: the composition floor); then the other releases. A call that runs out of time
    thus loses the least decisive tasks; a later call on the same machine resumes."""
    import real_shapes

    models = a.models.split(",")
    builds, first, natives, rest = [], [], [], []
    built = set()
    for m in models:
        b = "deepseek_v3_fp8" if m == "deepseek_v3" and "deepseek_v3_fp8" in models else m
        if b not in built:
            built.add(b)
            builds.append({"id": f"build:{b}", "kind": "build", "model": b, "deps": []})
    specs = list(a.spec)
    for m in models:
        spec = real_shapes.MODELS[m]
        b = "deepseek_v3_fp8" if m == "deepseek_v3" and "deepseek_v3_fp8" in models else m
        deps = [f"build:{b}"]
        if "native" in spec["oracle"].split("+"):
            # The generators run beside the native oracles (they wait for the files before
            # comparing): engine starts overlap.
            first.append({"id": f"native_matched:{m}", "kind": "native_matched", "model": m,
                          "deps": deps})
            natives.append({"id": f"native:{m}", "kind": "native", "model": m, "deps": deps})
        for i, (ver, d) in enumerate(reversed(specs)):
            (first if i == 0 else rest).append(
                {"id": f"gen:{m}:{ver}", "kind": "gen", "model": m, "spec": ver,
                 "spec_dir": d, "tp": 1, "deps": deps})
        if m in ("kimi_k25", "deepseek_v3_fp8") and a.tp2:
            if n_gpus >= 2:
                for ver, d in specs:
                    rest.append({"id": f"gen:{m}:{ver}:tp2", "kind": "gen", "model": m,
                                 "spec": ver, "spec_dir": d, "tp": 2, "deps": deps})
            else:
                rest.append({"id": f"gen:{m}:tp2", "kind": "skip", "model": m, "deps": [],
                             "reason": "not run: no 2-GPU machine"})
    return builds + first + natives + rest


def main(a) -> int:
    out, work = Path(a.out), Path(a.work)
    out.mkdir(parents=True, exist_ok=True)
    (work / "logs").mkdir(parents=True, exist_ok=True)
    (work / "results").mkdir(parents=True, exist_ok=True)
    sys.path[:0] = [str(HERE), str(ROOT / "src")] + ([a.site] if a.site else [])
    n_gpus = _n_gpus()
    tasks = plan(a, n_gpus)
    deadline = time.time() + a.deadline
    meta = {"started": time.time(), "n_gpus": n_gpus, "batches": a.batches,
            "min_len": a.min_len, "max_len": a.max_len, "max_model_len": a.max_model_len,
            "tiny": a.tiny, "twin_tolerances": a.twin_tol,
            "matched_tolerances": a.matched_tol or (MATCHED_EXACT if a.tiny
                                                    else MATCHED_DEFAULTS),
            "max_num_batched_tokens": a.max_num_batched_tokens,
            "additional_config": a.vllm_additional_config,
            "native_kv_gib": a.native_kv_gib, "python": sys.version.split()[0],
            "env": {k: os.environ.get(k, "skip" if k == "VLLM_DEEP_GEMM_WARMUP" else None)
                    for k in ("VLLM_DEEP_GEMM_WARMUP", "VLLM_USE_DEEP_GEMM")}}
    try:
        import importlib.metadata as md

        import torch
        import transformers

        meta.update(torch=torch.__version__, transformers=transformers.__version__,
                    vllm=md.version("vllm"),
                    gpu=torch.cuda.get_device_name(0) if n_gpus else None)
    except Exception as exc:  # noqa: BLE001
        meta["versions_error"] = str(exc)
    # The device copy's .git (if any) need not be what runs: the caller names the commit its
    # snapshot came from.
    meta["shim_commit"] = os.environ.get("GPU_MODELS_COMMIT")
    if not meta["shim_commit"]:
        try:
            meta["shim_commit"] = subprocess.run(
                ["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True,
                text=True).stdout.strip() or None
        except OSError:
            pass
    results: dict[str, dict] = {}

    def load(t):
        f = work / "results" / (t["id"].replace(":", "_") + ".json")
        return json.loads(f.read_text()) if f.exists() else None

    def save():
        rows = [{"id": t["id"], **{k: t.get(k) for k in ("kind", "model", "spec", "tp")},
                 **results.get(t["id"], {"ok": None, "status": "not run"})} for t in tasks]
        _write(out / "gpu_models.json", {"meta": meta, "runs": rows})

    for t in tasks:  # resume: what an earlier call finished stays
        prev = load(t)
        if t["kind"] == "skip":
            results[t["id"]] = {"ok": None, "status": t["reason"]}
        elif prev is not None and prev.get("ok"):
            results[t["id"]] = {**prev, "from_earlier_call": True}
    save()
    running: list[tuple[dict, subprocess.Popen, float]] = []
    gpu_rr = 0
    while True:
        pending = [t for t in tasks if t["id"] not in results
                   and all(x["id"] != t["id"] for x, _, _ in running)]
        ready = []
        for t in pending:
            deps = [results.get(d) for d in t["deps"]]
            if any(d is not None and not d.get("ok") for d in deps):
                results[t["id"]] = {"ok": False, "status": "not run: a prerequisite failed",
                                    "deps": t["deps"]}
                save()
            elif all(d is not None for d in deps):
                ready.append(t)
        builds = sum(1 for t, _, _ in running if t["kind"] == "build")
        natives = sum(1 for t, _, _ in running if t["kind"].startswith("native"))
        for t in ready:
            if len(running) >= a.parallel or time.time() > deadline - a.min_start_left:
                break
            if t["kind"] == "build" and builds >= a.parallel_builds:
                continue
            is_native = t["kind"].startswith("native")
            if is_native and natives >= a.parallel_natives:
                continue
            # A generator waits for its native files: never let generators take the last
            # slot while a native task could start (they would wait for each other).
            if not is_native and natives < a.parallel_natives and len(running) + 1 >= \
                    a.parallel and any(x["kind"].startswith("native") and x is not t
                                       for x in ready if all(x["id"] != y["id"]
                                                             for y, _, _ in running)):
                continue
            builds += t["kind"] == "build"
            natives += t["kind"].startswith("native")
            running.append((t, _start(a, t, results, work, n_gpus, gpu_rr), time.time()))
            gpu_rr += 1
            print(f"start {t['id']}", flush=True)
        if not running:
            break
        time.sleep(1)
        still = []
        for t, proc, t0 in running:
            rc = proc.poll()
            if rc is None and time.time() < deadline and time.time() - t0 < a.timeout:
                still.append((t, proc, t0))
                continue
            cut = None
            if rc is None:
                # the run's deadline (the device call ends) is not the task's own time limit
                cut = "deadline" if time.time() >= deadline else "timeout"
                try:
                    os.killpg(proc.pid, 9)
                except OSError:
                    pass
                proc.wait()
                rc = cut
            res = load(t) or (
                {"ok": None, "status": "not finished: stopped at the run's deadline"}
                if cut == "deadline" else {"ok": False, "error": f"no result (rc={rc})"})
            res["rc"] = rc
            res["seconds"] = time.time() - t0
            if not res.get("ok"):  # failed or stopped: what its log says last
                log = work / "logs" / (t["id"].replace(":", "_") + ".log")
                res["log_tail"] = log.read_text(errors="replace")[-3000:] if log.exists() else ""
            results[t["id"]] = res
            verdict = {True: "PASS", None: "STOPPED"}.get(res.get("ok"), "FAIL")
            print(f"{verdict} {t['id']} {_brief(res)}", flush=True)
            save()
        running = still
    for t in tasks:
        if t["id"] not in results:
            results[t["id"]] = {"ok": None, "status": "not run: deadline reached"}
    meta["finished"] = time.time()
    save()
    return 0 if all(r.get("ok") or r.get("ok") is None for r in results.values()) else 1


def _brief(res: dict) -> str:
    if "checks" in res:
        comp = res.get("composition") or {}
        return " ".join(
            f"{k}: {'pass' if v.get('passed', v.get('ok')) else 'FAIL'}"
            f"{' (within floor)' if v.get('passed') and not v.get('ok') else ''} "
            f"min_cos={v.get('min_cosine')} rel_l2={v.get('max_rel_l2_err')}"
            for k, v in res["checks"].items()) + (
            f" same_steps_as_native_matched={comp.get('same_as_native_matched')}"
            f" same_steps_as_native={comp.get('same_as_native')}" if comp else "")
    return (res.get("error") or "")[:400]


def needs_flashinfer_standin(model: str) -> bool:
    """Qwen3.5 where no FlashInfer is importable: vLLM 0.34's Qwen3.5 norm imports
    ``flashinfer.norm`` unconditionally, so the engine gets ``standins/`` (a PyTorch
    stand-in, its README) first on ``PYTHONPATH``."""
    import importlib.util

    return model.startswith("qwen3_5") and importlib.util.find_spec("flashinfer") is None


def _start(a, t: dict, results: dict, work: Path, n_gpus: int, rr: int) -> subprocess.Popen:
    name = t["id"].replace(":", "_")
    res_file = work / "results" / f"{name}.json"
    res_file.unlink(missing_ok=True)
    build_id = [d for d in t["deps"] if d.startswith("build:")]
    build = dict(results[build_id[0]]) if build_id else {}
    if build_id and t["model"] != build_id[0].split(":", 1)[1]:
        # deepseek_v3 is built with deepseek_v3_fp8: same root, its own directory
        import real_shapes

        build = dict(build, path=str(Path(a.ckpts) / t["model"]),
                     capture=real_shapes.MODELS[t["model"]]["capture"],
                     oracle=real_shapes.MODELS[t["model"]]["oracle"])
    p = {"kind": t["kind"], "model": t["model"], "result": str(res_file), "work": str(work),
         "ckpts": a.ckpts, "tiny": a.tiny, "batches": a.batches, "min_len": a.min_len,
         "max_len": a.max_len, "max_model_len": a.max_model_len, "gpu_mem": a.gpu_mem,
         "native_gpu_mem": a.native_gpu_mem, "tp": t.get("tp", 1), "build": build,
         "twin_tol": a.twin_tol, "max_num_batched_tokens": a.max_num_batched_tokens,
         "additional_config": a.vllm_additional_config,
         "matched_tol": a.matched_tol or (MATCHED_EXACT if a.tiny else MATCHED_DEFAULTS),
         "native_kv_bytes": int(a.native_kv_gib * 2**30) if a.native_kv_gib else None}
    if t["model"] == "deepseek_v3_fp8" and t["kind"] == "gen":
        p["twin"] = str(Path(a.ckpts) / "deepseek_v3")
    standin = t["kind"] != "build" and needs_flashinfer_standin(t["model"])
    if standin:
        p["flashinfer_standin"] = True
    pfile = work / "results" / f"{name}.params.json"
    pfile.write_text(json.dumps(p))
    env = dict(os.environ)
    spec_dir = [t["spec_dir"]] if t.get("spec_dir") else []
    env["PYTHONPATH"] = os.pathsep.join(([str(STANDINS)] if standin else [])
                                        + [str(ROOT / "src"), *spec_dir, str(HERE), str(BENCH)]
                                        + ([a.site] if a.site else []))
    if standin:
        from gpu_families import hide_cuda_toolkit

        hide_cuda_toolkit(env)
    env.pop("VLLM_WORKER_MULTIPROC_METHOD", None)
    env.pop("SPECULATORS_COMPAT_ACTIVE", None)
    env.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
    # DeepGEMM (block-FP8) kernels are compiled for the shapes used, not all up front.
    env.setdefault("VLLM_DEEP_GEMM_WARMUP", "skip")
    if n_gpus and t.get("tp", 1) == 1:
        env["CUDA_VISIBLE_DEVICES"] = str(rr % n_gpus)
    log = open(work / "logs" / f"{name}.log", "w")  # noqa: SIM115 - handed to the child
    return subprocess.Popen([a.python, __file__, "--child", str(pfile)], env=env, stdout=log,
                            stderr=subprocess.STDOUT, cwd=str(work), start_new_session=True)


def merge(dirs: list[str], meta: dict) -> dict:
    """One results document from the ``results`` folders of one or more device calls (a
    later folder's result of a task replaces an earlier one's): what docs/results holds."""
    rows: dict[str, dict] = {}
    for d in dirs:
        for f in sorted(Path(d).glob("*.json")):
            if f.name.endswith(".params.json"):
                continue
            params = json.loads(f.with_name(f.stem + ".params.json").read_text())
            res = json.loads(f.read_text())
            # file stem = task id with ":" -> "_" (kind_model[_release][_tp2])
            rest = f.stem.removeprefix(f"{params['kind']}_{params['model']}").lstrip("_")
            tid = ":".join(x for x in (params["kind"], params["model"], *rest.split("_"))
                           if x)
            res.pop("traceback", None)
            if "log_tail" in res:
                res["log_tail"] = res["log_tail"][-800:]
            rows[tid] = {"id": tid, "kind": params["kind"], "model": params["model"],
                         "tp": params.get("tp", 1), "call": Path(d).name, **res}
    for tid in [r["id"] for r in rows.values() if r["kind"] == "gen"]:
        rows[tid]["spec"] = tid.split(":")[2]
    for r in meta.pop("extra_rows", []):
        rows[r["id"]] = r
    return {"meta": meta, "runs": sorted(rows.values(), key=lambda r: r["id"])}


def parse(argv=None):
    p = argparse.ArgumentParser()
    p.add_argument("--child")
    p.add_argument("--merge", nargs="+", help="results folders of device calls -> --into")
    p.add_argument("--into", help="with --merge: the merged JSON file")
    p.add_argument("--meta", type=json.loads, default={}, help="with --merge: run metadata")
    p.add_argument("--out", default="/tmp/gpu-models-out")
    p.add_argument("--work", default="/tmp/gpu-models")
    p.add_argument("--ckpts", default=None, help="default: <work>/ckpts")
    p.add_argument("--site", default=None)
    p.add_argument("--spec", action="append", default=[], type=lambda s: tuple(s.split("=", 1)))
    p.add_argument("--models", default=ALL_MODELS)
    p.add_argument("--batches", default="1,11,33")
    p.add_argument("--min-len", type=int, default=16)
    p.add_argument("--max-len", type=int, default=2048)
    p.add_argument("--max-model-len", type=int, default=4096)
    p.add_argument("--gpu-mem", type=float, default=0.08)
    p.add_argument("--native-gpu-mem", type=float, default=0.2)
    p.add_argument("--twin-tol", type=json.loads, default=dict(TWIN_DEFAULTS))
    p.add_argument("--matched-tol", type=json.loads, default=None,
                   help="shim vs native_matched (default: exact with --tiny, else "
                        "MATCHED_DEFAULTS)")
    p.add_argument("--max-num-batched-tokens", type=int, default=None,
                   help="the generator's and native_matched's step budget (default: "
                        "speculators' own, max(8192, max_model_len)); speculators >= 0.4")
    p.add_argument("--vllm-additional-config", type=json.loads, default=None,
                   help="JSON for the generator's VllmConfig(additional_config=...), e.g. "
                        "'{\"gdn_prefill_backend\": \"triton\"}' where the installed "
                        "FlashInfer has no gdn_prefill (Qwen3.5 on Hopper)")
    p.add_argument("--native-kv-gib", type=float, default=0,
                   help="CUDA: fixed KV cache size of the native engines "
                        "(kv_cache_memory_bytes) instead of profiling; 0: off")
    p.add_argument("--parallel-natives", type=int, default=2,
                   help="native engines at once (each holds --native-gpu-mem)")
    p.add_argument("--tp2", action="store_true")
    p.add_argument("--tiny", action="store_true", help="CPU test dimensions")
    p.add_argument("--parallel", type=int, default=4)
    p.add_argument("--parallel-builds", type=int, default=2)
    p.add_argument("--timeout", type=float, default=520)
    p.add_argument("--deadline", type=float, default=540)
    p.add_argument("--min-start-left", type=float, default=150,
                   help="start no task with less than this many seconds before the deadline")
    p.add_argument("--python", default=sys.executable)
    a = p.parse_args(argv)
    a.ckpts = a.ckpts or str(Path(a.work) / "ckpts")
    a.spec = [(v, os.path.abspath(d)) for v, d in a.spec]
    return a


if __name__ == "__main__":
    args = parse()
    if args.child:
        child_main(args.child)
    elif args.merge:
        _write(Path(args.into), merge(args.merge, args.meta))
    else:
        sys.exit(main(args))
