#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The README's main job: build everything, boot the guest with
#   minivmm --kernel bzImage --initramfs initramfs --tap tap0
# inside a private network namespace, show it on the network, stop it.
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
BOOT_TIMEOUT=${MINIVMM_BOOT_TIMEOUT:-600}

log() { echo "boot.sh: $*" >&2; }
[ "$(id -u)" -eq 0 ] || { log "needs root (network namespace, TAP, /dev/kvm)"; exit 1; }

bash scripts/host-deps.sh
images=$(bash resources/build.sh)
vmlinux=$(printf '%s\n' "$images" | tail -n 3 | head -n 1)
bzimage=$(printf '%s\n' "$images" | tail -n 2 | head -n 1)
initramfs=$(printf '%s\n' "$images" | tail -n 1)
kernel=$bzimage
[ "$KERNEL_KIND" = vmlinux ] && kernel=$vmlinux
cargo build --release -p vmm -p netperf >&2
bin=target/release

workdir=$(mktemp -d)
vmm_pid=
cleanup() {
    [ -n "$vmm_pid" ] && kill "$vmm_pid" 2>/dev/null && wait "$vmm_pid" 2>/dev/null
    ip netns del "$NS" 2>/dev/null || true
    rm -rf "$workdir"
}
trap cleanup EXIT INT TERM

ip netns add "$NS"
ip -n "$NS" link set lo up
ip -n "$NS" tuntap add dev tap0 mode tap
ip -n "$NS" addr add "$HOST_IP/24" dev tap0
ip -n "$NS" link set tap0 up

if [ -e /sys/module/kvm_pvm ]; then
    log "PVM-backed KVM: guest userspace cannot run here; parking the guest (rdinit=/park)"
    mode=rdinit=/park
    # The 10 KB park image beside the main one: unpacking 4 MB in an
    # emulated guest kernel costs half a minute a parked guest does not need.
    initramfs=$(dirname "$initramfs")/minivmm-park.cpio
    serving="Run /park as init process"
else
    mode=minivmm.mode=serve
    serving=MINIVMM-SERVING
fi

log "minivmm --kernel $KERNEL_KIND --initramfs initramfs --tap tap0 (in namespace $NS)"
ip netns exec "$NS" "$bin/minivmm" --kernel "$kernel" --initramfs "$initramfs" --tap tap0 \
    --metrics "$workdir/metrics.json" --log-level info \
    --cmdline "$mode ip=$GUEST_IP::$HOST_IP:255.255.255.0:guest:eth0:off" \
    </dev/null > >(tee "$workdir/console") &
vmm_pid=$!

deadline=$((SECONDS + BOOT_TIMEOUT))
until grep -q "$serving" "$workdir/console" 2>/dev/null; do
    kill -0 "$vmm_pid" 2>/dev/null || { log "minivmm exited before the guest was up"; exit 1; }
    [ $SECONDS -lt $deadline ] || { log "guest not up after ${BOOT_TIMEOUT}s"; exit 1; }
    sleep 1
done
log "guest is up after ${SECONDS}s; pinging it from the host side"
ip netns exec "$NS" ping -c 3 -s 1472 "$GUEST_IP" >&2
if [ "$mode" = minivmm.mode=serve ]; then
    ip netns exec "$NS" "$bin/mvperf" -t TCP_STREAM -H "$GUEST_IP" -l 5 >&2
    ip netns exec "$NS" "$bin/mvperf" -t TCP_RR -H "$GUEST_IP" -l 5 >&2
fi
kill -USR1 "$vmm_pid"
sleep 1
log "device metrics: $(cat "$workdir/metrics.json")"
kill -TERM "$vmm_pid"
wait "$vmm_pid" && status=0 || status=$?
vmm_pid=
log "minivmm exited with status $status"
exit "$status"
