// SPDX-License-Identifier: Apache-2.0
//! The device's buffer per connection grows while the host keeps up: how
//! far, out of what, when not, and what a guest may send meanwhile.
//! Oracles: the `buf_alloc` the guest hears never falls and never passes
//! `buf_alloc_max`; all growth together stays within `credit_boost` and
//! comes back when a connection ends; a host that leaves bytes untaken
//! stops it; the guest is held to the buffer it heard of; every byte
//! reaches the host once and in order.

use std::io::Read;
use std::os::unix::net::UnixStream;

use super::fixture::*;
use crate::virtio::vsock::packet::{Header, Op};
use crate::virtio::vsock::{Tunables, UnixBackend};

const BUF: u32 = 8 * 1024;
const CHUNK: u32 = 2 * 1024;

fn tunables(buf_alloc_max: u32, credit_boost: usize) -> Tunables {
    Tunables {
        buf_alloc: BUF,
        buf_alloc_max,
        credit_boost,
        ..test_tunables()
    }
}

/// A guest's view of one connection's credit, sending as it allows.
struct Guest {
    port: u32,
    host_port: u32,
    sent: u32,
    fwd_seen: u32,
    buf_seen: u32,
    /// Every `buf_alloc` the device's packets carried, in order.
    heard: Vec<u32>,
    want: Vec<u8>,
}

impl Guest {
    fn new(port: u32, host_port: u32) -> Self {
        Guest {
            port,
            host_port,
            sent: 0,
            fwd_seen: 0,
            buf_seen: BUF,
            heard: Vec::new(),
            want: Vec::new(),
        }
    }

    fn credit(&self) -> u32 {
        self.buf_seen - (self.sent - self.fwd_seen)
    }

    /// Sends up to `n` bytes within the credit it heard of; returns how
    /// many.
    fn send(&mut self, f: &mut VsockFixture<UnixBackend>, n: u32) -> u32 {
        let n = n.min(self.credit());
        if n > 0 {
            let seed = self.want.len() as u32;
            let d: Vec<u8> = (seed..seed + n).map(|i| (i % 251) as u8).collect();
            f.send(&guest_hdr(self.port, self.host_port, Op::Rw), &d);
            self.sent += n;
            self.want.extend_from_slice(&d);
        }
        n
    }

    /// Takes in the packets the device sent this connection.
    fn hear(&mut self, pkts: &[Pkt]) {
        for p in pkts
            .iter()
            .filter(|p| (p.hdr.dst_port, p.hdr.src_port) == (self.port, self.host_port))
        {
            assert_eq!(p.op(), Some(Op::CreditUpdate), "{p:?}");
            self.fwd_seen = p.hdr.fwd_cnt;
            self.buf_seen = p.hdr.buf_alloc;
            self.heard.push(p.hdr.buf_alloc);
        }
    }
}

/// Reads whatever `s` has now, without waiting.
fn read_now(s: &mut UnixStream, out: &mut Vec<u8>) {
    s.set_nonblocking(true).unwrap();
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        match s.read(&mut buf) {
            Ok(0) => panic!("EOF"),
            Ok(k) => out.extend_from_slice(&buf[..k]),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return,
            Err(e) => panic!("host read: {e}"),
        }
    }
}

/// One packet of a streaming guest whose host reads everything at once:
/// what the host read.
fn stream_step(f: &mut VsockFixture<UnixBackend>, g: &mut Guest, s: &mut UnixStream) -> Vec<u8> {
    let mut got = Vec::new();
    g.send(f, CHUNK);
    read_now(s, &mut got);
    f.run_until_idle();
    let pkts = f.recv();
    f.post_rx(pkts.len(), 4096);
    g.hear(&pkts);
    got
}

#[test]
fn a_stream_its_host_keeps_up_with_grows_its_buffer_to_the_most_and_no_further() {
    let mut f = VsockFixture::with(tunables(4 * BUF, 1 << 20), UnixBackend, true);
    let l = f.host_listen(9);
    let mut s = f.open_from_guest(&l, 1, 9);
    f.post_rx(4, 4096);
    let mut g = Guest::new(1, 9);
    let mut got = Vec::new();
    for _ in 0..500 {
        got.extend(stream_step(&mut f, &mut g, &mut s));
    }
    assert!(
        got == g.want,
        "{} of {} bytes, or out of order",
        got.len(),
        g.want.len()
    );
    assert_eq!(g.want.len(), 500 * CHUNK as usize, "never short of credit");
    // Doubled twice, heard in order, never lowered, never past the most.
    assert!(g.heard.windows(2).all(|w| w[0] <= w[1]), "{:?}", g.heard);
    let mut steps = g.heard.clone();
    steps.dedup();
    assert_eq!(steps, [2 * BUF, 4 * BUF]);
    assert_eq!(f.metric(|m| &m.credit_grown), 2);
    assert_eq!(f.dev().credit_boost_used(), 3 * BUF as usize);
    assert_eq!(f.metric(|m| &m.credit_exceeded), 0);
    // Asked, the device gives the whole grown buffer back at once.
    f.send(&guest_hdr(1, 9, Op::CreditRequest), &[]);
    let pkts = f.recv();
    g.hear(&pkts);
    assert_eq!(g.credit(), 4 * BUF);
}

#[test]
fn growth_is_bounded_by_the_boost_and_returns_when_its_connection_ends() {
    // Room for one doubling, from 8 KiB to 16 KiB.
    let mut f = VsockFixture::with(tunables(4 * BUF, BUF as usize), UnixBackend, true);
    let l = f.host_listen(9);
    let mut a = f.open_from_guest(&l, 1, 9);
    let mut b = f.open_from_guest(&l, 2, 9);
    f.post_rx(4, 4096);
    let (mut ga, mut gb) = (Guest::new(1, 9), Guest::new(2, 9));
    for _ in 0..40 {
        stream_step(&mut f, &mut ga, &mut a);
        stream_step(&mut f, &mut gb, &mut b);
    }
    assert_eq!(
        ga.buf_seen,
        2 * BUF,
        "the first grows once, as far as the boost goes"
    );
    assert_eq!(gb.buf_seen, BUF, "nothing left for the second");
    assert_eq!(f.metric(|m| &m.credit_grown), 1);
    assert_eq!(f.dev().credit_boost_used(), BUF as usize);
    // The first connection ends: its growth is free for the second.
    f.send(&guest_hdr(1, 9, Op::Rst), &[]);
    assert_eq!(f.dev().credit_boost_used(), 0);
    for _ in 0..40 {
        stream_step(&mut f, &mut gb, &mut b);
    }
    assert_eq!(gb.buf_seen, 2 * BUF);
    assert_eq!(f.dev().credit_boost_used(), BUF as usize);
    assert_eq!(f.dev().connections(), 1);
}

#[test]
fn a_host_that_leaves_bytes_untaken_stops_the_growth() {
    // No bound of its own: only the host's pace stops it.
    let mut f = VsockFixture::with(tunables(u32::MAX, usize::MAX), UnixBackend, true);
    let l = f.host_listen(9);
    let _s = f.open_from_guest(&l, 1, 9);
    f.post_rx(4, 4096);
    let mut g = Guest::new(1, 9);
    let mut grown_at_first_refusal = None;
    for _ in 0..20_000 {
        if g.send(&mut f, 64 * 1024) == 0 {
            break;
        }
        let pkts = f.recv();
        f.post_rx(pkts.len(), 4096);
        g.hear(&pkts);
        if grown_at_first_refusal.is_none() && f.metric(|m| &m.tx_short_writes) > 0 {
            grown_at_first_refusal = Some(f.metric(|m| &m.credit_grown));
        }
        let held = f.dev().pending_bytes();
        assert!(
            held <= g.buf_seen as usize,
            "{held} bytes held past {}",
            g.buf_seen
        );
    }
    assert_eq!(g.credit(), 0, "the guest used all it was given");
    let grown = grown_at_first_refusal.expect("the socket's buffer filled");
    assert_eq!(
        f.metric(|m| &m.credit_grown),
        grown,
        "no growth once the host left bytes untaken"
    );
    assert!(g.buf_seen < u32::MAX / 2, "{}", g.buf_seen);
    assert_eq!(f.dev().credit_boost_used(), (g.buf_seen - BUF) as usize);
}

#[test]
fn the_guest_is_held_to_the_buffer_it_heard_of() {
    let mut f = VsockFixture::with(tunables(4 * BUF, 1 << 20), UnixBackend, true);
    let l = f.host_listen(9);
    let mut s = f.open_from_guest(&l, 1, 9);
    // No RX buffers: the guest hears nothing of the growth that follows.
    let posted = f.rx_outstanding();
    for _ in 0..posted {
        f.send(&guest_hdr(1, 9, Op::CreditRequest), &[]);
    }
    assert_eq!(f.recv().len(), posted);
    assert_eq!(f.rx_outstanding(), 0);
    let mut g = Guest::new(1, 9);
    assert_eq!(
        g.send(&mut f, BUF),
        BUF,
        "its whole credit, taken by the host"
    );
    assert!(f.metric(|m| &m.credit_grown) >= 1, "the buffer grew");
    assert_eq!(f.dev().connections(), 1);
    // One byte past what it heard of is past its credit, whatever grew.
    let hdr = Header {
        len: 1,
        ..guest_hdr(1, 9, Op::Rw)
    };
    f.send(&hdr, b"x");
    assert_eq!(f.metric(|m| &m.credit_exceeded), 1);
    assert_eq!(f.dev().connections(), 0);
    let mut got = Vec::new();
    let mut buf = vec![0u8; 4 * BUF as usize];
    while got.len() < g.want.len() {
        let k = s.read(&mut buf).unwrap();
        assert!(k > 0, "EOF after {} bytes", got.len());
        got.extend_from_slice(&buf[..k]);
    }
    assert!(got == g.want);
}
