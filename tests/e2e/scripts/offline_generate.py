"""An offline data-generation script shaped like speculators' own
``scripts/data_generation_offline.py`` (0.3.0 / 0.4.0.1), written for this project.

What matters is the shape, because that is what broke under ``speculators-compat run``:
speculators is imported at MODULE LEVEL (so vLLM's spawned workers, which re-run this
file as ``__mp_main__`` before any vLLM code, import it too), the work is under a
``__main__`` guard, the data goes through speculators' OWN preprocessing
(``load_and_preprocess_dataset``: a local ShareGPT-style ``.jsonl``, the tokenizer's chat
template, loss masks), then through speculators' generator, one ``data_<i>.pt`` file per
sample. Nothing here imports or mentions the shim: it runs under
``speculators-compat run`` (tests/e2e/test_offline_script.py).

Usage: offline_generate.py --target-model-path DIR --train-data-path FILE.jsonl
       --output-dir DIR [--layer-ids 0 2 5] [--batch-size 4] [--seq-length 256]
"""

import argparse
import json
import os
from pathlib import Path

import torch
from speculators.data_generation.preprocessing import load_and_preprocess_dataset
from speculators.data_generation.vllm_hidden_states_generator import VllmHiddenStatesGenerator


def parse_args():
    p = argparse.ArgumentParser(description="offline hidden-state data generation")
    p.add_argument("--target-model-path", required=True)
    p.add_argument("--train-data-path", required=True)
    p.add_argument("--output-dir", required=True)
    p.add_argument("--layer-ids", type=int, nargs="+", default=None)
    p.add_argument("--batch-size", type=int, default=4)
    p.add_argument("--seq-length", type=int, default=256)
    p.add_argument("--max-samples", type=int, default=None)
    p.add_argument("--hf-cache-dir", default=None)
    p.add_argument("--token-freq-path", default="./token_freq.pt")
    p.add_argument("--num-preprocessing-workers", type=int, default=1)
    return p.parse_args()


def worker_reports(generator):
    """What vLLM's workers say about the shim (test-only side output; ``None`` without it)."""
    try:
        from speculators_compat._process import worker_report
    except ImportError:
        return None
    return generator.executor.collective_rpc(worker_report)


def main():
    args = parse_args()
    dataset, _ = load_and_preprocess_dataset(
        target_model_path=args.target_model_path,
        train_data_path=args.train_data_path,
        seq_length=args.seq_length,
        build_dataset_num_proc=args.num_preprocessing_workers,
        max_samples=args.max_samples,
        token_freq_path=args.token_freq_path,
        cache_dir=args.hf_cache_dir,
    )
    out = Path(args.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    generator = VllmHiddenStatesGenerator(
        model_path=args.target_model_path,
        layer_ids=args.layer_ids,
        max_model_len=args.seq_length,
        tensor_parallel_size=1,
    )
    index = 0
    for start in range(0, len(dataset), args.batch_size):
        batch = dataset[start:start + args.batch_size]
        results = generator.generate(batch["input_ids"])
        if len(results) != len(batch["input_ids"]):
            raise SystemExit(f"{len(results)} results for {len(batch['input_ids'])} samples")
        for j, result in enumerate(results):
            n = len(result["input_ids"])
            # to a temporary name, then renamed: a killed run leaves no truncated sample
            tmp = out / f".data_{index}.pt.tmp"
            torch.save({"input_ids": result["input_ids"],
                        "hidden_states": [h.contiguous() for h in result["hidden_states"]],
                        "loss_mask": batch["loss_mask"][j][:n]}, tmp)
            os.replace(tmp, out / f"data_{index}.pt")
            index += 1
    info = {"samples": index, "layer_ids": list(generator.layer_ids), "driver_pid": os.getpid(),
            "worker_reports": worker_reports(generator)}
    (out / "run_info.json").write_text(json.dumps(info, default=str))


if __name__ == "__main__":
    main()
