#!/usr/bin/env bash
# Device side of the GPU benchmark (docs/performance.md, "GPU benchmark"): stash the kit
# parts this call carries, install the kit (once per machine, tools/gpu/gpu_preamble.sh), then
# run benchmarks/gpu/gpu_bench.py into $OUT (gpu_bench.json, logs.tar.xz).
#
#   bash tools/gpu/gpu_bench.sh [PART...] [-- gpu_bench.py arguments]
#
# e.g. the last carry call:  bash tools/gpu/gpu_bench.sh .gpu-kit/parts/kit.part02
#      a later call, same machine (kit installed, checkpoint cached):
#                            bash tools/gpu/gpu_bench.sh -- --modes c --json-name gpu_bench-c.json
#      two GPUs, every engine tensor parallel 2 (gpu_bench.py refuses --tp above the GPU count):
#                            bash tools/gpu/gpu_bench.sh -- --tp 2 --modes a,c,b --json-name gpu_bench-tp2.json
#      speculators' own offline script through the shim, both releases, into
#      $OUT/offline_script.json (benchmarks/gpu/offline_script_bench.py; carries .gpu-kit/spectests):
#                            bash tools/gpu/gpu_bench.sh -- --offline-script
source "$(dirname "$0")/gpu_preamble.sh"
out=${OUT:-/tmp/gpu-bench-out}
mkdir -p "$out"
if [ "${GPU_ARGS[0]:-}" = "--offline-script" ]; then
    python3 benchmarks/gpu/offline_script_bench.py --out "$out" --work /root/gpu-bench \
        --site /root/site "${GPU_SPECS[@]}" "${GPU_ARGS[@]:1}"
    rc=$?
    tar -C /root/gpu-bench -cJf "$out/offline-script-logs.tar.xz" \
        --exclude='*/out' --exclude='*/hf-datasets' --exclude='*/check-cache' offline-script 2>/dev/null || true
    echo "offline script: $(( $(date +%s) - GPU_T0 )) s since install began, rc=$rc"
    exit $rc
fi
# The checkpoint (16 GB) and the check files stay under /root/gpu-bench for later calls on
# this machine. After a visit with the real-shape models (their checkpoints ~30 GB) a run
# ended with nothing written and the machine stopped answering, most likely a full disk:
# refuse at once instead.
free_gb=$(df -BG --output=avail /root | tail -1 | tr -dc 0-9)
if [ ! -d /root/gpu-bench/ckpt ] && [ "${free_gb:-0}" -lt "${GPU_BENCH_MIN_FREE_GB:-24}" ]; then
    echo "gpu_bench: only ${free_gb} GB free under /root; the checkpoint and the offline" \
         "loop's files need about 24 GB. Free it first (rm -rf /root/gpu-models) or use" \
         "a fresh machine." >&2
    exit 2
fi
# The run ends GPU_CALL_MARGIN_S (60) before the call's limit, GPU_CALL_LIMIT_S (600, the
# device's longest call; set it to the call's timeout where that is shorter), counted from
# the call's start: --deadline is lowered to fit after the kit's install. A call that
# overruns its limit returns nothing.
end_by=$(( GPU_CALL_T0 + ${GPU_CALL_LIMIT_S:-600} - ${GPU_CALL_MARGIN_S:-60} ))
python3 benchmarks/gpu/gpu_bench.py --out "$out" --work /root/gpu-bench --site /root/site \
    --end-by "$end_by" "${GPU_SPECS[@]}" "${GPU_ARGS[@]}"
rc=$?
tar -C /root/gpu-bench -cJf "$out/logs.tar.xz" logs 2>/dev/null || true  # every child's log
echo "benchmark: $(( $(date +%s) - GPU_T0 )) s since install began, rc=$rc"
exit $rc
