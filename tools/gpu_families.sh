#!/usr/bin/env bash
# Device side of the model-family run (docs/gpu.md, "Model families"): stash the kit parts
# this call carries, install the kit (tools/gpu_preamble.sh), unpack the checkpoint tars
# carried as .cache/gpu-ckpts-*.tar (or unpacked into /root/ckpts by earlier calls), then
# run tests/e2e/scripts/gpu_families.py into $OUT (both speculators releases unless the
# arguments name --spec).
#
#   bash tools/gpu_families.sh [PART...] [-- gpu_families.py arguments]
source "$(dirname "$0")/gpu_preamble.sh"
out=${OUT:-/tmp/gpu-families-out}
mkdir -p "$out" /root/ckpts
nvidia-smi -L | tee "$out/gpus.txt"
for t in .cache/gpu-ckpts-*.tar; do [ -f "$t" ] && tar -C /root/ckpts -xf "$t"; done
# Reap what a previous run may have left holding GPU memory (docs/gpu.md).
pkill -f "tests/e2e/scripts/generate.py" 2>/dev/null; sleep 1
python3 tests/e2e/scripts/gpu_families.py --ckpts /root/ckpts --out "$out" \
    "${GPU_SPECS[@]}" "${GPU_ARGS[@]}"
rc=$?
echo "families: $(( $(date +%s) - GPU_T0 )) s since install began, rc=$rc"
exit $rc
