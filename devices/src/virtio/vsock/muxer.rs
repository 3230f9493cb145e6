// SPDX-License-Identifier: Apache-2.0
//! The connection multiplexer: the guest's packets to the host sockets
//! they belong to, and the host sockets' data and events back into packets
//! for the guest, with Firecracker's host-side protocol.
//!
//! **Host-initiated.** A host process connects to `uds_path` (the
//! listener) and writes `CONNECT <port>\n`; the muxer reads the line a byte
//! at a time (so no byte the process sends after it is consumed), assigns
//! the connection a host port from `[1 << 30, 1 << 31)` and sends the guest
//! a REQUEST; the guest's RESPONSE makes it write `OK <host port>\n` to the
//! process and relay from then on; the guest's RST, a line that is not a
//! `CONNECT`, or no RESPONSE within the connect time-out closes the socket.
//!
//! **Guest-initiated.** A guest REQUEST to port P connects to
//! `<uds_path>_P`; the muxer answers RESPONSE, or RST when nothing listens
//! there or the connection cap is reached.
//!
//! **The end of a connection.** The guest's SHUTDOWN SEND drains what the
//! host socket has not taken, then shuts the socket's write side; the host's
//! EOF becomes a SHUTDOWN SEND to the guest; once neither side can send
//! ([`Conn::finished`]) the muxer resets the connection, as the spec's
//! "SHUTDOWN then RST" asks. A SHUTDOWN that leaves bytes the host does not
//! take is reset after the shutdown time-out. A host socket that fails
//! (`EPIPE`, `ECONNRESET`) resets the connection; the guest's RST closes it.
//!
//! **Bounds.** At most `max_connections` connections (host sockets waiting
//! for their `CONNECT` line included); each holds at most `buf_alloc`
//! bytes the host did not take (credit: a guest that sends past it is
//! reset), in held TX chains and in copies; RSTs owed for packets of no
//! connection wait in a queue of [`MAX_QUEUED_RSTS`], beyond which they are
//! dropped and counted. The muxer
//! never polls a socket it cannot act on: a readable socket leaves the
//! poll set until a read drains it, and one whose guest has no credit
//! waits for the guest's credit before it is read again.
//!
//! **Deferred TX chains.** A connection's packets of one TX pass go to its
//! host socket together: each chain is held unwritten as it comes (within
//! the bounds below), and at the end of the pass one `writev` takes them
//! all, up to `HELD_IOVS` segments a call, so a stream of 4 KiB packets
//! costs a call per pass rather than per packet. A packet of another kind
//! (SHUTDOWN, RST, ...) first writes what its connection deferred, so the
//! host sees every byte sent before it, as if nothing had waited. What the
//! socket refuses of them stays held as below.
//!
//! **Held TX chains.** A packet whose payload the host socket did not take
//! whole keeps its TX chain: the rest is written from guest memory when
//! the socket polls writable, and the chain is returned once its last byte
//! is written, out of order with the chains around it (the used ring
//! allows it). The chains held are bounded within the TX ring the driver
//! chose: a connection holds at most half of its descriptors, the device
//! at most three quarters ([`HoldLimits`]); past that the rest of a packet
//! is copied into the connection's `pending` and its chain returned at
//! once. So a host that never reads keeps at most half the ring from the
//! guest, and every such host together at most three quarters: the other
//! connections always have the rest. A held chain goes back (its head on
//! [`Muxer::returned`], put in the used ring at the end of the event) when
//! its bytes are written, when its connection ends however it ends, or
//! when [`Muxer::spill_held`] copies what it owes (a snapshot); a device
//! reset forgets it with the rings.
//!
//! Sockets are closed only after the event handler took them out of the
//! poll set (`graveyard`), so that no descriptor number is reused while
//! epoll still knows it.

use std::collections::{HashMap, VecDeque};
use std::os::unix::net::UnixListener;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use super::backend::VsockBackend;
use super::conn::{Conn, State, MAX_CONNECT_LINE};
use super::metrics::VsockMetrics;
use super::packet::{Header, Op, HDR_LEN, SHUTDOWN_RCV, SHUTDOWN_SEND, TYPE_STREAM};
use super::Tunables;
use crate::virtio::events::{add, inc};
use crate::virtio::iov::{copy_from_segs, IoVecs};
use crate::virtio::queue::{split_seg, IoSeg};
use crate::warn::warn_rate_limited;

/// RSTs owed for packets that belong to no connection, or for connections
/// already gone, held for RX buffers; beyond this they are dropped.
pub const MAX_QUEUED_RSTS: usize = 1024;

/// Host connections accepted per listener event: the rest wait for the
/// next one (the listener stays readable), so a flood of connects cannot
/// hold the event loop.
pub const ACCEPTS_PER_EVENT: usize = 16;

/// First host port given to host-initiated connections (Firecracker's).
pub const FIRST_HOST_PORT: u32 = 1 << 30;

/// The most segments one write of held chains passes to `writev`.
pub const HELD_IOVS: usize = 64;

/// How many TX ring descriptors held chains may keep, from the size of
/// the TX ring the driver chose.
///
/// One connection may hold half the ring: Linux's 256 KiB of credit in
/// 4 KiB packets of two descriptors each (its layout until 6.2) is 128
/// descriptors, half of a 256-entry ring, so a connection whose host reads
/// in bursts keeps its whole window in guest memory. All of them together
/// may hold three quarters: whatever the hosts that do not read, a quarter
/// of the ring always turns over for the others.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct HoldLimits {
    /// By one connection.
    pub(crate) per_conn: usize,
    /// By all of them.
    pub(crate) all: usize,
}

impl HoldLimits {
    /// Whether a connection holding `conn` descriptors, on a device holding
    /// `all`, may hold a chain of `descs` more.
    pub(crate) fn allow(self, conn: usize, all: usize, descs: usize) -> bool {
        conn + descs <= self.per_conn && all + descs <= self.all
    }

    /// The limits for a TX ring of `size` descriptors.
    pub(crate) fn for_ring(size: u16) -> Self {
        let size = usize::from(size);
        HoldLimits {
            per_conn: size / 2,
            all: size / 4 * 3,
        }
    }
}

/// A TX chain as the muxer sees it: what it needs to hold it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct TxChain {
    /// Its head.
    pub(crate) head: u16,
    /// The ring descriptors it takes, or its buffers if more (an
    /// indirect chain's): what the bounds count.
    pub(crate) descs: usize,
}

/// A connection's key: (guest port, host port).
type Key = (u32, u32);

/// The poll interest of a connection's socket (read, write).
pub(crate) type Interest = (bool, bool);

/// A socket taken out of service, closed once it left the poll set.
pub(crate) struct Grave<S> {
    pub(crate) stream: S,
    pub(crate) registered: bool,
}

/// The multiplexer.
pub(crate) struct Muxer<B: VsockBackend> {
    pub(crate) backend: B,
    pub(crate) listener: UnixListener,
    uds_path: PathBuf,
    guest_cid: u64,
    tun: Tunables,
    pub(crate) slots: Vec<Option<Conn<B::Stream>>>,
    /// What each slot's socket is registered for, if it is.
    pub(crate) registered: Vec<Option<Interest>>,
    map: HashMap<Key, usize>,
    /// The connection the last guest packet found in `map`, while it is in
    /// service: a stream's packets come in runs, and hashing every key
    /// (SipHash, as guest-chosen keys need) cost about 170 instructions a
    /// packet.
    last: Option<(Key, usize)>,
    rx_work: VecDeque<usize>,
    rsts: VecDeque<Key>,
    next_host_port: u32,
    /// Slots whose poll interest may have changed.
    pub(crate) dirty: Vec<usize>,
    pub(crate) graveyard: Vec<Grave<B::Stream>>,
    /// A deadline was set or cleared since the timer was last armed.
    pub(crate) deadlines_changed: bool,
    metrics: Arc<VsockMetrics>,
    scratch: Vec<IoSeg>,
    /// The part of a packet a host socket refused, as segments.
    rest: Vec<IoSeg>,
    copy: Vec<u8>,
    /// How many ring descriptors held chains may keep.
    pub(crate) hold: HoldLimits,
    /// Ring descriptors the held chains of every connection keep.
    pub(crate) held_descs: usize,
    /// Heads of held chains now done with, to put in the TX used ring.
    pub(crate) returned: Vec<u16>,
    /// Slots whose held chains wait for the end of the TX pass, unwritten.
    deferred: Vec<usize>,
    /// Guest data bytes accepted since the TX pass last took them
    /// ([`take_tx_bytes`](Self::take_tx_bytes)): the metric is added to
    /// once a pass, as an atomic add a packet costs the datapath cycles.
    tx_bytes: u64,
}

/// Puts `slot` on `dirty`, the list whose poll interest is brought in line
/// after the event, once for a run of the same slot: a pass of one
/// connection's packets marks it once, not once a packet, for the sort that
/// dedups the list. A function of the list alone, so that it can be called
/// while a connection in the slots is borrowed.
fn mark_dirty(dirty: &mut Vec<usize>, slot: usize) {
    if dirty.last() != Some(&slot) {
        dirty.push(slot);
    }
}

/// The segments of `segs` from byte `from` on, at most `len` bytes.
pub(crate) fn take_range(segs: &[IoSeg], mut from: usize, mut len: usize, out: &mut Vec<IoSeg>) {
    out.clear();
    for &seg in segs {
        if len == 0 {
            break;
        }
        if from >= seg.len() {
            from -= seg.len();
            continue;
        }
        let (_, rest) = split_seg(seg, from);
        let (part, _) = split_seg(rest, len);
        len -= part.len();
        from = 0;
        out.push(part);
    }
}

/// The `len` bytes after the header of a chain of `total` bytes whose
/// segments are `segs`, without cutting them where the layouts Linux posts
/// allow: the header in a buffer of its own and exactly `len` bytes after it
/// (its TX, and its RX before 6.3) gives the segments after it as they are;
/// header and payload in one buffer (its RX from 6.3 on) is cut once; any
/// other layout goes through [`take_range`] into `out`.
#[inline]
pub(crate) fn payload_segs<'a>(
    segs: &'a [IoSeg],
    total: usize,
    len: usize,
    out: &'a mut Vec<IoSeg>,
) -> &'a [IoSeg] {
    match segs {
        [hdr, rest @ ..] if hdr.len() == HDR_LEN && total - HDR_LEN == len => rest,
        [one] => {
            out.clear();
            out.push(split_seg(split_seg(*one, HDR_LEN).1, len).0);
            out
        }
        _ => {
            take_range(segs, HDR_LEN, len, out);
            out
        }
    }
}

impl<B: VsockBackend> Muxer<B> {
    pub(crate) fn new(
        backend: B,
        listener: UnixListener,
        uds_path: PathBuf,
        guest_cid: u64,
        tun: Tunables,
        metrics: Arc<VsockMetrics>,
    ) -> Self {
        Muxer {
            backend,
            listener,
            uds_path,
            guest_cid,
            tun,
            slots: Vec::new(),
            registered: Vec::new(),
            map: HashMap::new(),
            last: None,
            rx_work: VecDeque::new(),
            rsts: VecDeque::new(),
            next_host_port: FIRST_HOST_PORT,
            dirty: Vec::new(),
            graveyard: Vec::new(),
            deadlines_changed: false,
            metrics,
            scratch: Vec::new(),
            rest: Vec::new(),
            copy: Vec::new(),
            hold: HoldLimits::default(),
            held_descs: 0,
            returned: Vec::new(),
            tx_bytes: 0,
            deferred: Vec::new(),
        }
    }

    /// Connections open (host sockets waiting for their line included).
    pub(crate) fn connections(&self) -> usize {
        self.slots.iter().filter(|s| s.is_some()).count()
    }

    /// Bytes held for host sockets that did not take them, in all.
    pub(crate) fn pending_bytes(&self) -> usize {
        self.slots
            .iter()
            .flatten()
            .map(|c| c.pending.len() + c.held.bytes())
            .sum()
    }

    /// TX chains held for host sockets, in all.
    pub(crate) fn held_chains(&self) -> usize {
        self.slots.iter().flatten().map(|c| c.held.len()).sum()
    }

    /// Copies what every held chain still owes its host socket into the
    /// connection's `pending`, in its place (after the `OK` line, before
    /// the copies made after it), and gives the chains up onto
    /// [`returned`](Self::returned): the rings then hold no chain taken
    /// out of order, as a snapshot needs.
    pub(crate) fn spill_held(&mut self) {
        for c in self.slots.iter_mut().flatten() {
            if c.held.is_empty() {
                continue;
            }
            copy_from_segs(c.held.segs(), &mut self.copy);
            let tail: Vec<u8> = c.pending.drain(c.pending_ctl..).collect();
            c.pending.extend(self.copy.iter());
            c.pending.extend(tail);
            self.held_descs -= c.held.release(&mut self.returned);
        }
    }

    /// RSTs waiting for RX buffers.
    pub(crate) fn queued_rsts(&self) -> usize {
        self.rsts.len()
    }

    /// Whether a packet waits for an RX buffer.
    pub(crate) fn has_rx_work(&self) -> bool {
        !self.rsts.is_empty() || !self.rx_work.is_empty()
    }

    /// The connection in `slot`, if any.
    pub(crate) fn conn(&self, slot: usize) -> Option<&Conn<B::Stream>> {
        self.slots.get(slot).and_then(Option::as_ref)
    }

    /// The earliest deadline of any connection.
    pub(crate) fn next_deadline(&self) -> Option<Instant> {
        self.slots.iter().flatten().filter_map(|c| c.deadline).min()
    }

    fn alloc_slot(&mut self, conn: Conn<B::Stream>) -> usize {
        let slot = match self.slots.iter().position(Option::is_none) {
            Some(s) => s,
            None => {
                self.slots.push(None);
                self.registered.push(None);
                self.slots.len() - 1
            }
        };
        self.slots[slot] = Some(conn);
        self.registered[slot] = None;
        mark_dirty(&mut self.dirty, slot);
        inc(&self.metrics.conns_active);
        slot
    }

    fn queue_rst(&mut self, key: Key) {
        if self.rsts.len() >= MAX_QUEUED_RSTS {
            let n = inc(&self.metrics.rsts_dropped);
            warn_rate_limited!(count = n, "virtio-vsock: RX queue full, an RST was dropped");
            return;
        }
        self.rsts.push_back(key);
    }

    /// Takes the connection in `slot` out of service; an `rst` tells the
    /// guest (a connection it knows of).
    pub(crate) fn kill(&mut self, slot: usize, rst: bool) {
        let Some(mut conn) = self.slots.get_mut(slot).and_then(Option::take) else {
            return;
        };
        self.metrics
            .conns_active
            .fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
        let key = (conn.guest_port, conn.host_port);
        if self.map.get(&key) == Some(&slot) {
            self.map.remove(&key);
        }
        if self.last.is_some_and(|(_, s)| s == slot) {
            self.last = None;
        }
        if conn.queued {
            self.rx_work.retain(|&s| s != slot);
        }
        if conn.deadline.is_some() {
            self.deadlines_changed = true;
        }
        if rst {
            self.queue_rst(key);
        }
        let registered = self.registered[slot].take().is_some();
        self.held_descs -= conn.held.release(&mut self.returned);
        self.graveyard.push(Grave {
            stream: conn.stream,
            registered,
        });
    }

    /// Forgets every connection, telling the guest nothing (a reset or a
    /// transport reset: the driver has forgotten them itself).
    pub(crate) fn kill_all(&mut self) {
        for slot in 0..self.slots.len() {
            self.kill(slot, false);
        }
        self.rsts.clear();
        self.rx_work.clear();
    }

    /// Puts `slot` on the RX work list if it owes the guest a packet.
    fn schedule(&mut self, slot: usize) {
        let Some(c) = self.slots.get_mut(slot).and_then(Option::as_mut) else {
            return;
        };
        mark_dirty(&mut self.dirty, slot);
        let data = c.readable && c.can_read_host();
        let owed = c.owed;
        let any = owed.request
            || owed.response
            || owed.shutdown
            || owed.credit_update
            || owed.credit_request
            || data && (c.peer_free() > 0 || !c.credit_stalled);
        if any && !c.queued {
            c.queued = true;
            self.rx_work.push_back(slot);
        }
    }

    /// Resets the connection if both directions are over.
    fn settle(&mut self, slot: usize) {
        if self.conn(slot).is_some_and(Conn::finished) {
            inc(&self.metrics.conns_closed);
            self.kill(slot, true);
        } else {
            self.schedule(slot);
        }
    }

    // ---- the guest's packets -------------------------------------------

    /// One packet from the guest whose header passed
    /// [`Header::check_from_guest`]; `payload` is its `hdr.len` bytes of
    /// the chain after the header. Returns whether the muxer holds the
    /// chain (it returns it later through [`returned`](Self::returned));
    /// otherwise the caller returns it now.
    pub(crate) fn on_guest_packet(
        &mut self,
        hdr: &Header,
        payload: &[IoSeg],
        chain: TxChain,
    ) -> bool {
        debug_assert_eq!(
            payload.iter().map(|s| s.len()).sum::<usize>(),
            hdr.len as usize
        );
        let key = (hdr.src_port, hdr.dst_port);
        let Some(op) = Op::from_u16(hdr.op) else {
            let n = inc(&self.metrics.unknown_ops);
            warn_rate_limited!(
                count = n,
                "virtio-vsock: unknown op {} answered RST",
                hdr.op
            );
            self.reject(key, hdr.op);
            return false;
        };
        if hdr.kind != TYPE_STREAM {
            let n = inc(&self.metrics.bad_types);
            warn_rate_limited!(
                count = n,
                "virtio-vsock: socket type {} answered RST",
                hdr.kind
            );
            self.reject(key, hdr.op);
            return false;
        }
        let mut found = self.lookup(key);
        if let Some(slot) = found {
            // What the guest sent before this packet reaches the host first
            // (the socket may fail on it and end the connection).
            if op != Op::Rw && self.slots[slot].as_ref().is_some_and(|c| c.deferred) {
                self.flush(slot);
                found = self.lookup(key);
            }
        }
        let Some(slot) = found else {
            match op {
                Op::Rst => {}
                Op::Request => self.guest_connect(hdr),
                _ => self.refuse(key, hdr.op),
            }
            return false;
        };
        match op {
            Op::Rst => {
                inc(&self.metrics.rsts_received);
                self.kill(slot, false);
                false
            }
            Op::Request => {
                // A second REQUEST for a live connection: both ends reset.
                inc(&self.metrics.protocol_errors);
                self.kill(slot, true);
                false
            }
            _ => self.on_conn_packet(slot, op, hdr, payload, chain),
        }
    }

    /// The slot of the connection `key` names, if one is in service.
    #[inline]
    fn lookup(&mut self, key: Key) -> Option<usize> {
        if let Some((k, slot)) = self.last {
            if k == key {
                return Some(slot);
            }
        }
        let slot = *self.map.get(&key)?;
        self.last = Some((key, slot));
        Some(slot)
    }

    /// A packet the muxer cannot read: answered RST, and a connection its
    /// key names is reset with it (the guest forgets the connection on the
    /// RST, so its host socket must not stay open).
    fn reject(&mut self, key: Key, op: u16) {
        match self.lookup(key) {
            Some(slot) => self.kill(slot, op != Op::Rst as u16),
            None => self.refuse(key, op),
        }
    }

    /// An RST for a packet the muxer cannot act on, unless it is one.
    fn refuse(&mut self, key: Key, op: u16) {
        if op != Op::Rst as u16 {
            self.queue_rst(key);
        }
    }

    fn guest_connect(&mut self, hdr: &Header) {
        let key = (hdr.src_port, hdr.dst_port);
        if self.connections() >= self.tun.max_connections {
            inc(&self.metrics.conns_refused);
            let n = inc(&self.metrics.conns_capped);
            warn_rate_limited!(
                count = n,
                "virtio-vsock: {} connections open, a guest connection was refused",
                self.tun.max_connections
            );
            self.queue_rst(key);
            return;
        }
        let mut path = self.uds_path.clone().into_os_string();
        path.push(format!("_{}", hdr.dst_port));
        match self.backend.connect(std::path::Path::new(&path)) {
            Ok(stream) => {
                let mut c = Conn::new(
                    stream,
                    hdr.src_port,
                    hdr.dst_port,
                    State::Established,
                    self.tun.buf_alloc,
                );
                c.peer_credit(hdr.buf_alloc, hdr.fwd_cnt);
                c.owed.response = true;
                let slot = self.alloc_slot(c);
                self.map.insert(key, slot);
                inc(&self.metrics.conns_opened_guest);
                self.schedule(slot);
            }
            Err(e) => {
                let n = inc(&self.metrics.conns_refused);
                log::debug!(
                    "virtio-vsock: guest connection to port {} refused: {e} (occurrence {n})",
                    hdr.dst_port
                );
                self.queue_rst(key);
            }
        }
    }

    fn on_conn_packet(
        &mut self,
        slot: usize,
        op: Op,
        hdr: &Header,
        payload: &[IoSeg],
        chain: TxChain,
    ) -> bool {
        let Some(c) = self.slots[slot].as_mut() else {
            return false;
        };
        let was_stalled = c.credit_stalled && c.peer_free() == 0;
        c.peer_credit(hdr.buf_alloc, hdr.fwd_cnt);
        if was_stalled && c.peer_free() > 0 {
            c.credit_stalled = false;
        }
        match op {
            Op::Response => self.guest_accepted(slot),
            Op::Rw => return self.guest_data(slot, hdr.len as usize, payload, chain),
            Op::Shutdown => self.guest_shutdown(slot, hdr.flags),
            Op::CreditRequest => {
                c.owed.credit_update = true;
                self.schedule(slot);
            }
            Op::CreditUpdate => self.schedule(slot),
            Op::Request | Op::Rst => {}
        }
        false
    }

    fn protocol_error(&mut self, slot: usize) {
        let n = inc(&self.metrics.protocol_errors);
        warn_rate_limited!(
            count = n,
            "virtio-vsock: packet out of protocol, connection reset"
        );
        self.kill(slot, true);
    }

    fn guest_accepted(&mut self, slot: usize) {
        let Some(c) = self.slots[slot].as_mut() else {
            return;
        };
        if c.state != State::LocalInit {
            self.protocol_error(slot);
            return;
        }
        c.state = State::Established;
        c.deadline = None;
        self.deadlines_changed = true;
        let ok = format!("OK {}\n", c.host_port);
        c.pending_ctl = ok.len();
        c.pending.extend(ok.bytes());
        inc(&self.metrics.conns_opened_host);
        self.flush(slot);
    }

    fn guest_data(&mut self, slot: usize, len: usize, payload: &[IoSeg], chain: TxChain) -> bool {
        let Some(c) = self.slots[slot].as_mut() else {
            return false;
        };
        if c.state != State::Established || c.guest_shut_send {
            self.protocol_error(slot);
            return false;
        }
        if len > c.guest_credit() as usize {
            let n = inc(&self.metrics.credit_exceeded);
            warn_rate_limited!(count = n, "virtio-vsock: guest sent past its credit, reset");
            self.kill(slot, true);
            return false;
        }
        // len <= buf_alloc, a u32.
        c.rx_cnt = c.rx_cnt.wrapping_add(len as u32);
        self.tx_bytes += len as u64;
        if c.guest_credit() == 0 {
            inc(&self.metrics.tx_credit_stalls);
        }
        if len > 0 && self.defer(slot, payload, chain) {
            return true;
        }
        let Some(c) = self.slots[slot].as_mut() else {
            return false;
        };
        if c.deferred {
            // No room to defer it: what was deferred goes first.
            self.flush(slot);
        }
        let Some(c) = self.slots[slot].as_mut() else {
            return false;
        };
        let mut sent = 0;
        if !c.owes_host() && len > 0 {
            match self.backend.send(&mut c.stream, IoVecs::guest(payload)) {
                Ok(n) => sent = n.min(len),
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                Err(e) => {
                    self.host_failed(slot, &e);
                    return false;
                }
            }
        }
        c.fwd_cnt = c.fwd_cnt.wrapping_add(sent as u32);
        let held = sent < len && self.keep_rest(slot, payload, sent, len, chain);
        let c = self.slots[slot].as_mut().expect("slot checked above");
        if c.wants_credit_update() {
            c.owed.credit_update = true;
        }
        self.schedule(slot);
        held
    }

    /// Holds a packet's chain unwritten, to go to the host socket with the
    /// connection's next packets in one `writev` at the end of the TX pass
    /// ([`flush_deferred`](Self::flush_deferred)): when the connection owes
    /// the host nothing but chains deferred so (bytes the socket refused
    /// wait for it to poll writable instead) and the bounds on held chains
    /// allow. Returns whether it did.
    fn defer(&mut self, slot: usize, payload: &[IoSeg], chain: TxChain) -> bool {
        let Some(c) = self.slots[slot].as_mut() else {
            return false;
        };
        if c.owes_host() && !c.deferred {
            return false;
        }
        let room = self
            .hold
            .allow(c.held.descs(), self.held_descs, chain.descs);
        if !room {
            return false;
        }
        c.held.push(chain.head, chain.descs, payload);
        self.held_descs += chain.descs;
        if !c.deferred {
            c.deferred = true;
            self.deferred.push(slot);
        }
        true
    }

    /// The guest data bytes accepted since the last call, for the TX
    /// pass's `tx_bytes`.
    pub(crate) fn take_tx_bytes(&mut self) -> u64 {
        std::mem::take(&mut self.tx_bytes)
    }

    /// Writes what the TX pass deferred, a `writev` per connection for
    /// up to `HELD_IOVS` packets ([`flush`](Self::flush)).
    pub(crate) fn flush_deferred(&mut self) {
        let mut slots = std::mem::take(&mut self.deferred);
        // In the order the connections' first packets came.
        for &slot in &slots {
            if self.conn(slot).is_some_and(|c| c.deferred) {
                self.flush(slot);
            }
        }
        slots.clear();
        self.deferred = slots;
    }

    /// What the host socket of `slot` refused of a packet (bytes `sent..len`
    /// of `payload`) waits for EPOLLOUT: in its chain, held, if the bounds
    /// allow and no copied data waits before it (returns true), else copied
    /// into `pending` (bounded by the credit the packet was checked
    /// against).
    fn keep_rest(
        &mut self,
        slot: usize,
        payload: &[IoSeg],
        sent: usize,
        len: usize,
        chain: TxChain,
    ) -> bool {
        let Some(c) = self.slots[slot].as_mut() else {
            return false;
        };
        inc(&self.metrics.tx_short_writes);
        let rest = len - sent;
        take_range(payload, sent, rest, &mut self.rest);
        let room = self
            .hold
            .allow(c.held.descs(), self.held_descs, chain.descs);
        if room && !c.pending_data() {
            c.held.push(chain.head, chain.descs, &self.rest);
            self.held_descs += chain.descs;
            inc(&self.metrics.tx_chains_held);
            return true;
        }
        copy_from_segs(&self.rest, &mut self.copy);
        c.pending.extend(self.copy.iter());
        add(&self.metrics.tx_bytes_copied, rest as u64);
        false
    }

    fn guest_shutdown(&mut self, slot: usize, flags: u32) {
        let timeout = self.tun.shutdown_timeout;
        let Some(c) = self.slots[slot].as_mut() else {
            return;
        };
        if c.state != State::Established {
            self.protocol_error(slot);
            return;
        }
        c.guest_shut_rcv |= flags & SHUTDOWN_RCV != 0;
        c.guest_shut_send |= flags & SHUTDOWN_SEND != 0;
        if c.guest_shut_send && c.deadline.is_none() && c.owes_host() {
            c.deadline = Some(Instant::now() + timeout);
            self.deadlines_changed = true;
        }
        self.shut_host_write(slot);
        self.settle(slot);
    }

    /// After the guest's SHUTDOWN SEND and once `pending` is drained, tells
    /// the host process no more data comes.
    fn shut_host_write(&mut self, slot: usize) {
        let Some(c) = self.slots[slot].as_mut() else {
            return;
        };
        if c.guest_shut_send && !c.owes_host() && !c.host_write_shut {
            c.host_write_shut = true;
            if let Err(e) = self.backend.shutdown_write(&mut c.stream) {
                log::debug!("virtio-vsock: shutdown of a host socket: {e}");
            }
        }
    }

    /// The host socket failed: the connection is reset.
    fn host_failed(&mut self, slot: usize, e: &std::io::Error) {
        let n = inc(&self.metrics.host_socket_errors);
        log::debug!("virtio-vsock: host socket error, connection reset: {e} (occurrence {n})");
        self.kill(slot, true);
    }

    // ---- the host side -------------------------------------------------

    /// Accepts host connections waiting on the listener (at most
    /// [`ACCEPTS_PER_EVENT`]); at the cap each is accepted and closed.
    pub(crate) fn accept_host(&mut self) {
        for _ in 0..ACCEPTS_PER_EVENT {
            let stream = match self.backend.accept(&self.listener) {
                Ok(s) => s,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return,
                Err(e) => {
                    // ECONNABORTED, EMFILE: this one is lost, the next may do.
                    let n = inc(&self.metrics.host_socket_errors);
                    warn_rate_limited!(count = n, "virtio-vsock: accept failed: {e}");
                    return;
                }
            };
            if self.connections() >= self.tun.max_connections {
                inc(&self.metrics.conns_refused);
                inc(&self.metrics.conns_capped);
                self.graveyard.push(Grave {
                    stream,
                    registered: false,
                });
                continue;
            }
            let mut c = Conn::new(
                stream,
                0,
                0,
                State::AwaitLine(Vec::new()),
                self.tun.buf_alloc,
            );
            c.deadline = Some(Instant::now() + self.tun.connect_timeout);
            self.deadlines_changed = true;
            self.alloc_slot(c);
        }
    }

    /// The host socket of `slot` polled readable, writable or hung up.
    pub(crate) fn on_socket_event(
        &mut self,
        slot: usize,
        readable: bool,
        writable: bool,
        active: bool,
    ) {
        let Some(c) = self.slots.get_mut(slot).and_then(Option::as_mut) else {
            return;
        };
        if matches!(c.state, State::AwaitLine(_)) {
            self.read_line(slot, active);
            return;
        }
        if writable {
            self.flush(slot);
        }
        let Some(c) = self.slots.get_mut(slot).and_then(Option::as_mut) else {
            return;
        };
        if readable && c.can_read_host() {
            c.readable = true;
        }
        self.schedule(slot);
    }

    /// Reads the `CONNECT <port>\n` line of a host connection, a byte at a
    /// time, as far as the socket has it.
    fn read_line(&mut self, slot: usize, active: bool) {
        let Some(c) = self.slots[slot].as_mut() else {
            return;
        };
        let State::AwaitLine(line) = &mut c.state else {
            return;
        };
        loop {
            let mut b = [0u8; 1];
            match self.backend.read_bytes(&mut c.stream, &mut b) {
                Ok(1) => line.push(b[0]),
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return,
                // EOF or an error before the line ended.
                _ => return self.kill(slot, false),
            }
            if b[0] == b'\n' {
                break;
            }
            if line.len() >= MAX_CONNECT_LINE {
                inc(&self.metrics.bad_connect_lines);
                return self.kill(slot, false);
            }
        }
        let port = parse_connect(line);
        let Some(port) = port else {
            inc(&self.metrics.bad_connect_lines);
            return self.kill(slot, false);
        };
        if !active {
            // No driver to ask: refused as a guest that listens on nothing.
            inc(&self.metrics.conns_refused);
            return self.kill(slot, false);
        }
        let host_port = self.assign_host_port(port);
        let c = self.slots[slot].as_mut().expect("slot checked above");
        c.guest_port = port;
        c.host_port = host_port;
        c.state = State::LocalInit;
        c.owed.request = true;
        c.deadline = Some(Instant::now() + self.tun.connect_timeout);
        self.deadlines_changed = true;
        self.map.insert((port, host_port), slot);
        self.schedule(slot);
    }

    /// The next host port no connection to guest port `port` uses.
    fn assign_host_port(&mut self, port: u32) -> u32 {
        loop {
            let p = self.next_host_port;
            self.next_host_port = if p >= u32::MAX >> 1 {
                FIRST_HOST_PORT
            } else {
                p + 1
            };
            // At most max_connections ports are taken: this ends.
            if !self.map.contains_key(&(port, p)) {
                return p;
            }
        }
    }

    /// Writes what waits for the host socket of `slot`, in order: the `OK`
    /// line, the held chains (from guest memory), the copied data; until the
    /// socket takes less than it was offered (its buffer is full: the rest
    /// waits for it to poll writable).
    pub(crate) fn flush(&mut self, slot: usize) {
        let Some(c) = self.slots[slot].as_mut() else {
            return;
        };
        let deferred = std::mem::take(&mut c.deferred);
        let mut short = false;
        while c.owes_host() && !short {
            let ctl = c.pending_ctl > 0 || c.held.is_empty();
            let (res, offered) = if ctl {
                let (front, _) = c.pending.as_slices();
                let n = if c.pending_ctl > 0 {
                    c.pending_ctl.min(front.len())
                } else {
                    front.len()
                };
                (self.backend.write_bytes(&mut c.stream, &front[..n]), n)
            } else {
                let front = c.held.segs();
                let segs = &front[..front.len().min(HELD_IOVS)];
                let offered = segs.iter().map(|s| s.len()).sum();
                (
                    self.backend.send(&mut c.stream, IoVecs::guest(segs)),
                    offered,
                )
            };
            short = res.as_ref().is_ok_and(|&n| n < offered);
            match res {
                Ok(0) => break,
                Ok(n) if ctl => {
                    let n = n.min(c.pending.len());
                    c.pending.drain(..n);
                    // `OK <port>\n` is no guest data: it frees no credit.
                    let ctl = n.min(c.pending_ctl);
                    c.pending_ctl -= ctl;
                    c.fwd_cnt = c.fwd_cnt.wrapping_add((n - ctl) as u32);
                }
                Ok(n) => {
                    let n = n.min(c.held.bytes());
                    self.held_descs -= c.held.advance(n, &mut self.returned);
                    c.fwd_cnt = c.fwd_cnt.wrapping_add(n as u32);
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                Err(e) => return self.host_failed(slot, &e),
            }
        }
        if deferred && !c.held.is_empty() {
            // Deferred chains the socket did not take wait for it as
            // refused ones do, counted as they are.
            inc(&self.metrics.tx_short_writes);
            add(&self.metrics.tx_chains_held, c.held.len() as u64);
        }
        if !c.owes_host() && c.guest_shut_send && c.deadline.is_some() {
            c.deadline = None;
            self.deadlines_changed = true;
        }
        if c.wants_credit_update() {
            c.owed.credit_update = true;
        }
        self.shut_host_write(slot);
        self.settle(slot);
    }

    /// Resets every connection whose deadline passed by `now`.
    pub(crate) fn expire(&mut self, now: Instant) {
        for slot in 0..self.slots.len() {
            let Some(c) = self.slots[slot].as_ref() else {
                continue;
            };
            if c.deadline.is_some_and(|d| d <= now) {
                inc(&self.metrics.conns_timed_out);
                // A host socket still waiting for its line is no
                // connection the guest knows of.
                let known = !matches!(c.state, State::AwaitLine(_));
                if c.state == State::LocalInit {
                    inc(&self.metrics.conns_refused);
                }
                self.kill(slot, known);
            }
        }
        self.deadlines_changed = true;
    }

    // ---- packets for the guest -----------------------------------------

    /// The next packet owed to the guest: its header, and for data how many
    /// bytes (at most `room`) were read from the host socket straight into
    /// `payload`, the payload room of the RX buffers ready, in order (the
    /// caller cuts them into a packet a buffer). `None` when nothing is
    /// owed.
    pub(crate) fn next_rx(&mut self, payload: &[IoSeg], room: usize) -> Option<(Header, usize)> {
        if let Some((guest_port, host_port)) = self.rsts.pop_front() {
            inc(&self.metrics.rsts_sent);
            let hdr = Header::to_guest(self.guest_cid, host_port, guest_port, Op::Rst);
            return Some((hdr, 0));
        }
        // Each connection waiting at the start is asked once: one that owes
        // nothing this chain can carry goes back to the end of the list
        // (`settle`), and is not asked again in this call.
        for _ in 0..self.rx_work.len() {
            let Some(slot) = self.rx_work.pop_front() else {
                break;
            };
            let Some(c) = self.slots.get_mut(slot).and_then(Option::as_mut) else {
                continue;
            };
            c.queued = false;
            if let Some(out) = self.conn_rx(slot, payload, room) {
                self.settle(slot);
                return Some(out);
            }
            self.settle(slot);
        }
        None
    }

    /// The packet connection `slot` owes the guest, if any.
    fn conn_rx(&mut self, slot: usize, payload: &[IoSeg], room: usize) -> Option<(Header, usize)> {
        let cid = self.guest_cid;
        let c = self.slots[slot].as_mut()?;
        let op = if std::mem::take(&mut c.owed.request) {
            Op::Request
        } else if std::mem::take(&mut c.owed.response) {
            Op::Response
        } else if c.readable && c.can_read_host() && c.peer_free() > 0 && room > 0 {
            return self.read_host(slot, payload, room);
        } else if std::mem::take(&mut c.owed.shutdown) {
            Op::Shutdown
        } else if std::mem::take(&mut c.owed.credit_update) {
            Op::CreditUpdate
        } else if std::mem::take(&mut c.owed.credit_request) {
            Op::CreditRequest
        } else if c.readable && c.can_read_host() && c.peer_free() == 0 && !c.credit_stalled {
            // Data waits for a guest without room: asked once per stall.
            c.credit_stalled = true;
            inc(&self.metrics.rx_credit_stalls);
            Op::CreditRequest
        } else {
            return None;
        };
        let mut hdr = Header::to_guest(cid, c.host_port, c.guest_port, op);
        if op == Op::Shutdown {
            hdr.flags = SHUTDOWN_SEND;
        }
        Some((Self::credit(c, hdr), 0))
    }

    /// Stamps the device's credit on a header for the guest.
    fn credit(c: &mut Conn<B::Stream>, mut hdr: Header) -> Header {
        hdr.buf_alloc = c.buf_alloc;
        hdr.fwd_cnt = c.fwd_cnt;
        c.adv_fwd_cnt = c.fwd_cnt;
        c.owed.credit_update = false;
        hdr
    }

    /// One `readv` from the host socket of `slot` into `payload`.
    fn read_host(
        &mut self,
        slot: usize,
        payload: &[IoSeg],
        room: usize,
    ) -> Option<(Header, usize)> {
        let cid = self.guest_cid;
        let c = self.slots[slot].as_mut()?;
        let want = room.min(c.peer_free() as usize);
        take_range(payload, 0, want, &mut self.scratch);
        match self
            .backend
            .recv(&mut c.stream, IoVecs::guest(&self.scratch))
        {
            Ok(0) => {
                c.host_eof = true;
                c.readable = false;
                let hdr = Header {
                    flags: SHUTDOWN_SEND,
                    ..Header::to_guest(cid, c.host_port, c.guest_port, Op::Shutdown)
                };
                Some((Self::credit(c, hdr), 0))
            }
            Ok(n) => {
                let n = n.min(want);
                if n < want {
                    // The socket is drained: poll it again.
                    c.readable = false;
                }
                c.tx_cnt = c.tx_cnt.wrapping_add(n as u32);
                add(&self.metrics.rx_bytes, n as u64);
                let hdr = Header {
                    len: n as u32,
                    ..Header::to_guest(cid, c.host_port, c.guest_port, Op::Rw)
                };
                Some((Self::credit(c, hdr), n))
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                c.readable = false;
                // Another packet it owes, if any.
                self.conn_rx(slot, payload, 0)
            }
            Err(e) => {
                self.host_failed(slot, &e);
                // The RST just queued goes out in this chain.
                self.next_rx_rst()
            }
        }
    }

    fn next_rx_rst(&mut self) -> Option<(Header, usize)> {
        let (guest_port, host_port) = self.rsts.pop_front()?;
        inc(&self.metrics.rsts_sent);
        let hdr = Header::to_guest(self.guest_cid, host_port, guest_port, Op::Rst);
        Some((hdr, 0))
    }
}

/// The port of a `CONNECT <port>\n` line (Firecracker's host protocol).
pub(crate) fn parse_connect(line: &[u8]) -> Option<u32> {
    let line = std::str::from_utf8(line).ok()?;
    let rest = line.strip_suffix('\n')?.strip_prefix("CONNECT ")?;
    if rest.is_empty() || !rest.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    rest.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The layouts Linux posts are read without copying the segment list:
    /// after a header in a segment of its own and exactly the payload, the
    /// chain's own segments; any other layout, the same bytes cut into
    /// `out`.
    #[test]
    #[allow(unsafe_code)]
    fn payload_segs_take_linux_layouts_as_they_are() {
        let buf = vec![0u8; 4096];
        let b = buf.as_ptr() as usize;
        // SAFETY: every segment lies inside `buf`, which outlives them;
        // nothing is read or written through them.
        let seg = |off: usize, len: usize| unsafe { IoSeg::new(b + off, len) };
        let mut out = Vec::new();
        let segs = [seg(0, HDR_LEN), seg(100, 300), seg(500, 200)];
        let got = payload_segs(&segs, HDR_LEN + 500, 500, &mut out);
        assert!(std::ptr::eq(got, &segs[1..]), "the chain's own segments");
        // More room after the header than the payload: cut.
        let got = payload_segs(&segs, HDR_LEN + 500, 350, &mut out);
        assert_eq!(got, [seg(100, 300), seg(500, 50)]);
        // Header and payload in one buffer.
        let one = [seg(0, HDR_LEN + 1000)];
        let got = payload_segs(&one, HDR_LEN + 1000, 600, &mut out);
        assert_eq!(got, [seg(HDR_LEN, 600)]);
        // A header split over two segments.
        let split = [seg(0, 20), seg(40, 24 + 100)];
        let got = payload_segs(&split, HDR_LEN + 100, 100, &mut out);
        assert_eq!(got, [seg(64, 100)]);
    }

    #[test]
    fn connect_lines() {
        assert_eq!(parse_connect(b"CONNECT 52\n"), Some(52));
        assert_eq!(parse_connect(b"CONNECT 4294967295\n"), Some(u32::MAX));
        assert_eq!(parse_connect(b"CONNECT 0052\n"), Some(52));
        for bad in [
            &b"CONNECT 52"[..],
            b"CONNECT 4294967296\n",
            b"CONNECT \n",
            b"CONNECT -1\n",
            b"CONNECT +5\n",
            b"connect 52\n",
            b"CONNECT  52\n",
            b"CONNECT 52 \n",
            b"CONNECT 5a\n",
            b"OK 52\n",
            b"\xffCONNECT 52\n",
        ] {
            assert_eq!(parse_connect(bad), None, "{bad:?}");
        }
    }

    #[test]
    #[allow(unsafe_code)]
    fn ranges_of_segments() {
        let mut buf = [0u8; 64];
        let base = buf.as_mut_ptr() as usize;
        // SAFETY: both segments lie inside `buf`, alive for the test.
        let segs = unsafe { [IoSeg::new(base, 10), IoSeg::new(base + 10, 30)] };
        let mut out = Vec::new();
        take_range(&segs, 5, 10, &mut out);
        // SAFETY: as above.
        let want = unsafe { [IoSeg::new(base + 5, 5), IoSeg::new(base + 10, 5)] };
        assert_eq!(out, want);
        take_range(&segs, 10, 100, &mut out);
        assert_eq!(out, [segs[1]]);
        take_range(&segs, 40, 1, &mut out);
        assert!(out.is_empty());
        take_range(&segs, 0, 0, &mut out);
        assert!(out.is_empty());
    }
}
