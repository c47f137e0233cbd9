#!/usr/bin/env bash
# Device side of the data-parallel run (tests/e2e/scripts/gpu_data_parallel.py): stash the
# kit parts this call carries, install the kit (tools/gpu/gpu_preamble.sh), then run
# speculators 0.4.0.1's offline script as one run and as two replicas on the one GPU
# (--replicas-per-gpu 2), with and without SPECULATORS_COMPAT_BATCH_INVARIANT=1, into
# $OUT/data_parallel.json. The checkpoint stays under /root/gpu-dp (a later call on the same
# machine reuses it).
#
#   bash tools/gpu/gpu_data_parallel.sh [PART...] [-- gpu_data_parallel.py arguments]
source "$(dirname "$0")/gpu_preamble.sh"
out=${OUT:-/tmp/gpu-dp-out}
mkdir -p "$out"
nvidia-smi -L | tee "$out/gpus.txt"
df -h /root | tail -1 >> "$out/gpus.txt"
# One release (the last --spec wins): 0.4.0.1 unless the arguments name another.
spec=(--spec 0.4.0.1=/root/spec-0.4.0.1)
case " ${GPU_ARGS[*]:-} " in *" --spec "*) spec=() ;; esac
python3 tests/e2e/scripts/gpu_data_parallel.py --device gpu --out "$out" --work /root/gpu-dp \
    --site /root/site "${spec[@]}" "${GPU_ARGS[@]}"
rc=$?
tar -C /root/gpu-dp -cJf "$out/logs.tar.xz" --exclude='out' --exclude='ckpt' --exclude='hf' \
    . 2>/dev/null || true
echo "data-parallel: $(( $(date +%s) - GPU_T0 )) s since install began, rc=$rc"
exit $rc
