#!/usr/bin/env bash
# Device side of the real-shape model run (docs/gpu.md, "Real-shape models"): stash
# the kit parts this call carries, install the kit (tools/gpu/gpu_preamble.sh), then run
# tests/e2e/scripts/gpu_models.py into $OUT (gpu_models.json, logs.tar.xz). Checkpoints and
# finished tasks stay under /root/gpu-models: a later call on the same machine resumes.
#
#   bash tools/gpu/gpu_models.sh [PART...] [-- gpu_models.py arguments]
source "$(dirname "$0")/gpu_preamble.sh"
out=${OUT:-/tmp/gpu-models-out}
mkdir -p "$out"
nvidia-smi -L | tee "$out/gpus.txt"
df -h /root | tail -1 >> "$out/gpus.txt"
python3 tests/e2e/scripts/gpu_models.py --out "$out" --work /root/gpu-models --site /root/site \
    "${GPU_SPECS[@]}" "${GPU_ARGS[@]}"
rc=$?
tar -C /root/gpu-models -cJf "$out/logs.tar.xz" logs results 2>/dev/null || true
echo "models: $(( $(date +%s) - GPU_T0 )) s since install began, rc=$rc"
exit $rc
