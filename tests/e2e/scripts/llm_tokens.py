"""vLLM's own ``LLM(...).generate`` with or without ``activate()``; report tokens and what
the engine's (spawned) worker process says about activation.

Usage: llm_tokens.py --out FILE --model PATH [--activate] [--gpu-mem FRACTION] [--kv-gib GIB]
"""

import argparse
import json
import os

if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--model", required=True)
    p.add_argument("--activate", action="store_true")
    p.add_argument("--gpu-mem", type=float, default=None,
                   help="gpu_memory_utilization (GPU runs that share the device)")
    p.add_argument("--kv-gib", type=float, default=None,
                   help="kv_cache_memory_bytes in GiB: no KV sizing by profiling, whose "
                        "check fails when other processes on the GPU free memory meanwhile")
    a = p.parse_args()
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    # collective_rpc(<function>) crosses the engine-core boundary by pickle (test only).
    os.environ["VLLM_ALLOW_INSECURE_SERIALIZATION"] = "1"
    result = {"driver_pid": os.getpid()}
    if a.activate:
        import speculators_compat

        result["driver_report"] = speculators_compat.activate().as_dict()
    from vllm import LLM, SamplingParams

    from speculators_compat._process import worker_report
    from speculators_compat.adapters.cpu_block_size import cpu_accepts_16

    # Same engine settings with and without activate(). Block size 16 where the CPU
    # backend accepts it: vLLM <= 0.28's default picks its AMX kernel on CPUs that have
    # AMX, which rejects this checkpoint's head size 64 ("Unsupported CPU attention
    # configuration: head_dim=64 isa=0", a vLLM limit, with or without the shim).
    extra = {"block_size": 16} if cpu_accepts_16() else {}
    if a.gpu_mem is not None:
        extra["gpu_memory_utilization"] = a.gpu_mem
    if a.kv_gib is not None:
        extra["kv_cache_memory_bytes"] = int(a.kv_gib * 2**30)
    llm = LLM(model=a.model, enforce_eager=True, max_model_len=256, dtype="bfloat16",
              seed=0, **extra)
    prompts = [{"prompt_token_ids": [5 + (7 * i + j) % 400 for j in range(10 + i)]}
               for i in range(4)]
    outs = llm.generate(prompts, SamplingParams(max_tokens=8, temperature=0.0))
    result["tokens"] = [list(o.outputs[0].token_ids) for o in outs]
    result["worker_reports"] = llm.collective_rpc(worker_report)
    with open(a.out, "w") as f:
        json.dump(result, f, default=str)
    del llm
