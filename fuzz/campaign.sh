#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Runs a libFuzzer campaign on one target and prints its figures.
#
#   bash fuzz/campaign.sh <target> [seconds] [jobs]
#   FUZZ_FLAGS="-a -s none" bash fuzz/campaign.sh net_datapath 3600
#   RUNS=1000000 bash fuzz/campaign.sh vsock_datapath 7200
#
# RUNS=N ends the campaign after N executions (libFuzzer's -runs) or the
# seconds, whichever comes first: on a shared machine the rate varies, and
# a campaign of a given size should not have to guess its time.
#
# Needs nightly and cargo-fuzz (`cargo install cargo-fuzz`). New inputs go to
# the working corpus fuzz/libfuzzer/corpus/<target> (not committed);
# the committed seeds in fuzz/corpus/<target> are read as well. With
# MERGE=1 the inputs that add coverage are merged into the committed seeds
# afterwards (keep them small: that corpus is replayed by every CI run).
# Crashes land in fuzz/libfuzzer/artifacts/<target>/; replay one with
# `cargo +nightly fuzz run --fuzz-dir fuzz/libfuzzer <target> <file>`.
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
# FUZZ_FLAGS adds cargo-fuzz build flags, e.g. "-a -s none": debug
# assertions (the datapath's ring-offset checks) without ASan, 3x faster.
# shellcheck disable=SC2086
cargo +nightly fuzz run --fuzz-dir "$fuzz_dir" -O ${FUZZ_FLAGS:-} "$target" "$work" "$seeds" -- \
    -max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
    $([ -n "${RUNS:-}" ] && echo "-runs=$RUNS") \
    $([ "$jobs" -gt 1 ] && echo "-jobs=$jobs -workers=$jobs") >"$log" 2>&1 || status=$?
logs=("$log")
for f in fuzz-*.log; do [ -e "$f" ] && logs+=("$f"); done
grep -hE "^#[0-9]+[[:space:]]+(DONE|INITED)|ERROR|panicked" "${logs[@]}" || true
execs=$(cat "${logs[@]}" | { grep -oE "stat::number_of_executed_units: [0-9]+" || true; } \
    | awk '{s += $2} END {print s + 0}')
echo "campaign $target: ${secs}s x $jobs job(s), $execs executions, exit status $status"
if [ "$execs" = 0 ]; then
    # Nothing ran (cargo-fuzz or nightly missing, a build error): say why
    # instead of reporting an empty campaign.
    tail -n 20 "$log" >&2
    exit "$(( status ? status : 1 ))"
fi
# Coverage the working corpus reaches in minivmm's own files: libFuzzer's
# per-function edge counts (-print_coverage) summed per source file. Edges
# count every branch the compiler emitted, panic and error paths included;
# Debug/Display impls (only reached when an error is printed) are left out.
"target/x86_64-unknown-linux-gnu/release/$target" -runs=0 -print_coverage=1 "$work" "$seeds" 2>&1 \
    | awk '/^(UN)?COVERED_FUNC:/ {
               file = $NF; sub(/:[0-9]+$/, "", file)
               if (file !~ /\/(devices|vmm)\/src\// || / as core::fmt::/) next
               sub(/.*\/(devices|vmm)\/src\//, "", file)
               split($5, e, "/"); hit[file] += e[1]; all[file] += e[2]
           }
           END { for (f in all) printf "  %-28s %5d of %5d edges (%.0f%%)\n", f, hit[f], all[f], 100 * hit[f] / all[f] }' \
    | sort
if [ "${MERGE:-0}" = 1 ]; then
    # shellcheck disable=SC2086
    cargo +nightly fuzz run --fuzz-dir "$fuzz_dir" -O ${FUZZ_FLAGS:-} "$target" "$seeds" "$work" -- -set_cover_merge=1 2>&1 | tail -2
fi
exit "$status"
