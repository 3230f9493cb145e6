// SPDX-License-Identifier: Apache-2.0
//! libFuzzer entry point of the `legacy_pio` target; the target and its oracles
//! are `fuzz_harness::legacy`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| fuzz_harness::legacy::run(data));
