"""The pipeline's last step, measured: generate hidden states with speculators' unchanged
generator through the shim, train an EAGLE-3 draft with speculators' own ``Trainer``,
serve it with vLLM's EAGLE-3 speculative decoding, and report the acceptance per draft
position and the mean acceptance length on held-out prompts. JSON to ``--out``.

Three drafts, served on the same target and the same held-out prompts (greedy):

- ``default``: trained on the shim's data (speculators' default layers
  ``[2, n//2, n-3]`` + ``n-1``), its config without ``eagle_aux_hidden_state_layer_ids``
  (what speculators 0.3/0.4 saves on its own): vLLM feeds its default ids
  ``(2, n//2, n-3)``, the outputs of layers ``1, n//2-1, n-4``;
- ``matched``: the same trained weights, the config naming the layers the data came from
  in vLLM's numbering (speculators' layer ``k`` = vLLM id ``k + 1``); the
  ``draft_aux_layers`` adapter writes this on its own, which the run checks;
- ``native``: trained the same way on vLLM's native ``extract_hidden_states`` of the same
  sequences (aux ids ``k + 1``), its config naming those ids.

The target must have a learnable greedy continuation, or acceptance says nothing: a
small Llama (``build_checkpoint``'s recipe, resized) is first trained on sequences that
follow a fixed rule (each token is a fixed random permutation of the token two places
back), so its greedy continuation follows the rule. The run reports how well it does
(the target's greedy tokens, in transformers and in vLLM, against the rule; the drafts'
top-1 accuracy on their held-out data; acceptance of the matched draft against chance).
It also compares the two data sets directly: the shim's layer ``k`` must equal vLLM's
native id ``k + 1`` (per-token cosine), and differ from native id ``k``.

Each step runs in its own process (``--phase``): the target's training, the shim's
generation and vLLM's native extraction (in parallel on a GPU), the two trainings (in
parallel), the three servings (in parallel). ``ok`` in the JSON (and the exit status)
says whether the pipeline and its checks held; ``claims`` holds the comparisons the
measurement is about (matched >= default, matched within noise of native).

Usage (device, vLLM kit installed, speculators on ``PYTHONPATH``):
    python3 tests/e2e/scripts/gpu_serve.py --out $OUT/serve.json
Usage (CPU test):
    ... --device cpu --size cpu --out /tmp/serve.json
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import random
import shutil
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]

#: Sizes: ``gpu`` fits one H200 device call of about 300 s; ``cpu`` tests the script.
SIZES = {
    "gpu": dict(hidden_size=512, intermediate_size=1408, num_hidden_layers=8,
                num_attention_heads=8, num_key_value_heads=4, head_dim=64,
                target_steps=800, target_batch=64, target_len=128, target_lr=1e-3,
                train_seqs=512, seq_len=128, prompts=64, prompt_groups=8, max_tokens=64,
                epochs=10, total_seq_len=2048, draft_lr=1e-3, gpu_mem=0.1, kv_gib=None,
                draft_compile=1, train_budget_s=None,
                max_model_len=512, prompt_min=8, prompt_max=32,
                min_rule_accuracy=0.9, min_acceptance=0.3),
    "cpu": dict(hidden_size=128, intermediate_size=256, num_hidden_layers=8,
                num_attention_heads=2, num_key_value_heads=1, head_dim=64,
                target_steps=400, target_batch=16, target_len=64, target_lr=2e-3,
                train_seqs=48, seq_len=64, prompts=8, prompt_groups=4, max_tokens=24,
                epochs=3, total_seq_len=512, draft_lr=2e-3, gpu_mem=None, kv_gib=None,
                draft_compile=1, train_budget_s=None,
                max_model_len=256, prompt_min=6, prompt_max=16,
                min_rule_accuracy=0.5, min_acceptance=0.05),
}
#: Token ids the sequences use: 256 ids past the tokenizer's special tokens (0..4); the
#: drafts' vocabulary (256) covers them exactly.
POOL_LO, POOL = 5, 256
DRAFT_VOCAB = 256
K = 3  # draft tokens per step (speculators' ttt_steps and vLLM's num_speculative_tokens)
#: Sequences whose shim and native hidden states are compared layer by layer.
MAPPING_SAMPLES = 8


# ------------------------------------------------------------------------------ sequences
def rule_table(seed: int) -> dict[int, int]:
    """The target's rule: a random permutation ``T`` of the pool; each token is ``T`` of
    the token two places back (``x[t+1] = T[x[t-1]]``). Learning it takes a previous-token
    attention head and a lookup; a draft must know the current token (from the target's
    hidden states or its own attention) as well as the next one (its embedding)."""
    ids = list(range(POOL_LO, POOL_LO + POOL))
    perm = ids[:]
    random.Random(seed).shuffle(perm)
    return dict(zip(ids, perm))


def chain(rng: random.Random, rule: dict[int, int], length: int) -> list[int]:
    """Two random tokens, then the rule."""
    seq = [POOL_LO + rng.randrange(POOL), POOL_LO + rng.randrange(POOL)]
    while len(seq) < length:
        seq.append(rule[seq[-2]])
    return seq[:length]


def rule_accuracy(rule: dict[int, int], prompts: list[list[int]],
                  outputs: list[list[int]]) -> float:
    """Share of generated tokens that follow the rule (each checked against the rule's
    token, the continuation kept on the rule)."""
    hit = total = 0
    for p, out in zip(prompts, outputs):
        seq = list(p)
        for tok in out:
            want = rule.get(seq[-2])
            hit += int(tok == want)
            total += 1
            seq.append(want)
    return hit / max(total, 1)


def load_rule(work: Path) -> dict[int, int]:
    return {int(k): v for k, v in json.loads((work / "rule.json").read_text()).items()}


# ----------------------------------------------------------------------------- the phases
def phase_target(a, work: Path, s: dict) -> dict:
    """Build the target and train it on the rule's sequences; check its greedy continuation."""
    import torch
    from transformers import AutoModelForCausalLM

    from speculators_compat.demo.checkpoints import STAMP_NAME, build_checkpoint

    device = torch.device(a.device)
    shape = {k: s[k] for k in ("hidden_size", "intermediate_size", "num_hidden_layers",
                               "num_attention_heads", "num_key_value_heads", "head_dim")}
    path = build_checkpoint("llama", work / "target", seed=a.seed, **shape)
    torch.manual_seed(a.seed)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=s["target_lr"], betas=(0.9, 0.98),
                            weight_decay=0.0)
    steps, warm = s["target_steps"], max(1, s["target_steps"] // 16)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda i: min(1.0, (i + 1) / warm) * (
        0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(i, steps) / steps))))
    rng = random.Random(a.seed + 1)
    rule = load_rule(work)
    losses = []
    t0 = time.perf_counter()
    model.train()
    for _ in range(steps):
        batch = torch.tensor([chain(rng, rule, s["target_len"])
                              for _ in range(s["target_batch"])], device=device)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
            loss = model(input_ids=batch, labels=batch).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        losses.append(float(loss.detach()))
    seconds = time.perf_counter() - t0
    model.eval()
    prompts = json.loads((work / "prompts.json").read_text())[:16]
    outs = []
    with torch.no_grad():
        for p in prompts:
            ids = torch.tensor([p], device=device)
            for _ in range(16):
                nxt = model(input_ids=ids).logits[0, -1].argmax()
                ids = torch.cat([ids, nxt.view(1, 1)], dim=1)
            outs.append(ids[0, len(p):].tolist())
    model.to(torch.bfloat16).save_pretrained(path)
    (Path(path) / STAMP_NAME).unlink(missing_ok=True)  # trained: no longer the recipe's build
    tenth = max(1, steps // 10)
    return {"path": str(path), "num_hidden_layers": s["num_hidden_layers"], "steps": steps,
            "loss_first_tenth": sum(losses[:tenth]) / tenth,
            "loss_last_tenth": sum(losses[-tenth:]) / tenth, "train_seconds": round(seconds, 1),
            "rule_accuracy_transformers": rule_accuracy(rule, prompts, outs)}


def save_sample(path: Path, ids: list[int], hidden: list) -> None:
    import torch

    torch.save({"input_ids": torch.tensor(ids, dtype=torch.long),
                "hidden_states": [h.contiguous().cpu() for h in hidden],
                "loss_mask": torch.ones(len(ids), dtype=torch.long)}, path)


def phase_generate(a, work: Path, s: dict) -> dict:
    """speculators' unchanged generator through the shim, its default layers."""
    import speculators_compat

    report = speculators_compat.activate()
    from speculators.data_generation.vllm_hidden_states_generator import (
        VllmHiddenStatesGenerator,
    )

    seqs = json.loads((work / "train_seqs.json").read_text())
    out = work / "data-shim"
    out.mkdir(exist_ok=True)
    kwargs = {} if s["gpu_mem"] is None else {"gpu_memory_utilization": s["gpu_mem"]}
    t0 = time.perf_counter()
    gen = VllmHiddenStatesGenerator(model_path=str(work / "target"), layer_ids=None,
                                    max_model_len=s["max_model_len"], tensor_parallel_size=1,
                                    **kwargs)
    layers = list(gen.layer_ids)
    index = 0
    for start in range(0, len(seqs), 32):
        batch = seqs[start:start + 32]
        results = gen.generate(batch)
        if [list(map(int, r["input_ids"])) for r in results] != batch:
            raise SystemExit("the generator returned other sequences than it was given")
        for r in results:
            save_sample(out / f"data_{index}.pt", batch[index - start], r["hidden_states"])
            index += 1
    return {"layer_ids": layers, "samples": index, "seconds": round(time.perf_counter() - t0, 1),
            "report": report.summary_line(),
            "draft_aux_layers": report["draft_aux_layers"].status.value}


def engine_memory(kw: dict, s: dict) -> None:
    """The memory settings of this script's own ``LLM`` engines. ``kv_gib`` sets vLLM's
    ``kv_cache_memory_bytes``: the KV cache is then not sized by profiling, whose check
    fails when other processes on the same GPU free memory meanwhile (one device call
    runs several checks side by side)."""
    if s["gpu_mem"] is not None:
        kw["gpu_memory_utilization"] = s["gpu_mem"]
    if s.get("kv_gib") is not None:
        kw["kv_cache_memory_bytes"] = int(float(s["kv_gib"]) * 2**30)


def phase_native(a, work: Path, s: dict) -> dict:
    """vLLM's native extract_hidden_states of the same sequences: the draft's training
    data at ids ``layer + 1``; for the first sequences also vLLM's default ids (what it
    feeds a draft whose config names none), to compare with the shim's data."""
    sys.path.insert(0, str(ROOT / "benchmarks" / "gpu"))
    import gpu_bench
    import torch

    seqs = json.loads((work / "train_seqs.json").read_text())
    layers = json.loads(a.layers)
    n = s["num_hidden_layers"]
    want = [k + 1 for k in layers]
    aux = sorted({*want, 2, n // 2, n - 3})
    out, mapping = work / "data-native", work / "native-mapping"
    out.mkdir(exist_ok=True)
    mapping.mkdir(exist_ok=True)
    kw = dict(model=str(work / "target"), enforce_eager=True, enable_prefix_caching=False,
              enable_chunked_prefill=False, max_model_len=s["max_model_len"],
              dtype="bfloat16", seed=0)
    engine_memory(kw, s)
    t0 = time.perf_counter()
    llm, connector = gpu_bench.native_llm(kw, aux, work / "native-store")
    index = 0
    for start in range(0, len(seqs), 32):
        batch = seqs[start:start + 32]
        for ids, hs in zip(batch, gpu_bench.native_extract(llm, batch, len(aux))):
            save_sample(out / f"data_{index}.pt", ids, [hs[:, aux.index(k), :] for k in want])
            if index < MAPPING_SAMPLES:
                torch.save({k: hs[:, j, :].contiguous().cpu() for j, k in enumerate(aux)},
                           mapping / f"data_{index}.pt")
            index += 1
    return {"aux_layer_ids": want, "extracted_ids": aux, "samples": index,
            "connector": connector, "seconds": round(time.perf_counter() - t0, 1)}


class BudgetSpent(Exception):
    """Raised after a saved epoch when the next one would not end within the budget."""


def budgeted(trainer_cls, budget_s: float | None, epochs: int, clock=time.perf_counter):
    """speculators' ``Trainer`` that stops after a saved epoch once another epoch (at the
    mean pace so far) would end past ``budget_s``: a step that must fit one device call
    then serves the last whole epoch instead of being killed with nothing saved. The
    class records the epochs saved in ``saved``; its clock starts when it is made (the
    trainer's own set-up counts towards the pace: the estimate errs towards stopping)."""

    class Budgeted(trainer_cls):
        def save_checkpoint(self, epoch):
            super().save_checkpoint(epoch)
            Budgeted.saved.append(epoch)
            spent = clock() - Budgeted.t0
            pace = spent / len(Budgeted.saved)
            if budget_s is not None and epoch < epochs - 1 and spent + pace > budget_s:
                raise BudgetSpent(epoch)

    Budgeted.saved = []
    Budgeted.t0 = clock()
    return Budgeted


def phase_train(a, work: Path, s: dict) -> dict:
    """speculators' Trainer, as tests/e2e/scripts/gpu_train.py drives it."""
    import speculators_compat

    speculators_compat.activate()
    sys.path.insert(0, str(HERE))
    import gpu_train
    import torch
    import train_draft
    from speculators.models.eagle3 import Eagle3DraftModel, Eagle3SpeculatorConfig
    from speculators.train.data import list_files
    from speculators.train.trainer import Trainer, TrainerConfig
    from speculators.train.vocab_mapping import build_vocab_mappings_from_distribution
    from transformers import AutoConfig

    device = torch.device(a.device)
    torch.manual_seed(a.seed)
    data = work / a.data
    files = sorted(map(str, list_files(str(data))), key=lambda f: int(Path(f).stem[5:]))
    n_val = max(2, len(files) // 10)
    train_files, val_files = files[:-n_val], files[-n_val:]
    freq: Counter = Counter()
    for f in files:
        freq.update(int(t) for t in torch.load(f, weights_only=True)["input_ids"])
    target = str(work / "target")
    vocab = AutoConfig.from_pretrained(target).vocab_size
    d2t, t2d = build_vocab_mappings_from_distribution(dict(freq), DRAFT_VOCAB, vocab)
    config = train_draft.draft_config(target, DRAFT_VOCAB, K)
    if a.aux_ids:
        config.eagle_aux_hidden_state_layer_ids = json.loads(a.aux_ids)
    model = Eagle3DraftModel(config, t2d=t2d, d2t=d2t)
    # flex attention has no CPU backward in torch; without compile (draft_compile=0) its
    # eager path is left out too: the same attention, its mask evaluated densely
    if device.type == "cpu" or not s["draft_compile"]:
        train_draft.set_attention(model, train_draft.DENSE)
    model.to(device)
    records = gpu_train.MetricRecords()
    logging.getLogger("speculators.metrics").addHandler(records)
    logging.getLogger("speculators.metrics").setLevel(logging.INFO)
    kwargs = {"use_off_policy_tokens": False, "ttt_steps": K, "ttt_step_loss_decay": 1.0}
    save = work / f"ckpt-{a.data}"
    t0 = time.perf_counter()
    trainer_cls = budgeted(Trainer, s["train_budget_s"], s["epochs"])
    try:
        trainer_cls(model, TrainerConfig(
            lr=s["draft_lr"], num_epochs=s["epochs"], save_path=str(save),
            local_rank=0 if device.type == "cuda" else str(device), train_call_kwargs=kwargs,
            val_call_kwargs=kwargs, scheduler_type="cosine"),
            gpu_train.loader(train_files, s["total_seq_len"], a.seed),
            gpu_train.loader(val_files, s["total_seq_len"], None)).run_training()
    except BudgetSpent:
        pass
    final = save / str(trainer_cls.saved[-1])
    saved = json.loads((final / "config.json").read_text())
    val = [r["val"] for r in records.records if "val" in r]
    losses = [r["train"]["loss"] for r in records.records if "train" in r]
    reloaded = Eagle3SpeculatorConfig.from_pretrained(final)
    return {"checkpoint": str(final), "files": len(files), "steps": len(losses),
            "epochs_done": len(trainer_cls.saved), "epochs_planned": s["epochs"],
            "loss_first": losses[0] if losses else None,
            "loss_last": losses[-1] if losses else None,
            "val_full_acc": [val[-1].get(f"full_acc_{i}_epoch") for i in range(K)]
            if val else None,
            "saved_aux_layer_ids": saved.get("eagle_aux_hidden_state_layer_ids"),
            "reloaded_aux_layer_ids": reloaded.eagle_aux_hidden_state_layer_ids,
            "seconds": round(time.perf_counter() - t0, 1)}


def _aux_layers_in_use(worker) -> list | None:
    """Runs in each vLLM worker: the target's auxiliary layer ids vLLM set."""
    model = getattr(getattr(worker, "model_runner", None), "model", None)
    for holder in (model, getattr(model, "model", None),
                   getattr(getattr(model, "language_model", None), "model", None)):
        layers = getattr(holder, "aux_hidden_state_layers", None)
        if layers:
            return sorted(int(k) for k in layers)
    return None


def spec_counts(llm) -> dict:
    """vLLM's cumulative speculative-decoding counters (``LLM.get_metrics``)."""
    c = {"drafts": 0, "draft_tokens": 0, "accepted": 0, "per_pos": [0] * K}
    for m in llm.get_metrics():
        if m.name == "vllm:spec_decode_num_drafts":
            c["drafts"] += m.value
        elif m.name == "vllm:spec_decode_num_draft_tokens":
            c["draft_tokens"] += m.value
        elif m.name == "vllm:spec_decode_num_accepted_tokens":
            c["accepted"] += m.value
        elif m.name == "vllm:spec_decode_num_accepted_tokens_per_pos":
            for i, v in enumerate(m.values[:K]):
                c["per_pos"][i] += v
    return c


def summarize(c: dict) -> dict:
    d = max(c["drafts"], 1)
    return {"drafts": c["drafts"], "draft_tokens": c["draft_tokens"], "accepted": c["accepted"],
            "acceptance_per_pos": [v / d for v in c["per_pos"]],
            "acceptance_rate": c["accepted"] / max(c["draft_tokens"], 1),
            "mean_acceptance_length": 1 + c["accepted"] / d}


def phase_serve(a, work: Path, s: dict) -> dict:
    """vLLM's EAGLE-3 speculative decoding of the held-out prompts, greedy."""
    from vllm import LLM, SamplingParams

    prompts = json.loads((work / "prompts.json").read_text())
    kw = dict(model=str(work / "target"), max_model_len=s["max_model_len"], enforce_eager=True,
              dtype="bfloat16", seed=0, disable_log_stats=False,
              speculative_config={"model": str(work / a.draft), "method": "eagle3",
                                  "num_speculative_tokens": K})
    engine_memory(kw, s)
    # a function sent to the workers (which auxiliary layers they were set to) is pickled
    os.environ.setdefault("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")
    t0 = time.perf_counter()
    llm = LLM(**kw)
    startup = time.perf_counter() - t0
    try:
        used = llm.collective_rpc(_aux_layers_in_use)
    except Exception as exc:  # noqa: BLE001 - informational: the metrics still count
        used = [f"{type(exc).__name__}: {exc}"]
    sp = SamplingParams(max_tokens=s["max_tokens"], temperature=0.0, ignore_eos=True)
    groups, outputs = [], []
    g = s["prompt_groups"]
    size = math.ceil(len(prompts) / g)
    t0 = time.perf_counter()
    for i in range(0, len(prompts), size):
        before = spec_counts(llm)
        outs = llm.generate([{"prompt_token_ids": p} for p in prompts[i:i + size]], sp,
                            use_tqdm=False)
        after = spec_counts(llm)
        delta = {k: (after[k] - before[k]) if k != "per_pos" else
                 [x - y for x, y in zip(after[k], before[k])] for k in after}
        groups.append(summarize(delta))
        outputs += [list(o.outputs[0].token_ids) for o in outs]
    total = summarize(spec_counts(llm))
    return {**total, "groups": [x["mean_acceptance_length"] for x in groups],
            "aux_layers_in_use": used, "outputs": outputs,
            "rule_accuracy_vllm": rule_accuracy(load_rule(work), prompts, outputs),
            "startup_seconds": round(startup, 1),
            "generate_seconds": round(time.perf_counter() - t0, 1)}


PHASES = {"target": phase_target, "generate": phase_generate, "native": phase_native,
          "train": phase_train, "serve": phase_serve}


# --------------------------------------------------------------------------- orchestration
def absolute_path_list(value: str) -> str:
    """``PYTHONPATH`` with its relative entries made absolute: each phase runs in the
    work folder, where ``src`` or ``.envs/speculators-…`` would name nothing (the phase
    would then import an installed copy, or fail to import speculators)."""
    return os.pathsep.join(str(Path(p).resolve()) if p else p
                           for p in value.split(os.pathsep)) if value else value


def run_phases(a, work: Path, jobs: list[tuple[str, list[str], dict]], parallel: bool) -> dict:
    """Run ``(label, extra args, extra env)`` phases as child processes; their results."""
    logs = work / "logs"
    logs.mkdir(exist_ok=True)

    def start(label, extra, env_extra):
        env = dict(os.environ, **env_extra)
        env.pop("SPECULATORS_COMPAT_ACTIVE", None)
        env["PYTHONPATH"] = absolute_path_list(env.get("PYTHONPATH", ""))
        cmd = [sys.executable, str(Path(__file__).resolve()), "--work", str(work),
               "--device", a.device, "--size", a.size, "--seed", str(a.seed),
               *(f"--set={x}" for x in a.set), *extra,
               "--result", str(work / f"{label}.json")]
        log = open(logs / f"{label}.log", "w")  # noqa: SIM115 - closed below
        return label, subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env,
                                       cwd=str(work), start_new_session=True), log

    results, running = {}, []
    for job in jobs:
        done = work / f"{job[0]}.json"
        if a.reuse and done.exists():  # written only by a phase that succeeded
            results[job[0]] = {**json.loads(done.read_text()), "rc": 0, "reused": True}
            continue
        running.append(start(*job))
        if not parallel:
            _finish(running.pop(), work, a.phase_timeout, results)
    for r in running:
        _finish(r, work, a.phase_timeout, results)
    return results


def _finish(item, work: Path, timeout: float, results: dict) -> None:
    label, proc, log = item
    try:
        rc = proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, 9)
        rc = proc.wait()
    log.close()
    path = work / f"{label}.json"
    res = json.loads(path.read_text()) if rc == 0 and path.exists() else {}
    res["rc"] = rc
    if rc != 0:
        res["log_tail"] = (work / "logs" / f"{label}.log").read_text(errors="replace")[-4000:]
    results[label] = res


def hidden_mapping(work: Path, layers: list[int], n: int) -> dict:
    """The shim's data against vLLM's native capture of the same tokens: its layer ``k``
    must equal native id ``k + 1``; native id ``k`` (vLLM's default feed for the draft's
    inputs ``k``) is the layer below."""
    import torch

    def cos(x, y) -> float:
        return float(torch.nn.functional.cosine_similarity(x.float(), y.float(), dim=-1).min())

    same = [1.0] * len(layers)
    below = [1.0] * (len(layers) - 1)
    for i in range(MAPPING_SAMPLES):
        shim = torch.load(work / "data-shim" / f"data_{i}.pt", weights_only=True)
        native = torch.load(work / "native-mapping" / f"data_{i}.pt", weights_only=True)
        for j, k in enumerate(layers):
            same[j] = min(same[j], cos(shim["hidden_states"][j], native[k + 1]))
            if j < len(layers) - 1:
                below[j] = min(below[j], cos(shim["hidden_states"][j], native[k]))
    return {"shim_layers": layers, "samples": MAPPING_SAMPLES,
            "min_cosine_layer_k_vs_native_k_plus_1": same,
            "min_cosine_layer_k_vs_native_k": below,
            "native_k_is_vllm_default": list(layers[:-1]) == [2, n // 2, n - 3]}


def _no_cudnn_attention() -> None:
    """PyTorch's scaled-dot-product attention without its cuDNN backend: on the GPU kit
    (torch 2.14 built against cuDNN 9.24, the image's cuDNN 9.19) the target's training
    failed in its backward with ``cuDNN Frontend error ... CUDNN_STATUS_BAD_PARAM``
    (H200, 2026-12-03); the flash and memory-efficient backends remain."""
    import torch

    torch.backends.cuda.enable_cudnn_sdp(False)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default=None)
    p.add_argument("--workdir", default=None)
    p.add_argument("--device", default="cuda")
    p.add_argument("--size", default="gpu", choices=sorted(SIZES))
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--sequential", action="store_true", help="one phase at a time")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override one of the size's settings, e.g. --set epochs=6")
    p.add_argument("--phase-timeout", type=float, default=900,
                   help="seconds one step may take before it is killed")
    p.add_argument("--min-acceptance", type=float, default=None,
                   help="the matched draft's acceptance at position 1 must reach this "
                        "(default: the size's; chance is 1/256)")
    p.add_argument("--min-rule-accuracy", type=float, default=None,
                   help="the share of the target's greedy tokens in vLLM that follow the rule "
                        "(default: the size's)")
    p.add_argument("--until", choices=["target", "data", "train"], default=None,
                   help="stop after this step (the JSON holds what ran)")
    p.add_argument("--reuse", action="store_true",
                   help="with --workdir: keep the results of steps that succeeded there")
    # a phase (internal)
    p.add_argument("--phase", choices=sorted(PHASES))
    p.add_argument("--work")
    p.add_argument("--result")
    p.add_argument("--data")
    p.add_argument("--draft")
    p.add_argument("--layers")
    p.add_argument("--aux-ids")
    a = p.parse_args(argv)
    s = dict(SIZES[a.size])
    for item in a.set:
        key, _, value = item.partition("=")
        if key not in s:
            p.error(f"--set {key}: not a setting ({', '.join(sorted(s))})")
        s[key] = type(s[key])(value) if s[key] is not None else float(value)
    if a.phase:
        if a.device == "cuda":
            _no_cudnn_attention()
        res = PHASES[a.phase](a, Path(a.work), s)
        Path(a.result).write_text(json.dumps(res, indent=2) + "\n")
        return 0
    if not a.out:
        p.error("--out is required")
    t_start = time.perf_counter()
    work = Path(a.workdir) if a.workdir else Path(__import__("tempfile").mkdtemp(
        prefix="gpu_serve_"))
    work.mkdir(parents=True, exist_ok=True)
    parallel = not a.sequential and a.device != "cpu"
    rule = rule_table(a.seed)
    rng = random.Random(a.seed)
    seqs = [chain(rng, rule, s["seq_len"]) for _ in range(s["train_seqs"])]
    prompts = [chain(rng, rule, rng.randint(s["prompt_min"], s["prompt_max"]))
               for _ in range(s["prompts"])]
    (work / "rule.json").write_text(json.dumps(rule))
    (work / "train_seqs.json").write_text(json.dumps(seqs))
    (work / "prompts.json").write_text(json.dumps(prompts))
    from speculators_compat import _check_draft, _draft_layers, _versions

    n = s["num_hidden_layers"]
    spec_layers = list(_draft_layers.speculators_default(n))
    result: dict = {"device": a.device, "size": a.size, "sizes": s, "work": str(work),
                    "versions": {m: _versions.installed(m) for m in
                                 ("vllm", "speculators", "torch", "transformers")},
                    "layers": {"num_hidden_layers": n, "speculators_default": spec_layers,
                               "vllm_default_ids": list(_draft_layers.vllm_default(n)),
                               "matched_ids": list(_draft_layers.vllm_ids(spec_layers[:-1]))},
                    "chance_acceptance": 1 / POOL}
    phases: dict = {}
    result["phases"] = phases

    def save() -> None:  # after every step: a run stopped from outside leaves what it did
        result["seconds"] = round(time.perf_counter() - t_start, 1)
        Path(a.out).parent.mkdir(parents=True, exist_ok=True)
        Path(a.out).write_text(json.dumps(result, indent=2) + "\n")

    def done() -> int:
        save()
        brief = {k: result.get(k) for k in ("ok", "failed", "serving_summary", "claims",
                                            "learnability", "seconds")}
        print(json.dumps(brief, indent=1))
        return 0 if result.get("ok") else 1

    phases.update(run_phases(a, work, [("target", ["--phase", "target"], {})], parallel))
    save()
    if phases["target"]["rc"] != 0:
        result.update(ok=False, failed="target")
        return done()
    if a.until == "target":
        result.update(ok=True, stopped_after="target")
        return done()
    data_env = {"SPECULATORS_COMPAT_REPORT_FILE": str(work / "data-shim" / "compat-report.json")}
    phases.update(run_phases(a, work, [
        ("generate", ["--phase", "generate"], data_env),
        ("native", ["--phase", "native", "--layers", json.dumps(spec_layers)], {})], parallel))
    save()
    if phases["generate"]["rc"] != 0:
        result.update(ok=False, failed="generate")
        return done()
    # vLLM's native path is the reference row; without it the shim's drafts still run
    native = phases["native"]["rc"] == 0
    if native:
        result["hidden_mapping"] = hidden_mapping(work, spec_layers, n)
    if a.until == "data":
        result.update(ok=native, stopped_after="data")
        return done()
    matched = result["layers"]["matched_ids"]
    # speculators compiles the draft's forward on CUDA (torch.compile); draft_compile=0
    # trains it eagerly (a kit whose Triton is not the one its torch was built for)
    train_env = {} if s["draft_compile"] else {"TORCHDYNAMO_DISABLE": "1"}
    phases.update(run_phases(a, work, [
        ("train-shim", ["--phase", "train", "--data", "data-shim"], train_env),
        *([("train-native", ["--phase", "train", "--data", "data-native",
                             "--aux-ids", json.dumps(matched)], train_env)] if native else [])],
        parallel))
    save()
    if phases["train-shim"]["rc"] != 0:
        result.update(ok=False, failed="train-shim")
        return done()
    native = native and phases["train-native"]["rc"] == 0
    if a.until == "train":
        result.update(ok=native, stopped_after="train")
        return done()
    drafts = make_drafts(work, phases, native)
    result["check_draft"] = {
        name: {k: v for k, v in _check_draft.check(
            str(path), str(work / ("data-native" if name == "native" else "data-shim")),
            str(work / "target")).items() if k in ("status", "exit", "vllm_feeds", "expected")}
        for name, path in drafts.items()}
    phases.update(run_phases(a, work, [
        (f"serve-{name}", ["--phase", "serve", "--draft", str(path)], {})
        for name, path in drafts.items()], parallel))
    serving = {name: phases[f"serve-{name}"] for name in drafts
               if phases[f"serve-{name}"]["rc"] == 0}
    if not {"matched", "default"} <= set(serving):
        result.update(ok=False, failed=f"serve {sorted(set(drafts) - set(serving))}")
        return done()
    evaluate(result, phases, serving, s, a)
    return done()


def make_drafts(work: Path, phases: dict, native: bool) -> dict[str, Path]:
    """The drafts served: the shim-trained checkpoint as saved (the adapter named its
    layers), the same without them (what speculators saves on its own), the native one."""
    from speculators_compat._draft_layers import FIELD

    shim_ckpt = Path(phases["train-shim"]["checkpoint"])
    drafts = {"matched": work / "draft-matched", "default": work / "draft-default"}
    for path in drafts.values():
        shutil.copytree(shim_ckpt, path, dirs_exist_ok=True)
    cfg = json.loads((drafts["default"] / "config.json").read_text())
    cfg[FIELD] = None
    (drafts["default"] / "config.json").write_text(json.dumps(cfg, indent=2))
    if native:
        drafts["native"] = Path(phases["train-native"]["checkpoint"])
    return drafts


def evaluate(result: dict, phases: dict, serving: dict, s: dict, a) -> None:
    """Acceptance, the comparisons between drafts, learnability, and the run's checks."""
    result["serving_summary"] = {
        name: {"acceptance_per_pos": [round(x, 4) for x in r["acceptance_per_pos"]],
               "mean_acceptance_length": round(r["mean_acceptance_length"], 4),
               "aux_layers_in_use": r["aux_layers_in_use"],
               "rule_accuracy_vllm": round(r["rule_accuracy_vllm"], 4)}
        for name, r in serving.items()}
    groups = {name: r["groups"] for name, r in serving.items()}
    cmp_ = {"matched_minus_default": paired(groups["matched"], groups["default"])}
    if "native" in groups:
        cmp_["matched_minus_native"] = paired(groups["matched"], groups["native"])
    result["comparison"] = cmp_
    outs = [r["outputs"] for r in serving.values()]
    agree = sum(len({tuple(o) for o in same}) == 1 for same in zip(*outs))
    tgt = phases["target"]
    matched = result["layers"]["matched_ids"]
    result["learnability"] = {
        "target_loss_first_last_tenth": [tgt["loss_first_tenth"], tgt["loss_last_tenth"]],
        "target_rule_accuracy_transformers": tgt["rule_accuracy_transformers"],
        "target_rule_accuracy_vllm": min(r["rule_accuracy_vllm"] for r in serving.values()),
        "draft_val_top1_by_position": {k: phases[f"train-{k}"].get("val_full_acc")
                                       for k in ("shim", "native") if f"train-{k}" in phases},
        "matched_acceptance_pos1_vs_chance": [serving["matched"]["acceptance_per_pos"][0],
                                              1 / POOL],
        "outputs_identical_across_drafts": f"{agree}/{len(outs[0])}"}
    claims = {"matched_ge_default": cmp_["matched_minus_default"]["mean"]
              >= -2 * cmp_["matched_minus_default"]["se"]}
    if "matched_minus_native" in cmp_:
        claims["matched_within_noise_of_native"] = abs(cmp_["matched_minus_native"]["mean"]) \
            <= max(2 * cmp_["matched_minus_native"]["se"], 0.02)
    result["claims"] = claims
    min_rule = a.min_rule_accuracy if a.min_rule_accuracy is not None else s["min_rule_accuracy"]
    min_acc = a.min_acceptance if a.min_acceptance is not None else s["min_acceptance"]
    hm = (result.get("hidden_mapping") or {}).get("min_cosine_layer_k_vs_native_k_plus_1")
    checks = {
        "generator_default_layers": phases["generate"]["layer_ids"]
        == result["layers"]["speculators_default"],
        "adapter_applied": phases["generate"]["draft_aux_layers"] == "applied",
        "adapter_named_the_layers": phases["train-shim"]["saved_aux_layer_ids"] == matched,
        "native_ran": "native" in serving,
        "native_draft_names_its_ids": phases.get("train-native", {}).get(
            "saved_aux_layer_ids") == matched,
        "layer_k_equals_native_k_plus_1": bool(hm) and min(hm) >= 0.99,
        "vllm_fed_default_ids": fed(serving["default"], result["layers"]["vllm_default_ids"]),
        "vllm_fed_matched_ids": fed(serving["matched"], matched),
        "check_draft": (result["check_draft"]["matched"]["status"] == "match"
                        and result["check_draft"]["default"]["status"] == "mismatch"),
        "target_learned": result["learnability"]["target_rule_accuracy_vllm"] >= min_rule,
        "matched_above_chance": serving["matched"]["acceptance_per_pos"][0] >= min_acc,
    }
    result["checks"] = checks
    result["ok"] = all(checks.values())
    if not result["ok"]:
        result["failed"] = [k for k, v in checks.items() if not v]


def fed(serve: dict, ids: list[int]) -> bool:
    """vLLM's workers hold ``ids`` as the target's auxiliary layers (true where the
    installed vLLM keeps them where this script cannot find them: not a failure)."""
    used = [u for u in serve.get("aux_layers_in_use") or [] if isinstance(u, list)]
    return all(u == sorted(set(ids)) for u in used)


def paired(x: list[float], y: list[float]) -> dict:
    """Mean and standard error of the per-group differences (same prompts in each group)."""
    d = [a - b for a, b in zip(x, y)]
    mean = sum(d) / len(d)
    var = sum((v - mean) ** 2 for v in d) / max(len(d) - 1, 1)
    return {"mean": mean, "se": math.sqrt(var / len(d)), "groups": len(d)}


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    sys.exit(main())
