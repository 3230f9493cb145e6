#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
#
# Proves the minivmm guest image (kernel config, init, mvperf) without minivmm
# and without KVM: boots it under qemu-system-x86_64 with TCG.
#
#  1. Boot without minivmm.mode=serve: init must print MINIVMM-READY and reset
#     the VM (`reboot=k`); with -no-reboot qemu then exits 0.
#  2. Boot with minivmm.mode=serve and a virtio-net device on a TAP inside a
#     network namespace created here (all traffic stays in it, deleted on
#     exit): wait for MINIVMM-SERVING, ping the guest, then run the five
#     mvperf tests against the guest's server, printing their JSON on stdout.
#  3. Boot the ext4 root disk instead of the initramfs (a copy, virtio-blk,
#     `root=/dev/vda rw`) in serve mode with `minivmm.disk=write:SEED`: init
#     must write its test file and remount the root read-only, serve and
#     answer pings; after qemu is killed the host reads the file out of the
#     image with debugfs (same bytes as the init's pattern) and `e2fsck -fn`
#     finds it clean.
#  4. Boot another copy read-only (`readonly=on`, `root=/dev/vda ro`) with
#     `minivmm.disk=readonly`: init must report EROFS and a refused device
#     write, reset the VM, and the copy must hash as before.
#
# QEMU: any qemu-system-x86_64 on PATH; without one, the private copy of
# Debian's that the set-up unpacked into the cache (resources/qemu-fetch.sh,
# run by scripts/host-deps.sh setup). This script fetches nothing.
#
# Every wait on a guest follows progress: it fails after BOOT_TIMEOUT seconds
# without a byte on the guest's serial log, or after three times that in all,
# so a host loaded by other work slows the check without failing it.
#
# Usage: qemu-check.sh [BZIMAGE INITRAMFS [DISK]]   (default: from
# resources/build.sh; given BZIMAGE and INITRAMFS alone, boots 3 and 4 are
# skipped)
# Exit: 0 all passed, 1 a check failed, 77 skipped (not root, no TUN, QEMU
# neither on PATH nor in the cache).
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
LOG_PREFIX=qemu-check
# shellcheck source-path=SCRIPTDIR source=common.sh
. "$HERE/common.sh"

BOOT_TIMEOUT=${MINIVMM_QEMU_BOOT_TIMEOUT:-300}
TEST_SECONDS=${MINIVMM_QEMU_TEST_SECONDS:-3}
HOST_IP=10.200.0.1
GUEST_IP=10.200.0.2
PREFIX=24
TESTS=(TCP_STREAM TCP_MAERTS TCP_RR UDP_STREAM UDP_RR)

if [ "$(id -u)" -ne 0 ]; then
    log "SKIP: needs root for network namespaces and TAP devices"
    exit 77
fi
if [ ! -c /dev/net/tun ]; then
    log "SKIP: /dev/net/tun is missing"
    exit 77
fi
ensure_packages iproute2 iputils-ping cpio

# Any qemu-system-x86_64 on PATH will do (a machine may carry its own build).
QEMU_BIN=(qemu-system-x86_64)
if ! command -v qemu-system-x86_64 >/dev/null; then
    if ! QROOT=$("$HERE/qemu-fetch.sh" --cached); then
        log "SKIP: no qemu-system-x86_64 on PATH and no private one in the cache"
        exit 77
    fi
    # -L: the firmware (microvm's qboot) lives in the private tree too.
    QEMU_BIN=(env "LD_LIBRARY_PATH=$QROOT/lib/x86_64-linux-gnu:$QROOT/usr/lib/x86_64-linux-gnu"
        "$QROOT/usr/bin/qemu-system-x86_64" -L "$QROOT/usr/share/qemu" -L "$QROOT/usr/share/seabios")
    log "using the private $("${QEMU_BIN[@]}" --version | head -n 1) from $QROOT"
fi

DISK=
if [ $# -eq 2 ] || [ $# -eq 3 ]; then
    BZIMAGE=$1
    INITRAMFS=$2
    DISK=${3:-}
elif [ $# -eq 0 ]; then
    # The last four lines: vmlinux, bzImage, initramfs, root disk.
    out=$("$HERE/build.sh" | tail -n 4)
    BZIMAGE=$(sed -n 2p <<<"$out")
    INITRAMFS=$(sed -n 3p <<<"$out")
    DISK=$(sed -n 4p <<<"$out")
else
    die "usage: $0 [BZIMAGE INITRAMFS [DISK]]"
fi
[ -s "$BZIMAGE" ] || die "no kernel image at $BZIMAGE"
[ -s "$INITRAMFS" ] || die "no initramfs at $INITRAMFS"
[ -z "$DISK" ] || [ -s "$DISK" ] || die "no root disk at $DISK"

NS=minivmm-qemu-$$
WORK=$(mktemp -d)
QEMU_PID=
trap 'stop_guest_run "$QEMU_PID" "$NS" "$WORK"' EXIT
trap 'exit 1' INT TERM

# The host side runs the very binary the initramfs carries (static, so it runs
# here too): both ends speak the same protocol version whatever else shares
# the build cache.
MVPERF=$WORK/mvperf
# read_member FILE MEMBER: one member of the archive on stdout, gzip'ed or not.
read_member() {
    if [ "$(head -c 2 "$1" | od -An -tx1 | tr -d ' ')" = 1f8b ]; then
        zcat "$1" | cpio -i --quiet --to-stdout "$2"
    else
        cpio -i --quiet --to-stdout "$2" <"$1"
    fi
}
read_member "$INITRAMFS" bin/mvperf >"$MVPERF" 2>/dev/null || true
[ -s "$MVPERF" ] || die "the initramfs $INITRAMFS has no bin/mvperf"
chmod +x "$MVPERF"

# microvm has virtio-mmio transports and appends their virtio_mmio.device=
# words to the command line itself; acpi=off keeps every IRQ on the legacy
# controllers, which the ACPI-less guest kernel can find. microvm has no
# keyboard controller, so add one: `reboot=k` resets through it (as on minivmm)
# and -no-reboot turns that reset into qemu exiting 0.
# shellcheck disable=SC2054 # commas belong to qemu option values
QEMU_NO_INITRD=("${QEMU_BIN[@]}" -M microvm,acpi=off -accel tcg -cpu max -m 256 -smp 1
    -display none -monitor none -no-reboot -device i8042 -kernel "$BZIMAGE")
QEMU=("${QEMU_NO_INITRD[@]}" -initrd "$INITRAMFS")
BASE_CMDLINE="console=ttyS0 reboot=k panic=-1"

# wait_for LOG PATTERN PID: waits until LOG has a line matching PATTERN;
# fails when the process PID ends first or the guest stalls (`stalled` in
# common.sh: the log has not grown for BOOT_TIMEOUT seconds, or three times
# that in all).
wait_for() {
    local log=$1 pattern=$2 pid=$3
    progress_start
    while ! grep -qsE "$pattern" "$log"; do
        if ! kill -0 "$pid" 2>/dev/null; then
            log "qemu ended before '$pattern' appeared"
            return 1
        fi
        if stalled "$log" "$BOOT_TIMEOUT"; then
            log "no '$pattern'"
            return 1
        fi
        sleep 0.1
    done
}

fail() {
    local log=${2:-}
    log "FAIL: $1"
    if [ -n "$log" ] && [ -f "$log" ]; then
        log "last serial lines:"
        tail -n 30 "$log" >&2
    fi
    exit 1
}

now_ms() { date +%s%3N; }

# --- 1. marker and reset --------------------------------------------------
log "boot 1: init prints MINIVMM-READY and resets the VM"
LOG1=$WORK/boot1.log
start=$(now_ms)
"${QEMU[@]}" -serial "file:$LOG1" -append "$BASE_CMDLINE" </dev/null >"$WORK/qemu1.out" 2>&1 &
QEMU_PID=$!
wait_for "$LOG1" 'MINIVMM-READY' "$QEMU_PID" || fail "no ready marker" "$LOG1"
log "MINIVMM-READY after $(( $(now_ms) - start )) ms"
# The reset comes right after; the same progress bound as the boot.
progress_start
while kill -0 "$QEMU_PID" 2>/dev/null && ! stalled "$LOG1" "$BOOT_TIMEOUT"; do
    sleep 0.1
done
kill -0 "$QEMU_PID" 2>/dev/null && fail "the guest did not reset after the marker" "$LOG1"
rc=0
wait "$QEMU_PID" || rc=$?
QEMU_PID=
[ "$rc" -eq 0 ] || fail "qemu exited with status $rc: $(cat "$WORK/qemu1.out")" "$LOG1"
log "boot 1 passed: reset after $(( $(now_ms) - start )) ms, qemu exited 0"

# --- 2. serve over a TAP in a private namespace ------------------------------
log "boot 2: serve mode on a TAP in namespace $NS"
ip netns add "$NS"
nsx() { ip netns exec "$NS" "$@"; }
nsx ip link set lo up
nsx ip tuntap add dev tap0 mode tap
# A short queue: UDP_STREAM outruns the guest, and a long backlog would hold
# the test's control message back past the client's grace period.
nsx ip link set tap0 txqueuelen 64
nsx ip addr add "$HOST_IP/$PREFIX" dev tap0
nsx ip link set tap0 up

LOG2=$WORK/boot2.log
CMDLINE="$BASE_CMDLINE minivmm.mode=serve minivmm.ip=$GUEST_IP/$PREFIX"
CMDLINE="$CMDLINE ip=$GUEST_IP::$HOST_IP:255.255.255.0::eth0:off"
start=$(now_ms)
# Not through nsx: a backgrounded function is a subshell, and $! must be the
# process that becomes qemu (ip netns exec execs it) so the EXIT trap can end it.
ip netns exec "$NS" "${QEMU[@]}" -serial "file:$LOG2" -append "$CMDLINE" \
    -netdev tap,id=net0,ifname=tap0,script=no,downscript=no \
    -device virtio-net-device,netdev=net0,mac=52:54:00:00:00:02 \
    </dev/null >"$WORK/qemu2.out" 2>&1 &
QEMU_PID=$!
wait_for "$LOG2" 'MINIVMM-SERVING|MINIVMM-ERROR' "$QEMU_PID" || fail "guest did not start serving" "$LOG2"
grep -q 'MINIVMM-ERROR' "$LOG2" && fail "init reported an error" "$LOG2"
log "MINIVMM-SERVING after $(( $(now_ms) - start )) ms"
grep -m1 'Kernel command line' "$LOG2" >&2 || true

nsx ping -c 3 -w 30 "$GUEST_IP" >&2 || fail "ping $GUEST_IP failed" "$LOG2"
log "ping passed"

failures=0
# mvperf's own waits follow progress (60 s without any fails it) and cap its
# run at -l + 10 graces; `timeout` only bounds a tool that hangs past that.
for t in "${TESTS[@]}"; do
    log "mvperf -t $t -H $GUEST_IP -l $TEST_SECONDS --json"
    if ! nsx timeout "$((TEST_SECONDS + 11 * 60))" "$MVPERF" -t "$t" -H "$GUEST_IP" -l "$TEST_SECONDS" \
        --grace 60 --udp-timeout-ms 2000 --json >"$WORK/$t.json" 2>"$WORK/$t.err"; then
        cat "$WORK/$t.err" >&2
        log "FAIL: $t: mvperf exited non-zero"
        failures=$((failures + 1))
        continue
    fi
    cat "$WORK/$t.json"
    case $t in
        *_RR) field=transactions_per_s ;;
        *) field=throughput_mbps ;;
    esac
    value=$(grep -oE "\"$field\"[[:space:]]*:[[:space:]]*[0-9.eE+-]+" "$WORK/$t.json" | head -n 1 | sed 's/.*://' | tr -d ' ')
    if [ -z "$value" ] || ! awk -v v="$value" 'BEGIN { exit !(v > 0) }'; then
        log "FAIL: $t: no traffic ($field=${value:-missing})"
        failures=$((failures + 1))
    fi
done
kill -0 "$QEMU_PID" 2>/dev/null || fail "qemu died during the tests" "$LOG2"
grep -q 'MINIVMM-ERROR' "$LOG2" && fail "guest reported an error during the tests" "$LOG2"
[ "$failures" -eq 0 ] || fail "$failures mvperf test(s) failed" "$LOG2"
kill "$QEMU_PID"
wait "$QEMU_PID" 2>/dev/null || true
QEMU_PID=
log "boot 2 passed"

if [ -z "$DISK" ]; then
    log "no root disk given: boots 3 and 4 skipped"
    log "PASS"
    exit 0
fi
ensure_packages e2fsprogs

# disk_pattern SEED: the bytes init writes for minivmm.disk=write:SEED, made
# by the init's own function (run by the host's busybox, which the image
# carries too).
disk_pattern() {
    busybox sh -c "$(sed -n '/^disk_pattern() {$/,/^}$/p' "$HERE/initramfs/init"); disk_pattern $1"
}

# --- 3. the root disk, read-write, serving ---------------------------------
log "boot 3: root disk (a copy, read-write) in serve mode, writing the test file"
RW=$WORK/rootfs-rw.ext4
cp --sparse=always "$DISK" "$RW"
SEED=qemu$$
LOG3=$WORK/boot3.log
CMDLINE="$BASE_CMDLINE root=/dev/vda rw minivmm.mode=serve minivmm.disk=write:$SEED"
CMDLINE="$CMDLINE ip=$GUEST_IP::$HOST_IP:255.255.255.0::eth0:off"
start=$(now_ms)
ip netns exec "$NS" "${QEMU_NO_INITRD[@]}" -serial "file:$LOG3" -append "$CMDLINE" \
    -drive "file=$RW,if=none,id=rootfs,format=raw" -device virtio-blk-device,drive=rootfs \
    -netdev tap,id=net0,ifname=tap0,script=no,downscript=no \
    -device virtio-net-device,netdev=net0,mac=52:54:00:00:00:02 \
    </dev/null >"$WORK/qemu3.out" 2>&1 &
QEMU_PID=$!
wait_for "$LOG3" 'MINIVMM-SERVING|MINIVMM-ERROR|MINIVMM-DISK-WRITE FAIL' "$QEMU_PID" ||
    fail "guest did not start serving from the disk" "$LOG3"
grep -qE 'MINIVMM-ERROR|MINIVMM-DISK-WRITE FAIL' "$LOG3" && fail "init reported an error" "$LOG3"
log "MINIVMM-SERVING from the disk after $(( $(now_ms) - start )) ms"
grep -q 'Run /sbin/init as init process' "$LOG3" || fail "the kernel did not run the disk's /sbin/init" "$LOG3"
want=$(grep -o 'MINIVMM-DISK-WRITE ok.*' "$LOG3" | tr -d '\r')
[ "$want" = "MINIVMM-DISK-WRITE ok bytes=$(disk_pattern "$SEED" | wc -c) seed=$SEED" ] ||
    fail "unexpected disk write line: $want" "$LOG3"
nsx ping -c 3 -w 30 "$GUEST_IP" >&2 || fail "ping $GUEST_IP (disk root) failed" "$LOG3"
# The root is read-only since the write: killing the VM leaves it clean.
kill "$QEMU_PID"
wait "$QEMU_PID" 2>/dev/null || true
QEMU_PID=
cmp -s <(debugfs -R 'cat /minivmm-disk-test' "$RW" 2>/dev/null) <(disk_pattern "$SEED") ||
    fail "/minivmm-disk-test in the image is not what init wrote" "$LOG3"
e2fsck -fn "$RW" >&2 || fail "e2fsck -fn finds the disk unclean after the boot" "$LOG3"
log "boot 3 passed: the file is in the image, the file system is clean"

# --- 4. the root disk, read-only --------------------------------------------
log "boot 4: root disk (a copy, read-only), writes must fail"
RO=$WORK/rootfs-ro.ext4
cp --sparse=always "$DISK" "$RO"
before=$(sha256sum <"$RO")
LOG4=$WORK/boot4.log
start=$(now_ms)
"${QEMU_NO_INITRD[@]}" -serial "file:$LOG4" \
    -append "$BASE_CMDLINE root=/dev/vda ro minivmm.disk=readonly" \
    -drive "file=$RO,if=none,id=rootfs,format=raw,readonly=on" -device virtio-blk-device,drive=rootfs \
    </dev/null >"$WORK/qemu4.out" 2>&1 &
QEMU_PID=$!
wait_for "$LOG4" 'MINIVMM-DISK-READONLY' "$QEMU_PID" || fail "no read-only check line" "$LOG4"
grep -m1 'MINIVMM-DISK-READONLY' "$LOG4" >&2
grep -q 'MINIVMM-DISK-READONLY ok' "$LOG4" || fail "the read-only check failed" "$LOG4"
rc=0
wait "$QEMU_PID" || rc=$?
QEMU_PID=
[ "$rc" -eq 0 ] || fail "qemu exited with status $rc: $(cat "$WORK/qemu4.out")" "$LOG4"
[ "$(sha256sum <"$RO")" = "$before" ] || fail "the read-only image changed" "$LOG4"
log "boot 4 passed: EROFS, device write refused, image unchanged, reset after $(( $(now_ms) - start )) ms"

log "PASS"
