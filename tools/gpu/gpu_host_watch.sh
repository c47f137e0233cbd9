#!/usr/bin/env bash
# Device side, started in the background by tools/gpu/gpu_preamble.sh for the call's shell:
# every 2 s one line of the host's available memory, free disk under /root and load
# average into FILE, so that a call comes back with what the host went through. Below
# GPU_WATCH_MIN_MEM_MB of available memory (default 6144) or GPU_WATCH_MIN_DISK_GB of free
# disk (default 2) it kills every process under the call's shell except itself (the runs,
# their engines and workers): the shell then goes on to pack the logs and the call
# returns its output, where a host out of memory or disk can stop answering and the
# call's output is lost (a full disk did that to two calls, 2026-12-04).
#
#   bash tools/gpu/gpu_host_watch.sh ROOT_PID FILE >/dev/null 2>&1 &
#
# It ends when ROOT_PID ends. Start it with its output away from the call's: a background
# process that holds the call's stdout open keeps a reader of it waiting.
root=$1
file=$2
mem_floor=${GPU_WATCH_MIN_MEM_MB:-6144}
disk_floor=${GPU_WATCH_MIN_DISK_GB:-2}
me=$$

# Every process whose parent chain reaches $root without passing through this watcher.
under_root() {
    ps -e -o pid=,ppid= | awk -v r="$root" -v me="$me" '
        { parent[$1] = $2 }
        END {
            for (p in parent) {
                x = p
                while ((x in parent) && x != r && x != me && x > 1) x = parent[x]
                if (x == r && p != r) print p
            }
        }'
}

# Alive and not a zombie: a shell that has exited stays a zombie until its parent reaps
# it, and a parent that first reads the call's output to its end would wait for ever.
alive() {
    local stat
    stat=$(cat "/proc/$root/stat" 2>/dev/null) || return 1
    stat=${stat##*) }
    [ "${stat%% *}" != Z ]
}

while alive; do
    mem=$(awk '/^MemAvailable:/ {print int($2 / 1024)}' /proc/meminfo)
    disk=$(df -BG --output=avail /root 2>/dev/null | tail -1 | tr -dc 0-9)
    echo "$(date +%T) mem_available_mb=${mem:-?} disk_free_gb=${disk:-?} load=$(cut -d' ' -f1 /proc/loadavg)" >>"$file"
    why=""
    [ -n "$mem" ] && [ "$mem" -lt "$mem_floor" ] && why="available memory ${mem} MB < ${mem_floor} MB"
    [ -n "$disk" ] && [ "$disk" -lt "$disk_floor" ] && why="free disk ${disk} GB < ${disk_floor} GB"
    if [ -n "$why" ]; then
        victims=$(under_root)
        echo "$(date +%T) $why: killing the call's processes:" $victims >>"$file"
        [ -n "$victims" ] && kill -9 $victims 2>/dev/null
        sleep 5
    fi
    sleep 2
done
