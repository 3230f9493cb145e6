// SPDX-License-Identifier: Apache-2.0
//! Target `mmds_datapath`: MMDS on one card, fed the frames a hostile guest
//! sends to it: well-behaved TCP exchanges (ARP, SYN, requests for paths,
//! tokens, JSON or IMDS text), the same with any flags, sequence and
//! acknowledgment numbers, windows, bad checksums, fragments, requests of
//! any bytes and any length, raw frames of any bytes, while the clock moves
//! on, the host replaces or patches the store and the device resets.
//!
//! The stack is the one the network device runs ([`MmdsStack`]); what the
//! device adds around it (a chain claimed by [`MmdsStack::claims`] goes to
//! the stack and is returned to the guest, never to the backend; the
//! stack's frames are copied into RX buffers) is covered by the device's
//! own tests (`devices::virtio::net::tests::mmds`). Here the claim itself
//! is checked against the harness's own reading of each frame.
//!
//! Oracles after every step, whatever the input:
//! - the TAP never sees an MMDS frame: every frame whose EtherType and
//!   destination (IPv4 destination, or ARP target) name the MMDS address is
//!   claimed, and no other frame is; nor is such a frame ruled out by its
//!   first bytes ([`packet::rules_out`], the device's first look);
//! - every frame MMDS sends is well formed as the guest's kernel reads it:
//!   a zeroed vnet header, MMDS's MAC as the source, and either an ARP
//!   reply from the MMDS address or an IPv4 packet from it with TTL 1 and
//!   a TCP segment from port 80 whose IPv4 and TCP checksums are right;
//! - MMDS has nothing more to send after a bounded number of frames;
//! - memory is bounded: at most `MAX_CONNECTIONS` connections, and the
//!   bytes held for them within what that many full receive buffers and
//!   responses take;
//! - no token is honoured after its TTL: a token the harness saw issued is
//!   refused by the store once its TTL has passed since the guest read it;
//! - the store never exceeds its bound.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use arbitrary::Arbitrary;
use devices::mmds::guest::GuestClient;
use devices::mmds::http::MAX_REQUEST_LEN;
use devices::mmds::packet::{self, flags, Inbound, ETH_HLEN};
use devices::mmds::tcp::MAX_CONNECTIONS;
use devices::mmds::token::TOKEN_LEN;
use devices::mmds::{
    lock, Mmds, MmdsMetrics, MmdsStack, MmdsVersion, SharedMmds, DEFAULT_IPV4, MMDS_MAC,
};
use serde_json::json;

/// Steps taken of an input.
const MAX_STEPS: usize = 96;
/// Frames MMDS may have to send after one guest frame before it must be
/// done: a whole response in 64-byte segments and a reset.
const MAX_FRAMES_PER_STEP: usize = 2048;
/// The store's bound in the target: small, so that limits are hit.
const STORE_LIMIT: usize = 2048;
/// The vnet header (virtio 1.1 §5.1.6).
const VNET: usize = 12;
const IP: [u8; 4] = DEFAULT_IPV4;

/// A request a guest makes.
#[derive(Debug, Arbitrary)]
enum Request {
    /// `GET` of one of a few paths.
    Get {
        path: u8,
        json: bool,
        token: TokenUse,
    },
    /// `PUT /latest/api/token`.
    Token {
        ttl: u16,
        alias: bool,
        forwarded: bool,
    },
    /// Any bytes.
    Raw(Vec<u8>),
    /// A request line `n` times longer than usual.
    Long(u16),
}

/// What token a `GET` carries.
#[derive(Debug, Arbitrary)]
enum TokenUse {
    None,
    Latest,
    Garbage(Vec<u8>),
}

/// What the guest does to one segment.
#[derive(Debug, Arbitrary)]
struct Tamper {
    flags: u8,
    seq_delta: i32,
    ack_delta: i32,
    window: Option<u16>,
    bad_csum: bool,
    needs_csum: bool,
    fragment: bool,
}

#[derive(Debug, Arbitrary)]
enum Step {
    Arp,
    Connect(u8),
    Send(u8, Request),
    Ack(u8, Option<u16>),
    Fin(u8),
    Rst(u8),
    Tampered(u8, Tamper, Vec<u8>),
    /// A frame of any bytes after a vnet header; `to_mmds` points its
    /// IPv4 destination (or ARP target) at MMDS.
    Raw(Vec<u8>, bool),
    Advance(u16),
    PutStore(u16),
    PatchStore(u16),
    Reset,
}

#[derive(Debug, Arbitrary)]
struct Input {
    v2: bool,
    imds_compat: bool,
    steps: Vec<Step>,
}

struct Conn {
    client: GuestClient,
    /// Response bytes read so far.
    got: Vec<u8>,
}

struct Rig {
    stack: MmdsStack,
    mmds: SharedMmds,
    m: MmdsMetrics,
    now: Instant,
    conns: HashMap<u8, Conn>,
    /// Tokens seen issued, with the latest time they can expire.
    tokens: Vec<(String, Instant)>,
}

/// Whether the harness, reading the frame itself, finds it addressed to
/// MMDS (the claim must agree).
fn addressed_to_mmds(chain: &[u8]) -> bool {
    let f = match chain.get(VNET..) {
        Some(f) if f.len() >= ETH_HLEN => f,
        _ => return false,
    };
    match (f[12], f[13]) {
        (0x08, 0x00) => f.get(30..34) == Some(&IP[..]),
        (0x08, 0x06) => f.get(38..42) == Some(&IP[..]),
        _ => false,
    }
}

fn check_reply(frame: &[u8]) {
    assert!(frame.len() >= VNET + ETH_HLEN, "runt reply");
    assert!(
        frame[..VNET].iter().all(|&b| b == 0),
        "vnet header not zero"
    );
    let f = &frame[VNET..];
    assert_eq!(f[6..12], MMDS_MAC, "source MAC");
    match (f[12], f[13]) {
        (0x08, 0x06) => {
            assert_eq!(f.len(), ETH_HLEN + 28, "ARP length");
            assert_eq!(f[20..22], [0, 2], "ARP reply");
            assert_eq!(f[22..28], MMDS_MAC);
            assert_eq!(f[28..32], IP);
        }
        (0x08, 0x00) => {
            let ip = &f[ETH_HLEN..];
            assert_eq!(ip[8], 1, "TTL");
            assert_eq!(ip[12..16], IP, "source address");
            let mut dst = [0u8; 4];
            dst.copy_from_slice(&ip[16..20]);
            match packet::parse(frame, dst) {
                Ok(Inbound::Tcp(s)) => assert_eq!(s.sport, 80),
                other => panic!("MMDS sent a frame its guest cannot read: {other:?}"),
            }
        }
        _ => panic!("EtherType {:02x}{:02x}", f[12], f[13]),
    }
}

impl Rig {
    fn new(input: &Input) -> Self {
        let mmds = Arc::new(Mutex::new(Mmds::new(STORE_LIMIT)));
        {
            let mut s = lock(&mmds);
            let _ = s.put(
                json!({"latest": {"meta-data": {"ami-id": "ami-1", "n": 1, "list": [1]}},
                                 "user-data": "hello"}),
            );
            let version = if input.v2 {
                MmdsVersion::V2
            } else {
                MmdsVersion::V1
            };
            s.configure(version, input.imds_compat);
        }
        Rig {
            stack: MmdsStack::new(IP, mmds.clone()),
            mmds,
            m: MmdsMetrics::default(),
            now: Instant::now(),
            conns: HashMap::new(),
            tokens: Vec::new(),
        }
    }

    fn conn(&mut self, i: u8) -> &mut Conn {
        let i = i % 8;
        self.conns.entry(i).or_insert_with(|| Conn {
            client: GuestClient::new(IP, 40000 + u16::from(i)),
            got: Vec::new(),
        })
    }

    /// The guest sends `chain`: claimed exactly when addressed to MMDS,
    /// then everything MMDS answers is read as the guest would.
    fn send(&mut self, chain: &[u8]) {
        let claimed = self.stack.claims(chain);
        assert_eq!(
            claimed,
            addressed_to_mmds(chain),
            "a frame to MMDS would reach the TAP, or another frame would not"
        );
        // The device's TX path first asks this of a chain's first bytes
        // and reads the whole chain only when they do not rule it out.
        if let Some(head) = chain.get(..packet::HEAD_LEN) {
            assert!(
                !(claimed && packet::rules_out(head, IP)),
                "the first bytes would rule out a frame to MMDS"
            );
        }
        if claimed {
            self.stack.receive(chain, self.now, &self.m);
        }
        self.drain();
    }

    fn drain(&mut self) {
        let mut n = 0;
        while let Some(frame) = self.stack.poll() {
            check_reply(frame);
            let frame = frame.to_vec();
            self.deliver(&frame);
            n += 1;
            assert!(n <= MAX_FRAMES_PER_STEP, "MMDS keeps sending");
        }
    }

    /// A guest connection takes the data of a segment for it, in order.
    fn deliver(&mut self, frame: &[u8]) {
        let dst_port = match frame.get(VNET + ETH_HLEN + 20..VNET + ETH_HLEN + 24) {
            Some(p) if frame[VNET + 12..VNET + 14] == [8, 0] => u16::from_be_bytes([p[2], p[3]]),
            _ => return,
        };
        let Some(i) = dst_port.checked_sub(40000).filter(|i| *i < 8) else {
            return;
        };
        let mut dst = [0u8; 4];
        dst.copy_from_slice(&frame[VNET + ETH_HLEN + 16..VNET + ETH_HLEN + 20]);
        let Ok(Inbound::Tcp(s)) = packet::parse(frame, dst) else {
            return;
        };
        let (seq, syn, payload) = (s.seq, s.flags & flags::SYN != 0, s.payload.to_vec());
        let now = self.now;
        let c = self.conn(i as u8);
        if syn {
            c.client.ack = seq.wrapping_add(1);
        } else if seq == c.client.ack && !payload.is_empty() {
            c.client.ack = seq.wrapping_add(payload.len() as u32);
            c.got.extend_from_slice(&payload);
        }
        let tokens = take_tokens(&mut c.got, now);
        self.tokens.extend(tokens);
    }

    fn request_bytes(&self, r: &Request) -> Vec<u8> {
        match r {
            Request::Get { path, json, token } => {
                let paths = [
                    "/",
                    "/latest",
                    "/latest/meta-data/",
                    "/latest/meta-data/ami-id",
                    "/latest/meta-data/n",
                    "/user-data",
                    "/nothing",
                    "//latest//meta-data",
                ];
                let mut s = format!(
                    "GET {} HTTP/1.1\r\nHost: x\r\n",
                    paths[usize::from(*path) % paths.len()]
                );
                if *json {
                    s.push_str("Accept: application/json\r\n");
                }
                match token {
                    TokenUse::None => {}
                    TokenUse::Latest => {
                        if let Some((t, _)) = self.tokens.last() {
                            s.push_str(&format!("X-metadata-token: {t}\r\n"));
                        }
                    }
                    TokenUse::Garbage(g) => {
                        s.push_str("X-metadata-token: ");
                        s.push_str(&String::from_utf8_lossy(g));
                        s.push_str("\r\n");
                    }
                }
                s.push_str("\r\n");
                s.into_bytes()
            }
            Request::Token {
                ttl,
                alias,
                forwarded,
            } => {
                let name = if *alias {
                    "X-aws-ec2-metadata-token-ttl-seconds"
                } else {
                    "X-metadata-token-ttl-seconds"
                };
                let fwd = if *forwarded {
                    "X-Forwarded-For: 1.2.3.4\r\n"
                } else {
                    ""
                };
                // Small TTLs, so the clock passes them.
                format!(
                    "PUT /latest/api/token HTTP/1.1\r\n{fwd}{name}: {}\r\n\r\n",
                    ttl % 8
                )
                .into_bytes()
            }
            Request::Raw(b) => b.clone(),
            Request::Long(n) => {
                let mut s = b"GET /".to_vec();
                s.extend(std::iter::repeat_n(b'a', usize::from(*n % 8192)));
                s.extend_from_slice(b" HTTP/1.1\r\n\r\n");
                s
            }
        }
    }

    fn step(&mut self, step: &Step) {
        match step {
            Step::Arp => {
                let f = self.conn(0).client.arp_request();
                self.send(&f);
            }
            Step::Connect(i) => {
                let f = self.conn(*i).client.send(flags::SYN, b"");
                self.send(&f);
                let f = self.conn(*i).client.send(flags::ACK, b"");
                self.send(&f);
            }
            Step::Send(i, r) => {
                let bytes = self.request_bytes(r);
                // Segments of at most 1460 bytes, as the MSS asks.
                for chunk in bytes.chunks(1460) {
                    let f = self.conn(*i).client.send(flags::ACK | flags::PSH, chunk);
                    self.send(&f);
                }
            }
            Step::Ack(i, window) => {
                let c = &mut self.conn(*i).client;
                if let Some(w) = window {
                    c.window = *w;
                }
                let f = c.send(flags::ACK, b"");
                self.send(&f);
            }
            Step::Fin(i) => {
                let f = self.conn(*i).client.send(flags::FIN | flags::ACK, b"");
                self.send(&f);
            }
            Step::Rst(i) => {
                let f = self.conn(*i).client.send(flags::RST, b"");
                self.send(&f);
            }
            Step::Tampered(i, t, payload) => {
                let f = tampered(&self.conn(*i).client, t, payload);
                self.send(&f);
            }
            Step::Raw(bytes, to_mmds) => {
                let mut f = vec![0u8; VNET];
                f.extend_from_slice(bytes);
                if *to_mmds && f.len() >= VNET + 42 {
                    f[VNET + 12] = 8;
                    f[VNET + 30..VNET + 34].copy_from_slice(&IP);
                    f[VNET + 38..VNET + 42].copy_from_slice(&IP);
                }
                self.send(&f);
            }
            Step::Advance(s) => self.now += Duration::from_millis(u64::from(*s) * 10),
            Step::PutStore(n) => {
                let _ =
                    lock(&self.mmds).put(json!({ "latest": "x".repeat(usize::from(*n % 4096)) }));
            }
            Step::PatchStore(n) => {
                let _ = lock(&self.mmds)
                    .patch(&json!({ "p": "y".repeat(usize::from(*n % 4096)), "user-data": null }));
            }
            Step::Reset => {
                self.stack.reset();
                self.conns.clear();
            }
        }
        self.check();
    }

    fn check(&self) {
        assert!(!self.stack.has_output(), "answers left after the drain");
        assert!(self.stack.connections() <= MAX_CONNECTIONS);
        // A connection holds a full receive buffer and one response: the
        // store, a 404 naming a path as long as a request, the headers.
        let per_conn = MAX_REQUEST_LEN + STORE_LIMIT + MAX_REQUEST_LEN + 512;
        let bound = MAX_CONNECTIONS * per_conn + 2 * (VNET + 65550 + 4096);
        assert!(
            self.stack.held_bytes() <= bound,
            "{} bytes held, bound {bound}",
            self.stack.held_bytes()
        );
        let store = lock(&self.mmds);
        let len = serde_json::to_vec(&store.data()).map_or(0, |v| v.len());
        assert!(len <= STORE_LIMIT, "store of {len} bytes over its bound");
        for (t, expires) in &self.tokens {
            if self.now >= *expires {
                assert!(
                    !store.token_valid(t, self.now),
                    "token honoured after its TTL"
                );
            }
        }
    }
}

/// Tokens in the complete responses at the front of `got` (removed), with
/// the latest time each can expire: its TTL from now, when the guest read
/// it (it was issued no later).
fn take_tokens(got: &mut Vec<u8>, now: Instant) -> Vec<(String, Instant)> {
    let mut out = Vec::new();
    loop {
        let Some(end) = got.windows(4).position(|w| w == b"\r\n\r\n") else {
            return out;
        };
        let head = String::from_utf8_lossy(&got[..end]).to_string();
        let len: usize = head
            .lines()
            .find_map(|l| l.strip_prefix("Content-Length: "))
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        if got.len() < end + 4 + len {
            return out;
        }
        let body = String::from_utf8_lossy(&got[end + 4..end + 4 + len]).to_string();
        let ttl = head.lines().find_map(|l| {
            l.strip_prefix("X-metadata-token-ttl-seconds: ")
                .or_else(|| l.strip_prefix("X-aws-ec2-metadata-token-ttl-seconds: "))
                .and_then(|v| v.parse::<u64>().ok())
        });
        if let (Some(ttl), true) = (ttl, body.len() == TOKEN_LEN) {
            out.push((body, now + Duration::from_secs(ttl)));
        }
        got.drain(..end + 4 + len);
    }
}

/// A segment of `c`'s connection with what `t` changes.
fn tampered(c: &GuestClient, t: &Tamper, payload: &[u8]) -> Vec<u8> {
    let mut c = c.clone();
    c.seq = c.seq.wrapping_add(t.seq_delta as u32);
    c.ack = c.ack.wrapping_add(t.ack_delta as u32);
    if let Some(w) = t.window {
        c.window = w;
    }
    let mut f = c.segment(t.flags, &payload[..payload.len().min(3000)], None);
    let ip = VNET + ETH_HLEN;
    if t.fragment {
        f[ip + 6] |= 0x20;
        f[ip + 10] = 0;
        f[ip + 11] = 0;
        let sum = packet::checksum(&[&f[ip..ip + 20]]);
        f[ip + 10..ip + 12].copy_from_slice(&sum.to_be_bytes());
    }
    if t.bad_csum {
        let last = f.len() - 1;
        f[last] ^= 0x5a;
    }
    if t.needs_csum {
        f[0] = 1;
    }
    f
}

/// Runs one input.
pub fn run(data: &[u8]) {
    crate::with_input(data, |input: &Input| {
        let mut rig = Rig::new(input);
        for step in input.steps.iter().take(MAX_STEPS) {
            rig.step(step);
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A whole V2 exchange through the target's own steps: the token is
    /// seen, honoured, and refused once its TTL passed.
    #[test]
    fn a_v2_session_runs_through_the_steps() {
        let input = Input {
            v2: true,
            imds_compat: false,
            steps: vec![],
        };
        let mut rig = Rig::new(&input);
        rig.step(&Step::Connect(1));
        rig.step(&Step::Send(
            1,
            Request::Token {
                ttl: 3,
                alias: false,
                forwarded: false,
            },
        ));
        assert_eq!(rig.tokens.len(), 1);
        let (token, _) = rig.tokens[0].clone();
        assert!(lock(&rig.mmds).token_valid(&token, rig.now));
        rig.step(&Step::Send(
            1,
            Request::Get {
                path: 3,
                json: true,
                token: TokenUse::Latest,
            },
        ));
        assert!(
            String::from_utf8_lossy(&rig.conn(1).got).is_empty(),
            "the GET was answered whole"
        );
        rig.step(&Step::Advance(300));
        assert!(!lock(&rig.mmds).token_valid(&token, rig.now));
        assert_eq!(
            rig.m
                .mmds_tokens_issued
                .load(std::sync::atomic::Ordering::Relaxed),
            1
        );
        assert_eq!(
            rig.m
                .mmds_requests_accepted
                .load(std::sync::atomic::Ordering::Relaxed),
            2
        );
    }

    #[test]
    fn the_claim_oracle_reads_frames_itself() {
        let c = GuestClient::new(IP, 40000);
        assert!(addressed_to_mmds(&c.arp_request()));
        assert!(addressed_to_mmds(&c.segment(flags::SYN, b"", None)));
        let mut other = c.clone();
        other.mmds_ip = [10, 0, 0, 1];
        assert!(!addressed_to_mmds(&other.segment(flags::SYN, b"", None)));
        assert!(!addressed_to_mmds(&[0u8; 20]));
    }
}
