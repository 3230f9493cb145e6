// SPDX-License-Identifier: Apache-2.0
//! virtio-vsock (virtio 1.2 §5.10) with Firecracker's host side: the
//! guest's `AF_VSOCK` stream sockets relayed to Unix sockets on the host.
//!
//! This module's public items are the interface the VMM builds against:
//! [`VsockConfig`] (plain data chosen by the VMM), [`Tunables`] (the
//! device's bounds, defaults for the VMM, smaller in tests), [`Vsock`] (the
//! device, a [`VirtioDevice`](super::VirtioDevice) and an event-manager
//! subscriber, shared as `Arc<Mutex<Vsock>>` as the other devices are) and
//! [`VsockMetrics`].
//!
//! | module | role |
//! |---|---|
//! | `packet` | the 44-byte header and the checks every header from the guest goes through |
//! | `conn` | one connection: its state, credit both ways, bytes the host has not taken |
//! | `muxer` | the connections, Firecracker's `CONNECT <port>\n` / `OK <port>\n` protocol, `<uds_path>_<port>` |
//! | `pass` | bounded passes over the RX, TX and event queues |
//! | `backend` | every system call on a Unix socket: the seam for fault injection |
//! | `device` | features, configuration space (the guest CID), activation, reset, TRANSPORT_RESET |
//! | `event_handler` | the event-manager glue: one token per connection's socket |
//! | `metrics` | the counters (field names are a contract) |
//!
//! **Host side** (Firecracker's `docs/vsock.md`): minivmm listens on
//! `uds_path`; a host process connects, writes `CONNECT <port>\n`, and once
//! the guest accepts reads `OK <host port>\n` and then talks to the guest's
//! listener; a guest connecting to CID 2 port P reaches the host listener at
//! `<uds_path>_P`.
//!
//! **Features offered**: VERSION_1, EVENT_IDX, INDIRECT_DESC; stream sockets
//! only (no `VIRTIO_VSOCK_F_SEQPACKET`: a SEQPACKET request is answered RST).
//!
//! **System calls.** In [`Vsock::new`] (or before it, for a listener the
//! VMM bound itself: [`Vsock::with_listener`]), before seccomp: `socket`,
//! `bind`, `listen`, `fcntl` (the listener), `eventfd2`, `timerfd_create`.
//! On the event loop: `accept4` with `SOCK_NONBLOCK | SOCK_CLOEXEC` (a host
//! connection), `socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK |
//! SOCK_CLOEXEC, 0)` and `connect` (a guest's connection to
//! `<uds_path>_P`), `read`, `readv`, `write`, `writev`,
//! `shutdown(SHUT_WR)` and `close` on the sockets, `read`/`write` on the
//! eventfds, `timerfd_settime` and `read` on the time-out timer,
//! `epoll_ctl`. No `fcntl`, `recvfrom` or `sendto`.

use std::path::PathBuf;
use std::time::Duration;

pub mod backend;
pub mod conn;
pub mod device;
pub mod event_handler;
pub mod metrics;
pub(crate) mod muxer;
pub mod packet;
pub(crate) mod pass;

#[cfg(test)]
mod tests;

pub use backend::{UnixBackend, VsockBackend};
pub use device::{Vsock, VsockError};
pub use metrics::VsockMetrics;
pub use muxer::{HELD_IOVS, MAX_QUEUED_RSTS};
pub use pass::{RX_BATCH, RX_BATCH_BYTES};

/// The lowest CID a guest may have: 0 and 1 are reserved, 2 is the host
/// (virtio 1.2 §5.10.4).
pub const MIN_GUEST_CID: u64 = 3;

/// Configuration of the vsock device, plain data chosen by the VMM.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VsockConfig {
    /// The metrics key (Firecracker's deprecated `vsock_id`, or `vsock`).
    pub id: String,
    /// The guest's CID, in the configuration space.
    pub guest_cid: u64,
    /// Where minivmm listens for host connections; guest connections go
    /// to `<uds_path>_<port>`.
    pub uds_path: PathBuf,
}

/// The device's bounds. The defaults are what the VMM uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tunables {
    /// Connections open at once, either way, host sockets still sending
    /// their `CONNECT` line included; more are refused and counted.
    pub max_connections: usize,
    /// The device's receive buffer per connection, advertised to the guest
    /// as `buf_alloc`: the most guest data a connection holds for a host
    /// socket that does not read.
    pub buf_alloc: u32,
    /// How long a host connection may take to send its `CONNECT` line, and
    /// the guest to answer the REQUEST.
    pub connect_timeout: Duration,
    /// How long a connection the guest shut down may take to hand the host
    /// what it holds.
    pub shutdown_timeout: Duration,
    /// QueueNumMax of each of the three queues.
    pub queue_size: u16,
}

impl Default for Tunables {
    fn default() -> Self {
        Tunables {
            max_connections: 256,
            buf_alloc: 256 * 1024,
            // Firecracker waits 2 s; an emulated guest kernel (see the
            // README on PVM hosts) can take longer to answer the first time.
            connect_timeout: Duration::from_secs(10),
            shutdown_timeout: Duration::from_secs(10),
            queue_size: 256,
        }
    }
}
