// SPDX-License-Identifier: Apache-2.0
//! libFuzzer entry point of the `chain_walk` target; the target and its oracles
//! are `fuzz_harness::chain_walk`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| fuzz_harness::chain_walk::run(data));
