#!/usr/bin/env bash
# Device side of the model-family run (docs/gpu.md, "Model families"): stash the kit parts
# this call carries, install the kit (tools/gpu_preamble.sh), unpack the checkpoints carried
# in .cache/gpu-ckpts.tar, then run tests/e2e/scripts/gpu_families.py into $OUT.
#
#   bash tools/gpu_families.sh [PART...] [-- gpu_families.py arguments]
source "$(dirname "$0")/gpu_preamble.sh"
out=${OUT:-/tmp/gpu-families-out}
mkdir -p "$out" /root/ckpts
nvidia-smi -L | tee "$out/gpus.txt"
if [ -f .cache/gpu-ckpts.tar ]; then tar -C /root/ckpts -xf .cache/gpu-ckpts.tar; fi
# Reap what a previous run may have left holding GPU memory (docs/gpu.md).
pkill -f "tests/e2e/scripts/generate.py" 2>/dev/null; sleep 1
python3 tests/e2e/scripts/gpu_families.py --ckpts /root/ckpts --out "$out" \
    --spec 0.4.0.1=/root/spec-0.4.0.1 --spec 0.3.0=/root/spec-0.3.0 "${GPU_ARGS[@]}"
rc=$?
echo "families: $(( $(date +%s) - GPU_T0 )) s since install began, rc=$rc"
exit $rc
