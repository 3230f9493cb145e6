// SPDX-License-Identifier: Apache-2.0
//! The receive side: [`RxVirtio`] moves frames from the backend into the
//! guest's RX buffers.
//!
//! It owns one [`SplitQueue`] and knows nothing about epoll: a pass is one
//! call to [`RxVirtio::process`], which returns why it stopped
//! ([`RxStatus`]) so the event glue can decide what to wait for next. What
//! ends a pass is shared with TX (see [`pass`](super::pass)).
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
//!
//! **Rate limiting.** A direction with a [`RateLimiter`] pays for every
//! frame in the limiter's tokens (frame bytes, vnet header excluded, and one
//! op). RX learns a frame's size only from the read, so it asks for
//! admission before the read and pays after (into debt if need be). The pass
//! then ends with `Throttled`, which counts no weight hit, and the event glue
//! waits for the limiter's timer. Without a limiter the cost is one
//! predicted branch per frame.

use std::io;
use std::time::{Duration, Instant};

use super::metrics::NetMetrics;
use super::pass::{Pass, Yield};
use super::tap::NetBackend;
use super::tx::BOUNCE_BUFFER_LEN;
use super::{NUM_BUFFERS_OFFSET, VNET_HDR_LEN};
use crate::mmds::MmdsStack;
use crate::rate_limiter::RateLimiter;
use crate::virtio::events;
use crate::virtio::iov;
use crate::virtio::metrics::Counters;
use crate::virtio::pass::{admitted, queue_failed, refuse_chain};
use crate::virtio::queue::{Chain, ChainRules, IoSeg, QueueError, SplitQueue, IOV_MAX};
use crate::virtio::Interrupt;
use crate::warn::warn_rate_limited;

const RX_RULES: ChainRules = ChainRules {
    device_writes: true,
    min_len: VNET_HDR_LEN,
    max_len: usize::MAX,
};

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
        metrics.host_errors(),
    )
}

/// Pays for an RX frame of `n` bytes, vnet header included.
#[inline(never)]
fn rx_charge(l: &mut RateLimiter, n: usize) {
    l.charge(n.saturating_sub(VNET_HDR_LEN) as u64);
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
enum ReadOutcome {
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
                    refuse_chain(
                        &mut self.queue,
                        &metrics.malformed_chains,
                        "virtio-net",
                        "RX ",
                        head,
                        err,
                    );
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
    ) -> io::Result<ReadOutcome> {
        let (nsegs, cap, nchains) = self.offered();
        let n = self.recv(backend, nsegs, cap)?;
        if n == 0 {
            return Ok(ReadOutcome::Zero);
        }
        if !(VNET_HDR_LEN..=cap).contains(&n) {
            // The chains keep their place in the cache for the next frame.
            let d = events::inc(&metrics.rx_dropped);
            warn_rate_limited!(
                count = d,
                "virtio-net: dropped a {n}-byte RX frame: posted buffers hold {cap} bytes"
            );
            return Ok(ReadOutcome::Dropped);
        }
        let used = self.return_chains(n, nchains);
        pass.frames += 1;
        pass.payload += (n - VNET_HDR_LEN) as u64;
        pass.buffers += used as u64;
        Ok(ReadOutcome::Frame(n))
    }

    /// The chains offered to the next read, as (segments, bytes, chains):
    /// without MRG_RXBUF only the first; with it, as many as the largest
    /// frame needs and one system call takes.
    #[inline(always)]
    fn offered(&self) -> (usize, usize, usize) {
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
        (nsegs, cap, nchains)
    }

    /// One read from the backend into the first `nsegs` cached segments
    /// (`cap` bytes), with the host byte after them that catches a frame
    /// too long for them; the bytes read.
    #[inline(always)]
    fn recv<B: NetBackend>(&mut self, backend: &B, nsegs: usize, cap: usize) -> io::Result<usize> {
        match self.bounce.as_mut() {
            Some(bounce) => {
                let n = iov::host_buf(bounce, |io| backend.recv_frame(io))?;
                if n <= cap {
                    iov::copy_to_segs(&self.segs.items()[..nsegs], 0, &bounce[..n]);
                }
                Ok(n)
            }
            // The usual case: the read may fill every cached segment, so
            // they are the I/O vector as they lie.
            None if nsegs == self.segs.len() => {
                let (v, from) = self.segs.raw();
                iov::with_tail(v, from, &mut self.overflow, |io| backend.recv_frame(io))
            }
            None => {
                self.iov.clear();
                self.iov.extend_from_slice(&self.segs.items()[..nsegs]);
                iov::with_tail(&mut self.iov, 0, &mut self.overflow, |io| {
                    backend.recv_frame(io)
                })
            }
        }
    }

    /// Returns the chains a frame of `n` bytes filled (of the first
    /// `nchains`, which hold at least `n`), each with the bytes it got, and
    /// writes `num_buffers`; how many it took.
    #[inline(always)]
    fn return_chains(&mut self, n: usize, nchains: usize) -> usize {
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
        used
    }

    /// One RX pass: reads frames until the backend is empty, the guest runs
    /// out of buffers, the rate limiter (if any) holds the next frame back,
    /// or the pass must yield.
    pub fn process<B: NetBackend>(
        &mut self,
        backend: &B,
        mut limiter: Option<&mut RateLimiter>,
        mut mmds: Option<&mut MmdsStack>,
        metrics: &NetMetrics,
        irq: &dyn Interrupt,
    ) -> RxStatus {
        if self.broken {
            return RxStatus::Broken;
        }
        events::inc(&metrics.rx_passes);
        let mut pass = Pass::new(self.time_budget);
        let status = loop {
            match self.buffers(&mut pass, metrics) {
                Some(Ok(())) => {}
                Some(Err(status)) => break status,
                None => continue,
            }
            // MMDS's answers go ahead of the backend's frames; without MMDS
            // on the card this is one branch per frame.
            if let Some(m) = mmds.as_deref_mut().filter(|m| m.has_output()) {
                if self.deliver_mmds(m, &mut pass, metrics) {
                    continue;
                }
            }
            if let Some(status) = self.read_one(backend, limiter.as_deref_mut(), &mut pass, metrics)
            {
                break status;
            }
        };
        if status == RxStatus::Broken {
            self.broken = true;
        }
        events::add(&metrics.rx_frames, pass.frames);
        events::add(&metrics.rx_bytes, pass.payload);
        events::add(&metrics.rx_buffers, pass.buffers);
        pass.finish(&mut self.queue, irq, metrics, status == RxStatus::WeightHit);
        status
    }

    /// Puts MMDS's next frame, if it has one, into the cached buffers;
    /// whether it had one. A frame the buffers cannot hold is dropped and
    /// counted (MMDS sends again what the guest asks for again).
    #[inline(never)]
    fn deliver_mmds(&mut self, m: &mut MmdsStack, pass: &mut Pass, metrics: &NetMetrics) -> bool {
        let Some(frame) = m.poll() else {
            return false;
        };
        let n = frame.len();
        let (nsegs, cap, nchains) = self.offered();
        pass.packets += 1;
        if n > cap {
            events::inc(&metrics.mmds.mmds_tx_dropped);
            return true;
        }
        iov::copy_to_segs(&self.segs.items()[..nsegs], 0, frame);
        let used = self.return_chains(n, nchains);
        events::inc(&metrics.mmds.mmds_tx_frames);
        // A delivered frame as any: the pass that ends on an empty ring
        // after it has drained, not starved (a starved pass stops until the
        // driver kicks), and `rx_frames` counts it.
        pass.frames += 1;
        pass.payload += (n - VNET_HDR_LEN) as u64;
        pass.bytes += n as u64;
        pass.buffers += used as u64;
        true
    }

    /// Makes sure buffers for a frame are cached: `Ok` to read one, `Err`
    /// with how the pass ends, `None` to look at the ring again (chains
    /// arrived while kicks were being re-enabled).
    #[inline(always)]
    fn buffers(&mut self, pass: &mut Pass, metrics: &NetMetrics) -> Option<Result<(), RxStatus>> {
        match self.fill_cache(pass, metrics) {
            Err(e) => {
                queue_failed(&metrics.queue_errors, "virtio-net", "RX ", &e);
                Some(Err(RxStatus::Broken))
            }
            Ok(Fill::Yield(why)) => {
                Pass::count_yield(why, &metrics.rx_weight_hits, metrics);
                Some(Err(RxStatus::WeightHit))
            }
            // We have buffers: the guest need not kick us for more until
            // we run short again.
            Ok(Fill::Enough) => {
                self.queue.disable_notifications();
                Some(Ok(()))
            }
            // Ask for a kick when buffers are posted, then look once
            // more: some may have arrived before the request landed.
            Ok(Fill::Empty) => match self.queue.enable_notifications() {
                Ok(true) => {
                    pass.budget.charge(1);
                    None
                }
                // We cannot tell whether another frame waits without
                // reading it. Keep polling the backend: if one does,
                // the next pass starts without buffers and starves.
                Ok(false) if pass.frames > 0 => Some(Err(RxStatus::Drained)),
                Ok(false) => {
                    events::inc(&metrics.rx_no_avail_buffer);
                    self.starved_since = Some(Instant::now());
                    metrics.rx_starved_ns.start();
                    Some(Err(RxStatus::Starved))
                }
                Err(e) => {
                    queue_failed(&metrics.queue_errors, "virtio-net", "RX ", &e);
                    Some(Err(RxStatus::Broken))
                }
            },
        }
    }

    /// Reads one frame into the cached buffers, within the limiter and the
    /// pass's bounds; how the pass ends, or `None` to go on.
    #[inline(always)]
    fn read_one<B: NetBackend>(
        &mut self,
        backend: &B,
        mut limiter: Option<&mut RateLimiter>,
        pass: &mut Pass,
        metrics: &NetMetrics,
    ) -> Option<RxStatus> {
        // The frame's size is known only once it is read: admit it on
        // any token and charge it after, so the debt makes later frames
        // wait (the long-run rate stays exact).
        if let Some(l) = limiter.as_deref_mut() {
            if !rx_admit(l, metrics) {
                return Some(RxStatus::Throttled);
            }
        }
        match self.read_frame(backend, pass, metrics) {
            Ok(ReadOutcome::Frame(n)) => {
                pass.packets += 1;
                pass.bytes += n as u64;
                if let Some(l) = limiter {
                    rx_charge(l, n);
                }
            }
            Ok(ReadOutcome::Dropped) => pass.packets += 1,
            Ok(ReadOutcome::Zero) => return Some(RxStatus::ZeroRead),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Some(RxStatus::Drained),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => return None,
            Err(e) => {
                let n = events::inc(&metrics.host_errors);
                warn_rate_limited!(count = n, "virtio-net: backend read failed: {e}");
                return Some(RxStatus::Drained);
            }
        }
        let why = pass.must_yield(self.weight_bytes, self.weight_packets)?;
        Pass::count_yield(why, &metrics.rx_weight_hits, metrics);
        Some(RxStatus::WeightHit)
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
