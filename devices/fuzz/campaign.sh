#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Runs a libFuzzer campaign on one target and prints its figures.
#
#   bash devices/fuzz/campaign.sh <target> [seconds] [jobs]
#
# Needs nightly and cargo-fuzz (`cargo install cargo-fuzz`). New inputs go to
# the working corpus devices/fuzz/libfuzzer/corpus/<target> (not committed);
# the committed seeds in devices/fuzz/corpus/<target> are read as well. With
# MERGE=1 the inputs that add coverage are merged into the committed seeds
# afterwards (keep them small: that corpus is replayed by every CI run).
# Crashes land in devices/fuzz/libfuzzer/artifacts/<target>/; replay one with
# `cargo +nightly fuzz run --fuzz-dir devices/fuzz/libfuzzer <target> <file>`.
set -euo pipefail
# From inside the cargo-fuzz crate: libFuzzer writes its per-job logs
# (fuzz-N.log) to the current directory.
cd "$(dirname "$0")/libfuzzer"

target=${1:?usage: campaign.sh <target> [seconds] [jobs]}
secs=${2:-60}
jobs=${3:-1}
fuzz_dir=.
work=corpus/$target
seeds=../corpus/$target
mkdir -p "$work" "$seeds"
log=$(mktemp)
trap 'rm -f "$log"' EXIT

# -timeout: one input taking a second is a hang in these targets.
status=0
cargo +nightly fuzz run --fuzz-dir "$fuzz_dir" -O "$target" "$work" "$seeds" -- \
    -max_total_time="$secs" -timeout=1 -rss_limit_mb=2048 -print_final_stats=1 \
    $([ "$jobs" -gt 1 ] && echo "-jobs=$jobs -workers=$jobs") >"$log" 2>&1 || status=$?
grep -E "^#[0-9]+ +(DONE|INITED)|ERROR|panicked" "$log" || true
execs=$(grep -hoE "stat::number_of_executed_units: [0-9]+" "$log" fuzz-*.log 2>/dev/null \
    | awk '{s += $2} END {print s + 0}')
last=$(grep -E "^#[0-9]+ +(DONE|pulse|NEW|REDUCE|INITED)" "$log" | tail -1)
echo "campaign $target: ${secs}s x $jobs, $execs executions, last status: $last"
if [ "${MERGE:-0}" = 1 ]; then
    cargo +nightly fuzz run --fuzz-dir "$fuzz_dir" -O "$target" "$seeds" "$work" -- -merge=1 2>&1 | tail -2
fi
exit "$status"
