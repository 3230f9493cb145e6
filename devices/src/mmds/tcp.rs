// SPDX-License-Identifier: Apache-2.0
//! MMDS's TCP endpoint on port 80: a bounded set of passive connections,
//! each reassembling the guest's request in order into a fixed buffer and
//! sending one response at a time within the guest's window.
//!
//! What bounds it, whatever the guest sends:
//!
//! - at most [`MAX_CONNECTIONS`] connections; a SYN beyond that resets the
//!   least recently used one (as Firecracker's endpoint does);
//! - a receive buffer of [`MAX_REQUEST_LEN`] bytes per connection, whose free
//!   space is the window MMDS advertises; bytes past it, out of order or
//!   outside the window are dropped and re-acknowledged; a request that
//!   cannot fit resets the connection;
//! - one response held per connection until the guest acknowledges it (a
//!   response is at most the store's bound plus its header);
//! - at most [`MAX_PENDING_RESETS`] resets waiting to be sent.
//!
//! No timers: the link is a virtio ring that loses nothing while the guest
//! posts buffers. A segment MMDS sent that the guest dropped is sent again
//! when the guest repeats an acknowledgment (go-back-N); a SYN-ACK when the
//! guest repeats its SYN.

use std::collections::VecDeque;
use std::time::Instant;

use super::http::{self, Parsed, MAX_REQUEST_LEN};
use super::metrics::MmdsMetrics;
use super::packet::{flags, tcp_frame, Outbound, Segment};
use super::{lock, SharedMmds};

/// Connections open at once.
pub const MAX_CONNECTIONS: usize = 30;
/// Resets waiting to be sent at once; more are not sent.
pub const MAX_PENDING_RESETS: usize = 16;
/// The port MMDS listens on.
pub const HTTP_PORT: u16 = 80;
/// The MSS MMDS announces: an Ethernet MTU of 1500 less IPv4 and TCP
/// headers.
pub const LOCAL_MSS: u16 = 1460;
/// The MSS assumed when the guest announces none (RFC 1122 §4.2.2.6).
const DEFAULT_MSS: u16 = 536;

/// Where a connection is in its opening.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// SYN received, SYN-ACK sent or due.
    SynReceived,
    /// The guest acknowledged the SYN-ACK.
    Established,
}

#[derive(Debug)]
struct Conn {
    ip: [u8; 4],
    port: u16,
    mac: [u8; 6],
    state: State,
    iss: u32,
    snd_una: u32,
    snd_nxt: u32,
    /// The response not yet acknowledged: `tx[0]` has sequence number
    /// `snd_una` once the SYN is acknowledged.
    tx: Vec<u8>,
    rcv_nxt: u32,
    rx: Vec<u8>,
    peer_window: u16,
    peer_mss: u16,
    syn_ack_due: bool,
    ack_due: bool,
    fin_received: bool,
    fin_sent: bool,
    fin_acked: bool,
    /// When the guest last sent to it (a counter, for the LRU choice).
    last_used: u64,
}

impl Conn {
    fn window(&self) -> u16 {
        // The buffer holds at most MAX_REQUEST_LEN (4096) bytes.
        (MAX_REQUEST_LEN - self.rx.len()) as u16
    }

    fn out<'a>(&self, seq: u32, flags_: u8, payload: &'a [u8]) -> Outbound<'a> {
        Outbound {
            mac: self.mac,
            ip: self.ip,
            port: self.port,
            local_port: HTTP_PORT,
            seq,
            ack: self.rcv_nxt,
            flags: flags_,
            window: self.window(),
            mss: None,
            payload,
        }
    }

    /// Sequence number of `tx[0]`.
    fn tx_seq(&self) -> u32 {
        if self.state == State::SynReceived {
            self.iss.wrapping_add(1)
        } else {
            self.snd_una
        }
    }

    /// Takes the guest's acknowledgment; false if it acknowledges what was
    /// never sent.
    fn acknowledge(&mut self, seg: &Segment<'_>) -> bool {
        let acked = seg.ack.wrapping_sub(self.snd_una);
        let in_flight = self.snd_nxt.wrapping_sub(self.snd_una);
        if acked > in_flight {
            return false;
        }
        if acked == 0 {
            // The same acknowledgment, window unchanged, nothing else: the
            // guest lacks what follows. Send it again from there.
            let repeated = in_flight > 0
                && seg.payload.is_empty()
                && seg.flags & flags::FIN == 0
                && seg.window == self.peer_window;
            if repeated {
                self.snd_nxt = self.snd_una;
                self.fin_sent = false;
            }
        } else {
            let mut n = acked as usize;
            if self.state == State::SynReceived {
                self.state = State::Established;
                n -= 1;
            }
            let data = n.min(self.tx.len());
            self.tx.drain(..data);
            if n > data && self.fin_sent {
                self.fin_acked = true;
            }
            self.snd_una = seg.ack;
        }
        self.peer_window = seg.window;
        true
    }

    /// Appends the in-window part of the segment's data that fits, and
    /// takes its FIN once every byte before it is in.
    fn take_data(&mut self, seg: &Segment<'_>) {
        if !seg.payload.is_empty() {
            self.ack_due = true;
            let offset = self.rcv_nxt.wrapping_sub(seg.seq) as usize;
            if offset < seg.payload.len() {
                let new = &seg.payload[offset..];
                let take = new.len().min(MAX_REQUEST_LEN - self.rx.len());
                self.rx.extend_from_slice(&new[..take]);
                // `take` is at most MAX_REQUEST_LEN.
                self.rcv_nxt = self.rcv_nxt.wrapping_add(take as u32);
            }
        }
        if seg.flags & flags::FIN != 0 {
            self.ack_due = true;
            let fin_seq = seg.seq.wrapping_add(seg.payload.len() as u32);
            if !self.fin_received && fin_seq == self.rcv_nxt {
                self.fin_received = true;
                self.rcv_nxt = self.rcv_nxt.wrapping_add(1);
            }
        }
    }

    /// Answers the request at the front of the buffer if no response is
    /// pending; false if the request cannot fit and the connection must
    /// be reset.
    fn serve(&mut self, mmds: &SharedMmds, now: Instant, m: &MmdsMetrics) -> bool {
        if !self.tx.is_empty() || self.state != State::Established {
            return true;
        }
        let (response, http10, used) = match http::parse(&self.rx) {
            Parsed::Incomplete => return true,
            Parsed::TooLarge => return false,
            Parsed::Bad(n) => {
                MmdsMetrics::inc(&m.mmds_requests_refused);
                (http::Response::bad_request(), false, n)
            }
            Parsed::Request(req, n) => {
                (http::respond(&mut lock(mmds), &req, now, m), req.http10, n)
            }
        };
        response.write(http10, &mut self.tx);
        self.rx.drain(..used);
        true
    }

    /// The next segment this connection has to send, into `out`.
    fn poll(&mut self, out: &mut Vec<u8>, local_ip: [u8; 4]) -> bool {
        if self.syn_ack_due {
            self.syn_ack_due = false;
            self.snd_nxt = self.iss.wrapping_add(1);
            let mut seg = self.out(self.iss, flags::SYN | flags::ACK, &[]);
            seg.mss = Some(LOCAL_MSS);
            tcp_frame(out, &seg, local_ip);
            return true;
        }
        if self.state == State::SynReceived {
            return false;
        }
        let sent = self.snd_nxt.wrapping_sub(self.tx_seq()) as usize;
        if sent < self.tx.len() {
            let in_flight = self.snd_nxt.wrapping_sub(self.snd_una) as usize;
            let room = usize::from(self.peer_window).saturating_sub(in_flight);
            let n = (self.tx.len() - sent)
                .min(usize::from(self.peer_mss))
                .min(room);
            if n > 0 {
                let last = sent + n == self.tx.len();
                let f = flags::ACK | if last { flags::PSH } else { 0 };
                let seg = self.out(self.snd_nxt, f, &self.tx[sent..sent + n]);
                tcp_frame(out, &seg, local_ip);
                self.snd_nxt = self.snd_nxt.wrapping_add(n as u32);
                self.ack_due = false;
                return true;
            }
        }
        if self.fin_received && !self.fin_sent && sent >= self.tx.len() {
            self.fin_sent = true;
            let seg = self.out(self.snd_nxt, flags::FIN | flags::ACK, &[]);
            tcp_frame(out, &seg, local_ip);
            self.snd_nxt = self.snd_nxt.wrapping_add(1);
            self.ack_due = false;
            return true;
        }
        if self.ack_due {
            self.ack_due = false;
            tcp_frame(out, &self.out(self.snd_nxt, flags::ACK, &[]), local_ip);
            return true;
        }
        false
    }

    fn finished(&self) -> bool {
        self.fin_received && self.fin_acked
    }
}

/// A reset to send: to whom, and its sequence and acknowledgment numbers.
#[derive(Debug, Clone, Copy)]
struct Reset {
    mac: [u8; 6],
    ip: [u8; 4],
    port: u16,
    local_port: u16,
    seq: u32,
    ack: Option<u32>,
}

/// The endpoint of one card.
#[derive(Debug, Default)]
pub struct Tcp {
    conns: Vec<Conn>,
    resets: VecDeque<Reset>,
    clock: u64,
    cursor: usize,
}

impl Tcp {
    /// Connections open now.
    pub fn connections(&self) -> usize {
        self.conns.len()
    }

    /// Bytes held for connections (receive buffers and responses): what
    /// the fuzz target bounds.
    pub fn held_bytes(&self) -> usize {
        self.conns
            .iter()
            .map(|c| c.rx.capacity() + c.tx.len())
            .sum()
    }

    /// Forgets every connection (the device was reset).
    pub fn clear(&mut self) {
        self.conns.clear();
        self.resets.clear();
    }

    fn reset_for(&mut self, seg: &Segment<'_>) {
        if seg.flags & flags::RST != 0 {
            return;
        }
        let len = seg.payload.len() as u32
            + u32::from(seg.flags & flags::SYN != 0)
            + u32::from(seg.flags & flags::FIN != 0);
        // RFC 793 §3.4, "Reset Generation".
        let (seq, ack) = if seg.flags & flags::ACK != 0 {
            (seg.ack, None)
        } else {
            (0, Some(seg.seq.wrapping_add(len)))
        };
        self.queue_reset(Reset {
            mac: seg.mac,
            ip: seg.ip,
            port: seg.sport,
            local_port: seg.dport,
            seq,
            ack,
        });
    }

    fn queue_reset(&mut self, r: Reset) {
        if self.resets.len() < MAX_PENDING_RESETS {
            self.resets.push_back(r);
        }
    }

    fn reset_conn(&mut self, i: usize, m: &MmdsMetrics) {
        let c = self.conns.swap_remove(i);
        MmdsMetrics::inc(&m.mmds_connections_reset);
        self.queue_reset(Reset {
            mac: c.mac,
            ip: c.ip,
            port: c.port,
            local_port: HTTP_PORT,
            seq: c.snd_nxt,
            ack: Some(c.rcv_nxt),
        });
    }

    fn open(&mut self, seg: &Segment<'_>, m: &MmdsMetrics) {
        if self.conns.len() >= MAX_CONNECTIONS {
            let lru = (0..self.conns.len()).min_by_key(|&i| self.conns[i].last_used);
            if let Some(i) = lru {
                self.reset_conn(i, m);
            }
        }
        let mut iss = [0u8; 4];
        if crate::virtio::iov::fill_random(&mut iss).is_err() {
            // Without the kernel's generator, a clock-derived start still
            // differs between connections.
            iss = (self.clock as u32)
                .wrapping_mul(2_654_435_761)
                .to_be_bytes();
        }
        let iss = u32::from_be_bytes(iss);
        MmdsMetrics::inc(&m.mmds_connections_opened);
        self.conns.push(Conn {
            ip: seg.ip,
            port: seg.sport,
            mac: seg.mac,
            state: State::SynReceived,
            iss,
            snd_una: iss,
            snd_nxt: iss,
            tx: Vec::new(),
            rcv_nxt: seg.seq.wrapping_add(1),
            rx: Vec::new(),
            peer_window: seg.window,
            peer_mss: seg.mss.unwrap_or(DEFAULT_MSS).clamp(1, LOCAL_MSS),
            syn_ack_due: true,
            ack_due: false,
            fin_received: false,
            fin_sent: false,
            fin_acked: false,
            last_used: self.clock,
        });
    }

    /// Takes one segment from the guest.
    pub fn receive(&mut self, seg: &Segment<'_>, mmds: &SharedMmds, now: Instant, m: &MmdsMetrics) {
        self.clock += 1;
        if seg.dport != HTTP_PORT {
            MmdsMetrics::inc(&m.mmds_rx_dropped);
            return self.reset_for(seg);
        }
        let syn = seg.flags & flags::SYN != 0;
        let found = self
            .conns
            .iter()
            .position(|c| c.ip == seg.ip && c.port == seg.sport);
        let Some(i) = found else {
            if syn && seg.flags & (flags::ACK | flags::RST) == 0 {
                return self.open(seg, m);
            }
            return self.reset_for(seg);
        };
        let c = &mut self.conns[i];
        c.last_used = self.clock;
        if seg.flags & flags::RST != 0 {
            // Only a reset at the next expected byte ends the connection
            // (RFC 5961 §3.2), so a blind one cannot.
            if seg.seq == c.rcv_nxt {
                self.conns.swap_remove(i);
            }
            return;
        }
        if syn {
            if c.state == State::SynReceived && seg.seq.wrapping_add(1) == c.rcv_nxt {
                c.syn_ack_due = true;
            } else {
                c.ack_due = true;
            }
            return;
        }
        if seg.flags & flags::ACK == 0 || !c.acknowledge(seg) {
            c.ack_due = true;
            return;
        }
        c.take_data(seg);
        if !c.serve(mmds, now, m) {
            return self.reset_conn(i, m);
        }
        if c.finished() {
            self.conns.swap_remove(i);
        }
    }

    /// Writes the next segment MMDS has to send into `out`, vnet header
    /// first; false if there is none.
    pub fn poll(&mut self, out: &mut Vec<u8>, local_ip: [u8; 4]) -> bool {
        if let Some(r) = self.resets.pop_front() {
            let seg = Outbound {
                mac: r.mac,
                ip: r.ip,
                port: r.port,
                local_port: r.local_port,
                seq: r.seq,
                ack: r.ack.unwrap_or(0),
                flags: flags::RST | if r.ack.is_some() { flags::ACK } else { 0 },
                window: 0,
                mss: None,
                payload: &[],
            };
            tcp_frame(out, &seg, local_ip);
            return true;
        }
        let n = self.conns.len();
        for k in 0..n {
            let i = (self.cursor + k) % n;
            if self.conns[i].poll(out, local_ip) {
                self.cursor = i + 1;
                return true;
            }
        }
        false
    }
}
