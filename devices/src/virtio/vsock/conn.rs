// SPDX-License-Identifier: Apache-2.0
//! One vsock connection: its state, the credit both ways (virtio 1.2
//! §5.10.6.3), and the bytes the host socket has not taken yet.
//!
//! **States.** A host-initiated connection reads its `CONNECT <port>\n`
//! line ([`State::AwaitLine`]), then waits for the guest's RESPONSE to the
//! REQUEST the device sent ([`State::LocalInit`]); a guest-initiated one is
//! [`State::Established`] as soon as the host listener accepted it (its
//! RESPONSE goes out before any data). Half-closes are flags beside the
//! state: the guest's SHUTDOWN bits and the host's EOF.
//!
//! **Credit.** The guest may have at most `buf_alloc` bytes in the
//! device's hands that the host socket has not taken (`rx_cnt - fwd_cnt`);
//! the guest learns `fwd_cnt` from every header the device sends, and a
//! CREDIT_UPDATE goes out unasked once half the credit the guest can use
//! (the smaller of the device's buffer and the guest's own) has been freed
//! since the last one it saw ([`Conn::wants_credit_update`]), so a guest
//! that streams never stops for want of credit while the host keeps up.
//! The other way, the device reads from the host socket no more than the
//! guest's `buf_alloc - (tx_cnt - peer_fwd_cnt)` ([`Conn::peer_free`]).
//!
//! **Memory.** Guest data goes from guest memory to the socket with one
//! `writev`. What the socket refused stays in guest memory: the TX chain
//! that carries it is held un-returned ([`Held`], its bytes in
//! `held_segs`) and written from there when the socket takes more, up to
//! the muxer's bounds on held chains; past them the rest is copied into
//! `pending`. Credit bounds both by `buf_alloc` (a guest that sends past
//! its credit is reset). Host data goes from the socket into guest buffers
//! with one `readv` and is never held here.
//!
//! **Order.** The host gets a connection's bytes as the guest sent them:
//! first the `OK` line (`pending_ctl` bytes at the front of `pending`),
//! then the held chains, then the guest data in `pending`. So a chain is
//! held only while `pending` holds no guest data.

use std::collections::VecDeque;
use std::time::Instant;

use crate::virtio::queue::IoSeg;

/// Longest `CONNECT <port>\n` line accepted (`CONNECT 4294967295\n` is 19
/// bytes; a little slack for leading zeros).
pub const MAX_CONNECT_LINE: usize = 32;

/// Where a connection stands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum State {
    /// A host process connected to `uds_path`; its `CONNECT` line so far.
    AwaitLine(Vec<u8>),
    /// The device asked the guest (REQUEST) and waits for its RESPONSE.
    LocalInit,
    /// Data may flow.
    Established,
}

/// Control packets a connection owes the guest, sent before its data.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Owed {
    /// REQUEST (a host-initiated connection).
    pub request: bool,
    /// RESPONSE (the host accepted a guest's REQUEST).
    pub response: bool,
    /// SHUTDOWN with SEND: the host sent EOF.
    pub shutdown: bool,
    /// CREDIT_UPDATE.
    pub credit_update: bool,
    /// CREDIT_REQUEST: the device has data for a guest without credit.
    pub credit_request: bool,
}

/// A TX chain kept un-returned while the host socket has not taken all
/// of its payload.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Held {
    /// Its head: what the used entry returns.
    pub head: u16,
    /// Descriptors of the ring it holds (what the bounds count).
    pub descs: usize,
    /// Payload bytes the socket has not taken yet (at least 1).
    pub left: usize,
}

/// A connection's held TX chains, oldest first, and the payload they still
/// owe the host socket as segments of guest memory, in order; with their
/// descriptors and bytes summed as they come and go, as the TX path asks
/// for both on every packet.
///
/// Both lists are vectors read from a start index: a push is a vector's
/// push, the segments are one slice for `writev` however many came and
/// went, and what was written is dropped by moving the index (the space
/// is reclaimed once the front is more than half of a list, or when it
/// empties), where a ring buffer pays for its wrap on every push and
/// needs a copy to offer one slice.
#[derive(Debug, Default)]
pub struct HeldChains {
    chains: Vec<Held>,
    /// The first live entry of `chains`.
    chains_at: usize,
    segs: Vec<IoSeg>,
    /// The first live entry of `segs`.
    segs_at: usize,
    descs: usize,
    bytes: usize,
}

/// Drops the `at` entries written from the front of `v` once they are
/// more than half of it: the live entries it then moves are fewer than the
/// written ones it drops, so the cost is amortised over the writes.
fn reclaim<T>(v: &mut Vec<T>, at: &mut usize) {
    if *at == v.len() {
        v.clear();
        *at = 0;
    } else if *at > v.len() / 2 {
        v.drain(..*at);
        *at = 0;
    }
}

impl HeldChains {
    /// Holds the chain `head` of `descs` descriptors, which still owes
    /// the host `segs` (at least one byte).
    #[inline]
    pub fn push(&mut self, head: u16, descs: usize, segs: &[IoSeg]) {
        let mut left = 0;
        for &seg in segs {
            left += seg.len();
            self.segs.push(seg);
        }
        debug_assert!(left > 0, "a held chain owes the host something");
        self.chains.push(Held { head, descs, left });
        self.descs += descs;
        self.bytes += left;
    }

    /// Whether no chain is held.
    pub fn is_empty(&self) -> bool {
        self.chains_at == self.chains.len()
    }

    /// Chains held.
    pub fn len(&self) -> usize {
        self.chains.len() - self.chains_at
    }

    /// Ring descriptors the held chains keep.
    pub fn descs(&self) -> usize {
        self.descs
    }

    /// Guest bytes the held chains still owe the host socket.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// The held chains, oldest first.
    #[cfg(test)]
    pub fn chains(&self) -> impl Iterator<Item = &Held> {
        self.chains[self.chains_at..].iter()
    }

    /// Entries stored in the two lists, written ones not reclaimed yet
    /// included.
    #[cfg(test)]
    pub fn stored(&self) -> (usize, usize) {
        (self.chains.len(), self.segs.len())
    }

    /// The payload still owed, in order, as one slice: what one `writev`
    /// offers.
    pub fn segs(&self) -> &[IoSeg] {
        &self.segs[self.segs_at..]
    }

    /// The host socket took `n` more bytes (at most [`bytes`](Self::bytes)):
    /// drops them from the segments, and pushes the heads of the chains now
    /// written whole onto `done`; returns the ring descriptors those chains
    /// held.
    pub fn advance(&mut self, n: usize, done: &mut Vec<u16>) -> usize {
        if n >= self.bytes {
            // All of it, as a socket that keeps up takes it: no segment
            // to cut.
            return self.release(done);
        }
        self.bytes -= n;
        let mut k = n;
        while k > 0 {
            let Some(seg) = self.segs.get_mut(self.segs_at) else {
                break;
            };
            if seg.len() <= k {
                k -= seg.len();
                self.segs_at += 1;
            } else {
                *seg = crate::virtio::queue::split_seg(*seg, k).1;
                k = 0;
            }
        }
        let mut k = n;
        let mut freed = 0;
        while let Some(h) = self.chains.get_mut(self.chains_at) {
            if h.left > k {
                h.left -= k;
                break;
            }
            k -= h.left;
            freed += h.descs;
            done.push(h.head);
            self.chains_at += 1;
        }
        reclaim(&mut self.segs, &mut self.segs_at);
        reclaim(&mut self.chains, &mut self.chains_at);
        self.descs -= freed;
        freed
    }

    /// Gives up every held chain: their heads onto `done`; returns the ring
    /// descriptors they held. What they still owed the host is dropped
    /// unless the caller copied it first.
    #[inline]
    pub fn release(&mut self, done: &mut Vec<u16>) -> usize {
        self.segs.clear();
        self.segs_at = 0;
        // An iterator of known length: one capacity check, not one a head.
        done.extend(self.chains[self.chains_at..].iter().map(|h| h.head));
        self.chains.clear();
        self.chains_at = 0;
        self.bytes = 0;
        std::mem::take(&mut self.descs)
    }
}

/// One connection.
#[derive(Debug)]
pub struct Conn<S> {
    /// The host socket.
    pub stream: S,
    /// The guest's port.
    pub guest_port: u32,
    /// The host's port (a host-initiated connection's is assigned).
    pub host_port: u32,
    /// Where it stands.
    pub state: State,
    /// Control packets it owes the guest.
    pub owed: Owed,
    /// The guest said it sends no more (SHUTDOWN SEND).
    pub guest_shut_send: bool,
    /// The guest said it receives no more (SHUTDOWN RCV).
    pub guest_shut_rcv: bool,
    /// The host socket returned EOF.
    pub host_eof: bool,
    /// `shutdown(SHUT_WR)` was called on the host socket.
    pub host_write_shut: bool,
    /// Epoll said the host socket is readable and no read has drained it.
    pub readable: bool,
    /// The connection is in the muxer's list of RX work.
    pub queued: bool,
    /// The device waits on credit to read for the guest (a stall counted).
    pub credit_stalled: bool,
    /// Its held chains were not offered to the host socket yet: they are
    /// written together at the end of the TX pass.
    pub deferred: bool,
    /// When it is reset if it has not moved on (the `CONNECT` line, the
    /// guest's RESPONSE, draining after a SHUTDOWN).
    pub deadline: Option<Instant>,
    /// Guest bytes the host socket has not taken yet, after `OK <port>\n`.
    pub pending: VecDeque<u8>,
    /// Bytes at the front of `pending` that are not guest data (the `OK`
    /// line), which free no credit when written.
    pub pending_ctl: usize,
    /// TX chains held for the host socket.
    pub held: HeldChains,
    /// The device's receive buffer, advertised in every header.
    pub buf_alloc: u32,
    /// Payload bytes received from the guest (wrapping).
    pub rx_cnt: u32,
    /// Payload bytes handed to the host socket (wrapping).
    pub fwd_cnt: u32,
    /// `fwd_cnt` as the guest last saw it.
    pub adv_fwd_cnt: u32,
    /// The guest's receive buffer.
    pub peer_buf_alloc: u32,
    /// Bytes the guest has taken from its buffer.
    pub peer_fwd_cnt: u32,
    /// Payload bytes sent to the guest (wrapping).
    pub tx_cnt: u32,
}

impl<S> Conn<S> {
    /// A connection in `state` over `stream`.
    pub fn new(stream: S, guest_port: u32, host_port: u32, state: State, buf_alloc: u32) -> Self {
        Conn {
            stream,
            guest_port,
            host_port,
            state,
            owed: Owed::default(),
            guest_shut_send: false,
            guest_shut_rcv: false,
            host_eof: false,
            host_write_shut: false,
            readable: false,
            queued: false,
            credit_stalled: false,
            deferred: false,
            deadline: None,
            pending: VecDeque::new(),
            pending_ctl: 0,
            held: HeldChains::default(),
            buf_alloc,
            rx_cnt: 0,
            fwd_cnt: 0,
            adv_fwd_cnt: 0,
            peer_buf_alloc: 0,
            peer_fwd_cnt: 0,
            tx_cnt: 0,
        }
    }

    /// Takes the guest's credit from one of its headers.
    pub fn peer_credit(&mut self, buf_alloc: u32, fwd_cnt: u32) {
        self.peer_buf_alloc = buf_alloc;
        self.peer_fwd_cnt = fwd_cnt;
    }

    /// Bytes the guest has room for: its buffer less what it has not taken.
    /// A guest whose `fwd_cnt` runs ahead of what it was sent has none.
    pub fn peer_free(&self) -> u32 {
        let in_flight = self.tx_cnt.wrapping_sub(self.peer_fwd_cnt);
        self.peer_buf_alloc.saturating_sub(in_flight)
    }

    /// Bytes of the device's buffer the guest may still fill, as the guest
    /// was told (what it may send without breaking the protocol).
    pub fn guest_credit(&self) -> u32 {
        let in_flight = self.rx_cnt.wrapping_sub(self.adv_fwd_cnt);
        self.buf_alloc.saturating_sub(in_flight)
    }

    /// Whether the device should tell the guest its `fwd_cnt` unasked: half
    /// the credit the guest can use freed since it last heard. That is the
    /// device's buffer, or the guest's own if it is smaller: Linux (6.1.172,
    /// `virtio_transport_tx_buf_size`) sends no more than its own
    /// `buf_alloc` ahead, so a guest with a smaller buffer would otherwise
    /// wait, all it may send in flight, for an update that needs more freed
    /// than that.
    pub fn wants_credit_update(&self) -> bool {
        let usable = self.buf_alloc.min(self.peer_buf_alloc);
        let freed = self.fwd_cnt.wrapping_sub(self.adv_fwd_cnt);
        freed > 0 && freed >= usable / 2
    }

    /// Whether the connection may read from the host socket for the guest.
    pub fn can_read_host(&self) -> bool {
        self.state == State::Established && !self.host_eof && !self.guest_shut_rcv
    }

    /// Whether both directions are over and nothing waits for the host:
    /// the device resets the connection (the clean end of the spec's
    /// SHUTDOWN then RST).
    pub fn finished(&self) -> bool {
        let host_done = self.host_eof || self.guest_shut_rcv;
        self.state == State::Established
            && !self.owes_host()
            && self.guest_shut_send
            && host_done
            && !self.owed.response
            && !self.owed.shutdown
    }

    /// What the host socket is polled for: reading while the device wants
    /// to read and has not been told it can, writing while bytes wait.
    pub fn interest(&self) -> (bool, bool) {
        let read = match self.state {
            State::AwaitLine(_) => true,
            State::LocalInit => false,
            State::Established => self.can_read_host() && !self.readable,
        };
        (read, self.owes_host())
    }

    /// Whether guest bytes (or the `OK` line) wait for the host socket.
    pub fn owes_host(&self) -> bool {
        !self.pending.is_empty() || !self.held.is_empty()
    }

    /// Whether `pending` holds guest data (beyond the `OK` line): a new
    /// chain is then not held, as its bytes go after that data.
    pub fn pending_data(&self) -> bool {
        self.pending.len() > self.pending_ctl
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn conn() -> Conn<()> {
        Conn::new((), 1000, 52, State::Established, 4096)
    }

    #[test]
    fn the_guest_never_gets_more_than_it_has_room_for() {
        let mut c = conn();
        assert_eq!(c.peer_free(), 0, "nothing before the guest says");
        c.peer_credit(1000, 0);
        assert_eq!(c.peer_free(), 1000);
        c.tx_cnt = 600;
        assert_eq!(c.peer_free(), 400);
        c.peer_credit(1000, 600);
        assert_eq!(c.peer_free(), 1000);
        // Wrapping counters.
        c.tx_cnt = 10;
        c.peer_credit(1000, u32::MAX - 9);
        assert_eq!(c.peer_free(), 980);
        // A guest that shrinks its buffer below what is in flight.
        c.peer_credit(5, u32::MAX - 9);
        assert_eq!(c.peer_free(), 0);
    }

    #[test]
    fn an_update_is_due_at_half_the_credit_the_guest_can_use() {
        let mut c = conn();
        // A guest with a larger buffer than the device's: half the device's.
        c.peer_credit(1 << 20, 0);
        c.fwd_cnt = 2047;
        assert!(!c.wants_credit_update());
        c.fwd_cnt = 2048;
        assert!(c.wants_credit_update());
        // A guest whose own buffer is smaller sends no more than it ahead:
        // half of it.
        c.peer_credit(1000, 0);
        c.fwd_cnt = 499;
        assert!(!c.wants_credit_update());
        c.fwd_cnt = 500;
        assert!(c.wants_credit_update());
        // A guest with no buffer: as soon as anything was freed, never for
        // nothing.
        c.peer_credit(0, 0);
        c.adv_fwd_cnt = 500;
        assert!(!c.wants_credit_update());
        c.fwd_cnt = 501;
        assert!(c.wants_credit_update());
    }

    #[test]
    fn the_device_s_credit_and_its_updates() {
        let mut c = conn();
        c.peer_credit(1 << 20, 0);
        assert_eq!(c.guest_credit(), 4096);
        c.rx_cnt = 3000;
        assert_eq!(c.guest_credit(), 1096);
        c.fwd_cnt = 2047;
        assert!(!c.wants_credit_update());
        c.fwd_cnt = 2048;
        assert!(c.wants_credit_update());
        c.adv_fwd_cnt = 2048;
        assert!(!c.wants_credit_update());
        assert_eq!(c.guest_credit(), 4096 - 952);
        c.rx_cnt = 9000;
        assert_eq!(c.guest_credit(), 0, "past its credit");
    }

    #[test]
    fn interest_follows_the_state() {
        let mut c = conn();
        assert_eq!(c.interest(), (true, false));
        c.readable = true;
        assert_eq!(c.interest(), (false, false));
        let mut byte = [0u8; 1];
        c.held.push(0, 1, &[seg(&mut byte, 0, 1)]);
        assert_eq!(c.interest(), (false, true), "a held chain to write");
        c.held.release(&mut Vec::new());
        c.pending.push_back(1);
        assert_eq!(c.interest(), (false, true));
        c.readable = false;
        c.guest_shut_rcv = true;
        assert_eq!(c.interest(), (false, true));
        c.state = State::LocalInit;
        c.pending.clear();
        assert_eq!(c.interest(), (false, false));
        c.state = State::AwaitLine(Vec::new());
        assert_eq!(c.interest(), (true, false));
    }

    /// `len` bytes at offset `at` of `buf`.
    #[allow(unsafe_code)]
    fn seg(buf: &mut [u8], at: usize, len: usize) -> IoSeg {
        assert!(at + len <= buf.len());
        // SAFETY: inside `buf`, which outlives every use in the test (the
        // segments are only counted and split, never read).
        unsafe { IoSeg::new(buf.as_mut_ptr() as usize + at, len) }
    }

    #[test]
    fn held_chains_are_advanced_by_what_the_socket_took_and_returned_whole() {
        let mut buf = vec![0u8; 0x3000];
        let b = &mut buf[..];
        let mut c = conn();
        assert!(!c.owes_host());
        c.held.push(7, 2, &[seg(b, 0x1000, 10)]);
        c.held.push(3, 1, &[seg(b, 0x2000, 12), seg(b, 0x2100, 8)]);
        assert!(c.owes_host());
        assert!(!c.pending_data());
        assert_eq!((c.held.len(), c.held.descs(), c.held.bytes()), (2, 3, 30));
        let mut done = Vec::new();
        // Exactly the first chain: its segment gone, its head returned.
        assert_eq!(c.held.advance(10, &mut done), 2);
        assert_eq!(done, [7]);
        assert_eq!(c.held.segs(), [seg(b, 0x2000, 12), seg(b, 0x2100, 8)]);
        assert_eq!((c.held.descs(), c.held.bytes()), (1, 20));
        // Part of the second, across its segments.
        assert_eq!(c.held.advance(15, &mut done), 0);
        assert_eq!(done, [7]);
        assert_eq!(c.held.segs(), [seg(b, 0x2103, 5)]);
        assert_eq!(c.held.chains().next().map(|h| h.left), Some(5));
        assert_eq!((c.held.descs(), c.held.bytes()), (1, 5));
        // More than is owed takes what is owed.
        assert_eq!(c.held.advance(9, &mut done), 1);
        assert_eq!(done, [7, 3]);
        assert!(c.held.is_empty() && c.held.segs().is_empty());
        assert_eq!((c.held.descs(), c.held.bytes()), (0, 0));
        assert!(!c.owes_host());
        // Several at once, and a release of what is left.
        for (h, d) in [(1, 1), (2, 4), (5, 2)] {
            c.held.push(h, d, &[seg(b, 0x100 * usize::from(h), 4)]);
        }
        assert_eq!((c.held.len(), c.held.descs(), c.held.bytes()), (3, 7, 12));
        done.clear();
        assert_eq!(c.held.advance(9, &mut done), 5);
        assert_eq!(done, [1, 2]);
        assert_eq!((c.held.descs(), c.held.bytes()), (2, 3));
        assert_eq!(c.held.release(&mut done), 2);
        assert_eq!(done, [1, 2, 5]);
        assert!(c.held.is_empty() && c.held.segs().is_empty());
        assert_eq!((c.held.descs(), c.held.bytes()), (0, 0));
    }

    #[test]
    fn the_held_payload_is_offered_whole_after_its_front_was_written() {
        let mut buf = vec![0u8; 0x1000];
        let b = &mut buf[..];
        let mut c = conn();
        let mut done = Vec::new();
        for h in 0..3 {
            c.held.push(h, 1, &[seg(b, 0x100 * usize::from(h), 8)]);
        }
        c.held.advance(16, &mut done);
        for h in 3..6 {
            c.held.push(h, 1, &[seg(b, 0x100 * usize::from(h), 8)]);
        }
        let want: Vec<IoSeg> = (2..6).map(|h| seg(b, 0x100 * h, 8)).collect();
        assert_eq!(c.held.segs(), &want[..], "one writev for all of it");
        assert_eq!(c.held.bytes(), 32);
    }

    /// Written entries stay in place (a move of the index) until they are
    /// more than half of a list, then go in one move.
    #[test]
    fn written_entries_are_reclaimed_once_they_are_more_than_half() {
        let mut buf = vec![0u8; 0x1000];
        let b = &mut buf[..];
        let mut c = conn();
        let mut done = Vec::new();
        for h in 0..10 {
            c.held.push(h, 1, &[seg(b, 0x10 * usize::from(h), 4)]);
        }
        c.held.advance(4, &mut done);
        assert_eq!(c.held.stored(), (10, 10), "one written of ten stays");
        c.held.advance(16, &mut done);
        assert_eq!(c.held.stored(), (10, 10), "five of ten is half: they stay");
        c.held.advance(4, &mut done);
        assert_eq!(c.held.stored(), (4, 4), "six of ten go");
        assert_eq!(done, [0, 1, 2, 3, 4, 5]);
        assert_eq!(c.held.segs()[0], seg(b, 0x60, 4));
    }

    /// Thousands of pushes and partial writes against a model (the bytes
    /// owed, and each chain's head and what it owes): the same bytes in
    /// the same order, the same heads returned when their last byte goes,
    /// and storage within twice what is live, so a socket that always
    /// leaves a little behind cannot grow the lists without bound.
    #[test]
    fn held_chains_match_a_model_through_many_partial_writes() {
        let mut buf = vec![0u8; 0x10000];
        let b = &mut buf[..];
        let mut c = conn();
        let mut done = Vec::new();
        // (head, bytes owed) a chain, and the owed bytes as (address, len).
        let mut chains: VecDeque<(u16, usize)> = VecDeque::new();
        let mut owed: VecDeque<(usize, usize)> = VecDeque::new();
        let mut want_done = Vec::new();
        let mut rng = 0x2545_f491_u32;
        let mut next = |n: u32| {
            rng = rng.wrapping_mul(1_103_515_245).wrapping_add(12_345);
            (rng >> 8) % n
        };
        for step in 0..4000u32 {
            // One to three chains of one to three segments.
            for _ in 0..=next(3) {
                let head = (step % 1024) as u16;
                let mut segs = Vec::new();
                for _ in 0..=next(3) {
                    let (at, len) = (next(0xf000) as usize, 1 + next(100) as usize);
                    segs.push(seg(b, at, len));
                    owed.push_back((at, len));
                }
                let left = segs.iter().map(|s| s.len()).sum();
                c.held.push(head, 2, &segs);
                chains.push_back((head, left));
            }
            // Write all but a little, or a little.
            let total: usize = chains.iter().map(|&(_, l)| l).sum();
            let n = if next(2) == 0 {
                total.saturating_sub(1 + next(50) as usize)
            } else {
                next(300) as usize
            };
            let freed = c.held.advance(n, &mut done);
            let (mut k, mut model_freed) = (n.min(total), 0);
            while let Some((head, left)) = chains.front_mut() {
                if *left > k {
                    *left -= k;
                    break;
                }
                k -= *left;
                want_done.push(*head);
                model_freed += 2;
                chains.pop_front();
            }
            let mut k = n.min(total);
            while k > 0 {
                let (at, len) = owed.front_mut().unwrap();
                if *len <= k {
                    k -= *len;
                    owed.pop_front();
                } else {
                    *at += k;
                    *len -= k;
                    k = 0;
                }
            }
            assert_eq!(freed, model_freed, "step {step}");
            assert_eq!(done, want_done, "step {step}");
            let segs: Vec<IoSeg> = owed.iter().map(|&(at, len)| seg(b, at, len)).collect();
            assert_eq!(c.held.segs(), &segs[..], "step {step}");
            assert_eq!(c.held.len(), chains.len());
            assert_eq!(c.held.bytes(), owed.iter().map(|&(_, l)| l).sum::<usize>());
            assert_eq!(c.held.descs(), 2 * chains.len());
            let (stored_chains, stored_segs) = c.held.stored();
            assert!(stored_chains <= 2 * chains.len(), "step {step}");
            assert!(stored_segs <= 2 * owed.len(), "step {step}");
        }
    }

    #[test]
    fn copied_data_is_what_follows_the_ok_line() {
        let mut c = conn();
        c.pending.extend(b"OK 5\n");
        c.pending_ctl = 5;
        assert!(c.owes_host());
        assert!(!c.pending_data(), "the OK line is no data");
        c.pending.push_back(1);
        assert!(c.pending_data());
    }

    #[test]
    fn a_connection_is_finished_when_both_directions_are() {
        let mut c = conn();
        assert!(!c.finished());
        c.guest_shut_send = true;
        assert!(!c.finished(), "the host may still send");
        c.host_eof = true;
        assert!(c.finished());
        c.pending.push_back(0);
        assert!(!c.finished(), "bytes still wait for the host");
        c.pending.clear();
        let mut byte = [0u8; 1];
        c.held.push(0, 1, &[seg(&mut byte, 0, 1)]);
        assert!(!c.finished(), "a held chain still waits for the host");
        c.held.release(&mut Vec::new());
        c.owed.shutdown = true;
        assert!(!c.finished(), "the guest is still owed the host's SHUTDOWN");
        let mut d = conn();
        d.guest_shut_rcv = true;
        d.guest_shut_send = true;
        assert!(d.finished(), "the guest closed both ways");
        let mut e = conn();
        e.guest_shut_rcv = true;
        assert!(!e.finished(), "the guest may still send");
        e.state = State::LocalInit;
        e.guest_shut_send = true;
        assert!(!e.finished());
    }
}
