"""Generate, then train, in one environment: speculators' unchanged generator
writes hidden-state samples through the shim, speculators' own ``Trainer`` trains an
EAGLE-3 draft on them, the trained checkpoint reloads identically; JSON to ``--out``.

Made for the lent GPU machine (vLLM from the project's GPU kit, transformers 5, one
speculators release on ``PYTHONPATH``, this checkout's ``src`` first on ``PYTHONPATH``);
runs on CPU with tiny settings too, which is how it is tested (``--device cpu``).

Steps, all in this process tree:
1. a small Llama checkpoint (``speculators_compat.demo.checkpoints.build_checkpoint``);
2. ``--samples`` random token sequences through speculators' ``VllmHiddenStatesGenerator``
   (4 layers: 3 auxiliary + the last), one ``data_<i>.pt`` per sample as speculators'
   offline script saves them; token frequencies -> speculators' vocab mapping;
3. speculators' ``Trainer`` (``TrainerConfig``, its checkpointer, its metric logger:
   the per-step losses are read from the ``speculators.metrics`` records) over
   ``Eagle3SampleFileDataset`` + ``MultipackDistributedBatchSamplerV2`` +
   ``create_collate_fn``, as speculators' scripts/train.py builds them;
4. the loss must go down (mean of the last tenth of the steps below the first tenth, and
   the held-out loss of the final model below that of the initial one), and the last
   epoch's checkpoint must reload (config ``from_pretrained`` + speculators'
   ``load_safetensors_state_dict``): the file holds exactly the trained weights in
   bfloat16 (the checkpointer's dtype), the reloaded model equals the trained one rounded
   so, bit for bit, with an identical forward.

On CPU the draft's attention runs through ``train_draft.dense_flex_attention`` (torch's
FlexAttention has no CPU backward) and ``Trainer``'s device is ``"cpu"`` (its
``local_rank`` is only used as a device).

Usage (device): PYTHONPATH=<checkout>/src:/root/spec-0.4.0.1 python \\
    tests/e2e/scripts/gpu_train.py --out $OUT/train.json [--epochs 6 --samples 256]
Usage (CPU test): ... --device cpu --samples 12 --epochs 2 --total-seq-len 256
"""

from __future__ import annotations

import speculators_compat

speculators_compat.activate()

# ruff: noqa: E402  (speculators after activate())
import argparse
import json
import logging
import math
import os
import random
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import train_draft  # noqa: E402  (same folder: config, attention switch, comparisons)
from speculators.data_generation.vllm_hidden_states_generator import VllmHiddenStatesGenerator
from speculators.models.eagle3 import Eagle3DraftModel, Eagle3SpeculatorConfig
from speculators.train.checkpointer import convert_float_dtype, load_safetensors_state_dict
from speculators.train.data import Eagle3SampleFileDataset, create_collate_fn, split_files
from speculators.train.distributed_batch_sampler import MultipackDistributedBatchSamplerV2
from speculators.train.trainer import Trainer, TrainerConfig
from speculators.train.vocab_mapping import build_vocab_mappings_from_distribution
from torch.utils.data import DataLoader

from speculators_compat.demo.checkpoints import build_checkpoint

LAYERS = [0, 2, 4, 5]  # the tiny Llama has 6 layers


class MetricRecords(logging.Handler):
    """Collects the dicts speculators' Trainer logs to ``speculators.metrics``."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.records: list[dict] = []

    def emit(self, record: logging.LogRecord) -> None:
        if isinstance(record.msg, dict):
            self.records.append(record.msg)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True)
    p.add_argument("--workdir", default=None)
    p.add_argument("--device", default="cuda")
    p.add_argument("--samples", type=int, default=256)
    p.add_argument("--min-len", type=int, default=48)
    p.add_argument("--max-len", type=int, default=160)
    p.add_argument("--total-seq-len", type=int, default=640)
    p.add_argument("--epochs", type=int, default=6)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--ttt-steps", type=int, default=3)
    p.add_argument("--draft-vocab-size", type=int, default=256)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--gpu-mem", type=float, default=0.8,
                   help="the generator's gpu_memory_utilization (speculators' default 0.8); "
                        "smaller when other runs share the GPU")
    return p.parse_args(argv)


def generate(model: str, out: Path, args) -> dict:
    rng = random.Random(args.seed)
    from transformers import AutoConfig

    vocab = AutoConfig.from_pretrained(model).vocab_size
    seqs = [[rng.randrange(5, vocab) for _ in range(rng.randint(args.min_len, args.max_len))]
            for _ in range(args.samples)]
    t0 = time.perf_counter()
    gen = VllmHiddenStatesGenerator(model_path=model, layer_ids=LAYERS,
                                    max_model_len=args.max_len + 8, tensor_parallel_size=1,
                                    gpu_memory_utilization=args.gpu_mem)
    results = []
    for start in range(0, len(seqs), 64):
        batch = seqs[start:start + 64]
        got = gen.generate(batch)
        if len(got) != len(batch):
            raise SystemExit(f"{len(got)} results for {len(batch)} sequences")
        results.extend(got)
    seconds = time.perf_counter() - t0
    del gen
    out.mkdir(parents=True, exist_ok=True)
    freq: Counter = Counter()
    for i, r in enumerate(results):
        ids = [int(t) for t in r["input_ids"]]
        if len(r["hidden_states"]) != len(LAYERS):
            raise SystemExit(f"sample {i}: {len(r['hidden_states'])} layers, want {len(LAYERS)}")
        freq.update(ids)
        torch.save({"input_ids": torch.as_tensor(ids),
                    "hidden_states": [h.contiguous().cpu() for h in r["hidden_states"]],
                    "loss_mask": torch.ones(len(ids), dtype=torch.long)}, out / f"data_{i}.pt")
    matched = sum(tuple(int(t) for t in r["input_ids"]) == tuple(s)
                  for r, s in zip(results, seqs))
    return {"samples": len(results), "inputs_returned_in_order": matched,
            "generate_seconds": round(seconds, 2), "token_freq": dict(freq), "vocab": vocab}


def loader(files, total_len: int, shuffle_seed: int | None) -> DataLoader:
    dataset = Eagle3SampleFileDataset(file_list=files, max_len=total_len)
    sampler = MultipackDistributedBatchSamplerV2(
        batch_max_length=total_len, lengths=dataset.approx_lengths, num_replicas=1, rank=0,
        seed=shuffle_seed or 0)
    return DataLoader(dataset, batch_sampler=sampler, collate_fn=create_collate_fn(total_len))


def held_out_loss(model, files, total_len, ttt_steps, device) -> float:
    model.eval()
    losses = []
    with torch.no_grad():
        for batch in loader(files, total_len, None):
            _t, loss = train_draft.forward(model, train_draft.to_device(batch, device), ttt_steps)
            losses.append(float(loss))
    return sum(losses) / max(len(losses), 1)


def main(argv=None) -> dict:
    args = parse_args(argv)
    t_start = time.perf_counter()
    work = Path(args.workdir or tempfile.mkdtemp(prefix="gpu_train_"))
    device = torch.device(args.device)
    torch.manual_seed(args.seed)
    result: dict = {"device": str(device), "argv": sys.argv[1:],
                    "report": speculators_compat.report().summary_line()}
    model_dir = str(build_checkpoint("llama", work / "ckpt"))
    gen = generate(model_dir, work / "data", args)
    freq = gen.pop("token_freq")
    result["generation"] = gen

    config = train_draft.draft_config(model_dir, args.draft_vocab_size, args.ttt_steps)
    d2t, t2d = build_vocab_mappings_from_distribution(freq, args.draft_vocab_size, gen["vocab"])
    model = Eagle3DraftModel(config, t2d=t2d, d2t=d2t)
    if device.type == "cpu":
        train_draft.set_attention(model, train_draft.DENSE)
    train_files, val_files = split_files(str(work / "data"), ratio=0.9)
    if len(train_files) + len(val_files) != gen["samples"] or not val_files:
        raise SystemExit(f"split {len(train_files)}+{len(val_files)} of {gen['samples']}")
    model.to(device)
    initial_val = held_out_loss(model, val_files, args.total_seq_len, args.ttt_steps, device)

    records = MetricRecords()
    logging.getLogger("speculators.metrics").addHandler(records)
    logging.getLogger("speculators.metrics").setLevel(logging.INFO)
    kwargs = {"use_off_policy_tokens": False, "ttt_steps": args.ttt_steps,
              "ttt_step_loss_decay": 1.0}
    trainer = Trainer(model, TrainerConfig(
        lr=args.lr, num_epochs=args.epochs, save_path=str(work / "checkpoints"),
        local_rank=0 if device.type == "cuda" else str(device),
        train_call_kwargs=kwargs, val_call_kwargs=kwargs, scheduler_type="cosine"),
        loader(train_files, args.total_seq_len, args.seed),
        loader(val_files, args.total_seq_len, None))
    t0 = time.perf_counter()
    trainer.run_training()
    result["train_seconds"] = round(time.perf_counter() - t0, 2)
    losses = [r["train"]["loss"] for r in records.records if "train" in r]
    val = [r["val"].get("loss_epoch") for r in records.records if "val" in r]
    tenth = max(1, len(losses) // 10)
    first, last = sum(losses[:tenth]) / tenth, sum(losses[-tenth:]) / tenth
    final_val = held_out_loss(model, val_files, args.total_seq_len, args.ttt_steps, device)
    result["training"] = {
        "steps": len(losses), "first_tenth_mean": first, "last_tenth_mean": last,
        "val_loss_by_epoch": val, "held_out_before": initial_val, "held_out_after": final_val,
        "loss_finite": all(math.isfinite(x) for x in losses),
        "loss_down": last < first and final_val < initial_val}

    # Reload the last epoch's checkpoint the way the trainer resumes, compare. speculators'
    # checkpointer saves bfloat16 (convert_float_dtype): the file must hold exactly the
    # trained weights in bf16, and the reloaded model must equal the trained one rounded so.
    ckpt = work / "checkpoints" / str(args.epochs - 1)
    ignore = set(getattr(model, "_keys_to_ignore_on_save", None) or [])
    saved = load_safetensors_state_dict(ckpt / "model.safetensors", "cpu")
    expected = {k: v for k, v in convert_float_dtype(model.state_dict(), torch.bfloat16).items()
                if k not in ignore}
    loaded_config = Eagle3SpeculatorConfig.from_pretrained(ckpt)
    reloaded = Eagle3DraftModel(loaded_config, t2d=t2d.clone(), d2t=d2t.clone())
    missing, unexpected = reloaded.load_state_dict(saved, strict=False)
    rounded = Eagle3DraftModel(model.config, t2d=t2d.clone(), d2t=d2t.clone())
    rounded.load_state_dict(expected, strict=False)
    model.eval()
    flex = train_draft.DENSE if device.type == "cpu" else train_draft.FLEX
    for m in (reloaded, rounded):
        m.to(device).eval()
        train_draft.set_attention(m, flex)
    batch = train_draft.to_device(next(iter(loader(val_files, args.total_seq_len, None))),
                                  device)
    result["reload"] = {
        "checkpoint": str(ckpt.relative_to(work)),
        "missing_keys": sorted(missing), "unexpected_keys": sorted(unexpected),
        "saved_dtype": str(loaded_config.to_dict().get("dtype")),
        "config_dict_diff": [k for k in train_draft.config_diff(model.config.to_dict(),
                                                                loaded_config.to_dict())
                             if k not in ("dtype", "torch_dtype")],
        "file_vs_trained_bf16_diff": train_draft.weights_diff(saved, expected),
        "weights_diff": train_draft.weights_diff(
            {k: v for k, v in rounded.state_dict().items() if k not in ignore},
            {k: v for k, v in reloaded.state_dict().items() if k not in ignore}),
        "forward_diff": train_draft.forward_diff(rounded, reloaded, batch, args.ttt_steps),
    }
    r = result["reload"]
    result["ok"] = bool(
        gen["inputs_returned_in_order"] == gen["samples"] and result["training"]["loss_down"]
        and result["training"]["loss_finite"] and not r["unexpected_keys"]
        and set(r["missing_keys"]) <= {"verifier_lm_head.weight", "verifier_norm.weight"}
        and not r["config_dict_diff"] and not r["file_vs_trained_bf16_diff"]
        and not r["weights_diff"] and not r["forward_diff"])
    result["seconds"] = round(time.perf_counter() - t_start, 2)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: result[k] for k in ("ok", "training", "reload", "seconds")}, indent=1))
    return result


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    sys.exit(0 if main()["ok"] else 1)
