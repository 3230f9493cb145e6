#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The README's main job: build everything, boot the guest with
#   minivmm --kernel bzImage --initramfs initramfs --tap tap0
# (with --disk: --disk path=COPY,root=on in place of --initramfs) inside a private network namespace, wait until the mvperf and iperf3
# servers in the guest listen, run iperf3 (TCP both ways) and mvperf
# TCP_STREAM and TCP_RR against them from the host, stop the VM and show the
# results. Any crash line on the guest console (a program's `segfault at`,
# `traps:`, a `general protection` fault, `Kernel panic`) makes it exit 1,
# whatever minivmm's status.
#
# Usage: scripts/boot.sh [--vmlinux] [--disk | --disk-readonly]
#   --vmlinux        boots the ELF kernel instead of the bzImage
#   --disk           boots the ext4 root disk instead of the initramfs:
#                    `--disk path=COPY,root=on` on a copy of the cached image
#                    (the guest may write it; the copy goes at the end)
#   --disk-readonly  the same with `readonly=on`, on the same kind of copy
# All traffic stays inside the namespace this script creates and deletes.
#
# It is also the set-up: before the boot it fetches everything the tests use
# (scripts/host-deps.sh setup: host packages, crates, cargo-mutants, the QEMU
# of the QEMU check; resources/build.sh: the guest image), so that
# scripts/test.sh needs no network afterwards. Its waits on the guest follow
# progress: console silence for MINIVMM_BOOT_TIMEOUT seconds (900) fails the
# boot, and three times that in all.
set -euo pipefail
cd "$(dirname "$0")/.."

KERNEL_KIND=bzImage
ROOT_KIND=initramfs
for arg in "$@"; do
    case "$arg" in
        --vmlinux) KERNEL_KIND=vmlinux ;;
        --disk) ROOT_KIND=disk ;;
        --disk-readonly) ROOT_KIND=disk_readonly ;;
        *)
            echo "usage: $0 [--vmlinux] [--disk | --disk-readonly]" >&2
            exit 1
            ;;
    esac
done
NS=minivmm-demo-$$
HOST_IP=10.0.2.1
GUEST_IP=10.0.2.2
BOOT_TIMEOUT=${MINIVMM_BOOT_TIMEOUT:-900}
TEST_SECONDS=5

# shellcheck source=../resources/common.sh
. resources/common.sh
log() { echo "boot.sh: $*" >&2; }
# The console lines that mean a guest program or the guest kernel crashed
# (the same list as CRASH_MARKERS in tests/src/lib.rs).
CRASH_RE='segfault at|traps:|general protection|Kernel panic'
crashed() { grep -E "$CRASH_RE" "$workdir/console" 2>/dev/null; }
[ "$(id -u)" -eq 0 ] || { log "needs root (network namespace, TAP, /dev/kvm)"; exit 1; }

bash scripts/host-deps.sh setup
# The last four lines: vmlinux, bzImage, initramfs, root disk.
images=$(bash resources/build.sh | tail -n 4)
vmlinux=$(sed -n 1p <<<"$images")
bzimage=$(sed -n 2p <<<"$images")
initramfs=$(sed -n 3p <<<"$images")
disk=$(sed -n 4p <<<"$images")
kernel=$bzimage
[ "$KERNEL_KIND" = vmlinux ] && kernel=$vmlinux
cargo build --release -p vmm -p netperf >&2
# Where cargo put them (CARGO_TARGET_DIR moves its output).
bin=${CARGO_TARGET_DIR:-target}/release

workdir=$(mktemp -d)
vmm_pid=
trap 'stop_guest_run "$vmm_pid" "$NS" "$workdir"' EXIT
trap 'exit 1' INT TERM

ip netns add "$NS"
ip -n "$NS" link set lo up
ip -n "$NS" tuntap add dev tap0 mode tap
ip -n "$NS" addr add "$HOST_IP/24" dev tap0
ip -n "$NS" link set tap0 up

# The guest's root: the initramfs, or a copy of the cached disk image (the
# cache's own stays as built for every later boot and test). minivmm adds
# root=/dev/vda rw|ro for a root drive.
case "$ROOT_KIND" in
    initramfs) root_args=(--initramfs "$initramfs") ;;
    disk | disk_readonly)
        cp --sparse=always "$disk" "$workdir/rootfs.ext4"
        drive=path=$workdir/rootfs.ext4,root=on
        [ "$ROOT_KIND" = disk_readonly ] && drive=$drive,readonly=on
        root_args=(--disk "$drive")
        ;;
esac
# A read-only root also shows the guest's own check of it (EROFS).
disk_check=
[ "$ROOT_KIND" = disk_readonly ] && disk_check=minivmm.disk=readonly

# On a PVM-backed KVM host (such as the project's own machines) minivmm adds
# its recoveries to the guest command line by itself and logs them.
log "minivmm --kernel $KERNEL_KIND ${root_args[*]} --tap tap0 (in namespace $NS)"
start=$SECONDS
ip netns exec "$NS" "$bin/minivmm" --kernel "$kernel" "${root_args[@]}" --tap tap0 \
    --metrics "$workdir/metrics.json" --log-level info \
    --cmdline "minivmm.mode=serve ${disk_check:+$disk_check }ip=$GUEST_IP::$HOST_IP:255.255.255.0:guest:eth0:off" \
    </dev/null > >(tee "$workdir/console") &
vmm_pid=$!

progress_start
until grep -q MINIVMM-SERVING "$workdir/console" 2>/dev/null; do
    if grep -qE 'MINIVMM-ERROR|MINIVMM-DISK-[A-Z]+ FAIL' "$workdir/console" 2>/dev/null; then
        log "the guest's init reported an error (see above)"
        exit 1
    fi
    if crashed >/dev/null; then
        log "a guest program or the guest kernel crashed: $(crashed | head -n 3)"
        exit 1
    fi
    if ! kill -0 "$vmm_pid" 2>/dev/null; then
        status=0
        wait "$vmm_pid" || status=$?
        vmm_pid=
        log "minivmm exited with status $status before the guest served"
        [ "$status" -eq 3 ] && log "the guest kernel panicked; on a PVM-backed host its kernel needs resources/kernel/pvm-syscall-fixup.patch (rebuild with resources/build.sh)"
        exit 1
    fi
    if stalled "$workdir/console" "$BOOT_TIMEOUT"; then
        log "guest not serving after $((SECONDS - start)) s"
        exit 1
    fi
    sleep 1
done
log "guest serving after $((SECONDS - start)) s; pinging it from the host side"
ip netns exec "$NS" ping -c 3 -w 30 -s 1472 "$GUEST_IP" >&2
# The guest's iperf3 -s takes one client at a time and prints this line each
# time it is ready for the next; an emulated guest takes seconds, and a
# client that comes earlier is reset. A wait that stalls (120 s without a
# console byte) goes on to the client anyway.
iperf3_clients=0
wait_iperf3_listening() {
    progress_start
    while [ "$(grep -c 'Server listening on 5201' "$workdir/console")" -le "$iperf3_clients" ] &&
        ! stalled "$workdir/console" 120; do
        sleep 1
    done
    iperf3_clients=$((iperf3_clients + 1))
}
# iperf3 has no overall deadline of its own: its receive idle timeout (120 s
# by default) fails a run whose data stops, and `timeout` caps a run at 15
# minutes.
for dir in "" -R; do
    wait_iperf3_listening
    log "iperf3 -c $GUEST_IP -t $TEST_SECONDS $dir (Debian's iperf3 on the host against iperf3 -s in the guest)"
    ip netns exec "$NS" timeout 900 iperf3 -c "$GUEST_IP" -t "$TEST_SECONDS" ${dir:+"$dir"} \
        >"$workdir/iperf3$dir.txt"
done
for t in TCP_STREAM TCP_RR; do
    log "mvperf -t $t -H $GUEST_IP -l $TEST_SECONDS (host -> guest through minivmm's virtio-net)"
    ip netns exec "$NS" "$bin/mvperf" -t "$t" -H "$GUEST_IP" -l "$TEST_SECONDS" --grace 60 \
        >"$workdir/$t.txt"
done
kill -USR1 "$vmm_pid"
sleep 1
log "device metrics: $(cat "$workdir/metrics.json")"
kill -TERM "$vmm_pid"
status=0
wait "$vmm_pid" || status=$?
vmm_pid=
log "minivmm exited with status $status"
if [ -e /sys/module/kvm_pvm ]; then
    log "note: this host's KVM is PVM-backed and runs the guest kernel instruction-emulated;"
    log "      the figures below prove the path works, they do not measure its speed"
fi
if crashed >/dev/null; then
    log "FAILED: the guest console has crash lines:"
    crashed >&2
    status=1
fi
echo "iperf3 host -> guest:"
cat "$workdir/iperf3.txt"
echo "iperf3 guest -> host (-R):"
cat "$workdir/iperf3-R.txt"
cat "$workdir/TCP_STREAM.txt" "$workdir/TCP_RR.txt"
exit "$status"
