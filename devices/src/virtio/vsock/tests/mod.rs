// SPDX-License-Identifier: Apache-2.0
//! The vsock device's test suites, each driving a whole
//! [`Vsock`](super::Vsock) from the driver side over real Unix sockets.
//!
//! - `contract` (the suite every virtio device passes, from `test_utils`):
//!   the device behind the real MMIO transport, driven as a driver and as
//!   a hostile driver would.
//! - `fixture`: [`VsockFixture`](fixture::VsockFixture), the device wired to
//!   an `EventManager`, packets built and read back, the fault-injecting
//!   backend.
//! - `protocol`: connections both ways, credit, half-close, time-outs, the
//!   cap, hostile headers, TRANSPORT_RESET.
//! - `faults`: fault injection on the Unix sockets and the bounds of a pass.
//! - `held`: TX chains held for host sockets that refused their bytes:
//!   out-of-order return, the bounds, every path that ends a connection,
//!   quiesce.
//! - `notify`: when the device asks for kicks and raises interrupts.
//! - `transport`: the device behind the real MMIO transport.

use crate::virtio::test_utils::contract::contract_suite;
use crate::virtio::vsock::{UnixBackend, Vsock};

contract_suite!(Vsock<UnixBackend>);

mod faults;
#[allow(dead_code)]
pub(super) mod fixture;
mod held;
mod notify;
mod protocol;
mod transport;
