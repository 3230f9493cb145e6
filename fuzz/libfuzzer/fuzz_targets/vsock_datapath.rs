// SPDX-License-Identifier: Apache-2.0
//! libFuzzer entry point of the `vsock_datapath` target; the target and its
//! oracles are `fuzz_harness::vsock`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| fuzz_harness::vsock::run(data));
