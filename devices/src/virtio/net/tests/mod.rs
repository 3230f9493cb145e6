// SPDX-License-Identifier: Apache-2.0
//! The network device's test suites, each driving a whole [`Net`] from the
//! driver side over a `SOCK_SEQPACKET` pair (or a real TAP where it says so).
//!
//! - `contract` (the suite every virtio device passes, from `test_utils`):
//!   the device behind the real MMIO transport, its TX queue driven as a
//!   driver and as a hostile driver would.
//! - `fixture`: [`NetFixture`](fixture::NetFixture), the device wired to an
//!   `EventManager` and a socket peer, and what the suites share (frames,
//!   fault-injecting backend; the log capture and `check_metric_after_block!`
//!   of `test_utils`).
//! - `tx`, `rx`, `pass`: the datapath one direction at a time, and the
//!   bounds and interrupts of a pass.
//! - `robustness`: whatever a guest writes into its rings and registers.
//! - `fault_injection`: a backend that fails on demand and resets at every step.
//! - `broken_device`: tests each checked against a device broken on purpose.
//! - `soak`: long random runs with invariants after every step.
//! - `rate_limiter`: the rate limiters in the datapath, in real time.
//! - `io_engine`: the io_uring and `writev` TX engines give the same frames.

use crate::virtio::net::{Net, SeqPacket};
use crate::virtio::test_utils::contract::contract_suite;

contract_suite!(Net<SeqPacket>);

mod broken_device;
mod fault_injection;
pub(super) mod fixture;
mod io_engine;
mod mmds;
mod pass;
mod rate_limiter;
mod robustness;
mod rx;
mod soak;
mod tx;
