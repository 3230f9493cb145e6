#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Instructions per frame in the network device's own thread, counted by
# callgrind (stable on a noisy machine, unlike time). Needs valgrind; no root.
#
#   bash devices/benches/callgrind-frames.sh [BATCH] [extra frame_cost flags]
#
# For each direction and size, runs devices/examples/frame_cost.rs under
# callgrind twice (N1 and N2 frames) and prints
# (Ir(N2) - Ir(N1)) / (N2 - N1) for the device thread (callgrind's thread 2),
# which cancels start-up and tear-down.
set -euo pipefail
cd "$(dirname "$0")/../.."
batch=${1:-128}
shift || true
n1=${N1:-2000}
n2=${N2:-12000}
cargo build --quiet --release -p devices --features test-utils --example frame_cost
bin=target/release/examples/frame_cost
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

device_ir() { # dir size frames -> Ir of thread 2
    valgrind --tool=callgrind --separate-threads=yes \
        --callgrind-out-file="$out/cg.$1.$2.$3" "$bin" "$1" "$2" "$3" "$batch" "${@:4}" \
        >/dev/null 2>"$out/log"
    awk '/^(summary|totals):/ {print $2; exit}' "$out/cg.$1.$2.$3-02"
}

printf '%-4s %6s %6s  %s\n' dir bytes batch 'device-thread instructions/frame'
for dir in tx rx; do
    for size in 64 1514; do
        a=$(device_ir "$dir" "$size" "$n1" "$@")
        b=$(device_ir "$dir" "$size" "$n2" "$@")
        printf '%-4s %6s %6s  %d\n' "$dir" "$size" "$batch" $(((b - a) / (n2 - n1)))
    done
done
