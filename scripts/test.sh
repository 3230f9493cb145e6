#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The README's test command: lint, then every test in the workspace. Tests
# that boot the guest or create TAPs need root, /dev/kvm and /dev/net/tun;
# where those are missing they print SKIP with the reason.
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/host-deps.sh test
# Build (or reuse from the cache) the guest kernel and initramfs up front so
# their progress is visible; the tests reuse the cached result.
bash resources/build.sh >/dev/null

cargo fmt --all --check
cargo clippy --workspace --all-targets -- -D warnings
# One test binary at a time, tests inside it in parallel: the two READY boots
# share the two cores, then the served boot runs beside the QEMU check.
log=$(mktemp)
trap 'rm -f "$log"' EXIT
cargo test --workspace -- --nocapture 2>&1 | tee "$log"
# cargo's last line is often a doc-test binary with nothing in it; close
# with the totals of every binary instead.
awk '/^test result:/ { p += $4; f += $6; i += $8 } /^SKIP / { s++ }
     END { printf "tests: %d passed, %d failed, %d skipped\n", p, f, i + s }' "$log"
