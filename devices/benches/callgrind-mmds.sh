#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Instructions per MMDS GET in the network device's own thread, counted by
# callgrind. Needs valgrind; no root.
#
#   bash devices/benches/callgrind-mmds.sh
#
# Runs devices/examples/mmds_cost.rs under callgrind twice (N1 and N2 GETs,
# V1 and V2) and prints (Ir(N2) - Ir(N1)) / (N2 - N1) for the device thread
# (callgrind's thread 2), which cancels start-up, the connection's opening
# and the token request.
set -euo pipefail
cd "$(dirname "$0")/../.."
n1=${N1:-500}
n2=${N2:-2500}
cargo build --quiet --release -p devices --features test-utils --example mmds_cost
bin=target/release/examples/mmds_cost
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

device_ir() { # gets [--v2] -> Ir of thread 2
    valgrind --tool=callgrind --separate-threads=yes \
        --callgrind-out-file="$out/cg.$1${2:-}" "$bin" "$@" >/dev/null 2>"$out/log"
    awk '/^(summary|totals):/ {print $2; exit}' "$out/cg.$1${2:-}-02"
}

printf '%-8s  %s\n' version 'device-thread instructions/GET'
for v in "" --v2; do
    a=$(device_ir "$n1" $v)
    b=$(device_ir "$n2" $v)
    printf '%-8s  %d\n' "${v:-V1}" $(((b - a) / (n2 - n1)))
done
