// SPDX-License-Identifier: Apache-2.0
//! [`TimeCounter`]: nanoseconds a device spent in a state (starved,
//! throttled), shared by the devices' metrics. It includes a period still in
//! progress when read, so a metrics line written during a long stall already
//! shows it.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::Instant;

use serde::{Serialize, Serializer};

/// Nanoseconds spent in a state: the periods that ended plus the one in
/// progress, if any. Serialized as that sum.
#[derive(Debug, Default)]
pub struct TimeCounter {
    ended: AtomicU64,
    /// When the current period began ([`mono_ns`], never 0); 0 when none.
    since: AtomicU64,
}

impl TimeCounter {
    /// Starts a period (no-op if one is running).
    pub(crate) fn start(&self) {
        let _ = self
            .since
            .compare_exchange(0, mono_ns(), Ordering::Relaxed, Ordering::Relaxed);
    }

    /// Ends the running period, if any, and adds its length.
    pub(crate) fn stop(&self) {
        let since = self.since.swap(0, Ordering::Relaxed);
        if since != 0 {
            self.ended
                .fetch_add(mono_ns().saturating_sub(since), Ordering::Relaxed);
        }
    }

    /// Whether a period is running.
    pub fn is_running(&self) -> bool {
        self.since.load(Ordering::Relaxed) != 0
    }

    /// Nanoseconds of the periods that ended.
    pub fn ended_ns(&self) -> u64 {
        self.ended.load(Ordering::Relaxed)
    }

    /// Nanoseconds so far, a period in progress included.
    pub fn total_ns(&self) -> u64 {
        let ended = self.ended_ns();
        match self.since.load(Ordering::Relaxed) {
            0 => ended,
            since => ended.saturating_add(mono_ns().saturating_sub(since)),
        }
    }
}

impl Serialize for TimeCounter {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_u64(self.total_ns())
    }
}

/// Nanoseconds on a monotonic clock private to this process, never 0.
pub(crate) fn mono_ns() -> u64 {
    static BASE: OnceLock<Instant> = OnceLock::new();
    let base = *BASE.get_or_init(Instant::now);
    u64::try_from(base.elapsed().as_nanos())
        .unwrap_or(u64::MAX)
        .saturating_add(1)
}
