"""The GPU benchmark's report: a pure function of the recorded JSON files.

The renderer of ``gpu_bench.py`` (as ``tools/matrix/matrix_render.py`` is of
``tools/matrix/matrix.py``):
``gpu_bench.json`` files (several calls and machines merged) and, beside them, the files of
``offline_script_bench.py`` become the markdown block of docs/performance.md ("GPU
results": the summary), docs/performance-gpu-details.md (the counters that explain a
cell) and docs/perf-gpu.svg; a unit test renders both again from the files the block
names (``tests/unit/test_perf_docs_current.py``). Nothing here runs a model.

Rows are keyed by path (``a``, ``c``, ``b:<release>`` with the settings that tell runs
apart, and ``|tpN`` at tensor parallel N), loop (``offline``, ``held``, ``dropped``; files
recorded before the loops were named: ``--hold all`` = held, ``--hold call`` = dropped; (a)
has none) and batch size. Every ratio is taken within one run (file) and round, then the
median over runs and rounds; the targets (:func:`_targets`) read those.

    python3 benchmarks/gpu/gpu_bench_render.py FILES... [--update-docs] [--plot SVG]
    (or: python3 benchmarks/gpu/gpu_bench.py render FILES...)
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BENCH = Path(__file__).resolve().parent

GPU_BEGIN = ("<!-- BEGIN GENERATED GPU RESULTS "
             "(benchmarks/gpu/gpu_bench.py render --update-docs) -->")
GPU_END = "<!-- END GENERATED GPU RESULTS -->"
LABELS = {"a": "(a) vLLM LLM.generate, max_tokens=1", "c": "(c) native extract_hidden_states"
          " + ExampleHiddenStatesConnector, files loaded"}
LOOP_LABELS = {"offline": "offline script's loop", "held": "every result held",
               "dropped": "results dropped per call"}
LOOP_ORDER = {"offline": 0, "held": 1, "dropped": 2, None: -1}

#: Targets (docs/performance.md): (b)/(a) and (b)/(c) per loop, batch and release, each
#: ratio from one run; two rounds within ROUNDS_AGREE; (b)'s driver peak RSS at most (c)'s.
MIN_B_OVER_A = 0.95
MIN_B_OVER_C = 1.0
ROUNDS_AGREE = 0.03


def src_digest() -> str:
    """sha256 (12 hex digits) of the shim's sources (``src/speculators_compat/**/*.py``):
    names the code a device run used even where the copy there has no git history; the
    render compares it with this checkout's."""
    h = hashlib.sha256()
    base = ROOT / "src" / "speculators_compat"
    for f in sorted(base.rglob("*.py")):
        h.update(str(f.relative_to(base)).encode() + b"\0" + f.read_bytes() + b"\0")
    return h.hexdigest()[:12]


# -------------------------------------------------------------------------- row keys
def _run_mode(r: dict) -> str:
    """A child's path as the report keys it: (b) runs are told apart by the shim settings
    they ran with (``SPECULATORS_COMPAT_*``), the driver threads of the transport's copies
    where recorded (``b:0.4.0.1|t8``) and the measurement switches; any run at tensor
    parallel N > 1 by that (``a|tp2``; a run without a TP field is TP 1)."""
    mode = r.get("mode") or ""
    if mode.startswith("b:"):
        passes = r.get("passes", [])

        def drv(ps):
            return ps.get("driver_abs") or ps.get("driver") or {}

        key = ("copy_pool_threads" if any("copy_pool_threads" in drv(ps) for ps in passes)
               else "copy_threads")
        threads = {drv(ps).get(key) for ps in passes}
        threads.discard(None)
        if len(threads) == 1:
            mode = f"{mode}|t{threads.pop()}"
        if _zero_copy(r):
            mode = f"{mode}|zc"
            if any("copied_ahead" in drv(ps) for ps in passes):
                mode = f"{mode}|ca"  # held calls copied into memory made during the forward
            if any(drv(ps).get("early_calls") for ps in passes):
                mode = f"{mode}|ec"  # rows copied while the model ran
        if r.get("memory_ahead") is False:
            mode = f"{mode}|nma"
        elif r.get("huge_pages") is False:
            mode = f"{mode}|nhp"
        if r.get("early_copy") is False:
            mode = f"{mode}|nec"
        for k, v in sorted((r.get("compat_env") or {}).items()):
            mode = f"{mode}|{k.removeprefix('SPECULATORS_COMPAT_').lower()}={v}"
    tp = r.get("tp") or 1
    return f"{mode}|tp{tp}" if tp != 1 and mode else mode


def _pass_loop(r: dict, ps: dict) -> str | None:
    """The loop a pass ran; for files recorded before the loops were named, from the
    child's ``hold`` (all: held; call: dropped; (c) held every result then); (a) has
    none."""
    if "loop" in ps:
        return ps["loop"]
    mode = r.get("mode") or ""
    if mode.startswith("a"):
        return None
    return "dropped" if mode.startswith("b:") and r.get("hold") == "call" else "held"


def _zero_copy(r: dict) -> bool:
    """Did this (b) run's shim hand speculators' clone() the memory (zero copy)? From its
    activation report (runs before zero copy existed: no)."""
    adapters = ((r.get("report") or {}).get("adapters") or []) if isinstance(
        r.get("report"), dict) else []
    return any(a.get("name") == "shm_transport" and "takes the memory over" in str(
        a.get("reason")) for a in adapters if isinstance(a, dict))


def _mode_parts(key: str) -> tuple[str, str, int]:
    """``b:0.4.0.1|t8|tp2`` -> (``b:0.4.0.1``, ``8``, 2); ``a`` -> (``a``, ``""``, 1)."""
    base, *tags = key.split("|")
    threads = next((t[1:] for t in tags if t[:1] == "t" and t[1:].isdigit()), "")
    tp = next((int(t[2:]) for t in tags if t[:2] == "tp" and t[2:].isdigit()), 1)
    return base, threads, tp


def _with_tp(base: str, tp: int) -> str:
    """The key of mode ``base`` (``a``, ``c``) at TP size ``tp``."""
    return f"{base}|tp{tp}" if tp != 1 else base


def _ref(base: str, key: str) -> str:
    """The (a) or (c) row a row is compared with: the same TP size."""
    return _with_tp(base, _mode_parts(key)[2])


def _row_order(row: tuple) -> tuple:
    """Rows grouped by TP size, then (a), (b), (c), then batch (largest first), loop."""
    mode, loop, batch = row
    return (_mode_parts(mode)[2], mode[:1], mode, -batch, LOOP_ORDER.get(loop, 9))


def _tp_suffix(key: str) -> str:
    tp = _mode_parts(key)[2]
    return f", TP {tp}" if tp != 1 else ""


def _b_version(mode: str, what: str) -> str:
    base, threads, _ = _mode_parts(mode)
    tags = mode.split("|")[1:]
    envs = [t for t in tags if "=" in t]
    return (f"(b) speculators {base[2:]} {what}"
            + (", zero copy" if "zc" in tags else "")
            + ((" or copies into ordinary memory (none made ahead)" if "nma" in tags
                else " or copies into memory made ahead") if "ca" in tags else "")
            + (f", {threads} copy threads" if threads and ("zc" not in tags or "ca" in tags)
               else "")
            + (", memory made ahead without huge pages" if "nhp" in tags else "")
            + (", rows copied while the model ran" if "ec" in tags else "")
            + (", early copy off" if "nec" in tags else "")
            + "".join(f", {e}" for e in envs))


def _label(mode: str, loop: str | None = None) -> str:
    if mode.startswith("b:"):
        text = _b_version(mode, "generator via shim")
    else:
        text = LABELS.get(_mode_parts(mode)[0], _mode_parts(mode)[0])
    return text + (f", {LOOP_LABELS.get(loop, loop)}" if loop else "") + _tp_suffix(mode)


def _short_label(mode: str, loop: str | None = None) -> str:
    if mode.startswith("b:"):
        text = f"(b) {_mode_parts(mode)[0][2:]}"
    else:
        text = {"a": "(a) vLLM", "c": "(c) native"}.get(_mode_parts(mode)[0], mode)
    return text + (f", {loop}" if loop else "") + _tp_suffix(mode)


# ------------------------------------------------------------------------- statistics
def _stats(xs: list[float]) -> dict | None:
    xs = sorted(x for x in xs if x is not None)
    if not xs:
        return None
    n = len(xs)
    med = xs[n // 2] if n % 2 else (xs[n // 2 - 1] + xs[n // 2]) / 2
    return {"median": med, "min": xs[0], "max": xs[-1], "n": n}


def _median(xs: list[float]) -> float:
    st = _stats(xs)
    return st["median"] if st else 0.0


def pass_noise(ps: dict) -> float | None:
    """Relative standard error of a pass's tokens/s from its calls' spread (each call's
    tokens/s); ``None`` where the pass did not record its calls' tokens or has one call."""
    calls, toks = ps.get("calls_s") or [], ps.get("calls_tokens") or []
    rates = [k / s for k, s in zip(toks, calls) if s]
    if len(rates) < 2:
        return None
    mean = sum(rates) / len(rates)
    var = sum((r - mean) ** 2 for r in rates) / (len(rates) - 1)
    return (var ** 0.5 / mean) / len(rates) ** 0.5


def _peak_gib(ps: dict) -> float | None:
    """The driver's peak RSS during a pass (reset at its start), GiB."""
    if not ps.get("peak_reset"):
        return None
    kib = (ps.get("peak_rss") or {}).get("vmhwm_kib")
    return kib / 2**20 if kib else None


def aggregate(docs: list[dict]) -> dict:
    """Per row (path, loop, batch): tokens/s over runs and rounds, per-pass details, the
    ratios to (a) and (c) of the same run and round, rounds' spread, driver memory;
    failures and skipped passes; correctness from every file."""
    tps: dict[tuple, list[float]] = {}
    by_round: dict[tuple, dict] = {}  # (file, round, mode, loop, batch) -> pass facts
    extra: dict[tuple, dict[str, list]] = {}
    proc_peak: dict[str, list[float]] = {}
    file_peak: dict[tuple[int, str], list[float]] = {}
    failures = []
    for fi, d in enumerate(docs):
        for r in d.get("runs", []):
            mode = _run_mode(r)
            if not r.get("ok"):
                failures.append({"mode": mode, "round": r.get("round"),
                                 "error": r.get("error"), "file": fi,
                                 "partial": bool(r.get("passes"))})
                if not r.get("passes"):
                    continue
            for s in r.get("skipped") or []:
                failures.append({"mode": mode, "round": s.get("round"), "file": fi,
                                 "error": f"{s.get('loop') or 'pass'}, batch {s.get('batch')}"
                                          f": not run ({s.get('why')})", "skipped": True})
            # A process that ran no pass (every one skipped for the deadline) peaked at its
            # engine start only: its peak says nothing about a loop's memory.
            hwm = (r.get("rss_end_kib") or {}).get("vmhwm_kib")
            if r.get("passes"):
                proc_peak.setdefault(mode, []).append(hwm / 2**20 if hwm else None)
                if hwm:
                    file_peak.setdefault((fi, mode), []).append(hwm / 2**20)
            for ps in r.get("passes", []):
                loop = _pass_loop(r, ps)
                row = (mode, loop, ps["batch"])
                rnd = ps.get("round", r.get("round", 0)) or 0
                tps.setdefault(row, []).append(ps["tokens_per_s"])
                by_round[(fi, rnd, *row)] = {"tps": ps["tokens_per_s"], "noise": pass_noise(ps),
                                             "peak": _peak_gib(ps)}
                e = extra.setdefault(row, {})
                for k in ("consume_s", "load_s", "generate_s", "seconds", "drain_s"):
                    if ps.get(k) is not None:
                        e.setdefault(k, []).append(ps[k])
                ok = ps.get("results_unchanged", ps.get("held_results_unchanged"))
                if ok is not None:
                    e.setdefault("held_ok", []).append(1.0 if ok else 0.0)
                if isinstance(ps.get("files"), dict):
                    e.setdefault("files_ok", []).append(1.0 if ps["files"].get("ok") else 0.0)
                    if ps["files"].get("saved_over_states") is not None:
                        e.setdefault("files_over", []).append(ps["files"]["saved_over_states"])
                if ps.get("drain_exceeds_a_call") is not None:
                    e.setdefault("drain_long", []).append(1.0 if ps["drain_exceeds_a_call"]
                                                          else 0.0)
                if _peak_gib(ps) is not None:
                    e.setdefault("peak_gib", []).append(_peak_gib(ps))
                released = ps.get("rss_released_kib") or (ps.get("rss_released") or {}).get(
                    "vmrss_kib")
                if released and r.get("rss_after_warmup_kib"):
                    e.setdefault("rss_growth_mib", []).append(
                        (released - r["rss_after_warmup_kib"]) / 1024)
    agg = {"tokens_per_s": {row: _stats(v) for row, v in tps.items()},
           "extra": {row: {k: _stats(v) for k, v in e.items()} for row, e in extra.items()},
           "proc_peak_gib": {m: _stats(v) for m, v in proc_peak.items()},
           "failures": failures, "by_round": by_round}
    ratios, rounds = {}, {}
    for row, v in tps.items():
        mode, loop, batch = row
        refs = [("a", (_ref("a", mode), None, batch))]
        if mode.startswith("b:"):
            refs.append(("c", (_ref("c", mode), loop, batch)))
        for name, ref in refs:
            if ref == row or not tps.get(ref):
                continue
            pairs = [(fi, rd, f["tps"] / by_round[(fi, rd, *ref)]["tps"],
                      _combine(f["noise"], by_round[(fi, rd, *ref)]["noise"]),
                      _ratio(f["peak"], by_round[(fi, rd, *ref)]["peak"]))
                     for (fi, rd, *rr), f in by_round.items()
                     if tuple(rr) == row and (fi, rd, *ref) in by_round]
            ratios[(row, name)] = {
                "medians": _stats(v)["median"] / _stats(tps[ref])["median"],
                "paired": _stats([x[2] for x in pairs]),
                "noise": _stats([x[3] for x in pairs]),
                "peak": _stats([x[4] for x in pairs]),
                "by_round": {(fi, rd): x for fi, rd, x, _, _ in pairs}}
        # The rounds of one file: their spread (max / min - 1), for tokens/s and each ratio.
        per_file: dict[int, dict[int, float]] = {}
        for (fi, rd, *rr), f in by_round.items():
            if tuple(rr) == row:
                per_file.setdefault(fi, {})[rd] = f["tps"]
        rounds[row] = {"tps": _spread(per_file)}
        for name in ("a", "c"):
            rr = (ratios.get((row, name)) or {}).get("by_round") or {}
            files: dict[int, dict[int, float]] = {}
            for (fi, rd), x in rr.items():
                files.setdefault(fi, {})[rd] = x
            rounds[row][name] = _spread(files)
    agg["ratios"] = ratios
    agg["rounds"] = rounds
    # Whole processes, for files whose passes did not record their own peaks: (b)'s
    # process peak over (c)'s, per file.
    agg["proc_peak_ratio"] = {}
    for m in {m for _, m in file_peak if m.startswith("b:")}:
        c = _ref("c", m)
        agg["proc_peak_ratio"][m] = _stats([
            _median(v) / _median(file_peak[(fi, c)]) for (fi, mm), v in file_peak.items()
            if mm == m and (fi, c) in file_peak])
    agg["correctness"] = [d.get("correctness") for d in docs if d.get("correctness")]
    return agg


def _combine(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else (a * a + b * b) ** 0.5


def _ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or not b else a / b


def _spread(files: dict[int, dict[int, float]]) -> dict | None:
    """The largest spread of one file's rounds, ``max / min - 1`` (``None`` where no file
    has two rounds)."""
    spreads = [max(v.values()) / min(v.values()) - 1 for v in files.values()
               if len(v) > 1 and min(v.values()) > 0]
    if not spreads:
        return None
    worst = max(range(len(spreads)), key=spreads.__getitem__)
    fi = [k for k, v in files.items() if len(v) > 1 and min(v.values()) > 0][worst]
    return {"max": spreads[worst], "values": [files[fi][k] for k in sorted(files[fi])],
            "files": len(spreads)}


# ---------------------------------------------------------------------------- markdown
def _fmt_stats(st: dict | None, digits: int = 0) -> str:
    if not st:
        return "n/a | | "
    return (f"{st['median']:,.{digits}f} | {st['min']:,.{digits}f} – {st['max']:,.{digits}f} "
            f"| {st['n']}")


def _target_ratio(r: dict, unit: str = "") -> tuple[float, str]:
    """A target's value: the median of the ratios measured in the same run (file and
    round), where any run measured both paths; else the ratio of the medians over all
    files (other machines, other times: said so). The noise is one standard error of a
    ratio from its passes' calls (median over the pairs), where recorded.

    Why: files from several calls and machines are merged; (c)'s and (a)'s speed differs
    between machines by more than the gaps the targets decide (the target is "(b) ≥ (c)
    in the same run")."""
    paired = r.get("paired")
    noise = (r.get("noise") or {}).get("median")
    pm = f" ± {noise:.3f}" if noise is not None else ""
    if paired and paired.get("n"):
        spread = (f" (same run: {paired['min']:.3f}–{paired['max']:.3f}, n {paired['n']})"
                  if paired["n"] > 1 else " (same run)")
        return paired["median"], f"{paired['median']:.3f}{pm}{unit}{spread}"
    return r["medians"], f"{r['medians']:.3f}{unit} (medians of different runs)"


def _header(docs: list[dict], files: list[str] | None) -> list[str]:
    d0 = docs[0]
    p = d0.get("params", {})
    b = d0.get("build", {})
    cfg = b.get("config") or p.get("model_config", {})
    ran = [r for d in docs for r in d.get("runs", []) if r.get("versions")]
    vers = {**(b.get("versions") or {}), **(ran[0]["versions"] if ran else {})}
    dev = (b.get("device") or {})
    shims = sorted({f"{s.get('commit')} (src {s.get('src_sha256_12')})"
                    for s in ((d.get("shim") or {}) for d in docs)})
    lines = []
    if p.get("tiny") or dev.get("device") != "cuda":
        lines += ["> **Not a reference measurement:** a CPU test run of the script (tiny model); "
                  "do not draw conclusions from these numbers.", ""]
    procs = {(d.get("params") or {}).get("round_procs") for d in docs} - {None}
    lines += [
        f"Run {d0.get('started')} ({len(docs)} file(s)): {dev.get('gpu') or dev.get('device')}"
        f"; vLLM {vers.get('vllm')}, torch {vers.get('torch')}, transformers "
        f"{vers.get('transformers')}; shim {', '.join(shims)}.",
        f"Checkpoint: random Llama, hidden {cfg.get('hidden_size')}, intermediate "
        f"{cfg.get('intermediate_size')}, {cfg.get('num_hidden_layers')} layers, "
        f"{cfg.get('num_attention_heads')} heads / {cfg.get('num_key_value_heads')} KV heads, "
        f"vocab {cfg.get('vocab_size')}, {cfg.get('dtype', 'bfloat16')} "
        f"({(b.get('safetensors_bytes') or 0) / 1e9:.1f} GB); {p.get('num_seqs')} sequences of "
        f"{p.get('min_len')}–{p.get('max_len')} random token ids ({p.get('tokens') or 0:,} "
        f"tokens, sha {p.get('tokens_sha')}) "
        + (f"of which a pass at batch B takes the first {p['pass_calls']} × B "
           f"({p['pass_calls']} calls)" if p.get("pass_calls") else "per pass")
        + f"; layers {p.get('layers')}; max_model_len "
        f"{p.get('max_model_len')}; {p.get('rounds')} round(s)"
        + (f" ({', '.join(sorted(procs))} processes)" if procs else "")
        + f"; (c) chunked prefill {'on' if p.get('c_chunked_prefill') else 'off'}"
        + ("; (a) with async scheduling off" if p.get("a_async_scheduling") == "off"
           else "") + ".",
        *([f"Files: {', '.join(f'`{f}`' for f in files)}."] if files else []),
    ]
    return lines


def _main_table(agg: dict, rows: list[tuple]) -> list[str]:
    lines = ["", "| path | loop | TP | batch | tokens/s median | min – max | n | vs (a), same "
             "run | vs (c), same run and loop | rounds' spread |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for row in rows:
        mode, loop, bsz = row
        st = agg["tokens_per_s"].get(row)
        if not st:
            continue
        va = agg["ratios"].get((row, "a"))
        vc = agg["ratios"].get((row, "c"))
        same_a = "1.00" if mode == _ref("a", mode) else (
            f"{_target_ratio(va)[0]:.3f}" if va else "n/a")
        same_c = f"{_target_ratio(vc)[0]:.3f}" if vc else ""
        spread = (agg["rounds"].get(row) or {}).get("tps")
        spread_s = f"{spread['max'] * 100:.1f}%" if spread else ""
        lines.append(f"| {_label(mode).removesuffix(_tp_suffix(mode))} | "
                     f"{LOOP_LABELS.get(loop, '—') if loop else '—'} | {_mode_parts(mode)[2]} | "
                     f"{bsz} | {_fmt_stats(st)} | {same_a} | {same_c} | {spread_s} |")
    return lines


def _detail_table(agg: dict, rows: list[tuple]) -> list[str]:
    lines = ["", "Per pass (medians): timed seconds; (c)'s generate and file loading inside "
             "them; consume = checksum of every byte (held, dropped); drain = the offline "
             "loop's wait for its last saves after the last call; results unchanged after "
             "later calls (held: re-checked at the end of the pass; offline: in the files "
             "written from them); driver peak RSS during the pass; RSS after the pass's "
             "results were released, minus after the warm-up.", "",
             "| path | loop | batch | timed s | (c) generate s | (c) load files s | consume s "
             "| drain s | results unchanged | files complete | driver peak RSS, GiB | RSS "
             "growth, MiB |",
             "|---|---|---:|---:|---:|---:|---:|---:|---|---|---:|---:|"]
    for row in rows:
        mode, loop, bsz = row
        e = agg["extra"].get(row)
        if not e:
            continue

        def med(k, digits=2, e=e):
            return f"{e[k]['median']:.{digits}f}" if e.get(k) else ""

        def yes(k, e=e):
            return "" if not e.get(k) else ("yes" if e[k]["min"] == 1.0 else "NO")

        drain = med("drain_s") + (" (> a call)" if (e.get("drain_long") or {}).get("max")
                                  else "")
        files = yes("files_ok") + (f" ({e['files_over']['max']:.2f}× the states' bytes)"
                                   if e.get("files_over") else "")
        lines.append(f"| {_label(mode)} | {LOOP_LABELS.get(loop, '—') if loop else '—'} | "
                     f"{bsz} | {med('seconds')} | {med('generate_s')} | {med('load_s')} | "
                     f"{med('consume_s')} | {drain} | {yes('held_ok')} | {files} | "
                     f"{med('peak_gib')} | {med('rss_growth_mib', 0)} |")
    return lines


def _transport_table(docs: list[dict]) -> list[str]:
    """What the driver's transport did in each (b) pass that reports the counters of the
    transport with copies made ahead: calls whose segments speculators' clone took over,
    calls copied into driver memory (and that copy's time), memory made ahead during the
    forward (and the time a copy waited for it), pages of the pool the driver unmapped
    once the pass's results were released."""
    groups: dict[tuple, list[dict]] = {}
    for d in docs:
        for r in d.get("runs", []):
            for ps in r.get("passes", []):
                drv = ps.get("driver") or {}
                if "copied_ahead" not in drv:
                    continue
                groups.setdefault((_run_mode(r), _pass_loop(r, ps), ps["batch"]), []).append(
                    {**drv, **{k: v for k, v in (ps.get("driver_abs") or {}).items()
                               if k == "fresh_hugepages"}})
    rows = []
    for (mode, loop, batch), drvs in sorted(groups.items(), key=lambda kv: _row_order(kv[0])):
        def med(key, drvs=drvs):
            return _median([x.get(key, 0) for x in drvs])

        huge = {x.get("fresh_hugepages") for x in drvs} - {None}
        trimmed = [x["trimmed_bytes"] for x in drvs
                   if x.get("read_after_release", True) and "trimmed_bytes" in x]
        rows.append(f"| {_label(mode, loop)} | {batch} | {len(drvs)} | "
                    f"{med('handed_over'):.0f} | {med('copied_ahead'):.0f} | "
                    f"{med('copy_s'):.2f} | {med('fresh_bytes') / 2**30:.2f} | "
                    f"{med('fresh_wait_s'):.2f} | "
                    f"{'/'.join('yes' if h else 'no' for h in sorted(huge, reverse=True))} | "
                    f"{_gib(_median(trimmed) if trimmed else None)} |")
    if not rows:
        return []
    return ["", "Driver transport per (b) pass (medians over passes; calls handed over = "
            "speculators' clone took the shared memory over; calls copied = copied by the "
            "transport into driver memory, which clone then took over):", "",
            "| path | batch | passes | calls handed over | calls copied | copy s | memory "
            "made ahead, GiB | waited for it, s | huge pages | pool pages unmapped, GiB |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---|---:|", *rows]


def _counters_table(docs: list[dict], rows: list[tuple]) -> list[str]:
    """The shim's driver counters per (b) pass, whatever their names (passes that
    recorded them as read: ``driver_abs``), as medians over passes of the pass's change;
    counters that did not move are left out."""
    groups: dict[tuple, list[dict]] = {}
    for d in docs:
        for r in d.get("runs", []):
            for ps in r.get("passes", []):
                if "driver_abs" in ps and isinstance(ps.get("driver"), dict) and \
                        "copied_ahead" not in ps["driver"]:
                    groups.setdefault((_run_mode(r), _pass_loop(r, ps), ps["batch"]),
                                      []).append(ps["driver"])
    out = []
    for row in rows:
        drvs = groups.get(row)
        if not drvs:
            continue
        keys = sorted({k for x in drvs for k, v in x.items() if isinstance(v, (int, float))})
        vals = [(k, _median([x.get(k) for x in drvs])) for k in keys]
        text = ", ".join(f"{k} {v:.3g}" for k, v in vals if v)
        out.append(f"| {_label(*row[:2])} | {row[2]} | {len(drvs)} | {text or '(none moved)'} |")
    if not out:
        return []
    return ["", "The shim's driver counters, change per (b) pass (medians over passes):", "",
            "| path | batch | passes | counters |", "|---|---:|---:|---|", *out]


def _call_split_table(docs: list[dict]) -> list[str]:
    """Where a (b) call's time goes, calls handed over apart from calls copied (passes
    that recorded the transport's per-call counters ``fetch_s``/``copy_s``/
    ``after_fetch_s``): the transport's part in the driver (export RPCs and mapping, of
    which the copy) and after the states arrived, and the rest (the model steps and
    speculators' loop), beside (a)'s mean call in the same file and batch."""
    groups: dict[tuple, list[tuple]] = {}
    for d in docs:
        a_call = {}
        for r in d.get("runs", []):
            if _run_mode(r).split("|")[0] == "a":
                for ps in r.get("passes", []):
                    if ps.get("calls_s"):
                        a_call[ps["batch"]] = sum(ps["calls_s"]) / len(ps["calls_s"])
        for r in d.get("runs", []):
            for ps in r.get("passes", []):
                per = [dc or {} for dc in ps.get("driver_calls") or []]
                if not per or len(per) != len(ps.get("calls_s") or []):
                    continue
                for kind, key in (("handed over", "handed_over"), ("copied", "copied_ahead")):
                    sel = [(c, dc) for c, dc in zip(ps["calls_s"], per, strict=True)
                           if dc.get(key)]
                    if not sel:
                        continue
                    n = len(sel)
                    call = sum(c for c, _ in sel) / n
                    # where steps_wait_s was recorded, the wait for the last steps
                    # (step_overlap) ran before the export RPC: fetch_s excludes it
                    fetch = sum(dc.get("fetch_s", 0) for _, dc in sel) / n
                    copy = sum(dc.get("copy_s", 0) for _, dc in sel) / n
                    early = (sum(dc.get("early_bytes", 0) for _, dc in sel) / n / 2**20
                             if any("early_bytes" in dc for _, dc in sel) else None)
                    after = sum(dc.get("after_fetch_s", 0) for _, dc in sel) / n
                    groups.setdefault((_run_mode(r), _pass_loop(r, ps), ps["batch"], kind),
                                      []).append((n, call, call - fetch - after, fetch, copy,
                                                  early, after, a_call.get(ps["batch"])))
    rows = []
    for (mode, loop, batch, kind), vals in sorted(
            groups.items(), key=lambda kv: (_row_order(kv[0][:3]), kv[0][3] != "handed over")):
        def med(i, digits=3, vals=vals):
            xs = [v[i] for v in vals if v[i] is not None]
            return f"{_median(xs):.{digits}f}" if xs else ""

        rows.append(f"| {_label(mode, loop)} | {batch} | {kind} | {len(vals)} | "
                    f"{sum(v[0] for v in vals)} | {med(1)} | {med(2)} | {med(3)} | {med(4)} | "
                    f"{med(5, 0)} | {med(6)} | {med(7)} |")
    if not rows:
        return []
    return ["", "Where a (b) call's time goes (per pass: means per call; then medians over "
            "passes; steps = the call minus the transport's part in the driver; where the "
            "steps are sent one ahead, runs from 2026-12-05 count the wait for the last steps "
            "as steps, earlier ones under states to the driver; (a): vLLM's own mean call, "
            "same file and batch):",
            "", "| path | batch | calls | passes | n | call s | steps s | states to the driver s "
            "| of which copy s | MiB copied during the steps | after they arrived s "
            "| (a) call s |",
            "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|", *rows]


#: The capturing worker's counters (``transport`` of a pass: cumulative per process), shown
#: per call: the hooks' time on the forward thread, their waits for staging room, the wait
#: for copies after the last step, the copy threads' time (summed over threads).
WORKER_COUNTERS = ("hook_s", "staging_wait_s", "tail_s", "populate_s")


def _worker_table(docs: list[dict]) -> list[str]:
    """The worker's counters per (b) call: each pass's change from the pass before it in
    the same process (the first pass of a process has no baseline), divided by the
    pass's generate calls (its timed calls and its lead-in); medians over passes, ms."""
    groups: dict[tuple, list[dict]] = {}
    for d in docs:
        for r in d.get("runs", []):
            prev = None
            for ps in r.get("passes", []):
                now = next((x for x in ps.get("transport") or [] if isinstance(x, dict)),
                           None)
                if now and prev and all(k in now and k in prev for k in WORKER_COUNTERS):
                    calls = len(ps.get("calls_s") or []) + (1 if ps.get("lead_in") else 0)
                    if calls:
                        per = {k: (now[k] - prev[k]) / calls * 1e3 for k in WORKER_COUNTERS}
                        # copies queued per call (recorded since 2026-12-05), where known
                        per["copies"] = ((now["copies"] - prev["copies"]) / calls
                                         if "copies" in now and "copies" in prev else None)
                        groups.setdefault((_run_mode(r), _pass_loop(r, ps), ps["batch"]),
                                          []).append(per)
                prev = now
    rows = _median_rows(groups, WORKER_COUNTERS)
    if not rows:
        return []
    ordered = sorted(groups.items(), key=lambda kv: _row_order(kv[0]))  # as _median_rows
    for i, (_, vals) in enumerate(ordered):
        known = [v["copies"] for v in vals if v["copies"] is not None]
        rows[i] += f" {_median(known):.1f} |" if known else " – |"
    return ["", "The capturing worker, per (b) call (a pass's change in the worker's counters "
            "over its generate calls, lead-in included; medians over passes; the first pass "
            "of each process has no baseline; copies queued: one per run of rows adjacent in "
            "a step's output and in the region, – where the run did not count them):", "",
            "| path | batch | passes | hooks on the forward thread, ms | hooks waiting for "
            "staging room, ms | copies left after the last step, ms | copy threads, ms "
            "(summed) | copies queued |", "|---|---:|---:|---:|---:|---:|---:|---:|", *rows]


def _median_rows(groups: dict[tuple, list], fields) -> list[str]:
    """One table row per (mode, loop, batch): the passes' medians of ``fields`` (keys or
    indices of each pass's values), one decimal."""
    rows = []
    for key, vals in sorted(groups.items(), key=lambda kv: _row_order(kv[0])):
        cells = " | ".join(f"{_median([v[f] for v in vals]):.1f}" for f in fields)
        rows.append(f"| {_label(key[0], key[1])} | {key[2]} | {len(vals)} | {cells} |")
    return rows


def _steps_table(docs: list[dict]) -> list[str]:
    """Per call of every path, what its worker (rank 0) did: ``execute_model`` steps, the
    time covered by steps and sampling (``busy``), and the rest of the call (the driver,
    the engine core's loop, the RPCs and everything between steps); from each pass's
    ``worker_steps`` over its generate calls (lead-in included), medians over passes."""
    groups: dict[tuple, list[tuple]] = {}
    for d in docs:
        for r in d.get("runs", []):
            for ps in r.get("passes", []):
                ws = next((x for x in ps.get("worker_steps") or [] if isinstance(x, dict)),
                          None)
                calls_s = ps.get("calls_s") or []
                if not ws or not calls_s:
                    continue
                n = len(calls_s) + (1 if ps.get("lead_in") else 0)
                call = sum(calls_s) / len(calls_s)
                busy = ws["busy_s"] / n
                groups.setdefault((_run_mode(r), _pass_loop(r, ps), ps["batch"]), []).append(
                    (ws["steps"] / n, call * 1e3, busy * 1e3, (call - busy) * 1e3))
    rows = _median_rows(groups, range(4))
    if not rows:
        return []
    return ["", "The worker's steps per call (rank 0; `execute_model` and `sample_tokens` "
            "timed in the worker; busy = the time covered by them; the rest = the call "
            "minus busy; medians over passes):", "",
            "| path | batch | passes | steps | call, ms | worker busy, ms | rest of the "
            "call, ms |", "|---|---:|---:|---:|---:|---:|---:|", *rows]


def _gib(nbytes) -> str:
    return "" if nbytes is None else f"{nbytes / 2**30:.2f}"


def _rss_table(agg: dict, modes: list[str]) -> list[str]:
    lines = ["", "| path | driver peak RSS of the process, GiB (median, min – max, n) |",
             "|---|---|"]
    for m in modes:
        st = agg["proc_peak_gib"].get(m)
        lines.append(f"| {_label(m)} | {_fmt_stats(st, 2)} |")
    return lines


def _correctness(agg: dict, check_seqs) -> list[str]:
    lines = ["", "Correctness, (b) vs (c) on the same tokens (first "
             f"{check_seqs} sequences; speculators layer k = native aux layer "
             "k + 1): minimum per-token cosine per layer", ""]
    if not agg["correctness"]:
        lines.append("(no comparison in these files)")
    for fi, c in enumerate(agg["correctness"]):
        where = f"file {fi + 1}: " if len(agg["correctness"]) > 1 else ""
        if not c.get("pairs"):
            lines.append(f"- {where}no pairs compared: {c.get('error') or c.get('files')}")
        files = c.get("files") if isinstance(c.get("files"), dict) else {}
        earlier = sorted(n for n, f in files.items()
                         if isinstance(f, dict) and f.get("from_earlier_call"))
        if earlier:
            lines.append(f"- {where}check files from an earlier call: {', '.join(earlier)}")
        lines += _correctness_lines(where, c.get("pairs", {}))
    return lines


def _correctness_lines(where: str, pairs: dict) -> list[str]:
    """One line for a file's pairs that all passed (their worst layer), one line per pair
    with every layer's value for a pair that failed or could not be compared."""
    good = {n: v for n, v in pairs.items() if v.get("ok") and v.get("per_layer")}
    lines = []
    if good:
        worst = min(x["min_cosine"] for v in good.values() for x in v["per_layer"].values())
        layers = sorted({str(k) for v in good.values() for k in v["per_layer"]},
                        key=lambda k: (len(k), k))
        thresholds = sorted({v.get("threshold") for v in good.values()}, key=str)
        lines.append(f"- {where}{', '.join(good)}: minimum {worst:.5f} over layers "
                     f"{', '.join(layers)} — ✅ (≥ "
                     f"{', '.join(map(str, thresholds))})")
    for name, v in pairs.items():
        if name in good:
            continue
        if "per_layer" not in v:
            lines.append(f"- {where}{name}: {v.get('error')}")
            continue
        per = ", ".join(f"layer {k}: {x['min_cosine']:.5f}" if x["min_cosine"] is not None
                        else f"layer {k}: shape mismatch" for k, x in v["per_layer"].items())
        lines.append(f"- {where}{name}: {per} — {'✅' if v.get('ok') else '❌'} "
                     f"(≥ {v.get('threshold')})")
    return lines


def _mark(ok: bool | None) -> str:
    return "n/a" if ok is None else ("✅" if ok else "❌")


def _targets(agg: dict, rows: list[tuple]) -> list[str]:
    """The targets, one row per (b) path, loop and batch: (b)/(a) ≥ 0.95, (b) ≥ (c), the
    rounds of one run within 3 % (tokens/s and both ratios), (b)'s driver peak RSS during
    the pass ≤ (c)'s (same run, round, loop and batch). Values are the medians of same-run
    ratios, ± one standard error from the passes' calls; then the rounds of (a) and (c),
    and for files without per-pass peaks, the processes' peaks."""
    lines = ["", "Targets: each cell is the median over runs and rounds of a ratio taken "
             "within one run and round (± one standard error from the passes' calls); the "
             "rounds' cell is the largest spread, max / min − 1, of one run's rounds.", "",
             f"| (b) path | loop | batch | (b)/(a) ≥ {MIN_B_OVER_A} | (b) ≥ (c) | rounds within "
             f"{ROUNDS_AGREE:.0%}: tokens/s; (b)/(a); (b)/(c) | driver peak RSS ≤ (c)'s |",
             "|---|---|---:|---|---|---|---|"]
    n0 = len(lines)
    for row in rows:
        mode, loop, bsz = row
        if not mode.startswith("b:"):
            continue
        cells = []
        r = agg["ratios"].get((row, "a"))
        if r:
            value, text = _target_ratio(r)
            cells.append(f"{_mark(value >= MIN_B_OVER_A)} {text}")
        else:
            cells.append("n/a")
        r = agg["ratios"].get((row, "c")) or {}
        if r:
            value, text = _target_ratio(r, " × (c)")
            cells.append(f"{_mark(value >= MIN_B_OVER_C)} {text}")
        else:
            cells.append("n/a")
        cells.append(_rounds_cell(agg["rounds"].get(row) or {}, ("tps", "a", "c")))
        peak = r.get("peak")
        cells.append(f"{_mark(peak['max'] <= 1.0)} {peak['median']:.3f} × (c) (same run: "
                     f"{peak['min']:.3f}–{peak['max']:.3f}, n {peak['n']})" if peak else "n/a")
        lines.append(f"| {_label(mode)} | {LOOP_LABELS.get(loop, loop)} | {bsz} | "
                     + " | ".join(cells) + " |")
    if len(lines) == n0:
        return []
    extra = []
    for row in rows:
        if not row[0].startswith("b:"):
            cell = _rounds_cell(agg["rounds"].get(row) or {}, ("tps",))
            if cell != "n/a":
                extra.append(f"- {_label(*row[:2])}, batch {row[2]}: rounds within "
                             f"{ROUNDS_AGREE:.0%}: {cell}")
    for m, st in sorted(agg["proc_peak_ratio"].items()):
        if st and not any((agg["ratios"].get(((m, loop, bsz), "c")) or {}).get("peak")
                          for (mm, loop, bsz) in rows if mm == m):
            extra.append(f"- {_label(m)}: driver peak RSS of the process ≤ (c)'s (files "
                         f"without per-pass peaks): {_mark(st['max'] <= 1.0)} "
                         f"{st['median']:.3f} × (c) (same run: {st['min']:.3f}–{st['max']:.3f}"
                         f", n {st['n']})")
    return lines + ([""] + extra if extra else [])


def _rounds_cell(spreads: dict, keys: tuple) -> str:
    """``✅ 0.8% (40,100 / 40,420); 1.1%; 0.9%``: the spread of each quantity over one
    run's rounds (the values for the first), or ``n/a`` with fewer than two rounds."""
    parts = [(k, spreads[k]) for k in keys if spreads.get(k)]
    if not parts:
        return "n/a"
    first_k, first = parts[0]
    vals = " / ".join(f"{v:,.0f}" if first_k == "tps" else f"{v:.3f}"
                      for v in first["values"])
    text = "; ".join(f"{s['max'] * 100:.1f}%" + (f" ({vals})" if k == first_k else "")
                     for k, s in parts)
    return f"{_mark(all(s['max'] <= ROUNDS_AGREE for _, s in parts))} {text}"


def _runners(docs: list[dict]) -> list[str]:
    workers = sorted({f"{_with_tp(r['mode'], r.get('tp') or 1)}: "
                      f"{w['runner'].removeprefix('vllm.')}"
                      for d in docs for r in d.get("runs", [])
                      for w in (r.get("workers") if isinstance(r.get("workers"), list) else [])
                      if isinstance(w, dict) and "runner" in w})
    return ["", "Model runner per path (as the workers reported): " + "; ".join(workers) + "."
            ] if workers else []


def _failures(agg: dict) -> list[str]:
    if not agg["failures"]:
        return []
    lines = ["", "Failed, cut-short or skipped:", ""]
    for f in agg["failures"]:
        lines.append(f"- {f['mode']} round {f['round']}"
                     f"{' (partial data kept)' if f.get('partial') else ''}: "
                     f"{str(f['error'])[:300]}")
    return lines


def _rows(agg: dict) -> list[tuple]:
    return sorted(agg["tokens_per_s"], key=_row_order)


#: What each part of the report holds: ``summary`` is the block of docs/performance.md
#: (what a reader of the results needs: tokens/s, the targets, correctness, the offline
#: script); ``details`` is docs/performance-gpu-details.md (per pass, the shim's and the
#: worker's counters, each call split, each process's memory: what explains a cell).
PARTS = ("summary", "details", "all")
DETAILS_TITLE = "# GPU benchmark: details"


def render_markdown(docs: list[dict], files: list[str] | None = None,
                    part: str = "all") -> str:
    """The generated report (``part`` of :data:`PARTS`); ``files`` (the rendered files'
    paths) are named in it, so that it can be rendered again from them (the unit tests
    check that it is current). Files of ``offline_script_bench.py`` among ``docs`` get
    their own table (in the summary)."""
    if part not in PARTS:
        raise ValueError(f"part must be one of {PARTS}")
    summary, details = part in ("summary", "all"), part in ("details", "all")
    bench = [d for d in docs if d.get("kind") != "offline_script"]
    scripts = [d for d in docs if d.get("kind") == "offline_script"]
    lines: list[str] = []
    if bench:
        agg = aggregate(bench)
        rows = _rows(agg)
        modes = sorted({r[0] for r in rows} | set(agg["proc_peak_gib"]),
                       key=lambda m: _row_order((m, None, 0)))
        lines += _header(bench, files)  # every file, the offline script's too
        if summary:
            lines += _main_table(agg, rows)
        if details:
            lines += _detail_table(agg, rows)
            lines += _transport_table(bench)
            lines += _counters_table(bench, rows)
            lines += _call_split_table(bench)
            lines += _worker_table(bench)
            lines += _steps_table(bench)
            lines += _rss_table(agg, modes)
        if summary:
            lines += _correctness(agg, (bench[0].get("params") or {}).get("check_seqs"))
            lines += _targets(agg, rows)
        if details:
            lines += _runners(bench)
        if summary:
            lines += _failures(agg)
    if scripts and summary:
        if lines:
            lines.append("")
        lines += render_offline_script(scripts, None if bench else files)
    return "\n".join(lines)


def render_offline_script(docs: list[dict], files: list[str] | None = None) -> list[str]:
    """speculators' own offline script through ``speculators-compat run``
    (``offline_script_bench.py``): per release, the generation loop's samples/s and
    tokens/s (from the script's own log lines around it, and the steady rate from the
    files' write times), and whether every file is there, complete and in input order."""
    lines = ["speculators' own `scripts/data_generation_offline.py` (unchanged, from the "
             "release's tag) through `python -m speculators_compat run`, on "
             + ", ".join(sorted({str((d.get("machine") or {}).get("gpu")
                                     or (d.get("machine") or {}).get("device")) for d in docs}))
             + ".", *([f"Files: {', '.join(f'`{f}`' for f in files)}."] if files else []), "",
             "| release | vLLM | samples | tokens | batch | generation loop s | samples/s | "
             "tokens/s | steady tokens/s (files' write times) | script start to exit s | "
             "files complete, in input order |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    if any((d.get("params") or {}).get("tiny") for d in docs):
        lines[:0] = ["> **Not a reference measurement:** a CPU test run (tiny model).", ""]
    for d in docs:
        for r in d.get("runs", []):
            t = r.get("timing") or {}
            chk = r.get("check") or {}
            ok = chk.get("ok")
            verdict = "yes" if ok else (f"NO: {str(chk.get('error'))[:200]}" if ok is False
                                        else "n/a")
            lines.append(
                f"| {r.get('release')} | {(r.get('versions') or {}).get('vllm', '')} | "
                f"{chk.get('files', '')} | {chk.get('tokens') or 0:,} | {r.get('batch_size')} | "
                f"{_num(t.get('loop_s'), 2)} | {_num(t.get('samples_per_s'), 1)} | "
                f"{_num(t.get('tokens_per_s'), 0)} | {_num(t.get('steady_tokens_per_s'), 0)} | "
                f"{_num(r.get('wall_s'), 0)} | {verdict} |")
    for d in docs:
        agree = (d.get("check") or {}).get("agree")
        if agree:
            lines += ["", "The releases' saved states of the first "
                      f"{agree.get('samples')} samples, minimum per-token cosine: "
                      + ", ".join(f"{k} {v:.5f}" if v is not None else f"{k} n/a"
                                  for k, v in agree.get("pairs", {}).items())
                      + f" — {_mark(agree.get('ok'))} (≥ {agree.get('threshold')})"]
    return lines


def _num(x, digits: int) -> str:
    return "" if x is None else f"{x:,.{digits}f}"


# --------------------------------------------------------------------------------- svg
def render_svg(docs: list[dict]) -> str:
    cpu_bench = str(BENCH.parent / "cpu")  # perfreport.py (the CPU report's SVG panel)
    if cpu_bench not in sys.path:
        sys.path.insert(0, cpu_bench)
    from perfreport import _panel

    agg = aggregate([d for d in docs if d.get("kind") != "offline_script"])
    rows = _rows(agg)
    sizes = sorted({row[2] for row in rows}, reverse=True)
    colours = {"a": "#4c72b0", "c": "#55a868"}
    items = []
    for bsz in sizes:
        for row in rows:
            st = agg["tokens_per_s"].get(row)
            if row[2] == bsz and st:
                items.append((f"{_short_label(row[0], row[1])}, batch {bsz}", st["median"],
                              st["min"], st["max"],
                              colours.get(_mode_parts(row[0])[0], "#dd8452")))
    # The reference line: (a) at batch 32 (else the largest batch), at the smallest TP size.
    a_rows = [row for row in rows if _mode_parts(row[0])[0] == "a"]
    ref_row = next((row for row in a_rows if row[2] == 32), a_rows[0] if a_rows else None)
    a32 = agg["tokens_per_s"].get(ref_row) if ref_row else None
    width = 960.0
    parts, h = _panel(10, 10, width - 20, "Prefill with hidden states to the driver "
                      "(median, min–max whiskers)", items, "tokens/s",
                      ref=(MIN_B_OVER_A * a32["median"],
                           f"{MIN_B_OVER_A} × (a){_tp_suffix(ref_row[0])}")
                      if a32 else None, digits=0)
    y = h + 20
    return (f'<svg xmlns="http://www.w3.org/2000/svg" width="{width:.0f}" height="{y:.0f}" '
            f'viewBox="0 0 {width:.0f} {y:.0f}" font-family="DejaVu Sans, Arial, sans-serif">'
            f'<rect width="100%" height="100%" fill="white"/>' + "".join(parts) + "</svg>\n")


# ---------------------------------------------------------------------------------- CLI
def _depth(doc: dict) -> int | None:
    """The measured model's decoder layer count (``--model-layers``), from the build's
    config or the run's parameters; ``None`` where a file records neither."""
    cfg = (doc.get("build") or {}).get("config") or \
        (doc.get("params") or {}).get("model_config") or {}
    return cfg.get("num_hidden_layers")


def _repo_path(f: str) -> str:
    """``f`` relative to the repository where it lies inside it, else its name."""
    path = Path(f).resolve()
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else path.name


def render_main(a) -> int:
    docs = [json.loads(Path(f).read_text()) for f in a.files]
    bench = [d for d in docs if d.get("kind") != "offline_script"]
    shas = {(d.get("params") or {}).get("tokens_sha") for d in bench}
    if len(shas) > 1:
        print(f"warning: the files used different tokens ({shas}); merging anyway",
              file=sys.stderr)
    depths = {_depth(d) for d in bench}
    if len(depths) > 1:
        # Rows are keyed by path, TP, loop and batch, not by model: a shallower model's
        # numbers (--model-layers) would be averaged into the full model's.
        raise SystemExit(f"the files measured models of different depths ({sorted(depths)} "
                         f"layers); render them separately")
    here = src_digest()
    for f, d in zip(a.files, docs):
        theirs = (d.get("shim") or {}).get("src_sha256_12")
        if theirs and theirs != here:
            print(f"note: {f} ran shim sources {theirs}; this checkout's are {here}",
                  file=sys.stderr)
    files = [_repo_path(f) for f in a.files]
    md = render_markdown(docs, files)
    if a.plot is None:  # the docs' plot only with the docs: a look at a file leaves both be
        a.plot = str(ROOT / "docs" / "perf-gpu.svg") if a.update_docs else ""
    if a.plot and bench:
        Path(a.plot).parent.mkdir(parents=True, exist_ok=True)
        Path(a.plot).write_text(render_svg(docs))
    if a.update_docs:
        path = Path(a.docs)
        text = path.read_text()
        if GPU_BEGIN not in text or GPU_END not in text:
            raise SystemExit(f"{path} has no generated GPU results markers")
        head, rest = text.split(GPU_BEGIN, 1)
        _, tail = rest.split(GPU_END, 1)
        body = render_markdown(docs, files, "summary")
        if bench and a.details:
            details = Path(a.details)
            back = os.path.relpath(path, details.parent)
            details.write_text(
                f"{DETAILS_TITLE}\n\nGenerated by `benchmarks/gpu/gpu_bench.py render "
                f"--update-docs` from the files named below, with the summary in "
                f"[{path.name}]({back}#gpu-results): per pass, the transport's and the "
                f"worker's counters, where each call's time goes, each process's memory.\n\n"
                f"{render_markdown(docs, files, 'details')}\n")
            body += (f"\n\nPer pass, the shim's and the worker's counters, where each call's "
                     f"time goes and each process's memory: "
                     f"[{details.name}]({os.path.relpath(details, path.parent)}).")
        rel = os.path.relpath(a.plot, path.parent) if a.plot and bench else None
        body += f"\n\n![GPU benchmark plot]({rel})" if rel else ""
        path.write_text(f"{head}{GPU_BEGIN}\n{body}\n{GPU_END}{tail}")
    print(md)
    return 0


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="gpu_bench.py render", description=__doc__.split("\n\n")[0])
    p.add_argument("files", nargs="+",
                   help="gpu_bench.json (merged) and offline_script.json files")
    p.add_argument("--plot", default=None,
                   help="SVG to write (default: docs/perf-gpu.svg with --update-docs, "
                        "else none)")
    p.add_argument("--update-docs", action="store_true",
                   help="write the generated GPU block of --docs")
    p.add_argument("--docs", default=str(ROOT / "docs" / "performance.md"))
    p.add_argument("--details", default=str(ROOT / "docs" / "performance-gpu-details.md"),
                   help="the page --update-docs writes the per-pass details to (the block "
                        "of --docs holds the summary and links to it)")
    return p


def main(argv: list[str] | None = None) -> int:
    return render_main(parser().parse_args(sys.argv[1:] if argv is None else argv))


if __name__ == "__main__":
    sys.exit(main())
