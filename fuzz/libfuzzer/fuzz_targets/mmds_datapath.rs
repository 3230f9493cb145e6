// SPDX-License-Identifier: Apache-2.0
//! libFuzzer entry point of the `mmds_datapath` target; the target and its
//! oracles are `fuzz_harness::mmds`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| fuzz_harness::mmds::run(data));
