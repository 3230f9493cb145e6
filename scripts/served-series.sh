#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# A series of served boots in a row, for the question "does guest userspace
# ever crash on this machine?": each boot runs the served guest
# (minivmm.mode=serve) on a TAP in a private namespace, runs mvperf TCP_RR
# and iperf3 TCP against it from the host, stops the VM with SIGTERM and
# counts the crash lines on its console (`segfault at`, `traps:`,
# `general protection`, `Kernel panic`). The first half of the boots use 1
# vCPU, the second half 2. One line per boot, then a summary; exit 1 if any
# boot crashed, failed to serve or had a test fail.
#
# Usage: scripts/served-series.sh [COUNT] [LOGDIR]
#   COUNT   boots in all (default 30: 15 with 1 vCPU, 15 with 2)
#   LOGDIR  where each boot's console and results are kept (default: a new
#           temporary directory, printed at the end)
# MINIVMM_KERNEL overrides the guest kernel (default: the cached vmlinux);
# MINIVMM_SERIES_VCPUS=N gives every boot N vCPUs (two series, one per vCPU
# count, can then run side by side: each boot has its own namespace).
# All traffic stays inside the namespace each boot creates and deletes.
# Waits on a guest follow progress (`stalled` in resources/common.sh): console
# silence for MINIVMM_BOOT_TIMEOUT seconds (900) fails a boot, and three times
# that in all.
set -euo pipefail
cd "$(dirname "$0")/.."

COUNT=${1:-30}
LOGDIR=${2:-$(mktemp -d -t minivmm-series.XXXXXX)}
HOST_IP=10.0.2.1
GUEST_IP=10.0.2.2
BOOT_TIMEOUT=${MINIVMM_BOOT_TIMEOUT:-900}
CRASH_RE='segfault at|traps:|general protection|Kernel panic'

# shellcheck source=../resources/common.sh
. resources/common.sh
log() { echo "served-series.sh: $*" >&2; }
[ "$(id -u)" -eq 0 ] || { log "needs root (network namespace, TAP, /dev/kvm)"; exit 1; }
case "$COUNT" in '' | *[!0-9]*) log "COUNT must be a number, not '$COUNT'"; exit 1 ;; esac
mkdir -p "$LOGDIR"

bash scripts/host-deps.sh boot
images=$(bash resources/build.sh | tail -n 4)
kernel=${MINIVMM_KERNEL:-$(sed -n 1p <<<"$images")}
initramfs=$(sed -n 3p <<<"$images")
cargo build --release -p vmm -p netperf >&2
bin=${CARGO_TARGET_DIR:-target}/release

NS=
vmm_pid=
cleanup_boot() {
    if [ -n "$vmm_pid" ]; then
        kill "$vmm_pid" 2>/dev/null || true
        wait "$vmm_pid" 2>/dev/null || true
        vmm_pid=
    fi
    [ -z "$NS" ] || ip netns del "$NS" 2>/dev/null || true
    NS=
}
trap cleanup_boot EXIT
trap 'exit 1' INT TERM

# json_field FILE a.b.c [SCALE]: one number out of a JSON file, or "?".
json_field() {
    python3 - "$@" <<'PY' 2>/dev/null || echo "?"
import json, sys
v = json.load(open(sys.argv[1]))
for k in sys.argv[2].split("."):
    v = v[k]
print("%.2f" % (float(v) * float(sys.argv[3] if len(sys.argv) > 3 else 1)))
PY
}

# One boot, in this shell (so that the EXIT trap sees its VM and namespace):
# writes "vcpus serve_s tcp_rr iperf3_mbit crashes status verdict" to
# $LOGDIR/boot-N/result.
one_boot() {
    local n=$1 vcpus=$2 dir=$LOGDIR/boot-$1
    mkdir -p "$dir"
    NS=minivmm-series-$$-$n
    ip netns add "$NS"
    ip -n "$NS" link set lo up
    ip -n "$NS" tuntap add dev tap0 mode tap
    ip -n "$NS" addr add "$HOST_IP/24" dev tap0
    ip -n "$NS" link set tap0 up
    local start=$SECONDS verdict=ok rr=- ip3=- served=-
    ip netns exec "$NS" "$bin/minivmm" --kernel "$kernel" --initramfs "$initramfs" \
        --vcpus "$vcpus" --mem 256 --tap tap0 --log-level info \
        --cmdline "minivmm.mode=serve ip=$GUEST_IP::$HOST_IP:255.255.255.0:guest:eth0:off" \
        </dev/null >"$dir/console" 2>"$dir/minivmm.log" &
    vmm_pid=$!
    progress_start
    while ! grep -q MINIVMM-SERVING "$dir/console"; do
        if grep -qE "MINIVMM-ERROR|$CRASH_RE" "$dir/console" || ! kill -0 "$vmm_pid" 2>/dev/null ||
            stalled "$dir/console" "$BOOT_TIMEOUT"; then
            verdict=not-served
            break
        fi
        sleep 1
    done
    if [ $verdict = ok ]; then
        served=$((SECONDS - start))
        if ip netns exec "$NS" "$bin/mvperf" -t TCP_RR -H "$GUEST_IP" -l 5 --grace 60 --json \
            >"$dir/tcp_rr.json" 2>"$dir/tcp_rr.err"; then
            rr=$(json_field "$dir/tcp_rr.json" transactions_per_s)
        else
            verdict=tcp_rr-failed
        fi
        # The guest's iperf3 -s may still be starting: its line says when it
        # listens (a wait that stalls 120 s goes on to the client anyway).
        progress_start
        until grep -q 'Server listening on 5201' "$dir/console" || stalled "$dir/console" 120; do
            sleep 1
        done
        # iperf3's receive idle timeout (120 s) fails a run whose data stops;
        # `timeout` caps it.
        if ip netns exec "$NS" timeout 900 iperf3 -c "$GUEST_IP" -t 3 --json >"$dir/iperf3.json" 2>&1; then
            ip3=$(json_field "$dir/iperf3.json" end.sum_received.bits_per_second 1e-6)
        else
            [ $verdict = ok ] && verdict=iperf3-failed
        fi
    fi
    kill -TERM "$vmm_pid" 2>/dev/null || true
    local status=0
    wait "$vmm_pid" || status=$?
    vmm_pid=
    ip netns del "$NS" 2>/dev/null || true
    NS=
    local crashes
    crashes=$(grep -cE "$CRASH_RE" "$dir/console" || true)
    [ "$crashes" -eq 0 ] || verdict=crashed
    [ "$status" -eq 0 ] || [ $verdict != ok ] || verdict=exit-$status
    echo "$vcpus $served $rr $ip3 $crashes $status $verdict" >"$dir/result"
}

log "$COUNT served boots of $kernel; consoles in $LOGDIR"
printf '%-4s %-5s %-8s %-8s %-10s %-7s %-6s %s\n' boot vcpus serve_s tcp_rr/s iperf3_Mb crashes status verdict
failed=0
crashed=0
for n in $(seq 1 "$COUNT"); do
    vcpus=1
    [ "$n" -gt $((COUNT / 2)) ] && vcpus=2
    vcpus=${MINIVMM_SERIES_VCPUS:-$vcpus}
    one_boot "$n" "$vcpus"
    read -r v served rr ip3 crashes status verdict <"$LOGDIR/boot-$n/result"
    printf '%-4s %-5s %-8s %-8s %-10s %-7s %-6s %s\n' "$n" "$v" "$served" "$rr" "$ip3" "$crashes" "$status" "$verdict"
    [ "$verdict" = ok ] || failed=$((failed + 1))
    [ "$crashes" -eq 0 ] || crashed=$((crashed + 1))
    if [ "$crashes" -ne 0 ]; then
        grep -E "$CRASH_RE" "$LOGDIR/boot-$n/console" | head -n 3 | sed 's/^/    /'
    fi
done
echo "summary: $COUNT boots, $((COUNT - failed)) ok, $crashed with crash lines, $failed failed; CPU: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'); host kernel $(uname -r); consoles in $LOGDIR"
[ "$failed" -eq 0 ]
