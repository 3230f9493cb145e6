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

# -timeout: an input runs in milliseconds; 10 s is a hang even on a loaded
# 2-core machine (1 s gave a spurious timeout: the input ran in 1 ms).
status=0
cargo +nightly fuzz run --fuzz-dir "$fuzz_dir" -O "$target" "$work" "$seeds" -- \
    -max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
    $([ "$jobs" -gt 1 ] && echo "-jobs=$jobs -workers=$jobs") >"$log" 2>&1 || status=$?
logs=("$log")
for f in fuzz-*.log; do [ -e "$f" ] && logs+=("$f"); done
grep -hE "^#[0-9]+[[:space:]]+(DONE|INITED)|ERROR|panicked" "${logs[@]}" || true
execs=$(cat "${logs[@]}" | grep -oE "stat::number_of_executed_units: [0-9]+" \
    | awk '{s += $2} END {print s + 0}')
echo "campaign $target: ${secs}s x $jobs job(s), $execs executions, exit status $status"
if [ "${MERGE:-0}" = 1 ]; then
    cargo +nightly fuzz run --fuzz-dir "$fuzz_dir" -O "$target" "$seeds" "$work" -- -merge=1 2>&1 | tail -2
fi
exit "$status"
