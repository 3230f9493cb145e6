// SPDX-License-Identifier: Apache-2.0
//! One pass over the request queue: [`BlockVirtio::process`] takes chains
//! from the avail ring, reads each as a request and runs it, and says why
//! it stopped ([`PassStatus`]) so the event glue knows what to wait for.
//!
//! **Every pass is bounded**, as the network device's: it stops after
//! [`PASS_REQUESTS`] requests or once it has read [`PASS_DESC_BUDGET`](crate::virtio::queue::PASS_DESC_BUDGET) ring
//! entries and descriptors (good and refused chains alike, indirect tables
//! included), whichever comes first, and the event glue re-queues it
//! through an eventfd behind every other ready event. So a pass reads at
//! most [`MAX_PASS_READS`](crate::virtio::queue::MAX_PASS_READS) entries and descriptors, whatever the guest
//! writes into its rings; `BlockMetrics::max_descs_per_pass` shows the
//! largest seen. With `Sync` a pass also does at most `PASS_REQUESTS`
//! requests' I/O; with `Async` it queues at most that many (and never
//! more than the ring holds: a full ring ends the pass until completions
//! come back).
//!
//! **Rate limiting.** A request that passed its checks pays before it runs:
//! its data bytes from the bandwidth bucket, one op from the ops bucket. A
//! request the limiter refuses is kept, popped but not answered, and runs
//! first once the limiter's timer fires: nothing is dropped and nothing
//! overtakes it. Requests answered without running (malformed, UNSUPP) are
//! not charged.
//!
//! Used entries are published, and the interrupt decided, once per pass
//! and once per batch of completions. With `Async` a pass submits what it
//! queued in one `io_uring_enter` and then answers, in the same
//! publication, whatever the kernel completed meanwhile (page-cache I/O
//! completes inline): such a request costs no wake-up of its own. A pass
//! that stopped on a full ring and found room again that way is re-queued
//! (`Yield`), since no completion is left to restart it.

use super::backend::BlockBackend;
use super::io::{finish, run_sync, without_io, AsyncEngine, Needs, SegPool};
use super::metrics::{BlockMetrics, Tally};
use super::request::{Op, Parsed, Parser, Reject, Request, Rules, VIRTIO_BLK_S_IOERR};
use super::{CacheType, ID_BYTES, SECTOR_SIZE};
use crate::rate_limiter::RateLimiter;
use crate::virtio::events;
use crate::virtio::iov;
use crate::virtio::metrics::Counters;
use crate::virtio::pass::{self, admitted, more_after_drained, queue_failed, refuse_chain};
use crate::virtio::queue::{Budget, QueueError, SplitQueue, PASS_WEIGHT_CHAINS};
use crate::virtio::Interrupt;
use crate::warn::warn_rate_limited;

/// Requests one pass takes at most (vhost-net's packet weight, the shared
/// [`PASS_WEIGHT_CHAINS`]).
pub const PASS_REQUESTS: u32 = PASS_WEIGHT_CHAINS;

/// How a pass ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PassStatus {
    /// The avail ring is empty and notifications are enabled again.
    Done,
    /// The request or descriptor budget ran out with chains available.
    Yield,
    /// The rate limiter holds a request back until its timer fires.
    Throttled,
    /// The io_uring is full: the pass goes on when completions come back.
    Saturated,
    /// The queue is unusable until the driver resets the device.
    Broken,
}

/// The request queue of one activation.
#[derive(Debug)]
pub struct BlockVirtio {
    pub(crate) queue: SplitQueue,
    rules: Rules,
    parser: Parser,
    /// FLUSH runs `fdatasync` (`Writeback`).
    flush: bool,
    id: [u8; ID_BYTES],
    /// A request the rate limiter held back: it runs first.
    throttled: Option<Request>,
    broken: bool,
    /// Data-segment vectors of answered requests, for the next ones.
    pool: SegPool,
    /// Request counters of the pass or batch of completions under way.
    tally: Tally,
}

/// Whether the limiter lets `req` run now; counts a refusal.
fn admit(limiter: Option<&mut RateLimiter>, req: &Request, metrics: &BlockMetrics) -> bool {
    let Some(l) = limiter else {
        return true;
    };
    admitted(
        l.consume(req.op.data_len()),
        &metrics.rate_limiter_throttled,
        &metrics.throttled_ns,
        metrics.host_errors(),
    )
}

impl BlockVirtio {
    /// Wraps a ready request queue.
    pub(crate) fn new(queue: SplitQueue, rules: Rules, cache: CacheType, id: &str) -> Self {
        let mut idb = [0u8; ID_BYTES];
        let n = id.len().min(ID_BYTES);
        idb[..n].copy_from_slice(&id.as_bytes()[..n]);
        BlockVirtio {
            queue,
            rules,
            parser: Parser::default(),
            flush: cache == CacheType::Writeback,
            id: idb,
            throttled: None,
            broken: false,
            pool: SegPool::default(),
            tally: Tally::default(),
        }
    }

    /// Whether a request waits for the rate limiter.
    pub fn is_throttled(&self) -> bool {
        self.throttled.is_some()
    }

    /// The image under the queue changed size (another image, or the same
    /// one grown or shrunk): later requests are checked against `capacity`
    /// sectors. A request the limiter holds back was checked against the
    /// old size; one that no longer fits is answered IOERR now, as a
    /// request past the end is, rather than run (a write past the new end
    /// would grow the file).
    pub(crate) fn set_capacity(
        &mut self,
        capacity: u64,
        metrics: &BlockMetrics,
        irq: &dyn Interrupt,
    ) {
        self.rules.capacity = capacity;
        let end = |op: &Op| match *op {
            Op::Read { offset, len }
            | Op::Write { offset, len }
            | Op::Discard { offset, len }
            | Op::WriteZeroes { offset, len, .. } => offset.saturating_add(len),
            Op::Flush | Op::GetId { .. } => 0,
        };
        let bytes = capacity.saturating_mul(SECTOR_SIZE);
        if let Some(req) = self.throttled.take_if(|r| end(&r.op) > bytes) {
            finish(
                &mut self.queue,
                &req,
                VIRTIO_BLK_S_IOERR,
                0,
                &mut self.tally,
                metrics,
            );
            self.publish(irq, metrics);
        }
    }

    /// Runs (Sync, or without I/O) or starts (Async) one request that
    /// passed its checks and the limiter.
    fn start<B: BlockBackend>(
        &mut self,
        mut req: Request,
        backend: &mut B,
        engine: &mut Option<AsyncEngine>,
        metrics: &BlockMetrics,
    ) {
        let (status, written) = match without_io(&req, &self.id, self.flush) {
            Needs::Nothing(status, written) => (status, written),
            Needs::Io => {
                if let Some(e) = engine.as_mut() {
                    match e.start(req) {
                        Ok(()) => return,
                        // The ring refused the entry: this one runs now.
                        Err(back) => req = back,
                    }
                }
                run_sync(backend, &mut req)
            }
        };
        finish(
            &mut self.queue,
            &req,
            status,
            written,
            &mut self.tally,
            metrics,
        );
        self.pool.give(req.data);
    }

    /// Answers a chain that is not run (see `request`).
    fn answer(&mut self, parsed: Parsed, metrics: &BlockMetrics) {
        match parsed {
            Parsed::Ready(_) => {}
            Parsed::Answer { head, status, why } => {
                iov::write_bytes_at(std::slice::from_ref(&status), 0, &[why.status()]);
                self.queue.add_used(head, 1);
                let n = match why {
                    Reject::Malformed(_) => events::inc(&metrics.malformed_requests),
                    Reject::ReadOnly => events::inc(&metrics.read_only_refusals),
                    Reject::Unsupported(_) => events::inc(&metrics.unsupported),
                };
                warn_rate_limited!(count = n, "virtio-blk: request {head} refused: {why:?}");
            }
            Parsed::Refused { head, why: Some(e) } => refuse_chain(
                &mut self.queue,
                &metrics.malformed_requests,
                "virtio-blk",
                "",
                head,
                e,
            ),
            Parsed::Refused { head, why: None } => {
                let n = events::inc(&metrics.malformed_requests);
                warn_rate_limited!(
                    count = n,
                    "virtio-blk: chain {head} refused: no status byte"
                );
                self.queue.add_used(head, 0);
            }
        }
    }

    /// Takes chains until the ring is empty, the budget runs out, the ring
    /// is full or the limiter holds a request back (module doc).
    fn fill<B: BlockBackend>(
        &mut self,
        budget: &mut Budget,
        backend: &mut B,
        engine: &mut Option<AsyncEngine>,
        mut limiter: Option<&mut RateLimiter>,
        metrics: &BlockMetrics,
    ) -> Result<PassStatus, QueueError> {
        let mut requests = 0u32;
        if let Some(req) = self.throttled.take() {
            if !admit(limiter.as_deref_mut(), &req, metrics) {
                self.throttled = Some(req);
                return Ok(PassStatus::Throttled);
            }
            self.start(req, backend, engine, metrics);
            requests += 1;
        }
        loop {
            if engine.as_ref().is_some_and(|e| !e.has_room()) {
                return Ok(PassStatus::Saturated);
            }
            if requests >= PASS_REQUESTS || budget.exhausted() {
                if self.queue.has_available()? {
                    return Ok(PassStatus::Yield);
                }
            } else if let Some(head) = self.queue.pop(budget)? {
                requests += 1;
                let data = self.pool.take();
                let parsed = self
                    .parser
                    .parse(&self.queue, head, &self.rules, data, budget);
                let Parsed::Ready(req) = parsed else {
                    self.answer(parsed, metrics);
                    continue;
                };
                if !admit(limiter.as_deref_mut(), &req, metrics) {
                    self.throttled = Some(req);
                    return Ok(PassStatus::Throttled);
                }
                self.start(req, backend, engine, metrics);
                continue;
            }
            if !more_after_drained(&mut self.queue, budget)? {
                return Ok(PassStatus::Done);
            }
        }
    }

    /// One pass (module doc).
    pub fn process<B: BlockBackend>(
        &mut self,
        backend: &mut B,
        engine: &mut Option<AsyncEngine>,
        limiter: Option<&mut RateLimiter>,
        metrics: &BlockMetrics,
        irq: &dyn Interrupt,
    ) -> PassStatus {
        let Some(mut budget) = pass::begin(&mut self.queue, self.broken, &metrics.queue.passes)
        else {
            return PassStatus::Broken;
        };
        let status = match self.fill(&mut budget, backend, engine, limiter, metrics) {
            Ok(s) => s,
            Err(e) => {
                queue_failed(&metrics.queue.queue_errors, "virtio-blk", "", &e);
                self.broken = true;
                PassStatus::Broken
            }
        };
        let mut status = status;
        if let Some(e) = engine.as_mut() {
            if let Err(err) = e.submit(metrics) {
                // The entries stay queued and go with the next submission
                // (the next completion, kick or pass).
                let n = events::inc(&metrics.host_errors);
                warn_rate_limited!(count = n, "virtio-blk: io_uring submission failed: {err}");
            }
            // What the kernel completed during the submission (page-cache
            // I/O completes inline) is answered in this pass, published
            // with the rest: no wake-up and no second publication for it.
            e.complete(
                backend,
                &mut self.queue,
                &mut self.tally,
                &mut self.pool,
                metrics,
            );
            // Those completions made room: no completion may be left to
            // restart a pass that stopped on a full ring, so it is
            // re-queued instead.
            if status == PassStatus::Saturated && e.has_room() {
                status = PassStatus::Yield;
            }
        }
        self.tally.flush(metrics);
        let yielded = status == PassStatus::Yield;
        pass::end(&mut self.queue, &budget, yielded, irq, &metrics.queue);
        status
    }

    /// Reaps the engine's completions into the queue and publishes them.
    pub fn complete<B: BlockBackend>(
        &mut self,
        backend: &mut B,
        engine: &mut AsyncEngine,
        metrics: &BlockMetrics,
        irq: &dyn Interrupt,
    ) -> usize {
        let n = engine.complete(
            backend,
            &mut self.queue,
            &mut self.tally,
            &mut self.pool,
            metrics,
        );
        self.tally.flush(metrics);
        self.publish(irq, metrics);
        n
    }

    /// Publishes the used entries and raises the interrupt the driver asked
    /// for.
    fn publish(&mut self, irq: &dyn Interrupt, metrics: &BlockMetrics) {
        let c = &metrics.queue;
        events::notify_driver(
            self.queue.publish_used(),
            irq,
            &c.interrupts,
            &c.interrupts_suppressed,
        );
    }
}
