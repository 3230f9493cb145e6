// SPDX-License-Identifier: Apache-2.0
//! libFuzzer entry point of the `mmio_transport` target; the target and its oracles
//! are `fuzz_harness::mmio`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| fuzz_harness::mmio::run(data));
