#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# User-space instructions per unit of each vsock cell, the device against the
# raw relay, counted by callgrind (stable however loaded the machine is,
# unlike the times of `netbench --scenario vsock`). Needs valgrind; no root.
#
#   bash tools/bench/callgrind-vsock.sh [CELL...]
#
# For each cell and side, runs `netbench --vsock-cost` under callgrind at two
# sizes and prints (Ir(N2) - Ir(N1)) / (units between them) for the measured
# thread (callgrind's thread 1: the device and its driver, or the relay),
# which cancels start-up and tear-down. A unit is a packet for the streams
# (4 KiB or 64 KiB) and a transaction for rr_1. Kernel work (the copies of
# the socket calls) is not counted: `strace -c -f` of the same runs counts
# the calls (BENCHMARKS.md).
set -euo pipefail
cd "$(dirname "$0")/../.."
cells=("$@")
[ ${#cells[@]} -gt 0 ] || cells=(tx_4k tx_64k rx_4k rr_1)
cargo build --quiet --release -p netbench
bin=target/release/netbench
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

unit_bytes() { # cell -> bytes a unit (netbench counts bytes for the streams)
    case $1 in tx_4k | rx_4k) echo 4096 ;; tx_64k) echo 65536 ;; rr_1) echo 1 ;; esac
}

thread_ir() { # cell side units -> Ir of thread 1
    valgrind --tool=callgrind --separate-threads=yes \
        --callgrind-out-file="$out/cg" "$bin" --vsock-cost "$1" "$2" "$3" \
        >/dev/null 2>"$out/log" || { cat "$out/log" >&2; exit 1; }
    awk '/^(summary|totals):/ {print $2; exit}' "$out/cg-01"
}

printf '%-7s %14s %14s %7s\n' cell 'device Ir/unit' 'raw Ir/unit' ratio
for cell in "${cells[@]}"; do
    ub=$(unit_bytes "$cell")
    [ -n "$ub" ] || { echo "unknown cell $cell (tx_4k tx_64k rx_4k rr_1)" >&2; exit 2; }
    n1=${N1:-2000} n2=${N2:-10000}
    per=()
    for side in device raw; do
        a=$(thread_ir "$cell" "$side" $((n1 * ub)))
        b=$(thread_ir "$cell" "$side" $((n2 * ub)))
        per+=($(((b - a) / (n2 - n1))))
    done
    printf '%-7s %14d %14d %7s\n' "$cell" "${per[0]}" "${per[1]}" \
        "$(awk -v d="${per[0]}" -v r="${per[1]}" 'BEGIN { printf "%.1f", d / r }')"
done
