// SPDX-License-Identifier: Apache-2.0
//! The datapath: moving frames between the backend and the virtqueues.
//!
//! [`RxVirtio`] and [`TxVirtio`] own one [`SplitQueue`] each and know nothing
//! about epoll: a pass is one call to `process`, which returns why it stopped
//! ([`RxStatus`], [`TxStatus`]) so the event glue can decide what to wait for
//! next.
//!
//! RX is zero copy: the device pops RX chains until their writable capacity
//! reaches the largest frame the backend may deliver under the negotiated
//! offloads (12 + 1514 bytes without guest TSO/UFO, 12 + 65550 with them),
//! then does one `readv` straight into all of them. With MRG_RXBUF the frame
//! lands in as many chains as it needs; each is returned with the bytes it got
//! and `num_buffers` in the header says how many (virtio 1.1 §5.1.6.4). The
//! 12-byte header counts inside the first buffer, so a 1526-byte buffer takes
//! a whole 1514-byte frame. Chains popped but not filled stay cached for the
//! next frame instead of being pushed back to the ring, so their descriptors
//! are walked and checked once. Without MRG_RXBUF a frame must fit one chain;
//! one that does not is dropped and counted, never split.
//!
//! A trailing one-byte host buffer after the guest segments tells a frame
//! that filled the buffers exactly from one that was truncated: a read from
//! a TAP, as from a socket, returns only what fit
//! (`tap::tests::test_real_tap_read_returns_only_what_fit`).
//!
//! TX is zero copy too: each chain goes out with one `writev` of its
//! descriptors as the guest laid them out, header included. EAGAIN keeps the
//! chain pending until the backend is writable again.
//!
//! **Rate limiting.** A direction with a [`RateLimiter`] pays for every
//! frame in the limiter's tokens (frame bytes, vnet header excluded, and one
//! op). TX pays before the `writev`; a refused chain stays pending, popped
//! but not used, so nothing is lost and the guest sees no completion. RX
//! learns a frame's size only from the read, so it asks for admission before
//! the read and pays after (into debt if need be). Either way the pass ends
//! with `Throttled`, which counts no weight hit, and the event glue waits for
//! the limiter's timer. Without a limiter the cost is one predicted branch
//! per frame.
//!
//! **Every pass is bounded.** Both directions stop a pass after a byte weight
//! or a packet weight (vhost-net's 0x80000 bytes / 256 packets by default) so
//! that a flood in one direction cannot delay the other. Independently of the
//! weights, and also when they are 0, a pass stops once it has read
//! [`PASS_DESC_BUDGET`] ring entries and descriptors: every descriptor read
//! counts, through indirect tables too, for good and refused chains alike,
//! and a refused chain counts as one packet against the packet weight. RX
//! cache filling spends the same budget. A pass may also end by time: with a
//! time budget (`NetConfig::pass_time_budget_us`) it yields once it has run
//! that long, looking at the clock every [`CLOCK_STRIDE`] packets. A packet
//! weight bounds a pass by frames, whose cost varies a hundredfold with
//! their size and the host; the time budget bounds what the other direction
//! waits for, which is what fairness is about. A pass cut short any of these
//! ways returns `WeightHit` and the event glue re-queues it behind every
//! other ready event. So a pass never reads more than [`MAX_PASS_READS`]
//! entries and descriptors, whatever the guest writes into its rings and
//! whenever it writes it; `NetMetrics::max_descs_per_pass` shows the largest
//! seen.
//!
//! Used entries are published once per pass (see [`SplitQueue`]), and the
//! per-frame counters are added to [`NetMetrics`] once per pass as well.

use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use super::iov::{self, IoVecs};
use super::metrics::{NetMetrics, TimeCounter};
use super::tap::NetBackend;
use super::uring::{TxRing, NOT_TRIED, TX_BATCH, TX_BATCH_BYTES};
use super::{warn_rate_limited, MAX_FRAME_GSO, NUM_BUFFERS_OFFSET, VNET_HDR_LEN};
use crate::rate_limiter::{RateLimiter, RateLimiterError};
pub use crate::virtio::queue::ChainError;
use crate::virtio::queue::{
    Budget, Chain, ChainRules, IoSeg, Notify, QueueError, SplitQueue, IOV_MAX, MAX_CHAIN_SEGS,
};
use crate::virtio::Interrupt;

/// Largest TX chain accepted: a 64 KiB GSO frame plus the vnet header.
pub const MAX_TX_CHAIN_LEN: usize = VNET_HDR_LEN + MAX_FRAME_GSO;
/// Size of the bounce buffer of the copying baseline (vmm-reference's 64 KiB,
/// rounded up so the largest GSO frame fits).
pub const BOUNCE_BUFFER_LEN: usize = MAX_TX_CHAIN_LEN;
/// Ring entries and descriptors one pass may read before it yields, whatever
/// the weights (a fixed hard cap: 0 weights only turn the weights off). Well
/// above what a weighted pass of real traffic reads: 256 frames of 19
/// descriptors (a 64 KiB frame in page fragments) are 5,120.
pub const PASS_DESC_BUDGET: u32 = 8192;
/// Most ring entries and descriptors a pass can read: the budget is checked
/// before each chain, one chain costs at most its avail entry, the
/// descriptor pointing to an indirect table and `MAX_CHAIN_SEGS + 1`
/// buffer descriptors (the last one refused), and the pass may look at
/// `avail.idx` once more after re-enabling notifications.
pub const MAX_PASS_READS: u32 = PASS_DESC_BUDGET + MAX_CHAIN_SEGS as u32 + 3;

const RX_RULES: ChainRules = ChainRules {
    device_writes: true,
    min_len: VNET_HDR_LEN,
    max_len: usize::MAX,
};
const TX_RULES: ChainRules = ChainRules {
    device_writes: false,
    min_len: VNET_HDR_LEN,
    max_len: MAX_TX_CHAIN_LEN,
};

/// Packets (frames and refused chains) between two looks at the clock when a
/// pass has a time budget. The clock is the vDSO's (tens of ns, about 1 % of
/// the cheapest frame, a 2.8 µs TAP write of a tiny frame); every fourth
/// frame makes it a quarter of that, and a pass overshoots its budget by at
/// most three frames. The first look comes after this many packets, so
/// every pass makes progress however small the budget.
pub const CLOCK_STRIDE: u64 = 4;

/// Why a pass must yield.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Yield {
    /// The byte or packet weight.
    Weight,
    /// The time budget.
    Time,
    /// The descriptor budget.
    Descs,
}

/// One pass's progress, added to the metrics once at its end.
#[derive(Debug)]
struct Pass {
    budget: Budget,
    /// Frames and refused chains (the packet weight counts both).
    packets: u64,
    /// Frame bytes including the vnet header (the byte weight).
    bytes: u64,
    /// Frames delivered or sent, frame bytes without the header, and (RX)
    /// buffers used: the counters of `NetMetrics`.
    frames: u64,
    payload: u64,
    buffers: u64,
    /// When the pass must end, with a time budget.
    deadline: Option<Instant>,
    /// `packets` at which the clock is read next.
    next_clock: u64,
    /// The deadline has passed (sticky: a pass that looked at the ring once
    /// more after yielding must not run on).
    out_of_time: bool,
    /// When the pass started, with a time budget.
    started: Option<Instant>,
    /// TX batches written so far.
    batches: u32,
}

impl Pass {
    fn new(time_budget: Option<Duration>) -> Self {
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
    fn no_room_for_batch(&mut self) -> bool {
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
    fn must_yield(&mut self, weight_bytes: u64, weight_packets: u64) -> Option<Yield> {
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
    fn count_yield(why: Yield, weight_hits: &AtomicU64, m: &NetMetrics) {
        NetMetrics::inc(match why {
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
    fn finish(self, queue: &mut SplitQueue, irq: &dyn Interrupt, m: &NetMetrics, requeued: bool) {
        let notify = if requeued && queue.unsignalled() < coalesce_limit(queue.size()) {
            if queue.unsignalled() > 0 {
                NetMetrics::inc(&m.interrupts_coalesced);
            }
            queue.publish_used_quietly();
            Notify::Nothing
        } else {
            queue.publish_used()
        };
        match notify {
            Notify::Nothing => {}
            Notify::Interrupt => {
                NetMetrics::inc(&m.interrupts);
                irq.signal_used_queue();
            }
            Notify::Suppressed => {
                NetMetrics::inc(&m.interrupts_suppressed);
            }
        }
        let reads = u64::from(self.budget.spent());
        NetMetrics::add(&m.descs_walked, reads);
        m.max_descs_per_pass.fetch_max(reads, Ordering::Relaxed);
    }
}

/// Used entries a re-queued pass may leave without an interrupt decision:
/// 64 (vhost-net signals used buffers in batches of 64, `VHOST_NET_BATCH`),
/// and at most a quarter of the ring, so that a driver with few buffers gets
/// them back long before it runs dry. With 32, a TX pass of one 32-frame
/// batch still interrupted every pass (BENCHMARKS.md).
#[inline]
fn coalesce_limit(queue_size: u16) -> u16 {
    (queue_size / 4).clamp(1, 64)
}

/// Returns a refused chain to the guest with length 0 and counts it.
fn return_malformed(
    queue: &mut SplitQueue,
    metrics: &NetMetrics,
    head: u16,
    err: ChainError,
    dir: &str,
) {
    let n = NetMetrics::inc(&metrics.malformed_chains);
    warn_rate_limited(n, format_args!("{dir} chain {head} refused: {err}"));
    // A head outside the table names no chain: there is nothing to give back.
    if err != ChainError::HeadOutOfRange {
        queue.add_used(head, 0);
    }
}

// The limiter calls stay out of line (`inline(never)`): inlined, they grew
// the RX pass enough that the compiler stopped inlining `readv`, and the
// unlimited datapath paid for the limited one.

/// Whether the RX limiter admits a read now; counts a refusal.
#[inline(never)]
fn rx_admit(l: &mut RateLimiter, metrics: &NetMetrics) -> bool {
    admitted(
        l.admit(),
        &metrics.rx_rate_limiter_throttled,
        &metrics.rx_throttled_ns,
        metrics,
    )
}

/// Pays for an RX frame of `n` bytes, vnet header included.
#[inline(never)]
fn rx_charge(l: &mut RateLimiter, n: usize) {
    l.charge(n.saturating_sub(VNET_HDR_LEN) as u64);
}

/// Whether the TX limiter lets a chain of `len` bytes, vnet header
/// included, go now; counts a refusal.
#[inline(never)]
fn tx_consume(l: &mut RateLimiter, len: usize, metrics: &NetMetrics) -> bool {
    admitted(
        l.consume(len.saturating_sub(VNET_HDR_LEN) as u64),
        &metrics.tx_rate_limiter_throttled,
        &metrics.tx_throttled_ns,
        metrics,
    )
}

/// Whether the rate limiter let a frame go; a refusal is counted in
/// `throttled` and starts `throttled_ns` (the timer's event stops it). A
/// timer that cannot be armed lets the frame go: blocking without a wake-up
/// would stop the direction for good.
fn admitted(
    res: Result<bool, RateLimiterError>,
    throttled: &std::sync::atomic::AtomicU64,
    throttled_ns: &TimeCounter,
    metrics: &NetMetrics,
) -> bool {
    match res {
        Ok(true) => true,
        Ok(false) => {
            NetMetrics::inc(throttled);
            throttled_ns.start();
            false
        }
        Err(e) => {
            let n = NetMetrics::inc(&metrics.host_errors);
            warn_rate_limited(n, format_args!("rate limiter not applied: {e}"));
            true
        }
    }
}

fn queue_failed(metrics: &NetMetrics, dir: &str, err: &QueueError) {
    let n = NetMetrics::inc(&metrics.queue_errors);
    warn_rate_limited(
        n,
        format_args!("{dir} queue unusable until the driver resets the device: {err}"),
    );
}

/// How an RX pass ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RxStatus {
    /// The backend has no more frames (EAGAIN).
    Drained,
    /// The guest has not posted enough buffers; reading stopped until the
    /// next RX queue notification.
    Starved,
    /// The pass hit the byte or packet weight or the descriptor budget; more
    /// frames or chains may be waiting.
    WeightHit,
    /// The queue is unusable until the driver resets the device.
    Broken,
    /// The rate limiter holds the next frame back; reading waits for its
    /// timer.
    Throttled,
    /// The backend returned 0 bytes: a 0-byte message from a socket peer,
    /// or end of file once the peer hung up. Only the event glue can tell
    /// (EPOLLHUP), so the pass stops there.
    ZeroRead,
}

/// The result of one read from the backend.
enum Read {
    /// A frame of this many bytes (vnet header included) was delivered.
    Frame(usize),
    /// A frame was read but dropped (it did not fit, or was a runt).
    Dropped,
    /// The read returned 0 bytes.
    Zero,
}

/// The receive side: one RX queue filled from the backend.
#[derive(Debug)]
pub struct RxVirtio {
    pub(crate) queue: SplitQueue,
    mrg_rxbuf: bool,
    /// Largest frame the backend may deliver, vnet header included.
    max_frame: usize,
    weight_bytes: u64,
    weight_packets: u64,
    /// How long one pass may run (None: no time budget).
    time_budget: Option<Duration>,
    /// Chains popped and validated but not filled yet, in ring order.
    chains: Fifo<Chain>,
    /// Segments of `chains`, in the same order.
    segs: Fifo<IoSeg>,
    cached_len: usize,
    cached_descs: usize,
    /// The I/O vector of one `readv` (a copy of the first segments).
    iov: Vec<IoSeg>,
    /// Catches the first byte past the guest buffers to detect truncation.
    overflow: [u8; 1],
    bounce: Option<Vec<u8>>,
    starved_since: Option<Instant>,
    broken: bool,
}

impl RxVirtio {
    /// Wraps a ready RX queue; `max_frame` includes the vnet header.
    pub fn new(
        queue: SplitQueue,
        mrg_rxbuf: bool,
        max_frame: usize,
        weight_bytes: u64,
        weight_packets: u64,
        bounce: bool,
    ) -> Self {
        RxVirtio {
            queue,
            mrg_rxbuf,
            max_frame,
            weight_bytes,
            weight_packets,
            time_budget: None,
            chains: Fifo::new(),
            segs: Fifo::new(),
            cached_len: 0,
            cached_descs: 0,
            iov: Vec::new(),
            overflow: [0],
            bounce: bounce.then(|| vec![0u8; BOUNCE_BUFFER_LEN + 1]),
            starved_since: None,
            broken: false,
        }
    }

    /// Ends every pass after `budget` as well (None: no time budget).
    pub fn with_time_budget(mut self, budget: Option<Duration>) -> Self {
        self.time_budget = budget;
        self
    }

    /// Whether the queue is unusable until a reset.
    pub fn is_broken(&self) -> bool {
        self.broken
    }

    /// Whether the last pass ended starved (and when that began).
    pub fn starved_since(&self) -> Option<Instant> {
        self.starved_since
    }

    /// Ends a starvation period, adding its length to `rx_starved_ns`.
    /// Returns whether the device was starved.
    pub fn end_starvation(&mut self, metrics: &NetMetrics) -> bool {
        let starved = self.starved_since.take().is_some();
        if starved {
            metrics.rx_starved_ns.stop();
        }
        starved
    }

    /// Whether the cached chains can take the next frame.
    fn enough_buffers(&self) -> bool {
        if self.chains.is_empty() {
            return false;
        }
        // With MRG_RXBUF, read once the cache can hold the largest possible
        // frame, or once it holds every descriptor of the ring (the guest
        // cannot post more, so waiting would deadlock; a frame that does not
        // fit is then dropped), or once one readv could not take more.
        !self.mrg_rxbuf
            || self.cached_len >= self.max_frame
            || self.cached_descs >= usize::from(self.queue.size())
            || self.segs.len() >= IOV_MAX - 1
    }

    /// Pops chains into the cache until it can take a frame, the ring is
    /// empty, or the pass must yield.
    #[inline]
    fn fill_cache(&mut self, pass: &mut Pass, metrics: &NetMetrics) -> Result<Fill, QueueError> {
        while !self.enough_buffers() {
            if let Some(why) = pass.must_yield(self.weight_bytes, self.weight_packets) {
                return Ok(Fill::Yield(why));
            }
            let Some(head) = self.queue.pop(&mut pass.budget)? else {
                return Ok(Fill::Empty);
            };
            match self
                .queue
                .walk(head, &RX_RULES, self.segs.tail(), &mut pass.budget)
            {
                Ok(chain) => {
                    self.cached_len += chain.len;
                    self.cached_descs += chain.ring_descs;
                    self.chains.tail().push(chain);
                }
                Err(err) => {
                    pass.packets += 1;
                    return_malformed(&mut self.queue, metrics, head, err, "RX");
                }
            }
        }
        Ok(Fill::Enough)
    }

    /// Reads one frame into the cached chains.
    fn read_frame<B: NetBackend>(
        &mut self,
        backend: &B,
        pass: &mut Pass,
        metrics: &NetMetrics,
    ) -> io::Result<Read> {
        // Chains offered to this read: without MRG_RXBUF only the first; with
        // it, as many as the largest frame needs and one syscall takes.
        let mut nsegs = 0;
        let mut cap = 0;
        let mut nchains = 0;
        for (i, c) in self.chains.items().iter().enumerate() {
            if i > 0 && (!self.mrg_rxbuf || cap >= self.max_frame || nsegs + c.nsegs >= IOV_MAX) {
                break;
            }
            nsegs += c.nsegs;
            cap += c.len;
            nchains += 1;
        }

        let n = match self.bounce.as_mut() {
            Some(bounce) => {
                let n = iov::host_buf(bounce, |io| backend.recv_frame(io))?;
                if n <= cap {
                    iov::copy_to_segs(&self.segs.items()[..nsegs], 0, &bounce[..n]);
                }
                n
            }
            // The usual case: the read may fill every cached segment, so
            // they are the I/O vector as they lie.
            None if nsegs == self.segs.len() => {
                let (v, from) = self.segs.raw();
                iov::with_tail(v, from, &mut self.overflow, |io| backend.recv_frame(io))?
            }
            None => {
                self.iov.clear();
                self.iov.extend_from_slice(&self.segs.items()[..nsegs]);
                iov::with_tail(&mut self.iov, 0, &mut self.overflow, |io| {
                    backend.recv_frame(io)
                })?
            }
        };
        if n == 0 {
            return Ok(Read::Zero);
        }
        if !(VNET_HDR_LEN..=cap).contains(&n) {
            // The chains keep their place in the cache for the next frame.
            let d = NetMetrics::inc(&metrics.rx_dropped);
            warn_rate_limited(
                d,
                format_args!("dropped a {n}-byte RX frame: posted buffers hold {cap} bytes"),
            );
            return Ok(Read::Dropped);
        }

        // Return the chains the frame filled, each with the bytes it got
        // (n <= cap, the capacity of the first `nchains`).
        let mut left = n;
        let mut used = 0usize;
        let mut used_segs = 0;
        for c in &self.chains.items()[..nchains] {
            if left == 0 {
                break;
            }
            let take = left.min(c.len);
            left -= take;
            used += 1;
            used_segs += c.nsegs;
            self.cached_len -= c.len;
            self.cached_descs -= c.ring_descs;
            // Frame lengths are at most 12 + 65550, well within u32.
            self.queue.add_used(c.head, take as u32);
        }
        // num_buffers (virtio 1.1 §5.1.6.4): 1 without MRG_RXBUF. The backend
        // leaves these two bytes untouched, so they must always be written.
        let nb = u16::try_from(used).unwrap_or(u16::MAX).to_le_bytes();
        iov::write_bytes_at(self.segs.items(), NUM_BUFFERS_OFFSET, &nb);
        self.chains.consume(used);
        self.segs.consume(used_segs);

        pass.frames += 1;
        pass.payload += (n - VNET_HDR_LEN) as u64;
        pass.buffers += used as u64;
        Ok(Read::Frame(n))
    }

    /// One RX pass: reads frames until the backend is empty, the guest runs
    /// out of buffers, the rate limiter (if any) holds the next frame back,
    /// or the pass must yield.
    pub fn process<B: NetBackend>(
        &mut self,
        backend: &B,
        mut limiter: Option<&mut RateLimiter>,
        metrics: &NetMetrics,
        irq: &dyn Interrupt,
    ) -> RxStatus {
        if self.broken {
            return RxStatus::Broken;
        }
        NetMetrics::inc(&metrics.rx_passes);
        let mut pass = Pass::new(self.time_budget);
        let status = loop {
            match self.fill_cache(&mut pass, metrics) {
                Err(e) => {
                    queue_failed(metrics, "RX", &e);
                    break RxStatus::Broken;
                }
                Ok(Fill::Yield(why)) => {
                    Pass::count_yield(why, &metrics.rx_weight_hits, metrics);
                    break RxStatus::WeightHit;
                }
                // We have buffers: the guest need not kick us for more until
                // we run short again.
                Ok(Fill::Enough) => self.queue.disable_notifications(),
                Ok(Fill::Empty) => {
                    // Ask for a kick when buffers are posted, then look once
                    // more: some may have arrived before the request landed.
                    match self.queue.enable_notifications() {
                        Ok(true) => {
                            pass.budget.charge(1);
                            continue;
                        }
                        // We cannot tell whether another frame waits without
                        // reading it. Keep polling the backend: if one does,
                        // the next pass starts without buffers and starves.
                        Ok(false) if pass.frames > 0 => break RxStatus::Drained,
                        Ok(false) => {
                            NetMetrics::inc(&metrics.rx_no_avail_buffer);
                            self.starved_since = Some(Instant::now());
                            metrics.rx_starved_ns.start();
                            break RxStatus::Starved;
                        }
                        Err(e) => {
                            queue_failed(metrics, "RX", &e);
                            break RxStatus::Broken;
                        }
                    }
                }
            }
            // The frame's size is known only once it is read: admit it on
            // any token and charge it after, so the debt makes later frames
            // wait (the long-run rate stays exact).
            if let Some(l) = limiter.as_deref_mut() {
                if !rx_admit(l, metrics) {
                    break RxStatus::Throttled;
                }
            }
            match self.read_frame(backend, &mut pass, metrics) {
                Ok(Read::Frame(n)) => {
                    pass.packets += 1;
                    pass.bytes += n as u64;
                    if let Some(l) = limiter.as_deref_mut() {
                        rx_charge(l, n);
                    }
                }
                Ok(Read::Dropped) => pass.packets += 1,
                Ok(Read::Zero) => break RxStatus::ZeroRead,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break RxStatus::Drained,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    let n = NetMetrics::inc(&metrics.host_errors);
                    warn_rate_limited(n, format_args!("backend read failed: {e}"));
                    break RxStatus::Drained;
                }
            }
            if let Some(why) = pass.must_yield(self.weight_bytes, self.weight_packets) {
                Pass::count_yield(why, &metrics.rx_weight_hits, metrics);
                break RxStatus::WeightHit;
            }
        };
        if status == RxStatus::Broken {
            self.broken = true;
        }
        NetMetrics::add(&metrics.rx_frames, pass.frames);
        NetMetrics::add(&metrics.rx_bytes, pass.payload);
        NetMetrics::add(&metrics.rx_buffers, pass.buffers);
        pass.finish(&mut self.queue, irq, metrics, status == RxStatus::WeightHit);
        status
    }
}

/// A FIFO that hands out its contents as one slice (what `readv` needs):
/// consumed entries are skipped, and reclaimed when it empties or once they
/// pile up.
#[derive(Debug)]
struct Fifo<T> {
    v: Vec<T>,
    start: usize,
}

impl<T> Fifo<T> {
    fn new() -> Self {
        Fifo {
            v: Vec::new(),
            start: 0,
        }
    }

    fn items(&self) -> &[T] {
        &self.v[self.start..]
    }

    fn len(&self) -> usize {
        self.v.len() - self.start
    }

    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The vector to append to.
    fn tail(&mut self) -> &mut Vec<T> {
        &mut self.v
    }

    /// The whole vector and where the live entries start.
    fn raw(&mut self) -> (&mut Vec<T>, usize) {
        (&mut self.v, self.start)
    }

    /// Drops the first `n` live entries.
    fn consume(&mut self, n: usize) {
        self.start = (self.start + n).min(self.v.len());
        if self.start == self.v.len() {
            self.v.clear();
            self.start = 0;
        } else if self.start >= IOV_MAX {
            self.v.drain(..self.start);
            self.start = 0;
        }
    }
}

/// How cache filling ended.
enum Fill {
    /// The cache can take a frame.
    Enough,
    /// The ring has no more chains.
    Empty,
    /// The pass must yield.
    Yield(Yield),
}

/// How a TX pass ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TxStatus {
    /// The TX ring is empty and guest notifications are enabled again.
    Done,
    /// The pass hit the byte or packet weight, the time budget or the
    /// descriptor budget with chains still available.
    WeightHit,
    /// The backend returned EAGAIN; chains are pending until it is writable.
    Blocked,
    /// The rate limiter holds a chain back (no used entry yet); it is
    /// pending until the limiter's timer fires.
    Throttled,
    /// The queue is unusable until the driver resets the device.
    Broken,
}

/// A walked TX chain in the batch.
#[derive(Debug, Clone, Copy)]
struct TxItem {
    head: u16,
    len: usize,
    /// Its segments: `TxBatch::segs[start..end]`.
    start: usize,
    end: usize,
    /// The rate limiter took its tokens. Only the last item can be unpaid:
    /// the limiter refused it and filling stopped there.
    paid: bool,
}

/// Chains walked and not written yet. A pass fills the batch up to
/// [`TX_BATCH`] chains, then writes them all: with a [`TxRing`] in one
/// system call, else one `writev` each. Items left when a pass ends wait for
/// the backend (EAGAIN; paid) or for the rate limiter (the last, unpaid).
#[derive(Debug, Default)]
struct TxBatch {
    items: Vec<TxItem>,
    segs: Vec<IoSeg>,
    /// What each write returned (see [`TxRing::write_frames`]).
    results: Vec<i32>,
}

impl TxBatch {
    /// Items the limiter has paid for: a prefix of `items`.
    fn paid(&self) -> usize {
        match self.items.last() {
            Some(last) if !last.paid => self.items.len() - 1,
            _ => self.items.len(),
        }
    }

    fn frame(&self, i: usize) -> &[IoSeg] {
        let it = &self.items[i];
        &self.segs[it.start..it.end]
    }

    /// Keeps the items `keep` says to, in order, with their segments moved
    /// to the front of `segs`.
    fn retain(&mut self, keep: impl Fn(usize) -> bool) {
        let mut kept = 0;
        let mut seg_end = 0;
        for i in 0..self.items.len() {
            if !keep(i) {
                continue;
            }
            let mut it = self.items[i];
            let n = it.end - it.start;
            // Items are in segment order, so the destination never passes
            // the source.
            self.segs.copy_within(it.start..it.end, seg_end);
            it.start = seg_end;
            it.end = seg_end + n;
            seg_end += n;
            self.items[kept] = it;
            kept += 1;
        }
        self.items.truncate(kept);
        self.segs.truncate(seg_end);
    }
}

/// Whether a write's result leaves the frame for a retry once the backend
/// is writable: not tried, EAGAIN, or (from the ring, which does not retry
/// it itself) EINTR.
#[inline]
fn pushed_back(res: i32) -> bool {
    res == NOT_TRIED || res == -libc::EAGAIN || res == -libc::EINTR
}

/// How filling the batch ended.
enum TxFill {
    /// The batch holds [`TX_BATCH`] chains or [`TX_BATCH_BYTES`].
    Full,
    /// The ring has no more chains.
    Empty,
    /// The pass must yield.
    Yield(Yield),
    /// The rate limiter holds the last chain back.
    Throttled,
}

/// The transmit side: one TX queue drained into the backend.
#[derive(Debug)]
pub struct TxVirtio {
    pub(crate) queue: SplitQueue,
    weight_bytes: u64,
    weight_packets: u64,
    /// How long one pass may run (None: no time budget).
    time_budget: Option<Duration>,
    batch: TxBatch,
    bounce: Option<Vec<u8>>,
    broken: bool,
    /// How the backend refused the last frame (an errno, or
    /// [`SHORT_WRITE`]) until it takes one: a backend that refuses every
    /// frame (a TAP set down: EIO; deleted: EBADFD) is logged once, not once
    /// per frame.
    refusing: Option<i32>,
}

/// The kind of refusal of a write that took only part of a frame.
const SHORT_WRITE: i32 = -1;

impl TxVirtio {
    /// Wraps a ready TX queue.
    pub fn new(queue: SplitQueue, weight_bytes: u64, weight_packets: u64, bounce: bool) -> Self {
        TxVirtio {
            queue,
            weight_bytes,
            weight_packets,
            time_budget: None,
            batch: TxBatch {
                items: Vec::with_capacity(TX_BATCH),
                segs: Vec::new(),
                results: Vec::with_capacity(TX_BATCH),
            },
            bounce: bounce.then(|| Vec::with_capacity(BOUNCE_BUFFER_LEN)),
            broken: false,
            refusing: None,
        }
    }

    /// Ends every pass after `budget` as well (None: no time budget).
    pub fn with_time_budget(mut self, budget: Option<Duration>) -> Self {
        self.time_budget = budget;
        self
    }

    /// Whether chains wait for the backend to become writable. Never once
    /// the queue is broken: chains left in the batch then wait for the
    /// driver's reset, and writability must not wake the loop for them.
    pub fn is_blocked(&self) -> bool {
        !self.broken && self.batch.paid() > 0
    }

    /// Whether a chain waits for the rate limiter (never once the queue is
    /// broken).
    pub fn is_throttled(&self) -> bool {
        !self.broken && self.batch.items.last().is_some_and(|it| !it.paid)
    }

    /// Counts a frame the backend refused, and logs the first of a run of
    /// refusals of one kind. The runs are rate-limited too: a guest that
    /// alternates good frames and frames the TAP refuses (a bad GSO header)
    /// must not get a log line for every other frame.
    fn refused(&mut self, metrics: &NetMetrics, kind: i32, msg: std::fmt::Arguments<'_>) {
        NetMetrics::inc(&metrics.tx_dropped);
        if self.refusing != Some(kind) {
            self.refusing = Some(kind);
            let n = NetMetrics::inc(&metrics.tx_refusal_runs);
            warn_rate_limited(
                n,
                format_args!(
                    "{msg}; dropped, as is every frame after it refused the same way (tx_dropped)"
                ),
            );
        }
    }

    /// Walks chains into the batch until it is full, the ring is empty, the
    /// pass must yield or the rate limiter holds a chain back. A chain the
    /// limiter held back before is paid for first.
    fn fill(
        &mut self,
        mut limiter: Option<&mut RateLimiter>,
        pass: &mut Pass,
        metrics: &NetMetrics,
    ) -> Result<TxFill, QueueError> {
        if let Some(last) = self.batch.items.last_mut().filter(|it| !it.paid) {
            if let Some(l) = limiter.as_deref_mut() {
                if !tx_consume(l, last.len, metrics) {
                    return Ok(TxFill::Throttled);
                }
            }
            last.paid = true;
        }
        if self.batch.items.is_empty() && pass.no_room_for_batch() {
            if !self.queue.has_available()? {
                return Ok(TxFill::Empty);
            }
            return Ok(TxFill::Yield(Yield::Time));
        }
        // Chains left from the last pass count towards the byte bound too.
        let mut bytes: usize = self.batch.items.iter().map(|it| it.len).sum();
        loop {
            if self.batch.items.len() >= TX_BATCH || bytes >= TX_BATCH_BYTES {
                return Ok(TxFill::Full);
            }
            if let Some(why) = pass.must_yield(self.weight_bytes, self.weight_packets) {
                if !self.queue.has_available()? {
                    return Ok(TxFill::Empty);
                }
                return Ok(TxFill::Yield(why));
            }
            let Some(head) = self.queue.pop(&mut pass.budget)? else {
                return Ok(TxFill::Empty);
            };
            let start = self.batch.segs.len();
            match self
                .queue
                .walk(head, &TX_RULES, &mut self.batch.segs, &mut pass.budget)
            {
                Ok(chain) => {
                    pass.packets += 1;
                    pass.bytes += chain.len as u64;
                    // Without a limiter this is one branch per frame.
                    let paid = match limiter.as_deref_mut() {
                        None => true,
                        Some(l) => tx_consume(l, chain.len, metrics),
                    };
                    bytes += chain.len;
                    self.batch.items.push(TxItem {
                        head,
                        len: chain.len,
                        start,
                        end: self.batch.segs.len(),
                        paid,
                    });
                    if !paid {
                        return Ok(TxFill::Throttled);
                    }
                }
                Err(err) => {
                    pass.packets += 1;
                    return_malformed(&mut self.queue, metrics, head, err, "TX");
                }
            }
        }
    }

    /// Writes the paid chains of the batch, in order, and returns each one
    /// the backend took or refused to the guest. Chains the backend pushed
    /// back (EAGAIN) stay in the batch; returns whether none did.
    fn flush<B: NetBackend>(
        &mut self,
        backend: &B,
        ring: &mut Option<TxRing>,
        pass: &mut Pass,
        metrics: &NetMetrics,
    ) -> bool {
        let n = self.batch.paid();
        if n == 0 {
            return true;
        }
        pass.batches += 1;
        // Results as the kernel gives them (bytes or a negated errno): an
        // `io::Error` per frame cost about 30 instructions a frame to make
        // and drop.
        let mut results = std::mem::take(&mut self.batch.results);
        results.clear();
        results.resize(n, NOT_TRIED);
        // The device builds no ring with a bounce buffer (`Net::with_backend`).
        if let Some(r) = ring.as_mut() {
            NetMetrics::inc(&metrics.tx_batches);
            let batch = &self.batch;
            if let Err(e) = r.write_frames(n, |i| batch.frame(i), &mut results) {
                // Entries the kernel did not take still point at the batch:
                // the ring goes now, and what it did not write goes frame by
                // frame below, as everything from now on.
                *ring = None;
                NetMetrics::inc(&metrics.host_errors);
                log::error!(
                    "virtio-net: io_uring submission failed ({e}); writing TX frames one \
                     system call at a time from now on"
                );
            }
        }
        // Without a ring, or for what a failed ring did not write.
        for (i, res) in results.iter_mut().enumerate() {
            if *res != NOT_TRIED {
                continue;
            }
            *res = Self::write_one(backend, self.bounce.as_mut(), self.batch.frame(i));
            if *res == -libc::EAGAIN {
                break;
            }
        }
        let mut again = 0usize;
        for (i, &res) in results.iter().enumerate() {
            let it = self.batch.items[i];
            match res {
                r if r >= 0 && r as usize == it.len => {
                    self.refusing = None;
                    pass.frames += 1;
                    pass.payload += (it.len - VNET_HDR_LEN) as u64;
                }
                // A backend keeps frame boundaries, so a frame it took only
                // part of (none, with 0) reached the peer cut short or not at
                // all: dropped, not sent. A TAP or a datagram socket never
                // does this; a backend in trouble might.
                r if r >= 0 => self.refused(
                    metrics,
                    SHORT_WRITE,
                    format_args!("backend took {r} bytes of a {}-byte TX frame", it.len),
                ),
                r if pushed_back(r) => {
                    again += 1;
                    continue;
                }
                // The TAP refuses frames the guest got wrong (a bad GSO
                // header: EINVAL) or cannot take now (interface down: EIO).
                // Neither is a host fault; the frame is lost as on a wire.
                r => self.refused(
                    metrics,
                    -r,
                    format_args!(
                        "backend refused a TX frame: {}",
                        io::Error::from_raw_os_error(-r)
                    ),
                ),
            }
            self.queue.add_used(it.head, 0);
        }
        if again == 0 && n == self.batch.items.len() {
            self.batch.items.clear();
            self.batch.segs.clear();
        } else {
            // Keep what the backend pushed back, and the unpaid tail.
            self.batch
                .retain(|i| results.get(i).is_none_or(|&r| pushed_back(r)));
        }
        self.batch.results = results;
        if again > 0 {
            NetMetrics::inc(&metrics.tap_eagain);
        }
        again == 0
    }

    /// One frame, one system call (EINTR retried), through the bounce
    /// buffer if there is one; bytes written or a negated errno.
    fn write_one<B: NetBackend>(
        backend: &B,
        mut bounce: Option<&mut Vec<u8>>,
        frame: &[IoSeg],
    ) -> i32 {
        loop {
            let res = match bounce.as_deref_mut() {
                Some(buf) => {
                    iov::copy_from_segs(frame, buf);
                    iov::host_buf(buf, |io| backend.send_frame(io))
                }
                None => backend.send_frame(IoVecs::guest(frame)),
            };
            return match res {
                // A frame is at most MAX_TX_CHAIN_LEN bytes: it fits.
                Ok(n) => i32::try_from(n).unwrap_or(i32::MAX),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => -libc::EAGAIN,
                // An error without an errno (a test backend's) is still a
                // refusal: EIO stands for it.
                Err(e) => -e.raw_os_error().filter(|&c| c > 0).unwrap_or(libc::EIO),
            };
        }
    }

    /// One TX pass: writes chains in batches until the ring is empty, the
    /// backend pushes back, the rate limiter (if any) holds a chain back,
    /// or the pass must yield. `ring` batches the writes; a ring that fails
    /// is dropped and the device writes one frame per system call.
    pub fn process<B: NetBackend>(
        &mut self,
        backend: &B,
        ring: &mut Option<TxRing>,
        mut limiter: Option<&mut RateLimiter>,
        metrics: &NetMetrics,
        irq: &dyn Interrupt,
    ) -> TxStatus {
        if self.broken {
            return TxStatus::Broken;
        }
        NetMetrics::inc(&metrics.tx_passes);
        let mut pass = Pass::new(self.time_budget);
        let status = 'pass: {
            if self.is_blocked() {
                NetMetrics::inc(&metrics.tx_eagain_retries);
            }
            // The guest need not kick while we are draining the ring.
            self.queue.disable_notifications();
            loop {
                // Chains pushed back before go first, in their order.
                if self.is_blocked() && !self.flush(backend, ring, &mut pass, metrics) {
                    break 'pass TxStatus::Blocked;
                }
                let fill = match self.fill(limiter.as_deref_mut(), &mut pass, metrics) {
                    Ok(fill) => fill,
                    Err(e) => {
                        // What was walked before the failure still goes out.
                        self.flush(backend, ring, &mut pass, metrics);
                        queue_failed(metrics, "TX", &e);
                        break 'pass TxStatus::Broken;
                    }
                };
                if !self.flush(backend, ring, &mut pass, metrics) {
                    break 'pass TxStatus::Blocked;
                }
                match fill {
                    TxFill::Full => continue,
                    TxFill::Throttled => break 'pass TxStatus::Throttled,
                    TxFill::Yield(why) => {
                        Pass::count_yield(why, &metrics.tx_weight_hits, metrics);
                        break 'pass TxStatus::WeightHit;
                    }
                    TxFill::Empty => {}
                }
                // Re-enable kicks; if chains arrived meanwhile, keep going
                // (each such look counts against the budget, so a guest that
                // keeps moving avail.idx cannot keep the pass here).
                match self.queue.enable_notifications() {
                    Ok(true) => {
                        pass.budget.charge(1);
                        self.queue.disable_notifications();
                    }
                    Ok(false) => break 'pass TxStatus::Done,
                    Err(e) => {
                        queue_failed(metrics, "TX", &e);
                        break 'pass TxStatus::Broken;
                    }
                }
            }
        };
        if status == TxStatus::Broken {
            self.broken = true;
        }
        NetMetrics::add(&metrics.tx_frames, pass.frames);
        NetMetrics::add(&metrics.tx_bytes, pass.payload);
        pass.finish(&mut self.queue, irq, metrics, status == TxStatus::WeightHit);
        status
    }
}

#[cfg(test)]
mod tests {
    use vm_memory::{Bytes, GuestAddress};

    use super::super::test_driver::*;
    use super::super::NetConfig;
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

    fn cfg() -> NetConfig {
        NetConfig::default()
    }

    // ---- TX ----

    #[test]
    fn test_tx_single_descriptor() {
        let mut h = Harness::new(cfg(), MRG_FEATURES);
        let f = frame(1514 + 12, 1);
        let head = h.post_tx(&f, &[]);
        h.kick_tx();
        check_metric_after_block!(h.metrics.tx_frames, 1, h.run_until_idle());
        assert_eq!(h.peer_frames(), vec![f]);
        assert_eq!(h.txq.take_used(&h.mem), vec![(u32::from(head), 0)]);
        assert_eq!(h.metric(|m| &m.tx_bytes), 1514);
        assert_eq!(h.irq.count(), 1);
    }

    #[test]
    fn test_tx_multi_descriptor() {
        let mut h = Harness::new(cfg(), MRG_FEATURES);
        // Header alone, then the frame in uneven pieces, as Linux lays out
        // a linear head plus page fragments.
        let f = frame(12 + 3000, 2);
        let head = h.post_tx(&f, &[12, 100, 1, 2000]);
        let f2 = frame(12 + 60, 3);
        let head2 = h.post_tx(&f2, &[5]);
        h.kick_tx();
        h.run_until_idle();
        assert_eq!(h.peer_frames(), vec![f, f2]);
        assert_eq!(
            h.txq.take_used(&h.mem),
            vec![(u32::from(head), 0), (u32::from(head2), 0)]
        );
        assert_eq!(h.metric(|m| &m.tx_bytes), 3000 + 60);
    }

    #[test]
    fn test_tx_bounce_buffer_matches() {
        let mut h = Harness::new(
            NetConfig {
                bounce_buffer: true,
                ..cfg()
            },
            MRG_FEATURES,
        );
        let f = frame(12 + 1400, 4);
        h.post_tx(&f, &[12, 700]);
        h.kick_tx();
        h.run_until_idle();
        assert_eq!(h.peer_frames(), vec![f]);
    }

    #[test]
    fn test_tx_eagain_waits_for_epollout() {
        let mut h = Harness::new(cfg(), MRG_FEATURES);
        // Room for about two frames (the kernel doubles the value; a
        // message larger than the buffer would be refused with EMSGSIZE).
        h.dev().backend().set_send_buffer(40000).unwrap();
        let frames: Vec<Vec<u8>> = (0..8).map(|i| frame(12 + 30000, i)).collect();
        for f in &frames {
            h.post_tx(f, &[12]);
        }
        h.kick_tx();
        h.run_until_idle();
        let first = h.peer_frames();
        assert!(first.len() < 8, "the socket never pushed back");
        assert!(h.metric(|m| &m.tap_eagain) >= 1);
        // Nothing is lost or reordered, and the retry came from EPOLLOUT
        // (no further kick).
        let mut got = first;
        for _ in 0..100 {
            h.run_until_idle();
            got.extend(h.peer_frames());
            if got.len() == 8 {
                break;
            }
        }
        assert_eq!(got, frames);
        assert!(h.metric(|m| &m.tx_eagain_retries) >= 1);
        assert_eq!(h.txq.take_used(&h.mem).len(), 8);
        assert!(!h.dev().active.as_ref().unwrap().tx.is_blocked());
    }

    /// A short or 0-byte write by the backend (a frame-preserving one took
    /// part of a frame) is a dropped frame, not a sent one; its chain comes
    /// back like any other.
    #[test]
    fn test_tx_short_write_is_a_dropped_frame() {
        let (b, peer) = FaultBackend::pair();
        b.script.lock().unwrap().write_fault_at(0, Fault::Short(20));
        b.script.lock().unwrap().write_fault_at(0, Fault::Zero);
        let mem = vm_memory::GuestMemoryMmap::from_ranges(&[(GuestAddress(0), MEM_SIZE as usize)])
            .unwrap();
        let mut h = Harness::with_backend(b, peer, cfg(), mem);
        h.activate(MRG_FEATURES);
        let frames: Vec<Vec<u8>> = (0..3).map(|i| frame(12 + 100, i)).collect();
        let heads: Vec<(u32, u32)> = frames
            .iter()
            .map(|f| (u32::from(h.post_tx(f, &[12])), 0))
            .collect();
        h.kick_tx();
        h.run_until_idle();
        assert_eq!(h.txq.take_used(&h.mem), heads);
        assert_eq!(
            h.peer_frames(),
            vec![frames[0][..20].to_vec(), frames[2].clone()]
        );
        assert_eq!(h.metric(|m| &m.tx_frames), 1);
        assert_eq!(h.metric(|m| &m.tx_bytes), 100);
        assert_eq!(h.metric(|m| &m.tx_dropped), 2);
    }

    /// A backend refusing frame after frame the same way (a TAP set down)
    /// is logged once per run of refusals, not once per frame; every frame is
    /// counted and its chain returned.
    #[test]
    fn test_tx_refusals_logged_once_per_run() {
        let (b, peer) = FaultBackend::pair();
        {
            let mut s = b.script.lock().unwrap();
            let eio = Some(Fault::Errno(libc::EIO));
            s.writes.extend(std::iter::repeat_n(eio, 10));
            s.writes.push_back(None);
            s.writes.extend(std::iter::repeat_n(eio, 3));
            s.writes
                .extend(std::iter::repeat_n(Some(Fault::Errno(libc::EINVAL)), 5));
        }
        let mem = vm_memory::GuestMemoryMmap::from_ranges(&[(GuestAddress(0), MEM_SIZE as usize)])
            .unwrap();
        let mut h = Harness::with_backend(b, peer, cfg(), mem);
        h.activate(MRG_FEATURES);
        let before = test_log::lines().len();
        for i in 0..19 {
            h.post_tx(&frame(12 + 60, i), &[]);
        }
        h.kick_tx();
        h.run_until_idle();
        assert_eq!(h.txq.take_used(&h.mem).len(), 19);
        assert_eq!(h.metric(|m| &m.tx_dropped), 18);
        assert_eq!(h.peer_frames().len(), 1);
        // Runs 1 (EIO) and 2 (EIO after a frame went through) are logged;
        // run 3 (EINVAL) is the third run, which the rate limit skips.
        let lines = test_log::lines()[before..].to_vec();
        assert_eq!(lines.len(), 2, "{lines:#?}");
        assert!(lines.iter().all(|l| l.contains("Input/output error")));
    }

    // ---- TX malformed chains ----

    /// Posts a bad TX chain followed by a good frame; checks the bad one comes
    /// back with length 0, is counted, and the device keeps working.
    fn check_bad_tx(write: impl FnOnce(&mut Harness) -> u16) {
        let mut h = Harness::new(cfg(), MRG_FEATURES);
        let bad = write(&mut h);
        let good = frame(100, 9);
        let good_head = h.post_tx(&good, &[]);
        h.kick_tx();
        check_metric_after_block!(h.metrics.malformed_chains, 1, h.run_until_idle());
        assert_eq!(h.peer_frames(), vec![good]);
        assert_eq!(
            h.txq.take_used(&h.mem),
            vec![(u32::from(bad), 0), (u32::from(good_head), 0)]
        );
    }

    #[test]
    fn test_tx_write_only_descriptor() {
        check_bad_tx(|h| {
            let a = h.alloc(100);
            h.txq
                .add_chain(&h.mem, &[(a, 12, 0), (a + 12, 88, F_WRITE)])
        });
    }

    #[test]
    fn test_tx_outside_memory() {
        check_bad_tx(|h| h.txq.add_chain(&h.mem, &[(MEM_SIZE - 10, 100, 0)]));
        check_bad_tx(|h| h.txq.add_chain(&h.mem, &[(u64::MAX - 5, 100, 0)]));
    }

    #[test]
    fn test_tx_shorter_than_header() {
        check_bad_tx(|h| {
            let a = h.alloc(16);
            h.txq.add_chain(&h.mem, &[(a, 4, 0), (a + 4, 4, 0)])
        });
    }

    #[test]
    fn test_tx_oversize_frame() {
        check_bad_tx(|h| {
            let a = h.alloc(70000);
            h.txq.add_chain(&h.mem, &[(a, 12, 0), (a + 12, 65551, 0)])
        });
    }

    #[test]
    fn test_tx_looping_chain() {
        check_bad_tx(|h| {
            let a = h.alloc(64);
            let head = h.txq.write_chain(&h.mem, &[(a, 32, 0), (a + 32, 32, 0)]);
            // The second descriptor points back to the first.
            h.txq.write_desc(&h.mem, head + 1, a + 32, 32, F_NEXT, head);
            h.txq.publish(&h.mem, head);
            head
        });
    }

    #[test]
    fn test_tx_next_out_of_range() {
        check_bad_tx(|h| {
            let a = h.alloc(64);
            let head = h.txq.write_chain(&h.mem, &[(a, 64, 0)]);
            h.txq.write_desc(&h.mem, head, a, 64, F_NEXT, 9999);
            h.txq.publish(&h.mem, head);
            head
        });
    }

    #[test]
    fn test_tx_head_out_of_range_is_skipped() {
        let mut h = Harness::new(cfg(), MRG_FEATURES);
        // An avail entry naming descriptor 300 of a 256-entry table cannot
        // even be returned; it is counted and skipped.
        h.txq.publish(&h.mem, 300);
        let good = frame(100, 9);
        h.post_tx(&good, &[]);
        h.kick_tx();
        check_metric_after_block!(h.metrics.malformed_chains, 1, h.run_until_idle());
        assert_eq!(h.peer_frames(), vec![good]);
    }

    #[test]
    fn test_tx_avail_index_too_far_breaks_only_tx() {
        let mut h = Harness::new(cfg(), MRG_FEATURES);
        // avail idx 1000 ahead of next_avail with a 256-entry ring.
        h.mem
            .write_obj(1000u16, GuestAddress(0x80000 + 16 * 256 + 2))
            .unwrap();
        h.kick_tx();
        check_metric_after_block!(h.metrics.queue_errors, 1, h.run_until_idle());
        // The driver is told once that the device needs a reset, even when
        // it keeps kicking the broken queue.
        assert_eq!(h.irq.device_errors.load(Ordering::SeqCst), 1);
        h.kick_tx();
        h.run_until_idle();
        assert_eq!(h.irq.device_errors.load(Ordering::SeqCst), 1);
        // RX still works.
        h.post_rx(&[1526]);
        h.kick_rx();
        h.peer.send(&frame(100, 1)).unwrap();
        h.run_until_idle();
        assert_eq!(h.metric(|m| &m.rx_frames), 1);
    }

    // ---- RX ----

    /// Reads the num_buffers field of a received header.
    fn num_buffers(h: &Harness, addr: u64) -> u16 {
        h.mem.read_obj(GuestAddress(addr + 10)).unwrap()
    }

    #[test]
    fn test_rx_one_buffer_header_inclusive() {
        let mut h = Harness::new(cfg(), MRG_FEATURES);
        let bufs = h.post_rx(&[1526; 10]);
        h.kick_rx();
        // Stale bytes where num_buffers goes: the device must overwrite them.
        for (_, a) in &bufs {
            h.mem.write_obj(0xffffu16, GuestAddress(a + 10)).unwrap();
        }
        let frames: Vec<Vec<u8>> = (0..10).map(|i| frame(12 + 1514, i)).collect();
        for f in &frames {
            h.peer.send(f).unwrap();
        }
        h.run_until_idle();
        let used = h.rxq.take_used(&h.mem);
        assert_eq!(used.len(), 10);
        for (i, ((id, len), (head, addr))) in used.iter().zip(&bufs).enumerate() {
            assert_eq!((*id, *len), (u32::from(*head), 1526));
            assert_eq!(num_buffers(&h, *addr), 1);
            assert_eq!(h.read(addr + 12, 1514), frames[i][12..]);
        }
        assert_eq!(h.metric(|m| &m.rx_frames), 10);
        assert_eq!(h.metric(|m| &m.rx_buffers), 10);
        assert_eq!(h.metric(|m| &m.rx_bytes), 10 * 1514);
    }

    #[test]
    fn test_rx_mtu_sized_buffers_need_two() {
        let mut h = Harness::new(cfg(), MRG_FEATURES);
        let bufs = h.post_rx(&[1500; 20]);
        h.kick_rx();
        for i in 0..10 {
            h.peer.send(&frame(12 + 1514, i)).unwrap();
        }
        h.run_until_idle();
        let used = h.rxq.take_used(&h.mem);
        assert_eq!(used.len(), 20);
        for pair in used.chunks(2) {
            assert_eq!((pair[0].1, pair[1].1), (1500, 26));
        }
        assert_eq!(num_buffers(&h, bufs[0].1), 2);
        assert_eq!(num_buffers(&h, bufs[18].1), 2);
        assert_eq!(h.metric(|m| &m.rx_frames), 10);
        assert_eq!(h.metric(|m| &m.rx_buffers), 20);
    }

    #[test]
    fn test_rx_two_buffers_data() {
        let mut h = Harness::new(cfg(), MRG_FEATURES);
        let bufs = h.post_rx(&[1000, 1000]);
        h.kick_rx();
        let f = frame(12 + 1514, 5);
        h.peer.send(&f).unwrap();
        h.run_until_idle();
        let used = h.rxq.take_used(&h.mem);
        assert_eq!(
            used,
            vec![(u32::from(bufs[0].0), 1000), (u32::from(bufs[1].0), 526)]
        );
        assert_eq!(num_buffers(&h, bufs[0].1), 2);
        let mut got = h.read(bufs[0].1, 1000);
        got.extend(h.read(bufs[1].1, 526));
        assert_eq!(got[12..], f[12..]);
    }

    #[test]
    fn test_rx_many_buffers_gso() {
        let mut h = Harness::new(cfg(), MRG_FEATURES | GUEST_GSO);
        // Page-sized buffers, as Linux posts with big packets.
        let bufs = h.post_rx(&[4096; 20]);
        h.kick_rx();
        let f = frame(12 + 65550, 6);
        h.peer.send(&f).unwrap();
        h.run_until_idle();
        let used = h.rxq.take_used(&h.mem);
        // 65562 = 16 * 4096 + 26
        assert_eq!(used.len(), 17);
        assert!(used[..16].iter().all(|&(_, l)| l == 4096));
        assert_eq!(used[16].1, 26);
        assert_eq!(num_buffers(&h, bufs[0].1), 17);
        let mut got = Vec::new();
        for (i, (_, l)) in used.iter().enumerate() {
            got.extend(h.read(bufs[i].1, *l as usize));
        }
        assert_eq!(got[12..], f[12..]);
        assert_eq!(h.metric(|m| &m.rx_buffers), 17);
        // The 3 buffers left stay cached; a small frame takes the first.
        h.peer.send(&frame(100, 1)).unwrap();
        h.post_rx(&[4096; 14]);
        h.kick_rx();
        h.run_until_idle();
        assert_eq!(h.rxq.take_used(&h.mem), vec![(u32::from(bufs[17].0), 100)]);
    }

    #[test]
    fn test_rx_small_buffers_many() {
        let mut h = Harness::new(cfg(), MRG_FEATURES);
        let bufs = h.post_rx(&[256; 8]);
        h.kick_rx();
        let f = frame(12 + 1514, 7);
        h.peer.send(&f).unwrap();
        h.run_until_idle();
        let used = h.rxq.take_used(&h.mem);
        // 1526 = 5 * 256 + 246
        assert_eq!(used.len(), 6);
        assert_eq!(used[5].1, 246);
        assert_eq!(num_buffers(&h, bufs[0].1), 6);
    }

    #[test]
    fn test_rx_reads_without_waiting_for_64k() {
        // Without guest GSO one 1526-byte buffer is enough to read.
        let mut h = Harness::new(cfg(), MRG_FEATURES);
        h.post_rx(&[1526]);
        h.kick_rx();
        h.peer.send(&frame(12 + 1514, 1)).unwrap();
        h.run_until_idle();
        assert_eq!(h.metric(|m| &m.rx_frames), 1);

        // With guest GSO a 64 KiB frame may come: 1526 bytes are not enough.
        let mut h = Harness::new(cfg(), MRG_FEATURES | GUEST_GSO);
        h.post_rx(&[1526]);
        h.kick_rx();
        h.peer.send(&frame(12 + 1514, 1)).unwrap();
        h.run_until_idle();
        assert_eq!(h.metric(|m| &m.rx_frames), 0);
        assert!(h
            .dev()
            .active
            .as_ref()
            .unwrap()
            .rx
            .starved_since()
            .is_some());
        h.post_rx(&[1526; 42]);
        h.kick_rx();
        h.run_until_idle();
        assert_eq!(h.metric(|m| &m.rx_frames), 1);
        assert_eq!(h.metric(|m| &m.rx_buffers), 1);
    }

    #[test]
    fn test_rx_without_mrg_drops_frame_too_big() {
        let mut h = Harness::new(cfg(), BASE_FEATURES);
        let bufs = h.post_rx(&[1000]);
        h.kick_rx();
        h.peer.send(&frame(12 + 1514, 1)).unwrap();
        check_metric_after_block!(h.metrics.rx_dropped, 1, h.run_until_idle());
        // Not split, not consumed: the chain waits for a frame that fits,
        // and with nothing used the guest gets no interrupt.
        assert!(h.rxq.take_used(&h.mem).is_empty());
        assert_eq!(h.irq.count(), 0);
        assert_eq!(h.metric(|m| &m.interrupts_suppressed), 0);
        let small = frame(12 + 500, 2);
        h.peer.send(&small).unwrap();
        h.run_until_idle();
        assert_eq!(h.rxq.take_used(&h.mem), vec![(u32::from(bufs[0].0), 512)]);
        assert_eq!(num_buffers(&h, bufs[0].1), 1);
        assert_eq!(h.read(bufs[0].1 + 12, 500), small[12..]);
    }

    #[test]
    fn test_rx_without_mrg_exact_fit() {
        // A frame exactly as long as the chain is not mistaken for a
        // truncated one.
        let mut h = Harness::new(cfg(), BASE_FEATURES);
        let bufs = h.post_rx(&[1526, 1526]);
        h.kick_rx();
        h.peer.send(&frame(12 + 1514, 1)).unwrap();
        h.peer.send(&frame(12 + 1514, 2)).unwrap();
        h.run_until_idle();
        assert_eq!(
            h.rxq.take_used(&h.mem),
            vec![(u32::from(bufs[0].0), 1526), (u32::from(bufs[1].0), 1526)]
        );
        assert_eq!(h.metric(|m| &m.rx_dropped), 0);
    }

    #[test]
    fn test_rx_bounce_buffer_matches() {
        let mut h = Harness::new(
            NetConfig {
                bounce_buffer: true,
                ..cfg()
            },
            MRG_FEATURES,
        );
        let bufs = h.post_rx(&[1000, 1000]);
        h.kick_rx();
        let f = frame(12 + 1514, 8);
        h.peer.send(&f).unwrap();
        h.run_until_idle();
        assert_eq!(h.rxq.take_used(&h.mem).len(), 2);
        let mut got = h.read(bufs[0].1, 1000);
        got.extend(h.read(bufs[1].1, 526));
        assert_eq!(got[12..], f[12..]);
        assert_eq!(num_buffers(&h, bufs[0].1), 2);
    }

    #[test]
    fn test_rx_header_split_across_descriptors() {
        let mut h = Harness::new(cfg(), MRG_FEATURES);
        let a = h.alloc(2000);
        // num_buffers straddles the first two descriptors (bytes 10 and 11).
        let head = h
            .rxq
            .add_chain(&h.mem, &[(a, 11, F_WRITE), (a + 100, 1515, F_WRITE)]);
        h.kick_rx();
        h.peer.send(&frame(12 + 1514, 3)).unwrap();
        h.run_until_idle();
        assert_eq!(h.rxq.take_used(&h.mem), vec![(u32::from(head), 1526)]);
        assert_eq!(h.read(a + 10, 1), vec![1]);
        assert_eq!(h.read(a + 100, 1), vec![0]);
    }

    // ---- RX malformed chains ----

    fn check_bad_rx(write: impl FnOnce(&mut Harness) -> u16) {
        let mut h = Harness::new(cfg(), MRG_FEATURES);
        let bad = write(&mut h);
        let good = h.post_rx(&[1526]);
        h.kick_rx();
        h.peer.send(&frame(12 + 1514, 1)).unwrap();
        check_metric_after_block!(h.metrics.malformed_chains, 1, h.run_until_idle());
        assert_eq!(
            h.rxq.take_used(&h.mem),
            vec![(u32::from(bad), 0), (u32::from(good[0].0), 1526)]
        );
        assert_eq!(h.metric(|m| &m.rx_frames), 1);
    }

    #[test]
    fn test_rx_read_only_descriptor() {
        check_bad_rx(|h| {
            let a = h.alloc(2000);
            h.rxq
                .add_chain(&h.mem, &[(a, 1000, F_WRITE), (a + 1000, 1000, 0)])
        });
    }

    #[test]
    fn test_rx_outside_memory() {
        check_bad_rx(|h| h.rxq.add_chain(&h.mem, &[(MEM_SIZE - 100, 1526, F_WRITE)]));
    }

    #[test]
    fn test_rx_shorter_than_header() {
        check_bad_rx(|h| {
            let a = h.alloc(16);
            h.rxq.add_chain(&h.mem, &[(a, 8, F_WRITE)])
        });
    }

    #[test]
    fn test_rx_looping_chain() {
        check_bad_rx(|h| {
            let a = h.alloc(64);
            let head = h.rxq.write_chain(&h.mem, &[(a, 64, F_WRITE)]);
            h.rxq
                .write_desc(&h.mem, head, a, 64, F_WRITE | F_NEXT, head);
            h.rxq.publish(&h.mem, head);
            head
        });
    }

    #[test]
    fn test_rx_short_backend_frame_is_dropped() {
        let mut h = Harness::new(cfg(), MRG_FEATURES);
        h.post_rx(&[1526]);
        h.kick_rx();
        h.peer.send(&[0u8; 5]).unwrap();
        check_metric_after_block!(h.metrics.rx_dropped, 1, h.run_until_idle());
        assert!(h.rxq.take_used(&h.mem).is_empty());
    }

    // ---- weights ----

    /// One RX buffer and `n` tiny TX frames posted, an RX frame waiting in
    /// the backend, both queues kicked, one loop iteration run; returns the
    /// TX frames.
    fn flood_tx_beside_one_rx_frame(h: &mut Harness, n: u8) -> Vec<Vec<u8>> {
        h.post_rx(&[1526]);
        let tx: Vec<Vec<u8>> = (0..n).map(|i| frame(12 + 64, i)).collect();
        for f in &tx {
            h.post_tx(f, &[]);
        }
        h.peer.send(&frame(12 + 100, 0xaa)).unwrap();
        h.kick_rx();
        h.kick_tx();
        h.run_once(0);
        tx
    }

    #[test]
    fn test_tx_packet_weight_lets_rx_run_first() {
        let mut h = Harness::new(
            NetConfig {
                tx_weight_packets: 4,
                ..cfg()
            },
            MRG_FEATURES,
        );
        // One loop iteration: one TX pass of 4 frames, and the RX frame.
        flood_tx_beside_one_rx_frame(&mut h, 10);
        assert_eq!(h.peer_frames().len(), 4);
        assert_eq!(h.metric(|m| &m.rx_frames), 1);
        assert_eq!(h.metric(|m| &m.tx_weight_hits), 1);
        h.run_once(0);
        assert_eq!(h.peer_frames().len(), 4);
        h.run_until_idle();
        assert_eq!(h.peer_frames().len(), 2);
        assert_eq!(h.metric(|m| &m.tx_weight_hits), 2);
        // The activation pass, then 4 + 4 + 2.
        assert_eq!(h.metric(|m| &m.tx_passes), 4);
    }

    #[test]
    fn test_tx_byte_weight() {
        let mut h = Harness::new(
            NetConfig {
                tx_weight_bytes: 3000,
                tx_weight_packets: 0,
                ..cfg()
            },
            MRG_FEATURES,
        );
        for i in 0..10 {
            h.post_tx(&frame(1012, i), &[]);
        }
        h.kick_tx();
        h.run_once(0);
        // 2 * 1012 < 3000 <= 3 * 1012
        assert_eq!(h.peer_frames().len(), 3);
        h.run_until_idle();
        assert_eq!(h.peer_frames().len(), 7);
        assert_eq!(h.metric(|m| &m.tx_weight_hits), 3);
    }

    /// 200 TX frames and one kick: one pass sends them all.
    fn assert_one_pass_drains_200(mut h: Harness) {
        for i in 0..200 {
            h.post_tx(&frame(100, i as u8), &[]);
        }
        h.kick_tx();
        h.run_once(0);
        assert_eq!(h.peer_frames().len(), 200);
        assert_eq!(h.metric(|m| &m.tx_weight_hits), 0);
        assert_eq!(h.metric(|m| &m.time_budget_hits), 0);
        assert_eq!(h.metric(|m| &m.tx_passes), 2); // activation + this one
    }

    #[test]
    fn test_no_weight_drains_in_one_pass() {
        assert_one_pass_drains_200(Harness::new(
            NetConfig {
                tx_weight_bytes: 0,
                tx_weight_packets: 0,
                ..cfg()
            },
            MRG_FEATURES,
        ));
    }

    #[test]
    fn test_rx_packet_weight() {
        let mut h = Harness::new(
            NetConfig {
                rx_weight_packets: 2,
                ..cfg()
            },
            MRG_FEATURES,
        );
        h.post_rx(&[1526; 8]);
        h.kick_rx();
        for i in 0..5 {
            h.peer.send(&frame(12 + 100, i)).unwrap();
        }
        h.run_once(0);
        assert_eq!(h.metric(|m| &m.rx_frames), 2);
        assert_eq!(h.metric(|m| &m.rx_weight_hits), 1);
        // While deferred, the backend is not polled for reading; the
        // re-queue event runs the next pass.
        h.run_once(0);
        assert_eq!(h.metric(|m| &m.rx_frames), 4);
        h.run_until_idle();
        assert_eq!(h.metric(|m| &m.rx_frames), 5);
    }

    /// `frames` frames of 112 bytes into a device with an RX packet weight
    /// of 2 (every pass but the last is cut short and re-queued), run to
    /// idle; returns the harness.
    fn rx_in_short_passes(features: u64, frames: u8, used_event: Option<u16>) -> Harness {
        let mut h = Harness::new(
            NetConfig {
                rx_weight_packets: 2,
                ..cfg()
            },
            features,
        );
        if let Some(e) = used_event {
            h.rxq.set_used_event(&h.mem, e);
        }
        h.post_rx(&vec![1526; usize::from(frames)]);
        h.kick_rx();
        for i in 0..frames {
            h.peer.send(&frame(12 + 100, i)).unwrap();
        }
        h
    }

    #[test]
    fn test_a_requeued_pass_leaves_its_interrupt_to_the_next_one() {
        let mut h = rx_in_short_passes(MRG_FEATURES, 5, None);
        h.run_once(0);
        // The entries are published (a polling driver sees them); the
        // interrupt waits for the pass right behind.
        assert_eq!(h.rxq.used_idx(&h.mem), 2);
        assert_eq!(h.metric(|m| &m.interrupts), 0);
        assert_eq!(h.metric(|m| &m.interrupts_coalesced), 1);
        h.run_until_idle();
        assert_eq!(h.rxq.used_idx(&h.mem), 5);
        // One interrupt, from the pass that drained the backend.
        assert_eq!(h.metric(|m| &m.interrupts), 1);
        assert_eq!(h.metric(|m| &m.rx_weight_hits), 2);
    }

    #[test]
    fn test_a_saturated_direction_interrupts_every_64_entries() {
        let mut h = rx_in_short_passes(MRG_FEATURES, 140, None);
        h.run_until_idle();
        assert_eq!(h.rxq.used_idx(&h.mem), 140);
        // After the 32nd pass (64 entries waiting), the 64th (128) and the
        // pass that found the backend empty.
        assert_eq!(h.metric(|m| &m.interrupts), 3);
        assert_eq!(h.metric(|m| &m.rx_weight_hits), 70);
    }

    #[test]
    fn test_a_small_ring_waits_for_at_most_a_quarter_of_it() {
        assert_eq!(coalesce_limit(1024), 64);
        assert_eq!(coalesce_limit(256), 64);
        assert_eq!(coalesce_limit(32), 8);
        assert_eq!(coalesce_limit(2), 1);
        assert_eq!(coalesce_limit(1), 1);
    }

    /// With EVENT_IDX the decision that follows covers every entry since
    /// the last one: a `used_event` crossed by a re-queued pass still gets
    /// its interrupt, once.
    #[test]
    fn test_a_deferred_decision_honours_used_event_crossed_meanwhile() {
        for event in [0u16, 1, 3] {
            let mut h = rx_in_short_passes(MRG_FEATURES | RING_EVENT_IDX, 5, Some(event));
            h.run_once(0);
            assert_eq!(h.metric(|m| &m.interrupts), 0, "used_event {event}");
            h.run_until_idle();
            assert_eq!(h.metric(|m| &m.interrupts), 1, "used_event {event}");
        }
        // Not crossed (the driver waits for the 6th entry): none.
        let mut h = rx_in_short_passes(MRG_FEATURES | RING_EVENT_IDX, 5, Some(5));
        h.run_until_idle();
        assert_eq!(h.metric(|m| &m.interrupts), 0);
        assert_eq!(h.metric(|m| &m.interrupts_suppressed), 1);
    }

    #[test]
    fn test_rx_byte_weight_runs_tx_between_passes() {
        let mut h = Harness::new(
            NetConfig {
                rx_weight_bytes: 2000,
                rx_weight_packets: 0,
                ..cfg()
            },
            MRG_FEATURES,
        );
        h.post_rx(&[1526; 8]);
        h.kick_rx();
        for i in 0..6 {
            h.peer.send(&frame(12 + 1000, i)).unwrap();
        }
        h.run_once(0);
        assert_eq!(h.metric(|m| &m.rx_frames), 2);
        h.post_tx(&frame(100, 1), &[]);
        h.kick_tx();
        h.run_once(0);
        assert_eq!(h.metric(|m| &m.tx_frames), 1);
        assert_eq!(h.metric(|m| &m.rx_frames), 4);
    }

    // ---- time budget ----

    /// A device whose passes end by time only: weights off, a 1 µs budget,
    /// which any [`CLOCK_STRIDE`] frames through a socket exceed.
    fn timed_only() -> NetConfig {
        NetConfig {
            tx_weight_bytes: 0,
            tx_weight_packets: 0,
            rx_weight_bytes: 0,
            rx_weight_packets: 0,
            pass_time_budget_us: 1,
            ..cfg()
        }
    }

    #[test]
    fn test_tx_time_budget_ends_the_pass_and_lets_rx_run() {
        let mut h = Harness::timed(timed_only(), MRG_FEATURES);
        let tx = flood_tx_beside_one_rx_frame(&mut h, 64);
        // The clock is read every CLOCK_STRIDE frames, so the pass ended at
        // one of those looks, long before the ring was empty; RX ran in the
        // same loop iteration.
        let first = h.peer_frames();
        assert!(
            !first.is_empty() && first.len() < tx.len(),
            "{}",
            first.len()
        );
        assert!(
            (first.len() as u64).is_multiple_of(CLOCK_STRIDE),
            "{}",
            first.len()
        );
        assert_eq!(h.metric(|m| &m.rx_frames), 1);
        assert!(h.metric(|m| &m.time_budget_hits) >= 1);
        assert_eq!(h.metric(|m| &m.tx_weight_hits), 0);
        assert_eq!(h.metric(|m| &m.desc_budget_hits), 0);
        // Every frame still goes out, in order.
        h.run_until_idle();
        let mut all = first;
        all.extend(h.peer_frames());
        assert_eq!(all, tx);
        assert_eq!(h.txq.take_used(&h.mem).len(), tx.len());
    }

    #[test]
    fn test_rx_time_budget_ends_the_pass() {
        let mut h = Harness::timed(timed_only(), MRG_FEATURES);
        h.post_rx(&[1526; 32]);
        h.kick_rx();
        for i in 0..16 {
            h.peer.send(&frame(12 + 100, i)).unwrap();
        }
        h.run_once(0);
        let first = h.metric(|m| &m.rx_frames);
        assert!(
            first > 0 && first < 16 && first.is_multiple_of(CLOCK_STRIDE),
            "{first}"
        );
        assert!(h.metric(|m| &m.time_budget_hits) >= 1);
        assert_eq!(h.metric(|m| &m.rx_weight_hits), 0);
        h.run_until_idle();
        assert_eq!(h.metric(|m| &m.rx_frames), 16);
    }

    #[test]
    fn test_time_budget_not_reached_changes_nothing() {
        // A budget no pass reaches: one pass drains the ring, as without it.
        assert_one_pass_drains_200(Harness::timed(
            NetConfig {
                pass_time_budget_us: 60_000_000,
                ..timed_only()
            },
            MRG_FEATURES,
        ));
    }

    #[test]
    fn test_default_config_has_a_time_budget_and_tests_turn_it_off() {
        assert_eq!(
            NetConfig::default().pass_time_budget(),
            Some(std::time::Duration::from_micros(
                super::super::DEFAULT_PASS_TIME_BUDGET_US
            ))
        );
        let h = Harness::new(cfg(), MRG_FEATURES);
        assert_eq!(h.dev().active.as_ref().unwrap().tx.time_budget, None);
        let h = Harness::timed(cfg(), MRG_FEATURES);
        assert!(h.dev().active.as_ref().unwrap().tx.time_budget.is_some());
    }
}
