#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The README's test command: lint, then every test in the workspace. Tests
# that boot the guest or create TAPs need root, /dev/kvm and /dev/net/tun;
# where those are missing they print SKIP with the reason. After the set-up
# (scripts/boot.sh) it needs no network.
set -euo pipefail
cd "$(dirname "$0")/.."

# The set-up's check: on a machine where scripts/boot.sh (the set-up) ran,
# nothing is missing and this does no network work; on a fresh one it
# fetches what is missing, every fetch bounded (one line within a minute
# when a registry cannot be reached).
bash scripts/host-deps.sh test
# From here on nothing fetches: cargo works from its cache (the set-up
# fetched every crate of Cargo.lock and built cargo-mutants into the cache),
# and the QEMU check finds its QEMU in the cache.
export CARGO_NET_OFFLINE=true
# Build (or reuse from the cache) the guest kernel and initramfs up front so
# their progress is visible; the tests reuse the cached result.
bash resources/build.sh >/dev/null

cargo fmt --all --check
cargo clippy --workspace --all-targets -- -D warnings
# One test binary at a time, tests inside it in parallel: the two self-test
# boots (bzImage with 1 vCPU, vmlinux with 2) share the two cores, the served
# boot (mvperf, iperf3) runs beside the QEMU check, and the two-guest test
# boots its guests one after the other.
log=$(mktemp)
trap 'rm -f "$log"' EXIT
# --no-fail-fast: one run reports every failing binary, not just the first.
cargo test --workspace --no-fail-fast -- --nocapture 2>&1 | tee "$log"
# The mutants of the last commit (scripts/mutants.sh): a change's tests must
# notice every single-point change cargo-mutants makes to its lines. A commit
# that touches no arch, devices or vmm source costs nothing here.
bash scripts/mutants.sh diff HEAD~1 -j 2
# cargo's last line is often a doc-test binary with nothing in it; close
# with the totals of every binary instead. Skips come in every form a test
# prints: `SKIP <test>: why`, `SKIP: why`, `SKIPPED <test>: why` (a test that
# returned early, reported "ok" by cargo, so not counted as passed), and
# `NOTE <test>: ...` where a check was replaced by another (the test passed;
# the replaced check counts as skipped). With --nocapture such a line may
# follow cargo's "test x ... " on the same line, so match anywhere.
awk '/^test result:/ { p += $4; f += $6; i += $8 }
     /(^|[^[:alnum:]_])SKIP(PED)?([: ]|$)/ { s++ }
     /(^|[^[:alnum:]_])NOTE [[:alnum:]_]+:/ { n++ }
     END { printf "skips: %d ignored, %d tests skipped, %d checks replaced\n", i, s, n
           printf "tests: %d passed, %d failed, %d skipped\n", p - s, f, i + s + n }' "$log"
