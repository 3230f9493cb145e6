// SPDX-License-Identifier: Apache-2.0
//! libFuzzer entry point of the `net_datapath_race` target; the target and its oracles
//! are `fuzz_harness::race`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| fuzz_harness::race::run(data));
