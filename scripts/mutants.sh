#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Mutation testing with cargo-mutants over arch, devices and vmm: which
# single-point changes to the code the tests would not notice. What is
# examined, what is excluded and why, and the time-outs are in
# .cargo/mutants.toml; ROBUSTNESS.md ("Mutation testing") has the scores.
#
#   bash scripts/mutants.sh diff [BASE]   the mutants of the change since BASE
#                                         (default: the last commit, HEAD~1);
#                                         run it before committing a change
#   bash scripts/mutants.sh full [ARGS]   every mutant (hours on 2 cores: use
#                                         --shard K/N to split a run)
#   bash scripts/mutants.sh files F...    the mutants of these source files
#
# Extra arguments after the mode go to cargo-mutants (e.g. -j 2, --shard 0/4).
# Results: mutants.out/ (missed.txt, caught.txt, timeout.txt, unviable.txt).
# Exit status: 0 when every viable mutant was caught (a mutant that made a
# test hang counts as caught), 2 when some were missed (cargo-mutants' code). Tests that need root, TUN
# or KVM run as they do in CI; without them they skip, and the mutants they
# would catch show as missed.
set -euo pipefail
cd "$(dirname "$0")/.."

VERSION=27.1.0
ensure_cargo_mutants() {
    if ! cargo mutants --version 2>/dev/null | grep -q "$VERSION"; then
        echo "mutants.sh: installing cargo-mutants $VERSION" >&2
        cargo install --locked --quiet "cargo-mutants@$VERSION"
    fi
}

# cargo-mutants exits 3 when the only mutants not caught made a test hang
# past its time-out: the tests noticed them, so that is a pass here. 2 (some
# missed) and anything else fail.
run() {
    local status=0
    cargo mutants "${core[@]}" "$@" || status=$?
    if [ "$status" -eq 3 ]; then
        echo "mutants.sh: every mutant not caught made a test hang (timed out): noticed"
        status=0
    fi
    return "$status"
}

# The crates examined; .cargo/mutants.toml excludes the rest of the tree too.
core=(-p arch -p devices -p vmm)
mode=${1:-diff}
[ $# -gt 0 ] && shift
case "$mode" in
    diff)
        base=HEAD~1
        if [ $# -gt 0 ] && [ "${1#-}" = "$1" ]; then base=$1; shift; fi
        if ! git rev-parse -q --verify "$base^{commit}" >/dev/null; then
            echo "mutants.sh: SKIP: no commit $base here (a shallow clone?)"
            exit 0
        fi
        diff_file=$(mktemp)
        trap 'rm -f "$diff_file"' EXIT
        git diff "$base" -- 'arch/src/*.rs' 'devices/src/*.rs' 'vmm/src/*.rs' >"$diff_file"
        if [ ! -s "$diff_file" ]; then
            echo "mutants.sh: no change to arch, devices or vmm sources since $base"
            exit 0
        fi
        ensure_cargo_mutants
        run --in-diff "$diff_file" "$@"
        ;;
    full) ensure_cargo_mutants; run "$@" ;;
    files)
        args=()
        while [ $# -gt 0 ] && [ "${1#-}" = "$1" ]; do args+=(--file "$1"); shift; done
        ensure_cargo_mutants
        run "${args[@]}" "$@"
        ;;
    *) echo "usage: $0 diff [BASE] | full | files FILE... [cargo-mutants args]" >&2; exit 1 ;;
esac
