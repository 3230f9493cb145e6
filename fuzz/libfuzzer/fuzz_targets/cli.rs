// SPDX-License-Identifier: Apache-2.0
//! libFuzzer entry point of the `cli` target; the target and its oracles
//! are `fuzz_harness::cli`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| fuzz_harness::cli::run(data));
