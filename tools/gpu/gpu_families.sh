#!/usr/bin/env bash
# Device side of the model-family run (docs/gpu.md, "Model families"): stash the kit parts
# this call carries, install the kit (tools/gpu/gpu_preamble.sh), unpack the checkpoint tars
# carried as .cache/gpu-ckpts-*.tar (or unpacked into /root/ckpts by earlier calls), then
# run tests/e2e/scripts/gpu_families.py into $OUT (both speculators releases unless the
# arguments name --spec).
#
#   bash tools/gpu/gpu_families.sh [PART...] [-- gpu_families.py arguments]
source "$(dirname "$0")/gpu_preamble.sh"
out=${OUT:-/tmp/gpu-families-out}
mkdir -p "$out" /root/ckpts
nvidia-smi -L | tee "$out/gpus.txt"
for t in .cache/gpu-ckpts-*.tar; do [ -f "$t" ] && tar -C /root/ckpts -xf "$t"; done
# Reap what a previous run may have left holding GPU memory (docs/gpu.md).
pkill -f "tests/e2e/scripts/generate.py" 2>/dev/null; sleep 1
# Per-run files stay on the device (the device tool brings back only a few files of
# $OUT): $OUT gets families.json and every run's JSON and log in one tar.
runs=/root/families-runs
rm -rf "$runs" && mkdir -p "$runs"
python3 tests/e2e/scripts/gpu_families.py --ckpts /root/ckpts --out "$runs" \
    "${GPU_SPECS[@]}" "${GPU_ARGS[@]}"
rc=$?
cp "$runs/families.json" "$out/" 2>/dev/null
tar -C "$runs" -cJf "$out/runs.tar.xz" . 2>/dev/null || true
echo "families: $(( $(date +%s) - GPU_T0 )) s since install began, rc=$rc"
exit $rc
