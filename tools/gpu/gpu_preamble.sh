# Device-side preamble shared by tools/gpu/gpu_run.sh, tools/gpu/gpu_bench.sh and tools/gpu/gpu_models.sh
# (sourced, not run): stash the kit parts named before `--`, install the kit (once per
# machine), set the offline / NCCL environment and, for a kit that carries its own torch
# (vLLM 0.34), the environment its install wrote (LD_PRELOAD of the NCCL stub, ...).
# Leaves the arguments after `--` in GPU_ARGS, the call's start in GPU_CALL_T0 (unless the
# caller set it), the install start time in GPU_T0, and cds to the repository root; starts
# tools/gpu/gpu_host_watch.sh for the call.
set -uo pipefail
# When the call began (before the parts are stashed): what GPU_CALL_LIMIT_S counts from.
GPU_CALL_T0=${GPU_CALL_T0:-$(date +%s)}
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
_parts=()
while [ $# -gt 0 ] && [ "$1" != "--" ]; do _parts+=("$1"); shift; done
[ "${1:-}" = "--" ] && shift
GPU_ARGS=("$@")
if [ ${#_parts[@]} -gt 0 ]; then python3 tools/gpu/gpu_kit.py stash "${_parts[@]}" || exit 1; fi
GPU_T0=$(date +%s)
# The host's memory and disk every 2 s into $OUT/host.txt; the call's processes are
# killed before the host runs out of either (tools/gpu/gpu_host_watch.sh).
mkdir -p "${OUT:-/tmp}"
bash tools/gpu/gpu_host_watch.sh $$ "${OUT:-/tmp}/host.txt" >/dev/null 2>&1 &
python3 tools/gpu/gpu_kit.py install || exit 1
echo "kit install: $(( $(date +%s) - GPU_T0 )) s"
_kit_env="${GPU_KIT_SITE:-/root/site}/.gpu-kit-env.sh"
if [ -f "$_kit_env" ]; then source "$_kit_env"; echo "kit environment: $_kit_env"; fi
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1
# Keep NVLink multicast off (shared hosts; see the device tool's KINDS.md).
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
# Both speculators releases unless the arguments name --spec themselves.
GPU_SPECS=(--spec 0.3.0=/root/spec-0.3.0 --spec 0.4.0.1=/root/spec-0.4.0.1)
case " ${GPU_ARGS[*]:-} " in *" --spec "*) GPU_SPECS=() ;; esac
