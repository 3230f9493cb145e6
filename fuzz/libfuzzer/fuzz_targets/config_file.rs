// SPDX-License-Identifier: Apache-2.0
//! libFuzzer entry point of the `config_file` target; the target and its
//! oracles are `fuzz_harness::config_file`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| fuzz_harness::config_file::run(data));
