// SPDX-License-Identifier: Apache-2.0
//! Bounded passes over the three queues (virtio 1.2 §5.10.2): TX (the
//! guest's packets into the muxer), RX (the muxer's packets into the
//! guest's buffers) and the event queue (TRANSPORT_RESET).
//!
//! **Every pass is bounded**, as the other devices' are: it stops after
//! [`PASS_PACKETS`] packets, [`PASS_BYTES`] payload bytes or
//! [`PASS_DESC_BUDGET`] ring entries and descriptors read, good and refused
//! chains alike, and the event glue re-queues it behind every other ready
//! event. So a pass never reads more than
//! [`MAX_PASS_READS`](crate::virtio::queue::MAX_PASS_READS) ring entries
//! and descriptors (the budget every device shares);
//! `VsockMetrics::max_descs_per_pass` shows the largest seen.
//!
//! **Chains.** A TX chain is device-readable: the 44-byte header, then the
//! payload, cut into descriptors however the driver likes (Linux 6.1 puts
//! the header in one descriptor and the payload in another; later kernels
//! put both in one). An RX chain is device-writable, header first, payload
//! after it, again cut anywhere, with room for at least one byte of payload
//! (a header-only chain could carry no data, and data waiting for it would
//! wait for good). A chain that breaks the ring's rules, is shorter than
//! that or longer than the device accepts is returned with used length 0
//! and counted in `malformed_packets`.
//!
//! **RX buffers in batches.** The RX pass keeps up to [`RX_BATCH`] chains
//! (or [`RX_BATCH_BYTES`] of payload room) taken from the ring and not used
//! yet, in ring order, and hands the muxer all their payload room at once:
//! one `readv` from a host socket fills as many as the socket has data for,
//! each becoming a packet of its own (Linux posts 4 KiB buffers, so a
//! stream costs one call per 64 KiB rather than per 4 KiB). A control
//! packet takes the first. The buffers past the first are taken without
//! asking the driver for kicks, and buffers are used in the order they
//! were taken, so a snapshot's "the chains from `used.idx` on" stays exact.
//! A chain taken when the muxer turned out to have nothing to put in it (a
//! socket that had no data after all) is kept for the next packet, not
//! returned empty.

use std::collections::VecDeque;
use std::sync::atomic::Ordering;

use super::backend::VsockBackend;
use super::metrics::VsockMetrics;
use super::muxer::{payload_segs, Muxer, TxChain};
use super::packet::{Header, EVENT_TRANSPORT_RESET, HDR_LEN, MAX_PAYLOAD};
use crate::virtio::events::{add, inc};
use crate::virtio::iov::{read_array, write_bytes_at};
use crate::virtio::queue::{
    Budget, Chain, ChainRules, IoSeg, Notify, SplitQueue, PASS_DESC_BUDGET,
};
use crate::virtio::Interrupt;
use crate::warn::warn_rate_limited;

/// Index of the RX queue (virtio 1.2 §5.10.2).
pub const RX_INDEX: usize = 0;
/// Index of the TX queue.
pub const TX_INDEX: usize = 1;
/// Index of the event queue.
pub const EVT_INDEX: usize = 2;

/// Packets one pass handles before it yields (vhost's packet weight).
pub const PASS_PACKETS: u32 = 256;
/// Payload bytes one pass moves before it yields (vhost's byte weight).
pub const PASS_BYTES: u64 = 0x80000;

/// The longest RX chain used: the header and the largest payload Linux's
/// driver ever posts room for, with slack for a driver that posts a little
/// more. Longer chains are refused.
pub const MAX_RX_CHAIN: usize = 1 << 20;

/// RX buffers the pass keeps ready for one read from a host socket.
pub const RX_BATCH: usize = 16;
/// Payload room past which the pass takes no more RX buffers for a read.
pub const RX_BATCH_BYTES: usize = 64 * 1024;

/// How a pass ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PassStatus {
    /// Nothing left to do, or waiting on the guest.
    Done,
    /// A bound was reached: run again after the other ready events.
    Yield,
    /// The queue is unusable (avail index out of range): the device needs
    /// a reset.
    Broken,
}

/// One pass's bookkeeping.
struct Pass {
    budget: Budget,
    packets: u32,
    bytes: u64,
}

impl Pass {
    fn new() -> Self {
        Pass {
            budget: Budget::new(PASS_DESC_BUDGET),
            packets: 0,
            bytes: 0,
        }
    }

    fn must_yield(&self) -> bool {
        self.budget.exhausted() || self.packets >= PASS_PACKETS || self.bytes >= PASS_BYTES
    }

    fn finish(&self, m: &VsockMetrics, status: PassStatus) -> PassStatus {
        let spent = u64::from(self.budget.spent());
        inc(&m.queue.passes);
        add(&m.queue.descs_walked, spent);
        m.queue
            .max_descs_per_pass
            .fetch_max(spent, Ordering::Relaxed);
        if status == PassStatus::Yield {
            inc(&m.queue.pass_yields);
        }
        status
    }
}

/// An RX chain taken from the ring and not used yet.
struct RxBuf {
    chain: Chain,
    /// Its segments, the header's first.
    segs: Vec<IoSeg>,
    /// The payload it carries at most: its room after the header, up to
    /// the largest packet.
    room: usize,
    /// Its entries in `VsockVirtio::rx_payload`.
    nsegs: usize,
}

/// The three queues of one activation.
pub(crate) struct VsockVirtio {
    pub(crate) queues: [SplitQueue; 3],
    guest_cid: u64,
    segs: Vec<IoSeg>,
    payload: Vec<IoSeg>,
    /// RX chains taken and not used, in ring order.
    rx_bufs: VecDeque<RxBuf>,
    /// Their payload parts, in the same order.
    rx_payload: VecDeque<IoSeg>,
    /// Their `room`, summed.
    rx_room: usize,
    /// Segment vectors of used RX chains, to take the next ones into.
    seg_pool: Vec<Vec<IoSeg>>,
    /// A TRANSPORT_RESET waits for an event buffer.
    pub(crate) event_pending: bool,
    /// A pass published used entries the driver wants an interrupt for.
    irq_owed: bool,
}

/// A queue-level failure: counted, and the pass reports a broken queue.
fn queue_failed(m: &VsockMetrics, what: impl std::fmt::Display) -> PassStatus {
    let n = inc(&m.queue.queue_errors);
    warn_rate_limited!(
        count = n,
        "virtio-vsock: {what}; the queue stops until a reset"
    );
    PassStatus::Broken
}

fn malformed(m: &VsockMetrics, what: impl std::fmt::Display) {
    let n = inc(&m.malformed_packets);
    warn_rate_limited!(count = n, "virtio-vsock: malformed packet: {what}");
}

impl VsockVirtio {
    pub(crate) fn new(queues: [SplitQueue; 3], guest_cid: u64) -> Self {
        VsockVirtio {
            queues,
            guest_cid,
            segs: Vec::new(),
            payload: Vec::new(),
            rx_bufs: VecDeque::new(),
            rx_payload: VecDeque::new(),
            rx_room: 0,
            seg_pool: Vec::new(),
            event_pending: false,
            irq_owed: false,
        }
    }

    /// Publishes the used entries of queue `q` and notes whether the driver
    /// wants an interrupt for them; [`raise_owed`](Self::raise_owed) raises
    /// it. The transport has one interrupt for all three queues, so the TX
    /// pass and the RX pass it runs (and every pass of one event) share
    /// one: the guest's handler looks at every queue.
    fn publish(&mut self, q: usize, m: &VsockMetrics) {
        match self.queues[q].publish_used() {
            Notify::Interrupt => self.irq_owed = true,
            Notify::Suppressed => add(&m.queue.interrupts_suppressed, 1),
            Notify::Nothing => {}
        }
    }

    /// Raises the interrupt the passes since the last call owe the driver,
    /// if any, counted in `interrupts`.
    pub(crate) fn raise_owed(&mut self, m: &VsockMetrics, irq: &dyn Interrupt) {
        if std::mem::take(&mut self.irq_owed) {
            inc(&m.queue.interrupts);
            irq.signal_used_queue();
        }
    }

    /// The next chain of queue `q`, re-enabling notifications when the ring
    /// looks empty (and looking once more, charged to the budget).
    #[inline]
    fn next_head(&mut self, q: usize, pass: &mut Pass) -> Result<Option<u16>, PassStatus> {
        let queue = &mut self.queues[q];
        loop {
            match queue.pop(&mut pass.budget) {
                Ok(Some(h)) => return Ok(Some(h)),
                Ok(None) => {}
                Err(_) => return Err(PassStatus::Broken),
            }
            match queue.enable_notifications() {
                Ok(true) => {
                    pass.budget.charge(1);
                    queue.disable_notifications();
                }
                Ok(false) => return Ok(None),
                Err(_) => return Err(PassStatus::Broken),
            }
        }
    }

    /// A TX pass: every packet the guest posted, within the bounds.
    pub(crate) fn tx_pass<B: VsockBackend>(
        &mut self,
        mux: &mut Muxer<B>,
        m: &VsockMetrics,
    ) -> PassStatus {
        let mut pass = Pass::new();
        let rules = ChainRules {
            device_writes: false,
            min_len: HDR_LEN,
            max_len: HDR_LEN + MAX_PAYLOAD as usize,
        };
        self.queues[TX_INDEX].disable_notifications();
        let status = loop {
            if pass.must_yield() {
                break PassStatus::Yield;
            }
            let head = match self.next_head(TX_INDEX, &mut pass) {
                Ok(Some(h)) => h,
                Ok(None) => break PassStatus::Done,
                Err(s) => break s,
            };
            pass.packets += 1;
            self.segs.clear();
            let q = &self.queues[TX_INDEX];
            let held = match q.walk(head, &rules, &mut self.segs, &mut pass.budget) {
                Ok(chain) => {
                    let (bytes, held) = self.tx_packet(chain, mux, m);
                    pass.bytes += bytes;
                    held
                }
                Err(e) => {
                    malformed(m, e);
                    false
                }
            };
            if !held {
                self.queues[TX_INDEX].add_used(head, 0);
            }
        };
        // Counted once a pass: an atomic add a packet is cycles the
        // datapath does not need.
        add(&m.tx_packets, u64::from(pass.packets));
        add(&m.tx_bytes, mux.take_tx_bytes());
        if status == PassStatus::Broken {
            let _ = queue_failed(m, "TX avail index out of range");
        }
        // The packets each connection deferred, one write each; the
        // chains written go back with the others, in the one publish.
        mux.flush_deferred();
        self.return_held(mux, m);
        pass.finish(m, status)
    }

    /// One packet in `self.segs`; returns its payload bytes and whether
    /// the muxer holds its chain.
    fn tx_packet<B: VsockBackend>(
        &mut self,
        chain: Chain,
        mux: &mut Muxer<B>,
        m: &VsockMetrics,
    ) -> (u64, bool) {
        let (bytes, _) = read_array::<HDR_LEN>(&self.segs, 0);
        let hdr = Header::parse(&bytes);
        if let Err(e) = hdr.check_from_guest(self.guest_cid, chain.len) {
            malformed(m, e);
            return (0, false);
        }
        let payload = payload_segs(&self.segs, chain.len, hdr.len as usize, &mut self.payload);
        // Counted by its buffers as well as its ring descriptors: an
        // indirect chain takes one of the ring but its segments are held
        // (as I/O vectors) too, so the bound covers both.
        let tx = TxChain {
            head: chain.head,
            descs: chain.ring_descs.max(chain.nsegs),
        };
        let held = mux.on_guest_packet(&hdr, payload, tx);
        (u64::from(hdr.len), held)
    }

    /// Returns the held chains the muxer is done with (a host socket took
    /// their bytes, their connection ended) to the TX used ring, length 0
    /// as every TX chain, and publishes them; the caller raises the
    /// interrupt owed.
    pub(crate) fn return_held<B: VsockBackend>(&mut self, mux: &mut Muxer<B>, m: &VsockMetrics) {
        for head in mux.returned.drain(..) {
            self.queues[TX_INDEX].add_used(head, 0);
        }
        self.publish(TX_INDEX, m);
    }

    /// An RX pass: packets the muxer owes the guest, into the buffers the
    /// guest posted, within the bounds.
    pub(crate) fn rx_pass<B: VsockBackend>(
        &mut self,
        mux: &mut Muxer<B>,
        m: &VsockMetrics,
    ) -> PassStatus {
        let mut pass = Pass::new();
        // The driver need not kick while buffers are left: the pass takes
        // them from the ring when work comes. It asks for kicks again only
        // when it runs out of buffers with work waiting (`next_head`).
        self.queues[RX_INDEX].disable_notifications();
        let status = 'pass: loop {
            if !mux.has_rx_work() {
                break PassStatus::Done;
            }
            if pass.must_yield() {
                break PassStatus::Yield;
            }
            if self.rx_bufs.is_empty() {
                match self.take_rx_buf(&mut pass, m, true) {
                    Ok(true) => {}
                    Ok(false) => break PassStatus::Done,
                    Err(s) => break s,
                }
            }
            // More for one read to fill, within what the pass has left.
            while self.rx_bufs.len() < RX_BATCH && self.rx_room < RX_BATCH_BYTES {
                let packets_left = PASS_PACKETS.saturating_sub(pass.packets) as usize;
                if self.rx_bufs.len() >= packets_left || pass.budget.exhausted() {
                    break;
                }
                match self.take_rx_buf(&mut pass, m, false) {
                    Ok(true) => {}
                    Ok(false) => break,
                    Err(s) => break 'pass s,
                }
            }
            // PASS_BYTES - bytes >= 1: the pass did not yield.
            let room = self
                .rx_room
                .min((PASS_BYTES.saturating_sub(pass.bytes)) as usize);
            let Some((mut hdr, n)) = mux.next_rx(self.rx_payload.make_contiguous(), room) else {
                break PassStatus::Done;
            };
            // The bytes read fill the buffers in order, a packet each; a
            // packet with no data takes the first.
            let mut left = n;
            while let Some(buf) = self.rx_bufs.pop_front() {
                let len = left.min(buf.room);
                // len <= room <= MAX_PAYLOAD.
                hdr.len = len as u32;
                write_bytes_at(&buf.segs, 0, &hdr.to_bytes());
                // HDR_LEN + len <= chain.len <= MAX_RX_CHAIN.
                self.queues[RX_INDEX].add_used(buf.chain.head, (HDR_LEN + len) as u32);
                self.rx_payload.drain(..buf.nsegs);
                self.rx_room -= buf.room;
                self.seg_pool.push(buf.segs);
                inc(&m.rx_packets);
                pass.packets += 1;
                pass.bytes += len as u64;
                left -= len;
                if left == 0 {
                    break;
                }
            }
        };
        if status == PassStatus::Broken {
            let _ = queue_failed(m, "RX avail index out of range");
        }
        self.publish(RX_INDEX, m);
        pass.finish(m, status)
    }

    /// Takes the next good RX chain onto `rx_bufs`; refused chains are
    /// returned with length 0 on the way. `false` when the ring has none;
    /// with `wait`, the driver is then asked to kick when it posts more.
    fn take_rx_buf(
        &mut self,
        pass: &mut Pass,
        m: &VsockMetrics,
        wait: bool,
    ) -> Result<bool, PassStatus> {
        // Room for the header and at least one byte of data: a chain that
        // could carry only control packets would hold data back for good
        // (Linux posts 4 KiB of room).
        let rules = ChainRules {
            device_writes: true,
            min_len: HDR_LEN + 1,
            max_len: MAX_RX_CHAIN,
        };
        loop {
            if pass.must_yield() {
                return Err(PassStatus::Yield);
            }
            let head = if wait {
                self.next_head(RX_INDEX, pass)?
            } else {
                self.queues[RX_INDEX]
                    .pop(&mut pass.budget)
                    .map_err(|_| PassStatus::Broken)?
            };
            let Some(head) = head else {
                return Ok(false);
            };
            let mut segs = self.seg_pool.pop().unwrap_or_default();
            segs.clear();
            let q = &self.queues[RX_INDEX];
            match q.walk(head, &rules, &mut segs, &mut pass.budget) {
                Ok(chain) => {
                    let room = (chain.len - HDR_LEN).min(MAX_PAYLOAD as usize);
                    let before = self.rx_payload.len();
                    for &seg in payload_segs(&segs, chain.len, room, &mut self.payload) {
                        self.rx_payload.push_back(seg);
                    }
                    self.rx_room += room;
                    let nsegs = self.rx_payload.len() - before;
                    self.rx_bufs.push_back(RxBuf {
                        chain,
                        segs,
                        room,
                        nsegs,
                    });
                    return Ok(true);
                }
                Err(e) => {
                    self.seg_pool.push(segs);
                    pass.packets += 1;
                    malformed(m, e);
                    self.queues[RX_INDEX].add_used(head, 0);
                }
            }
        }
    }

    /// Delivers a pending TRANSPORT_RESET into an event buffer, if the guest
    /// posted one.
    pub(crate) fn event_pass(&mut self, m: &VsockMetrics) -> PassStatus {
        if !self.event_pending {
            return PassStatus::Done;
        }
        let mut pass = Pass::new();
        let rules = ChainRules {
            device_writes: true,
            min_len: 4,
            max_len: 4096,
        };
        let status = loop {
            if pass.must_yield() {
                break PassStatus::Yield;
            }
            let head = match self.next_head(EVT_INDEX, &mut pass) {
                Ok(Some(h)) => h,
                Ok(None) => break PassStatus::Done,
                Err(s) => break s,
            };
            pass.packets += 1;
            self.segs.clear();
            let q = &self.queues[EVT_INDEX];
            if let Err(e) = q.walk(head, &rules, &mut self.segs, &mut pass.budget) {
                malformed(m, e);
                self.queues[EVT_INDEX].add_used(head, 0);
                continue;
            }
            write_bytes_at(&self.segs, 0, &EVENT_TRANSPORT_RESET.to_le_bytes());
            self.queues[EVT_INDEX].add_used(head, 4);
            self.event_pending = false;
            inc(&m.transport_resets);
            break PassStatus::Done;
        };
        if status == PassStatus::Broken {
            let _ = queue_failed(m, "event avail index out of range");
        }
        self.publish(EVT_INDEX, m);
        pass.finish(m, status)
    }
}
