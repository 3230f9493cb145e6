# SPDX-License-Identifier: Apache-2.0
# shellcheck shell=bash
#
# Helpers sourced by the resources/ build scripts and by scripts/ (not executable on its own).
# Progress goes to stderr so that stdout stays free for the scripts' results.

MINIVMM_CACHE=${MINIVMM_CACHE:-${HOME:-/root}/.cache/minivmm}
export MINIVMM_CACHE

log() {
    echo "${LOG_PREFIX:-resources}: $*" >&2
}

die() {
    log "error: $*"
    exit 1
}

# stop_guest_run PID NETNS DIR: for the EXIT trap of a script that runs a VM: ends
# process PID (none if empty) if it still runs, deletes network namespace NETNS and
# removes directory DIR.
stop_guest_run() {
    if [ -n "$1" ] && kill -0 "$1" 2>/dev/null; then
        kill "$1" 2>/dev/null || true
        wait "$1" 2>/dev/null || true
    fi
    ip netns delete "$2" 2>/dev/null || true
    rm -rf "$3"
}

# progress_start; stalled FILE STALL: for a wait on a guest that follows
# progress. `stalled` says (with a log line) whether FILE (its console or
# serial log) has not grown for STALL seconds since progress_start, or the
# wait has lasted three times STALL in all, however it grew.
progress_start() {
    WAIT_START=$SECONDS
    WAIT_SIZE=-1
    WAIT_SINCE=$SECONDS
}
stalled() {
    local size
    size=$(stat -c %s "$1" 2>/dev/null || echo 0)
    if [ "$size" != "$WAIT_SIZE" ]; then
        WAIT_SIZE=$size
        WAIT_SINCE=$SECONDS
    fi
    if [ $((SECONDS - WAIT_SINCE)) -ge "$2" ]; then
        log "$1 has not grown for $2 s: the guest stalled"
        return 0
    fi
    if [ $((SECONDS - WAIT_START)) -ge $((3 * $2)) ]; then
        log "still waiting after $((3 * $2)) s, though $1 grows"
        return 0
    fi
    return 1
}

# Bounds of every network fetch (fetch_watched): it ends after FETCH_STALL
# seconds without progress (so that, with the work around it, a registry that
# cannot be reached fails a fetch within a minute) and after FETCH_CAP
# seconds in all.
FETCH_STALL=${MINIVMM_FETCH_STALL:-40}
FETCH_CAP=${MINIVMM_FETCH_CAP:-3600}
# apt's own network settings for every apt command that fetches: no retry
# (apt retries a name that does not resolve item after item, each try as long
# as the resolver's time-outs: the set-up is run again instead), and a
# connection that moves no byte for 30 s fails.
APT_NET=(-o Acquire::Retries=0 -o Acquire::http::Timeout=30 -o Acquire::https::Timeout=30)
# cargo's: one retry, 30 s without a byte.
export CARGO_NET_RETRY=${CARGO_NET_RETRY:-1}
export CARGO_HTTP_TIMEOUT=${CARGO_HTTP_TIMEOUT:-30}

# group_cpu PGID: the CPU seconds the live processes of process group PGID
# have used.
group_cpu() {
    ps -e -o pgid=,cputimes= | awk -v g="$1" '$1 == g { s += $2 } END { print s + 0 }'
}

# dirs_fingerprint DIR...: the total size and number of the files under DIR...
# (missing ones count as empty); it changes when a byte lands.
dirs_fingerprint() {
    { find "$@" -xdev -type f -printf '%s\n' 2>/dev/null || true; } |
        awk '{ s += $1; n++ } END { print s + 0, n + 0 }'
}

# fetch_watched WHAT DIR... -- CMD...: runs CMD, a network fetch, in a
# session (so a process group) of its own, its output in a log, and ends the
# whole group (apt's download methods too, which would otherwise outlive it
# and hold the caller's output open) once FETCH_STALL seconds pass without
# progress: a byte landing under one of the DIRs, or a CPU second used by the
# group (a build after the download). Also ends it after FETCH_CAP seconds
# whatever, and when this script is interrupted. On success CMD's output goes
# to stderr; on failure one log line says why, with the most telling line of
# the output, and FETCH_UNREACHABLE is set when the cause was the network (no
# progress, a name that did not resolve, a connection that failed), so that
# callers do not try another fetch. Returns CMD's status (1 when it was
# ended).
fetch_watched() {
    local what=$1 dirs=() out pid fp last_fp cpu last_cpu since start why= status=0 said
    local prev_exit prev_signals prev_cmd=
    shift
    while [ $# -gt 0 ] && [ "$1" != -- ]; do
        dirs+=("$1")
        shift
    done
    shift
    out=$(mktemp)
    # A background job of a script is not a group leader, so setsid execs CMD
    # in place: $! is CMD's pid, and its session's and group's id. Line
    # buffered, so that a CMD ended by the watch has written what it said.
    setsid stdbuf -oL -eL "$@" >"$out" 2>&1 </dev/null &
    pid=$!
    # An interrupted or exiting caller takes the group with it, then runs its
    # own EXIT trap as before; both traps are put back afterwards.
    prev_exit=$(trap -p EXIT)
    prev_signals=$(trap -p INT TERM)
    if [ -n "$prev_exit" ]; then
        eval "set -- $prev_exit"
        prev_cmd=$3
    fi
    # shellcheck disable=SC2064 # the pid and the command are fixed now
    trap "kill -KILL -- -$pid 2>/dev/null; $prev_cmd" EXIT
    trap 'exit 1' INT TERM
    last_fp=$(dirs_fingerprint "${dirs[@]}")
    last_cpu=0
    since=$SECONDS
    start=$SECONDS
    while kill -0 "$pid" 2>/dev/null; do
        sleep 1
        fp=$(dirs_fingerprint "${dirs[@]}")
        cpu=$(group_cpu "$pid")
        if [ "$fp" != "$last_fp" ] || [ "$cpu" != "$last_cpu" ]; then
            last_fp=$fp
            last_cpu=$cpu
            since=$SECONDS
        fi
        if [ $((SECONDS - since)) -ge "$FETCH_STALL" ]; then
            why="no progress for $FETCH_STALL s"
        elif [ $((SECONDS - start)) -ge "$FETCH_CAP" ]; then
            why="not done after $FETCH_CAP s"
        fi
        if [ -n "$why" ]; then
            kill -INT -- -"$pid" 2>/dev/null || true
            sleep 2
            kill -KILL -- -"$pid" 2>/dev/null || true
            break
        fi
    done
    # (Braces and 2>: no "Killed" notice from bash for a group it ended.)
    { wait "$pid" || status=$?; } 2>/dev/null
    # Whatever it left behind in its group goes with it.
    kill -KILL -- -"$pid" 2>/dev/null || true
    trap - EXIT INT TERM
    eval "$prev_exit"
    eval "$prev_signals"
    if [ -z "$why" ] && [ "$status" -eq 0 ]; then
        cat "$out" >&2
        rm -f "$out"
        return 0
    fi
    [ -n "$why" ] || why="status $status"
    # The line that names the cause, if any does; else the last one.
    local net='resolv|could not connect|connection (refused|timed out)|network is unreachable|timed out'
    if said=$(grep -E -i -m 1 "$net" "$out"); then
        FETCH_UNREACHABLE=1
    else
        said=$(grep -E -i -m 1 'failed to fetch|error' "$out" ||
            grep -v '^[[:space:]]*$' "$out" | tail -n 1 || true)
    fi
    case "$why" in no\ progress*) FETCH_UNREACHABLE=1 ;; esac
    said=$(printf '%s' "$said" | sed 's/^[[:space:]]*//')
    rm -f "$out"
    log "$what failed ($why; is the registry reachable?)${said:+: $said}"
    [ "$status" -ne 0 ] || status=1
    return "$status"
}

# missing_packages PKG...: prints the packages (one a line) not installed yet.
missing_packages() {
    local pkg
    for pkg in "$@"; do
        if ! dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q '^install ok installed$'; then
            echo "$pkg"
        fi
    done
}

# apt_update: `apt-get update`, at most once per process tree (the marker is
# exported to child scripts); returns 1 when it did not run.
apt_update() {
    [ -n "${MINIVMM_APT_UPDATED:-}" ] && return 1
    export MINIVMM_APT_UPDATED=1
    fetch_watched "apt-get update" /var/lib/apt/lists -- apt-get "${APT_NET[@]}" update || true
}

# apt_install PKG...: downloads the packages (bounded, fetch_watched), then
# installs them from what was downloaded, with no network; fails with one
# log line.
apt_install() {
    fetch_watched "downloading $*" /var/cache/apt/archives -- \
        apt-get "${APT_NET[@]}" install -y --no-install-recommends --download-only "$@" || return 1
    apt-get install -y --no-install-recommends --no-download "$@" >&2 || {
        log "apt-get install $* failed"
        return 1
    }
}

# apt_plan PKG...: apt's dry run of installing PKG without recommends; fails
# with one log line: status 1 if apt cannot plan it, 2 if it would remove a
# package the machine has.
apt_plan() {
    local plan removals
    if ! plan=$(apt-get -s install --no-install-recommends "$@" 2>&1); then
        log "apt-get cannot install $*: $(printf '%s\n' "$plan" | tail -n 1)"
        return 1
    fi
    removals=$(printf '%s\n' "$plan" | awk '$1 == "Remv" { printf "%s%s %s", sep, $2, $3; sep = ", " }')
    if [ -n "$removals" ]; then
        log "not installing $*: apt would remove $removals, which this machine has; install $* yourself in a way that keeps them"
        return 2
    fi
}

# try_packages PKG...: installs the Debian packages that are not installed
# yet, without recommends, and only if apt's dry run shows it would remove
# nothing the machine has. Returns 0 when all are installed, 1 (after one log
# line saying why) when they are not. A warm machine does no network work:
# the package lists are refreshed only when apt cannot plan or fetch without.
try_packages() {
    local missing
    mapfile -t missing < <(missing_packages "$@")
    [ ${#missing[@]} -eq 0 ] && return 0
    if [ "$(id -u)" -ne 0 ]; then
        log "missing packages ${missing[*]} and not root to install them"
        return 1
    fi
    export DEBIAN_FRONTEND=noninteractive
    local planned=0
    apt_plan "${missing[@]}" || planned=$?
    # Absent or stale lists make a package look unknown: plan again on fresh
    # ones. A removal is final.
    if [ "$planned" -eq 1 ] && apt_update && [ -z "${FETCH_UNREACHABLE:-}" ]; then
        log "planning again on refreshed package lists"
        planned=0
        apt_plan "${missing[@]}" || planned=$?
    fi
    [ "$planned" -eq 0 ] || return 1
    log "installing ${missing[*]} (without recommends)"
    # (Each failure below has said why in one line.)
    if ! apt_install "${missing[@]}"; then
        # Lists older than the archive name files it no longer has; a
        # registry out of reach stays so.
        [ -z "${FETCH_UNREACHABLE:-}" ] || return 1
        apt_update || return 1
        apt_plan "${missing[@]}" || return 1
        apt_install "${missing[@]}" || return 1
    fi
}

# ensure_packages PKG...: try_packages, and stop the script when it fails
# (try_packages has said why).
ensure_packages() {
    try_packages "$@" || exit 1
}
