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

LOG_PREFIX=mutants.sh
# shellcheck source=../resources/common.sh
. resources/common.sh
VERSION=27.1.0
# The set-up (scripts/host-deps.sh, run by scripts/boot.sh and scripts/test.sh)
# builds this version into the cache; a cargo-mutants of the same version on
# PATH does as well. Missing, it is built now (bounded: an unreachable
# registry fails it within a minute).
ensure_cargo_mutants() {
    export PATH=$MINIVMM_CACHE/cargo-mutants-$VERSION/bin:$PATH
    if ! cargo mutants --version 2>/dev/null | grep -q "$VERSION"; then
        bash scripts/host-deps.sh mutants
    fi
}

# cargo-mutants exits 3 when a mutant made a test hang past its time-out
# (the tests noticed it), also when other mutants were missed: 3 is a pass
# here only if `missed` (its missed.txt) is empty. 2 (some missed) and
# anything else fail.
timeouts_only() {
    local missed=$1
    if [ -s "$missed" ]; then
        echo "mutants.sh: some mutants timed out, and these were missed:" >&2
        cat "$missed" >&2
        return 2
    fi
    echo "mutants.sh: every mutant not caught made a test hang (timed out): noticed"
}

run() {
    local status=0
    cargo mutants "${core[@]}" "$@" || status=$?
    if [ "$status" -eq 3 ]; then
        status=0
        timeouts_only mutants.out/missed.txt || status=$?
    fi
    return "$status"
}

# The binary's own code (vmm/src/main.rs) in a second pass: its mutants are
# tested against the binary-level tests that start no guest
# (.cargo/mutants-bin.toml), its results in mutants.out.bin/. Needs what
# those tests need (KVM for the halting VM); without it they skip and the
# mutants they would catch show as missed.
run_bin() {
    local status=0
    # The binary-level tests that boot no guest (the boots take minutes).
    local tests=(--test api --test operator --test boot --test jail --test jailer --
        --skip a_jailed_guest --skip config_file_with_two_nics_and_rate_limiters_boots
        --skip boots_to_ready --skip a_guest_booted_through_the_jailer --skip a_guest_kernel_panic)
    echo "mutants.sh: the binaries' own code (vmm/src/main.rs, vmm/src/bin/) against tests/"
    # cargo-mutants (27.1) runs its baseline on the mutated package's tests,
    # not on --test-package's: the unmutated run is made here instead, and
    # the time-out is fixed (these tests take under a minute on a quiet
    # machine; a mutant that makes minivmm wait instead of exiting must end).
    if ! cargo test -p minivmm-tests "${tests[@]}"; then
        echo "mutants.sh: the binary-level tests fail on the unmutated tree" >&2
        return 4
    fi
    cargo mutants -p vmm --test-package minivmm-tests --config .cargo/mutants-bin.toml \
        --output mutants.out.bin --baseline skip --timeout 300 "$@" -- "${tests[@]}" \
        || status=$?
    if [ "$status" -eq 3 ]; then
        status=0
        timeouts_only mutants.out.bin/mutants.out/missed.txt || status=$?
    fi
    return "$status"
}

# Runs the core pass, then the binary pass when `$1` says main.rs is in
# scope; fails when either missed a mutant.
run_both() {
    local bin=$1 status=0
    shift
    run "$@" || status=$?
    if [ "$bin" = yes ]; then
        # The binary pass takes the core pass's arguments but its files.
        local args=() skip=no
        for a in "$@"; do
            if [ "$skip" = yes ]; then skip=no; continue; fi
            if [ "$a" = --file ]; then skip=yes; continue; fi
            args+=("$a")
        done
        run_bin "${args[@]}" || status=$?
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
        bin=no
        grep -qE '^\+\+\+ b/vmm/src/(main\.rs|bin/)' "$diff_file" && bin=yes
        run_both "$bin" --in-diff "$diff_file" "$@"
        ;;
    full) ensure_cargo_mutants; run_both yes "$@" ;;
    files)
        args=()
        bin=no
        while [ $# -gt 0 ] && [ "${1#-}" = "$1" ]; do
            args+=(--file "$1")
            case "$1" in vmm/src/main.rs | vmm/src/bin/*) bin=yes ;; esac
            shift
        done
        ensure_cargo_mutants
        run_both "$bin" "${args[@]}" "$@"
        ;;
    *) echo "usage: $0 diff [BASE] | full | files FILE... [cargo-mutants args]" >&2; exit 1 ;;
esac
