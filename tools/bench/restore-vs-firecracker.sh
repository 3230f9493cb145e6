#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Snapshot restore, minivmm beside Firecracker, in one run on one machine
# (BENCHMARKS.md, "Snapshot and restore"). Needs root, /dev/net/tun,
# /dev/kvm, a Firecracker binary and a machine with nothing else booting
# guests (the figures are wall-clock).
#
#   FIRECRACKER=PATH bash tools/bench/restore-vs-firecracker.sh [RUNS]
#   bash tools/bench/restore-vs-firecracker.sh --firecracker PATH [RUNS]
#
# RUNS: restores per VMM (default 5). SNAPSHOTS (environment, default 3):
# Full snapshots per VMM, taken from its one boot a few seconds apart
# (paused, snapshotted, resumed); the restores go through them in turn.
# What a restored guest does first depends on the moment it was saved
# (a timer due, work queued), and every restore of one snapshot replays
# that moment, so with one snapshot per VMM the comparison rests on two
# moments. WORK (environment) is where the
# snapshots, consoles and logs go (default: a new temporary directory); the
# snapshots, disks and kernel copy are deleted at the end, the logs kept.
#
# Both VMMs get the same guest and the same client: the project's guest
# kernel and root disk (resources/build.sh), 256 MiB, 1 vCPU, a card on a
# TAP and the entropy device, booted with `minivmm.mode=serve`, configured
# and driven through the same API requests with curl on the API socket.
# In one network namespace the script creates (all traffic stays inside it):
#
# 1. minivmm, then Firecracker: a cold boot (InstanceStart until the guest
#    prints MINIVMM-SERVING), a ping answered, then SNAPSHOTS times: a
#    pause of 2 to 4 s, PATCH /vm Paused, a timed PUT /snapshot/create
#    (Full), PATCH /vm Resumed; the process killed.
# 2. RUNS rounds, minivmm then Firecracker in each: a fresh process on an
#    API socket, PUT /snapshot/load (File backend, resume_vm) timed until
#    its answer (curl's time_total) and, from a clock read just before
#    curl starts, until the guest's first ping reply (ping every 10 ms
#    from just before that, the reply's time taken by `ping -D`), the
#    CPU time of each of its threads (in $WORK/NAME.threads), the process's RSS once that reply came (and of
#    it the guest memory's mapping, from /proc/PID/smaps) and the CPU
#    time its threads had used (the vCPU's running the guest is most of
#    it: on a PVM host the guest kernel is emulated), the process killed.
# 3. A table: per VMM the median, min and max of each restore figure, the
#    cold boot, the create time and the files' sizes; the CPU and the load
#    average before and after.
#
# On a PVM-backed KVM (../shared/HOST-KVM.md in the project notes) the
# guest needs two things minivmm does by itself and Firecracker does not:
# the boot words minivmm adds there (taken from minivmm's own log of its
# boot and given to Firecracker in boot_args, so both guests get the same
# command line), and a way past Linux's boot-time INT3 self-test, whose
# `int3` fails emulation there (minivmm steps over it; Firecracker stops).
# Both VMMs therefore boot a copy of the kernel whose `int3; nop x4` at
# `int3_selftest_ip` is `incl (%rdi); nop x3`: the self-test's handler
# would have incremented that counter, so the test passes the same way.
set -euo pipefail
cd "$(dirname "$0")/../.."

# shellcheck source=../../resources/common.sh
. resources/common.sh
# After common.sh, whose log and die say "resources:".
log() { echo "restore-vs-firecracker.sh: $*" >&2; }
die() {
    log "$*"
    exit 1
}

runs=5
fc=${FIRECRACKER:-}
while [ $# -gt 0 ]; do
    case "$1" in
    --firecracker)
        [ $# -ge 2 ] || die "--firecracker needs a path"
        fc=$2
        shift 2
        ;;
    '' | *[!0-9]*) die "usage: FIRECRACKER=PATH bash $0 [RUNS] (RUNS a number, not '$1')" ;;
    *)
        runs=$1
        shift
        ;;
    esac
done
[ "$runs" -ge 1 ] || die "RUNS must be at least 1"
snapshots=${SNAPSHOTS:-3}
case "$snapshots" in
'' | *[!0-9]* | 0) die "SNAPSHOTS must be a number of at least 1, not '$snapshots'" ;;
esac
[ -n "$fc" ] || die "no Firecracker binary: set FIRECRACKER=PATH or pass --firecracker PATH"
[ -x "$fc" ] || die "$fc is not an executable"
fc=$(realpath "$fc")
[ "$(id -u)" -eq 0 ] || die "needs root (network namespace, TAP, /dev/kvm)"
for tool in ip curl ping python3 nm; do
    command -v "$tool" >/dev/null || die "needs $tool"
done

HOST_IP=10.0.38.1
GUEST_IP=10.0.38.2
GUEST_MAC=06:00:0a:00:26:02
BOOT_TIMEOUT=${MINIVMM_BOOT_TIMEOUT:-900}
BASE_ARGS="console=ttyS0 reboot=k panic=-1 pci=off minivmm.mode=serve \
ip=$GUEST_IP::$HOST_IP:255.255.255.0::eth0:off"

log "building minivmm"
cargo build --quiet --release -p vmm
minivmm=$(realpath "${CARGO_TARGET_DIR:-target}/release/minivmm")
log "guest kernel and root disk (resources/build.sh)"
# The last four lines: vmlinux, bzImage, initramfs, root disk.
images=$(bash resources/build.sh | tail -n 4)
vmlinux=$(sed -n 1p <<<"$images")
rootfs=$(sed -n 4p <<<"$images")

WORK=${WORK:-$(mktemp -d -t minivmm-restore-vs-fc.XXXXXX)}
mkdir -p "$WORK"
WORK=$(realpath "$WORK")
NS=minivmm-fcrestore-$$
vmm_pid=
cleanup() {
    if [ -n "$vmm_pid" ]; then
        kill -KILL "$vmm_pid" 2>/dev/null || true
        wait "$vmm_pid" 2>/dev/null || true
    fi
    ip netns del "$NS" 2>/dev/null || true
    # KEEP_SNAPSHOTS=1 keeps the snapshots and disks, to restore again.
    [ "${KEEP_SNAPSHOTS:-0}" = 1 ] ||
        rm -f "$WORK"/*.mem "$WORK"/*.state "$WORK"/*.ext4 "$WORK/vmlinux"
    rm -f "$WORK"/*.sock
    log "logs in $WORK"
}
trap cleanup EXIT
trap 'exit 1' INT TERM

# patch_int3 IN OUT: OUT is a copy of the ELF kernel IN whose self-test
# `int3; nop x4` is `incl (%rdi); nop x3` (the file offset found from the
# symbol's address and the program headers; refused unless the bytes there
# are the expected ones).
patch_int3() {
    local addr
    addr=$(nm "$1" | awk '$3 == "int3_selftest_ip" { print $1 }')
    [ -n "$addr" ] || die "$1 has no int3_selftest_ip symbol"
    python3 - "$1" "$2" "$addr" <<'PY'
import shutil, struct, sys
src, dst, addr = sys.argv[1], sys.argv[2], int(sys.argv[3], 16)
data = bytearray(open(src, "rb").read())
phoff, = struct.unpack_from("<Q", data, 0x20)
phentsize, phnum = struct.unpack_from("<HH", data, 0x36)
for i in range(phnum):
    p_type, _, p_offset, p_vaddr, _, p_filesz = struct.unpack_from(
        "<IIQQQQ", data, phoff + i * phentsize)
    if p_type == 1 and p_vaddr <= addr < p_vaddr + p_filesz:
        off = p_offset + addr - p_vaddr
        break
else:
    sys.exit("int3_selftest_ip is in no loaded segment")
if data[off:off + 5] != b"\xcc\x90\x90\x90\x90":
    sys.exit("int3_selftest_ip holds %s, not int3; nop x4" % data[off:off + 5].hex())
data[off:off + 5] = b"\xff\x07\x90\x90\x90"
open(dst, "wb").write(data)
PY
}

# api SOCK METHOD PATH [BODY]: one request with curl; prints "STATUS
# SECONDS" (curl's http_code and time_total) and fails unless the status
# is 2xx.
api() {
    local out body=()
    [ $# -ge 4 ] && body=(-H 'Content-Type: application/json' --data-binary "$4")
    out=$(curl -sS --max-time 60 --unix-socket "$1" -X "$2" "${body[@]}" \
        -o "$WORK/answer" -w '%{http_code} %{time_total}' "http://localhost$3") ||
        die "$2 $3: curl failed"
    case "$out" in
    2*) echo "$out" ;;
    *) die "$2 $3 ${4:-}: answered $out: $(cat "$WORK/answer")" ;;
    esac
}

# start VMM NAME [ARGS...]: starts VMM (minivmm or firecracker) inside the
# namespace on the API socket $WORK/NAME.sock, its stdout (the guest's
# console) in $WORK/NAME.out and its stderr in $WORK/NAME.err; sets
# vmm_pid (`ip netns exec` execs the VMM, so that is the VMM's pid) and
# waits for the socket.
start() {
    local bin=$minivmm name=$2
    [ "$1" = firecracker ] && bin=$fc
    shift 2
    rm -f "$WORK/$name.sock"
    ip netns exec "$NS" "$bin" --api-sock "$WORK/$name.sock" --id "$name" "$@" \
        </dev/null >"$WORK/$name.out" 2>"$WORK/$name.err" &
    vmm_pid=$!
    local i
    for i in $(seq 1 2000); do
        [ -S "$WORK/$name.sock" ] && return 0
        kill -0 "$vmm_pid" 2>/dev/null || die "$name exited: $(tail -n 5 "$WORK/$name.err" "$WORK/$name.out")"
        sleep 0.005
    done
    die "$name: no API socket after 10 s"
}

stop() {
    kill -KILL "$vmm_pid" 2>/dev/null || true
    wait "$vmm_pid" 2>/dev/null || true
    vmm_pid=
}

# The words minivmm adds to the guest command line on this host, from its
# log at level Info (none on an ordinary host).
pvm_words=
# boot VMM: cold boot, ping, Full snapshot; writes "boot_s create_ms
# state_bytes mem_bytes mem_allocated_bytes" to $WORK/VMM.boot.
boot() {
    local vmm=$1 s=$WORK/$1-boot.sock args=$BASE_ARGS
    cp "$rootfs" "$WORK/$vmm.ext4"
    [ "$vmm" = firecracker ] && [ -n "$pvm_words" ] && args="$args $pvm_words"
    start "$vmm" "$vmm-boot" --level Info
    api "$s" PUT /machine-config '{"vcpu_count": 1, "mem_size_mib": 256}' >/dev/null
    api "$s" PUT /boot-source "{\"kernel_image_path\": \"$WORK/vmlinux\", \"boot_args\": \"$args\"}" >/dev/null
    api "$s" PUT /drives/rootfs "{\"drive_id\": \"rootfs\", \"path_on_host\": \"$WORK/$vmm.ext4\",
        \"is_root_device\": true, \"is_read_only\": false}" >/dev/null
    api "$s" PUT /network-interfaces/eth0 "{\"iface_id\": \"eth0\", \"host_dev_name\": \"tap0\",
        \"guest_mac\": \"$GUEST_MAC\"}" >/dev/null
    api "$s" PUT /entropy '{}' >/dev/null
    local t0 out=$WORK/$vmm-boot.out
    t0=$(date +%s%N)
    api "$s" PUT /actions '{"action_type": "InstanceStart"}' >/dev/null
    progress_start
    until grep -q MINIVMM-SERVING "$out"; do
        kill -0 "$vmm_pid" 2>/dev/null || die "$vmm exited while booting: $(tail -n 20 "$out" "$WORK/$vmm-boot.err")"
        ! stalled "$out" "$BOOT_TIMEOUT" || die "$vmm: the guest stalled: $(tail -n 20 "$out")"
        sleep 0.05
    done
    local boot_ns=$(($(date +%s%N) - t0))
    if [ "$vmm" = minivmm ]; then
        pvm_words=$(sed -n "s/.*adding '\([^']*\)' to the guest command line.*/\1/p" "$WORK/$vmm-boot.err" | head -n 1)
    fi
    ip netns exec "$NS" ping -n -q -c 1 -i 0.05 -w 120 "$GUEST_IP" >/dev/null ||
        die "$vmm: the served guest answers no ping"
    local i created create_ms=
    for i in $(seq 1 "$snapshots"); do
        # Moments apart: 2 to 4 s of the guest running.
        sleep "$((2 + RANDOM % 3))"
        api "$s" PATCH /vm '{"state": "Paused"}' >/dev/null
        created=$(api "$s" PUT /snapshot/create "{\"snapshot_type\": \"Full\",
            \"snapshot_path\": \"$WORK/$vmm-$i.state\", \"mem_file_path\": \"$WORK/$vmm-$i.mem\"}")
        # The first one's time: the later ones find the memory file's pages cached.
        [ -n "$create_ms" ] || create_ms=${created#* }
        api "$s" PATCH /vm '{"state": "Resumed"}' >/dev/null
    done
    stop
    echo "$boot_ns $create_ms $(stat -c %s "$WORK/$vmm-1.state") $(stat -c '%s %b %B' "$WORK/$vmm-1.mem")" |
        awk '{ printf "%.1f %.1f %d %d %d\n", $1 / 1e9, $2 * 1e3, $3, $4, $5 * $6 }' >"$WORK/$vmm.boot"
    log "$vmm: served after $(cut -d' ' -f1 "$WORK/$vmm.boot") s, $snapshots snapshots taken"
}

# restore VMM ROUND: a restore of the VMM's snapshot number ROUND modulo
# SNAPSHOTS; appends "load_ms first_ping_ms rss_kib rss_anon_kib
# rss_file_kib loadavg_1min guest_mem_rss_kib snapshot cpu_ms" to
# $WORK/VMM.restores.
restore() {
    local vmm=$1 name=$1-r$2 snap=$(($2 % snapshots + 1))
    local s=$WORK/$name.sock mem=$WORK/$1-$snap.mem
    start "$vmm" "$name"
    local pings=$WORK/$name.ping ping_pid t_before out
    # Pings from just before the request, every 10 ms, until one is
    # answered (those sent before the guest runs are lost).
    ip netns exec "$NS" ping -D -n -c 1 -i 0.01 -w 30 "$GUEST_IP" >"$pings" 2>&1 &
    ping_pid=$!
    # Taken before curl starts: the request leaves a few milliseconds later
    # (curl's start), the same for both VMMs. (Counting back from after
    # curl's exit by its time_total overstated when the request left by
    # the time curl took to exit and the shell to fork, tens of
    # milliseconds on a loaded machine: replies came "before" requests.)
    t_before=$(date +%s%N)
    out=$(api "$s" PUT /snapshot/load "{\"snapshot_path\": \"$WORK/$vmm-$snap.state\",
        \"mem_backend\": {\"backend_type\": \"File\", \"backend_path\": \"$mem\"},
        \"resume_vm\": true}")
    wait "$ping_pid" || die "$name: no ping answered within 30 s: $(tail -n 5 "$WORK/$name.err")"
    local rss
    rss=$(awk '/^(VmRSS|RssAnon|RssFile):/ { printf "%s ", $2 }' "/proc/$vmm_pid/status")
    # The guest memory's part: the mapping of the memory file (its
    # private copies of pages the guest wrote included).
    local guest_rss
    guest_rss=$(awk -v f="$mem" '/^[0-9a-f]+-[0-9a-f]+ / { m = ($NF == f) }
        m && /^Rss:/ { s += $2 } END { print s + 0 }' "/proc/$vmm_pid/smaps")
    # utime + stime of all its threads, in clock ticks (after the
    # command's name, which may hold spaces: fields 12 and 13).
    local cpu_ticks
    cpu_ticks=$(sed 's/.*) //' "/proc/$vmm_pid/stat" | awk '{ print $12 + $13 }')
    # The same per thread still running: "name utime stime" (ticks).
    local t
    for t in "/proc/$vmm_pid/task"/*; do
        echo "$(tr ' ' _ <"$t/comm") $(sed 's/.*) //' "$t/stat" | cut -d' ' -f12,13)"
    done >"$WORK/$name.threads"
    kill -0 "$vmm_pid" 2>/dev/null || die "$name exited"
    stop
    # The first reply's time is ping's -D stamp.
    local first
    first=$(sed -n 's/^\[\([0-9.]*\)\] [0-9]* bytes from.*/\1/p' "$pings" | head -n 1)
    [ -n "$first" ] || die "$name: no reply line in $(cat "$pings")"
    echo "${out#* } $t_before $first $rss $(cut -d' ' -f1 /proc/loadavg) $guest_rss $snap $cpu_ticks" |
        awk -v hz="$(getconf CLK_TCK)" '{
            printf "%.1f %.1f %d %d %d %s %d %d %d\n", $1 * 1e3, ($3 - $2 / 1e9) * 1e3, $4, $5, $6, $7, $8, $9,
                $10 * 1000 / hz }' \
            >>"$WORK/$vmm.restores"
    log "$name: $(tail -n 1 "$WORK/$vmm.restores") (load ms, first ping ms, RSS KiB, anon, file; load average; guest memory RSS KiB; snapshot; CPU ms)"
}

# stats FILE COLUMN: "median min max" of one column.
stats() {
    cut -d' ' -f"$2" "$1" | sort -g | awk '{ v[NR] = $1 } END {
        m = NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2
        printf "%.1f (%.1f-%.1f)", m, v[1], v[NR] }'
}

load_before=$(cut -d' ' -f1-3 /proc/loadavg)
log "kernel copy with the INT3 self-test patched: $WORK/vmlinux"
patch_int3 "$vmlinux" "$WORK/vmlinux"
ip netns add "$NS"
ip -n "$NS" link set lo up
ip -n "$NS" tuntap add dev tap0 mode tap
ip -n "$NS" addr add "$HOST_IP/24" dev tap0
ip -n "$NS" link set tap0 up
rm -f "$WORK"/*.restores
boot minivmm
boot firecracker
for round in $(seq 1 "$runs"); do
    restore minivmm "$round"
    restore firecracker "$round"
done
load_after=$(cut -d' ' -f1-3 /proc/loadavg)

echo "Restore of a Full snapshot, 256 MiB, 1 vCPU, served guest; $runs restores per VMM, interleaved, of $snapshots snapshots each"
echo "CPU: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(nproc) cores; host kernel $(uname -r)"
echo "load average before: $load_before; after: $load_after"
echo "minivmm: $(git rev-parse --short HEAD); firecracker: $("$fc" --version 2>/dev/null | head -n 1)"
echo
echo "| figure | minivmm | Firecracker |"
echo "|---|---|---|"
row() { echo "| $1 | $2 | $3 |"; }
field() { cut -d' ' -f"$2" "$WORK/$1.boot"; }
row "cold boot, InstanceStart to MINIVMM-SERVING (s)" "$(field minivmm 1)" "$(field firecracker 1)"
row "PUT /snapshot/create, Full (ms)" "$(field minivmm 2)" "$(field firecracker 2)"
row "state file (bytes)" "$(field minivmm 3)" "$(field firecracker 3)"
row "memory file (bytes; allocated)" "$(field minivmm 4); $(field minivmm 5)" "$(field firecracker 4); $(field firecracker 5)"
for col in "1:PUT /snapshot/load answered (ms), median (min-max)" \
    "2:first ping reply, from just before the load request (ms)" \
    "3:RSS after the first ping (KiB)" "4:of it anonymous (KiB)" "5:of it file-backed (KiB)" \
    "7:of it the guest memory's mapping (KiB)" \
    "9:CPU time of the process until the first ping (ms, in clock ticks)" \
    "6:load average (1 min) at the restores"; do
    row "${col#*:}" "$(stats "$WORK/minivmm.restores" "${col%%:*}")" "$(stats "$WORK/firecracker.restores" "${col%%:*}")"
done
echo
echo "| first ping reply by snapshot (ms), median (min-max) | minivmm | Firecracker |"
echo "|---|---|---|"
by_snapshot() { awk -v n="$2" '$8 == n' "$WORK/$1.restores" >"$WORK/$1.snap$2"; stats "$WORK/$1.snap$2" 2; }
for i in $(seq 1 "$snapshots"); do
    [ "$runs" -ge "$i" ] || break
    row "snapshot $i" "$(by_snapshot minivmm "$i")" "$(by_snapshot firecracker "$i")"
done

# Whether a difference is shown, not just seen: for the load's answer and the
# first ping, the difference of the medians (minivmm minus Firecracker) with
# a 95 % bootstrap interval (10,000 resamples of each VMM's restores, a fixed
# seed), and how often a minivmm restore beats a Firecracker one (the
# Mann-Whitney U over all pairs, ties counted half). A difference is shown
# when its interval leaves out zero.
echo
echo "| figure | median difference, minivmm - Firecracker (ms) | 95 % interval | minivmm sooner in |"
echo "|---|---|---|---|"
python3 - "$WORK/minivmm.restores" "$WORK/firecracker.restores" <<'PY'
import random
import statistics
import sys

def column(path, i):
    with open(path) as f:
        return [float(line.split()[i]) for line in f if line.strip()]

rng = random.Random(38)
for i, name in [(0, "PUT /snapshot/load answered"), (1, "first ping reply")]:
    a, b = column(sys.argv[1], i), column(sys.argv[2], i)
    diff = statistics.median(a) - statistics.median(b)
    boot = sorted(
        statistics.median(rng.choices(a, k=len(a))) - statistics.median(rng.choices(b, k=len(b)))
        for _ in range(10_000)
    )
    lo, hi = boot[249], boot[9_749]
    wins = sum(1.0 if x < y else 0.5 if x == y else 0.0 for x in a for y in b)
    print(f"| {name} | {diff:+.1f} | {lo:+.1f} to {hi:+.1f} | {100 * wins / (len(a) * len(b)):.0f} % of pairs |")
PY
