// SPDX-License-Identifier: Apache-2.0
//! MMDS on one card without a device: a guest client's frames into
//! [`MmdsStack`], its answers read back as the guest's kernel would, and
//! what a hostile guest can do to the bounds.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::json;

use super::guest::{read_reply, GuestClient, Reply};
use super::packet::flags::{ACK, FIN, PSH, RST, SYN};
use super::tcp::{LOCAL_MSS, MAX_CONNECTIONS, MAX_PENDING_RESETS};
use super::*;

const IP: [u8; 4] = DEFAULT_IPV4;

struct Rig {
    stack: MmdsStack,
    mmds: SharedMmds,
    m: MmdsMetrics,
    now: Instant,
}

impl Rig {
    fn new(version: MmdsVersion) -> Self {
        let mmds = Arc::new(Mutex::new(Mmds::new(DEFAULT_SIZE_LIMIT)));
        {
            let mut s = lock(&mmds);
            s.put(json!({"latest":{"meta-data":{"ami-id":"ami-87654321","reservation-id":"r-79054aef"}}}))
                .expect("fits");
            s.configure(version, false);
        }
        Rig {
            stack: MmdsStack::new(IP, mmds.clone()),
            mmds,
            m: MmdsMetrics::default(),
            now: Instant::now(),
        }
    }

    fn send(&mut self, frame: &[u8]) -> Vec<Reply> {
        self.stack.receive(frame, self.now, &self.m);
        self.drain()
    }

    fn drain(&mut self) -> Vec<Reply> {
        let mut out = Vec::new();
        while let Some(f) = self.stack.poll() {
            let c = GuestClient::new(IP, 0);
            out.push(read_reply(f, c.mac, c.ip).expect("MMDS sent a well-formed frame"));
        }
        assert!(!self.stack.has_output());
        out
    }

    fn count(&self, f: impl Fn(&MmdsMetrics) -> &std::sync::atomic::AtomicU64) -> u64 {
        f(&self.m).load(Ordering::Relaxed)
    }

    /// Opens a connection as a guest's kernel does; returns MMDS's ISS.
    fn connect(&mut self, c: &mut GuestClient) -> u32 {
        let r = self.send(&c.send(SYN, b""));
        let [Reply::Tcp {
            seq, ack, flags, ..
        }] = r[..]
        else {
            panic!("one SYN-ACK, got {r:?}");
        };
        assert_eq!((flags, ack), (SYN | ACK, c.seq));
        c.ack = seq.wrapping_add(1);
        assert_eq!(self.send(&c.send(ACK, b"")), vec![]);
        seq
    }

    /// Sends a request on an open connection and reads the whole response,
    /// acknowledging every segment as it comes.
    fn request(&mut self, c: &mut GuestClient, req: &str) -> String {
        let replies = self.send(&c.send(ACK | PSH, req.as_bytes()));
        self.collect(c, replies, Vec::new())
    }

    /// Reads the rest of a response from `replies` on, after `got`.
    fn collect(
        &mut self,
        c: &mut GuestClient,
        mut replies: Vec<Reply>,
        mut got: Vec<u8>,
    ) -> String {
        for _ in 0..1000 {
            let mut progressed = false;
            for r in std::mem::take(&mut replies) {
                let Reply::Tcp {
                    seq, payload, port, ..
                } = r
                else {
                    panic!("not TCP: {r:?}");
                };
                assert_eq!(port, c.port);
                if payload.is_empty() {
                    continue;
                }
                assert_eq!(seq, c.ack, "in order");
                c.ack = c.ack.wrapping_add(payload.len() as u32);
                got.extend_from_slice(&payload);
                progressed = true;
            }
            if let Some(done) = complete(&got) {
                return done;
            }
            assert!(progressed, "MMDS stopped sending after {} bytes", got.len());
            replies = self.send(&c.send(ACK, b""));
        }
        panic!("no end");
    }
}

/// The response if `got` holds a whole one.
fn complete(got: &[u8]) -> Option<String> {
    let text = String::from_utf8(got.to_vec()).ok()?;
    let (head, body) = text.split_once("\r\n\r\n")?;
    let len: usize = head
        .lines()
        .find_map(|l| l.strip_prefix("Content-Length: "))?
        .parse()
        .ok()?;
    (body.len() == len).then_some(text)
}

fn body(resp: &str) -> &str {
    resp.split_once("\r\n\r\n").map_or("", |(_, b)| b)
}

#[test]
fn test_arp_request_answered_with_mmds_mac() {
    let mut r = Rig::new(MmdsVersion::V1);
    let c = GuestClient::new(IP, 40000);
    assert_eq!(
        r.send(&c.arp_request()),
        vec![Reply::Arp {
            mac: MMDS_MAC,
            ip: IP
        }]
    );
    // Only the last request is remembered: two give one reply.
    r.stack.receive(&c.arp_request(), r.now, &r.m);
    assert_eq!(r.send(&c.arp_request()).len(), 1);
}

#[test]
fn test_v1_get_over_tcp_then_close() {
    let mut r = Rig::new(MmdsVersion::V1);
    let mut c = GuestClient::new(IP, 40000);
    r.connect(&mut c);
    let resp = r.request(&mut c, "GET /latest/meta-data HTTP/1.1\r\nHost: x\r\n\r\n");
    assert!(resp.starts_with("HTTP/1.1 200 OK\r\n"), "{resp}");
    assert_eq!(body(&resp), "ami-id\nreservation-id");
    // A second request on the same connection (keep-alive), in JSON.
    let resp = r.request(&mut c, "GET / HTTP/1.1\r\nAccept: application/json\r\n\r\n");
    assert!(resp.contains("Content-Type: application/json"));
    assert_eq!(
        serde_json::from_str::<serde_json::Value>(body(&resp)).expect("JSON"),
        lock(&r.mmds).data()
    );
    // The guest closes: MMDS acknowledges and closes too; the last ACK
    // ends the connection.
    let replies = r.send(&c.send(FIN | ACK, b""));
    let [Reply::Tcp {
        flags, ack, seq, ..
    }] = replies[..]
    else {
        panic!("one FIN, got {replies:?}");
    };
    assert_eq!((flags, ack), (FIN | ACK, c.seq));
    c.ack = seq.wrapping_add(1);
    assert_eq!(r.stack.connections(), 1);
    assert_eq!(r.send(&c.send(ACK, b"")), vec![]);
    assert_eq!(r.stack.connections(), 0);
    assert_eq!(r.count(|m| &m.mmds_requests_accepted), 2);
    assert_eq!(r.count(|m| &m.mmds_rx_no_token), 2);
    assert_eq!(r.count(|m| &m.mmds_connections_opened), 1);
}

#[test]
fn test_v2_token_then_get_and_expiry() {
    let mut r = Rig::new(MmdsVersion::V2);
    let mut c = GuestClient::new(IP, 40001);
    r.connect(&mut c);
    let resp = r.request(&mut c, "GET /latest HTTP/1.1\r\n\r\n");
    assert!(resp.starts_with("HTTP/1.1 401 Unauthorized"), "{resp}");
    let resp = r.request(
        &mut c,
        "PUT /latest/api/token HTTP/1.1\r\nX-metadata-token-ttl-seconds: 3\r\n\r\n",
    );
    assert!(
        resp.contains("X-metadata-token-ttl-seconds: 3\r\n"),
        "{resp}"
    );
    let token = body(&resp).to_string();
    let get = format!("GET /latest/meta-data/ami-id HTTP/1.1\r\nX-metadata-token: {token}\r\n\r\n");
    assert_eq!(body(&r.request(&mut c, &get)), "ami-87654321");
    r.now += Duration::from_secs(3);
    let resp = r.request(&mut c, &get);
    assert!(resp.starts_with("HTTP/1.1 401"), "{resp}");
    assert_eq!(r.count(|m| &m.mmds_tokens_issued), 1);
}

#[test]
fn test_large_response_is_segmented_within_mss_and_window() {
    let mut r = Rig::new(MmdsVersion::V1);
    let big = "x".repeat(20_000);
    lock(&r.mmds).put(json!({ "big": big })).expect("fits");
    let mut c = GuestClient::new(IP, 40002);
    c.window = 3000;
    r.connect(&mut c);
    let replies = r.send(&c.send(ACK | PSH, b"GET /big HTTP/1.1\r\n\r\n"));
    // At most the window in flight, in segments of at most the MSS.
    let data: Vec<usize> = replies
        .iter()
        .filter_map(|x| match x {
            Reply::Tcp { payload, .. } if !payload.is_empty() => Some(payload.len()),
            _ => None,
        })
        .collect();
    assert_eq!(data, vec![1460, 1460, 80]);
    assert!(usize::from(LOCAL_MSS) >= 1460);
    // Acknowledging nothing new with the same window: sent again from the
    // acknowledged point (go-back-N).
    let again = r.send(&c.segment(ACK, b"", None));
    let Some(Reply::Tcp { seq, .. }) = again.first() else {
        panic!("a resend, got {again:?}");
    };
    assert_eq!(*seq, c.ack);
    let mut got = Vec::new();
    for x in &again {
        if let Reply::Tcp { payload, .. } = x {
            c.ack = c.ack.wrapping_add(payload.len() as u32);
            got.extend_from_slice(payload);
        }
    }
    assert_eq!(got.len(), 3000);
    // The rest arrives as the guest acknowledges, with a larger window.
    c.window = 64000;
    let replies = r.send(&c.send(ACK, b""));
    let resp = r.collect(&mut c, replies, got);
    assert!(body(&resp) == big, "the whole 20,000-byte string, in order");
}

#[test]
fn test_connection_table_bounded_lru_reset() {
    let mut r = Rig::new(MmdsVersion::V1);
    let mut first = GuestClient::new(IP, 1000);
    r.connect(&mut first);
    for port in 1001..1001 + 2 * MAX_CONNECTIONS as u16 {
        let mut c = GuestClient::new(IP, port);
        r.send(&c.send(SYN, b""));
    }
    assert_eq!(r.stack.connections(), MAX_CONNECTIONS);
    assert_eq!(
        r.count(|m| &m.mmds_connections_reset),
        MAX_CONNECTIONS as u64 + 1
    );
    // The first connection was reset: its request gets a reset back.
    let replies = r.send(&first.send(ACK | PSH, b"GET / HTTP/1.1\r\n\r\n"));
    assert!(
        matches!(replies[..], [Reply::Tcp { flags: RST, .. }]),
        "{replies:?}"
    );
}

#[test]
fn test_oversized_request_resets_and_memory_stays_bounded() {
    let mut r = Rig::new(MmdsVersion::V1);
    let mut c = GuestClient::new(IP, 2000);
    r.connect(&mut c);
    let chunk = vec![b'a'; 1000];
    let mut reset = false;
    for _ in 0..1000 {
        for x in r.send(&c.send(ACK, &chunk)) {
            if let Reply::Tcp { flags, .. } = x {
                reset |= flags & RST != 0;
            }
        }
        assert!(r.stack.held_bytes() < 200_000);
        if reset {
            break;
        }
    }
    assert!(reset, "a request line longer than the buffer resets");
    assert_eq!(r.stack.connections(), 0);
}

#[test]
fn test_out_of_window_and_bad_segments() {
    let mut r = Rig::new(MmdsVersion::V1);
    let mut c = GuestClient::new(IP, 3000);
    r.connect(&mut c);
    // Data far ahead of what is expected: only re-acknowledged.
    let mut ahead = c.clone();
    ahead.seq = ahead.seq.wrapping_add(100_000);
    let replies = r.send(&ahead.send(ACK, b"GET / HTTP/1.1\r\n\r\n"));
    assert!(
        matches!(replies[..], [Reply::Tcp { flags: ACK, ack, .. }] if ack == c.seq),
        "{replies:?}"
    );
    // An acknowledgment of bytes never sent: re-acknowledged, dropped.
    let mut liar = c.clone();
    liar.ack = liar.ack.wrapping_add(5000);
    assert_eq!(r.send(&liar.send(ACK, b"x")).len(), 1);
    // A blind reset (not at the expected sequence number) is ignored.
    let mut blind = c.clone();
    blind.seq = blind.seq.wrapping_add(7);
    r.send(&blind.segment(RST, b"", None));
    assert_eq!(r.stack.connections(), 1);
    // A bogus checksum is dropped and counted.
    let mut bad = c.segment(ACK, b"GET / HTTP/1.1\r\n\r\n", None);
    *bad.last_mut().expect("payload") ^= 0x55;
    assert_eq!(r.send(&bad), vec![]);
    assert_eq!(r.count(|m| &m.mmds_rx_dropped), 1);
    // The connection still works, and a reset at the expected number ends it.
    let resp = r.request(&mut c, "GET /latest/meta-data/ami-id HTTP/1.1\r\n\r\n");
    assert_eq!(body(&resp), "ami-87654321");
    r.send(&c.segment(RST, b"", None));
    assert_eq!(r.stack.connections(), 0);
}

#[test]
fn test_other_ports_and_strays_get_bounded_resets() {
    let mut r = Rig::new(MmdsVersion::V1);
    let c = GuestClient::new(IP, 4000);
    let mut syn22 = c.segment(SYN, b"", None);
    // Destination port 22 (bytes 36..38 of the frame: 12 + 14 + 20 + 2),
    // checksum left to the device.
    syn22[12 + 14 + 20 + 2..12 + 14 + 20 + 4].copy_from_slice(&22u16.to_be_bytes());
    syn22[0] = 1;
    let replies = r.send(&syn22);
    assert!(
        matches!(replies[..], [Reply::Tcp { flags, .. }] if flags == RST | ACK),
        "{replies:?}"
    );
    // A flood of strays queues at most MAX_PENDING_RESETS resets.
    for i in 0..100u32 {
        let mut s = c.clone();
        s.port = 5000 + i as u16;
        r.stack.receive(&s.segment(ACK, b"", None), r.now, &r.m);
    }
    assert_eq!(r.drain().len(), MAX_PENDING_RESETS);
    assert_eq!(r.stack.connections(), 0);
}

#[test]
fn test_reset_forgets_everything() {
    let mut r = Rig::new(MmdsVersion::V1);
    let mut c = GuestClient::new(IP, 40000);
    r.connect(&mut c);
    r.stack.receive(&c.arp_request(), r.now, &r.m);
    r.stack.reset();
    assert!(!r.stack.has_output());
    assert_eq!(r.stack.connections(), 0);
    assert_eq!(r.stack.ip(), IP);
}
