// SPDX-License-Identifier: Apache-2.0
//! The block device's test suites, each driving a whole [`Block`](super::Block)
//! from the driver side over an image in a temporary directory.
//!
//! - `contract` (the suite every virtio device passes, from `test_utils`):
//!   the device behind the real MMIO transport, driven as a driver and as
//!   a hostile driver would.
//! - `fixture`: [`BlockFixture`](fixture::BlockFixture), the device wired to
//!   an `EventManager`, requests built part by part, and the fault-injecting
//!   backend.
//! - `requests`: features, configuration space, opening and locking the
//!   image, each request type.
//! - `malformed`: the malformed-request matrix.
//! - `rate_limiter`: the limiter in the datapath, in real time.
//! - `pass`: the bounds of a pass, a corrupt ring, resets with requests in flight.
//! - `faults`: the fault-injection matrix, both engines.
//! - `integrity`: random data through random chain shapes against a model.
//! - `swap`: the image replaced or resized while the device runs, and its
//!   rate limits changed.

use crate::virtio::block::{Block, FileBackend};
use crate::virtio::test_utils::contract::contract_suite;

contract_suite!(Block<FileBackend>);

mod faults;
#[allow(dead_code)]
pub(super) mod fixture;
mod integrity;
mod malformed;
mod pass;
mod rate_limiter;
mod requests;
mod swap;
