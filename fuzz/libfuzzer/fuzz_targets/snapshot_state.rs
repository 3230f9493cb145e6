// SPDX-License-Identifier: Apache-2.0
//! libFuzzer entry point of the `snapshot_state` target; the target and its
//! oracles are `fuzz_harness::snapshot`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| fuzz_harness::snapshot::run(data));
