"""speculators' own offline data-generation script through the shim, timed, on the GPU.

``gpu_bench.py`` times the generator in loops shaped like speculators' offline script;
this runs the script itself: ``scripts/data_generation_offline.py`` of each release
(fetched unchanged from speculators' tags into ``.gpu-kit/spectests/<version>/scripts/``,
``--script VERSION=PATH`` overrides) as ``python3 -m speculators_compat run <script>
...``, with the release and the shim on ``PYTHONPATH`` and no network:

- the model is ``gpu_bench.py``'s random-weight checkpoint of Llama-3-8B's shape (built
  by its ``build`` child if absent, under ``--work``/ckpt: the same folder, reused), whose
  word-level tokenizer (``t<id>`` is token ``id``) carries a ChatML chat template;
- the data is a local ShareGPT-style ``.jsonl`` (``{"id", "conversations": [{"from":
  "human", "value"}, {"from": "gpt", "value"}]}``), which speculators' preprocessing
  loads with ``datasets``' json builder offline (a ``.json``/``.jsonl`` path is the one
  input it accepts without the hub): ``--samples`` conversations of seeded random words,
  about ``--min-len``..``--max-len`` tokens each after the chat template;
- the script's own arguments: ``--layer-ids`` as the benchmark's, ``--batch-size``
  (default 8, the script's), ``--seq-length`` 2048, ``--tensor-parallel-size 1`` (its
  default counts accelerators, 0 on a CPU build), ``--max-samples``, and the HF datasets
  cache, token-frequency file and output folder under ``--work``.

Timing comes from the script's own log lines, stamped by this parent as they arrive
(``PYTHONUNBUFFERED=1``): from "Processing N/N samples" (the generator is built, the loop
starts) to "Saved N new data points" (every save done); ``steady`` is the rate between
the first call's saves and the last file written (the files' write times), without the
first call's warm-up. The script's wall time from start to exit (imports, preprocessing,
engine start) is recorded apart.

After the releases, one check child reads every ``data_<i>.pt`` of each (memory-mapped):
there is one per sample, its ``input_ids`` are exactly the chat-template encoding of the
conversation the script's own order puts at ``i`` (``datasets``' json load,
``shuffle(seed)`` and ``select`` as speculators' preprocessing does them), it holds one
``[tokens, hidden]`` bf16 tensor per layer and a loss mask of the same length, the first
and last files' states are finite; and the releases' states of the first samples agree
(minimum per-token cosine >= 0.99). Results: ``<out>/offline_script.json`` (rewritten
after every step); ``gpu_bench.py render`` renders it beside the generator-level rows.

Device (``tools/gpu/gpu_bench.sh -- --offline-script [ARGS]`` does it after the preamble)::

    python3 benchmarks/gpu/offline_script_bench.py --out $OUT --work /root/gpu-bench \\
        --site /root/site --spec 0.3.0=/root/spec-0.3.0 --spec 0.4.0.1=/root/spec-0.4.0.1

CPU test (tiny model, a few samples)::

    VLLM_CPU_KVCACHE_SPACE=1 .envs/vllm-0.32.0/bin/python benchmarks/gpu/offline_script_bench.py \\
        --tiny --out /tmp/osb --work /tmp/osbw --spec 0.3.0=.envs/speculators-0.3.0 \\
        --spec 0.4.0.1=.envs/speculators-0.4.0.1
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BENCH = Path(__file__).resolve().parent
SCRIPT = "scripts/data_generation_offline.py"
LOG_TAIL = 4000
#: Minimum per-token cosine between the releases' states of one sample (gpu_bench.py's).
MIN_COSINE = 0.99
#: Samples whose states are compared between releases (each release keeps these files).
COMPARE = 4
#: A file may hold its states and a few kB of pickle; more means a tensor was saved with a
#: larger storage behind it (a view of memory shared with other results).
MAX_FILE_OVER_STATES = 1.5
FILE_OVERHEAD = 16 * 1024

#: The script's log lines around its generation loop (its logging format may or may not
#: carry a time: the parent stamps every line of the child's output as it arrives).
START_RE = re.compile(r"Processing (\d+)/(\d+) samples")
END_RE = re.compile(r"Saved (\d+) new data points")


# ------------------------------------------------------------------------------- the data
def conversations(n: int, min_len: int, max_len: int, vocab: int, seed: int) -> list[dict]:
    """``n`` ShareGPT-style conversations of random words ``t<id>`` (each one token of the
    checkpoint's word-level tokenizer), one human and one gpt turn, ``min_len``..``max_len``
    words in all (the chat template adds a few tokens); the first word of each human turn
    is unique, so no two conversations are equal."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        total = rng.randint(min_len, max_len)
        human = max(2, total // 4)
        words = [f"t{rng.randrange(5, vocab)}" for _ in range(total)]
        words[0] = f"t{5 + i % (vocab - 5)}"
        out.append({"id": f"c{i}", "conversations": [
            {"from": "human", "value": " ".join(words[:human])},
            {"from": "gpt", "value": " ".join(words[human:])}]})
    return out


def write_jsonl(path: Path, rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


# ---------------------------------------------------------------------------- the timing
def parse_timing(log: str) -> dict:
    """The generation loop's start and end from the script's own log lines, by the times
    the parent stamped on them (``<unix time> <line>``)."""
    start = end = None
    for line in log.splitlines():
        stamp, _, text = line.partition(" ")
        try:
            when = float(stamp)
        except ValueError:
            continue
        m = START_RE.search(text)
        if m:
            start = (when, int(m.group(1)))
        m = END_RE.search(text)
        if m:
            end = (when, int(m.group(1)))
    out = {"loop_start": start[0] if start else None, "loop_end": end[0] if end else None,
           "samples_logged": end[1] if end else None}
    if start and end:
        out["loop_s"] = end[0] - start[0]
    return out


def steady_rate(files: list[dict], batch: int) -> dict:
    """Tokens/s between the first call's last save and the last file written (files in
    index order, each with ``mtime`` and ``tokens``): the loop without its first call."""
    if len(files) <= batch:
        return {}
    t0 = max(f["mtime"] for f in files[:batch])
    t1 = max(f["mtime"] for f in files)
    tokens = sum(f["tokens"] for f in files[batch:])
    if t1 <= t0:
        return {}
    return {"steady_s": t1 - t0, "steady_tokens_per_s": tokens / (t1 - t0),
            "steady_samples_per_s": (len(files) - batch) / (t1 - t0)}


# ------------------------------------------------------------------------------ the disk
GIB = 1 << 30
#: Room kept beyond the estimate (the datasets cache, token frequencies, logs).
DISK_MARGIN = 2 * GIB


def checkpoint_bytes(model: dict) -> int:
    """bf16 bytes of a Llama checkpoint of this config (untied embeddings)."""
    h, i, n = model["hidden_size"], model["intermediate_size"], model["num_hidden_layers"]
    kv = model["num_key_value_heads"] * model.get("head_dim", h // model["num_attention_heads"])
    per_layer = 2 * h * h + 2 * h * kv + 3 * h * i + 2 * h
    return 2 * (2 * model["vocab_size"] * h + n * per_layer + h)


def release_output_bytes(samples: int, max_words: int, hidden: int, layers: int) -> int:
    """An upper bound of one release's ``data_<i>.pt`` files: every sample at its longest
    (one token a word, a few for the chat template), one bf16 row per layer and token."""
    return samples * (max_words + 32) * hidden * layers * 2 + samples * FILE_OVERHEAD


def prune_output(out: Path, keep: int) -> int:
    """Delete ``data_<i>.pt`` for ``i >= keep`` (the cross-release comparison reads the
    first ``keep``); returns the bytes freed."""
    freed = 0
    for f in out.glob("data_*.pt"):
        if f.stem[5:].isdigit() and int(f.stem[5:]) >= keep:
            freed += f.stat().st_size
            f.unlink()
    return freed


# ----------------------------------------------------------------------------- the check
def check_child(params_file: str) -> None:
    """One child after every release's run: each release's files against the script's
    own order, then the releases against each other (the same samples, the same states)."""
    import importlib.metadata as md

    from datasets import load_dataset
    from transformers import AutoTokenizer

    p = json.loads(Path(params_file).read_text())
    if p.get("compare_only"):
        Path(p["result"]).write_text(json.dumps(
            {"agree": compare_releases(p["releases"], p["compare_samples"])}, indent=1))
        return
    res: dict = {"versions": {}, "releases": {}}
    for dist in ("torch", "transformers", "vllm", "datasets"):
        for name in (dist, f"{dist}-cpu"):
            try:
                res["versions"][dist] = md.version(name)
                break
            except md.PackageNotFoundError:
                res["versions"][dist] = None
    raw = load_dataset("json", data_files=p["data"], split="train",
                       cache_dir=str(Path(p["work"]) / "check-cache")).shuffle(seed=p["seed"])
    if p["samples"] < len(raw):
        raw = raw.select(range(p["samples"]))
    order = list(raw["id"])
    convs = {c["id"]: c["conversations"] for c in p["rows"]}
    tok = AutoTokenizer.from_pretrained(p["model"])
    roles = {"human": "user", "gpt": "assistant"}
    expected = {}
    for cid in order:
        messages = [{"role": roles[t["from"]], "content": t["value"]} for t in convs[cid]]
        text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=False)
        expected[cid] = list(tok(text, add_special_tokens=False)["input_ids"])
    for rel in p["releases"]:
        res["releases"][rel["release"]] = check_files(
            Path(rel["output_dir"]), order, expected, p["layers"], p["hidden"],
            rel["batch_size"])
    Path(p["result"]).write_text(json.dumps(res, indent=1))


def check_files(out: Path, order: list[str], expected: dict, layers: list[int], hidden: int,
                batch_size: int) -> dict:
    """One release's ``data_<i>.pt``: one per sample, conversation ``order[i]``'s tokens,
    one ``[tokens, hidden]`` bf16 tensor per layer, a loss mask as long, finite states in
    the first and last files."""
    import torch

    errors: list[str] = []
    files: list[dict] = []
    for i, cid in enumerate(order):
        path = out / f"data_{i}.pt"
        if not path.exists():
            errors.append(f"data_{i}.pt missing")
            continue
        d = torch.load(path, mmap=True, weights_only=True)
        ids = [int(x) for x in d["input_ids"]]
        hs = d["hidden_states"]
        if ids != expected[cid]:
            errors.append(f"data_{i}.pt: input_ids are not conversation {cid}'s "
                          f"(position {i} of the script's order)")
        if len(hs) != len(layers):
            errors.append(f"data_{i}.pt: {len(hs)} layers, expected {len(layers)}")
        bad = [tuple(h.shape) for h in hs if tuple(h.shape) != (len(ids), hidden)
               or h.dtype != torch.bfloat16]
        if bad:
            errors.append(f"data_{i}.pt: layer shapes/dtypes {bad[:2]}, expected "
                          f"({len(ids)}, {hidden}) bfloat16")
        if len(d["loss_mask"]) != len(ids):
            errors.append(f"data_{i}.pt: loss mask of {len(d['loss_mask'])} for {len(ids)} "
                          "tokens")
        if i in (0, len(order) - 1) and not all(bool(torch.isfinite(h).all()) for h in hs):
            errors.append(f"data_{i}.pt: non-finite hidden states")
        size, states = path.stat().st_size, sum(h.nelement() * h.element_size() for h in hs)
        if size > MAX_FILE_OVER_STATES * states + FILE_OVERHEAD:
            errors.append(f"data_{i}.pt: {size} bytes for {states} bytes of states (a tensor "
                          "saved with a larger storage behind it)")
        files.append({"mtime": path.stat().st_mtime, "tokens": len(ids), "bytes": size})
    extra = sorted(f.name for f in out.glob("data_*.pt")
                   if not f.stem[5:].isdigit() or int(f.stem[5:]) >= len(order))
    if extra:
        errors.append(f"files beyond the samples: {extra[:3]}")
    return {"files": len(files), "expected": len(order),
            "tokens": sum(f["tokens"] for f in files),
            "bytes": sum(f["bytes"] for f in files), "errors": errors[:10],
            "error_count": len(errors), "error": errors[0] if errors else None,
            "ok": not errors and len(files) == len(order),
            "config_written": (out / "data_config.json").exists(),
            **steady_rate(files, batch_size)}


def compare_releases(releases: list[dict], n: int) -> dict | None:
    """The first ``n`` samples' states of every release against the first release's:
    minimum per-token cosine over layers (both ran the same tokens on one engine
    configuration; the threshold is gpu_bench's)."""
    import torch

    if len(releases) < 2:
        return None
    base = releases[0]
    out = {"threshold": MIN_COSINE, "samples": n, "pairs": {}}
    for other in releases[1:]:
        worst = 1.0
        for i in range(n):
            a_path = Path(base["output_dir"]) / f"data_{i}.pt"
            b_path = Path(other["output_dir"]) / f"data_{i}.pt"
            if not (a_path.exists() and b_path.exists()):
                worst = None
                break
            ha = torch.load(a_path, mmap=True, weights_only=True)["hidden_states"]
            hb = torch.load(b_path, mmap=True, weights_only=True)["hidden_states"]
            for x, y in zip(ha, hb):
                if x.shape != y.shape:
                    worst = -1.0
                    continue
                cos = torch.nn.functional.cosine_similarity(x.float(), y.float(), dim=-1)
                worst = min(worst, float(cos.min()))
        out["pairs"][f"{base['release']} vs {other['release']}"] = worst
    out["ok"] = all(v is not None and v >= MIN_COSINE for v in out["pairs"].values())
    return out


# ------------------------------------------------------------------------------- parent
def _run(cmd: list[str], env: dict, cwd: Path, log: Path, timeout: float) -> tuple:
    """``cmd`` in its own session (its engine processes end with it), every output line
    written to ``log`` with the time it arrived; (rc, wall s)."""
    t = time.time()
    env = {**env, "PYTHONUNBUFFERED": "1"}
    with open(log, "w") as lf:
        proc = subprocess.Popen(cmd, env=env, cwd=str(cwd), stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, start_new_session=True)

        def pump() -> None:
            for raw in proc.stdout:
                lf.write(f"{time.time():.3f} {raw.decode(errors='replace').rstrip()}\n")
            lf.flush()

        reader = threading.Thread(target=pump, daemon=True)
        reader.start()
        try:
            rc = proc.wait(timeout=max(timeout, 1))
        except subprocess.TimeoutExpired:
            rc = "timeout"
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except OSError:
            pass
        proc.wait()
        reader.join(timeout=10)
    return rc, time.time() - t


def _machine(smi: str | None) -> dict:
    gpus = [x.split(":", 1)[1].split("(")[0].strip() for x in (smi or "").splitlines()
            if x.startswith("GPU ")]
    return {"host": platform.node(), "cpus": os.cpu_count(), "nvidia_smi": smi,
            "gpu": gpus[0] if gpus else None, "gpus": len(gpus),
            "device": "cuda" if gpus else "cpu"}


class Bench:
    def __init__(self, a) -> None:
        import gpu_bench

        self.a, self.gb = a, gpu_bench
        self.t0 = time.time()
        self.out, self.work = Path(a.out), Path(a.work)
        self.base = self.work / "offline-script"
        for d in (self.out, self.base):
            d.mkdir(parents=True, exist_ok=True)
        self.doc: dict = {"kind": "offline_script", "argv": sys.argv[1:], "runs": [],
                          "started": time.strftime("%Y-%m-%dT%H:%M:%S%z")}

    def save(self) -> None:
        path = self.out / self.a.json_name
        path.with_suffix(".tmp").write_text(json.dumps(self.doc, indent=1, default=str))
        os.replace(path.with_suffix(".tmp"), path)

    def remaining(self) -> float:
        return self.a.deadline - (time.time() - self.t0)

    def env(self, spec_dir: str) -> dict:
        env = dict(os.environ)
        pp = [str(ROOT / "src"), spec_dir] + ([self.a.site] if self.a.site else [])
        env["PYTHONPATH"] = os.pathsep.join(os.path.abspath(x) for x in pp)
        env.update(HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
                   VLLM_NO_USAGE_STATS="1", TOKENIZERS_PARALLELISM="false")
        env.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
        env.pop("SPECULATORS_COMPAT_ACTIVE", None)
        return env

    def ckpt(self) -> Path:
        return self.work / "ckpt" / ("llama-tiny" if self.a.tiny else "llama3-8b-shape")

    def build(self, cfg: dict) -> dict:
        """``gpu_bench.py``'s build child: the same checkpoint folder, reused if built."""
        ckpt = self.ckpt()
        params = self.base / "build.params.json"
        result = self.base / "build.result.json"
        result.unlink(missing_ok=True)
        params.write_text(json.dumps({"mode": "build", "ckpt": str(ckpt),
                                      "model_config": cfg["model"], "result": str(result)}))
        env = self.env("")
        env["PYTHONPATH"] = os.pathsep.join(
            [str(ROOT / "src"), str(BENCH)] + ([self.a.site] if self.a.site else []))
        rc, wall = _run([self.a.python, str(BENCH / "gpu_bench.py"), "--child", str(params)],
                        env, self.base, self.base / "build.log", min(300, self.remaining()))
        res = json.loads(result.read_text()) if result.exists() else {"ok": False}
        res.update(rc=rc, wall_s=wall)
        return res

    def main(self) -> int:
        a = self.a
        cfg = dict(self.gb.SMALL if a.tiny else self.gb.FULL)
        layers = cfg["layers"]
        hidden = cfg["model"]["hidden_size"]
        n = a.samples or (12 if a.tiny else 256)
        lo, hi = (a.min_len, a.max_len) if a.min_len else ((20, 40) if a.tiny else (760, 1010))
        room = self.disk_room(cfg, n, hi, hidden, len(layers))
        self.doc["disk"] = room
        if not room["ok"]:
            print(room["error"], flush=True)
            self.save()
            return 2
        build = self.build(cfg)
        self.doc["build"] = build
        self.save()
        if not build.get("ok"):
            print(f"build failed: {build}", flush=True)
            return 1
        model = build["path"]
        rows = conversations(n, lo, hi, cfg["model"]["vocab_size"], a.seed)
        data = self.base / "conversations.jsonl"
        write_jsonl(data, rows)
        seq_length = cfg["max_model_len"]
        self.doc.update(params={"samples": n, "words": [lo, hi], "batch_size": a.batch_size,
                                "layers": layers, "seq_length": seq_length, "seed": a.seed,
                                "tiny": a.tiny, "model": model, "model_config": cfg["model"],
                                "preprocessing_workers": a.preprocessing_workers},
                        machine=_machine(self.gb._nvidia_smi()))
        self.save()
        specs = list(a.spec)
        for i, (version, spec_dir) in enumerate(specs):
            left = (self.remaining() - a.check_reserve
                    - a.min_release * (len(specs) - i - 1))
            if left < a.min_release:
                self.doc["runs"].append({"release": version, "ok": False,
                                         "error": "not run: deadline"})
                self.save()
                continue
            run = self.run_release(version, spec_dir, model, data, n, layers, seq_length,
                                   left)
            self.doc["runs"].append(run)
            self.save()
            if run.get("output_dir"):
                # checked at once, then only the samples the releases' comparison reads
                # are kept: one release's files on the disk at a time (7.5 GB at 8B)
                self.check([run], model, data, rows, n, layers, hidden)
                if not a.keep_output:
                    run["pruned_bytes"] = prune_output(Path(run["output_dir"]), COMPARE)
                self.save()
        ran = [r for r in self.doc["runs"] if r.get("output_dir")]
        self.compare(ran)
        for r in ran:
            if not a.keep_output:
                shutil.rmtree(r["output_dir"], ignore_errors=True)
        self.doc["wall_s"] = time.time() - self.t0
        self.save()
        sys.path.insert(0, str(BENCH))
        from gpu_bench_render import render_offline_script

        print("\n".join(render_offline_script([self.doc])), flush=True)
        return 0 if self.doc["runs"] and all(r.get("ok") for r in self.doc["runs"]) else 1

    def run_release(self, version, spec_dir, model, data, n, layers, seq_length,
                    left) -> dict:
        """speculators' script of ``version`` through the shim; its log stamped."""
        a = self.a
        script = Path(dict(a.script).get(version) or
                      ROOT / ".gpu-kit" / "spectests" / version / SCRIPT)
        work = self.base / version
        shutil.rmtree(work, ignore_errors=True)
        work.mkdir(parents=True)
        out = work / "out"
        run: dict = {"release": version, "script": str(script), "batch_size": a.batch_size,
                     "spec_dir": spec_dir}
        if not script.is_file():
            run.update(ok=False, error=f"{script}: no such file (fetch speculators' "
                                       f"scripts/ of tag v{version}, or --script)")
            return run
        cmd = [a.python, "-m", "speculators_compat", "run", str(script),
               "--target-model-path", model, "--train-data-path", str(data),
               "--output-dir", str(out), "--hf-cache-dir", str(work / "hf-datasets"),
               "--token-freq-path", str(work / "token_freq.pt"),
               "--layer-ids", *map(str, layers), "--batch-size", str(a.batch_size),
               "--seq-length", str(seq_length), "--tensor-parallel-size", "1",
               "--max-samples", str(n),
               "--num-preprocessing-workers", str(a.preprocessing_workers)]
        log = work / "script.log"
        print(f"[{time.time() - self.t0:5.0f}s] {version}: {' '.join(cmd[:5])} ...", flush=True)
        rc, wall = _run(cmd, self.env(spec_dir), work, log, left)
        text = log.read_text(errors="replace")
        timing = parse_timing(text)
        run.update(cmd=cmd, rc=rc, wall_s=wall, log=str(log), timing=timing,
                   output_dir=str(out), ok=rc == 0 and bool(timing.get("loop_s")))
        if not run["ok"]:
            run["log_tail"] = text[-LOG_TAIL:]
        print(f"[{time.time() - self.t0:5.0f}s] {version}: rc {rc}, {wall:.0f}s, loop "
              f"{timing.get('loop_s') or 0:.1f}s", flush=True)
        return run

    def check(self, runs: list[dict], model, data, rows, n, layers, hidden) -> None:
        """One check child for every release that ran (in the first one's environment):
        files complete and in order, the releases' states equal; then samples/s and
        tokens/s from the files' tokens."""
        work = self.base
        params = work / "check.params.json"
        result = work / "check.result.json"
        result.unlink(missing_ok=True)
        params.write_text(json.dumps({
            "data": str(data), "rows": rows, "samples": n, "seed": self.a.seed,
            "model": model, "layers": layers, "hidden": hidden, "work": str(work),
            "result": str(result),
            "releases": [{"release": r["release"], "output_dir": r["output_dir"],
                          "batch_size": r["batch_size"]} for r in runs]}))
        crc, cwall = _run([self.a.python, str(Path(__file__).resolve()), "--check",
                           str(params)], self.env(runs[0]["spec_dir"]), work,
                          work / "check.log", max(self.remaining(), 30))
        if result.exists():
            res = json.loads(result.read_text())
        else:
            tail = (work / "check.log").read_text(errors="replace")[-1500:]
            res = {"releases": {}, "error": f"check exited {crc}: {tail}"}
        self.doc.setdefault("check", {}).update(
            wall_s=cwall, versions=res.get("versions"), error=res.get("error"))
        for r in runs:
            chk = res["releases"].get(r["release"]) or {"ok": False,
                                                       "error": res.get("error")}
            r["check"], r["versions"] = chk, res.get("versions")
            timing = r["timing"]
            if timing.get("loop_s") and chk.get("tokens"):
                timing.update(samples_per_s=chk["files"] / timing["loop_s"],
                              tokens_per_s=chk["tokens"] / timing["loop_s"])
            for k in ("steady_s", "steady_tokens_per_s", "steady_samples_per_s"):
                if k in chk:
                    timing[k] = chk[k]
            r["ok"] = bool(r.get("ok")) and bool(chk.get("ok"))
            print(f"{r['release']}: {timing.get('tokens_per_s') or 0:,.0f} tok/s, "
                  f"{timing.get('samples_per_s') or 0:.1f} samples/s, check "
                  f"{'ok' if chk.get('ok') else chk.get('error')}", flush=True)

    def compare(self, runs: list[dict]) -> None:
        """The releases' states of the first ``COMPARE`` samples against each other (the
        files each release kept)."""
        if len(runs) < 2:
            return
        params = self.base / "compare.params.json"
        result = self.base / "compare.result.json"
        result.unlink(missing_ok=True)
        params.write_text(json.dumps({
            "compare_only": True, "compare_samples": COMPARE, "result": str(result),
            "releases": [{"release": r["release"], "output_dir": r["output_dir"]}
                         for r in runs]}))
        _run([self.a.python, str(Path(__file__).resolve()), "--check", str(params)],
             self.env(runs[0]["spec_dir"]), self.base, self.base / "compare.log",
             max(self.remaining(), 30))
        agree = (json.loads(result.read_text()).get("agree") if result.exists() else
                 {"ok": False, "error": (self.base / "compare.log").read_text(
                     errors="replace")[-1500:]})
        self.doc.setdefault("check", {})["agree"] = agree
        print(f"releases agree: {agree}", flush=True)
        if not agree.get("ok"):
            for r in runs:
                r["ok"] = False

    def disk_room(self, cfg: dict, samples: int, max_words: int, hidden: int,
                  layers: int) -> dict:
        """Whether ``--work`` has room for the checkpoint (unless built) and one release's
        files at a time: a full disk stopped a device machine once (2026-12-04)."""
        files = release_output_bytes(samples, max_words, hidden, layers)
        ckpt = self.ckpt()
        build = 0 if (ckpt / "config.json").exists() else checkpoint_bytes(cfg["model"])
        need = files + build + DISK_MARGIN
        free = shutil.disk_usage(self.base).free
        room = {"free_bytes": free, "need_bytes": need, "files_bytes": files,
                "checkpoint_bytes": build, "ok": free >= need}
        if not room["ok"]:
            room["error"] = (
                f"offline_script_bench: {free / GIB:.1f} GiB free under {self.base}; "
                f"{samples} samples of one release need about {files / GIB:.1f} GiB"
                + (f" and the checkpoint {build / GIB:.1f} GiB" if build else "")
                + ". Free it first (rm -rf /root/gpu-models) or pass fewer --samples.")
        return room


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default=os.environ.get("OUT", "/tmp/offline-script-out"))
    p.add_argument("--json-name", default="offline_script.json")
    p.add_argument("--work", default="/tmp/gpu-bench",
                   help="gpu_bench.py's work folder: its checkpoint is reused")
    p.add_argument("--site", default=None, help="folder with vLLM and its dependencies")
    p.add_argument("--spec", action="append", default=[], type=lambda s: tuple(s.split("=", 1)),
                   help="VERSION=DIR (repeatable)")
    p.add_argument("--script", action="append", default=[],
                   type=lambda s: tuple(s.split("=", 1)),
                   help=f"VERSION=PATH of {SCRIPT} (default .gpu-kit/spectests/VERSION/...)")
    p.add_argument("--samples", type=int, default=None, help="conversations (default 256)")
    p.add_argument("--min-len", type=int, default=None, help="words per conversation, min")
    p.add_argument("--max-len", type=int, default=None, help="words per conversation, max")
    p.add_argument("--batch-size", type=int, default=8, help="the script's --batch-size")
    p.add_argument("--preprocessing-workers", type=int, default=1,
                   help="the script's --num-preprocessing-workers (outside the timed loop)")
    p.add_argument("--seed", type=int, default=0, help="the data's and the script's --seed")
    p.add_argument("--tiny", action="store_true", help="tiny Llama, few samples (CPU test)")
    p.add_argument("--deadline", type=float, default=210, help="seconds for the whole call")
    p.add_argument("--min-release", type=float, default=75,
                   help="seconds kept for every later release")
    p.add_argument("--check-reserve", type=float, default=20,
                   help="seconds kept for the check after the last release")
    p.add_argument("--keep-output", action="store_true",
                   help="keep the script's files (WORK/offline-script/VERSION/out)")
    p.add_argument("--python", default=sys.executable)
    return p


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--check"]:
        try:
            check_child(argv[1])
        except BaseException:
            traceback.print_exc()
            raise
        return 0
    a = parser().parse_args(argv)
    if not a.spec:
        raise SystemExit("give at least one --spec VERSION=DIR")
    a.spec = [(v, os.path.abspath(d)) for v, d in a.spec]
    if str(BENCH) not in sys.path:
        sys.path.insert(0, str(BENCH))
    return Bench(a).main()


if __name__ == "__main__":
    sys.exit(main())
