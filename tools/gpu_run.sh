#!/usr/bin/env bash
# Device side of the GPU checks (see docs/gpu.md): stash the kit parts this call carries,
# install the kit (once per machine), then run the GPU matrix into $OUT.
#
#   bash tools/gpu_run.sh [PART...] [-- gpu_matrix.py arguments]
#
# e.g. the last carry call:  bash tools/gpu_run.sh .gpu-kit/parts/kit.part02 -- --tp2
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
out=${OUT:-/tmp/gpu-out}
mkdir -p "$out"
nvidia-smi -L | tee "$out/gpus.txt"
# Each run gets PYTHONPATH=src:/root/spec-<version>:/root/site from the matrix script.
# Both speculators releases unless the arguments name --spec themselves.
specs=(--spec 0.3.0=/root/spec-0.3.0 --spec 0.4.0.1=/root/spec-0.4.0.1)
case " $* " in *" --spec "*) specs=() ;; esac
python3 tests/e2e/scripts/gpu_matrix.py --out "$out" --site /root/site "${specs[@]}" "$@"
rc=$?
tar -C /tmp -cJf "$out/logs.tar.xz" gpu-matrix-logs 2>/dev/null || true  # all runs' logs
echo "matrix: $(( $(date +%s) - t0 )) s since install began, rc=$rc"
exit $rc
