"""Throughput and overhead of speculators' unchanged generator through speculators-compat.

Measures, on one checkpoint, one set of token sequences and one machine, each run in a
fresh process (the script re-invokes itself with ``--child MODE``), modes alternating
in this order for ``--repeats`` rounds (the report's letter in brackets; the letters and
the earlier names ``a, b, d, c_vllm, c_activate, c_activate_warm`` are accepted too):

  vllm_prefill     (a) vLLM's own prefill-only throughput: ``LLM.generate`` with
                   ``max_tokens=1``, prefix caching off, scheduler limits matched to
                   speculators' (the ceiling for extracting through that engine; no hidden
                   states leave the engine).
  generator        (b) speculators' unchanged ``VllmHiddenStatesGenerator`` through the
                   shim, 4 layers, same tokens; includes returning every hidden state to the
                   driver. Time broken down by driver-side timers (schedule, execute_model,
                   each collective_rpc, rest).
  capture_on_off   (d) the capture's own cost: one generator, ``generate`` timed with the
                   capture on and off in ABBA order (off: hooks removed in the worker
                   through a ``collective_rpc`` callable; speculators' generate then runs
                   every step and ends with "Failed to capture hidden states", caught and
                   timed).
  import_vllm      (c) ``import vllm`` (and then ``from vllm import LLM``) in a fresh
                   process.
  activate_cold    (c) after ``import vllm``: ``import speculators_compat; activate()``,
                   which includes importing speculators' generator module.
  activate_warm    (c) after ``import vllm`` and speculators' generator module (imported
                   under a first activate(), then deactivate()): a second ``activate()``
                   alone, i.e. the shim's own cost.

The timers live in ``benchmarks/cpu/bench_timers.py``. Every (a)/(b)/(d) call records the
CPU time of each process of the child's tree and, through ``collective_rpc`` callables,
the worker's own ``execute_model``/``sample_tokens`` wall and CPU time (the forward
itself, comparable between (a) and (b)).

Usage (one command; see docs/performance.md)::

    PYTHONPATH=.envs/speculators-0.4.0.1 .envs/vllm-0.32.0/bin/python benchmarks/cpu/bench.py

    # small smoke configuration (not for conclusions; plot next to --out)
    ... benchmarks/cpu/bench.py --repeats 2 --num-seqs 4 --seq-len 64 --out /tmp/r.json

    # re-render plot / docs from a results file without re-running
    ... benchmarks/cpu/bench.py --render benchmarks/cpu/results.json --update-docs

The parent writes ``benchmarks/cpu/results.json`` (every child's raw JSON plus aggregates),
``docs/perf.svg`` and, with ``--update-docs``, the generated block of
``docs/performance.md``. With another ``--out``, the plot goes beside it (``.svg``) unless
``--plot`` says otherwise.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_timers  # noqa: E402  (benchmarks/cpu/bench_timers.py: the timers)
from perfreport import LETTERS, MODE_ALIASES, canonical_mode  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
MARK = "@@BENCH-RESULT@@ "
#: The modes, run in this order each round. The report labels them with letters
#: (``perfreport.LETTERS``); the letters and earlier names are accepted as aliases
#: (``perfreport.MODE_ALIASES``: ``a``, ``b``, ``d``, ``c_vllm``, ``c_activate``,
#: ``c_activate_warm``), and results files recorded with them still render.
MODES = ("vllm_prefill", "generator", "capture_on_off", "import_vllm", "activate_cold",
         "activate_warm")
GENERATOR_MODULE = "speculators.data_generation.vllm_hidden_states_generator"
# speculators 0.3/0.4 generator constants (vllm_hidden_states_generator.py)
SPEC_MAX_NUM_SEQS = 32
SPEC_MIN_MAX_BATCHED_TOKENS = 8192

# ~100M-parameter llama (head_dim 64: supported by vLLM's CPU attention).
MODEL_OVERRIDES = {"hidden_size": 768, "intermediate_size": 2560, "num_hidden_layers": 12,
                   "num_attention_heads": 12, "num_key_value_heads": 12, "head_dim": 64}


# ----------------------------------------------------------------------------- helpers
def _emit(result: dict) -> None:
    sys.stdout.flush()
    print(MARK + json.dumps(result, default=str), flush=True)


def _sequences(p: dict) -> list[list[int]]:
    from speculators_compat.demo.runner import make_sequences

    return make_sequences(p["num_seqs"], seed=1234, min_len=p["seq_len"],
                          max_len=p["seq_len"], vocab=p["vocab_size"])


def _warmup_sequences(p: dict) -> list[list[int]]:
    """``full``: a batch shaped like the timed one (other tokens), so one-off costs of the
    large shapes (allocations, kernel selection) are not timed; ``small``: 2 x 16."""
    from speculators_compat.demo.runner import make_sequences

    if p.get("warmup", "full") == "full":
        return make_sequences(p["num_seqs"], seed=99, min_len=p["seq_len"],
                              max_len=p["seq_len"], vocab=p["vocab_size"])
    return make_sequences(2, seed=99, min_len=16, max_len=16, vocab=p["vocab_size"])


def _configs(vllm_config) -> dict:
    sc, cc, mc, pc = (vllm_config.scheduler_config, vllm_config.cache_config,
                      vllm_config.model_config, vllm_config.parallel_config)
    out = {
        "max_num_seqs": sc.max_num_seqs,
        "max_num_batched_tokens": sc.max_num_batched_tokens,
        "enable_chunked_prefill": getattr(sc, "enable_chunked_prefill", None),
        "async_scheduling": getattr(sc, "async_scheduling", None),
        "block_size": cc.block_size,
        "enable_prefix_caching": cc.enable_prefix_caching,
        "dtype": str(mc.dtype),
        "enforce_eager": mc.enforce_eager,
        "max_model_len": mc.max_model_len,
        "executor_backend": str(pc.distributed_executor_backend),
    }
    try:
        out["use_v2_model_runner"] = bool(vllm_config.use_v2_model_runner)
    except Exception as exc:  # noqa: BLE001
        out["use_v2_model_runner"] = f"unknown ({type(exc).__name__})"
    return out


# ------------------------------------------------------------------------------ children
def child_build(p: dict) -> dict:
    import transformers
    from safetensors import safe_open

    from speculators_compat.demo.checkpoints import build_checkpoint

    path = Path(p["ckpt_root"]) / f"tf-{transformers.__version__}" / p["ckpt_name"]
    t = time.perf_counter()
    path = build_checkpoint("llama", path, **p["overrides"])
    built_s = time.perf_counter() - t
    n_params = 0
    for f in sorted(path.glob("*.safetensors")):
        with safe_open(str(f), "pt") as fh:
            for k in fh.keys():  # noqa: SIM118 (safe_open has no __iter__)
                n = 1
                for d in fh.get_slice(k).get_shape():
                    n *= d
                n_params += n
    cfg = json.loads((path / "config.json").read_text())
    return {"path": str(path), "params": n_params, "build_seconds": built_s,
            "num_hidden_layers": cfg["num_hidden_layers"], "vocab_size": cfg["vocab_size"],
            "config": {k: cfg.get(k) for k in ("hidden_size", "intermediate_size",
                                                "num_hidden_layers", "num_attention_heads",
                                                "num_key_value_heads", "head_dim",
                                                "vocab_size", "dtype", "torch_dtype")}}


def child_vllm_prefill(p: dict) -> dict:
    t = time.perf_counter()
    from vllm import LLM, SamplingParams
    import_s = time.perf_counter() - t

    seqs = _sequences(p)
    defaults = None
    try:  # what LLM would pick without the explicit limits (reported only)
        from vllm.engine.arg_utils import EngineArgs

        ea = EngineArgs(model=p["model"], enforce_eager=True, enable_prefix_caching=False,
                        max_model_len=p["max_model_len"], dtype="bfloat16")
        dc = ea.create_engine_config()
        defaults = {"max_num_seqs": dc.scheduler_config.max_num_seqs,
                    "max_num_batched_tokens": dc.scheduler_config.max_num_batched_tokens}
    except Exception as exc:  # noqa: BLE001
        defaults = {"error": f"{type(exc).__name__}: {exc}"}

    kwargs = dict(model=p["model"], enforce_eager=True, enable_prefix_caching=False,
                  max_model_len=p["max_model_len"], dtype="bfloat16", seed=0)
    if p["match_scheduler"]:
        kwargs.update(max_num_seqs=SPEC_MAX_NUM_SEQS,
                      max_num_batched_tokens=max(SPEC_MIN_MAX_BATCHED_TOKENS,
                                                 p["max_model_len"]))
    t = time.perf_counter()
    llm = LLM(**kwargs)
    startup_s = time.perf_counter() - t
    sp = SamplingParams(max_tokens=1, temperature=0.0)

    def prompts(ss):
        return [{"prompt_token_ids": list(s)} for s in ss]

    t = time.perf_counter()
    llm.generate(prompts(_warmup_sequences(p)), sp, use_tqdm=False)
    warm_s = time.perf_counter() - t
    steps_ok = _try(lambda: llm.collective_rpc(bench_timers.time_worker_steps))
    calls, cpus, steps, ok = [], [], [], True
    for _ in range(p["calls"]):
        c0 = bench_timers.cpu_times()
        t = time.perf_counter()
        outs = llm.generate(prompts(seqs), sp, use_tqdm=False)
        calls.append(time.perf_counter() - t)
        cpus.append(bench_timers.cpu_delta(c0, bench_timers.cpu_times()))
        if steps_ok is True or isinstance(steps_ok, list):
            steps.append(llm.collective_rpc(bench_timers.read_worker_steps)[0])
        ok = ok and (len(outs) == len(seqs)
                     and all(list(o.prompt_token_ids) == s for o, s in zip(outs, seqs))
                     and all(len(o.outputs[0].token_ids) == 1 for o in outs))
        del outs
    tokens = sum(len(s) for s in seqs)
    gen_s = statistics.median(calls)
    return {"tokens": tokens, "seconds": gen_s, "tokens_per_s": tokens / gen_s,
            "calls_s": calls, "cpu_s": bench_timers.median_cpu(cpus), "cpu_s_per_call": cpus,
            "worker_steps": bench_timers.median_steps(steps), "worker_steps_per_call": steps,
            "worker_steps_error": None if isinstance(steps_ok, list) else steps_ok,
            "startup_s": startup_s, "import_s": import_s,
            "warmup_s": warm_s, "ok": ok,
            "config": _configs(llm.llm_engine.vllm_config), "llm_defaults": defaults,
            "processes": bench_timers.process_tree_info()}


def _capture_off(worker) -> bool:
    """Runs in the vLLM worker (sent by collective_rpc): remove the shim's hooks and its
    execute_model wrapper, and stop recording. ``_setup_hidden_states_capture`` (speculators'
    own ``_setup_capture``) installs a fresh capture again."""
    cap = getattr(worker, "_compat_capture", None)
    if cap is None:
        return False
    cap.remove()
    cap.enabled = False
    return True


def _worker_info(worker) -> dict:
    import torch

    runner = getattr(worker, "model_runner", None)
    return {"model_runner": f"{type(runner).__module__}.{type(runner).__name__}",
            "torch_threads": torch.get_num_threads(), "pid": os.getpid()}


def _start_generator(p: dict):
    t = time.perf_counter()
    import speculators_compat

    rep = speculators_compat.activate()
    from speculators.data_generation.vllm_hidden_states_generator import (
        VllmHiddenStatesGenerator,
    )
    import_s = time.perf_counter() - t
    t = time.perf_counter()
    gen = VllmHiddenStatesGenerator(p["model"], layer_ids=list(p["layer_ids"]),
                                    max_model_len=p["max_model_len"])
    startup_s = time.perf_counter() - t
    t = time.perf_counter()
    gen.generate(_warmup_sequences(p))
    warm_s = time.perf_counter() - t
    timers = bench_timers.Timers()
    for name in ("schedule", "add_request", "finish_requests"):
        timers.wrap(gen.scheduler, name)
    timers.wrap(gen.executor, "execute_model")
    timers.wrap(gen.executor, "sample_tokens")
    timers.wrap(gen.executor, "collective_rpc", by_method=True)
    bench_timers.wait_for_steps_first(gen.executor, timers.add_steps_in_flight)
    info = {"import_s": import_s, "startup_s": startup_s, "warmup_s": warm_s,
            "config": _configs(gen.vllm_config),
            "scheduler_limits": {
                "max_num_seqs": getattr(gen.scheduler, "max_num_running_reqs", None),
                "max_num_scheduled_tokens": getattr(gen.scheduler, "max_num_scheduled_tokens",
                                                    None)},
            "worker": gen.executor.collective_rpc(_worker_info),
            "adapters_applied": [a["name"] for a in rep.as_dict()["adapters"]
                                 if a["status"] == "applied"],
            "versions": rep.as_dict()["versions"]}
    return gen, timers, info


def _check_results(res, seqs, n_layers: int, hidden: int) -> tuple[bool, int]:
    nbytes = 0
    ok = len(res) == len(seqs)
    for r, s in zip(res, seqs):
        ok = ok and r["input_ids"].tolist() == s and len(r["hidden_states"]) == n_layers
        for h in r["hidden_states"]:
            ok = ok and tuple(h.shape) == (len(s), hidden)
            nbytes += h.numel() * h.element_size()
    return bool(ok), nbytes


def _try(fn):
    try:
        return fn()
    except Exception as exc:  # noqa: BLE001
        return f"{type(exc).__name__}: {exc}"


def child_generator(p: dict) -> dict:
    seqs = _sequences(p)
    gen, timers, info = _start_generator(p)
    gen.executor.collective_rpc(bench_timers.time_worker_steps)
    gen.executor.collective_rpc(bench_timers.read_transport)  # counters from here on
    calls, snaps, cpus, steps, ok, nbytes, transport = [], [], [], [], True, 0, []
    for _ in range(p["calls"]):
        timers.reset()
        c0 = bench_timers.cpu_times()
        t = time.perf_counter()
        res = gen.generate(seqs)
        dt = time.perf_counter() - t
        cpus.append(bench_timers.cpu_delta(c0, bench_timers.cpu_times()))
        snaps.append(timers.snapshot(dt))
        steps.append(gen.executor.collective_rpc(bench_timers.read_worker_steps)[0])
        transport.append(gen.executor.collective_rpc(bench_timers.read_transport)[0])
        calls.append(dt)
        good, nbytes = _check_results(res, seqs, len(set(p["layer_ids"])), p["hidden_size"])
        ok = ok and good
        del res
    tokens = sum(len(s) for s in seqs)
    gen_s = statistics.median(calls)
    return {"tokens": tokens, "seconds": gen_s, "tokens_per_s": tokens / gen_s,
            "calls_s": calls, "cpu_s": bench_timers.median_cpu(cpus), "cpu_s_per_call": cpus,
            "worker_steps": bench_timers.median_steps(steps), "worker_steps_per_call": steps,
            "ok": ok, "hidden_state_bytes": nbytes, "transport_per_call": transport,
            "breakdown": bench_timers.median_breakdown(snaps), **info,
            "processes": bench_timers.process_tree_info()}


def child_capture_on_off(p: dict) -> dict:
    """Capture on vs off in one generator, ABBA order (on,off,off,on / off,on,on,off by
    round parity), ``d_pairs`` pairs."""
    seqs = _sequences(p)
    gen, timers, info = _start_generator(p)
    tokens = sum(len(s) for s in seqs)
    block = ["on", "off", "off", "on"] if p["repeat"] % 2 == 0 else ["off", "on", "on", "off"]
    order = (block * p["d_pairs"])[: 2 * p["d_pairs"]]
    gen.executor.collective_rpc(bench_timers.time_worker_steps)
    gen.executor.collective_rpc(bench_timers.read_transport)  # counters from here on
    runs: dict[str, list] = {"on": [], "off": []}
    state = "on"
    ok = True
    for want in order:
        if want != state:
            if want == "off":
                done = gen.executor.collective_rpc(_capture_off)
                if not all(done):
                    raise RuntimeError(f"could not switch the capture off: {done}")
            else:
                gen._setup_capture()  # speculators' own method: fresh capture in the workers
            state = want
        if state == "on":
            gen.executor.collective_rpc(bench_timers.time_hooks)
        timers.reset()
        c0 = bench_timers.cpu_times()
        t = time.perf_counter()
        error = None
        try:
            res = gen.generate(seqs)
        except RuntimeError as exc:
            if state == "on" or "Failed to capture hidden states" not in str(exc):
                raise
            res, error = None, str(exc)
        dt = time.perf_counter() - t
        run = {"seconds": dt, "breakdown": timers.snapshot(dt),
               "cpu_s": bench_timers.cpu_delta(c0, bench_timers.cpu_times()),
               "worker_steps": gen.executor.collective_rpc(bench_timers.read_worker_steps)[0]}
        run["transport"] = gen.executor.collective_rpc(bench_timers.read_transport)[0]
        if state == "on":
            run["hooks"] = gen.executor.collective_rpc(bench_timers.read_hook_timers)[0]
            good, run["hidden_state_bytes"] = _check_results(
                res, seqs, len(set(p["layer_ids"])), p["hidden_size"])
            ok = ok and good
            del res
        else:
            run["ended_with"] = error
        runs[state].append(run)

    def summary(rs):
        sec = statistics.median([r["seconds"] for r in rs])
        return {"seconds": sec, "tokens_per_s": tokens / sec,
                "calls_s": [r["seconds"] for r in rs],
                "cpu_s": bench_timers.median_cpu([r["cpu_s"] for r in rs]),
                "hooks": [r.get("hooks") for r in rs],
                "transport": [r.get("transport") for r in rs],
                "worker_steps": bench_timers.median_steps([r["worker_steps"] for r in rs]),
                "breakdown": bench_timers.median_breakdown([r["breakdown"] for r in rs])}

    on, off = summary(runs["on"]), summary(runs["off"])
    on["hook_cpu_s"] = statistics.median([h["cpu_s"] for h in on["hooks"] if h])
    return {"tokens": tokens, "order": order, "on": on, "off": off,
            "overhead_s": on["seconds"] - off["seconds"],
            "overhead_frac": (on["seconds"] - off["seconds"]) / on["seconds"],
            "ended_with": runs["off"][0]["ended_with"], "ok": ok, **info}


def child_import_vllm(p: dict) -> dict:
    t = time.perf_counter()
    import vllm  # noqa: F401
    import_vllm_s = time.perf_counter() - t
    n_mod = len(sys.modules)
    t = time.perf_counter()
    from vllm import LLM  # noqa: F401
    llm_s = time.perf_counter() - t
    return {"import_vllm_s": import_vllm_s, "from_vllm_import_LLM_s": llm_s,
            "modules_after_import_vllm": n_mod, "modules_after_LLM": len(sys.modules)}


def child_activate_cold(p: dict) -> dict:
    """Cold: ``import speculators_compat; activate()`` right after ``import vllm``; this
    includes importing speculators' generator module (and whatever vLLM modules it and the
    shim's probes pull in). Not split further: a shared dependency is charged to whichever
    import comes first, so per-probe attribution here would mislead; ``activate_warm``
    measures the shim's own part cleanly."""
    import vllm  # noqa: F401

    n0 = len(sys.modules)
    t = time.perf_counter()
    import speculators_compat

    speculators_compat.activate()
    total = time.perf_counter() - t
    return {"activate_total_s": total, "modules_added": len(sys.modules) - n0}


def child_activate_warm(p: dict) -> dict:
    """``activate()`` with vLLM and speculators' generator module already imported: the
    shim's own cost. speculators 0.3/0.4 import only with the shim's import-time fixes on
    transformers 5, and ``activate()`` refuses to come after a speculators import that such
    a fix must precede (those modules stay broken), so the generator module is imported
    under a first ``activate()``, the shim deactivated, and the second ``activate()`` timed
    (every module it needs is then cached, as in a long-lived process).
    ``import_generator_s`` is the first ``activate()`` with the generator import it does."""
    import importlib

    import vllm  # noqa: F401

    import speculators_compat

    n0 = len(sys.modules)
    t = time.perf_counter()  # the first activate() imports the generator module (probes)
    speculators_compat.activate()
    importlib.import_module(GENERATOR_MODULE)
    gen_s = time.perf_counter() - t
    speculators_compat.deactivate()
    n1 = len(sys.modules)
    t = time.perf_counter()
    speculators_compat.activate()
    act_s = time.perf_counter() - t
    return {"import_generator_s": gen_s, "activate_s": act_s, "reactivated": True,
            "modules_by_generator": n1 - n0, "modules_by_activate": len(sys.modules) - n1}


CHILDREN = {"build": child_build, "vllm_prefill": child_vllm_prefill,
            "generator": child_generator, "capture_on_off": child_capture_on_off,
            "import_vllm": child_import_vllm, "activate_cold": child_activate_cold,
            "activate_warm": child_activate_warm}


# -------------------------------------------------------------------------------- parent
def run_child(mode: str, params: dict, timeout: int, log_dir: Path | None) -> dict:
    env = dict(os.environ)
    env.pop("SPECULATORS_COMPAT_ACTIVE", None)
    env.setdefault("VLLM_CPU_KVCACHE_SPACE", str(params["kv_cache_gib"]))
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    # lets LLM.collective_rpc carry the benchmark's timing callable to (a)'s worker (the
    # generator's executor takes callables anyway); set for every mode alike
    env.setdefault("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")
    if params.get("cpu_detail"):
        env[bench_timers.CPU_DETAIL_ENV] = "1"
    if params.get("pycache_prefix"):
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        env["PYTHONPYCACHEPREFIX"] = params["pycache_prefix"]
    if env.get("PYTHONPATH"):
        env["PYTHONPATH"] = os.pathsep.join(os.path.abspath(x) for x in
                                            env["PYTHONPATH"].split(os.pathsep) if x)
    load_before = os.getloadavg()
    with tempfile.NamedTemporaryFile("w+", suffix=f"-{mode}.log", delete=False,
                                     dir=log_dir) as log:
        t = time.perf_counter()
        proc = subprocess.Popen([sys.executable, str(Path(__file__).resolve()), "--child", mode,
                                 "--params", json.dumps(params)], env=env, stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True, cwd=ROOT)
        try:
            rc = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            rc = "timeout"
        finally:
            try:  # vLLM processes left by this child only (its own session)
                os.killpg(proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            proc.wait()
        wall = time.perf_counter() - t
    text = Path(log.name).read_text(errors="replace")
    result = None
    for line in text.splitlines():
        if line.startswith(MARK):
            result = json.loads(line[len(MARK):])
    if result is None:
        result = {"error": f"no result (rc={rc})", "log_tail": text[-4000:]}
    if log_dir is None:
        os.unlink(log.name)
    else:
        result["log"] = log.name
    result.update(mode=mode, rc=rc, wall_s=wall, loadavg_before=load_before,
                  loadavg_after=os.getloadavg())
    return result


def _stats(values: list[float]) -> dict | None:
    values = [v for v in values if v is not None]
    if not values:
        return None
    return {"median": statistics.median(values), "min": min(values), "max": max(values),
            "n": len(values), "values": values}


def _steps_s(breakdown: dict) -> float:
    """A call's steps in the driver's timers: ``execute_model`` and, where the steps are
    sent one ahead (``step_overlap``: ``execute_model`` returns at once), the wait for the
    steps still running when the states are asked for."""
    seconds = breakdown["seconds"]
    return seconds.get("execute_model", 0.0) + seconds.get("steps in flight", 0.0)


def aggregate(runs: list[dict]) -> dict:
    """Statistics over the rounds, under the report's keys: a mode's letter
    (``perfreport.LETTERS``: ``a_...`` for vllm_prefill, ``b_...`` generator, ``d_...``
    capture_on_off) or, for the start-up costs, its earlier name (``c_vllm.``,
    ``c_activate.``, ``c_activate_warm.``). Runs recorded under old mode names count
    as their new ones."""
    def ok(mode):
        return [r for r in runs if canonical_mode(r["mode"]) == mode and "error" not in r]

    a, b, d = ok("vllm_prefill"), ok("generator"), ok("capture_on_off")
    agg: dict = {}
    agg["a_tokens_per_s"] = _stats([r["tokens_per_s"] for r in a])
    agg["a_startup_s"] = _stats([r["startup_s"] for r in a])
    agg["b_tokens_per_s"] = _stats([r["tokens_per_s"] for r in b])
    agg["b_startup_s"] = _stats([r["startup_s"] for r in b])
    # each process's fastest call: contention on a shared machine only ever adds time
    agg["a_best_tokens_per_s"] = _stats([r["tokens"] / min(r["calls_s"]) for r in a
                                         if r.get("calls_s")])
    agg["b_best_tokens_per_s"] = _stats([r["tokens"] / min(r["calls_s"]) for r in b
                                         if r.get("calls_s")])
    agg["d_on_tokens_per_s"] = _stats([r["on"]["tokens_per_s"] for r in d])
    agg["d_off_tokens_per_s"] = _stats([r["off"]["tokens_per_s"] for r in d])
    agg["d_overhead_frac"] = _stats([r["overhead_frac"] for r in d])
    agg["d_overhead_s"] = _stats([r["overhead_s"] for r in d])
    for part in ("execute_model", "collective_rpc:_get_captured_states", "rest"):
        for state in ("on", "off"):
            agg[f"d_{state}.{part}"] = _stats([r[state]["breakdown"]["seconds"].get(part, 0.0)
                                               for r in d])
    for state in ("on", "off"):
        agg[f"d_{state}.steps"] = _stats([_steps_s(r[state]["breakdown"]) for r in d])
    for name, rows in (("a", [r["cpu_s"] for r in a]), ("b", [r["cpu_s"] for r in b]),
                       ("d_on", [r["on"]["cpu_s"] for r in d]),
                       ("d_off", [r["off"]["cpu_s"] for r in d])):
        for proc in sorted({k for c in rows for k in c}):
            agg[f"{name}_cpu_s.{proc}"] = _stats([c.get(proc, 0.0) for c in rows])
    for name, rows in (("a", [r.get("worker_steps") for r in a]),
                       ("b", [r.get("worker_steps") for r in b]),
                       ("d_on", [r["on"].get("worker_steps") for r in d]),
                       ("d_off", [r["off"].get("worker_steps") for r in d])):
        rows = [x for x in rows if x]
        agg[f"{name}_worker_step_wall_s"] = _stats([x["wall_s"] for x in rows])
        agg[f"{name}_worker_step_cpu_s"] = _stats([x["cpu_s"] for x in rows])
    agg["d_hook_cpu_s"] = _stats([r["on"].get("hook_cpu_s") for r in d])

    def transport(calls, key):
        vals = [t[key] for t in calls or () if t]
        return statistics.median(vals) if vals else None

    # the transport's own in-step copy (CallSink.write), per call
    agg["b_transport_write_s"] = _stats([transport(r.get("transport_per_call"), "write_s")
                                         for r in b])
    agg["d_on_transport_write_s"] = _stats([transport(r["on"].get("transport"), "write_s")
                                            for r in d])
    # how much one process's identical calls differ with nothing changed between them:
    # (a)'s worker step CPU, max / min over its calls (no shim in that process)
    agg["a_step_cpu_spread"] = _stats([
        max(c) / min(c) for r in a
        for c in [[x["cpu_s"] for x in r.get("worker_steps_per_call") or () if x]]
        if len(c) > 1 and min(c) > 0])
    agg["d_step_overhead_frac"] = _stats([
        (_steps_s(r["on"]["breakdown"]) - _steps_s(r["off"]["breakdown"]))
        / _steps_s(r["off"]["breakdown"]) for r in d if _steps_s(r["off"]["breakdown"])])
    keys = sorted({k for r in b for k in r["breakdown"]["seconds"]})
    agg["b_breakdown_s"] = {k: _stats([r["breakdown"]["seconds"].get(k, 0.0) for r in b])
                            for k in keys}
    agg["b_seconds"] = _stats([r["seconds"] for r in b])
    for mode, key, fields in (
            ("import_vllm", "c_vllm", ("import_vllm_s", "from_vllm_import_LLM_s")),
            ("activate_cold", "c_activate", ("activate_total_s",)),
            ("activate_warm", "c_activate_warm", ("import_generator_s", "activate_s"))):
        for f in fields:
            agg[f"{key}.{f}"] = _stats([r[f] for r in ok(mode)])
    # ratios: of medians, and paired per round (adjacent runs)
    ratios: dict = {}
    if agg["a_tokens_per_s"] and agg["b_tokens_per_s"]:
        ratios["b_over_a"] = (agg["b_tokens_per_s"]["median"]
                              / agg["a_tokens_per_s"]["median"])
        pairs = {}
        for r in runs:
            letter = LETTERS.get(canonical_mode(r["mode"]))
            if letter in ("a", "b") and "error" not in r:
                pairs.setdefault(r["repeat"], {})[letter] = r["tokens_per_s"]
        ratios["b_over_a_paired"] = _stats([v["b"] / v["a"] for v in pairs.values()
                                            if "a" in v and "b" in v])
    if agg["a_best_tokens_per_s"] and agg["b_best_tokens_per_s"]:
        ratios["b_over_a_best"] = (agg["b_best_tokens_per_s"]["median"]
                                   / agg["a_best_tokens_per_s"]["median"])
    wa, wb = agg.get("a_cpu_s.VLLM::Worker"), agg.get("b_cpu_s.VLLM::Worker")
    if wa and wb:
        ratios["worker_cpu_b_over_a"] = wb["median"] / wa["median"]
    sa, sb = agg.get("a_worker_step_wall_s"), agg.get("b_worker_step_wall_s")
    if sa and sb:
        ratios["worker_step_wall_b_over_a"] = sb["median"] / sa["median"]
    sa, sb = agg.get("a_worker_step_cpu_s"), agg.get("b_worker_step_cpu_s")
    if sa and sb:
        ratios["worker_step_cpu_b_over_a"] = sb["median"] / sa["median"]
    won, woff = agg.get("d_on_cpu_s.VLLM::Worker"), agg.get("d_off_cpu_s.VLLM::Worker")
    if won and woff:
        ratios["d_worker_cpu_on_over_off"] = won["median"] / woff["median"]
    if agg["a_tokens_per_s"] and agg["d_off_tokens_per_s"]:
        ratios["d_off_over_a"] = (agg["d_off_tokens_per_s"]["median"]
                                  / agg["a_tokens_per_s"]["median"])
    iv = agg.get("c_vllm.import_vllm_s")
    if iv:
        for key, name in (("c_activate_warm.activate_s", "activate_own_over_import_vllm"),
                          ("c_activate.activate_total_s",
                           "activate_cold_total_over_import_vllm"),
                          ("c_activate_warm.import_generator_s",
                           "import_generator_over_import_vllm")):
            if agg.get(key):
                ratios[name] = agg[key]["median"] / iv["median"]
    agg["ratios"] = ratios
    targets = {}
    if "b_over_a" in ratios:
        targets["b_ge_0.9a"] = ratios["b_over_a"] >= 0.9
    if "activate_own_over_import_vllm" in ratios:
        targets["activate_lt_5pct_import_vllm"] = ratios["activate_own_over_import_vllm"] < 0.05
    agg["targets"] = targets
    return agg


def machine_info() -> dict:
    cpu = None
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    from speculators_compat import _versions

    return {"cpus": os.cpu_count(), "cpu_model": cpu, "python": platform.python_version(),
            "affinity": sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
            else None,
            "PYTHONDONTWRITEBYTECODE": os.environ.get("PYTHONDONTWRITEBYTECODE"),
            "LD_PRELOAD": os.environ.get("LD_PRELOAD"),
            "platform": platform.platform(),
            "versions": {m: _versions.installed(m) for m in
                         ("vllm", "torch", "transformers", "speculators",
                          "speculators_compat")}}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--num-seqs", type=int, default=16)
    ap.add_argument("--seq-len", type=int, default=384)
    ap.add_argument("--max-model-len", type=int, default=512)
    ap.add_argument("--layers", default=None,
                    help="comma-separated layer ids (default: speculators' own choice of 4, "
                         "[2, n/2, n-3, n-1])")
    ap.add_argument("--modes", default=",".join(MODES),
                    help=f"subset of {','.join(MODES)}, run in this order each round "
                         f"(aliases: {', '.join(f'{k}={v}' for k, v in MODE_ALIASES.items())})")
    ap.add_argument("--calls", type=int, default=3,
                    help="timed generate() calls per vllm_prefill/generator process (its value: "
                         "the median)")
    ap.add_argument("--d-pairs", type=int, default=3,
                    help="capture_on_off: capture on/off pairs per process, ABBA order (each "
                         "state's value is the median of its calls: 3 outvote one slow call)")
    ap.add_argument("--warmup", choices=("full", "small"), default="full",
                    help="untimed warm-up call: same shape as the timed one, or 2 x 16 tokens")
    ap.add_argument("--no-match-scheduler", action="store_true",
                    help="vllm_prefill: keep LLM's default max_num_seqs/max_num_batched_tokens")
    ap.add_argument("--kv-cache-gib", type=int, default=1,
                    help="VLLM_CPU_KVCACHE_SPACE (GiB, integer) for the children, unless "
                         "already set")
    ap.add_argument("--cpu-detail", action="store_true",
                    help="also record each process's system CPU time and minor page faults "
                         "per call (extra rows in the report)")
    ap.add_argument("--no-pycache", action="store_true",
                    help="run the children with the interpreter's bytecode settings as they "
                         "are (default: write/read bytecode under .cache/bench/pycache, "
                         "as an ordinary installation with .pyc files would)")
    ap.add_argument("--no-prime", action="store_true",
                    help="skip the untimed priming run of each mode (bytecode, page cache)")
    ap.add_argument("--ckpt-root", default=str(ROOT / ".cache" / "bench"))
    ap.add_argument("--timeout", type=int, default=1800, help="per child, seconds")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "cpu" / "results.json"))
    ap.add_argument("--plot", default=None,
                    help="plot path (default: docs/perf.svg for the default --out, else "
                         "--out with .svg, so a side run never overwrites the docs' plot)")
    ap.add_argument("--update-docs", action="store_true",
                    help="rewrite the generated results block of docs/performance.md")
    ap.add_argument("--docs", default=str(ROOT / "docs" / "performance.md"))
    ap.add_argument("--keep-logs", default=None, help="directory for the children's logs")
    ap.add_argument("--render", default=None, metavar="RESULTS_JSON",
                    help="only re-render plot/docs from an existing results file")
    ap.add_argument("--child", choices=sorted(CHILDREN), help=argparse.SUPPRESS)
    ap.add_argument("--params", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)

    if a.child:
        sys.path.insert(0, str(ROOT / "src"))
        bench_timers.pickle_by_value()
        _emit(CHILDREN[a.child](json.loads(a.params)))
        return 0

    import perfreport

    if a.plot is None:
        side_run = (not a.render and Path(a.out).resolve()
                    != (ROOT / "benchmarks" / "cpu" / "results.json").resolve())
        a.plot = str(Path(a.out).with_suffix(".svg") if side_run else ROOT / "docs" / "perf.svg")

    if a.render:
        data = json.loads(Path(a.render).read_text())
        data["aggregate"] = aggregate(data["runs"])
        perfreport.write_outputs(data, plot=a.plot, docs=a.docs if a.update_docs else None)
        print(perfreport.markdown(data))
        return 0

    modes = [canonical_mode(m) for m in a.modes.split(",") if m]
    bad = [m for m in modes if m not in MODES]
    if bad:
        ap.error(f"unknown modes {bad}")
    log_dir = Path(a.keep_logs) if a.keep_logs else None
    if log_dir:
        log_dir.mkdir(parents=True, exist_ok=True)
    overrides = dict(MODEL_OVERRIDES)
    name = "llama-" + "-".join(f"{k}{v}" for k, v in sorted(overrides.items()))
    base = {"kv_cache_gib": a.kv_cache_gib, "cpu_detail": a.cpu_detail,
            "pycache_prefix": None if a.no_pycache else str(Path(a.ckpt_root) / "pycache")}
    print(f"building/reusing checkpoint {name} ...", flush=True)
    built = run_child("build", {**base, "ckpt_root": a.ckpt_root, "ckpt_name": name,
                                "overrides": overrides}, a.timeout, log_dir)
    if "error" in built:
        print(json.dumps(built, indent=2))
        return 1
    n = built["num_hidden_layers"]
    layers = ([int(x) for x in a.layers.split(",")] if a.layers
              else [2, n // 2, n - 3, n - 1])
    params = {**base, "model": built["path"], "num_seqs": a.num_seqs, "seq_len": a.seq_len,
              "max_model_len": a.max_model_len, "layer_ids": layers,
              "vocab_size": built["vocab_size"], "hidden_size": built["config"]["hidden_size"],
              "match_scheduler": not a.no_match_scheduler, "calls": a.calls,
              "d_pairs": a.d_pairs, "warmup": a.warmup}
    print(f"checkpoint {built['path']}: {built['params']:,} parameters; "
          f"{a.num_seqs} x {a.seq_len} tokens; layers {layers}; {a.repeats} rounds of "
          f"{','.join(modes)}", flush=True)
    data = {"argv": sys.argv[1:], "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "machine": machine_info(), "checkpoint": built, "params": params, "runs": []}
    if not a.no_prime:
        # untimed: compiles/caches bytecode, loads the checkpoint into the page cache
        prime = {**params, "num_seqs": 2, "seq_len": 16, "repeat": -1, "calls": 1}
        for mode in modes:
            if mode != "capture_on_off":
                res = run_child(mode, prime, a.timeout, log_dir)
                res["repeat"] = -1
                data.setdefault("prime", []).append(res)
                print("(prime) " + perfreport.one_line(res), flush=True)
    for r in range(a.repeats):
        for mode in modes:
            res = run_child(mode, {**params, "repeat": r}, a.timeout, log_dir)
            res["repeat"] = r
            data["runs"].append(res)
            print(perfreport.one_line(res), flush=True)
    data["finished"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    data["aggregate"] = aggregate(data["runs"])
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(_repo_relative(data), indent=1, default=str) + "\n")
    perfreport.write_outputs(data, plot=a.plot, docs=a.docs if a.update_docs else None)
    print(perfreport.markdown(data))
    print(f"wrote {a.out}, {a.plot}" + (f", {a.docs}" if a.update_docs else ""))
    failed = [r for r in data["runs"] + data.get("prime", [])
              if "error" in r or r.get("ok") is False]
    return 1 if failed else 0


def _repo_relative(obj):
    """``obj`` with every string that names a path under the repository written relative
    to it: a results file committed to ``benchmarks/`` then says nothing about the
    checkout it was made in (the children got the absolute paths)."""
    root = str(ROOT) + os.sep
    if isinstance(obj, dict):
        return {k: _repo_relative(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_repo_relative(v) for v in obj]
    if isinstance(obj, str) and obj.startswith(root):
        return obj[len(root):]
    return obj


def _exit_on_signal(signum, _frame) -> None:
    """SIGTERM / SIGHUP end the benchmark as Ctrl+C does: through the ``finally`` that
    kills the running child's session (its vLLM processes would otherwise outlive it)."""
    sys.exit(128 + signum)


if __name__ == "__main__":
    if "--child" not in sys.argv:
        for _sig in (signal.SIGTERM, signal.SIGHUP):
            signal.signal(_sig, _exit_on_signal)
    sys.exit(main())
