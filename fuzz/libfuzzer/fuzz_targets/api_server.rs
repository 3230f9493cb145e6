// SPDX-License-Identifier: Apache-2.0
//! libFuzzer entry point of the `api_server` target; the target and its
//! oracles are `fuzz_harness::api_server`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| fuzz_harness::api_server::run(data));
