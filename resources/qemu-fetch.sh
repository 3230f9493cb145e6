#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
#
# The QEMU that resources/qemu-check.sh runs the guest image under, when no
# qemu-system-x86_64 is on PATH: Debian's qemu-system-x86 is NOT installed
# (on the project's machines that would remove their newer qemu-utils); its
# package and the dependencies this machine lacks are fetched with
# `apt-get download` and unpacked with `dpkg-deb -x` into
#   $MINIVMM_CACHE/qemu/<key>/root
# where <key> hashes the SHA256 apt's lists give for every one of those
# packages (their content), and run from there with LD_LIBRARY_PATH. From
# that private tree every shared library the machine already has is deleted,
# so the private copy only adds libraries and never replaces one; nothing
# outside the cache directory changes. $MINIVMM_CACHE/qemu/current names the
# tree the last fetch made, for the check to find with no network and no
# look at apt's lists (which another `apt-get update` may have moved on).
#
# Usage: qemu-fetch.sh            the set-up (scripts/host-deps.sh): the
#                                 current tree if whole, else fetch one
#        qemu-fetch.sh --cached   never fetch: the current tree, if whole
# Prints the tree's root (the last line of stdout); fails with one log line.
# The fetch is bounded (fetch_watched in common.sh): an unreachable registry
# fails it within a minute.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
LOG_PREFIX=qemu-fetch
# shellcheck source-path=SCRIPTDIR source=common.sh
. "$HERE/common.sh"

BASE=$MINIVMM_CACHE/qemu

# qemu_env ROOT CMD...: runs CMD with the private tree's libraries found.
qemu_env() {
    local root=$1
    shift
    LD_LIBRARY_PATH=$root/lib/x86_64-linux-gnu:$root/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} "$@"
}

# usable DIR: whether DIR holds a whole tree whose qemu finds every library
# (the machine may have lost one the tree relied on since).
usable() {
    [ -e "$1/ok" ] || return 1
    ! qemu_env "$1/root" ldd "$1/root/usr/bin/qemu-system-x86_64" 2>/dev/null | grep -q 'not found'
}

case "${1:-}" in
    --cached | "")
        # A whole tree is kept for good (a newer QEMU in the archive is no
        # reason to fetch again): a warm set-up does no work.
        key=$(cat "$BASE/current" 2>/dev/null || true)
        if [ -n "$key" ] && usable "$BASE/$key"; then
            touch "$BASE/$key"
            echo "$BASE/$key/root"
            exit 0
        fi
        [ -z "${1:-}" ] || die "no private QEMU in $BASE (the set-up, scripts/host-deps.sh setup, fetches it)"
        ;;
    *) die "usage: $0 [--cached]" ;;
esac

# Every package in qemu-system-x86's dependency closure (alternatives
# included) that the machine lacks; unneeded extras only cost disk space.
closure() {
    local all
    mapfile -t all < <(apt-cache depends --recurse --no-recommends --no-suggests \
        --no-conflicts --no-breaks --no-replaces --no-enhances qemu-system-x86 |
        grep -v '^[ <]' | sort -u)
    # One dpkg-query for all: the installed ones, then those not among them.
    comm -23 <(printf '%s\n' "${all[@]}") \
        <(dpkg-query -W -f='${Package} ${Status}\n' "${all[@]}" 2>/dev/null |
            awk '/ install ok installed$/ { print $1 }' | sort -u)
}

# content_key PKG...: a hash of the candidate version's SHA256 of each
# package, from apt's lists (no network); fails when apt knows none.
content_key() {
    local sums
    sums=$(apt-cache show --no-all-versions "$@" 2>/dev/null |
        awk '/^Package:/ { p = $2 } /^SHA256:/ { print p, $2 }')
    [ -n "$sums" ] || return 1
    printf '%s\n' "$sums" | sort | sha256sum | cut -c1-16
}

apt_knows_qemu() {
    local v
    v=$(apt-cache policy qemu-system-x86 2>/dev/null | awk '/Candidate:/ { print $2 }')
    [ -n "$v" ] && [ "$v" != "(none)" ]
}
if ! apt_knows_qemu; then
    apt_update || true
    apt_knows_qemu || die "apt knows no qemu-system-x86 package"
fi
mapfile -t pkgs < <(closure)
[ ${#pkgs[@]} -gt 0 ] || die "apt gives no package for qemu-system-x86"
key=$(content_key "${pkgs[@]}") || die "apt's lists give no SHA256 for ${pkgs[*]}"
dir=$BASE/$key
mkdir -p "$BASE"
exec 9>"$BASE/.lock"
flock 9
if usable "$dir"; then
    touch "$dir"
    echo "$key" >"$BASE/current"
    echo "$dir/root"
    exit 0
fi

log "fetching qemu-system-x86 and its ${#pkgs[@]} missing dependencies into $dir (nothing is installed)"
rm -rf "$dir"
mkdir -p "$dir/debs" "$dir/root"
(cd "$dir/debs" && fetch_watched "apt-get download of qemu-system-x86 and its dependencies" \
    "$dir/debs" -- apt-get "${APT_NET[@]}" download "${pkgs[@]}") || {
    rm -rf "$dir"
    exit 1
}
for deb in "$dir"/debs/*.deb; do
    dpkg-deb -x "$deb" "$dir/root" || die "dpkg-deb -x $deb failed"
done
# Never shadow a library the machine has (e.g. an alternative's
# libsystemd.so.0): the host's copy stays the one every program loads.
while IFS= read -r -d '' lib; do
    for sys in /lib/x86_64-linux-gnu /usr/lib/x86_64-linux-gnu; do
        if [ -e "$sys/$(basename "$lib")" ]; then
            rm -f "$lib"
            break
        fi
    done
done < <(find "$dir/root" -path '*-linux-gnu/*' -name '*.so*' -print0)
if qemu_env "$dir/root" ldd "$dir/root/usr/bin/qemu-system-x86_64" | grep 'not found' >&2; then
    die "the unpacked qemu-system-x86_64 lacks the libraries above"
fi
qemu_env "$dir/root" "$dir/root/usr/bin/qemu-system-x86_64" --version >&2 || die "the unpacked qemu-system-x86_64 does not run"
# The packages are unpacked; the tree is what is kept.
rm -rf "$dir/debs"
touch "$dir/ok"
echo "$key" >"$BASE/current"
# Trees of older keys are nobody's once a week old.
find "$BASE" -mindepth 1 -maxdepth 1 -type d ! -name "$key" -mtime +7 -exec rm -rf {} +
log "private QEMU ready in $dir"
echo "$dir/root"
