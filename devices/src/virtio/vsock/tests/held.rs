// SPDX-License-Identifier: Apache-2.0
//! TX chains held for host sockets that did not take their payload: returned
//! out of order once written, bounded per connection and per device, and
//! returned exactly once (or forgotten with the rings by a reset) by every
//! path that ends a connection, and before a snapshot. The oracle of every
//! test: a [`Ledger`] of the TX chains posted, which fails on a chain
//! returned twice or never posted.

use std::collections::HashSet;
use std::io::{Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};

use vm_memory::{Bytes, GuestAddress};

use super::fixture::*;
use crate::virtio::test_utils::{DriverQueue, Segment};
use crate::virtio::vsock::muxer::HoldLimits;
use crate::virtio::vsock::packet::{Header, Op, HDR_LEN, SHUTDOWN_SEND};
use crate::virtio::vsock::{Tunables, UnixBackend, VsockBackend};
use crate::virtio::VirtioDevice;

/// Payload of every data packet.
const PKT: usize = 4096;
/// Packets sent to a host that never reads: more than its socket takes
/// (about 200 KiB) plus a connection's bound of held chains.
const FLOOD: usize = 180;
/// The fixture's rings have 256 descriptors; Linux 6.1's packets take two.
const LIMITS_PER_CONN_CHAINS: usize = 256 / 2 / 2;
/// Held by all connections: three quarters of the ring.
const LIMITS_ALL_CHAINS: usize = 256 / 4 * 3 / 2;

/// The TX chains posted and not yet returned.
#[derive(Default)]
struct Ledger {
    out: HashSet<u16>,
    /// Heads in the order they came back, since the last `take_order`.
    order: Vec<u16>,
}

impl Ledger {
    fn post<B: VsockBackend + 'static>(&mut self, f: &mut VsockFixture<B>, h: &Header, d: &[u8]) {
        self.post_cut(f, h, d, &[HDR_LEN]);
    }

    /// [`post`](Self::post) with the chain cut at `cuts` (offsets from the
    /// header's start).
    fn post_cut<B: VsockBackend + 'static>(
        &mut self,
        f: &mut VsockFixture<B>,
        h: &Header,
        d: &[u8],
        cuts: &[usize],
    ) {
        let hdr = Header {
            len: d.len() as u32,
            ..*h
        };
        let head = f.post_tx(&hdr, d, cuts);
        assert!(self.out.insert(head), "head {head} posted while out");
    }

    /// Reads the TX used ring: each entry must be a chain out.
    fn collect<B: VsockBackend + 'static>(&mut self, f: &mut VsockFixture<B>) -> usize {
        f.run_until_idle();
        let used = f.qs[1].used(&f.mem).unwrap();
        for e in &used {
            assert_eq!(e.len, 0, "a TX chain came back with a length");
            let head = e.id as u16;
            assert!(
                self.out.remove(&head),
                "TX chain {head} returned twice or never posted"
            );
            self.order.push(head);
        }
        used.len()
    }
}

fn bytes(n: usize, seed: usize) -> Vec<u8> {
    (0..n)
        .map(|i| (i as u8).wrapping_mul(7).wrapping_add(seed as u8))
        .collect()
}

fn big_credit() -> VsockFixture<UnixBackend> {
    big_credit_over(UnixBackend)
}

/// An activated device over `backend` whose credit never binds.
fn big_credit_over<B: VsockBackend + 'static>(backend: B) -> VsockFixture<B> {
    let tun = Tunables {
        buf_alloc: 4 << 20,
        ..test_tunables()
    };
    VsockFixture::with(tun, backend, true)
}

/// Sends `n` packets on guest port `gp` to host port 9, in batches the
/// driver's ring has room for; returns what was sent, in order.
fn flood<B: VsockBackend + 'static>(
    f: &mut VsockFixture<B>,
    led: &mut Ledger,
    gp: u32,
    n: usize,
) -> Vec<u8> {
    let mut sent = Vec::new();
    for i in 0..n {
        let d = bytes(PKT, i + gp as usize * 1000);
        led.post(f, &guest_hdr(gp, 9, Op::Rw), &d);
        sent.extend_from_slice(&d);
        if i % 16 == 15 {
            led.collect(f);
        }
    }
    led.collect(f);
    sent
}

/// Reads everything the device relays to `s` until `n` bytes came.
fn drain<B: VsockBackend + 'static>(
    f: &mut VsockFixture<B>,
    led: &mut Ledger,
    s: &mut UnixStream,
    n: usize,
) -> Vec<u8> {
    s.set_nonblocking(true).unwrap();
    let mut got = Vec::new();
    let mut buf = vec![0u8; 65536];
    let end = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while got.len() < n {
        assert!(std::time::Instant::now() < end, "only {} of {n}", got.len());
        match s.read(&mut buf) {
            Ok(0) => break,
            Ok(k) => got.extend_from_slice(&buf[..k]),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                f.run_for(2);
                led.collect(f);
            }
            Err(e) => panic!("{e}"),
        }
    }
    led.collect(f);
    got
}

#[test]
fn the_limits_are_half_the_ring_for_one_connection_and_three_quarters_for_all() {
    assert_eq!(
        HoldLimits::for_ring(256),
        HoldLimits {
            per_conn: 128,
            all: 192
        }
    );
    assert_eq!(
        HoldLimits::for_ring(2),
        HoldLimits {
            per_conn: 1,
            all: 0
        }
    );
    assert_eq!(
        HoldLimits::for_ring(64),
        HoldLimits {
            per_conn: 32,
            all: 48
        }
    );
}

#[test]
fn a_refused_packet_s_chain_comes_back_after_later_ones_once_written() {
    let mut f = VsockFixture::faulty();
    let l = f.host_listen(9);
    let mut s1 = f.open_from_guest(&l, 1, 9);
    let mut s2 = f.open_from_guest(&l, 2, 9);
    let mut led = Ledger::default();
    f.dev()
        .backend_mut()
        .inject(Op2::Send, &[Fault::Errno(libc::EAGAIN)]);
    let a = bytes(3000, 1);
    let b = bytes(2000, 2);
    // Both in one pass: the first is refused and held, the second written.
    let ha = f.post_tx(
        &Header {
            len: 3000,
            ..guest_hdr(1, 9, Op::Rw)
        },
        &a,
        &[HDR_LEN],
    );
    let hb = f.post_tx(
        &Header {
            len: 2000,
            ..guest_hdr(2, 9, Op::Rw)
        },
        &b,
        &[HDR_LEN],
    );
    led.out.extend([ha, hb]);
    led.collect(&mut f);
    assert_eq!(led.order, [hb, ha], "the held chain returned after");
    assert!(led.out.is_empty());
    assert_eq!(read_n(&mut s1, 3000), a);
    assert_eq!(read_n(&mut s2, 2000), b);
    assert_eq!(held_and_copied(&f), (1, 0));
    assert_eq!(f.dev().held_chains(), 0);
}

#[test]
fn a_short_write_holds_the_rest_and_writes_it_from_the_chain() {
    let mut f = VsockFixture::faulty();
    let l = f.host_listen(9);
    let mut s = f.open_from_guest(&l, 1, 9);
    let mut led = Ledger::default();
    // 700 bytes taken, then the socket refuses the rest once: the rest is
    // held over two flushes, the chain returned after the last byte.
    f.dev()
        .backend_mut()
        .inject(Op2::Send, &[Fault::Short(700), Fault::Short(100)]);
    let a = bytes(2000, 3);
    led.post(&mut f, &guest_hdr(1, 9, Op::Rw), &a);
    led.collect(&mut f);
    assert!(led.out.is_empty(), "returned once written");
    assert_eq!(read_n(&mut s, 2000), a);
    assert_eq!(f.metric(|m| &m.tx_chains_held), 1);
    assert_eq!(f.dev().pending_bytes(), 0);
    // Credit counts only what the host took.
    let pkts = f.recv();
    let fwd = pkts.iter().map(|p| p.hdr.fwd_cnt).max().unwrap_or(2000);
    assert_eq!(fwd, 2000, "{pkts:?}");
}

#[test]
fn held_chains_are_bounded_per_connection_and_per_device_and_others_still_flow() {
    let mut f = big_credit();
    let l = f.host_listen(9);
    let mut led = Ledger::default();
    let mut hosts = Vec::new();
    let mut sent = Vec::new();
    for gp in 1..=3 {
        hosts.push(f.open_from_guest(&l, gp, 9));
        sent.push(flood(&mut f, &mut led, gp, FLOOD));
        let held = f.dev().held_chains();
        let want = (LIMITS_PER_CONN_CHAINS * gp as usize).min(LIMITS_ALL_CHAINS);
        assert_eq!(held, want, "after connection {gp}");
        assert_eq!(led.out.len(), held, "every chain not held came back");
    }
    assert!(
        f.metric(|m| &m.tx_bytes_copied) > 0,
        "past the bound: copies"
    );
    // A fourth connection, whose host reads, is not held back.
    let mut s4 = f.open_from_guest(&l, 4, 9);
    let d = bytes(PKT * 4, 9);
    led.post(&mut f, &guest_hdr(4, 9, Op::Rw), &d);
    led.collect(&mut f);
    assert_eq!(read_n(&mut s4, d.len()), d);
    assert_eq!(led.out.len(), LIMITS_ALL_CHAINS);
    // The first host reads all: its bytes in order, its chains back.
    let got = drain(&mut f, &mut led, &mut hosts[0], sent[0].len());
    assert!(got == sent[0], "connection 1's bytes out of order");
    assert_eq!(led.out.len(), LIMITS_ALL_CHAINS - LIMITS_PER_CONN_CHAINS);
    // The guest resets the second: its chains come back unwritten.
    led.post(&mut f, &guest_hdr(2, 9, Op::Rst), &[]);
    led.collect(&mut f);
    assert!(led.out.is_empty(), "{:?}", led.out);
    assert_eq!(f.dev().held_chains(), 0);
    let got = drain(&mut f, &mut led, &mut hosts[2], sent[2].len());
    assert!(got == sent[2], "connection 3's copies out of order");
    // Every descriptor held was counted back: a new connection holds its
    // whole bound again.
    let _s5 = f.open_from_guest(&l, 5, 9);
    flood(&mut f, &mut led, 5, FLOOD);
    assert_eq!(f.dev().held_chains(), LIMITS_PER_CONN_CHAINS);
}

/// A device with a connection's bound of chains held for a host that
/// never reads.
struct Holding {
    f: VsockFixture<UnixBackend>,
    led: Ledger,
    l: UnixListener,
    s: UnixStream,
    sent: Vec<u8>,
}

fn hold_some() -> Holding {
    let mut f = big_credit();
    let l = f.host_listen(9);
    let s = f.open_from_guest(&l, 1, 9);
    let mut led = Ledger::default();
    let sent = flood(&mut f, &mut led, 1, FLOOD);
    assert_eq!(f.dev().held_chains(), LIMITS_PER_CONN_CHAINS);
    assert_eq!(led.out.len(), LIMITS_PER_CONN_CHAINS);
    Holding { f, led, l, s, sent }
}

impl Holding {
    /// Once every chain is back, two new connections whose hosts do not
    /// read hold the device's whole bound again (the first its own bound,
    /// the second the rest): the device's count of held descriptors went
    /// down by exactly what was returned.
    fn holds_again(&mut self, gp: u32) -> [UnixStream; 2] {
        assert!(self.led.out.is_empty());
        // What the device owes the guest first (an RST).
        self.f.recv();
        let hosts = [gp, gp + 1].map(|p| {
            let s = self.f.open_from_guest(&self.l, p, 9);
            flood(&mut self.f, &mut self.led, p, FLOOD);
            s
        });
        assert_eq!(self.f.dev().held_chains(), LIMITS_ALL_CHAINS);
        hosts
    }
}

#[test]
fn a_host_that_goes_away_returns_the_held_chains() {
    let mut h = hold_some();
    drop(std::mem::replace(&mut h.s, UnixStream::pair().unwrap().0));
    h.led.collect(&mut h.f);
    assert!(h.led.out.is_empty());
    assert_eq!(h.f.dev().connections(), 0);
    assert_eq!(h.f.metric(|m| &m.host_socket_errors), 1);
    h.holds_again(2);
}

#[test]
fn a_transport_reset_returns_the_held_chains() {
    let mut h = hold_some();
    h.f.dev().transport_reset();
    h.led.collect(&mut h.f);
    assert!(h.led.out.is_empty());
    assert_eq!(h.f.dev().held_chains(), 0);
    h.holds_again(2);
}

#[test]
fn a_shutdown_the_host_never_drains_returns_the_held_chains_at_its_deadline() {
    // The host's end stays open (unread) to the end of the test.
    let Holding {
        mut f,
        mut led,
        s: _s,
        ..
    } = hold_some();
    let shut = Header {
        flags: SHUTDOWN_SEND,
        ..guest_hdr(1, 9, Op::Shutdown)
    };
    led.post(&mut f, &shut, &[]);
    led.collect(&mut f);
    assert_eq!(led.out.len(), LIMITS_PER_CONN_CHAINS);
    f.run_for(400);
    led.collect(&mut f);
    assert!(led.out.is_empty());
    assert_eq!(f.metric(|m| &m.conns_timed_out), 1);
}

#[test]
fn a_device_reset_forgets_the_held_chains_without_touching_the_used_ring() {
    // The host's end stays open (unread) to the end of the test.
    let Holding {
        mut f,
        mut led,
        s: _s,
        ..
    } = hold_some();
    let before = f.qs[1].used_idx(&f.mem).unwrap();
    f.dev().reset();
    f.run_until_idle();
    assert_eq!(f.qs[1].used_idx(&f.mem).unwrap(), before);
    assert_eq!(f.dev().held_chains(), 0);
    assert_eq!(f.dev().connections(), 0);
    // Activated again over fresh rings: nothing from before comes back.
    f.activate(FEATURES);
    led.out.clear();
    assert_eq!(led.collect(&mut f), 0);
}

#[test]
fn quiesce_copies_what_held_chains_owe_and_returns_them_in_place() {
    let mut h = hold_some();
    let Holding {
        f, led, s, sent, ..
    } = &mut h;
    let pending = f.dev().pending_bytes();
    // The driver asks for an interrupt at the next used entry.
    let used = f.qs[1].used_idx(&f.mem).unwrap();
    f.qs[1].set_used_event(&f.mem, used).unwrap();
    let irqs = f.irq.count();
    f.dev().quiesce().unwrap();
    assert_eq!(f.dev().held_chains(), 0);
    assert_eq!(f.dev().pending_bytes(), pending, "nothing lost");
    assert!(f.irq.count() > irqs, "the driver is told at once");
    // Every chain taken is counted in used.idx: what a restore resumes by.
    let posted = f.qs[1].avail_idx(&f.mem).unwrap();
    assert_eq!(f.qs[1].used_idx(&f.mem).unwrap(), posted);
    led.collect(f);
    assert!(led.out.is_empty());
    // The host still gets every byte, in order: the held chains' rest went
    // before the copies made after them.
    let got = drain(f, led, s, sent.len());
    assert!(got == *sent, "bytes out of order after quiesce");
    assert_eq!(f.dev().pending_bytes(), 0);
    h.holds_again(2);
}

/// A chain whose two buffers sit in an indirect table takes one ring
/// descriptor but is counted by its buffers: a host that never reads still
/// keeps at most the ring's half in buffers held.
#[test]
fn an_indirect_chain_is_counted_by_its_buffers() {
    let mut f = big_credit();
    let l = f.host_listen(9);
    let _s = f.open_from_guest(&l, 1, 9);
    let mut led = Ledger::default();
    for i in 0..FLOOD {
        let d = bytes(PKT, i);
        let hdr = Header {
            len: PKT as u32,
            ..guest_hdr(1, 9, Op::Rw)
        };
        let (h, p) = (f.alloc(HDR_LEN as u64), f.alloc(PKT as u64));
        f.mem.write_slice(&hdr.to_bytes(), GuestAddress(h)).unwrap();
        f.mem.write_slice(&d, GuestAddress(p)).unwrap();
        let table = GuestAddress(f.alloc(32));
        let segs = [
            Segment::readable(GuestAddress(h), HDR_LEN as u32),
            Segment::readable(GuestAddress(p), PKT as u32),
        ];
        let head = f.qs[1].add_chain_indirect(&f.mem, &segs, 0, table).unwrap();
        f.qs[1].publish(&f.mem).unwrap();
        f.kick(1);
        assert!(led.out.insert(head));
        if i % 16 == 15 {
            led.collect(&mut f);
        }
    }
    led.collect(&mut f);
    assert_eq!(f.dev().held_chains(), LIMITS_PER_CONN_CHAINS);
    assert_eq!(led.out.len(), LIMITS_PER_CONN_CHAINS);
    f.dev().transport_reset();
    led.collect(&mut f);
    assert!(led.out.is_empty());
}

/// The fixture with a TX ring of `size` descriptors (RX and events keep
/// theirs) over `backend`.
fn small_tx_ring<B: VsockBackend + 'static>(size: u16, backend: B) -> VsockFixture<B> {
    let mut f = VsockFixture::with(test_tunables(), backend, false);
    f.qs[1] = DriverQueue::packed(&f.mem, f.qs[1].layout().desc_table, size);
    f.activate(FEATURES);
    f
}

/// Posts a packet whose header and `nsegs - 1` payload pieces sit in an
/// indirect table (one ring descriptor), without running the loop.
fn post_indirect<B: VsockBackend + 'static>(
    f: &mut VsockFixture<B>,
    led: &mut Ledger,
    hdr: &Header,
    d: &[u8],
    nsegs: usize,
) {
    let hdr = Header {
        len: d.len() as u32,
        ..*hdr
    };
    let h = f.alloc(HDR_LEN as u64);
    f.mem.write_slice(&hdr.to_bytes(), GuestAddress(h)).unwrap();
    let mut segs = vec![Segment::readable(GuestAddress(h), HDR_LEN as u32)];
    let piece = d.len().div_ceil(nsegs - 1);
    for part in d.chunks(piece) {
        let p = f.alloc(part.len() as u64);
        f.mem.write_slice(part, GuestAddress(p)).unwrap();
        segs.push(Segment::readable(GuestAddress(p), part.len() as u32));
    }
    assert_eq!(segs.len(), nsegs);
    let table = GuestAddress(f.alloc(16 * nsegs as u64));
    let head = f.qs[1].add_chain_indirect(&f.mem, &segs, 0, table).unwrap();
    f.qs[1].publish(&f.mem).unwrap();
    f.kick(1);
    assert!(led.out.insert(head));
}

/// Copies wait behind held chains, and a packet that comes after copies
/// is copied too even when the bounds have room again (held, it would be
/// written before them).
#[test]
fn a_packet_after_copied_data_is_copied_even_with_room_to_hold_it() {
    // An 8-entry TX ring: a connection holds 4 descriptors, all 6.
    let mut f = small_tx_ring(8, FaultyBackend::default());
    let l = f.host_listen(9);
    let mut s1 = f.open_from_guest(&l, 1, 9);
    let mut s2 = f.open_from_guest(&l, 2, 9);
    let mut led = Ledger::default();
    f.dev()
        .backend_mut()
        .inject(Op2::Send, &[Fault::Errno(libc::EAGAIN); 2]);
    let (p1, x, y, z) = (bytes(300, 1), bytes(400, 2), bytes(500, 3), bytes(600, 4));
    // All in one pass: p1 refused and held (4), x refused and held (6, all
    // the device may), y copied (no room), the guest resets connection 1
    // (p1 returned: 2 held), z copied although there is room again.
    post_indirect(&mut f, &mut led, &guest_hdr(1, 9, Op::Rw), &p1, 4);
    post_indirect(&mut f, &mut led, &guest_hdr(2, 9, Op::Rw), &x, 2);
    post_indirect(&mut f, &mut led, &guest_hdr(2, 9, Op::Rw), &y, 2);
    led.post(&mut f, &guest_hdr(1, 9, Op::Rst), &[]);
    post_indirect(&mut f, &mut led, &guest_hdr(2, 9, Op::Rw), &z, 2);
    led.collect(&mut f);
    assert!(led.out.is_empty(), "{:?}", led.out);
    let want = [x, y, z].concat();
    assert_eq!(read_n(&mut s2, want.len()), want);
    assert_eq!(held_and_copied(&f), (2, 1100));
    assert!(host_sees_eof(&mut s1), "connection 1 reset");
}

/// With a TX ring of 2 nothing may be held: the rest of a short write is
/// copied, and counted to the byte.
#[test]
fn with_no_room_to_hold_the_rest_is_copied_and_counted() {
    let mut f = small_tx_ring(2, FaultyBackend::default());
    let l = f.host_listen(9);
    let mut s = f.open_from_guest(&l, 1, 9);
    f.dev()
        .backend_mut()
        .inject(Op2::Send, &[Fault::Short(700)]);
    let a = bytes(2000, 5);
    f.send(&guest_hdr(1, 9, Op::Rw), &a);
    assert_eq!(read_n(&mut s, 2000), a);
    assert_eq!(held_and_copied(&f), (0, 1300));
    assert_eq!(f.dev().pending_bytes(), 0);
}

/// Chains held when the TX queue breaks are never written into its used
/// ring: the device waits for a reset.
#[test]
fn held_chains_of_a_broken_queue_are_forgotten() {
    let Holding {
        mut f, mut led, s, ..
    } = hold_some();
    // An avail index past the ring's size: the next TX pass breaks.
    let avail = f.qs[1].layout().avail_ring;
    let idx = f.qs[1].avail_idx(&f.mem).unwrap();
    f.mem
        .write_obj(idx.wrapping_add(1000), GuestAddress(avail.0 + 2))
        .unwrap();
    f.kick(1);
    f.run_until_idle();
    assert_eq!(f.metric(|m| &m.queue.queue_errors), 1);
    let used = f.qs[1].used_idx(&f.mem).unwrap();
    let rx_used = f.qs[0].used_idx(&f.mem).unwrap();
    drop(s);
    f.run_until_idle();
    assert_eq!(f.dev().connections(), 0);
    assert_eq!(f.dev().held_chains(), 0);
    assert_eq!(f.qs[1].used_idx(&f.mem).unwrap(), used);
    // Nor does any other pass run: the RST the host's close owes the
    // guest waits for the reset with everything else.
    assert_eq!(f.qs[0].used_idx(&f.mem).unwrap(), rx_used);
    assert_eq!(led.collect(&mut f), 0);
}

/// A reset followed at once by an activation (no event between them)
/// starts with nothing to return.
#[test]
fn an_activation_right_after_a_reset_returns_nothing_from_before() {
    // The host's end stays open (unread) to the end of the test.
    let Holding {
        mut f,
        mut led,
        s: _s,
        ..
    } = hold_some();
    f.dev().reset();
    f.activate(FEATURES);
    led.out.clear();
    assert_eq!(led.collect(&mut f), 0);
    assert_eq!(f.dev().held_chains(), 0);
}

/// A host-initiated connection whose `OK` line the socket refused: the
/// guest's first packets are held or copied behind it, and the host reads
/// the line, then the held chain, then the copy.
#[test]
fn the_ok_line_goes_before_held_chains_and_copies() {
    let mut f = small_tx_ring(8, FaultyBackend::default());
    let mut s = f.host_connect();
    s.write_all(b"CONNECT 20\n").unwrap();
    f.post_rx(4, 4096);
    let req = f.recv();
    assert_eq!(req.len(), 1, "{req:?}");
    let hp = req[0].hdr.src_port;
    let mut led = Ledger::default();
    f.dev()
        .backend_mut()
        .inject(Op2::WriteBytes, &[Fault::Errno(libc::EAGAIN)]);
    // One pass: the RESPONSE (its OK line refused), a packet held behind
    // the line (4 buffers: the connection's bound), one copied behind it.
    let (a, b) = (bytes(700, 6), bytes(900, 7));
    led.post(&mut f, &guest_hdr(20, hp, Op::Response), &[]);
    post_indirect(&mut f, &mut led, &guest_hdr(20, hp, Op::Rw), &a, 4);
    post_indirect(&mut f, &mut led, &guest_hdr(20, hp, Op::Rw), &b, 2);
    led.collect(&mut f);
    assert!(led.out.is_empty(), "{:?}", led.out);
    let ok = format!("OK {hp}\n").into_bytes();
    let want = [ok, a, b].concat();
    assert_eq!(read_n(&mut s, want.len()), want);
    assert_eq!(held_and_copied(&f), (1, 900));
}

/// The device's counts of TX chains held and of bytes copied.
fn held_and_copied<B: VsockBackend>(f: &VsockFixture<B>) -> (u64, u64) {
    (
        f.metric(|m| &m.tx_chains_held),
        f.metric(|m| &m.tx_bytes_copied),
    )
}

fn faulty_big_credit() -> VsockFixture<FaultyBackend> {
    big_credit_over(FaultyBackend::default())
}

/// A connection's packets of one pass reach its host socket in one
/// `writev`, in order, and every chain comes back once it is written,
/// in the pass that brought it.
#[test]
fn a_pass_s_packets_go_to_their_host_in_one_write() {
    let mut f = faulty_big_credit();
    let l = f.host_listen(9);
    let mut s1 = f.open_from_guest(&l, 1, 9);
    let mut s2 = f.open_from_guest(&l, 2, 9);
    let mut led = Ledger::default();
    let before = f.calls(Op2::Send);
    let (mut want1, mut want2) = (Vec::new(), Vec::new());
    for i in 0..12 {
        let d = bytes(PKT, i);
        let (gp, want) = if i % 3 == 2 {
            (2, &mut want2)
        } else {
            (1, &mut want1)
        };
        led.post(&mut f, &guest_hdr(gp, 9, Op::Rw), &d);
        want.extend_from_slice(&d);
    }
    assert_eq!(led.collect(&mut f), 12, "every chain back in the pass");
    assert_eq!(
        f.calls(Op2::Send) - before,
        2,
        "a write for each connection"
    );
    assert_eq!(read_n(&mut s1, want1.len()), want1);
    assert_eq!(read_n(&mut s2, want2.len()), want2);
    assert_eq!(f.metric(|m| &m.tx_short_writes), 0);
    assert_eq!(held_and_copied(&f), (0, 0));
    assert_eq!(f.dev().held_chains(), 0);
    // The credit counts all of it.
    f.send(&guest_hdr(1, 9, Op::CreditRequest), &[]);
    let pkts = f.recv();
    assert_eq!(pkts.len(), 1);
    assert_eq!(pkts[0].op(), Some(Op::CreditUpdate));
    assert_eq!(pkts[0].hdr.fwd_cnt as usize, want1.len());
}

/// Past the bound on held chains, what was deferred is written first and
/// the rest go on in order, a write each time the bound is reached.
#[test]
fn deferring_stops_at_the_bound_on_held_chains() {
    let mut f = faulty_big_credit();
    let l = f.host_listen(9);
    let mut s = f.open_from_guest(&l, 1, 9);
    let mut led = Ledger::default();
    let before = f.calls(Op2::Send);
    let mut want = Vec::new();
    // More packets than a connection may hold, all in one pass.
    let n = LIMITS_PER_CONN_CHAINS + LIMITS_PER_CONN_CHAINS / 2;
    for i in 0..n {
        let d = bytes(1000, i);
        led.post(&mut f, &guest_hdr(1, 9, Op::Rw), &d);
        want.extend_from_slice(&d);
    }
    assert_eq!(led.collect(&mut f), n);
    assert_eq!(read_n(&mut s, want.len()), want);
    let writes = f.calls(Op2::Send) - before;
    assert!(
        (2..=4).contains(&writes),
        "{writes} writes for {n} packets, {LIMITS_PER_CONN_CHAINS} held at most"
    );
    assert_eq!(f.dev().held_chains(), 0);
}

/// A packet of another kind writes what its connection deferred before
/// it acts: SHUTDOWN's EOF and RST's close come after the data.
#[test]
fn a_control_packet_lets_what_came_before_it_reach_the_host_first() {
    for op in [Op::Shutdown, Op::Rst] {
        let mut f = faulty_big_credit();
        let l = f.host_listen(9);
        let mut s = f.open_from_guest(&l, 1, 9);
        let mut led = Ledger::default();
        let a = bytes(3000, 1);
        led.post(&mut f, &guest_hdr(1, 9, Op::Rw), &a);
        let hdr = Header {
            flags: SHUTDOWN_SEND,
            ..guest_hdr(1, 9, op)
        };
        led.post(&mut f, &hdr, &[]);
        led.collect(&mut f);
        assert!(led.out.is_empty(), "{op:?}");
        assert_eq!(read_n(&mut s, 3000), a, "{op:?}");
        assert!(host_sees_eof(&mut s), "{op:?}");
    }
}

/// Chains another connection holds for a host that does not read count
/// against the device's bound on deferring, by their sum: with a
/// connection's whole bound held elsewhere, a quarter of the ring is still
/// there to defer into, and a pass's packets still go in one write.
#[test]
fn deferring_shares_the_device_s_bound_with_chains_held_elsewhere() {
    let mut f = faulty_big_credit();
    let l = f.host_listen(9);
    let mut led = Ledger::default();
    let _stuck = f.open_from_guest(&l, 1, 9);
    flood(&mut f, &mut led, 1, FLOOD);
    assert_eq!(f.dev().held_chains(), LIMITS_PER_CONN_CHAINS);
    let mut s = f.open_from_guest(&l, 2, 9);
    let before = f.calls(Op2::Send);
    let mut want = Vec::new();
    for i in 0..8 {
        let d = bytes(PKT, 50 + i);
        led.post(&mut f, &guest_hdr(2, 9, Op::Rw), &d);
        want.extend_from_slice(&d);
    }
    led.collect(&mut f);
    assert_eq!(f.calls(Op2::Send) - before, 1, "the 8 packets in one write");
    assert_eq!(read_n(&mut s, want.len()), want);
    assert_eq!(f.dev().held_chains(), LIMITS_PER_CONN_CHAINS);
}

/// More deferred segments than one `writev` takes: the flush writes on
/// while the socket takes all it is offered, in the same event, and no
/// short write is counted.
#[test]
fn a_flush_goes_on_while_the_socket_takes_all_it_is_offered() {
    let mut f = faulty_big_credit();
    let l = f.host_listen(9);
    let mut s = f.open_from_guest(&l, 1, 9);
    let mut led = Ledger::default();
    let before = f.calls(Op2::Send);
    let mut want = Vec::new();
    // 30 packets of three payload segments: 90 segments, 120 descriptors.
    for i in 0..30 {
        let d = bytes(3000, 70 + i);
        let cuts = [HDR_LEN, HDR_LEN + 1000, HDR_LEN + 2000];
        led.post_cut(&mut f, &guest_hdr(1, 9, Op::Rw), &d, &cuts);
        want.extend_from_slice(&d);
    }
    assert_eq!(led.collect(&mut f), 30);
    assert_eq!(f.calls(Op2::Send) - before, 2, "64 segments, then 26");
    assert_eq!(f.metric(|m| &m.tx_short_writes), 0);
    assert_eq!(read_n(&mut s, want.len()), want);
}
