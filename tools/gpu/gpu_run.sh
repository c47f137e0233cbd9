#!/usr/bin/env bash
# Device side of the GPU checks (see docs/gpu.md): stash the kit parts this call carries,
# install the kit (once per machine), then run the GPU matrix into $OUT.
#
#   bash tools/gpu/gpu_run.sh [PART...] [-- gpu_matrix.py arguments]
#
# e.g. the last carry call:  bash tools/gpu/gpu_run.sh .gpu-kit/parts/kit.part02 -- --tp2
source "$(dirname "$0")/gpu_preamble.sh"
out=${OUT:-/tmp/gpu-out}
mkdir -p "$out"
nvidia-smi -L | tee "$out/gpus.txt"
# Each run gets PYTHONPATH=src:/root/spec-<version>:/root/site from the matrix script.
python3 tests/e2e/scripts/gpu_matrix.py --out "$out" --site /root/site "${GPU_SPECS[@]}" \
    "${GPU_ARGS[@]}"
rc=$?
tar -C /tmp -cJf "$out/logs.tar.xz" gpu-matrix-logs 2>/dev/null || true  # all runs' logs
echo "matrix: $(( $(date +%s) - GPU_T0 )) s since install began, rc=$rc"
exit $rc
