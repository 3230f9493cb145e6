// SPDX-License-Identifier: Apache-2.0
//! What the RX and TX passes share: one pass's bookkeeping (`Pass`) and the
//! bounds that end it. How a refused chain is returned and a queue or
//! limiter failure reported is the same for every device
//! (`virtio::pass`).
//!
//! **Every pass is bounded.** Both directions stop a pass after a byte weight
//! or a packet weight (vhost-net's 0x80000 bytes / 256 packets by default) so
//! that a flood in one direction cannot delay the other. Independently of the
//! weights, and also when they are 0, a pass stops once it has read
//! [`PASS_DESC_BUDGET`] (shared by every device) ring entries and descriptors: every descriptor read
//! counts, through indirect tables too, for good and refused chains alike,
//! and a refused chain counts as one packet against the packet weight. RX
//! cache filling spends the same budget. A pass may also end by time: with a
//! time budget (`NetConfig::pass_time_budget_us`) it yields once it has run
//! that long, looking at the clock every [`CLOCK_STRIDE`] packets. A packet
//! weight bounds a pass by frames, whose cost varies a hundredfold with
//! their size and the host; the time budget bounds what the other direction
//! waits for, which is what fairness is about. A pass cut short any of these
//! ways returns `WeightHit` and the event glue re-queues it behind every
//! other ready event. So a pass never reads more than
//! [`MAX_PASS_READS`](crate::virtio::queue::MAX_PASS_READS) ring
//! entries and descriptors, whatever the guest writes into its rings and
//! whenever it writes it; `NetMetrics::max_descs_per_pass` shows the largest
//! seen.
//!
//! Used entries are published once per pass (see [`SplitQueue`]), and the
//! per-frame counters are added to [`NetMetrics`] once per pass as well.

use std::sync::atomic::AtomicU64;
use std::time::{Duration, Instant};

use super::metrics::NetMetrics;
use crate::virtio::events;
use crate::virtio::pass::count_reads;
use crate::virtio::queue::{Budget, Notify, SplitQueue, PASS_DESC_BUDGET};
use crate::virtio::Interrupt;

/// Packets (frames and refused chains) between two looks at the clock when a
/// pass has a time budget. The clock is the vDSO's (tens of ns, about 1 % of
/// the cheapest frame, a 2.8 µs TAP write of a tiny frame); every fourth
/// frame makes it a quarter of that, and a pass overshoots its budget by at
/// most three frames. The first look comes after this many packets, so
/// every pass makes progress however small the budget.
pub const CLOCK_STRIDE: u64 = 4;

/// Why a pass must yield.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Yield {
    /// The byte or packet weight.
    Weight,
    /// The time budget.
    Time,
    /// The descriptor budget.
    Descs,
}

/// One pass's progress, added to the metrics once at its end.
#[derive(Debug)]
pub(super) struct Pass {
    pub(super) budget: Budget,
    /// Frames and refused chains (the packet weight counts both).
    pub(super) packets: u64,
    /// Frame bytes including the vnet header (the byte weight).
    pub(super) bytes: u64,
    /// Frames delivered or sent, frame bytes without the header, and (RX)
    /// buffers used: the counters of `NetMetrics`.
    pub(super) frames: u64,
    pub(super) payload: u64,
    pub(super) buffers: u64,
    /// When the pass must end, with a time budget.
    pub(super) deadline: Option<Instant>,
    /// `packets` at which the clock is read next.
    pub(super) next_clock: u64,
    /// The deadline has passed (sticky: a pass that looked at the ring once
    /// more after yielding must not run on).
    pub(super) out_of_time: bool,
    /// When the pass started, with a time budget.
    pub(super) started: Option<Instant>,
    /// TX batches written so far.
    pub(super) batches: u32,
}

impl Pass {
    pub(super) fn new(time_budget: Option<Duration>) -> Self {
        let started = time_budget.map(|_| Instant::now());
        Pass {
            budget: Budget::new(PASS_DESC_BUDGET),
            packets: 0,
            bytes: 0,
            frames: 0,
            payload: 0,
            buffers: 0,
            deadline: started.zip(time_budget).map(|(s, t)| s + t),
            next_clock: CLOCK_STRIDE,
            out_of_time: false,
            started,
            batches: 0,
        }
    }

    /// Whether one more TX batch, if it costs what this pass's batches
    /// cost on average, would end past the deadline. A batch is written in
    /// one go, so the clock read every few chains while filling it cannot
    /// stop it halfway; this look before each batch after the first keeps
    /// the overshoot to a fraction of a batch instead of a whole one.
    #[inline]
    pub(super) fn no_room_for_batch(&mut self) -> bool {
        let (Some(started), Some(deadline)) = (self.started, self.deadline) else {
            return false;
        };
        if !self.out_of_time && self.batches > 0 {
            let now = Instant::now();
            let per_batch = (now - started) / self.batches;
            self.out_of_time = now + per_batch > deadline;
        }
        self.out_of_time
    }

    /// Whether the pass has used up its time budget; reads the clock only
    /// every [`CLOCK_STRIDE`] packets.
    #[inline(always)]
    fn out_of_time(&mut self) -> bool {
        if let Some(deadline) = self.deadline {
            if !self.out_of_time && self.packets >= self.next_clock {
                self.next_clock = self.packets + CLOCK_STRIDE;
                self.out_of_time = Instant::now() >= deadline;
            }
        }
        self.out_of_time
    }

    /// Whether the pass must yield, and why. Asked once per frame: inlined
    /// (out of line it cost about 25 instructions per frame under callgrind).
    #[inline(always)]
    pub(super) fn must_yield(&mut self, weight_bytes: u64, weight_packets: u64) -> Option<Yield> {
        if (weight_bytes != 0 && self.bytes >= weight_bytes)
            || (weight_packets != 0 && self.packets >= weight_packets)
        {
            Some(Yield::Weight)
        } else if self.budget.exhausted() {
            Some(Yield::Descs)
        } else if self.out_of_time() {
            Some(Yield::Time)
        } else {
            None
        }
    }

    /// Counts why a pass yielded.
    pub(super) fn count_yield(why: Yield, weight_hits: &AtomicU64, m: &NetMetrics) {
        events::inc(match why {
            Yield::Weight => weight_hits,
            Yield::Time => &m.time_budget_hits,
            Yield::Descs => &m.desc_budget_hits,
        });
    }

    /// Publishes the pass's used entries, raises the interrupt the driver
    /// asked for and adds the pass's work to the metrics.
    ///
    /// `requeued`: the pass was cut short and the event loop runs the next
    /// one right behind it. Its interrupt then waits for that pass, unless
    /// [`coalesce_limit`] used entries are already waiting: a saturated
    /// direction interrupts the driver every 64 buffers instead of every
    /// pass (a 100 µs pass holds only about seven 64 KiB RX frames),
    /// and each interrupt wakes the driver, which then preempts the device
    /// on a shared core. `used.idx` is still stored, so a polling driver
    /// sees every pass's entries; the first pass that ends otherwise (ring
    /// drained, starved, throttled, backend full) decides the interrupt for
    /// everything since the last decision.
    pub(super) fn finish(
        self,
        queue: &mut SplitQueue,
        irq: &dyn Interrupt,
        m: &NetMetrics,
        requeued: bool,
    ) {
        let notify = if requeued && queue.unsignalled() < coalesce_limit(queue.size()) {
            if queue.unsignalled() > 0 {
                events::inc(&m.interrupts_coalesced);
            }
            queue.publish_used_quietly();
            Notify::Nothing
        } else {
            queue.publish_used()
        };
        events::notify_driver(notify, irq, &m.interrupts, &m.interrupts_suppressed);
        count_reads(&self.budget, &m.descs_walked, &m.max_descs_per_pass);
    }
}

/// Used entries a re-queued pass may leave without an interrupt decision:
/// 64 (vhost-net signals used buffers in batches of 64, `VHOST_NET_BATCH`),
/// and at most a quarter of the ring, so that a driver with few buffers gets
/// them back long before it runs dry. With 32, a TX pass of one 32-frame
/// batch still interrupted every pass (BENCHMARKS.md).
#[inline]
pub(super) fn coalesce_limit(queue_size: u16) -> u16 {
    (queue_size / 4).clamp(1, 64)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A pass that started `ago` before now with a `budget` and `batches`
    /// TX batches written.
    fn pass_at(budget: Duration, ago: Duration, batches: u32) -> Pass {
        let mut p = Pass::new(Some(budget));
        let started = Instant::now() - ago;
        p.started = Some(started);
        p.deadline = Some(started + budget);
        p.batches = batches;
        p
    }

    #[test]
    fn test_a_pass_past_its_deadline_stops_at_the_next_look_at_the_clock() {
        let mut p = Pass::new(Some(Duration::from_secs(3600)));
        // No look before the first stride: every pass makes progress.
        for packets in 0..CLOCK_STRIDE {
            p.packets = packets;
            assert!(!p.out_of_time(), "{packets} packets");
        }
        p.packets = CLOCK_STRIDE;
        assert!(!p.out_of_time(), "an hour's budget is not spent");
        // The deadline passes between two looks: the packets up to the next
        // look still go (the overshoot is under one stride), that one stops.
        p.deadline = Some(Instant::now() - Duration::from_millis(1));
        for k in 1..CLOCK_STRIDE {
            p.packets = CLOCK_STRIDE + k;
            assert!(
                !p.out_of_time(),
                "looked at the clock at packet {}",
                p.packets
            );
        }
        p.packets = 2 * CLOCK_STRIDE;
        assert!(p.out_of_time(), "the second look sees the deadline");
        // Sticky.
        p.deadline = Some(Instant::now() + Duration::from_secs(3600));
        p.packets += 1;
        assert!(p.out_of_time());
    }

    #[test]
    fn test_a_batch_starts_only_if_an_average_one_fits_the_time_budget() {
        let ms = Duration::from_millis;
        // The first batch always goes: the pass must make progress.
        assert!(!pass_at(ms(100), ms(99), 0).no_room_for_batch());
        // One batch took 60 ms: another would end at 120 ms > 100 ms.
        assert!(pass_at(ms(100), ms(60), 1).no_room_for_batch());
        // Two took 60 ms: a third ends at about 90 ms.
        assert!(!pass_at(ms(100), ms(60), 2).no_room_for_batch());
        // Sticky once out of time.
        let mut p = pass_at(ms(100), ms(60), 1);
        assert!(p.no_room_for_batch());
        p.batches = 100;
        assert!(p.no_room_for_batch());
        // No budget, no limit.
        let mut p = Pass::new(None);
        p.batches = 1_000;
        assert!(!p.no_room_for_batch());
    }
}
