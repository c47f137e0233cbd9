#!/usr/bin/env bash
# Device side: every correctness check of one GPU visit in one call, side by side on the
# one GPU (each engine at a small share of its memory), after the kit is installed
# (tools/gpu/gpu_preamble.sh; arguments before `--` are kit parts to stash first):
#   - the GPU matrix (tests/e2e/scripts/gpu_matrix.py: Llama and the DeepSeek-V3 layout,
#     batches 1/11/33, both speculators releases, against transformers), then vLLM's own
#     engine with and without activate() (tests/e2e/scripts/llm_tokens.py);
#   - speculators' own GPU tests, both releases (tests/e2e/scripts/gpu_speculators_tests.py);
#   - KV-cache pressure: generate.py --preempt, both releases (whole, exact, no preemption);
#   - the serving check (tests/e2e/scripts/gpu_serve.py), where it exists;
#   - real-shape models against vLLM's native extraction (gpu_models.py), GPU_VISIT_MODELS.
# vLLM's LLM engines of these checks (not the generator's, which the shim sizes) take a
# fixed KV cache (kv_cache_memory_bytes): vLLM's start-up profiling fails when another
# process on the GPU frees memory meanwhile, which side by side is the rule.
# $OUT gets visit.tar.xz (every JSON and summary), logs.tar.xz and summary.txt.
#
#   bash tools/gpu/gpu_visit.sh [PART...] [-- gpu_matrix.py arguments]
source "$(dirname "$0")/gpu_preamble.sh"
out=${OUT:-/tmp/gpu-visit-out}
res=/tmp/gpu-visit/results
logs=/tmp/gpu-visit/logs
mkdir -p "$out" "$res" "$logs"
site=${GPU_KIT_SITE:-/root/site}
deadline=${GPU_VISIT_DEADLINE:-540}
pids=()
# GPU_VISIT_SKIP=matrix,untouched,pressure,spectests leaves those checks out (e.g. a visit
# for the serving check and the models once the rest is recorded at the same shim code).
want() { case ",${GPU_VISIT_SKIP:-}," in *",$1,"*) return 1 ;; *) return 0 ;; esac; }
{ nvidia-smi -L; df -h /root | tail -1; nproc; } >"$res/gpus.txt" 2>&1
python3 tools/gpu/gpu_kit.py smoke >"$res/smoke.txt" 2>&1 || { tail -n 30 "$res/smoke.txt"; echo "smoke failed"; exit 3; }

ckpt=/tmp/gpu-matrix-ckpts/llama
PYTHONPATH="src:$site" python3 -c "import sys; from speculators_compat.demo.checkpoints import \
build_checkpoint; build_checkpoint('llama', sys.argv[1])" "$ckpt" >"$logs/ckpt.log" 2>&1
# The checks' deadline counts from here; the call's limit (GPU_CALL_LIMIT_S, 600) from the
# call's start, kit install, smoke test and checkpoint included: keep GPU_CALL_MARGIN_S
# (60) of it for packing the results, since a call that overruns its limit returns nothing.
left=$(( GPU_CALL_T0 + ${GPU_CALL_LIMIT_S:-600} - ${GPU_CALL_MARGIN_S:-60} - $(date +%s) ))
if [ "$left" -lt "$deadline" ]; then
  echo "GPU_VISIT_DEADLINE $deadline s lowered to $left s (the call's limit)"
  deadline=$left
fi
if want matrix; then
  timeout $((deadline - 40)) python3 tests/e2e/scripts/gpu_matrix.py --out "$res/matrix" \
      --site "$site" "${GPU_SPECS[@]}" --deadline $((deadline - 90)) "${GPU_ARGS[@]}" \
      >"$logs/matrix.log" 2>&1 &
  pids+=($!)
fi
if want untouched; then
  (
    for mode in plain active; do
      flag=(); [ $mode = active ] && flag=(--activate)
      PYTHONPATH="src:$site" timeout 240 python3 tests/e2e/scripts/llm_tokens.py \
          --out "$res/untouched-$mode.json" --model "$ckpt" --gpu-mem 0.06 --kv-gib 1 \
          "${flag[@]}" >"$logs/untouched-$mode.log" 2>&1
    done
  ) &
  pids+=($!)
fi
if want pressure; then
  for v in 0.3.0 0.4.0.1; do
    PYTHONPATH="src:/root/spec-$v:$site" timeout $((deadline - 60)) python3 \
        tests/e2e/scripts/generate.py --out "$res/pressure-$v.json" --model "$ckpt" \
        --layers 0,2,5 --batches 11 --preempt --gpu-mem 0.06 >"$logs/pressure-$v.log" 2>&1 &
    pids+=($!)
  done
fi
if want spectests; then
  timeout $((deadline - 30)) python3 tests/e2e/scripts/gpu_speculators_tests.py --site "$site" \
      --spec 0.3.0=/root/spec-0.3.0 --spec 0.4.0.1=/root/spec-0.4.0.1 \
      --timeout "${SPECTESTS_TIMEOUT:-400}" --out "$res/spectests.json" \
      --logs "$logs/spectests" >"$logs/spectests.log" 2>&1 &
  pids+=($!)
fi

if [ -f tests/e2e/scripts/gpu_serve.py ] && [ -z "${GPU_VISIT_NO_SERVE:-}" ]; then
  PYTHONPATH="src:/root/spec-0.4.0.1:$site" timeout $((deadline - 30)) \
      python3 tests/e2e/scripts/gpu_serve.py --out "$res/serve.json" --workdir /tmp/gpu-serve \
      --phase-timeout 240 --set kv_gib=2 --set train_budget_s=180 ${GPU_SERVE_ARGS:-} \
      >"$logs/serve.log" 2>&1 &
  pids+=($!)
fi

if [ -n "${GPU_VISIT_MODELS:-}" ]; then
  # GPU_VISIT_MODEL_SPECS=0.3.0 runs the models with that release only (one already
  # recorded at the same shim code need not take the call's time again)
  model_specs=("${GPU_SPECS[@]}")
  if [ -n "${GPU_VISIT_MODEL_SPECS:-}" ]; then
    model_specs=()
    for v in ${GPU_VISIT_MODEL_SPECS//,/ }; do model_specs+=(--spec "$v=/root/spec-$v"); done
  fi
  # GPU_VISIT_VLLM_CONFIG='{"gdn_prefill_backend": "triton"}' for Qwen3.5 / Qwen3-Next with
  # this kit (its FlashInfer has no gdn_prefill); GPU_VISIT_MODELS_GPU_MEM for models whose
  # weights want more than 8 % of the GPU (the hybrid real shapes ran at 0.25)
  model_extra=()
  if [ -n "${GPU_VISIT_VLLM_CONFIG:-}" ]; then
    model_extra=(--vllm-additional-config "$GPU_VISIT_VLLM_CONFIG")
  fi
  timeout $((deadline - 20)) python3 tests/e2e/scripts/gpu_models.py --out "$res/models" \
      --work /root/gpu-models --site "$site" "${model_specs[@]}" --models "$GPU_VISIT_MODELS" \
      --deadline $((deadline - 40)) --min-start-left 60 --parallel 4 --parallel-natives 2 \
      --native-gpu-mem 0.15 --native-kv-gib 8 --gpu-mem "${GPU_VISIT_MODELS_GPU_MEM:-0.08}" \
      "${model_extra[@]}" >"$logs/models.log" 2>&1 &
  pids+=($!)
fi

wait "${pids[@]}"
python3 - "$res" >"$out/summary.txt" 2>&1 <<'PY'
import json, sys
from pathlib import Path
res = Path(sys.argv[1])
def load(p):
    try:
        return json.loads(p.read_text())
    except Exception as e:  # noqa: BLE001
        return {"error": f"{p.name}: {e}"}
print((res / "gpus.txt").read_text())
m = load(res / "matrix" / "matrix.json")
for r in (m.get("runs") or m.get("results") or []) if isinstance(m, dict) else []:
    print("matrix", r.get("id"), r.get("ok"), r.get("min_cosine"), (r.get("error") or "")[:300])
s = res / "matrix" / "summary.md"
if s.exists():
    print(s.read_text()[:6000])
p, a = load(res / "untouched-plain.json"), load(res / "untouched-active.json")
print("untouched:", "ok" if ("tokens" in p and p.get("tokens") == a.get("tokens")
      and p.get("worker_reports") == [None] and a.get("worker_reports") not in (None, [None]))
      else "NOT OK", str(p)[:300], str(a)[:300])
for v in ("0.3.0", "0.4.0.1"):
    r = load(res / f"pressure-{v}.json")
    pre = (r.get("extra") or {}).get("preempt") if isinstance(r, dict) else None
    print("pressure", v, r.get("ok"), json.dumps(pre, default=str)[:600] if pre else str(r)[:600])
sp = load(res / "spectests.json")
print("spectests", json.dumps(sp, default=str)[:1500])
for name in ("serve.json", "models/gpu_models.json"):
    if (res / name).exists():
        print(name, json.dumps(load(res / name), default=str)[:3000])
PY
cat "$out/summary.txt"
tar -C /tmp/gpu-visit -cJf "$out/visit.tar.xz" results 2>/dev/null
[ -d /tmp/gpu-serve/logs ] && cp -r /tmp/gpu-serve/logs "$logs/serve-phases"
tar -C /tmp -cJf "$out/logs.tar.xz" gpu-visit/logs gpu-matrix-logs 2>/dev/null || true
echo "visit: $(( $(date +%s) - GPU_T0 )) s since install began"
