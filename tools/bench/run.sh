#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The benchmark run BENCHMARKS.md quotes, in one command. Needs root,
# /dev/net/tun, /dev/kvm and valgrind, and a quiet machine (nothing else
# compiling or booting guests: the timing figures are wall-clock).
#
#   bash tools/bench/run.sh [--quick]
#
# 1. Builds the release netbench and minivmm, and the same two at
#    BASELINE_REV (default: the last commit before the datapath's own
#    virtqueue) from a `git archive` of that commit under
#    target/bench-baseline/REV, so before and after are measured in one session.
# 2. Counts device-thread instructions per frame with callgrind for both, and
#    the block device's instructions per request (tools/bench/callgrind-block.sh).
# 3. Runs the baseline netbench (limit and seed001), then the new one (every
#    scenario, start-up included, the baseline minivmm's start-ups
#    interleaved with the new one's).
# 4. Writes everything into tools/bench/results/, prints the summary
#    (`netbench --report tools/bench/results`, also saved as latest.txt) and
#    puts it into BENCHMARKS.md between the results markers.
set -euo pipefail
cd "$(dirname "$0")/../.."
quick=()
case "${1:-}" in
--quick) quick=(--quick) ;;
"") ;;
*)
    echo "usage: bash tools/bench/run.sh [--quick]" >&2
    exit 2
    ;;
esac
baseline_rev=$(git rev-parse --short "${BASELINE_REV:-5823c7c}")
results=tools/bench/results
# One tree per baseline commit; its target/ survives between runs.
base=target/bench-baseline/$baseline_rev
mkdir -p "$results"

log() { printf 'run.sh: %s\n' "$*" >&2; }

log "building netbench and minivmm"
cargo build --quiet --release -p netbench -p vmm

log "guest kernel and initramfs (resources/build.sh)"
# The last four lines: vmlinux, bzImage, initramfs, root disk.
paths=$(bash resources/build.sh | tail -n 4)
vmlinux=$(sed -n 1p <<<"$paths")
initramfs=$(sed -n 3p <<<"$paths")

log "baseline $baseline_rev into $base"
mkdir -p "$base/src"
git archive "$baseline_rev" | tar -x -C "$base/src"
(cd "$base/src" && cargo build --quiet --release -p netbench -p vmm)
git log -1 --format='%h %s' "$baseline_rev" >"$results/baseline-rev.txt"

log "callgrind: instructions per frame, new and baseline"
bash devices/benches/callgrind-frames.sh >"$results/callgrind.txt"
bash "$base/src/devices/benches/callgrind-frames.sh" >"$results/callgrind-baseline.txt"
log "callgrind: instructions and system calls per block request"
bash tools/bench/callgrind-block.sh >"$results/callgrind-block.txt"

{
    echo "before the timed runs: $(date -u '+%F %T UTC')"
    uptime
    top -b -n 1 | head -n 15
} >"$results/machine.txt"

log "baseline netbench (limit, seed001)"
"$base/src/target/release/netbench" "${quick[@]}" --scenario limit --scenario seed001 \
    --json "$results/baseline.json" >/dev/null

log "netbench (every scenario)"
target/release/netbench "${quick[@]}" --json "$results/latest.json" --plot "$results" \
    --minivmm target/release/minivmm --minivmm-baseline "$base/src/target/release/minivmm" \
    --kernel "$vmlinux" --initramfs "$initramfs" >/dev/null

{
    echo "after the timed runs: $(date -u '+%F %T UTC')"
    uptime
} >>"$results/machine.txt"

target/release/netbench --report "$results" | tee "$results/latest.txt"

# The results block of BENCHMARKS.md is this run's summary, verbatim, so the
# figures there always come from one run.
awk -v f="$results/latest.txt" '
    /<!-- results:begin -->/ { print; print "```text"; while ((getline l < f) > 0) print l; print "```"; skip = 1; next }
    /<!-- results:end -->/ { skip = 0 }
    !skip { print }
' BENCHMARKS.md >BENCHMARKS.md.tmp && mv BENCHMARKS.md.tmp BENCHMARKS.md
log "BENCHMARKS.md results block updated from $results/latest.txt"
