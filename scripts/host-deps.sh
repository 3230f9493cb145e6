#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The set-up: fetches and installs what the scripts and the tests use, only
# what is missing (a warm machine does no network work), so that after it ran
# once the tests need no network. Host packages come without recommends and
# never at the cost of a package the machine already has: apt's dry run must
# show no removal, or nothing is installed and this says why. Every fetch is
# bounded (fetch_watched in resources/common.sh): one that cannot reach its
# registry fails within a minute with one line, and leaves no process behind.
#
# Usage: scripts/host-deps.sh boot    what scripts/boot.sh's boot needs on the
#                                     host (iproute2, iputils-ping, iperf3)
#        scripts/host-deps.sh setup   everything the tests use as well, what
#                                     scripts/boot.sh fetches and
#                                     scripts/test.sh checks (the same): the
#                                     test packages, the crates of Cargo.lock
#                                     (cargo fetch), cargo-mutants (built into
#                                     the cache), rustfmt and clippy, and the
#                                     private QEMU of resources/qemu-check.sh
#                                     (resources/qemu-fetch.sh)
#        scripts/host-deps.sh test    the same as setup
#        scripts/host-deps.sh mutants cargo-mutants alone (scripts/mutants.sh)
# The guest image's own build packages are installed by resources/*/build.sh
# (scripts/boot.sh runs resources/build.sh).
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/.." && pwd)
LOG_PREFIX=host-deps
# shellcheck source-path=SCRIPTDIR/.. source=../resources/common.sh
. "$HERE/../resources/common.sh"

# ip (namespaces, TAP), ping, iperf3 (the host end of iperf3 against the
# guest; the guest image carries its own copy).
boot=(iproute2 iputils-ping iperf3)
# kill and ps (procps), unshare and taskset (util-linux), debugfs and e2fsck
# (e2fsprogs: the disk tests read the guest's file out of the image and check
# the file system without mounting it), curl (the API tests drive the socket
# as the README does), cpio (the QEMU check reads mvperf out of the image).
test=("${boot[@]}" procps util-linux e2fsprogs curl cpio)

# The cargo-mutants scripts/mutants.sh runs (its version is pinned there).
MUTANTS_VERSION=$(sed -n 's/^VERSION=\([0-9.]*\)$/\1/p' "$HERE/mutants.sh")
# Where cargo keeps what it downloads: progress for fetch_watched.
CARGO_DIRS=("${CARGO_HOME:-$HOME/.cargo}/registry/cache" "${CARGO_HOME:-$HOME/.cargo}/registry/index"
    "${CARGO_HOME:-$HOME/.cargo}/git/db")

# The crates of Cargo.lock that this machine's builds use (the host target's:
# the static mvperf is built for it too), into cargo's cache.
fetch_crates() {
    local fetch=(cargo fetch --locked --manifest-path "$REPO/Cargo.toml"
        --target "$(rustc -vV | sed -n 's/^host: //p')")
    "${fetch[@]}" --offline >/dev/null 2>&1 && return 0
    log "fetching the crates of Cargo.lock"
    fetch_watched "cargo fetch" "${CARGO_DIRS[@]}" -- "${fetch[@]}"
}

# rustfmt and clippy, which scripts/test.sh runs first.
ensure_rust_components() {
    local c missing=()
    for c in fmt clippy; do
        cargo "$c" --version >/dev/null 2>&1 || missing+=("$c")
    done
    [ ${#missing[@]} -eq 0 ] && return 0
    command -v rustup >/dev/null || die "cargo ${missing[*]} missing, and no rustup to add it"
    local components=()
    for c in "${missing[@]}"; do
        case "$c" in fmt) components+=(rustfmt) ;; *) components+=("$c") ;; esac
    done
    fetch_watched "rustup component add ${components[*]}" "${RUSTUP_HOME:-$HOME/.rustup}" -- \
        rustup component add "${components[@]}"
}

# cargo-mutants (scripts/mutants.sh): built once into the cache, keyed by
# its version (a published crate version never changes).
ensure_cargo_mutants() {
    local root=$MINIVMM_CACHE/cargo-mutants-$MUTANTS_VERSION
    if "$root/bin/cargo-mutants" mutants --version 2>/dev/null | grep -q "$MUTANTS_VERSION"; then
        return 0
    fi
    log "building cargo-mutants $MUTANTS_VERSION into $root (once; minutes)"
    local status=0
    fetch_watched "cargo install cargo-mutants@$MUTANTS_VERSION" "${CARGO_DIRS[@]}" -- \
        cargo install --locked --quiet --root "$root" --target-dir "$root/build" \
        "cargo-mutants@$MUTANTS_VERSION" || status=$?
    rm -rf "$root/build"
    return "$status"
}

# The private QEMU of the QEMU check, unless the machine has one on PATH. A
# machine where apt cannot give one still runs every other test: the check
# then skips, saying so.
ensure_qemu() {
    command -v qemu-system-x86_64 >/dev/null && return 0
    bash "$REPO/resources/qemu-fetch.sh" >/dev/null ||
        log "WARNING: no QEMU for resources/qemu-check.sh; the QEMU check will skip"
}

case "${1:-}" in
    boot) ensure_packages "${boot[@]}" ;;
    setup | test)
        ensure_packages "${test[@]}"
        ensure_rust_components
        # (Each failure has said why in one line.)
        fetch_crates || exit 1
        ensure_cargo_mutants || exit 1
        ensure_qemu
        ;;
    mutants) ensure_cargo_mutants || exit 1 ;;
    *) die "usage: $0 boot|setup|test|mutants" ;;
esac
