#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
#
# Builds (or reuses) the minivmm guest image: kernel (vmlinux, bzImage),
# initramfs and an ext4 root disk holding the same userspace. Works from any
# directory, on a fresh Debian 12 machine as root (installs the packages it
# needs) or a warm one (no network work).
#
# Contract: the LAST FOUR lines of stdout are the absolute paths of vmlinux,
# bzImage, the initramfs and the root disk image, in that order. Progress goes
# to stderr. The disk image is the cache's own: boot a copy of it read-write.
#
# Environment: MINIVMM_CACHE (default ~/.cache/minivmm) holds everything built;
# MINIVMM_REQUIRE_MVPERF=1 fails when the netperf tool does not build.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
LOG_PREFIX=resources/build.sh
# shellcheck source-path=SCRIPTDIR source=common.sh
. "$HERE/common.sh"

kernel_out=$("$HERE/kernel/build.sh") || die "kernel build failed"
vmlinux=$(printf '%s\n' "$kernel_out" | tail -n 2 | head -n 1)
bzimage=$(printf '%s\n' "$kernel_out" | tail -n 1)
userspace_out=$("$HERE/initramfs/build.sh") || die "initramfs and root disk build failed"
initramfs=$(printf '%s\n' "$userspace_out" | tail -n 2 | head -n 1)
disk=$(printf '%s\n' "$userspace_out" | tail -n 1)

for f in "$vmlinux" "$bzimage" "$initramfs" "$disk"; do
    [ -s "$f" ] || die "expected build output $f is missing"
done

echo "$vmlinux"
echo "$bzimage"
echo "$initramfs"
echo "$disk"
