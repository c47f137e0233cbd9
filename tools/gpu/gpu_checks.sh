#!/usr/bin/env bash
# Device side of the GPU checks for one visit (see docs/gpu.md): stash the kit parts this
# call carries, install the kit (once per machine), smoke-test it, then run at the same
# time, each at a small share of the GPU:
#   - the GPU matrix (tests/e2e/scripts/gpu_matrix.py; arguments after `--` go to it),
#     then vLLM's own engine with and without activate() (tests/e2e/scripts/llm_tokens.py:
#     the same tokens, the plugin silent unless activated);
#   - speculators' own GPU tests (tests/e2e/scripts/gpu_speculators_tests.py), both releases.
# Everything lands in $OUT: smoke.txt, matrix.json, summary.md, untouched.json,
# spectests.json, logs.tar.xz.
#
#   bash tools/gpu/gpu_checks.sh [PART...] [-- gpu_matrix.py arguments]
source "$(dirname "$0")/gpu_preamble.sh"
out=${OUT:-/tmp/gpu-checks-out}
mkdir -p "$out" /tmp/gpu-checks-logs
nvidia-smi -L | tee "$out/gpus.txt"
python3 tools/gpu/gpu_kit.py smoke >"$out/smoke.txt" 2>&1
smoke=$?
tail -n 30 "$out/smoke.txt"
[ $smoke -eq 0 ] || { echo "smoke test failed (rc=$smoke)"; exit 3; }
site=${GPU_KIT_SITE:-/root/site}

(
  python3 tests/e2e/scripts/gpu_matrix.py --out "$out" --site "$site" "${GPU_SPECS[@]}" \
      "${GPU_ARGS[@]}" >/tmp/gpu-checks-logs/matrix.log 2>&1
  echo "matrix rc=$?" >>/tmp/gpu-checks-logs/matrix.log
  ckpt=/tmp/gpu-matrix-ckpts/llama
  for mode in plain active; do
    flag=(); [ $mode = active ] && flag=(--activate)
    PYTHONPATH="src:$site" timeout 300 python3 tests/e2e/scripts/llm_tokens.py \
        --out "/tmp/gpu-checks-logs/untouched-$mode.json" --model "$ckpt" --gpu-mem 0.1 \
        "${flag[@]}" >"/tmp/gpu-checks-logs/untouched-$mode.log" 2>&1
  done
  python3 - "$out/untouched.json" <<'PY'
import json, sys
res = {}
for mode in ("plain", "active"):
    try:
        res[mode] = json.load(open(f"/tmp/gpu-checks-logs/untouched-{mode}.json"))
    except OSError as e:
        res[mode] = {"error": str(e)}
p, a = res["plain"], res["active"]
ok = ("tokens" in p and p.get("tokens") == a.get("tokens")
      and p.get("worker_reports") == [None] and a.get("worker_reports") not in (None, [None]))
res["ok"] = ok
json.dump(res, open(sys.argv[1], "w"), indent=1, default=str)
print("untouched:", "ok" if ok else "NOT OK", p.get("tokens"), a.get("tokens"))
PY
) &
chain=$!

python3 tests/e2e/scripts/gpu_speculators_tests.py --site "$site" \
    --spec 0.3.0=/root/spec-0.3.0 --spec 0.4.0.1=/root/spec-0.4.0.1 \
    --timeout "${SPECTESTS_TIMEOUT:-420}" --out "$out/spectests.json" \
    --logs /tmp/gpu-checks-logs/spectests >/tmp/gpu-checks-logs/spectests.log 2>&1
echo "speculators' tests rc=$?"
wait $chain
tail -n 5 /tmp/gpu-checks-logs/matrix.log
cat "$out/summary.md" 2>/dev/null | head -40
tar -C /tmp -cJf "$out/logs.tar.xz" gpu-checks-logs gpu-matrix-logs 2>/dev/null || true
echo "checks: $(( $(date +%s) - GPU_T0 )) s since install began"
