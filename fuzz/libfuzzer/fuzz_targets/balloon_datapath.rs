// SPDX-License-Identifier: Apache-2.0
//! libFuzzer entry point of the `balloon_datapath` target; the target and
//! its oracles are `fuzz_harness::balloon`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| fuzz_harness::balloon::run(data));
