#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The README's main job: build everything, boot the guest with
#   minivmm --kernel bzImage --initramfs initramfs --tap tap0
# inside a private network namespace, wait until the mvperf and iperf3
# servers in the guest listen, run iperf3 (TCP both ways) and mvperf
# TCP_STREAM and TCP_RR against them from the host, stop the VM and show the
# results. Any crash line on the guest console (a program's `segfault at`,
# `traps:`, a `general protection` fault, `Kernel panic`) makes it exit 1,
# whatever minivmm's status.
#
# Usage: scripts/boot.sh [--vmlinux]   (--vmlinux boots the ELF kernel instead)
# All traffic stays inside the namespace this script creates and deletes.
set -euo pipefail
cd "$(dirname "$0")/.."

KERNEL_KIND=bzImage
[ "${1:-}" = "--vmlinux" ] && KERNEL_KIND=vmlinux
NS=minivmm-demo-$$
HOST_IP=10.0.2.1
GUEST_IP=10.0.2.2
BOOT_TIMEOUT=${MINIVMM_BOOT_TIMEOUT:-900}
TEST_SECONDS=5

log() { echo "boot.sh: $*" >&2; }
# The console lines that mean a guest program or the guest kernel crashed
# (the same list as CRASH_MARKERS in tests/src/lib.rs).
CRASH_RE='segfault at|traps:|general protection|Kernel panic'
crashed() { grep -E "$CRASH_RE" "$workdir/console" 2>/dev/null; }
[ "$(id -u)" -eq 0 ] || { log "needs root (network namespace, TAP, /dev/kvm)"; exit 1; }

bash scripts/host-deps.sh boot
images=$(bash resources/build.sh)
vmlinux=$(printf '%s\n' "$images" | tail -n 3 | head -n 1)
bzimage=$(printf '%s\n' "$images" | tail -n 2 | head -n 1)
initramfs=$(printf '%s\n' "$images" | tail -n 1)
kernel=$bzimage
[ "$KERNEL_KIND" = vmlinux ] && kernel=$vmlinux
cargo build --release -p vmm -p netperf >&2
# Where cargo put them (CARGO_TARGET_DIR moves its output).
bin=${CARGO_TARGET_DIR:-target}/release

workdir=$(mktemp -d)
vmm_pid=
cleanup() {
    if [ -n "$vmm_pid" ]; then
        kill "$vmm_pid" 2>/dev/null || true
        wait "$vmm_pid" 2>/dev/null || true
    fi
    ip netns del "$NS" 2>/dev/null || true
    rm -rf "$workdir"
}
trap cleanup EXIT
trap 'exit 1' INT TERM

ip netns add "$NS"
ip -n "$NS" link set lo up
ip -n "$NS" tuntap add dev tap0 mode tap
ip -n "$NS" addr add "$HOST_IP/24" dev tap0
ip -n "$NS" link set tap0 up

# On a PVM-backed KVM host (such as the project's own machines) minivmm adds
# its recoveries to the guest command line by itself and logs them.
log "minivmm --kernel $KERNEL_KIND --initramfs initramfs --tap tap0 (in namespace $NS)"
start=$SECONDS
ip netns exec "$NS" "$bin/minivmm" --kernel "$kernel" --initramfs "$initramfs" --tap tap0 \
    --metrics "$workdir/metrics.json" --log-level info \
    --cmdline "minivmm.mode=serve ip=$GUEST_IP::$HOST_IP:255.255.255.0:guest:eth0:off" \
    </dev/null > >(tee "$workdir/console") &
vmm_pid=$!

deadline=$((SECONDS + BOOT_TIMEOUT))
until grep -q MINIVMM-SERVING "$workdir/console" 2>/dev/null; do
    if grep -q MINIVMM-ERROR "$workdir/console" 2>/dev/null; then
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
    [ $SECONDS -lt $deadline ] || { log "guest not serving after ${BOOT_TIMEOUT}s"; exit 1; }
    sleep 1
done
log "guest serving after $((SECONDS - start)) s; pinging it from the host side"
ip netns exec "$NS" ping -c 3 -w 30 -s 1472 "$GUEST_IP" >&2
# The guest's iperf3 -s takes one client at a time and prints this line each
# time it is ready for the next; an emulated guest takes seconds, and a
# client that comes earlier is reset.
iperf3_clients=0
wait_iperf3_listening() {
    local deadline=$((SECONDS + 120))
    while [ "$(grep -c 'Server listening on 5201' "$workdir/console")" -le "$iperf3_clients" ] &&
        [ $SECONDS -lt $deadline ]; do
        sleep 1
    done
    iperf3_clients=$((iperf3_clients + 1))
}
for dir in "" -R; do
    wait_iperf3_listening
    log "iperf3 -c $GUEST_IP -t $TEST_SECONDS $dir (Debian's iperf3 on the host against iperf3 -s in the guest)"
    ip netns exec "$NS" timeout 180 iperf3 -c "$GUEST_IP" -t "$TEST_SECONDS" ${dir:+"$dir"} \
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
