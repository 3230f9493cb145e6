// SPDX-License-Identifier: Apache-2.0
//! One pass over the request queue: [`RngVirtio::process`] takes chains from
//! the avail ring, fills each with random bytes and gives it back, and says
//! why it stopped ([`PassStatus`]) so the event glue knows what to wait for.
//!
//! **Every pass is bounded** by the weights and the budget every device
//! shares: it stops after [`PASS_WEIGHT_CHAINS`] chains, once it has filled
//! [`PASS_WEIGHT_BYTES`], or once it has read
//! [`PASS_DESC_BUDGET`](crate::virtio::queue::PASS_DESC_BUDGET) ring
//! entries and descriptors (good and refused chains alike), whichever comes
//! first, and the event glue re-queues it behind every other ready event.
//! A request gets at most [`MAX_REQUEST_BYTES`], so a pass fills at most
//! `PASS_WEIGHT_BYTES + MAX_REQUEST_BYTES` bytes and reads at most
//! [`MAX_PASS_READS`](crate::virtio::queue::MAX_PASS_READS) entries and
//! descriptors, whatever the guest writes into its rings.
//!
//! **Rate limiting.** A request pays before it is filled: the bytes it will
//! get from the bandwidth bucket, one op from the ops bucket. A request the
//! limiter refuses is kept, popped but not answered, and is served first
//! once the limiter's timer fires: nothing is dropped and nothing overtakes
//! it. A refused chain is not charged.
//!
//! Used entries are published, and the interrupt decided, once per pass.

use super::metrics::RngMetrics;
use super::source::EntropySource;
use super::MAX_REQUEST_BYTES;
use crate::rate_limiter::RateLimiter;
use crate::virtio::events;
use crate::virtio::iov::IoVecs;
use crate::virtio::metrics::Counters;
use crate::virtio::pass::{self, admitted, more_after_drained, queue_failed, refuse_chain};
use crate::virtio::queue::{
    split_seg, Budget, ChainRules, IoSeg, QueueError, SplitQueue, PASS_WEIGHT_BYTES,
    PASS_WEIGHT_CHAINS,
};
use crate::virtio::Interrupt;
use crate::warn::warn_rate_limited;

/// Every buffer device-writable, at least one byte in all.
const RULES: ChainRules = ChainRules {
    device_writes: true,
    min_len: 1,
    max_len: usize::MAX,
};

/// How a pass ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PassStatus {
    /// The avail ring is empty and notifications are enabled again.
    Done,
    /// A weight or the descriptor budget ran out with chains available.
    Yield,
    /// The rate limiter holds a request back until its timer fires.
    Throttled,
    /// The queue is unusable until the driver resets the device.
    Broken,
}

/// A request taken from the ring and not answered yet: its segments are
/// the first of [`RngVirtio::segs`].
#[derive(Debug, Clone, Copy)]
struct Request {
    head: u16,
    /// Bytes it gets: its writable bytes, at most [`MAX_REQUEST_BYTES`].
    len: usize,
}

/// What one pass has done so far.
#[derive(Debug)]
struct Progress {
    budget: Budget,
    chains: u32,
    bytes: u64,
}

/// The request queue of one activation.
#[derive(Debug)]
pub struct RngVirtio {
    queue: SplitQueue,
    /// The segments of the request under way (or held back).
    segs: Vec<IoSeg>,
    /// A request the rate limiter held back: it is served first.
    throttled: Option<Request>,
    broken: bool,
}

impl RngVirtio {
    /// Wraps a ready request queue.
    pub(crate) fn new(queue: SplitQueue) -> Self {
        RngVirtio {
            queue,
            segs: Vec::new(),
            throttled: None,
            broken: false,
        }
    }

    /// Whether a request waits for the rate limiter.
    pub fn is_throttled(&self) -> bool {
        self.throttled.is_some()
    }

    /// One pass (module doc).
    pub fn process<S: EntropySource>(
        &mut self,
        source: &mut S,
        limiter: Option<&mut RateLimiter>,
        metrics: &RngMetrics,
        irq: &dyn Interrupt,
    ) -> PassStatus {
        let Some(budget) = pass::begin(&mut self.queue, self.broken, &metrics.queue.passes) else {
            return PassStatus::Broken;
        };
        let mut p = Progress {
            budget,
            chains: 0,
            bytes: 0,
        };
        let status = match self.fill(&mut p, source, limiter, metrics) {
            Ok(s) => s,
            Err(e) => {
                queue_failed(&metrics.queue.queue_errors, "virtio-rng", "", &e);
                self.broken = true;
                PassStatus::Broken
            }
        };
        let yielded = status == PassStatus::Yield;
        pass::end(&mut self.queue, &p.budget, yielded, irq, &metrics.queue);
        status
    }

    /// Serves chains until the ring is empty, a bound is reached or the
    /// limiter holds a request back (module doc).
    fn fill<S: EntropySource>(
        &mut self,
        p: &mut Progress,
        source: &mut S,
        mut limiter: Option<&mut RateLimiter>,
        metrics: &RngMetrics,
    ) -> Result<PassStatus, QueueError> {
        let mut next = self.throttled.take();
        loop {
            if let Some(req) = next.take() {
                if !Self::admit(limiter.as_deref_mut(), req, metrics) {
                    self.throttled = Some(req);
                    return Ok(PassStatus::Throttled);
                }
                p.bytes += self.serve(req, source, metrics) as u64;
                continue;
            }
            if p.chains >= PASS_WEIGHT_CHAINS
                || p.bytes >= PASS_WEIGHT_BYTES
                || p.budget.exhausted()
            {
                if self.queue.has_available()? {
                    return Ok(PassStatus::Yield);
                }
            } else if let Some(head) = self.queue.pop(&mut p.budget)? {
                p.chains += 1;
                next = self.take(head, &mut p.budget, metrics);
                continue;
            }
            if !more_after_drained(&mut self.queue, &mut p.budget)? {
                return Ok(PassStatus::Done);
            }
        }
    }

    /// Walks the chain at `head`: the request it makes, or `None` when it
    /// is refused (and given back).
    fn take(&mut self, head: u16, budget: &mut Budget, metrics: &RngMetrics) -> Option<Request> {
        self.segs.clear();
        match self.queue.walk(head, &RULES, &mut self.segs, budget) {
            Ok(chain) => Some(Request {
                head,
                len: chain.len.min(MAX_REQUEST_BYTES),
            }),
            Err(e) => {
                refuse_chain(
                    &mut self.queue,
                    &metrics.malformed_chains,
                    "virtio-rng",
                    "",
                    head,
                    e,
                );
                None
            }
        }
    }

    /// Whether the limiter lets `req` be served now; counts a refusal.
    fn admit(limiter: Option<&mut RateLimiter>, req: Request, metrics: &RngMetrics) -> bool {
        let Some(l) = limiter else {
            return true;
        };
        admitted(
            l.consume(req.len as u64),
            &metrics.rate_limiter_throttled,
            &metrics.throttled_ns,
            metrics.host_errors(),
        )
    }

    /// Fills `req`'s first `len` bytes from `source`, one call per segment
    /// (again for the rest after a short return), and gives the chain back
    /// with the bytes filled; returns them. A source that fails, or returns
    /// nothing twice in a row, ends the filling there: a host error.
    fn serve<S: EntropySource>(
        &mut self,
        req: Request,
        source: &mut S,
        metrics: &RngMetrics,
    ) -> usize {
        let mut left = req.len;
        let mut done = 0;
        'segs: for &seg in &self.segs {
            let (mut part, _) = split_seg(seg, left);
            let mut stalled = false;
            while !part.is_empty() {
                match source.fill(IoVecs::guest(std::slice::from_ref(&part))) {
                    Ok(n) if n > 0 => {
                        let n = n.min(part.len());
                        done += n;
                        left -= n;
                        part = split_seg(part, n).1;
                        stalled = false;
                    }
                    // EINTR, or a source with nothing this once: again.
                    Ok(_) if !stalled => stalled = true,
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted && !stalled => {
                        stalled = true
                    }
                    res => {
                        Self::source_failed(res.err(), metrics);
                        break 'segs;
                    }
                }
            }
            if left == 0 {
                break;
            }
        }
        // At most MAX_REQUEST_BYTES.
        self.queue.add_used(req.head, done as u32);
        events::inc(&metrics.requests);
        events::add(&metrics.entropy_bytes, done as u64);
        done
    }

    /// The host's generator failed (`err`) or gave nothing: counted and
    /// logged (rate-limited); the request goes back with what it has.
    fn source_failed(err: Option<std::io::Error>, metrics: &RngMetrics) {
        events::inc(&metrics.host_rng_fails);
        let n = events::inc(&metrics.host_errors);
        match err {
            Some(e) => warn_rate_limited!(count = n, "virtio-rng: getrandom failed: {e}"),
            None => warn_rate_limited!(count = n, "virtio-rng: getrandom returned no bytes"),
        }
    }
}
