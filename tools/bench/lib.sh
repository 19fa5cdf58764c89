# Shell helpers shared by tools/bench-compare and crates/fuse/tools/bench-fuse (source it):
# mounting cairn and waiting for FUSE daemons to exit.

# Waits until process PID has exited (a zombie counts as exited), at most 120 s.
wait_gone() {
    local pid=$1 tries=0 state
    while [[ -e /proc/$pid ]]; do
        state=$(awk '{print $3}' "/proc/$pid/stat" 2>/dev/null || true)
        [[ $state == Z || -z $state ]] && return 0
        if ((tries++ > 1200)); then
            echo "process $pid still running after 120 s" >&2
            return 1
        fi
        sleep 0.1
    done
}

# The pid of the newest process whose command line is exactly "$@" (a FUSE daemon found by
# the arguments it was started with), or nothing.
pid_of_command() {
    local pattern
    pattern=$(printf '%s ' "$@")
    pgrep -n -x -f -- "$(printf '%s' "${pattern% }" | sed 's/[][\.*^$+?(){}|]/\\&/g')" || true
}

# Mounts cairn IMAGE on MNT with the daemon BIN (extra arguments go to the daemon before the
# image, e.g. -o threads=2) and sets cairn_pid to the daemon's pid.
cairn_mount() {
    local bin=$1 image=$2 mnt=$3
    shift 3
    "$bin" "$@" "$image" "$mnt"
    cairn_pid=$(pid_of_command "$bin" "$@" "$image" "$mnt")
}

# Unmounts MNT and waits for the daemon cairn_pid to finish writing back and exit (umount
# returns before it has: plain FUSE mounts get no DESTROY request).
cairn_unmount() {
    local mnt=$1
    if mountpoint -q "$mnt"; then
        umount "$mnt" || umount -l "$mnt"
    fi
    if [[ -n ${cairn_pid:-} ]]; then
        wait_gone "$cairn_pid"
        cairn_pid=
    fi
}
