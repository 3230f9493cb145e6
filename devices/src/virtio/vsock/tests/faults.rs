// SPDX-License-Identifier: Apache-2.0
//! Fault injection on the Unix sockets (EAGAIN, EPIPE, ECONNRESET, short
//! writes, ECONNREFUSED, a failed accept), the bounds of a pass under a
//! flood, and the memory a connection holds for a host that does not read.
//! The oracles: the host receives the guest's bytes exactly once and in
//! order whatever the socket refused; a failed socket resets its connection
//! and nothing else; the device goes idle.

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;

use super::fixture::*;
use crate::virtio::queue::MAX_PASS_READS;
use crate::virtio::vsock::muxer::MAX_QUEUED_RSTS;
use crate::virtio::vsock::packet::{Header, Op, HDR_LEN, MAX_PAYLOAD, SHUTDOWN_SEND};
use crate::virtio::vsock::pass::{PASS_BYTES, PASS_PACKETS, RX_BATCH, RX_BATCH_BYTES};
use crate::virtio::vsock::{Tunables, UnixBackend};

const EAGAIN: Fault = Fault::Errno(libc::EAGAIN);

fn bytes(n: usize, seed: u8) -> Vec<u8> {
    (0..n)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

#[test]
fn refused_and_short_writes_reach_the_host_whole_and_in_order() {
    for faults in [
        vec![EAGAIN],
        vec![Fault::Short(1)],
        vec![Fault::Short(700), EAGAIN],
        vec![EAGAIN, EAGAIN, EAGAIN],
    ] {
        let mut f = VsockFixture::faulty();
        let l = f.host_listen(9);
        let mut s = f.open_from_guest(&l, 1, 9);
        f.dev().backend_mut().inject(Op2::Send, &faults);
        f.dev()
            .backend_mut()
            .inject(Op2::WriteBytes, &[Fault::Short(3)]);
        let a = bytes(2000, 1);
        let b = bytes(1500, 2);
        f.send(&guest_hdr(1, 9, Op::Rw), &a);
        f.send(&guest_hdr(1, 9, Op::Rw), &b);
        f.run_for(20);
        let mut want = a.clone();
        want.extend_from_slice(&b);
        assert_eq!(read_n(&mut s, 3500), want, "{faults:?}");
        assert_eq!(f.dev().pending_bytes(), 0, "{faults:?}");
        assert!(f.metric(|m| &m.tx_short_writes) >= 1, "{faults:?}");
        assert_eq!(f.metric(|m| &m.host_socket_errors), 0);
    }
}

/// A chain may hold more than its header's `len`: only `len` bytes reach
/// the host, the part a short write left over included.
#[test]
fn bytes_past_the_header_s_len_never_reach_the_host_after_a_short_write() {
    let mut f = VsockFixture::faulty();
    let l = f.host_listen(9);
    let mut s = f.open_from_guest(&l, 1, 9);
    f.dev()
        .backend_mut()
        .inject(Op2::Send, &[Fault::Short(700)]);
    let a = bytes(2000, 1);
    let mut chain = a.clone();
    chain.extend_from_slice(&[0xee; 300]);
    let hdr = Header {
        len: 2000,
        ..guest_hdr(1, 9, Op::Rw)
    };
    f.post_tx(&hdr, &chain, &[HDR_LEN]);
    f.run_for(20);
    f.send(&guest_hdr(1, 9, Op::Rw), b"end");
    let mut want = a;
    want.extend_from_slice(b"end");
    assert_eq!(read_n(&mut s, 2003), want);
    assert_eq!(f.metric(|m| &m.tx_short_writes), 1);
    assert_eq!(f.dev().pending_bytes(), 0);
}

#[test]
fn a_guest_shutdown_drains_what_the_host_has_not_taken_then_ends() {
    let mut f = VsockFixture::faulty();
    let l = f.host_listen(9);
    let mut s = f.open_from_guest(&l, 1, 9);
    f.dev().backend_mut().inject(Op2::Send, &[EAGAIN]);
    f.dev().backend_mut().inject(Op2::WriteBytes, &[EAGAIN]);
    let a = bytes(3000, 5);
    f.send(&guest_hdr(1, 9, Op::Rw), &a);
    f.send(
        &Header {
            flags: SHUTDOWN_SEND,
            ..guest_hdr(1, 9, Op::Shutdown)
        },
        &[],
    );
    f.run_for(20);
    assert_eq!(read_n(&mut s, 3000), a);
    assert!(host_sees_eof(&mut s), "the write side is shut once drained");
    assert_eq!(f.dev().connections(), 1, "the host may still send");
    s.write_all(b"late answer").unwrap();
    f.run_until_idle();
    let pkts = f.recv();
    assert_eq!(
        pkts.iter().find(|p| p.op() == Some(Op::Rw)).unwrap().data,
        b"late answer"
    );
}

#[test]
fn a_shutdown_the_host_never_drains_is_reset_at_its_deadline() {
    let mut f = VsockFixture::new();
    let l = f.host_listen(9);
    let _s = f.open_from_guest(&l, 1, 9);
    // More than the socket's buffer, and a host that never reads.
    for i in 0..4 {
        f.send(&guest_hdr(1, 9, Op::Rw), &bytes(60_000, i));
    }
    assert!(f.dev().pending_bytes() > 0, "the socket took it all");
    f.send(
        &Header {
            flags: SHUTDOWN_SEND,
            ..guest_hdr(1, 9, Op::Shutdown)
        },
        &[],
    );
    f.run_for(400);
    assert_eq!(f.metric(|m| &m.conns_timed_out), 1);
    assert_eq!(f.dev().connections(), 0);
    assert!(f.recv().iter().any(|p| p.op() == Some(Op::Rst)));
}

#[test]
fn epipe_and_econnreset_reset_only_their_connection() {
    let mut f = VsockFixture::faulty();
    let l = f.host_listen(9);
    let mut keep = f.open_from_guest(&l, 1, 9);
    let _gone = f.open_from_guest(&l, 2, 9);
    f.dev()
        .backend_mut()
        .inject(Op2::Send, &[Fault::Errno(libc::EPIPE)]);
    f.send(&guest_hdr(2, 9, Op::Rw), b"x");
    let pkts = f.recv();
    assert_eq!(pkts.len(), 1);
    assert_eq!((pkts[0].op(), pkts[0].hdr.dst_port), (Some(Op::Rst), 2));
    f.send(&guest_hdr(1, 9, Op::Rw), b"still here");
    assert_eq!(read_n(&mut keep, 10), b"still here");
    f.dev()
        .backend_mut()
        .inject(Op2::Recv, &[Fault::Errno(libc::ECONNRESET)]);
    keep.write_all(b"y").unwrap();
    f.run_until_idle();
    let pkts = f.recv();
    assert_eq!(
        pkts.iter().map(Pkt::op).collect::<Vec<_>>(),
        [Some(Op::Rst)]
    );
    assert_eq!(f.metric(|m| &m.host_socket_errors), 2);
    assert_eq!(f.dev().connections(), 0);
}

#[test]
fn a_read_with_nothing_after_all_keeps_the_rx_buffer() {
    let mut f = VsockFixture::faulty();
    let l = f.host_listen(9);
    let mut s = f.open_from_guest(&l, 1, 9);
    let before = f.rx_outstanding();
    f.dev().backend_mut().inject(Op2::Recv, &[EAGAIN]);
    s.write_all(b"abc").unwrap();
    f.run_until_idle();
    // The read that found nothing used no buffer; the socket was polled
    // again and the bytes came in the same chain.
    let pkts = f.recv();
    assert_eq!(pkts.len(), 1, "{pkts:?}");
    assert_eq!(pkts[0].data, b"abc");
    assert_eq!(f.rx_outstanding(), before - 1);
    assert_eq!(f.dev().backend_mut().calls[&Op2::Recv], 2);
}

#[test]
fn a_refused_connect_and_a_failed_accept_are_counted_and_survived() {
    let mut f = VsockFixture::faulty();
    let _l = f.host_listen(9);
    f.dev()
        .backend_mut()
        .inject(Op2::Connect, &[Fault::Errno(libc::ECONNREFUSED)]);
    f.post_rx(4, 4096);
    f.send(&guest_hdr(1, 9, Op::Request), &[]);
    assert_eq!(f.recv()[0].op(), Some(Op::Rst));
    assert_eq!(f.metric(|m| &m.conns_refused), 1);
    f.dev()
        .backend_mut()
        .inject(Op2::Accept, &[Fault::Errno(libc::EMFILE)]);
    let mut s = f.host_connect();
    f.run_until_idle();
    assert_eq!(f.metric(|m| &m.host_socket_errors), 1);
    // The connection still waits in the backlog and is taken next time.
    s.write_all(b"CONNECT 5\n").unwrap();
    let _t = f.host_connect();
    f.run_until_idle();
    assert!(f.recv().iter().any(|p| p.op() == Some(Op::Request)));
}

#[test]
fn a_flood_of_packets_for_no_connection_is_bounded() {
    let mut f = VsockFixture::new();
    let total = 1400;
    let mut sent = 0;
    while sent < total {
        for _ in 0..200 {
            let h = Header {
                len: 0,
                ..guest_hdr(sent as u32, 7, Op::Rw)
            };
            f.post_tx(&h, &[], &[]);
            sent += 1;
        }
        f.run_until_idle();
        f.qs[1].used(&f.mem).unwrap();
    }
    assert_eq!(f.dev().queued_rsts(), MAX_QUEUED_RSTS);
    assert_eq!(
        f.metric(|m| &m.rsts_dropped),
        (total - MAX_QUEUED_RSTS) as u64
    );
    assert!(f.metric(|m| &m.queue.max_descs_per_pass) <= u64::from(MAX_PASS_READS));
    f.post_rx(100, 64);
    let pkts = f.recv();
    assert_eq!(pkts.len(), 100);
    assert!(pkts.iter().all(|p| p.op() == Some(Op::Rst)));
}

#[test]
fn a_pass_stops_at_its_descriptor_budget_and_comes_back() {
    use crate::virtio::test_utils::Segment;
    use vm_memory::{Bytes, GuestAddress};
    let mut f = VsockFixture::new();
    // 60 RSTs for no connection, each 200 one-byte descriptors in an
    // indirect table: 202 reads a chain, past the budget in one pass.
    for i in 0..60u32 {
        let hdr = guest_hdr(i, 7, Op::Rst).to_bytes();
        let a = f.alloc(200);
        let mut bytes = hdr.to_vec();
        bytes.resize(200, 0);
        f.mem.write_slice(&bytes, GuestAddress(a)).unwrap();
        let segs: Vec<_> = (0..200)
            .map(|j| Segment::readable(GuestAddress(a + j), 1))
            .collect();
        let table = f.alloc(16 * 200);
        f.qs[1]
            .add_chain_indirect(&f.mem, &segs, 0, GuestAddress(table))
            .unwrap();
    }
    f.qs[1].publish(&f.mem).unwrap();
    f.kick(1);
    f.run_until_idle();
    assert_eq!(f.qs[1].used(&f.mem).unwrap().len(), 60);
    assert_eq!(f.metric(|m| &m.queue.pass_yields), 1);
    assert_eq!(f.metric(|m| &m.tx_packets), 60);
    assert_eq!(f.metric(|m| &m.malformed_packets), 0);
    let max = f.metric(|m| &m.queue.max_descs_per_pass);
    assert!(max >= 8192 && max <= u64::from(MAX_PASS_READS), "{max}");
    assert!(f.recv().is_empty(), "no answer to an RST");
}

/// Reads what `s` has without blocking, running the device between reads,
/// until `n` bytes came (a bounded number of rounds).
fn drain_host(f: &mut VsockFixture<UnixBackend>, s: &mut UnixStream, n: usize) -> Vec<u8> {
    s.set_nonblocking(true).unwrap();
    let mut got = Vec::with_capacity(n);
    let mut buf = vec![0u8; 64 * 1024];
    for _ in 0..10_000 {
        if got.len() >= n {
            break;
        }
        match s.read(&mut buf) {
            Ok(0) => panic!("the host saw EOF after {} of {n} bytes", got.len()),
            Ok(k) => got.extend_from_slice(&buf[..k]),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                f.run_until_idle();
            }
            Err(e) => panic!("host read: {e}"),
        }
    }
    got
}

#[test]
fn a_host_that_never_reads_holds_its_connection_to_buf_alloc_bytes() {
    let buf_alloc = 16 * 1024u32;
    let tun = Tunables {
        buf_alloc,
        ..test_tunables()
    };
    let mut f = VsockFixture::with(tun, UnixBackend, true);
    let l = f.host_listen(9);
    let mut s = f.open_from_guest(&l, 1, 9);
    f.post_rx(8, 4096);
    // An honest guest sends as long as the credit it last heard of allows;
    // far more than the socket's buffer holds, were there no bound.
    let (mut sent, mut fwd_seen) = (0u32, 0u32);
    let mut want = Vec::new();
    for i in 0..4000u32 {
        let credit = buf_alloc - (sent - fwd_seen);
        if credit == 0 {
            break;
        }
        let chunk = bytes(credit.min(4000) as usize, i as u8);
        f.send(&guest_hdr(1, 9, Op::Rw), &chunk);
        sent += chunk.len() as u32;
        want.extend_from_slice(&chunk);
        let held = f.dev().pending_bytes();
        assert!(
            held <= buf_alloc as usize,
            "{held} bytes held past buf_alloc {buf_alloc}"
        );
        for p in f.recv() {
            assert_eq!(p.op(), Some(Op::CreditUpdate));
            assert_eq!(p.hdr.buf_alloc, buf_alloc);
            fwd_seen = p.hdr.fwd_cnt;
            f.post_rx(1, 4096);
        }
    }
    assert_eq!(sent - fwd_seen, buf_alloc, "the guest ran out of credit");
    let held = f.dev().pending_bytes();
    assert!(
        held > 0 && held <= buf_alloc as usize,
        "{held} bytes held: the socket's buffer filled, and no more than the credit"
    );
    assert_eq!(f.metric(|m| &m.credit_exceeded), 0);
    assert!(f.metric(|m| &m.tx_credit_stalls) >= 1);
    // The host reads at last: every byte arrives once and in order, and
    // the guest gets all its credit back.
    let got = drain_host(&mut f, &mut s, want.len());
    assert!(
        got == want,
        "{} of {} bytes, or out of order",
        got.len(),
        want.len()
    );
    assert_eq!(f.dev().pending_bytes(), 0);
    let pkts = f.recv();
    let update = pkts.last().expect("a credit update once drained");
    assert_eq!(update.op(), Some(Op::CreditUpdate));
    assert_eq!(update.hdr.fwd_cnt, sent, "the whole credit back");
    assert_eq!(f.dev().connections(), 1);
}

/// An RW packet with no payload costs the host socket no call.
#[test]
fn an_empty_rw_packet_makes_no_write() {
    let mut f = VsockFixture::faulty();
    let l = f.host_listen(9);
    let _s = f.open_from_guest(&l, 1, 9);
    let before = f.calls(Op2::Send);
    f.send(&guest_hdr(1, 9, Op::Rw), &[]);
    assert_eq!(f.calls(Op2::Send), before);
    f.send(&guest_hdr(1, 9, Op::Rw), b"x");
    assert_eq!(f.calls(Op2::Send), before + 1);
    assert_eq!(f.dev().connections(), 1);
}

/// A chain may be longer than its header says (Linux's never is): the host
/// gets the header's `len` bytes and nothing after them, whether the header
/// has a buffer of its own or shares one with the payload.
#[test]
fn the_host_gets_the_bytes_the_header_counts_not_the_chain_s() {
    let mut f = VsockFixture::new();
    let l = f.host_listen(9);
    let mut s = f.open_from_guest(&l, 1, 9);
    let mut body = b"abc".to_vec();
    body.resize(88, b'!');
    let hdr = Header {
        len: 3,
        ..guest_hdr(1, 9, Op::Rw)
    };
    // 44 + 88 = 44 * 3: the lengths a confused check would take as exact.
    f.post_tx(&hdr, &body, &[HDR_LEN]);
    f.post_tx(&hdr, &body, &[]);
    f.send(&guest_hdr(1, 9, Op::Rw), b"d");
    assert_eq!(read_n(&mut s, 7), b"abcabcd");
    assert_eq!(f.metric(|m| &m.tx_bytes), 7);
}

/// A TX pass stops after `PASS_BYTES` of payload: nine 64 KiB packets
/// posted at once take two passes, the first yielding after eight.
#[test]
fn a_tx_pass_yields_after_its_bytes() {
    let tun = Tunables {
        buf_alloc: 4 << 20,
        ..test_tunables()
    };
    let mut f = VsockFixture::with(tun, UnixBackend, true);
    let l = f.host_listen(9);
    let mut s = f.open_from_guest(&l, 1, 9);
    let yields = f.metric(|m| &m.queue.pass_yields);
    let d = bytes(64 * 1024, 3);
    for _ in 0..9 {
        let hdr = Header {
            len: d.len() as u32,
            ..guest_hdr(1, 9, Op::Rw)
        };
        f.post_tx(&hdr, &d, &[HDR_LEN]);
    }
    f.run_until_idle();
    assert_eq!(f.metric(|m| &m.queue.pass_yields), yields + 1);
    assert_eq!(f.metric(|m| &m.tx_bytes), 9 * 64 * 1024);
    for _ in 0..9 {
        let mut got = vec![0u8; d.len()];
        let mut at = 0;
        while at < got.len() {
            at += s.read(&mut got[at..]).unwrap();
            f.run_until_idle();
        }
        assert!(got == d);
    }
}

/// A guest that shut its sending side with bytes still waiting: once the
/// host has taken them all, the shutdown deadline is off (the host may
/// answer as long as it likes); while the host takes only part and stops,
/// it stays on.
#[test]
fn the_shutdown_deadline_ends_only_when_every_byte_is_taken() {
    // A deadline the hosts' reads below fit in however loaded the machine.
    let tun = Tunables {
        buf_alloc: 4 << 20,
        shutdown_timeout: std::time::Duration::from_secs(1),
        ..test_tunables()
    };
    let mut f = VsockFixture::with(tun, UnixBackend, true);
    let l = f.host_listen(9);
    let shut = |gp| Header {
        flags: SHUTDOWN_SEND,
        ..guest_hdr(gp, 9, Op::Shutdown)
    };
    let d = bytes(60_000, 4);
    let mut hosts = Vec::new();
    for gp in [1, 2] {
        let s = f.open_from_guest(&l, gp, 9);
        for _ in 0..16 {
            f.send(&guest_hdr(gp, 9, Op::Rw), &d);
        }
        assert!(f.dev().pending_bytes() > 0, "the socket took it all");
        f.send(&shut(gp), &[]);
        hosts.push(s);
    }
    // The first host takes everything; the second 300,000 bytes (the
    // device writes more each time the socket has room), then stops.
    let mut buf = vec![0u8; 65536];
    for (h, want) in [(0, 16 * d.len()), (1, 300_000)] {
        let mut all = Vec::new();
        hosts[h].set_nonblocking(true).unwrap();
        while all.len() < want {
            let room = (want - all.len()).min(buf.len());
            match hosts[h].read(&mut buf[..room]) {
                Ok(n) => all.extend_from_slice(&buf[..n]),
                Err(_) => {
                    f.run_until_idle();
                }
            }
        }
        assert!(all[..] == d.repeat(16)[..want]);
    }
    f.run_until_idle();
    assert!(f.dev().pending_bytes() > 0, "the second still waits");
    f.run_for(1200);
    assert_eq!(f.metric(|m| &m.conns_timed_out), 1, "the second only");
    assert_eq!(f.dev().connections(), 1);
    // The first host's answer still reaches the guest (in buffers of its
    // own: the credit updates may have taken the others).
    f.recv();
    f.post_rx(4, 4096);
    hosts[0].set_nonblocking(false).unwrap();
    hosts[0].write_all(b"answer").unwrap();
    f.run_until_idle();
    let pkts = f.recv();
    assert!(
        pkts.iter()
            .any(|p| p.op() == Some(Op::Rw) && p.data == b"answer"),
        "{pkts:?}"
    );
}

/// Uses up the RX buffers the fixture posted, a byte each.
fn use_up_rx(f: &mut VsockFixture<FaultyBackend>, s: &mut UnixStream) {
    while f.rx_outstanding() > 0 {
        s.write_all(b"x").unwrap();
        f.recv();
    }
}

/// The host's bytes fill the RX buffers the guest posted in order, a
/// packet each, with one `readv` for as many as the socket has data for.
#[test]
fn one_read_fills_several_rx_buffers_in_order() {
    let mut f = VsockFixture::faulty();
    let (mut s, host_port) = f.open_from_host(52);
    use_up_rx(&mut f, &mut s);
    f.post_rx(16, 4096);
    let msg = bytes(40_000, 5);
    s.write_all(&msg).unwrap();
    let before = f.calls(Op2::Recv);
    let rx_bytes = f.metric(|m| &m.rx_bytes);
    let pkts = f.recv();
    assert_eq!(f.calls(Op2::Recv) - before, 1, "one read for all of it");
    let lens: Vec<u32> = pkts.iter().map(|p| p.hdr.len).collect();
    assert_eq!(
        lens,
        [4096, 4096, 4096, 4096, 4096, 4096, 4096, 4096, 4096, 3136]
    );
    for p in &pkts {
        assert_eq!(p.op(), Some(Op::Rw));
        assert_eq!((p.hdr.src_port, p.hdr.dst_port), (host_port, 52));
    }
    let got: Vec<u8> = pkts.iter().flat_map(|p| p.data.clone()).collect();
    assert!(got == msg, "in order, each byte once");
    assert_eq!(f.metric(|m| &m.rx_bytes) - rx_bytes, 40_000);
    // The six buffers left carry what comes next, control packets too.
    s.write_all(b"more").unwrap();
    s.shutdown(std::net::Shutdown::Write).unwrap();
    let pkts = f.recv();
    assert_eq!(pkts[0].data, b"more");
    assert_eq!(pkts.last().and_then(Pkt::op), Some(Op::Shutdown));
    assert!(f.rx_outstanding() >= 4, "{}", f.rx_outstanding());
}

/// One read fills at most `RX_BATCH` buffers and `RX_BATCH_BYTES` of room.
#[test]
fn a_read_is_bounded_by_the_batch() {
    let mut f = VsockFixture::faulty();
    let (mut s, _) = f.open_from_host(52);
    use_up_rx(&mut f, &mut s);
    f.dev().backend_mut().recv_room.clear();
    // Small buffers: the batch's count binds.
    f.post_rx(64, 1000);
    let msg = bytes(48_000, 9);
    s.write_all(&msg).unwrap();
    let before = f.calls(Op2::Recv);
    let pkts = f.recv();
    let reads = f.calls(Op2::Recv) - before;
    assert!(
        (3..=4).contains(&reads),
        "{reads} reads for 48 buffers of {RX_BATCH}"
    );
    assert_eq!(pkts.len(), 48);
    assert!(pkts.iter().all(|p| p.hdr.len == 1000));
    // Sixteen buffers of 1000 bytes are the most a read is offered.
    let rooms = std::mem::take(&mut f.dev().backend_mut().recv_room);
    assert_eq!(rooms.iter().max(), Some(&(RX_BATCH * 1000)), "{rooms:?}");
    let got: Vec<u8> = pkts.iter().flat_map(|p| p.data.clone()).collect();
    assert!(got == msg);
    // Large buffers: the batch's room binds.
    f.post_rx(8, 32 * 1024);
    let msg = bytes(200_000, 1);
    s.write_all(&msg).unwrap();
    let before = f.calls(Op2::Recv);
    let mut got = Vec::new();
    while got.len() < msg.len() {
        let pkts = f.recv();
        assert!(!pkts.is_empty(), "stalled at {} bytes", got.len());
        f.post_rx(pkts.len(), 32 * 1024);
        got.extend(pkts.iter().flat_map(|p| p.data.clone()));
    }
    assert!(got == msg);
    let reads = f.calls(Op2::Recv) - before;
    assert!(reads >= 200_000 / RX_BATCH_BYTES as u64, "{reads} reads");
    // Two buffers of 32 KiB are the most room a read is offered.
    let rooms = std::mem::take(&mut f.dev().backend_mut().recv_room);
    assert_eq!(rooms.iter().max(), Some(&RX_BATCH_BYTES), "{rooms:?}");
}

/// Runs the device's loop once, waiting for the host socket's data (one
/// RX pass, which yields by writing an event the loop has not seen yet),
/// and returns the packets it used and whether it yielded.
fn one_rx_pass(f: &mut VsockFixture<FaultyBackend>) -> (Vec<Pkt>, bool) {
    let passes = f.metric(|m| &m.queue.passes);
    let yields = f.metric(|m| &m.queue.pass_yields);
    f.evmgr.run_with_timeout(1000).unwrap();
    assert_eq!(f.metric(|m| &m.queue.passes), passes + 1, "one pass");
    let yielded = f.metric(|m| &m.queue.pass_yields) == yields + 1;
    (f.rx_used(), yielded)
}

/// A device with rings of 1,024 and a host connection that has used up the
/// RX buffers posted so far.
fn big_rings_and_a_connection() -> (VsockFixture<FaultyBackend>, UnixStream) {
    let tun = Tunables {
        queue_size: 1024,
        ..test_tunables()
    };
    let mut f = VsockFixture::with(tun, FaultyBackend::default(), true);
    let (mut s, _) = f.open_from_host(52);
    use_up_rx(&mut f, &mut s);
    (f, s)
}

/// An RX pass ends at `PASS_PACKETS` packets, however many buffers and
/// bytes are left, and the next pass goes on. A first buffer as large as a
/// packet is a batch of its own and puts the batches of 16 out of step
/// with the bound, so the last batch of the pass must stop at the packets
/// the pass has left. The backend fills every read.
#[test]
fn an_rx_pass_ends_at_its_packets() {
    let (mut f, mut s) = big_rings_and_a_connection();
    f.post_rx_shaped(&[HDR_LEN as u32, MAX_PAYLOAD]);
    f.post_rx(399, 100);
    f.run_until_idle();
    f.dev().backend_mut().inject(Op2::Recv, &[Fault::Fill; 26]);
    s.write_all(b"x").unwrap();
    let (first, yielded) = one_rx_pass(&mut f);
    assert_eq!(first.len(), PASS_PACKETS as usize);
    assert!(yielded);
    let lens: Vec<u32> = first.iter().map(|p| p.hdr.len).take(2).collect();
    assert_eq!(lens, [MAX_PAYLOAD, 100]);
    let rest = f.recv();
    assert_eq!(
        rest.len(),
        400 - PASS_PACKETS as usize,
        "the next pass goes on"
    );
    assert!(first
        .iter()
        .chain(&rest)
        .all(|p| p.data.iter().all(|&b| b == 0xab)));
}

/// RX buffers refused (too short for a header) weigh on the pass as
/// packets do: a pass facing 300 of them gives back `PASS_PACKETS` and
/// yields; the next pass goes on.
#[test]
fn refused_rx_buffers_count_against_the_pass_packets() {
    let (mut f, mut s) = big_rings_and_a_connection();
    for _ in 0..300 {
        f.post_rx_shaped(&[8]);
    }
    f.run_until_idle();
    assert_eq!(
        f.metric(|m| &m.malformed_packets),
        0,
        "taken only when needed"
    );
    s.write_all(b"x").unwrap();
    let yields = f.metric(|m| &m.queue.pass_yields);
    f.evmgr.run_with_timeout(1000).unwrap();
    let first = f.qs[0].used(&f.mem).unwrap();
    assert_eq!(first.len(), PASS_PACKETS as usize);
    assert!(first.iter().all(|e| e.len == 0), "{first:?}");
    assert_eq!(f.metric(|m| &m.queue.pass_yields), yields + 1);
    f.run_until_idle();
    let rest = f.qs[0].used(&f.mem).unwrap();
    assert_eq!(rest.len(), 300 - PASS_PACKETS as usize);
    assert_eq!(f.metric(|m| &m.malformed_packets), 300);
}

/// Event buffers refused weigh on the event pass the same way: with a
/// TRANSPORT_RESET owed, 300 buffers too short for the event are given
/// back `PASS_PACKETS` a pass.
#[test]
fn refused_event_buffers_count_against_the_pass_packets() {
    let tun = Tunables {
        queue_size: 1024,
        ..test_tunables()
    };
    let mut f = VsockFixture::with(tun, UnixBackend, true);
    let a = f.alloc(2);
    for _ in 0..300 {
        let seg = crate::virtio::test_utils::Segment::writable(vm_memory::GuestAddress(a), 2);
        f.qs[2].add_chain(&f.mem, &[seg]).unwrap();
    }
    f.qs[2].publish(&f.mem).unwrap();
    f.dev().transport_reset();
    f.evmgr.run_with_timeout(1000).unwrap();
    assert_eq!(f.qs[2].used(&f.mem).unwrap().len(), PASS_PACKETS as usize);
    f.run_until_idle();
    assert_eq!(
        f.qs[2].used(&f.mem).unwrap().len(),
        300 - PASS_PACKETS as usize
    );
    assert_eq!(f.metric(|m| &m.malformed_packets), 300);
    assert_eq!(
        f.metric(|m| &m.transport_resets),
        0,
        "no buffer could hold it"
    );
    assert_eq!(f.metric(|m| &m.queue.queue_errors), 0);
}

/// A TX chain longer than a header and the largest payload is refused,
/// whatever its header says: nothing of it reaches the host.
#[test]
fn a_tx_chain_longer_than_the_largest_packet_is_refused() {
    let mut f = VsockFixture::new();
    let l = f.host_listen(9);
    let mut s = f.open_from_guest(&l, 1, 9);
    let mut hdr = guest_hdr(1, 9, Op::Rw);
    hdr.len = 10;
    let data = vec![7u8; MAX_PAYLOAD as usize + 1];
    f.post_tx(&hdr, &data, &[HDR_LEN]);
    f.run_until_idle();
    assert_eq!(f.metric(|m| &m.malformed_packets), 1);
    assert_eq!(f.metric(|m| &m.tx_bytes), 0);
    // The same header on a chain of exactly the largest packet is taken.
    f.post_tx(&hdr, &data[..MAX_PAYLOAD as usize], &[HDR_LEN]);
    f.run_until_idle();
    assert_eq!(read_n(&mut s, 10), [7u8; 10]);
    assert_eq!(f.metric(|m| &m.malformed_packets), 1);
}

/// An RX pass ends at `PASS_BYTES` of payload with buffers and data left
/// (more than a socket's buffer holds: the backend fills every read).
#[test]
fn an_rx_pass_ends_at_its_bytes() {
    let mut f = VsockFixture::faulty();
    let (mut s, host_port) = f.open_from_host(52);
    use_up_rx(&mut f, &mut s);
    // Credit for all of it.
    let credit = Header {
        buf_alloc: 4 << 20,
        ..guest_hdr(52, host_port, Op::CreditUpdate)
    };
    f.send(&credit, &[]);
    f.post_rx(100, 8192);
    f.run_until_idle();
    f.dev().backend_mut().inject(Op2::Recv, &[Fault::Fill; 13]);
    s.write_all(b"x").unwrap();
    let (first, yielded) = one_rx_pass(&mut f);
    let bytes_of = |p: &[Pkt]| p.iter().map(|p| u64::from(p.hdr.len)).sum::<u64>();
    assert_eq!(bytes_of(&first), PASS_BYTES);
    assert_eq!(first.len(), 64);
    assert!(yielded);
    let rest = f.recv();
    assert_eq!(bytes_of(&rest), 36 * 8192, "the next pass goes on");
    assert!(first
        .iter()
        .chain(&rest)
        .all(|p| p.data.iter().all(|&b| b == 0xab)));
}

/// A guest with room for two and a half buffers gets exactly that, in one
/// read, then is asked for credit.
#[test]
fn a_read_into_several_buffers_stops_at_the_guest_s_credit() {
    let mut f = VsockFixture::faulty();
    let l = f.host_listen(9);
    f.send(
        &Header {
            buf_alloc: 2500,
            ..guest_hdr(7, 9, Op::Request)
        },
        &[],
    );
    f.post_rx(16, 1000);
    assert_eq!(f.recv()[0].op(), Some(Op::Response));
    let (mut g, _) = l.accept().unwrap();
    g.write_all(&bytes(10_000, 2)).unwrap();
    let before = f.calls(Op2::Recv);
    let pkts = f.recv();
    assert_eq!(f.calls(Op2::Recv) - before, 1);
    let lens: Vec<_> = pkts.iter().map(|p| (p.op(), p.hdr.len)).collect();
    assert_eq!(
        lens,
        [
            (Some(Op::Rw), 1000),
            (Some(Op::Rw), 1000),
            (Some(Op::Rw), 500),
            (Some(Op::CreditRequest), 0)
        ]
    );
}
