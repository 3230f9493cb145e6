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
# exported to child scripts).
apt_update() {
    [ -n "${MINIVMM_APT_UPDATED:-}" ] && return 1
    export MINIVMM_APT_UPDATED=1
    apt-get update >&2 || log "apt-get update failed"
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
    if [ "$planned" -eq 1 ] && apt_update; then
        log "planning again on refreshed package lists"
        planned=0
        apt_plan "${missing[@]}" || planned=$?
    fi
    [ "$planned" -eq 0 ] || return 1
    log "installing ${missing[*]} (without recommends)"
    if ! apt-get install -y --no-install-recommends "${missing[@]}" >&2; then
        # Lists older than the archive name files it no longer has.
        apt_update || { log "apt-get install ${missing[*]} failed"; return 1; }
        apt_plan "${missing[@]}" || return 1
        apt-get install -y --no-install-recommends "${missing[@]}" >&2 || {
            log "apt-get install ${missing[*]} failed"
            return 1
        }
    fi
}

# ensure_packages PKG...: try_packages, and stop the script when it fails.
ensure_packages() {
    try_packages "$@" || die "required packages missing: $(missing_packages "$@" | tr '\n' ' ')"
}
