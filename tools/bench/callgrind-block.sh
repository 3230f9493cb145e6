#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Instructions per request of the block scenario, counted by callgrind
# (stable on a noisy machine, unlike time), and system calls per request
# (strace). Needs valgrind and strace; no root.
#
#   bash tools/bench/callgrind-block.sh [WORKLOAD...]
#
# For each workload and mode (the device with each engine, and the raw
# loop) it runs `netbench --block-cost MODE WORKLOAD N` twice (N1 and N2
# requests) and prints (Ir(N2) - Ir(N1)) / (N2 - N1), which cancels
# start-up, the image fill and tear-down: in all, in the device's turns
# (`DeviceRig::device_turn`: the event loop, the device's pass, its system
# calls' user-space side) and in the driver harness's turns
# (`DeviceRig::driver_turn`: reading the answers, posting the next
# requests, the kick). Callgrind counts user space only: the kernel's side
# of preadv, pwritev, io_uring_enter, epoll_wait and the eventfd writes is
# not in these counts, so the system calls per request are printed beside
# them.
set -euo pipefail
cd "$(dirname "$0")/../.."
n1=${N1:-2000}
n2=${N2:-12000}
workloads=("$@")
[ ${#workloads[@]} -gt 0 ] || workloads=(randread_4k randwrite_4k seqread_128k seqwrite_128k)
cargo build --quiet --release -p netbench
target=${CARGO_TARGET_DIR:-target}
bin=$(realpath "$target/release/netbench")
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

# Inclusive Ir of a function in a callgrind output file (0 if absent).
fn_ir() { # file function
    callgrind_annotate --inclusive=yes "$1" 2>/dev/null |
        awk -v f=":$2 " '!found && index($0, f) { gsub(",", "", $1); ir = $1; found = 1 }
            END { print found ? ir : 0 }'
}

total_ir() { # file
    awk '/^(summary|totals):/ {print $2; exit}' "$1"
}

run() { # mode workload n -> out file
    local f="$out/cg.$1.$2.$3"
    (cd "$out" && valgrind --tool=callgrind --callgrind-out-file="$f" \
        "$bin" --block-cost "$1" "$2" "$3" >/dev/null 2>"$out/log") ||
        { cat "$out/log" >&2; exit 1; }
    echo "$f"
}

# System calls per request, by name, over N2 - N1 requests.
syscalls() { # mode workload
    local a b
    for n in "$n1" "$n2"; do
        (cd "$out" && strace -f -c -o "$out/st.$n" "$bin" --block-cost "$1" "$2" "$n" \
            >/dev/null 2>&1)
    done
    # strace -c: "% time seconds usecs/call calls [errors] syscall".
    parse() { awk '$NF ~ /^[a-z_0-9]+$/ && $4 ~ /^[0-9]+$/ && $NF != "syscall" && $NF != "total" {print $NF, $4}' "$1"; }
    join -a 2 -e 0 -o 0,1.2,2.2 <(parse "$out/st.$n1" | sort) <(parse "$out/st.$n2" | sort) |
        awk -v d=$((n2 - n1)) '{ c = ($3 - $2) / d; if (c >= 0.005) printf "%s %.3f  ", $1, c }'
}

printf '%-14s %-5s %9s %9s %9s   %s\n' workload mode 'Ir/req' device driver 'system calls per request'
for w in "${workloads[@]}"; do
    for mode in raw sync async; do
        a=$(run "$mode" "$w" "$n1")
        b=$(run "$mode" "$w" "$n2")
        d=$((n2 - n1))
        all=$((($(total_ir "$b") - $(total_ir "$a")) / d))
        if [ "$mode" = raw ]; then
            dev=-
            drv=-
        else
            dev=$((($(fn_ir "$b" netbench::block::DeviceRig::device_turn) - $(fn_ir "$a" netbench::block::DeviceRig::device_turn)) / d))
            drv=$((($(fn_ir "$b" netbench::block::DeviceRig::driver_turn) - $(fn_ir "$a" netbench::block::DeviceRig::driver_turn)) / d))
        fi
        printf '%-14s %-5s %9s %9s %9s   %s\n' "$w" "$mode" "$all" "$dev" "$drv" "$(syscalls "$mode" "$w")"
    done
done
