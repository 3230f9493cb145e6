// SPDX-License-Identifier: Apache-2.0
//! Connections both ways with Firecracker's host protocol, credit, the end
//! of a connection, time-outs and the cap, and TRANSPORT_RESET.

use std::io::{Read, Write};

use super::fixture::*;
use crate::virtio::vsock::packet::{Op, HDR_LEN, SHUTDOWN_RCV, SHUTDOWN_SEND};
use crate::virtio::vsock::{Tunables, UnixBackend};
use crate::virtio::VirtioDevice;

#[test]
fn a_host_connect_reaches_the_guest_and_data_flows_both_ways() {
    let mut f = VsockFixture::new();
    let (mut s, host_port) = f.open_from_host(52);
    assert!(host_port >= 1 << 30, "host ports start at 1 << 30");
    assert_eq!(f.metric(|m| &m.conns_opened_host), 1);
    // Host to guest.
    s.write_all(b"ping from the host").unwrap();
    f.run_until_idle();
    let pkts = f.recv();
    assert_eq!(pkts.len(), 1);
    assert_eq!(pkts[0].op(), Some(Op::Rw));
    assert_eq!(pkts[0].data, b"ping from the host");
    assert_eq!((pkts[0].hdr.src_cid, pkts[0].hdr.dst_cid), (2, CID));
    assert_eq!(
        (pkts[0].hdr.src_port, pkts[0].hdr.dst_port),
        (host_port, 52)
    );
    assert_eq!(pkts[0].hdr.buf_alloc, Tunables::default().buf_alloc);
    // Guest to host.
    f.send(&guest_hdr(52, host_port, Op::Rw), b"pong from the guest");
    assert_eq!(read_n(&mut s, 19), b"pong from the guest");
    assert_eq!(f.metric(|m| &m.tx_bytes), 19);
    assert_eq!(f.metric(|m| &m.rx_bytes), 18);
    // The guest closes both ways: the host sees EOF, the guest gets RST.
    f.send(
        &Header {
            flags: SHUTDOWN_RCV | SHUTDOWN_SEND,
            ..guest_hdr(52, host_port, Op::Shutdown)
        },
        &[],
    );
    assert!(host_sees_eof(&mut s));
    let pkts = f.recv();
    assert_eq!(
        pkts.iter().map(Pkt::op).collect::<Vec<_>>(),
        [Some(Op::Rst)]
    );
    assert_eq!(f.dev().connections(), 0);
    assert_eq!(f.metric(|m| &m.conns_closed), 1);
}

use crate::virtio::vsock::packet::Header;

#[test]
fn a_guest_connect_reaches_the_host_listener_at_uds_path_port() {
    let mut f = VsockFixture::new();
    let l = f.host_listen(1234);
    let mut s = f.open_from_guest(&l, 5000, 1234);
    assert_eq!(f.metric(|m| &m.conns_opened_guest), 1);
    f.send(&guest_hdr(5000, 1234, Op::Rw), b"hello host");
    assert_eq!(read_n(&mut s, 10), b"hello host");
    s.write_all(b"hello guest").unwrap();
    f.run_until_idle();
    let pkts = f.recv();
    assert_eq!(pkts[0].data, b"hello guest");
    // The host closes: the guest hears SHUTDOWN SEND, and may still send
    // (half-close) until the host's socket refuses.
    drop(s);
    f.run_until_idle();
    let pkts = f.recv();
    assert_eq!(pkts.len(), 1, "{pkts:?}");
    assert_eq!(pkts[0].op(), Some(Op::Shutdown));
    assert_eq!(pkts[0].hdr.flags, SHUTDOWN_SEND);
    // The guest shuts down its sending side: nothing can flow, RST.
    f.send(
        &Header {
            flags: SHUTDOWN_SEND,
            ..guest_hdr(5000, 1234, Op::Shutdown)
        },
        &[],
    );
    let pkts = f.recv();
    assert_eq!(
        pkts.iter().map(Pkt::op).collect::<Vec<_>>(),
        [Some(Op::Rst)]
    );
    assert_eq!(f.dev().connections(), 0);
}

#[test]
fn a_half_closed_host_still_receives_the_guest_s_answer() {
    let mut f = VsockFixture::new();
    let (mut s, hp) = f.open_from_host(80);
    s.write_all(b"GET /").unwrap();
    s.shutdown(std::net::Shutdown::Write).unwrap();
    f.run_until_idle();
    let ops: Vec<_> = f.recv().iter().map(|p| (p.op(), p.data.clone())).collect();
    assert_eq!(
        ops,
        [
            (Some(Op::Rw), b"GET /".to_vec()),
            (Some(Op::Shutdown), vec![])
        ]
    );
    f.send(&guest_hdr(80, hp, Op::Rw), b"200 OK");
    assert_eq!(read_n(&mut s, 6), b"200 OK");
    f.send(
        &Header {
            flags: SHUTDOWN_SEND,
            ..guest_hdr(80, hp, Op::Shutdown)
        },
        &[],
    );
    assert!(host_sees_eof(&mut s));
    assert_eq!(f.recv()[0].op(), Some(Op::Rst));
}

#[test]
fn a_guest_connect_to_nothing_is_answered_rst_and_counted() {
    let mut f = VsockFixture::new();
    f.post_rx(4, 4096);
    f.send(&guest_hdr(5000, 9999, Op::Request), &[]);
    let pkts = f.recv();
    assert_eq!(pkts.len(), 1);
    assert_eq!(pkts[0].op(), Some(Op::Rst));
    assert_eq!((pkts[0].hdr.src_port, pkts[0].hdr.dst_port), (9999, 5000));
    assert_eq!(f.metric(|m| &m.conns_refused), 1);
    assert_eq!(f.dev().connections(), 0);
}

#[test]
fn the_guest_s_rst_closes_the_host_socket() {
    let mut f = VsockFixture::new();
    let l = f.host_listen(7);
    let mut s = f.open_from_guest(&l, 1, 7);
    f.send(&guest_hdr(1, 7, Op::Rst), &[]);
    assert!(host_sees_eof(&mut s));
    assert_eq!(f.metric(|m| &m.rsts_received), 1);
    assert!(f.recv().is_empty(), "no answer to an RST");
    assert_eq!(f.dev().connections(), 0);
    assert_eq!(
        f.dev().sockets_closing(),
        0,
        "closed once out of the poll set"
    );
}

/// Packets of interleaved connections reach their own sockets, and a
/// closed connection's key never reaches the connection that took its slot
/// (the muxer remembers the last connection a packet was for).
#[test]
fn packets_reach_their_own_connection_and_never_a_closed_one_s_successor() {
    let mut f = VsockFixture::new();
    let l = f.host_listen(1234);
    let mut a = f.open_from_guest(&l, 5000, 1234);
    let mut b = f.open_from_guest(&l, 5001, 1234);
    for (port, data) in [(5000, b"to a 1"), (5001, b"to b 1"), (5000, b"to a 2")] {
        f.send(&guest_hdr(port, 1234, Op::Rw), data);
    }
    assert_eq!(read_n(&mut a, 12), b"to a 1to a 2");
    assert_eq!(read_n(&mut b, 6), b"to b 1");
    // A is closed by the guest; C takes its slot.
    f.send(&guest_hdr(5000, 1234, Op::Rst), &[]);
    assert!(host_sees_eof(&mut a));
    let mut c = f.open_from_guest(&l, 5002, 1234);
    f.post_rx(4, 4096);
    f.send(&guest_hdr(5000, 1234, Op::Rw), b"stale");
    let pkts = f.recv();
    assert_eq!(
        pkts.iter().map(Pkt::op).collect::<Vec<_>>(),
        [Some(Op::Rst)]
    );
    assert_eq!((pkts[0].hdr.src_port, pkts[0].hdr.dst_port), (1234, 5000));
    f.send(&guest_hdr(5002, 1234, Op::Rw), b"to c");
    assert_eq!(read_n(&mut c, 4), b"to c", "C got nothing of A's key");
    assert_eq!(f.dev().connections(), 2);
}

#[test]
fn a_guest_refusing_a_host_connect_closes_it() {
    let mut f = VsockFixture::new();
    let mut s = f.host_connect();
    s.write_all(b"CONNECT 99\n").unwrap();
    f.run_until_idle();
    f.post_rx(2, 4096);
    let req = f.recv();
    assert_eq!(req[0].op(), Some(Op::Request));
    f.send(&guest_hdr(99, req[0].hdr.src_port, Op::Rst), &[]);
    assert!(host_sees_eof(&mut s));
    assert_eq!(f.metric(|m| &m.conns_opened_host), 0);
}

#[test]
fn a_connect_the_guest_never_answers_times_out() {
    let mut f = VsockFixture::new();
    let mut s = f.host_connect();
    s.write_all(b"CONNECT 99\n").unwrap();
    f.post_rx(2, 4096);
    let req = f.recv();
    assert_eq!(req[0].op(), Some(Op::Request));
    f.run_for(400);
    assert!(host_sees_eof(&mut s));
    assert_eq!(f.metric(|m| &m.conns_timed_out), 1);
    assert_eq!(f.metric(|m| &m.conns_refused), 1);
    // The guest is told to forget the request.
    let pkts = f.recv();
    assert_eq!(
        pkts.iter().map(Pkt::op).collect::<Vec<_>>(),
        [Some(Op::Rst)]
    );
    // A host that never sends its line is closed too.
    let mut quiet = f.host_connect();
    f.run_for(400);
    assert!(host_sees_eof(&mut quiet));
    assert_eq!(f.metric(|m| &m.conns_timed_out), 2);
    assert!(f.recv().is_empty(), "the guest never knew of it");
    assert_eq!(f.dev().connections(), 0);
}

#[test]
fn bad_connect_lines_and_connects_before_the_driver_is_up_are_closed() {
    for line in [
        &b"CONNECT x\n"[..],
        b"HELLO 52\n",
        b"CONNECT 52 extra words\n",
    ] {
        let mut f = VsockFixture::new();
        let mut s = f.host_connect();
        s.write_all(line).unwrap();
        f.run_until_idle();
        assert!(host_sees_eof(&mut s), "{line:?}");
        assert_eq!(f.metric(|m| &m.bad_connect_lines), 1, "{line:?}");
    }
    let mut long = VsockFixture::new();
    let mut s = long.host_connect();
    s.write_all(&[b'7'; 100]).unwrap();
    long.run_until_idle();
    assert!(host_sees_eof(&mut s));
    assert_eq!(long.metric(|m| &m.bad_connect_lines), 1);

    let mut idle = VsockFixture::with(test_tunables(), UnixBackend, false);
    let mut s = idle.host_connect();
    s.write_all(b"CONNECT 52\n").unwrap();
    idle.run_until_idle();
    assert!(host_sees_eof(&mut s));
    assert_eq!(idle.metric(|m| &m.conns_refused), 1);
}

#[test]
fn data_sent_right_after_the_connect_line_is_not_lost() {
    let mut f = VsockFixture::new();
    let mut s = f.host_connect();
    s.write_all(b"CONNECT 52\nearly bytes").unwrap();
    f.run_until_idle();
    f.post_rx(4, 4096);
    let req = f.recv();
    assert_eq!(req.len(), 1);
    let hp = req[0].hdr.src_port;
    f.send(&guest_hdr(52, hp, Op::Response), &[]);
    let pkts = f.recv();
    assert_eq!(pkts.len(), 1, "{pkts:?}");
    assert_eq!(pkts[0].data, b"early bytes");
    let mut ok = [0u8; 32];
    let n = s.read(&mut ok).unwrap();
    assert_eq!(&ok[..n], format!("OK {hp}\n").as_bytes());
}

#[test]
fn the_guest_never_gets_more_than_its_credit() {
    let mut f = VsockFixture::new();
    let l = f.host_listen(9);
    f.send(
        &Header {
            buf_alloc: 1000,
            ..guest_hdr(1, 9, Op::Request)
        },
        &[],
    );
    f.post_rx(16, 4096);
    assert_eq!(f.recv()[0].op(), Some(Op::Response));
    let (mut s, _) = l.accept().unwrap();
    s.write_all(&[7u8; 5000]).unwrap();
    f.run_until_idle();
    let pkts = f.recv();
    let data: usize = pkts.iter().map(|p| p.data.len()).sum();
    assert_eq!(data, 1000, "exactly its buffer");
    // Out of credit, the device asks once.
    let asks = pkts
        .iter()
        .filter(|p| p.op() == Some(Op::CreditRequest))
        .count();
    assert_eq!(asks, 1, "{pkts:?}");
    assert_eq!(f.metric(|m| &m.rx_credit_stalls), 1);
    // The guest took 600 bytes: 600 more come.
    f.send(
        &Header {
            buf_alloc: 1000,
            fwd_cnt: 600,
            ..guest_hdr(1, 9, Op::CreditUpdate)
        },
        &[],
    );
    let data: usize = f.recv().iter().map(|p| p.data.len()).sum();
    assert_eq!(data, 600);
    let view = f.dev().credit_view();
    assert_eq!(view[0].3, 1000, "in flight never above the guest's buffer");
}

#[test]
fn a_guest_past_its_credit_is_reset() {
    let tun = Tunables {
        buf_alloc: 4096,
        ..test_tunables()
    };
    let mut f = VsockFixture::with(tun, UnixBackend, true);
    let l = f.host_listen(9);
    let mut s = f.open_from_guest(&l, 1, 9);
    f.send(&guest_hdr(1, 9, Op::Rw), &[1u8; 3000]);
    // Half the buffer forwarded: the guest is told unasked.
    let pkts = f.recv();
    assert_eq!(pkts.len(), 1);
    assert_eq!(pkts[0].op(), Some(Op::CreditUpdate));
    assert_eq!((pkts[0].hdr.buf_alloc, pkts[0].hdr.fwd_cnt), (4096, 3000));
    // Its whole credit is 4096 bytes again; 5000 is past it.
    f.send(&guest_hdr(1, 9, Op::Rw), &[2u8; 5000]);
    assert_eq!(f.metric(|m| &m.credit_exceeded), 1);
    assert_eq!(read_n(&mut s, 3000), [1u8; 3000]);
    assert!(
        host_sees_eof(&mut s),
        "nothing past the credit reaches the host"
    );
    f.post_rx(4, 4096);
    let ops: Vec<_> = f.recv().iter().map(Pkt::op).collect();
    assert_eq!(ops.last(), Some(&Some(Op::Rst)), "{ops:?}");
}

#[test]
fn credit_updates_keep_a_streaming_guest_going() {
    let tun = Tunables {
        buf_alloc: 8192,
        ..test_tunables()
    };
    let mut f = VsockFixture::with(tun, UnixBackend, true);
    let l = f.host_listen(9);
    let mut s = f.open_from_guest(&l, 1, 9);
    f.post_rx(16, 4096);
    let mut credit = 8192u32;
    let mut sent = 0u32;
    let mut fwd_seen = 0u32;
    for i in 0..40u8 {
        let chunk = [i; 1000];
        assert!(credit >= 1000, "the guest ran out of credit at packet {i}");
        f.send(&guest_hdr(1, 9, Op::Rw), &chunk);
        sent += 1000;
        assert_eq!(read_n(&mut s, 1000), chunk);
        for p in f.recv() {
            assert_eq!(p.op(), Some(Op::CreditUpdate));
            fwd_seen = p.hdr.fwd_cnt;
            f.post_rx(1, 4096);
        }
        credit = 8192 - (sent - fwd_seen);
    }
    assert_eq!(f.metric(|m| &m.credit_exceeded), 0);
    assert_eq!(f.metric(|m| &m.tx_bytes), 40_000);
}

/// A guest whose own buffer is smaller than the device's sends no more than
/// its own ahead (Linux 6.1.172 does): the device's updates come at half of
/// that, so it never waits for one with everything it may send in flight.
#[test]
fn a_guest_with_a_smaller_buffer_than_the_device_s_keeps_streaming() {
    let mut f = VsockFixture::new();
    let l = f.host_listen(9);
    let own = 16 * 1024u32;
    let hdr = |op| Header {
        buf_alloc: own,
        ..guest_hdr(1, 9, op)
    };
    f.send(&hdr(Op::Request), &[]);
    f.post_rx(16, 4096);
    let resp = f.recv();
    assert_eq!(resp[0].op(), Some(Op::Response));
    let (mut s, _) = l.accept().unwrap();
    s.set_read_timeout(Some(std::time::Duration::from_secs(2)))
        .unwrap();
    let (mut sent, mut fwd_seen, mut buf_seen) = (0u32, 0u32, resp[0].hdr.buf_alloc);
    assert!(buf_seen > 2 * own, "the device's buffer is the larger");
    for i in 0..100u8 {
        let credit = buf_seen.min(own) - (sent - fwd_seen);
        assert!(
            credit >= 1000,
            "the guest waits for an update at packet {i}"
        );
        f.send(&hdr(Op::Rw), &[i; 1000]);
        sent += 1000;
        assert_eq!(read_n(&mut s, 1000), [i; 1000]);
        for p in f.recv() {
            assert_eq!(p.op(), Some(Op::CreditUpdate));
            fwd_seen = p.hdr.fwd_cnt;
            buf_seen = p.hdr.buf_alloc;
            f.post_rx(1, 4096);
        }
    }
    assert_eq!(f.metric(|m| &m.credit_exceeded), 0);
}

/// An unknown op or socket type on a live connection's key resets the
/// connection both ways: the guest gets the RST, the host socket is closed.
#[test]
fn an_unknown_op_or_type_on_a_connection_resets_it() {
    let mut f = VsockFixture::new();
    let l = f.host_listen(1234);
    for (n, port) in [(1u64, 5000), (2, 5001)] {
        let mut s = f.open_from_guest(&l, port, 1234);
        f.post_rx(4, 4096);
        let hdr = if n == 1 {
            Header {
                op: 42,
                ..guest_hdr(port, 1234, Op::Rw)
            }
        } else {
            Header {
                kind: 2,
                ..guest_hdr(port, 1234, Op::Rw)
            }
        };
        f.send(&hdr, b"junk");
        let pkts = f.recv();
        assert_eq!(
            pkts.iter().map(Pkt::op).collect::<Vec<_>>(),
            [Some(Op::Rst)]
        );
        assert!(host_sees_eof(&mut s), "the host socket is closed");
        assert_eq!(f.dev().connections(), 0);
        assert_eq!(f.metric(|m| &m.unknown_ops) + f.metric(|m| &m.bad_types), n);
    }
}

#[test]
fn unknown_ops_and_types_are_answered_rst_bad_headers_dropped() {
    let mut f = VsockFixture::new();
    f.post_rx(16, 4096);
    f.send(
        &Header {
            op: 42,
            ..guest_hdr(1, 2, Op::Rw)
        },
        &[],
    );
    f.send(
        &Header {
            kind: 2,
            ..guest_hdr(1, 2, Op::Request)
        },
        &[],
    );
    assert_eq!(f.metric(|m| &m.unknown_ops), 1);
    assert_eq!(f.metric(|m| &m.bad_types), 1);
    let ops: Vec<_> = f.recv().iter().map(Pkt::op).collect();
    assert_eq!(ops, [Some(Op::Rst), Some(Op::Rst)]);
    // Not from the guest's CID, not to the host, a length past the chain:
    // dropped and counted, never answered.
    let bad_src = Header {
        src_cid: 4,
        ..guest_hdr(1, 2, Op::Request)
    };
    let bad_dst = Header {
        dst_cid: 1,
        ..guest_hdr(1, 2, Op::Request)
    };
    f.send(&bad_src, &[]);
    f.send(&bad_dst, &[]);
    let long = Header {
        len: 100,
        ..guest_hdr(1, 2, Op::Rw)
    };
    f.post_tx(&long, &[0u8; 50], &[]);
    f.run_until_idle();
    // A chain shorter than the header.
    let a = f.alloc(20);
    let seg = crate::virtio::test_utils::Segment::readable(vm_memory::GuestAddress(a), 20);
    f.qs[1].add_chain(&f.mem, &[seg]).unwrap();
    f.qs[1].publish(&f.mem).unwrap();
    f.kick(1);
    f.run_until_idle();
    assert_eq!(f.metric(|m| &m.malformed_packets), 4);
    assert!(f.recv().is_empty());
    // A header cut across descriptors is read whole: an RW for no
    // connection, answered RST.
    f.post_tx(&guest_hdr(1, 2, Op::Rw), &[], &[1, 20, 43]);
    f.run_until_idle();
    assert_eq!(
        f.recv().iter().map(Pkt::op).collect::<Vec<_>>(),
        [Some(Op::Rst)]
    );
    // RW, SHUTDOWN, RESPONSE for no connection: RST; an RST: nothing.
    for op in [Op::Rw, Op::Shutdown, Op::Response, Op::CreditUpdate] {
        f.send(&guest_hdr(1, 2, op), &[]);
    }
    f.send(&guest_hdr(1, 2, Op::Rst), &[]);
    assert_eq!(f.recv().len(), 4);
}

#[test]
fn the_connection_cap_refuses_both_ways_and_counts() {
    let tun = Tunables {
        max_connections: 2,
        ..test_tunables()
    };
    let mut f = VsockFixture::with(tun, UnixBackend, true);
    let l = f.host_listen(9);
    let _a = f.open_from_guest(&l, 1, 9);
    let (_b, _) = f.open_from_host(10);
    f.send(&guest_hdr(3, 9, Op::Request), &[]);
    let pkts = f.recv();
    assert_eq!(pkts[0].op(), Some(Op::Rst));
    let mut c = f.host_connect();
    f.run_until_idle();
    assert!(host_sees_eof(&mut c));
    assert_eq!(f.metric(|m| &m.conns_capped), 2);
    assert_eq!(f.metric(|m| &m.conns_active), 2);
    assert_eq!(f.dev().connections(), 2);
}

#[test]
fn a_dead_host_peer_resets_the_connection() {
    let mut f = VsockFixture::new();
    let l = f.host_listen(9);
    let s = f.open_from_guest(&l, 1, 9);
    drop(s);
    f.run_until_idle();
    assert_eq!(f.recv()[0].op(), Some(Op::Shutdown));
    f.send(&guest_hdr(1, 9, Op::Rw), b"anyone there?");
    assert_eq!(f.metric(|m| &m.host_socket_errors), 1);
    assert_eq!(f.recv()[0].op(), Some(Op::Rst));
    assert_eq!(f.dev().connections(), 0);
}

#[test]
fn a_transport_reset_reaches_the_event_queue_and_closes_everything() {
    let mut f = VsockFixture::new();
    let (mut s, _) = f.open_from_host(52);
    f.dev().transport_reset();
    // Out of service at once; closed once the loop took it out of epoll.
    assert_eq!(f.dev().sockets_closing(), 1);
    f.run_until_idle();
    assert_eq!(f.dev().sockets_closing(), 0);
    assert!(host_sees_eof(&mut s));
    assert_eq!(f.dev().connections(), 0);
    assert_eq!(f.metric(|m| &m.transport_resets), 0, "no event buffer yet");
    assert_eq!(
        f.read_event(),
        Some(0),
        "VIRTIO_VSOCK_EVENT_TRANSPORT_RESET"
    );
    assert_eq!(f.metric(|m| &m.transport_resets), 1);
}

#[test]
fn a_reset_closes_every_host_socket() {
    let mut f = VsockFixture::new();
    let (mut s, _) = f.open_from_host(52);
    assert!(f.dev().is_activated());
    f.dev().reset();
    assert!(!f.dev().is_activated());
    f.run_until_idle();
    assert!(host_sees_eof(&mut s));
    assert_eq!(f.dev().connections(), 0);
    assert_eq!(f.metric(|m| &m.conns_active), 0);
    f.activate(FEATURES);
    assert!(f.dev().is_activated());
    let (_s, _) = f.open_from_host(53);
}

#[test]
fn rx_chains_of_any_shape_carry_the_header_and_data() {
    for shape in [
        &[4140u32][..],
        &[10, 34, 4096],
        &[44, 1, 1, 4094],
        &[50, 50, 4040],
    ] {
        let mut f = VsockFixture::new();
        let l = f.host_listen(9);
        let mut s = f.open_from_guest(&l, 1, 9);
        // Use the eight chains open_from_guest posted first.
        while f.rx_outstanding() > 0 {
            s.write_all(b"x").unwrap();
            f.run_until_idle();
            f.recv();
        }
        f.post_rx_shaped(shape);
        let msg: Vec<u8> = (0..4096u32).map(|i| (i * 7) as u8).collect();
        s.write_all(&msg).unwrap();
        f.run_until_idle();
        let pkts = f.recv();
        assert_eq!(pkts.len(), 1, "{shape:?}");
        assert_eq!(pkts[0].data, msg, "{shape:?}");
    }
}

/// A header-only RX chain could carry no data: with data waiting, it is
/// refused (given back with length 0, counted) rather than kept, and the
/// loop goes idle; the data goes into the next chain with room.
#[test]
fn a_header_only_rx_chain_is_refused_and_the_data_waits_for_room() {
    let mut f = VsockFixture::new();
    let l = f.host_listen(9);
    let mut s = f.open_from_guest(&l, 1, 9);
    while f.rx_outstanding() > 0 {
        s.write_all(b"x").unwrap();
        f.run_until_idle();
        f.recv();
    }
    s.write_all(b"data").unwrap();
    f.post_rx_shaped(&[HDR_LEN as u32]);
    f.post_rx_shaped(&[20, HDR_LEN as u32 - 20]);
    assert_eq!(f.rx_refused().len(), 2);
    assert_eq!(f.metric(|m| &m.malformed_packets), 2);
    f.post_rx(1, 4096);
    let pkts = f.recv();
    assert_eq!(pkts.len(), 1);
    assert_eq!(pkts[0].data, b"data");
}

#[test]
fn the_configuration_space_holds_the_guest_cid() {
    let f = VsockFixture::new();
    let mut b = [0u8; 8];
    f.dev().read_config(0, &mut b);
    assert_eq!(u64::from_le_bytes(b), CID);
    let mut hi = [0u8; 4];
    f.dev().read_config(4, &mut hi);
    assert_eq!(hi, [0; 4]);
    f.dev().write_config(0, &[9; 8]);
    f.dev().read_config(0, &mut b);
    assert_eq!(u64::from_le_bytes(b), CID, "read-only");
    assert_eq!(f.metric(|m| &m.config_writes_ignored), 1);
    assert_eq!(f.dev().device_type(), 19);
    assert_eq!(f.dev().queue_max_sizes().len(), 3);
}

/// A REQUEST for a connection that is live resets it at both ends: an RST
/// to the guest and the host socket closed, counted as a protocol error.
#[test]
fn a_second_request_on_a_live_connection_resets_both_ends() {
    let mut f = VsockFixture::new();
    let l = f.host_listen(9);
    let mut s = f.open_from_guest(&l, 1, 9);
    f.send(&guest_hdr(1, 9, Op::Request), &[]);
    let pkts = f.recv();
    assert_eq!(pkts.len(), 1, "{pkts:?}");
    assert_eq!(pkts[0].op(), Some(Op::Rst));
    assert_eq!((pkts[0].hdr.src_port, pkts[0].hdr.dst_port), (9, 1));
    assert!(host_sees_eof(&mut s));
    assert_eq!(f.dev().connections(), 0);
    assert_eq!(f.metric(|m| &m.protocol_errors), 1);
}

/// A guest that shuts down only its receiving side may still send; one
/// that shuts its sending side with nothing waiting for the host gets no
/// deadline: the host may answer for as long as it likes.
#[test]
fn a_shutdown_sets_only_the_directions_it_names_and_no_deadline_with_nothing_waiting() {
    let mut f = VsockFixture::new();
    let l = f.host_listen(9);
    let mut s = f.open_from_guest(&l, 1, 9);
    let rcv = Header {
        flags: SHUTDOWN_RCV,
        ..guest_hdr(1, 9, Op::Shutdown)
    };
    f.send(&rcv, &[]);
    f.send(&guest_hdr(1, 9, Op::Rw), b"still sending");
    assert_eq!(read_n(&mut s, 13), b"still sending");
    assert_eq!(f.metric(|m| &m.protocol_errors), 0);
    let mut t = f.open_from_guest(&l, 2, 9);
    let send = Header {
        flags: SHUTDOWN_SEND,
        ..guest_hdr(2, 9, Op::Shutdown)
    };
    f.send(&send, &[]);
    assert!(host_sees_eof(&mut t));
    // Past the shutdown time-out (200 ms in the tests) both are there.
    f.run_for(400);
    assert_eq!(f.metric(|m| &m.conns_timed_out), 0);
    assert_eq!(f.dev().connections(), 2);
}

/// A CID a guest cannot have, a queue size that is not a power of two and
/// bounds of zero are refused, before the socket is bound; the edges that
/// are allowed build.
#[test]
fn bad_configurations_and_bounds_are_refused_before_the_socket_is_bound() {
    use crate::virtio::vsock::{Vsock, VsockConfig, VsockError};
    let dir = TempDir::new();
    let uds = dir.0.join("v.sock");
    let mem = crate::virtio::test_utils::guest_memory(1 << 20).unwrap();
    let build = |cid: u64, tun: Tunables| {
        let cfg = VsockConfig {
            id: "vsock0".into(),
            guest_cid: cid,
            uds_path: uds.clone(),
        };
        let r = Vsock::with_backend(cfg, tun, mem.clone(), UnixBackend).map(|_| ());
        let bound = uds.exists();
        let _ = std::fs::remove_file(&uds);
        (r, bound)
    };
    let t = test_tunables();
    for cid in [0, 1, 2, u64::from(u32::MAX), u64::MAX] {
        let (r, bound) = build(cid, t);
        assert!(
            matches!(r, Err(VsockError::Cid(c)) if c == cid),
            "{cid}: {r:?}"
        );
        assert!(!bound, "{cid}");
    }
    let bad = [
        Tunables { queue_size: 0, ..t },
        Tunables { queue_size: 3, ..t },
        Tunables {
            queue_size: 768,
            ..t
        },
        Tunables {
            max_connections: 0,
            ..t
        },
        Tunables { buf_alloc: 0, ..t },
    ];
    for tun in bad {
        let (r, bound) = build(3, tun);
        assert!(matches!(r, Err(VsockError::Tunables(_))), "{tun:?}: {r:?}");
        assert!(!bound, "{tun:?}");
    }
    for (cid, queue_size) in [(3, 1), (u64::from(u32::MAX) - 1, 32768)] {
        let (r, bound) = build(cid, Tunables { queue_size, ..t });
        assert!(r.is_ok() && bound, "{cid}, {queue_size}: {r:?}");
    }
}

/// A host agent that connects and sends its `CONNECT` line before the
/// driver is ready is refused, as by a guest that listens on nothing (and
/// no pass runs on rings that are not there); once the device is
/// activated the next one goes through.
#[test]
fn a_connect_before_activation_is_refused_and_the_next_goes_through() {
    let mut f = VsockFixture::with(test_tunables(), UnixBackend, false);
    let mut s = f.host_connect();
    s.write_all(b"CONNECT 52\n").unwrap();
    f.run_until_idle();
    assert!(host_sees_eof(&mut s));
    assert_eq!(f.metric(|m| &m.conns_refused), 1);
    assert_eq!(f.dev().connections(), 0);
    f.activate(FEATURES);
    let (_s, _) = f.open_from_host(52);
}

/// A restored device tells the guest to forget its connections: the
/// TRANSPORT_RESET goes into the first event buffer.
#[test]
fn a_restored_device_resets_the_transport() {
    let mut f = VsockFixture::new();
    f.dev().restored();
    assert_eq!(
        f.read_event(),
        Some(0),
        "VIRTIO_VSOCK_EVENT_TRANSPORT_RESET"
    );
    assert_eq!(f.metric(|m| &m.transport_resets), 1);
}

/// Data after the guest shut down its sending side is out of protocol: the
/// connection is reset both ways and counted.
#[test]
fn data_after_the_guest_s_shutdown_resets_the_connection() {
    let mut f = VsockFixture::new();
    let l = f.host_listen(9);
    let mut s = f.open_from_guest(&l, 1, 9);
    f.send(
        &Header {
            flags: SHUTDOWN_SEND,
            ..guest_hdr(1, 9, Op::Shutdown)
        },
        &[],
    );
    f.send(&guest_hdr(1, 9, Op::Rw), b"late");
    assert!(host_sees_eof(&mut s));
    let ops: Vec<_> = f.recv().iter().map(Pkt::op).collect();
    assert_eq!(ops, [Some(Op::Rst)]);
    assert_eq!(f.metric(|m| &m.protocol_errors), 1);
    assert_eq!(f.dev().connections(), 0);
}

/// A connection reset while it and another wait for RX buffers takes only
/// its own place in the queue of work: the other's data still comes once
/// the guest posts buffers.
#[test]
fn a_reset_connection_leaves_the_others_waiting_work_in_place() {
    let mut f = VsockFixture::new();
    let l = f.host_listen(9);
    let mut a = f.open_from_guest(&l, 1, 9);
    let mut b = f.open_from_guest(&l, 2, 9);
    // Every RX buffer used up, then data on both.
    while f.rx_outstanding() > 0 {
        a.write_all(b"x").unwrap();
        f.recv();
    }
    a.write_all(b"for a").unwrap();
    b.write_all(b"for b").unwrap();
    f.run_until_idle();
    f.send(&guest_hdr(1, 9, Op::Rst), &[]);
    assert!(host_sees_eof(&mut a));
    f.post_rx(8, 4096);
    let pkts = f.recv();
    let to_b: Vec<u8> = pkts
        .iter()
        .filter(|p| p.hdr.dst_port == 2 && p.op() == Some(Op::Rw))
        .flat_map(|p| p.data.clone())
        .collect();
    assert_eq!(to_b, b"for b", "{pkts:?}");
    assert!(pkts.iter().all(|p| p.hdr.dst_port == 2), "{pkts:?}");
}

/// A credit stall is counted once, by the packet that uses the guest's
/// last byte of credit: four packets of a quarter of the credit each, in
/// one TX pass (the host socket takes them only at its end).
#[test]
fn a_credit_stall_is_counted_by_the_packet_that_uses_the_last_credit() {
    let mut f = VsockFixture::new();
    let l = f.host_listen(9);
    let mut s = f.open_from_guest(&l, 1, 9);
    let quarter = vec![3u8; test_tunables().buf_alloc as usize / 4];
    let hdr = Header {
        len: quarter.len() as u32,
        ..guest_hdr(1, 9, Op::Rw)
    };
    for _ in 0..4 {
        f.post_tx(&hdr, &quarter, &[HDR_LEN]);
    }
    f.run_until_idle();
    assert_eq!(f.metric(|m| &m.tx_credit_stalls), 1);
    assert_eq!(read_n(&mut s, 3), [3u8; 3]);
}

/// A `CONNECT` line that comes in pieces waits for the rest: the socket
/// having nothing more for now is not the end of the line.
#[test]
fn a_connect_line_in_pieces_waits_for_its_end() {
    let mut f = VsockFixture::new();
    let mut s = f.host_connect();
    s.write_all(b"CONN").unwrap();
    f.run_until_idle();
    assert_eq!(f.dev().connections(), 1);
    s.write_all(b"ECT 52\n").unwrap();
    f.expect_request(52);
}
