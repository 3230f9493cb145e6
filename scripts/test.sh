#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The README's test command: lint, then every test in the workspace. Tests
# that boot the guest or create TAPs need root, /dev/kvm and /dev/net/tun;
# where those are missing they print SKIP with the reason.
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/host-deps.sh
# Build (or reuse from the cache) the guest kernel and initramfs up front so
# their progress is visible; the tests reuse the cached result.
bash resources/build.sh >/dev/null

cargo fmt --all --check
cargo clippy --workspace --all-targets -- -D warnings
# One test binary at a time, tests inside it in parallel: the three boot
# tests share the two cores.
cargo test --workspace -- --nocapture
