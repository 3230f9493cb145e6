#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
#
# Builds the minivmm guest userspace and packs the one tree twice:
#  - the initramfs, an uncompressed newc cpio holding static busybox (and the
#    applet links init uses), /init (also as /sbin/init), /dev/console, when
#    the netperf crate builds, the static /bin/mvperf (also the guest's HTTP
#    client for MMDS, `mvperf http`, see init's `minivmm.mmds=`), and
#    Debian's iperf3 with the shared libraries and dynamic loader it needs
#    (at the paths ldd names), so the guest can serve iperf3 as well as
#    mvperf. No curl: it and its libraries doubled the archive every boot
#    unpacks;
#  - the root disk, an ext4 image of the same files with free space for the
#    guest to write, booted with `--disk path=COPY,root=on` and no initramfs
#    (the kernel runs /sbin/init from a disk root).
#
# The tree and the cpio are always rebuilt (seconds); the cargo build of
# mvperf is incremental in the checkout's target/. Set MINIVMM_REQUIRE_MVPERF=1
# to make a failed mvperf build an error instead of a warning, and
# MINIVMM_REQUIRE_IPERF3=1 to make a missing iperf3 one.
#
# The archive is reproducible and named by its content hash, so checkouts that
# share $MINIVMM_CACHE (with different init scripts or mvperf versions) never
# overwrite an image another one is booting. mke2fs stamps each image with a
# fresh UUID and the files' change times, so the disk image is named by what
# it is made from instead (the cpio's hash, the mke2fs command, e2fsprogs'
# version) and built only when that is new. Boot a copy of it read-write: the
# cached one must stay as built.
#
# Prints two lines on stdout: the absolute paths of the initramfs and of the
# root disk image.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
LOG_PREFIX=initramfs/build.sh
# shellcheck source-path=SCRIPTDIR/.. source=common.sh
. "$HERE/../common.sh"

# e2fsprogs: mke2fs -d builds the disk image from a directory, with no loop
# mount and no root-only step.
ensure_packages busybox-static cpio binutils e2fsprogs
# iperf3 is a peer nobody here wrote; without it the image still serves mvperf.
IPERF3=
if try_packages iperf3 && [ -x /usr/bin/iperf3 ]; then
    IPERF3=/usr/bin/iperf3
elif [ "${MINIVMM_REQUIRE_IPERF3:-0}" = 1 ]; then
    die "iperf3 (Debian package iperf3) is not installed"
else
    log "WARNING: iperf3 is not installed; the initramfs has no /bin/iperf3"
fi

BUSYBOX=/bin/busybox
# Debian's dynamic `busybox` package also ships /bin/busybox; the guest has no
# libc, so insist on the static one.
if readelf -l "$BUSYBOX" 2>/dev/null | grep -q 'Requesting program interpreter'; then
    die "$BUSYBOX is dynamically linked; install busybox-static instead of busybox"
fi

# Applets init uses, plus a few for poking around on a console.
APPLETS=(sh ash mount umount mkdir cat echo grep sleep sync reboot poweroff halt
    ip ifconfig ping kill ps ls dmesg uname hostname true false devmem head wc
    dd rm mkfifo)

OUTDIR=$MINIVMM_CACHE/initramfs
mkdir -p "$OUTDIR"
exec 9>"$OUTDIR/.lock"
flock 9

WORK=$(mktemp -d "$OUTDIR/work.XXXXXX")
trap 'rm -rf "$WORK"' EXIT

# mvperf: static glibc build so it drops into a libc-less image.
MVPERF=
mvperf_target=x86_64-unknown-linux-gnu
if command -v cargo >/dev/null 2>&1; then
    log "building mvperf (static, $mvperf_target)"
    # The checkout's own target directory, never one shared with other
    # checkouts: cargo fingerprints workspace members by their path relative
    # to the workspace, so a shared directory can take another checkout's
    # build of the same file names for fresh. --target keeps these static
    # artifacts apart from ordinary builds there.
    if RUSTFLAGS="-C target-feature=+crt-static" CARGO_TARGET_DIR="$REPO/target" \
        cargo build --release --manifest-path "$REPO/Cargo.toml" -p netperf \
        --target "$mvperf_target" >&2; then
        MVPERF=$REPO/target/$mvperf_target/release/mvperf
        if readelf -l "$MVPERF" | grep -q 'Requesting program interpreter'; then
            die "$MVPERF is not statically linked"
        fi
    fi
else
    log "cargo not found"
fi
if [ -z "$MVPERF" ]; then
    [ "${MINIVMM_REQUIRE_MVPERF:-0}" = 1 ] && die "mvperf did not build"
    log "WARNING: mvperf did not build; the initramfs has no /bin/mvperf"
fi

ROOT=$WORK/root
mkdir -p "$ROOT"/{bin,sbin,dev,proc,sys,tmp,etc}
cp "$BUSYBOX" "$ROOT/bin/busybox"
for applet in "${APPLETS[@]}"; do
    ln -s busybox "$ROOT/bin/$applet"
done
install -m 0755 "$HERE/init" "$ROOT/init"
# The kernel looks for /sbin/init on a disk root (/init only in an
# initramfs); one script, so both boots run the same init.
ln -s ../init "$ROOT/sbin/init"
# The release profile keeps debug info; the guest does not need it.
if [ -n "$MVPERF" ]; then strip -o "$ROOT/bin/mvperf" "$MVPERF"; fi
# carry BINARY NAME: BINARY as /bin/NAME with every library ldd resolves and
# the loader, each at the path the loader will look for it (no ld.so.cache in
# the guest: the loader's built-in /lib/x86_64-linux-gnu covers Debian's
# multiarch libraries).
carry() {
    cp "$1" "$ROOT/bin/$2"
    ldd "$1" | awk '$2 == "=>" && $3 ~ /^\// { print $3 } $1 ~ /^\// { print $1 }' |
        while read -r lib; do
            mkdir -p "$ROOT$(dirname "$lib")"
            cp -L "$lib" "$ROOT$lib"
        done
    interp=$(readelf -l "$1" | sed -n 's/.*Requesting program interpreter: \(.*\)]/\1/p')
    [ -n "$interp" ] && [ -e "$ROOT$interp" ] || die "$2's loader ${interp:-?} did not make it into the image"
}
if [ -n "$IPERF3" ]; then carry "$IPERF3" iperf3; fi
# The kernel opens /dev/console for init before anything can mount devtmpfs.
# Only root can make the node; init copes without it (it reopens its stdio
# from devtmpfs).
if mknod -m 0600 "$ROOT/dev/console" c 5 1 2>/dev/null; then
    :
else
    log "WARNING: cannot mknod /dev/console (not root?); relying on init's devtmpfs fallback"
fi

# Stable timestamps and ownership make the archive reproducible.
find "$ROOT" -exec touch -h -d @0 {} +
# Uncompressed on purpose: on a PVM-backed KVM host the guest kernel runs
# instruction-emulated, and inflating a 2.5 MB gzip archive there took
# minutes, while copying 4 MB of plain cpio takes seconds.
(cd "$ROOT" && find . -mindepth 1 | LC_ALL=C sort |
    cpio --quiet -o -H newc -R 0:0 --reproducible) >"$WORK/initramfs.cpio"
OUT=$OUTDIR/minivmm-initramfs-$(sha256sum "$WORK/initramfs.cpio" | cut -c1-16).cpio
mv "$WORK/initramfs.cpio" "$OUT"
# Images of other versions are a few MB each; a week-old one is nobody's.
find "$OUTDIR" -maxdepth 1 -name 'minivmm-initramfs-*.cpio' -mtime +7 -delete
touch "$OUT"
log "initramfs $OUT ($(stat -c %s "$OUT") bytes${MVPERF:+, with mvperf}${IPERF3:+, with iperf3})"

# The root disk: the same tree as an ext4 file system. 4 KiB blocks (mke2fs
# would pick 1 KiB for a file system this small) so a guest page is one
# block; inode tables and the journal written now (no lazy init), or the
# guest kernel would spend its first minutes after a read-write mount zeroing
# them under emulation. The files keep the owner they have here (root, as
# the package step requires; the cpio records 0:0 for every file);
# root_owner makes the root directory root's in any case.
DISK_MIB=64
# shellcheck disable=SC2054 # commas belong to mke2fs's -E value
MKE2FS=(mke2fs -q -t ext4 -b 4096 -L minivmm-root
    -E root_owner=0:0,lazy_itable_init=0,lazy_journal_init=0,nodiscard)
DISKDIR=$MINIVMM_CACHE/rootfs
# The key: the files (the cpio), how they are packed (this script without its
# comments, as the kernel's key) and the mke2fs that packs them.
DISK_KEY=$( { sha256sum <"$OUT"; grep -v '^[[:space:]]*#' "$HERE/build.sh";
    dpkg-query -W -f='${Version}' e2fsprogs; } | sha256sum | cut -c1-16)
DISK=$DISKDIR/minivmm-rootfs-$DISK_KEY.ext4
mkdir -p "$DISKDIR"
if [ -s "$DISK" ]; then
    log "reusing cached root disk $DISK"
else
    # mke2fs copies each file's times: those of the cpio (0), not of today.
    # Reading the tree for the cpio moved the access times, so again.
    find "$ROOT" -exec touch -h -d @0 {} +
    # -F: the output is a regular file, not a device mke2fs should ask about.
    "${MKE2FS[@]}" -d "$ROOT" -F "$WORK/rootfs.ext4" "${DISK_MIB}M" >&2
    # The image must hold what the cpio does: read every file back out of it
    # (no mount needed) and compare. rdump leaves out device nodes; the only
    # one is /dev/console, which a disk root gets from devtmpfs anyway.
    mkdir "$WORK/check"
    debugfs -R "rdump / $WORK/check" "$WORK/rootfs.ext4" 2>/dev/null
    diff -r --no-dereference -x lost+found -x console "$ROOT" "$WORK/check" >&2 ||
        die "the root disk's files differ from the initramfs tree's"
    e2fsck -fn "$WORK/rootfs.ext4" >&2 || die "e2fsck finds the fresh root disk unclean"
    mv "$WORK/rootfs.ext4" "$DISK"
fi
# 64 MiB apparent, about 20 MB on disk each; a week-old one is nobody's.
find "$DISKDIR" -maxdepth 1 -name 'minivmm-rootfs-*.ext4' -mtime +7 -delete
touch "$DISK"
log "root disk $DISK (${DISK_MIB} MiB ext4, $(du -k "$DISK" | cut -f1) KiB used on the host)"

echo "$OUT"
echo "$DISK"
