#!/usr/bin/env bash
# Device side of the GPU benchmark (issue 12; see docs/performance.md, "GPU"): stash the kit
# parts this call carries, install the kit (once per machine, as tools/gpu_run.sh does), then
# run benchmarks/gpu_bench.py into $OUT (gpu_bench.json, logs.tar.xz).
#
#   bash tools/gpu_bench.sh [PART...] [-- gpu_bench.py arguments]
#
# e.g. the last carry call:  bash tools/gpu_bench.sh .gpu-kit/parts/kit.part02
#      a later call, same machine (kit installed, checkpoint cached):
#                            bash tools/gpu_bench.sh -- --modes c --json-name gpu_bench-c.json
set -uo pipefail
cd "$(dirname "$0")/.."
parts=()
while [ $# -gt 0 ] && [ "$1" != "--" ]; do parts+=("$1"); shift; done
[ "${1:-}" = "--" ] && shift
if [ ${#parts[@]} -gt 0 ]; then python3 tools/gpu_kit.py stash "${parts[@]}" || exit 1; fi
t0=$(date +%s)
python3 tools/gpu_kit.py install || exit 1
echo "kit install: $(( $(date +%s) - t0 )) s"

export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1
# Keep NVLink multicast off (shared hosts; see the device tool's KINDS.md).
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
out=${OUT:-/tmp/gpu-bench-out}
mkdir -p "$out"
# Both speculators releases unless the arguments name --spec themselves. The checkpoint
# (16 GB) and the check files stay under /root/gpu-bench for later calls on this machine.
specs=(--spec 0.3.0=/root/spec-0.3.0 --spec 0.4.0.1=/root/spec-0.4.0.1)
case " $* " in *" --spec "*) specs=() ;; esac
python3 benchmarks/gpu_bench.py --out "$out" --work /root/gpu-bench --site /root/site \
    "${specs[@]}" "$@"
rc=$?
tar -C /root/gpu-bench -cJf "$out/logs.tar.xz" logs 2>/dev/null || true  # every child's log
echo "benchmark: $(( $(date +%s) - t0 )) s since install began, rc=$rc"
exit $rc
