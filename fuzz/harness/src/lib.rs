// SPDX-License-Identifier: Apache-2.0
//! minivmm's fuzz targets, as plain functions of `&[u8]`.
//!
//! Each target turns the fuzzer's bytes into a structured sequence of guest
//! (or user) actions with the `arbitrary` crate, drives the real device code
//! with it, and checks oracles after every step: an oracle failure is a
//! panic, which libFuzzer reports as a crash and `cargo test` as a failure.
//! Two callers share the functions:
//!
//! - the cargo-fuzz crate in `fuzz/libfuzzer` (nightly, libFuzzer), whose
//!   `fuzz_targets/*.rs` only call [`TARGETS`]' functions;
//! - this crate's `tests/replay.rs` (stable, CI): every committed corpus
//!   input (`fuzz/corpus/<target>/`) and a bounded number of fresh
//!   random inputs per target.
//!
//! Adding a target: a module with a `pub fn run(data: &[u8])`, an entry in
//! [`TARGETS`], a `fuzz_targets/<name>.rs` and a `[[bin]]` in
//! `fuzz/libfuzzer/Cargo.toml`, and a seed corpus directory. [`common`] builds
//! guest memory and a net device behind its transport for device targets.
#![deny(missing_docs)]
#![deny(unsafe_code)]

pub mod api_http;
pub mod api_server;
pub mod balloon;
pub mod block;
pub mod chain_walk;
pub mod cli;
pub mod common;
pub mod config_file;
pub mod config_oracles;
pub mod datapath;
pub mod legacy;
pub mod mmds;
pub mod mmio;
pub mod net_rig;
pub mod race;
pub mod rng;
pub mod snapshot;
pub mod snapshot_buckets;
pub mod vsock;

/// Turns `data` into a structured input and runs `f` on it; bytes that do
/// not make a whole input are no input (libFuzzer moves on).
pub fn with_input<'a, T: arbitrary::Arbitrary<'a>>(data: &'a [u8], f: impl FnOnce(&T)) {
    if let Ok(input) = T::arbitrary_take_rest(arbitrary::Unstructured::new(data)) {
        f(&input);
    }
}

/// A fuzz target: its name (the corpus directory and the cargo-fuzz binary)
/// and the function that runs one input.
#[derive(Debug, Clone, Copy)]
pub struct Target {
    /// Name, as in `cargo fuzz run <name>`.
    pub name: &'static str,
    /// Runs one input; panics when an oracle fails.
    pub run: fn(&[u8]),
}

/// Every target.
pub const TARGETS: &[Target] = &[
    Target {
        name: "vsock_datapath",
        run: vsock::run,
    },
    Target {
        name: "mmio_transport",
        run: mmio::run,
    },
    Target {
        name: "legacy_pio",
        run: legacy::run,
    },
    Target {
        name: "cli",
        run: cli::run,
    },
    Target {
        name: "config_file",
        run: config_file::run,
    },
    Target {
        name: "net_datapath",
        run: datapath::run,
    },
    Target {
        name: "net_datapath_race",
        run: race::run,
    },
    Target {
        name: "chain_walk",
        run: chain_walk::run,
    },
    Target {
        name: "block_datapath",
        run: block::run,
    },
    Target {
        name: "api_http",
        run: api_http::run,
    },
    Target {
        name: "rng_datapath",
        run: rng::run,
    },
    Target {
        name: "api_server",
        run: api_server::run,
    },
    Target {
        name: "snapshot_state",
        run: snapshot::run,
    },
    Target {
        name: "balloon_datapath",
        run: balloon::run,
    },
    Target {
        name: "mmds_datapath",
        run: mmds::run,
    },
];
