// SPDX-License-Identifier: Apache-2.0
//! virtio-rng, the entropy device (virtio 1.1 §5.4; Firecracker's
//! `/entropy`).
//!
//! This module's public items are the interface the VMM builds against:
//! [`RngConfig`] (plain data chosen by the VMM), [`Rng`] (the device, a
//! [`VirtioDevice`](super::VirtioDevice) and an event-manager subscriber,
//! shared as `Arc<Mutex<Rng>>` as the other devices are) and
//! [`RngMetrics`] (counters with a JSON view under the device's id).
//!
//! The device, split as the others are:
//!
//! | module | role |
//! |---|---|
//! | `device` | features, the (empty) configuration space, activation and reset, the limits changed while it runs |
//! | `pass` | one bounded pass over the request queue, the rate limiter |
//! | `source` | where the bytes come from: `getrandom(2)`, or a test's source |
//! | `event_handler` | the event-manager glue |
//! | `metrics` | the counters (field names are a contract) |
//!
//! **The protocol.** One request queue. The driver posts chains of
//! device-writable buffers; the device fills them with random bytes and
//! returns each with the number of bytes it wrote. There are no feature
//! bits of the device's own and no configuration space. Offered:
//! VERSION_1, EVENT_IDX, INDIRECT_DESC.
//!
//! **Straight into guest memory.** Each buffer segment of a chain is filled
//! by one `getrandom(2)` on the segment itself (`GRND_NONBLOCK`: the event
//! loop never sleeps); a short return is asked again for the rest. A
//! request gets at most [`MAX_REQUEST_BYTES`]; a longer chain is filled that
//! far and says so in its used length.
//!
//! **Hostile guests.** A chain with a device-readable buffer, a buffer
//! outside guest memory, a loop, or no byte to fill is refused: returned
//! with used length 0, counted in `malformed_chains`, logged at a limited
//! rate. A corrupt ring (an avail index too far ahead) stops the queue until
//! the driver resets the device. Every pass is bounded by the shared
//! weights and descriptor budget ([`pass`]).
//!
//! **Rate limiting.** Firecracker's entropy limiter: a bandwidth bucket in
//! bytes and an ops bucket in requests, the shared
//! [`RateLimiter`](crate::rate_limiter::RateLimiter). A request pays before
//! it is filled; one the limiter refuses is kept and served first when the
//! limiter's timer fires.
//!
//! **System calls.** In [`Rng::new`], before seccomp: `eventfd2`, and
//! `timerfd_create` with a rate limiter. On the event loop: `getrandom`
//! (the one call this device adds to the event loop's list), `read`/`write`
//! on the eventfds, `timerfd_settime` and `read` on the limiter's timer,
//! `epoll_ctl`; `timerfd_create` for a limiter set while the VM runs. On a
//! vCPU thread: `write` on an eventfd at activation and reset.

use crate::rate_limiter::RateLimiterConfig;

pub mod device;
pub mod event_handler;
pub mod metrics;
pub mod pass;
pub mod source;

#[cfg(test)]
mod tests;

pub use device::{Rng, RngError};
pub use metrics::RngMetrics;
pub use source::{EntropySource, Getrandom};

/// Default QueueNumMax of the request queue (Firecracker's).
pub const DEFAULT_QUEUE_SIZE: u16 = 256;

/// Most bytes one request gets, whatever its buffers hold: a pass then
/// fills at most `PASS_WEIGHT_BYTES` plus one request. Linux's driver asks
/// for at most a few hundred bytes at a time.
pub const MAX_REQUEST_BYTES: usize = 64 << 10;

/// Configuration of the entropy device, plain data chosen by the VMM.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RngConfig {
    /// Limits on what the guest takes (bandwidth in bytes, ops in
    /// requests).
    pub rate_limiter: RateLimiterConfig,
    /// QueueNumMax of the request queue: a power of two up to 32768.
    pub queue_size: u16,
}

impl Default for RngConfig {
    /// No limits, the default queue size.
    fn default() -> Self {
        RngConfig {
            rate_limiter: RateLimiterConfig::default(),
            queue_size: DEFAULT_QUEUE_SIZE,
        }
    }
}
