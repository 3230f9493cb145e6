// SPDX-License-Identifier: Apache-2.0
//! What every device's pass over a queue does alike, written once: the
//! start and the end of a pass over a request queue, the limiter's verdict
//! on a chain, a refused chain given back, a queue that broke, the look at
//! the ring after it drained, and the reads a pass made.
//!
//! The bounds themselves ([`PASS_DESC_BUDGET`](super::queue::PASS_DESC_BUDGET),
//! [`MAX_PASS_READS`](super::queue::MAX_PASS_READS) and the shared weights)
//! sit beside [`Budget`] in `queue`, which charges every read to it. A
//! device's own module says what else ends its passes.

use std::sync::atomic::{AtomicU64, Ordering};

use crate::rate_limiter::RateLimiterError;
use crate::virtio::events::{self, HostErrors};
use crate::virtio::metrics::QueueCounters;
use crate::virtio::queue::{Budget, ChainError, QueueError, SplitQueue, PASS_DESC_BUDGET};
use crate::virtio::time_counter::TimeCounter;
use crate::virtio::Interrupt;
use crate::warn::warn_rate_limited;

/// The start of every pass over a request queue: none on a queue that
/// broke (`None`); otherwise the pass is counted in `passes`, kicks are
/// off while it drains the ring, and it gets a fresh descriptor budget.
pub(crate) fn begin(queue: &mut SplitQueue, broken: bool, passes: &AtomicU64) -> Option<Budget> {
    if broken {
        return None;
    }
    events::inc(passes);
    queue.disable_notifications();
    Some(Budget::new(PASS_DESC_BUDGET))
}

/// The end of every pass over a request queue: a yield counted, its reads
/// counted, its used entries published and the interrupt the driver asked
/// for raised, once for the whole pass.
pub(crate) fn end(
    queue: &mut SplitQueue,
    budget: &Budget,
    yielded: bool,
    irq: &dyn Interrupt,
    c: &QueueCounters,
) {
    if yielded {
        events::inc(&c.pass_yields);
    }
    count_reads(budget, &c.descs_walked, &c.max_descs_per_pass);
    events::notify_driver(
        queue.publish_used(),
        irq,
        &c.interrupts,
        &c.interrupts_suppressed,
    );
}

/// Whether a rate limiter let a frame or request go (`res`, from
/// `consume` or `admit`); a refusal is counted in `throttled` and starts
/// `throttled_ns` (the timer's event stops it). A timer that cannot be
/// armed lets it go, a host error: waiting without a wake-up would stop the
/// queue for good.
pub(crate) fn admitted(
    res: Result<bool, RateLimiterError>,
    throttled: &AtomicU64,
    throttled_ns: &TimeCounter,
    errors: HostErrors<'_>,
) -> bool {
    match res {
        Ok(true) => true,
        Ok(false) => {
            events::inc(throttled);
            throttled_ns.start();
            false
        }
        Err(e) => {
            let n = events::inc(errors.counter);
            warn_rate_limited!(
                count = n,
                "{}: rate limiter not applied: {e}",
                errors.device
            );
            true
        }
    }
}

/// Gives a refused chain back to the guest with length 0, counted in
/// `refused` and logged (rate-limited) as `device`'s `what` chain.
pub(crate) fn refuse_chain(
    queue: &mut SplitQueue,
    refused: &AtomicU64,
    device: &str,
    what: &str,
    head: u16,
    err: ChainError,
) {
    let n = events::inc(refused);
    warn_rate_limited!(count = n, "{device}: {what}chain {head} refused: {err}");
    // A head outside the table names no chain: there is nothing to give back.
    if err != ChainError::HeadOutOfRange {
        queue.add_used(head, 0);
    }
}

/// A queue became unusable (a corrupt ring): counted in `queue_errors` and
/// logged; the device stops using it until the driver resets the device.
pub(crate) fn queue_failed(queue_errors: &AtomicU64, device: &str, what: &str, err: &QueueError) {
    let n = events::inc(queue_errors);
    warn_rate_limited!(
        count = n,
        "{device}: {what}queue unusable until the driver resets the device: {err}"
    );
}

/// The ring looked empty: re-enables kicks and looks once more. True if
/// chains arrived meanwhile, and the pass goes on with kicks off again;
/// each such look is charged to `budget`, so a guest that keeps moving
/// `avail.idx` cannot keep a pass going.
pub(crate) fn more_after_drained(
    queue: &mut SplitQueue,
    budget: &mut Budget,
) -> Result<bool, QueueError> {
    if !queue.enable_notifications()? {
        return Ok(false);
    }
    budget.charge(1);
    queue.disable_notifications();
    Ok(true)
}

/// Adds a pass's reads to `descs_walked` and to the gauge of the most one
/// pass made, `max_descs_per_pass` (what the tests and fuzzers hold to
/// `MAX_PASS_READS`).
pub(crate) fn count_reads(
    budget: &Budget,
    descs_walked: &AtomicU64,
    max_descs_per_pass: &AtomicU64,
) {
    let reads = u64::from(budget.spent());
    events::add(descs_walked, reads);
    max_descs_per_pass.fetch_max(reads, Ordering::Relaxed);
}
