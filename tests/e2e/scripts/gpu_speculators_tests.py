"""Run speculators' own GPU regression tests through the shim on a machine without network.

speculators 0.3.0 and 0.4.0.1 ship ``tests/datagen/test_vllm_hidden_states.py``: marked
``regression``, skipped without CUDA, they load ``Qwen/Qwen2-0.5B`` from the Hugging Face hub
(transformers' forward and speculators' ``VllmHiddenStatesGenerator``) and compare the hidden
states (0.4.0.1 also compares a batch with its sequences one by one, chunked prefill). The
lent GPU machine has no network, so this script:

1. builds, under ``--hf-home`` (default ``/root/hf``), the hub cache layout that
   ``from_pretrained("Qwen/Qwen2-0.5B")`` resolves offline (``hub/models--Qwen--Qwen2-0.5B/
   refs/main`` naming ``snapshots/<40 hex>/``): Qwen2-0.5B's published architecture
   (``Qwen2ForCausalLM``, hidden 896, 24 layers, 14 heads / 2 KV heads, intermediate 4864,
   vocab 151,936, rope theta 1e6, tied embeddings, bf16) with seeded random weights
   (transformers' own initialisation, saved as safetensors), and a byte-level BPE tokenizer
   trained here on a small built-in English corpus that holds every test prompt (each word
   one token, as in Qwen2's own vocabulary; the two accuracy prompts are checked to have the
   same length, so padding does not enter that comparison), with Qwen2's ChatML template and
   ``<|endoftext|>`` as eos and pad. A stamp file makes the build idempotent;
2. runs, per ``--spec VERSION=DIR``, ``python -m speculators_compat run -m pytest -x -q -p
   no:cacheprovider -rfEs <test file> -m regression`` in its own process group with a
   timeout, in a temporary folder holding a copy of the test file's tree and a
   ``pyproject.toml`` with speculators' pytest markers, ``PYTHONPATH=<prefix>:<repo>/src:DIR:
   <sites>`` and the hub offline. Before it, a probe in the same environment records where
   ``speculators_compat``, ``speculators``, torch, transformers and vLLM are imported from; a
   run whose ``speculators_compat`` is not this repository's ``src`` or whose ``speculators`` is
   not DIR's VERSION is not ok;
3. writes ``--out`` (JSON: per release rc, passed / failed / skipped counts from pytest's last
   line, wall seconds, log tail, verdict and reasons) after every run, and each run's log
   into ``--logs``.

A skipped test is a failure here (``ok: false``): on the GPU machine a skip means the check
did not run. On a CPU machine both files skip ("CUDA required"), which exercises the plumbing.

Random weights are no Qwen2 checkpoint: the comparisons test the generator's plumbing at
Qwen2-0.5B's shapes, not the published model's numerics.

CPU test of the builder (tiny dimensions, same architecture class)::

    .envs/vllm-0.32.0/bin/python tests/e2e/scripts/gpu_speculators_tests.py --build-only \\
        --tiny --hf-home /tmp/hf-tiny
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
REPO_ID = "Qwen/Qwen2-0.5B"
#: Bumped whenever the recipe changes the files, so an older build is redone.
RECIPE_VERSION = 1
STAMP_NAME = "speculators_compat_build.json"
TEST_TIMEOUT_S = 600.0

#: Qwen2-0.5B's config.json as published (architecture fields); token ids are this tokenizer's.
QWEN2_0_5B = {
    "architectures": ["Qwen2ForCausalLM"],
    "hidden_size": 896,
    "intermediate_size": 4864,
    "num_hidden_layers": 24,
    "num_attention_heads": 14,
    "num_key_value_heads": 2,
    "vocab_size": 151936,
    "max_position_embeddings": 131072,
    "max_window_layers": 24,
    "sliding_window": 131072,
    "use_sliding_window": False,
    "rope_theta": 1000000.0,
    "rms_norm_eps": 1e-6,
    "hidden_act": "silu",
    "initializer_range": 0.02,
    "attention_dropout": 0.0,
    "tie_word_embeddings": True,
    "use_cache": True,
}
#: CPU test dimensions: the same class; head dim 64 (vLLM's CPU attention needs 64 or 128);
#: 12 layers, so the tests' layer ids (2, n // 2, n - 3; and 10) exist.
TINY = {"hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 12,
        "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 4096,
        "max_window_layers": 12}

EOS, IM_START, IM_END = "<|endoftext|>", "<|im_start|>", "<|im_end|>"
SPECIAL_TOKENS = [EOS, IM_START, IM_END]
#: Qwen2-0.5B's chat template (ChatML with a default system message).
CHAT_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}{% endif %}"
    "{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
#: The prompts of speculators 0.3.0 / 0.4.0.1 ``test_vllm_hidden_states.py``.
ACCURACY_PROMPTS = [
    "The future of artificial intelligence is bright and full of possibilities that will "
    "transform humanity.",
    "In a world where technology advances rapidly, we must carefully consider the ethical "
    "implications.",
]
BATCH_PROMPTS = [
    "What is 2+2?",
    "Explain the theory of relativity in simple terms.",
    "Write a haiku about the ocean.",
    "What are the main differences between Python and JavaScript?",
    "Hello!",
    "Translate 'good morning' to French, Spanish, and German.",
    "What is the capital of Brazil?",
    "Describe the process of photosynthesis step by step.",
]
CORPUS = """\
The quick brown fox jumps over the lazy dog. A small model reads a short text and writes
its hidden states to disk, one layer after another, for every token of every sequence.
Speculative decoding trains a draft model on the hidden states of a larger target model.
The draft proposes several tokens; the target checks them in one forward pass and keeps
the longest prefix it agrees with. Good drafts make generation faster without changing it.
Researchers measure the acceptance rate, the number of tokens per step and the time per
token. They compare batch processing with processing each sequence on its own, and they
check that the results match within a small tolerance.
Photosynthesis is the process by which plants use light, water and carbon dioxide to make
sugar and oxygen. The ocean covers most of the planet; its waves, tides and currents move
heat around the world. Brazil is a large country in South America; its capital is Brasilia.
Good morning is bonjour in French, buenos dias in Spanish and guten Morgen in German.
Python and JavaScript are programming languages: Python is often used for data and
science, JavaScript in the browser. Both have functions, classes, lists and dictionaries.
The theory of relativity says that the laws of physics are the same for every observer and
that the speed of light is constant. Simple terms help people understand hard ideas.
A haiku is a short poem of three lines. Hello, world! What is the answer? Two plus two is
four. Explain, describe, translate and write: these are things people ask an assistant.
"""


# ------------------------------------------------------------------------------- checkpoint
def checkpoint_params(tiny: bool) -> dict:
    """The config fields of the checkpoint (Qwen2-0.5B's, or the tiny CPU variant)."""
    return {**QWEN2_0_5B, **(TINY if tiny else {})}


def _corpus() -> list[str]:
    prompts = ACCURACY_PROMPTS + BATCH_PROMPTS
    return [line for line in CORPUS.splitlines() if line] + prompts * 4


def build_tokenizer(vocab_limit: int):
    """Byte-level BPE (as Qwen2's) trained on the built-in corpus until no pair is left, so
    every corpus word, test prompts included, is one token; any other text still encodes
    (bytes). Specials take ids 0..2; every id is below ``vocab_limit``."""
    import transformers
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_limit, special_tokens=SPECIAL_TOKENS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(_corpus(), trainer=trainer)
    if tok.get_vocab_size() > vocab_limit:
        raise RuntimeError(f"tokenizer has {tok.get_vocab_size()} ids, model vocab {vocab_limit}")
    fast = transformers.PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token=EOS, pad_token=EOS,
        additional_special_tokens=[IM_START, IM_END], model_max_length=32768,
        clean_up_tokenization_spaces=False)
    fast.chat_template = CHAT_TEMPLATE
    return fast


def check_tokenizer(fast, vocab_size: int) -> dict:
    """What the tests rely on: ids < vocab, lossless round trip, and both accuracy prompts of
    one length (the test pads them; with equal lengths no padding enters the comparison)."""
    lengths = {}
    for text in ACCURACY_PROMPTS + BATCH_PROMPTS:
        ids = fast(text)["input_ids"]
        if max(ids) >= vocab_size:
            raise RuntimeError(f"token id {max(ids)} >= vocab {vocab_size} for {text!r}")
        if fast.decode(ids) != text:
            raise RuntimeError(f"tokenizer does not round-trip {text!r}: {fast.decode(ids)!r}")
        lengths[text] = len(ids)
    acc = [lengths[t] for t in ACCURACY_PROMPTS]
    if len(set(acc)) != 1:
        raise RuntimeError(f"accuracy prompts tokenize to different lengths {acc}")
    return {"vocab": len(fast), "accuracy_prompt_tokens": acc,
            "batch_prompt_tokens": [lengths[t] for t in BATCH_PROMPTS]}


def _repo_dir(hf_home: Path) -> Path:
    return hf_home / "hub" / ("models--" + REPO_ID.replace("/", "--"))


def _build_key(tiny: bool, seed: int) -> dict:
    import transformers

    return {"recipe": RECIPE_VERSION, "repo": REPO_ID, "tiny": tiny, "seed": seed,
            "transformers": transformers.__version__, "config": checkpoint_params(tiny)}


def _is_built(repo: Path, key: dict) -> dict | None:
    try:
        stamp = json.loads((repo / STAMP_NAME).read_text())
        commit = (repo / "refs" / "main").read_text().strip()
    except (OSError, ValueError):
        return None
    snap = repo / "snapshots" / commit
    files_ok = all((snap / f).is_file() for f in ("config.json", "tokenizer.json"))
    weights = list(snap.glob("*.safetensors"))
    if stamp.get("key") == key and stamp.get("commit") == commit and files_ok and weights:
        return stamp
    return None


def build_checkpoint(hf_home: Path, tiny: bool = False, seed: int = 0) -> dict:
    """Build (or find built) ``Qwen/Qwen2-0.5B`` in the hub cache under ``hf_home``.

    The snapshot is written to a temporary folder, renamed into place, then ``refs/main`` and
    the stamp (last), so an interrupted build is redone rather than half used."""
    import torch
    import transformers

    repo = _repo_dir(hf_home)
    key = _build_key(tiny, seed)
    done = _is_built(repo, key)
    if done:
        return {**done, "skipped": True}
    t0 = time.time()
    commit = hashlib.sha1(json.dumps(key, sort_keys=True).encode()).hexdigest()
    (repo / "snapshots").mkdir(parents=True, exist_ok=True)
    (repo / "refs").mkdir(parents=True, exist_ok=True)
    (repo / STAMP_NAME).unlink(missing_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".build-", dir=repo))
    params = checkpoint_params(tiny)
    fast = build_tokenizer(params["vocab_size"])
    check_tokenizer(fast, params["vocab_size"])
    eos_id = fast.convert_tokens_to_ids(EOS)
    config = transformers.Qwen2Config(**{k: v for k, v in params.items()
                                         if k != "architectures"},
                                      bos_token_id=eos_id, eos_token_id=eos_id)
    config.architectures = list(params["architectures"])
    torch.manual_seed(seed)
    default = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    try:
        model = transformers.Qwen2ForCausalLM(config)
    finally:
        torch.set_default_dtype(default)
    model = model.to(torch.bfloat16).eval()
    std = float(model.model.layers[0].mlp.down_proj.weight.detach().float().std())
    if not 0.01 < std < 0.04:  # transformers' init: normal(0, initializer_range=0.02)
        raise RuntimeError(f"weights not initialised as expected (std {std:.4f})")
    n_params = sum(p.numel() for p in model.parameters())
    model.save_pretrained(tmp, safe_serialization=True)
    fast.save_pretrained(tmp)
    del model
    # What the tests load: AutoTokenizer picks the class from config.json (transformers 5:
    # Qwen2Tokenizer, with Qwen2's own pre-tokenizer over this vocabulary).
    loaded = transformers.AutoTokenizer.from_pretrained(tmp)
    tok_info = {**check_tokenizer(loaded, params["vocab_size"]),
                "class": type(loaded).__name__}
    snap = repo / "snapshots" / commit
    if snap.exists():
        shutil.rmtree(snap)
    tmp.rename(snap)
    for old in (repo / "snapshots").iterdir():
        if old.name != commit:
            shutil.rmtree(old, ignore_errors=True)
    (repo / "refs" / "main").write_text(commit)
    size = sum(f.stat().st_size for f in snap.rglob("*") if f.is_file())
    stamp = {"key": key, "commit": commit, "snapshot": str(snap), "parameters": n_params,
             "bytes": size, "build_s": round(time.time() - t0, 1), "weight_std": round(std, 5),
             "tokenizer": tok_info, "files": sorted(f.name for f in snap.iterdir())}
    (repo / STAMP_NAME).write_text(json.dumps(stamp, indent=1))
    return {**stamp, "skipped": False}


# ------------------------------------------------------------------------- pytest's verdict
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_COUNT = re.compile(r"(\d+) (passed|failed|skipped|errors?|xfailed|xpassed|deselected|"
                    r"warnings?|rerun)\b")
_TAIL = re.compile(r"\bin \d+(?:\.\d+)?s\b")
_NORMAL = {"error": "errors", "warning": "warnings"}


def parse_pytest_summary(text: str) -> dict | None:
    """pytest's last summary line (``1 failed, 2 passed, 1 skipped in 3.1s``, with or without
    the ``===`` frame) as ``{"line", "counts"}``; None if the log has none (a crash)."""
    for raw in reversed(text.splitlines()):
        line = _ANSI.sub("", raw).strip().strip("=").strip()
        if not _TAIL.search(line):
            continue
        if line.startswith("no tests ran"):
            return {"line": line, "counts": {}}
        counts = {}
        for n, word in _COUNT.findall(line.split(" in ")[0]):
            word = _NORMAL.get(word, word)
            counts[word] = counts.get(word, 0) + int(n)
        if counts:
            return {"line": line, "counts": counts}
    return None


def verdict(rc: int | None, summary: dict | None, timed_out: bool = False,
            problems: list[str] | None = None) -> tuple[bool, list[str]]:
    """ok only when pytest exited 0, passed at least one test and nothing else happened: a
    skipped test (e.g. "CUDA required") did not run its check, so it is a failure here."""
    reasons = list(problems or [])
    if timed_out:
        reasons.append("timed out")
    elif rc != 0:
        reasons.append(f"pytest exit status {rc}")
    if summary is None:
        reasons.append("no pytest summary line in the log")
    else:
        c = summary["counts"]
        for what in ("failed", "errors", "skipped", "xfailed", "xpassed"):
            if c.get(what):
                note = " (a skip is a failure here)" if what == "skipped" else ""
                reasons.append(f"{c[what]} {what}{note}")
        if not c.get("passed"):
            reasons.append("no test passed")
    return not reasons, reasons


# ---------------------------------------------------------------------------------- runner
PYPROJECT = """\
# speculators' [tool.pytest.ini_options] markers (0.3.0 / 0.4.0.1). Its addopts
# (-s -vvv --cache-clear) are left out: --cache-clear needs the cache provider this run
# disables (-p no:cacheprovider).
[tool.pytest.ini_options]
markers = [
    "smoke: quick tests to check basic functionality",
    "sanity: detailed tests to ensure major functions work correctly",
    "regression: tests to ensure that new changes do not break existing functionality"
]
"""

PROBE = r"""
import importlib.metadata as md, importlib.util, json, sys
out = {"python": sys.executable}
for name, dist in (("speculators_compat", "speculators-compat"), ("speculators", "speculators"),
                   ("torch", "torch"), ("transformers", "transformers"), ("vllm", "vllm"),
                   ("pytest", "pytest")):
    try:
        spec = importlib.util.find_spec(name)
    except Exception as exc:
        spec = None
    try:
        ver = md.version(dist)
    except Exception:
        ver = None
    out[name] = {"origin": spec.origin if spec else None, "version": ver}
try:
    import torch
    out["cuda"] = torch.cuda.is_available()
    out["gpu"] = torch.cuda.get_device_name(0) if out["cuda"] else None
except Exception as exc:
    out["torch_error"] = repr(exc)
print("PROBE " + json.dumps(out))
"""


def _under(path: str | None, folder: str) -> bool:
    if not path:
        return False
    p, f = os.path.realpath(path), os.path.realpath(folder)
    return p == f or p.startswith(f + os.sep)


def probe_problems(probe: dict | None, src: str, spec_dir: str, version: str) -> list[str]:
    """Why a run's imports are not the ones under test (empty: they are)."""
    if not probe:
        return ["import probe failed (see the log)"]
    out = []
    sc = (probe.get("speculators_compat") or {}).get("origin")
    if not _under(sc, src):
        out.append(f"speculators_compat imported from {sc}, not {src}")
    sp = probe.get("speculators") or {}
    if not _under(sp.get("origin"), spec_dir):
        out.append(f"speculators imported from {sp.get('origin')}, not {spec_dir}")
    elif sp.get("version") not in (None, version):
        out.append(f"speculators in {spec_dir} is {sp.get('version')}, not {version}")
    if "torch_error" in probe:
        out.append(f"torch does not import: {probe['torch_error']}")
    return out


def stage_tests(test_file: Path, work: Path) -> Path:
    """Copy the test file's folder (as ``tests/<sub>/``, with the ``__init__.py`` files on the
    way) and write speculators' pytest markers; return the file's path relative to ``work``."""
    test_file = test_file.resolve()
    anc = next((p for p in test_file.parents if p.name == "tests"), None)
    rel = test_file.relative_to(anc) if anc else Path("datagen") / test_file.name
    dest = work / "tests" / rel
    shutil.copytree(test_file.parent, dest.parent,
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    d = dest.parent.parent
    while True:
        init = d / "__init__.py"
        src_init = (anc / init.relative_to(work / "tests")) if anc else None
        if src_init is not None and src_init.is_file():
            shutil.copy2(src_init, init)
        elif not init.exists():
            init.write_text("")
        if d == work / "tests":
            break
        d = d.parent
    (work / "pyproject.toml").write_text(PYPROJECT)
    return Path("tests") / rel


def child_env(a: argparse.Namespace, spec_dir: str) -> dict:
    env = dict(os.environ)
    for k in ("VLLM_WORKER_MULTIPROC_METHOD",  # the shim's worker_spawn_method must do it
              "SPECULATORS_COMPAT_ACTIVE", "HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE",
              "TRANSFORMERS_CACHE"):
        env.pop(k, None)
    prefix = [p for p in (a.pythonpath_prefix or "").split(os.pathsep) if p]
    env["PYTHONPATH"] = os.pathsep.join(prefix + [str(ROOT / "src"), spec_dir, *a.site])
    env.update(HF_HOME=str(a.hf_home), HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
               HF_HUB_DISABLE_TELEMETRY="1", VLLM_NO_USAGE_STATS="1", PY_COLORS="0")
    env.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    return env


def _run_group(cmd: list[str], cwd: Path, env: dict, log, timeout: float) -> tuple[int, bool]:
    """Run ``cmd`` in its own process group (vLLM's workers included), killed at the timeout
    and always cleaned up afterwards, so the next release starts on a free GPU."""
    proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)
    timed_out = False
    try:
        rc = proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        timed_out = True
        _kill(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            pass
        rc = proc.poll()
    _kill(proc.pid, signal.SIGKILL)
    if rc is None:
        rc = proc.wait()
    return rc, timed_out


def _kill(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def run_release(a: argparse.Namespace, version: str, spec_dir: str, test_file: Path,
                logs: Path) -> dict:
    work = Path(tempfile.mkdtemp(prefix=f"spectests-{version}-"))
    rel = stage_tests(test_file, work)
    env = child_env(a, spec_dir)
    log_path = logs / f"speculators-{version}.log"
    t0 = time.time()
    with open(log_path, "w") as log:
        log.write(f"# PYTHONPATH={env['PYTHONPATH']}\n# HF_HOME={env['HF_HOME']}\n")
        log.flush()
        pr = subprocess.run([a.python, "-c", PROBE], cwd=work, env=env, capture_output=True,
                            text=True, timeout=300)
        log.write(pr.stdout + pr.stderr)
        probe = next((json.loads(line[6:]) for line in pr.stdout.splitlines()
                      if line.startswith("PROBE ")), None)
        problems = probe_problems(probe, str(ROOT / "src"), spec_dir, version)
        cmd = [a.python, "-m", "speculators_compat", "run", "-m", "pytest", "-x", "-q", "-p",
               "no:cacheprovider", "-rfEs", str(rel), "-m", "regression"]
        log.write("# " + " ".join(cmd) + "\n")
        log.flush()
        t1 = time.time()
        rc, timed_out = _run_group(cmd, work, env, log, a.timeout)
    wall = time.time() - t1
    text = log_path.read_text(errors="replace")
    summary = parse_pytest_summary(text)
    ok, reasons = verdict(rc, summary, timed_out, problems)
    if not a.keep_workdir:
        shutil.rmtree(work, ignore_errors=True)
    return {"version": version, "spec_dir": spec_dir, "test_file": str(test_file),
            "ok": ok, "reasons": reasons, "rc": rc, "timed_out": timed_out,
            "counts": (summary or {}).get("counts"), "pytest_line": (summary or {}).get("line"),
            "wall_s": round(wall, 1), "probe_s": round(t1 - t0, 1), "probe": probe,
            "pythonpath": env["PYTHONPATH"], "command": cmd, "log": str(log_path),
            "log_tail": text[-a.tail_chars:]}


def _default_tests(version: str) -> Path:
    return (ROOT / ".gpu-kit" / "spectests" / version / "tests" / "datagen"
            / "test_vllm_hidden_states.py")


def _pairs(items: list[str], flag: str) -> dict[str, str]:
    out = {}
    for item in items:
        if "=" not in item:
            raise SystemExit(f"{flag} {item!r}: expected VERSION=PATH")
        k, v = item.split("=", 1)
        out[k] = v
    return out


def _write(path: Path, obj) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(obj, indent=1, default=str))
    tmp.replace(path)


def parse(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--hf-home", type=Path, default=Path("/root/hf"))
    p.add_argument("--spec", action="append", default=[], help="VERSION=DIR (repeatable)")
    p.add_argument("--tests", action="append", default=[],
                   help="VERSION=PATH of tests/datagen/test_vllm_hidden_states.py (default: "
                        ".gpu-kit/spectests/VERSION/...)")
    p.add_argument("--site", action="append", default=[],
                   help="folder put on PYTHONPATH after the release (repeatable)")
    p.add_argument("--pythonpath-prefix", default="",
                   help="entries put before <repo>/src on every run's PYTHONPATH")
    p.add_argument("--timeout", type=float, default=TEST_TIMEOUT_S, help="seconds per release")
    p.add_argument("--out", type=Path, default=Path("/tmp/gpu-spectests/summary.json"))
    p.add_argument("--logs", type=Path, default=None, help="default: <out's folder>/logs")
    p.add_argument("--build-only", action="store_true")
    p.add_argument("--tiny", action="store_true", help="tiny dimensions (CPU test)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--python", default=sys.executable)
    p.add_argument("--tail-chars", type=int, default=6000)
    p.add_argument("--keep-workdir", action="store_true")
    a = p.parse_args(argv)
    a.hf_home = a.hf_home.resolve()
    a.site = [os.path.abspath(s) for s in a.site]
    a.logs = a.logs or a.out.parent / "logs"
    return a


def main(a: argparse.Namespace) -> int:
    t0 = time.time()
    model = build_checkpoint(a.hf_home, tiny=a.tiny, seed=a.seed)
    print(f"checkpoint {REPO_ID}: {'found' if model['skipped'] else 'built'} "
          f"({model['parameters'] / 1e6:.1f} M parameters, {model['bytes'] / 2**20:.0f} MiB, "
          f"{time.time() - t0:.1f} s) in {model['snapshot']}", flush=True)
    if a.build_only:
        return 0
    specs = _pairs(a.spec, "--spec")
    tests = _pairs(a.tests, "--tests")
    if not specs:
        raise SystemExit("no --spec VERSION=DIR given")
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.logs.mkdir(parents=True, exist_ok=True)
    result = {"date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "repo": REPO_ID,
              "hf_home": str(a.hf_home), "model": model, "runs": [], "all_ok": False}
    for version, spec_dir in specs.items():
        test_file = Path(tests.get(version) or _default_tests(version))
        if not test_file.is_file():
            row = {"version": version, "ok": False, "test_file": str(test_file),
                   "reasons": [f"test file {test_file} not found"]}
        else:
            row = run_release(a, version, os.path.abspath(spec_dir), test_file, a.logs)
        result["runs"].append(row)
        result["all_ok"] = all(r["ok"] for r in result["runs"])
        _write(a.out, result)
        print(f"speculators {version}: {'ok' if row['ok'] else 'NOT OK'} "
              f"{row.get('pytest_line') or ''} ({row.get('wall_s', 0)} s) "
              f"{'; '.join(row['reasons'])}", flush=True)
    result["all_ok"] = len(result["runs"]) == len(specs) and all(r["ok"] for r in result["runs"])
    _write(a.out, result)
    print(f"summary: {a.out}; all ok: {result['all_ok']}")
    return 0 if result["all_ok"] else 1


if __name__ == "__main__":
    sys.exit(main(parse()))
