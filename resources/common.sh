# SPDX-License-Identifier: Apache-2.0
# shellcheck shell=bash
#
# Helpers sourced by the resources/ build scripts (not executable on its own).
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

# missing_packages PKG...: prints the packages (one a line) not installed yet.
missing_packages() {
    local pkg
    for pkg in "$@"; do
        if ! dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q '^install ok installed$'; then
            echo "$pkg"
        fi
    done
}

# try_packages PKG...: installs the Debian packages that are not installed yet,
# without recommends, and only if apt would remove nothing the machine has
# (checked with a dry run first). Returns 0 when all are installed, 1 (after
# one log line saying why) when they are not. A warm machine does no network
# work; `apt-get update` runs at most once per process tree (the marker is
# exported to child scripts).
try_packages() {
    local missing plan removals
    mapfile -t missing < <(missing_packages "$@")
    [ ${#missing[@]} -eq 0 ] && return 0
    if [ "$(id -u)" -ne 0 ]; then
        log "missing packages ${missing[*]} and not root to install them"
        return 1
    fi
    export DEBIAN_FRONTEND=noninteractive
    if [ -z "${MINIVMM_APT_UPDATED:-}" ]; then
        apt-get update >&2 || { log "apt-get update failed"; return 1; }
        export MINIVMM_APT_UPDATED=1
    fi
    if ! plan=$(apt-get -s install --no-install-recommends "${missing[@]}" 2>&1); then
        log "apt-get cannot install ${missing[*]}: $(printf '%s\n' "$plan" | tail -n 1)"
        return 1
    fi
    removals=$(printf '%s\n' "$plan" | awk '$1 == "Remv" { printf "%s%s %s", sep, $2, $3; sep = ", " }')
    if [ -n "$removals" ]; then
        log "not installing ${missing[*]}: apt would remove $removals, which this machine has; install ${missing[*]} yourself in a way that keeps them"
        return 1
    fi
    log "installing ${missing[*]} (without recommends)"
    apt-get install -y --no-install-recommends "${missing[@]}" >&2 || {
        log "apt-get install ${missing[*]} failed"
        return 1
    }
}

# ensure_packages PKG...: try_packages, and stop the script when it fails.
ensure_packages() {
    try_packages "$@" || die "required packages missing: $(missing_packages "$@" | tr '\n' ' ')"
}
