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

# ensure_packages PKG...: installs the Debian packages that are not installed
# yet. A warm machine does no network work; `apt-get update` runs at most once
# per process tree (the marker is exported to child scripts).
ensure_packages() {
    local missing=() pkg
    for pkg in "$@"; do
        if ! dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q '^install ok installed$'; then
            missing+=("$pkg")
        fi
    done
    [ ${#missing[@]} -eq 0 ] && return 0
    [ "$(id -u)" -eq 0 ] || die "missing packages ${missing[*]} and not root to install them"
    log "installing ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    if [ -z "${MINIVMM_APT_UPDATED:-}" ]; then
        apt-get update >&2 || die "apt-get update failed"
        export MINIVMM_APT_UPDATED=1
    fi
    apt-get install -y --no-install-recommends "${missing[@]}" >&2 || die "apt-get install ${missing[*]} failed"
}
