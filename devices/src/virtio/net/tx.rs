// SPDX-License-Identifier: Apache-2.0
//! The transmit side: [`TxVirtio`] drains the guest's TX chains into the
//! backend.
//!
//! It owns one [`SplitQueue`] and knows nothing about epoll: a pass is one
//! call to [`TxVirtio::process`], which returns why it stopped
//! ([`TxStatus`]) so the event glue can decide what to wait for next. What
//! ends a pass is shared with RX (see [`pass`](super::pass)).
//!
//! TX is zero copy too: each chain goes out with one `writev` of its
//! descriptors as the guest laid them out, header included. EAGAIN keeps the
//! chain pending until the backend is writable again.
//!
//! **Rate limiting.** A direction with a [`RateLimiter`] pays for every
//! frame in the limiter's tokens (frame bytes, vnet header excluded, and one
//! op). TX pays before the `writev`; a refused chain stays pending, popped
//! but not used, so nothing is lost and the guest sees no completion. The
//! pass then ends with `Throttled`, which counts no weight hit, and the event
//! glue waits for the limiter's timer.
//!
//! **MMDS.** On a card MMDS serves, a chain for the MMDS address goes to the
//! stack, never to the backend. The pass is compiled once per card kind
//! (`TxClaim`): without MMDS the walk looks at nothing and no claim code
//! runs. With it, the walk hands a probe the first buffer's segment while it
//! has it ([`FirstSeg`]), the probe rules most frames out from those bytes
//! ([`packet::rules_out`]), and only the rest (ARP, IPv4 to MMDS, headers
//! split over buffers) are read whole, out of line.

use std::io;
use std::time::Duration;

use super::metrics::NetMetrics;
use super::pass::{Pass, Yield};
use super::tap::NetBackend;
use super::{MAX_FRAME_GSO, VNET_HDR_LEN};
use crate::mmds::packet::{self, ChainBytes, HEAD_LEN, UNDECIDED_HEAD};
use crate::mmds::MmdsStack;
use crate::rate_limiter::RateLimiter;
use crate::virtio::events;
use crate::virtio::io_engine::{WriteRing, MAX_BATCH, NOT_TRIED};
use crate::virtio::iov::{self, IoVecs};
use crate::virtio::metrics::Counters;
use crate::virtio::pass::{admitted, more_after_drained, queue_failed, refuse_chain};
use crate::virtio::queue::{ChainRules, FirstSeg, IoSeg, QueueError, SplitQueue};
use crate::virtio::Interrupt;
use crate::warn::warn_rate_limited;

/// Largest TX chain accepted: a 64 KiB GSO frame plus the vnet header.
pub const MAX_TX_CHAIN_LEN: usize = VNET_HDR_LEN + MAX_FRAME_GSO;
/// Size of the bounce buffer of the copying baseline (vmm-reference's 64 KiB,
/// rounded up so the largest GSO frame fits).
pub const BOUNCE_BUFFER_LEN: usize = MAX_TX_CHAIN_LEN;

/// Bytes a TX batch stops filling at (the chain that crosses it is the
/// last): 32 of the largest GSO frames are about 300 µs of TAP work here,
/// three times the default pass time budget, and a batch cannot be stopped
/// halfway. Five such frames a batch (the fifth crosses the bound) still
/// make the system call a small share of their cost; frames up to 8 KiB
/// fill a whole batch.
pub const TX_BATCH_BYTES: usize = 256 * 1024;

const TX_RULES: ChainRules = ChainRules {
    device_writes: false,
    min_len: VNET_HDR_LEN,
    max_len: MAX_TX_CHAIN_LEN,
};

// The limiter calls stay out of line (`inline(never)`): inlined, they grew
// the RX pass enough that the compiler stopped inlining `readv`, and the
// unlimited datapath paid for the limited one.
/// Whether the TX limiter lets a chain of `len` bytes, vnet header
/// included, go now; counts a refusal.
#[inline(never)]
fn tx_consume(l: &mut RateLimiter, len: usize, metrics: &NetMetrics) -> bool {
    admitted(
        l.consume(len.saturating_sub(VNET_HDR_LEN) as u64),
        &metrics.tx_rate_limiter_throttled,
        &metrics.tx_throttled_ns,
        metrics.host_errors(),
    )
}

/// A walked chain's segments, read in place for MMDS's claim.
struct GuestChain<'a>(&'a [IoSeg]);

impl ChainBytes for GuestChain<'_> {
    #[inline(always)]
    fn bytes<const N: usize>(&self, offset: usize) -> Option<[u8; N]> {
        iov::read_small(self.0, offset)
    }

    #[inline(always)]
    fn two<const N: usize, const M: usize>(
        &self,
        a: usize,
        b: usize,
    ) -> Option<([u8; N], [u8; M])> {
        iov::read_two(self.0, a, b)
    }
}

/// A chain's first bytes, read in place.
struct Head(iov::Prefix<HEAD_LEN>);

impl ChainBytes for Head {
    #[inline(always)]
    fn bytes<const N: usize>(&self, offset: usize) -> Option<[u8; N]> {
        self.0.read(offset)
    }
}

/// What a TX pass asks of the card's MMDS for each chain, compiled once
/// per card kind: a card without MMDS ([`NoMmds`]) walks chains with a
/// probe that is `()` and claims nothing, so it runs the code it would run
/// if MMDS did not exist.
trait TxClaim {
    /// Shown each chain's first segment by the walk.
    type Probe: ClaimProbe;

    /// A probe for the chains of one batch, copied fresh for each.
    fn probe(&self) -> Self::Probe;

    /// The stack, if the chain `segs` (one its probe did not rule out) is
    /// for MMDS, read over all its segments.
    fn claimed(&mut self, segs: &[IoSeg]) -> Option<&mut MmdsStack>;
}

/// What the walk showed of one chain.
trait ClaimProbe: FirstSeg + Copy {
    /// Whether it shows the chain is not for MMDS: the test every frame
    /// pays.
    fn rules_out(&self) -> bool;
}

impl ClaimProbe for () {
    #[inline(always)]
    fn rules_out(&self) -> bool {
        true
    }
}

/// A card without MMDS.
struct NoMmds;

impl TxClaim for NoMmds {
    type Probe = ();

    #[inline(always)]
    fn probe(&self) {}

    #[inline(always)]
    fn claimed(&mut self, _: &[IoSeg]) -> Option<&mut MmdsStack> {
        None
    }
}

/// A card MMDS serves.
struct Mmds<'a> {
    stack: &'a mut MmdsStack,
}

/// A chain's first [`HEAD_LEN`] bytes where they lie, kept as the walk
/// found them so the claim need not find the segment in the batch again;
/// [`UNDECIDED_HEAD`] when the walk showed none (a first buffer too short
/// or over two memory regions), which cannot rule a chain out. It carries
/// MMDS's address so that the batch's loop holds it in a local.
#[derive(Clone, Copy)]
struct MmdsProbe {
    head: iov::Prefix<HEAD_LEN>,
    ip: [u8; 4],
}

impl FirstSeg for MmdsProbe {
    const MIN_LEN: u32 = HEAD_LEN as u32;

    #[inline(always)]
    fn seen(&mut self, seg: IoSeg) {
        if let Some(head) = iov::Prefix::of(seg) {
            self.head = head;
        }
    }
}

impl ClaimProbe for MmdsProbe {
    /// Most frames are ruled out by their first bytes
    /// ([`packet::rules_out`]); the rest (a header split over buffers,
    /// ARP, IPv4 to MMDS) go to [`TxClaim::claimed`].
    #[inline(always)]
    fn rules_out(&self) -> bool {
        packet::rules_out(&Head(self.head), self.ip)
    }
}

impl TxClaim for Mmds<'_> {
    type Probe = MmdsProbe;

    #[inline(always)]
    fn probe(&self) -> MmdsProbe {
        MmdsProbe {
            head: iov::Prefix::of_static(&UNDECIDED_HEAD),
            ip: self.stack.ip(),
        }
    }

    /// Out of line: only frames whose first bytes could not rule them out
    /// come here.
    #[cold]
    #[inline(never)]
    fn claimed(&mut self, segs: &[IoSeg]) -> Option<&mut MmdsStack> {
        if self.stack.claims(&GuestChain(segs)) {
            Some(self.stack)
        } else {
            None
        }
    }
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
/// [`MAX_BATCH`] chains, then writes them all: with a [`WriteRing`] in one
/// system call, else one `writev` each. Items left when a pass ends wait for
/// the backend (EAGAIN; paid) or for the rate limiter (the last, unpaid).
#[derive(Debug, Default)]
struct TxBatch {
    items: Vec<TxItem>,
    segs: Vec<IoSeg>,
    /// What each write returned (see [`WriteRing::write_frames`]).
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
/// is writable: not tried, EAGAIN, or an interrupted ring write.
#[inline]
fn pushed_back(res: i32) -> bool {
    res == NOT_TRIED || res == -libc::EAGAIN || ring_interrupted(res)
}

/// EINTR, which only the ring can answer with (the one-frame write retries
/// it itself). The ring's writes carry RWF_NOWAIT and complete inside the
/// submission, so a signal has nothing to interrupt: defence, kept so an
/// interrupted write would be retried, not dropped.
#[inline]
fn ring_interrupted(res: i32) -> bool {
    res == -libc::EINTR
}

/// How filling the batch ended.
enum TxFill {
    /// The batch holds [`MAX_BATCH`] chains or [`TX_BATCH_BYTES`].
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
    pub(super) time_budget: Option<Duration>,
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
                items: Vec::with_capacity(MAX_BATCH),
                segs: Vec::new(),
                results: Vec::with_capacity(MAX_BATCH),
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
        events::inc(&metrics.tx_dropped);
        if self.refusing != Some(kind) {
            self.refusing = Some(kind);
            let n = events::inc(&metrics.tx_refusal_runs);
            warn_rate_limited!(count = n, "virtio-net: {msg}; dropped, as is every frame after it refused the same way (tx_dropped)");
        }
    }

    /// Hands the chain just walked (its segments from `start` on), whose
    /// frame is for MMDS, to the stack and returns it to the guest: such a
    /// frame never reaches the backend. MMDS frames pay no TX limiter (they
    /// use no TAP bandwidth); the pass's weights and budget bound them as
    /// any frame. Out of line: only MMDS's own frames come here.
    #[inline(never)]
    fn hand_to_mmds(&mut self, m: &mut MmdsStack, head: u16, start: usize, metrics: &NetMetrics) {
        iov::copy_from_segs(&self.batch.segs[start..], m.inbound());
        self.batch.segs.truncate(start);
        m.receive_inbound(std::time::Instant::now(), &metrics.mmds);
        self.queue.add_used(head, 0);
    }

    /// What ends filling before it starts: the chain the limiter held back
    /// is paid for first (and still refused: `Throttled`), and a pass with
    /// no time left for a batch walks none.
    #[inline(always)]
    fn before_fill(
        &mut self,
        limiter: Option<&mut RateLimiter>,
        pass: &mut Pass,
        metrics: &NetMetrics,
    ) -> Result<Option<TxFill>, QueueError> {
        if let Some(last) = self.batch.items.last_mut().filter(|it| !it.paid) {
            if let Some(l) = limiter {
                if !tx_consume(l, last.len, metrics) {
                    return Ok(Some(TxFill::Throttled));
                }
            }
            last.paid = true;
        }
        if self.batch.items.is_empty() && pass.no_room_for_batch() {
            if !self.queue.has_available()? {
                return Ok(Some(TxFill::Empty));
            }
            return Ok(Some(TxFill::Yield(Yield::Time)));
        }
        Ok(None)
    }

    /// Walks chains into the batch until it is full, the ring is empty, the
    /// pass must yield or the rate limiter holds a chain back. A chain the
    /// limiter held back before is paid for first.
    fn fill<C: TxClaim>(
        &mut self,
        mut limiter: Option<&mut RateLimiter>,
        claim: &mut C,
        pass: &mut Pass,
        metrics: &NetMetrics,
    ) -> Result<TxFill, QueueError> {
        if let Some(end) = self.before_fill(limiter.as_deref_mut(), pass, metrics)? {
            return Ok(end);
        }
        // Chains left from the last pass count towards the byte bound too.
        let mut bytes: usize = self.batch.items.iter().map(|it| it.len).sum();
        let fresh = claim.probe();
        loop {
            if self.batch.items.len() >= MAX_BATCH || bytes >= TX_BATCH_BYTES {
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
            let mut probe = fresh;
            match self.queue.walk_with(
                head,
                &TX_RULES,
                &mut self.batch.segs,
                &mut pass.budget,
                &mut probe,
            ) {
                Ok(chain) => {
                    pass.packets += 1;
                    pass.bytes += chain.len as u64;
                    if !probe.rules_out() {
                        if let Some(m) = claim.claimed(&self.batch.segs[start..]) {
                            self.hand_to_mmds(m, head, start, metrics);
                            continue;
                        }
                    }
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
                    refuse_chain(
                        &mut self.queue,
                        &metrics.malformed_chains,
                        "virtio-net",
                        "TX ",
                        head,
                        err,
                    );
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
        ring: &mut Option<WriteRing>,
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
        self.write_batch(backend, ring, &mut results, metrics);
        let again = self.settle(&results, pass, metrics);
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
            events::inc(&metrics.tap_eagain);
        }
        again == 0
    }

    /// Writes the paid chains of the batch: through the ring, or one
    /// system call each without one and for what a failed ring did not
    /// write, until the backend pushes one back. Each result is what the
    /// kernel said of its frame, or `NOT_TRIED`.
    #[inline(always)]
    fn write_batch<B: NetBackend>(
        &mut self,
        backend: &B,
        ring: &mut Option<WriteRing>,
        results: &mut [i32],
        metrics: &NetMetrics,
    ) {
        // The device builds no ring with a bounce buffer (`Net::with_backend`).
        if let Some(r) = ring.as_mut() {
            events::inc(&metrics.tx_batches);
            let batch = &self.batch;
            if let Err(e) = r.write_frames(results.len(), |i| batch.frame(i), results) {
                // Entries the kernel did not take still point at the batch:
                // the ring goes now, and what it did not write goes frame by
                // frame below, as everything from now on.
                *ring = None;
                events::inc(&metrics.host_errors);
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
    }

    /// Returns every chain whose frame the backend took or refused to the
    /// guest and counts it; returns how many it pushed back (they stay).
    #[inline(always)]
    fn settle(&mut self, results: &[i32], pass: &mut Pass, metrics: &NetMetrics) -> usize {
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
        again
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
        ring: &mut Option<WriteRing>,
        limiter: Option<&mut RateLimiter>,
        mmds: Option<&mut MmdsStack>,
        metrics: &NetMetrics,
        irq: &dyn Interrupt,
    ) -> TxStatus {
        match mmds {
            None => self.pass(backend, ring, limiter, &mut NoMmds, metrics, irq),
            Some(stack) => self.pass(backend, ring, limiter, &mut Mmds { stack }, metrics, irq),
        }
    }

    /// [`process`](Self::process), compiled once per card kind (`claim`):
    /// each copy is a function of its own, so the code for a card with MMDS
    /// does not change how the compiler lays out the one without.
    #[inline(never)]
    fn pass<B: NetBackend, C: TxClaim>(
        &mut self,
        backend: &B,
        ring: &mut Option<WriteRing>,
        mut limiter: Option<&mut RateLimiter>,
        claim: &mut C,
        metrics: &NetMetrics,
        irq: &dyn Interrupt,
    ) -> TxStatus {
        if self.broken {
            return TxStatus::Broken;
        }
        events::inc(&metrics.tx_passes);
        let mut pass = Pass::new(self.time_budget);
        let status = 'pass: {
            if self.is_blocked() {
                events::inc(&metrics.tx_eagain_retries);
            }
            // The guest need not kick while we are draining the ring.
            self.queue.disable_notifications();
            loop {
                // Chains pushed back before go first, in their order.
                if self.is_blocked() && !self.flush(backend, ring, &mut pass, metrics) {
                    break 'pass TxStatus::Blocked;
                }
                let fill = match self.fill(limiter.as_deref_mut(), claim, &mut pass, metrics) {
                    Ok(fill) => fill,
                    Err(e) => {
                        // What was walked before the failure still goes out.
                        self.flush(backend, ring, &mut pass, metrics);
                        queue_failed(&metrics.queue_errors, "virtio-net", "TX ", &e);
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
                match more_after_drained(&mut self.queue, &mut pass.budget) {
                    Ok(true) => {}
                    Ok(false) => break 'pass TxStatus::Done,
                    Err(e) => {
                        queue_failed(&metrics.queue_errors, "virtio-net", "TX ", &e);
                        break 'pass TxStatus::Broken;
                    }
                }
            }
        };
        if status == TxStatus::Broken {
            self.broken = true;
        }
        events::add(&metrics.tx_frames, pass.frames);
        events::add(&metrics.tx_bytes, pass.payload);
        pass.finish(&mut self.queue, irq, metrics, status == TxStatus::WeightHit);
        status
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use vm_memory::{Bytes, GuestAddress};

    use super::*;
    use crate::mmds::guest::GuestClient;
    use crate::mmds::{Mmds as Store, DEFAULT_IPV4, DEFAULT_SIZE_LIMIT};
    use crate::virtio::queue::GuestRegions;
    use crate::virtio::GuestMemory;

    /// A card without MMDS rules out every chain: it reads none.
    #[test]
    fn a_card_without_mmds_rules_out_every_chain() {
        assert!(<NoMmds as TxClaim>::Probe::rules_out(&()));
        assert!(NoMmds.claimed(&[]).is_none());
    }

    /// MMDS's probe rules a chain out by the head the walk showed it, and
    /// rules out nothing it was not shown (or shown too short).
    #[test]
    fn the_mmds_probe_rules_out_by_the_head_it_was_shown() {
        let mem = GuestMemory::from_ranges(&[(GuestAddress(0), 0x10000)]).expect("memory");
        let regions = GuestRegions::new(&mem).expect("regions");
        let mut stack = MmdsStack::new(
            DEFAULT_IPV4,
            Arc::new(Mutex::new(Store::new(DEFAULT_SIZE_LIMIT))),
        );
        let mut claim = Mmds { stack: &mut stack };
        let fresh = claim.probe();
        assert!(!fresh.rules_out(), "shown nothing");
        let mut other = GuestClient::new(DEFAULT_IPV4, 40000);
        other.mmds_ip = [10, 0, 0, 9];
        let mine = GuestClient::new(DEFAULT_IPV4, 40000);
        // (frame, bytes of it shown, whether the probe rules it out)
        let cases = [
            (other.segment(packet::flags::SYN, b"", None), None, true),
            (
                other.segment(packet::flags::SYN, b"", None),
                Some(HEAD_LEN - 1),
                false,
            ),
            (mine.segment(packet::flags::SYN, b"", None), None, false),
            (other.arp_request(), None, false),
            (mine.arp_request(), None, false),
        ];
        for (i, (f, shown, ruled_out)) in cases.into_iter().enumerate() {
            let gpa = 0x1000 * (i as u64 + 1);
            mem.write_slice(&f, GuestAddress(gpa)).expect("written");
            let seg = regions
                .segment(gpa, shown.unwrap_or(f.len()) as u64)
                .expect("in memory");
            let mut probe = fresh;
            probe.seen(seg);
            assert_eq!(probe.rules_out(), ruled_out, "case {i}");
            // What the probe did not rule out, the whole chain decides.
            let whole = regions.segment(gpa, f.len() as u64).expect("in memory");
            let for_mmds = i == 2 || i == 4;
            assert_eq!(claim.claimed(&[whole]).is_some(), for_mmds, "case {i}");
        }
    }
}
