// SPDX-License-Identifier: Apache-2.0
//! MMDS, the microVM metadata service, as Firecracker has it: a JSON store
//! the host fills through the API and the guest reads over its own network
//! card at a link-local address (169.254.169.254 by default).
//!
//! The parts, each testable without a guest:
//!
//! - [`store`]: [`Mmds`], the one store of a VM, shared as [`SharedMmds`]
//!   between the API thread (PUT, PATCH and GET `/mmds`) and the device
//!   thread (guest requests): the JSON value with its size bound, the
//!   version (V1 or V2), `imds_compat` and the session tokens.
//! - [`token`]: V2 session tokens: 32 bytes from `getrandom(2)`, kept in a
//!   bounded table with their expiry, compared in constant time.
//! - [`http`]: one guest HTTP/1.1 request parsed from a bounded buffer and
//!   answered as Firecracker's MMDS answers it (JSON or IMDS text, tokens,
//!   401, 404, 405, 400, 501).
//! - [`packet`]: Ethernet, ARP, IPv4 and TCP headers read and written, with
//!   their checksums.
//! - [`tcp`]: a bounded TCP endpoint on port 80: at most
//!   [`MAX_CONNECTIONS`](tcp::MAX_CONNECTIONS) connections (the least
//!   recently used is reset when another opens), a fixed receive buffer
//!   whose free space is the advertised window, one response at a time.
//! - [`stack`]: [`MmdsStack`], what one network card runs: it claims the
//!   guest's frames to the MMDS address on the TX path (they never reach the
//!   TAP) and hands the answers to the RX path, ahead of the TAP's frames.
//! - [`metrics`]: [`MmdsMetrics`], flattened into the card's counters.
//!
//! Why a TCP of our own rather than smoltcp: MMDS answers one kind of peer
//! (the guest's kernel over a virtio link that neither loses nor reorders
//! frames while buffers are posted) with one kind of exchange (a small
//! request, one response). What that needs (in-order receive into a fixed
//! buffer, send within the peer's window, go-back-N on a repeated ACK, FIN
//! and RST) is a few hundred lines whose every state is reachable by the
//! fuzz target, costs no allocation per frame, and owns no timers; a general
//! stack brings interfaces, sockets, timers and a buffer pool per
//! connection, each a state a hostile guest can drive and a fuzzer must
//! cover, for features (retransmission timers, congestion control, options)
//! this link does not use.

#[cfg(any(test, feature = "test-utils"))]
pub mod guest;
pub mod http;
pub mod metrics;
pub mod packet;
pub mod stack;
pub mod store;
pub mod tcp;
pub mod token;

#[cfg(test)]
mod tests;

use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

pub use metrics::MmdsMetrics;
pub use stack::MmdsStack;
pub use store::{Mmds, MmdsError, MmdsVersion};

/// The store of a VM, shared by the API thread and the cards MMDS serves.
pub type SharedMmds = Arc<Mutex<Mmds>>;

/// Locks the store. A panic while holding the lock cannot leave the store
/// half-changed (every change is built aside and swapped in), so a
/// poisoned lock is taken as it is.
pub fn lock(mmds: &SharedMmds) -> MutexGuard<'_, Mmds> {
    mmds.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Firecracker's default bound on the store (its `--mmds-size-limit`,
/// which defaults to `--http-api-max-payload-size`, 51200 bytes).
pub const DEFAULT_SIZE_LIMIT: usize = 51200;

/// The address MMDS answers at unless configured otherwise.
pub const DEFAULT_IPV4: [u8; 4] = [169, 254, 169, 254];

/// The MAC address MMDS answers ARP with (Firecracker's).
pub const MMDS_MAC: [u8; 6] = [0x06, 0x01, 0x23, 0x45, 0x67, 0x01];
