#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Installs the Debian host packages one command needs, only those missing (a
# warm machine does no network work), without recommends, and never at the
# cost of a package the machine already has: apt's dry run must show no
# removal, or nothing is installed and this says why.
#
# Usage: scripts/host-deps.sh boot   what scripts/boot.sh needs on the host
#        scripts/host-deps.sh test   what scripts/test.sh needs (boot's, plus
#                                    procps, util-linux and e2fsprogs)
# The guest image's own build packages are installed by resources/*/build.sh.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
LOG_PREFIX=host-deps
# shellcheck source-path=SCRIPTDIR/.. source=../resources/common.sh
. "$HERE/../resources/common.sh"

# ip (namespaces, TAP), ping, iperf3 (the host end of iperf3 against the
# guest; the guest image carries its own copy).
boot=(iproute2 iputils-ping iperf3)
# kill and ps (procps), unshare (util-linux), debugfs and e2fsck (e2fsprogs:
# the disk tests read the guest's file out of the image and check the file
# system without mounting it), curl (the API tests drive the socket as the
# README does).
test=("${boot[@]}" procps util-linux e2fsprogs curl)

case "${1:-}" in
    boot) ensure_packages "${boot[@]}" ;;
    test)
        ensure_packages "${test[@]}"
        # QEMU (the TCG cross-check of the guest image) is not installed:
        # resources/qemu-check.sh unpacks Debian's into a private cache
        # directory when none is on PATH, so nothing the machine has (its
        # newer qemu-utils) gives way.
        ;;
    *) die "usage: $0 boot|test" ;;
esac
