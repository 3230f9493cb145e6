// SPDX-License-Identifier: Apache-2.0
//! The fuzz targets under stable `cargo test`: every committed corpus input,
//! then fresh random inputs for a bounded time, per target.
//!
//! The random inputs come from a seed printed with the results; rerun with
//! `MINIVMM_FUZZ_SEED=<seed>` to replay a failure, and the failing input is
//! printed in hex for `fuzz/corpus/<target>/`.

use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use devices::virtio::test_utils::Rng;
use fuzz_harness::{Target, TARGETS};

/// Random inputs per target stop at this count or after [`RANDOM_TIME`].
const RANDOM_INPUTS: usize = 20_000;
const RANDOM_TIME: Duration = Duration::from_secs(3);
const MAX_INPUT_LEN: usize = 4096;

fn corpus_dir(target: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../corpus")
        .join(target)
}

/// A random input: short inputs are as interesting as long ones, so the
/// length is picked on a log scale.
fn random_input(rng: &mut Rng) -> Vec<u8> {
    let len = (rng.next_u64() as usize % MAX_INPUT_LEN) >> (rng.next_u64() % 8);
    (0..len).map(|_| rng.next_u64() as u8).collect()
}

fn seed() -> u64 {
    match std::env::var("MINIVMM_FUZZ_SEED") {
        Ok(s) => s.parse().expect("MINIVMM_FUZZ_SEED must be a number"),
        Err(_) => {
            SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(1, |d| d.as_nanos() as u64)
                | 1
        }
    }
}

/// Runs one input; on an oracle failure prints where the input came from
/// and its bytes before failing the test.
fn run_one(target: &Target, input: &[u8], origin: &str) {
    if let Err(panic) = catch_unwind(AssertUnwindSafe(|| (target.run)(input))) {
        // The bytes, for fuzz/corpus/<target>/ (`xxd -r -p`).
        let hex: String = input.iter().map(|b| format!("{b:02x}")).collect();
        eprintln!(
            "fuzz target {} failed on {origin} ({} bytes): {hex}",
            target.name,
            input.len()
        );
        resume_unwind(panic);
    }
}

fn replay(name: &str) {
    let target = TARGETS
        .iter()
        .find(|t| t.name == name)
        .expect("target is listed");
    let dir = corpus_dir(name);
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("corpus {}: {e}", dir.display()))
        .map(|e| e.expect("corpus entry").path())
        .collect();
    files.sort();
    assert!(!files.is_empty(), "no seed corpus for {name}");
    for f in &files {
        let data = std::fs::read(f).expect("corpus file");
        run_one(target, &data, &f.display().to_string());
    }

    let seed = seed();
    let mut rng = Rng(seed);
    let start = Instant::now();
    let mut n = 0;
    while n < RANDOM_INPUTS && start.elapsed() < RANDOM_TIME {
        let data = random_input(&mut rng);
        run_one(target, &data, &format!("random input {n} of seed {seed}"));
        n += 1;
    }
    println!(
        "fuzz replay {name}: {} corpus inputs, {n} random inputs (seed {seed}) in {:.1} s",
        files.len(),
        start.elapsed().as_secs_f64()
    );
}

#[test]
fn mmio_transport() {
    replay("mmio_transport");
}

#[test]
fn legacy_pio() {
    replay("legacy_pio");
}

#[test]
fn cli() {
    replay("cli");
}

#[test]
fn config_file() {
    replay("config_file");
}

#[test]
fn net_datapath() {
    replay("net_datapath");
}

#[test]
fn net_datapath_race() {
    replay("net_datapath_race");
}

#[test]
fn chain_walk() {
    replay("chain_walk");
}

#[test]
fn block_datapath() {
    replay("block_datapath");
}

#[test]
fn vsock_datapath() {
    replay("vsock_datapath");
}

#[test]
fn api_http() {
    replay("api_http");
}

#[test]
fn rng_datapath() {
    replay("rng_datapath");
}

#[test]
fn api_server() {
    replay("api_server");
}

#[test]
fn every_target_has_a_test_here() {
    let src = include_str!("replay.rs");
    for t in TARGETS {
        assert!(
            src.contains(&format!("fn {}() {{", t.name)),
            "target {} has no replay test",
            t.name
        );
    }
}

#[test]
fn snapshot_state() {
    replay("snapshot_state");
}
