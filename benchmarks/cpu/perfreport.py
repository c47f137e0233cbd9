"""Rendering for benchmarks/cpu/bench.py: one-line progress, a markdown summary, an SVG plot.

Pure Python (no matplotlib in vLLM's environment): the plot is a hand-written SVG of
horizontal bars (median) with min-max whiskers.
"""

from __future__ import annotations

import html
import os
from pathlib import Path

#: The benchmark's modes and the letters the report labels them with.
LETTERS = {"vllm_prefill": "a", "generator": "b", "capture_on_off": "d", "import_vllm": "c",
           "activate_cold": "c", "activate_warm": "c"}
#: Earlier mode names (results files recorded before the modes were named), and the
#: letters, as accepted by ``bench.py --modes``.
MODE_ALIASES = {"a": "vllm_prefill", "b": "generator", "d": "capture_on_off",
                "c_vllm": "import_vllm", "c_activate": "activate_cold",
                "c_activate_warm": "activate_warm"}


def canonical_mode(mode: str) -> str:
    """A mode's current name, from its current or earlier name."""
    return MODE_ALIASES.get(mode, mode)


BEGIN = "<!-- BEGIN GENERATED RESULTS (benchmarks/cpu/bench.py --update-docs) -->"
END = "<!-- END GENERATED RESULTS -->"

SHORT_LABELS = {
    "execute_model": "execute_model (the forward)",
    "collective_rpc:_get_captured_states": "rpc _get_captured_states",
    "rest": "rest (requests, clone, mapping)",
}

BREAKDOWN_LABELS = {
    "execute_model": "execute_model (forward; sample_tokens inside, shim)",
    "sample_tokens": "sample_tokens (speculators' call, answered from cache)",
    "schedule": "scheduler.schedule",
    "add_request": "scheduler.add_request",
    "finish_requests": "scheduler.finish_requests",
    "steps in flight": "steps still running at the states' RPC (step_overlap)",
    "collective_rpc:_get_captured_states": "rpc _get_captured_states (take + transfer)",
    "collective_rpc:_reset_capture": "rpc _reset_capture",
    "collective_rpc:_set_request_metadata": "rpc _set_request_metadata",
    "rest": "rest of generate() (requests, clone().cpu(), mapping)",
}


def one_line(r: dict) -> str:
    head = f"[round {r.get('repeat')}] {r['mode']:<16} wall {r['wall_s']:7.1f}s  load " \
           f"{r['loadavg_before'][0]:.1f}->{r['loadavg_after'][0]:.1f}  "
    if "error" in r:
        return head + f"ERROR {r['error']}\n{r.get('log_tail', '')[-1500:]}"
    m = LETTERS.get(canonical_mode(r["mode"]), r["mode"])
    if m == "build":
        return head + f"{r['params']:,} params"
    if m in ("a", "b"):
        s = (f"{r['tokens_per_s']:8.1f} tok/s ({r['tokens']} tokens in {r['seconds']:.2f}s; "
             f"startup {r['startup_s']:.1f}s) ok={r['ok']}")
        if m == "b":
            bd = r["breakdown"]["seconds"]
            s += "  [" + ", ".join(f"{k} {v:.2f}s" for k, v in sorted(
                bd.items(), key=lambda kv: -kv[1])[:4]) + "]"
        return head + s
    if m == "d":
        return head + (f"on {r['on']['tokens_per_s']:.1f} tok/s, off "
                       f"{r['off']['tokens_per_s']:.1f} tok/s, overhead "
                       f"{100 * r['overhead_frac']:.1f}% ({r['overhead_s']:.2f}s) "
                       f"order {'/'.join(r['order'])} ok={r['ok']}")
    keys = [k for k, v in r.items() if k.endswith("_s") and k != "wall_s"
            and isinstance(v, float)]
    return head + ", ".join(f"{k} {r[k]:.2f}" for k in keys)


def _cpu_row(lab: str, proc: str, stat) -> str:
    """A per-process CPU row; ``bench.py --cpu-detail`` adds a process's system time
    (``NAME/system``) and minor page faults (``NAME/minor-faults-k``)."""
    if proc.endswith("/minor-faults-k"):
        return (f"| minor page faults per call, ({lab}), process "
                f"{proc[:-len('/minor-faults-k')]}, thousands | {_fmt(stat, digits=1)} |")
    if proc.endswith("/system"):
        return (f"| system CPU time per call, ({lab}), process {proc[:-len('/system')]}, s "
                f"| {_fmt(stat, digits=2)} |")
    return f"| CPU time per call, ({lab}), process {proc}, s | {_fmt(stat, digits=2)} |"


def _fmt(st: dict | None, scale: float = 1.0, digits: int = 1, pct: bool = False) -> str:
    if not st:
        return "n/a"
    f = (lambda v: f"{100 * v:.{digits}f}%") if pct else (lambda v: f"{v * scale:.{digits}f}")
    return f"{f(st['median'])} | {f(st['min'])} – {f(st['max'])} | {st['n']}"


def _load(data: dict) -> tuple[float, float]:
    loads = [x for r in data["runs"] for x in (r["loadavg_before"][0], r["loadavg_after"][0])]
    return (min(loads), max(loads)) if loads else (0.0, 0.0)


def markdown(data: dict) -> str:
    agg, p, m = data["aggregate"], data["params"], data["machine"]
    ck = data["checkpoint"]
    rat, tgt = agg["ratios"], agg["targets"]
    lo, hi = _load(data)
    cpus = m.get("cpus") or 1
    contended = hi > 0.75 * cpus
    first = {LETTERS[mode]: next((r for r in data["runs"]
                                  if canonical_mode(r["mode"]) == mode and "error" not in r),
                                 None) for mode in ("vllm_prefill", "generator")}
    lines = []
    if contended or p["num_seqs"] * p["seq_len"] < 16 * 384:
        lines.append("> **Not a reference measurement:** "
                     + ("the machine was busy (1-min load average up to "
                        f"{hi:.1f} on {cpus} CPUs); " if contended else "")
                     + ("smaller than the issue's configuration (16 × 384 tokens); "
                        if p["num_seqs"] * p["seq_len"] < 16 * 384 else "")
                     + "do not draw conclusions from these numbers.")
        lines.append("")
    v = m["versions"]
    lines += [
        f"Run {data['started']} → {data.get('finished', '?')}: {cpus} CPUs "
        f"({m.get('cpu_model')}), 1-min load average {lo:.1f}–{hi:.1f}; vLLM {v['vllm']}, "
        f"torch {v['torch']}, transformers {v['transformers']}, speculators "
        f"{v['speculators']}, speculators-compat {v['speculators_compat']}; bytecode "
        + ("cached (PYTHONPYCACHEPREFIX, primed)." if p.get("pycache_prefix")
           else "as the environment has it (PYTHONDONTWRITEBYTECODE="
           f"{m.get('PYTHONDONTWRITEBYTECODE')})."),
        f"Checkpoint: random llama, {ck['params']:,} parameters "
        f"({', '.join(f'{k} {x}' for k, x in ck['config'].items() if x is not None)}); "
        f"{p['num_seqs']} sequences × {p['seq_len']} tokens = "
        f"{p['num_seqs'] * p['seq_len']} tokens per timed call; layers {p['layer_ids']}; "
        f"max_model_len {p['max_model_len']}; "
        f"{max((r.get('repeat', 0) for r in data['runs']), default=0) + 1} rounds.",
        "",
        "| measurement | median | min – max | n |",
        "|---|---:|---:|---:|",
        f"| (a) vLLM `LLM.generate`, max_tokens=1: tokens/s | {_fmt(agg['a_tokens_per_s'])} |",
        f"| (b) speculators' generator via shim, 4 layers: tokens/s | "
        f"{_fmt(agg['b_tokens_per_s'])} |",
        f"| (b) / (a), paired by round | {_fmt(rat.get('b_over_a_paired'), digits=3)} |",
        f"| (d) same generator, capture on: tokens/s | {_fmt(agg['d_on_tokens_per_s'])} |",
        f"| (d) same generator, capture off: tokens/s | {_fmt(agg['d_off_tokens_per_s'])} |",
        f"| (d) capture overhead, (on − off) / on | "
        f"{_fmt(agg['d_overhead_frac'], pct=True)} |",
        f"| (d) … the steps (`execute_model`, steps sent ahead included), capture on, s | "
        f"{_fmt(agg.get('d_on.steps') or agg.get('d_on.execute_model'), digits=3)} |",
        f"| (d) … the steps, capture off, s | "
        f"{_fmt(agg.get('d_off.steps') or agg.get('d_off.execute_model'), digits=3)} |",
        f"| (d) … the steps' wall time, (on − off) / off | "
        f"{_fmt(agg.get('d_step_overhead_frac'), pct=True)} |",
        f"| (d) … `_get_captured_states` RPC (take + transfer), capture on, s | "
        f"{_fmt(agg.get('d_on.collective_rpc:_get_captured_states'), digits=3)} |",
        f"| (d) … rest of `generate()` (driver: clone, mapping), on / off, s | "
        f"{_fmt(agg.get('d_on.rest'), digits=3)} / "
        f"{(agg.get('d_off.rest') or {}).get('median', float('nan')):.3f} |",
        *[f"| worker `execute_model`+`sample_tokens`, ({lab}), {kind}, s | "
          f"{_fmt(agg.get(f'{pre}_worker_step_{key}_s'), digits=3)} |"
          for lab, pre in (("a", "a"), ("b", "b"), ("d on", "d_on"), ("d off", "d_off"))
          for kind, key in (("CPU", "cpu"),)],  # wall time: in the JSON (on CPU, within 0.2 %)
        f"| (d) … the 4 hooks' own CPU time in the worker (thread_time), s | "
        f"{_fmt(agg.get('d_hook_cpu_s'), digits=3)} |",
        *([f"| (b) transport: the rows into the call's region, in the step, s | "
           f"{_fmt(agg['b_transport_write_s'], digits=3)} |",
           f"| (d) … of the hooks' time: copy into the call's region, capture on, s | "
           f"{_fmt(agg.get('d_on_transport_write_s'), digits=3)} |"]
          if agg.get("b_transport_write_s") else []),
        *([f"| (a) worker step CPU, slowest / fastest of one process's identical calls | "
           f"{_fmt(agg['a_step_cpu_spread'], digits=2)} |"]
          if agg.get("a_step_cpu_spread") else []),
        *[_cpu_row(lab, k[len(pre):], agg[k])
          for lab, pre in (("a", "a_cpu_s."), ("b", "b_cpu_s."), ("d on", "d_on_cpu_s."),
                           ("d off", "d_off_cpu_s."))
          for k in sorted(agg) if k.startswith(pre)],
        f"| (a) startup `LLM(...)`, s | {_fmt(agg['a_startup_s'])} |",
        f"| (b) startup `VllmHiddenStatesGenerator(...)`, s | {_fmt(agg['b_startup_s'])} |",
        f"| (c) `import vllm`, s | {_fmt(agg.get('c_vllm.import_vllm_s'), digits=2)} |",
        f"| (c) then `from vllm import LLM`, s | "
        f"{_fmt(agg.get('c_vllm.from_vllm_import_LLM_s'), digits=2)} |",
        f"| (c) import speculators' generator module (after `import vllm`), s | "
        f"{_fmt(agg.get('c_activate_warm.import_generator_s'), digits=2)} |",
        f"| (c) `activate()` alone (vLLM + generator already imported), s | "
        f"{_fmt(agg.get('c_activate_warm.activate_s'), digits=3)} |",
        f"| (c) `import speculators_compat; activate()` right after `import vllm`, s | "
        f"{_fmt(agg.get('c_activate.activate_total_s'), digits=2)} |",
        "",
        "| ratio | value | target |",
        "|---|---:|---|",
    ]

    def ok(key):
        return "" if key not in tgt else (" ✅" if tgt[key] else " ❌")

    if "b_over_a" in rat:
        lines.append(f"| (b) / (a), medians | {rat['b_over_a']:.3f} | ≥ 0.9{ok('b_ge_0.9a')} |")
    if "b_over_a_best" in rat:
        lines.append(f"| (b) / (a), each process's fastest call (medians over rounds) | "
                     f"{rat['b_over_a_best']:.3f} | (contention only adds time) |")
    if "worker_cpu_b_over_a" in rat:
        lines.append(f"| worker CPU time per call, (b) / (a) | {rat['worker_cpu_b_over_a']:.3f} "
                     "| (contention-robust view) |")
    for key, what in (("worker_step_cpu_b_over_a", "CPU"),):
        if key in rat:
            lines.append(f"| worker `execute_model`+`sample_tokens` {what} time, (b) / (a) | "
                         f"{rat[key]:.3f} | (the forward itself) |")
    if "d_worker_cpu_on_over_off" in rat:
        lines.append(f"| (d) worker CPU time, capture on / off | "
                     f"{rat['d_worker_cpu_on_over_off']:.3f} | |")
    if "d_off_over_a" in rat:
        lines.append(f"| (d) capture off / (a), medians | {rat['d_off_over_a']:.3f} | |")
    if "activate_own_over_import_vllm" in rat:
        lines.append(f"| (c) `activate()` alone / `import vllm` | "
                     f"{100 * rat['activate_own_over_import_vllm']:.2f}% | "
                     f"< 5%{ok('activate_lt_5pct_import_vllm')} |")
    if "activate_cold_total_over_import_vllm" in rat:
        lines.append(f"| (c) `activate()` after `import vllm`, total / `import vllm` | "
                     f"{100 * rat['activate_cold_total_over_import_vllm']:.1f}% | (includes "
                     "importing speculators' generator, paid anyway) |")
    if "import_generator_over_import_vllm" in rat:
        lines.append(f"| (c) import speculators' generator module / `import vllm` | "
                     f"{100 * rat['import_generator_over_import_vllm']:.1f}% | (not the shim's) |")
    bd = agg.get("b_breakdown_s") or {}
    total = (agg.get("b_seconds") or {}).get("median")
    if bd and total:
        lines += ["", "Where (b)'s `generate()` time goes (driver-side timers, medians):", "",
                  "| part | seconds | share |", "|---|---:|---:|"]
        for k, st in sorted(bd.items(), key=lambda kv: -kv[1]["median"]):
            lines.append(f"| {BREAKDOWN_LABELS.get(k, k)} | {st['median']:.3f} | "
                         f"{100 * st['median'] / total:.1f}% |")
    cfg_rows = []
    for mode in ("a", "b"):
        r = first[mode]
        if r:
            c = r["config"]
            cfg_rows.append(f"| ({mode}) | {c['max_num_seqs']} | {c['max_num_batched_tokens']} | "
                            f"{c['block_size']} | {c['enable_prefix_caching']} | "
                            f"{c['async_scheduling']} | {c['dtype']} | "
                            f"{c['use_v2_model_runner']} | {c['executor_backend']} |")
    if cfg_rows:
        lines += ["", "Engine settings as run:", "",
                  "| | max_num_seqs | max_num_batched_tokens | block_size | prefix caching | "
                  "async scheduling | dtype | V2 runner | executor |",
                  "|---|---:|---:|---:|---|---|---|---|---|", *cfg_rows]
        if first["a"] and first["a"].get("llm_defaults"):
            d = first["a"]["llm_defaults"]
            if "error" not in d:
                lines.append(f"\n`LLM`'s own defaults here would be max_num_seqs "
                             f"{d['max_num_seqs']}, max_num_batched_tokens "
                             f"{d['max_num_batched_tokens']}"
                             + (" (overridden to speculators' values)."
                                if p.get("match_scheduler") else " (kept)."))
    return "\n".join(lines)


# ------------------------------------------------------------------------------------ SVG
def _panel(x0: float, y0: float, width: float, title: str, items: list, unit: str,
           ref: tuple[float, str] | None = None, digits: int = 1) -> tuple[list[str], float]:
    """Horizontal bars: items = [(label, median, lo, hi, colour)]. Returns (svg, height)."""
    label_w, row_h, top = 330.0, 26.0, 34.0
    plot_w = width - label_w - 90
    vmax = max([hi if hi is not None else med for _, med, _, hi, _ in items
                if med is not None]
               + ([ref[0]] if ref else []) + [1e-12]) * 1.08
    out = [f'<text x="{x0}" y="{y0 + 18}" font-size="15" font-weight="bold">'
           f'{html.escape(title)}</text>']
    h = top + row_h * len(items) + 26
    bx = x0 + label_w

    def sx(v):
        return bx + plot_w * v / vmax

    # grid + ticks
    step = _nice_step(vmax / 5)
    t = 0.0
    while t <= vmax:
        out.append(f'<line x1="{sx(t):.1f}" y1="{y0 + top - 4}" x2="{sx(t):.1f}" '
                   f'y2="{y0 + h - 22}" stroke="#ddd"/>')
        out.append(f'<text x="{sx(t):.1f}" y="{y0 + h - 8}" font-size="11" '
                   f'text-anchor="middle" fill="#555">{_tick(t, step)}</text>')
        t += step
    out.append(f'<text x="{bx + plot_w}" y="{y0 + 18}" font-size="11" text-anchor="end" '
               f'fill="#555">{html.escape(unit)}</text>')
    for i, (label, med, lo, hi, colour) in enumerate(items):
        y = y0 + top + i * row_h
        out.append(f'<text x="{bx - 8}" y="{y + 15}" font-size="12" text-anchor="end">'
                   f'{html.escape(label)}</text>')
        if med is None:
            out.append(f'<text x="{bx + 4}" y="{y + 15}" font-size="12" fill="#999">n/a</text>')
            continue
        out.append(f'<rect x="{bx}" y="{y + 3}" width="{max(sx(med) - bx, 0.5):.1f}" '
                   f'height="{row_h - 8}" fill="{colour}"/>')
        if lo is not None and hi is not None:
            yc = y + row_h / 2 - 1
            out.append(f'<line x1="{sx(lo):.1f}" y1="{yc}" x2="{sx(hi):.1f}" y2="{yc}" '
                       f'stroke="#222" stroke-width="1.5"/>')
            for v in (lo, hi):
                out.append(f'<line x1="{sx(v):.1f}" y1="{yc - 5}" x2="{sx(v):.1f}" '
                           f'y2="{yc + 5}" stroke="#222" stroke-width="1.5"/>')
        out.append(f'<text x="{max(sx(hi if hi is not None else med), sx(med)) + 6:.1f}" '
                   f'y="{y + 15}" font-size="11" fill="#222">{med:.{digits}f}</text>')
    if ref:
        v, lab = ref
        out.append(f'<line x1="{sx(v):.1f}" y1="{y0 + top - 6}" x2="{sx(v):.1f}" '
                   f'y2="{y0 + h - 22}" stroke="#c00" stroke-dasharray="5,3"/>')
        out.append(f'<text x="{sx(v) - 4:.1f}" y="{y0 + top - 8}" font-size="11" fill="#c00" '
                   f'text-anchor="end">{html.escape(lab)}</text>')
    return out, h


def _nice_step(x: float) -> float:
    import math

    if x <= 0:
        return 1.0
    e = 10 ** math.floor(math.log10(x))
    for m in (1, 2, 2.5, 5, 10):
        if m * e >= x:
            return m * e
    return 10 * e


def _tick(t: float, step: float) -> str:
    if step >= 1:
        return f"{t:.0f}"
    if step >= 0.1:
        return f"{t:.1f}"
    return f"{t:.2f}"


def svg(data: dict) -> str:
    agg, p = data["aggregate"], data["params"]

    def item(label, st, colour, scale=1.0):
        if not st:
            return (label, None, None, None, colour)
        return (label, st["median"] * scale, st["min"] * scale, st["max"] * scale, colour)

    width = 960.0
    parts: list[str] = []
    y = 10.0
    a = agg.get("a_tokens_per_s")
    p1, h = _panel(10, y, width - 20,
                   f"Prefill throughput, {p['num_seqs']} × {p['seq_len']} tokens "
                   "(median, min–max whiskers)",
                   [item("(a) vLLM LLM.generate, max_tokens=1", a, "#4c72b0"),
                    item("(b) speculators generator via shim", agg.get("b_tokens_per_s"),
                         "#dd8452"),
                    item("(d) same generator, capture on", agg.get("d_on_tokens_per_s"),
                         "#c9a37a"),
                    item("(d) same generator, capture off", agg.get("d_off_tokens_per_s"),
                         "#8c8c8c")],
                   "tokens/s", ref=(0.9 * a["median"], "0.9 × (a)") if a else None)
    parts += p1
    y += h + 10
    cpu_items = [item(f"{lab}: worker", agg.get(f"{pre}_cpu_s.VLLM::Worker"), col)
                 for lab, pre, col in (("(a)", "a", "#4c72b0"), ("(b)", "b", "#dd8452"),
                                       ("(d) on", "d_on", "#c9a37a"),
                                       ("(d) off", "d_off", "#8c8c8c"))]
    cpu_items += [item(f"{lab}: {proc}", agg.get(f"{pre}_cpu_s.{proc}"), col)
                  for lab, pre, col, proc in (("(a)", "a", "#9fb4d8", "VLLM::EngineCore"),
                                              ("(a)", "a", "#9fb4d8", "driver"),
                                              ("(b)", "b", "#efc2a3", "driver"))]
    cpu_items = [i for i in cpu_items if i[1] is not None]
    if cpu_items:
        p4, h = _panel(10, y, width - 20, "CPU time per generate() call, by process "
                       "(less sensitive to other load than wall time)", cpu_items, "CPU seconds",
                       digits=2)
        parts += p4
        y += h + 10
    step_items = [item(f"{lab}: worker steps, {kind}", agg.get(f"{pre}_worker_step_{key}_s"),
                       col if key == "wall" else light)
                  for key, kind in (("wall", "wall"), ("cpu", "CPU"))
                  for lab, pre, col, light in (("(a)", "a", "#4c72b0", "#9fb4d8"),
                                               ("(b)", "b", "#dd8452", "#efc2a3"),
                                               ("(d) on", "d_on", "#c9a37a", "#e4d1bc"),
                                               ("(d) off", "d_off", "#8c8c8c", "#c6c6c6"))]
    if any(i[1] is not None for i in step_items):
        p5, h = _panel(10, y, width - 20, "Worker execute_model + sample_tokens per call "
                       "(the forward itself)", step_items, "seconds", digits=3)
        parts += p5
        y += h + 10
    bd = agg.get("b_breakdown_s") or {}
    total = (agg.get("b_seconds") or {}).get("median") or 0.0
    if bd and total:
        big = {k: st for k, st in bd.items() if st["median"] >= 0.002 * total}
        small = sum(max(st["median"], 0.0) for k, st in bd.items() if k not in big)
        items = [item(SHORT_LABELS.get(k, k), st, "#dd8452")
                 for k, st in sorted(big.items(), key=lambda kv: -kv[1]["median"])]
        if small:
            items.append(("other timed parts", small, None, None, "#dd8452"))
        p2, h = _panel(10, y, width - 20, "(b) generate() wall time by part (driver-side "
                       "timers)", items, "seconds", digits=3)
        parts += p2
        y += h + 10
    c_items = [item("(c) import vllm", agg.get("c_vllm.import_vllm_s"), "#4c72b0"),
                    item("(c) then from vllm import LLM",
                         agg.get("c_vllm.from_vllm_import_LLM_s"), "#4c72b0"),
                    item("(c) import speculators generator module",
                         agg.get("c_activate_warm.import_generator_s"), "#8c8c8c"),
                    item("(c) activate() alone (shim's own cost)",
                         agg.get("c_activate_warm.activate_s"), "#dd8452"),
                    item("(c) activate() right after import vllm",
                         agg.get("c_activate.activate_total_s"), "#c9a37a")]
    if any(i[1] is not None for i in c_items):
        p3, h = _panel(10, y, width - 20, "Import and activation, fresh processes", c_items,
                       "seconds", ref=None, digits=2)
        parts += p3
        y += h + 10
    return (f'<svg xmlns="http://www.w3.org/2000/svg" width="{width:.0f}" height="{y:.0f}" '
            f'viewBox="0 0 {width:.0f} {y:.0f}" font-family="DejaVu Sans, Arial, sans-serif">'
            f'<rect width="100%" height="100%" fill="white"/>' + "".join(parts) + "</svg>\n")


def write_outputs(data: dict, *, plot: str | None, docs: str | None) -> None:
    if plot:
        Path(plot).parent.mkdir(parents=True, exist_ok=True)
        Path(plot).write_text(svg(data))
    if docs:
        path = Path(docs)
        text = path.read_text()
        if BEGIN not in text or END not in text:
            raise SystemExit(f"{docs} has no generated-results markers")
        head, rest = text.split(BEGIN, 1)
        _, tail = rest.split(END, 1)
        rel = os.path.relpath(plot, path.parent) if plot else None
        body = markdown(data) + (f"\n\n![benchmark plot]({rel})" if rel else "")
        path.write_text(f"{head}{BEGIN}\n{body}\n{END}{tail}")
