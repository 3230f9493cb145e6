// SPDX-License-Identifier: Apache-2.0
//! Soak: millions of frames each way through the real
//! device, behind the real MMIO transport, with random chain shapes.
//!
//! The driver ([`MockDriver`]) keeps both rings full of chains of random
//! shapes: one buffer, several, the header split over descriptors, many
//! small buffers, zero-length ones, indirect tables, direct descriptors
//! followed by a table; with MRG_RXBUF frames spread over several RX chains.
//! The peer of the socket-pair backend sends frames of random lengths and
//! contents (a pure function of their sequence number, so nothing is kept)
//! and checks every frame the device sends. Oracles, all the time:
//! - every used id is a chain the driver has outstanding (each chain comes
//!   back exactly once), TX used lengths are 0, RX ones the bytes written
//!   (every chain of a frame but the last full, `num_buffers` right, the
//!   backend's stale header bytes overwritten);
//! - RX frames land byte-exact and in order in guest memory, TX frames
//!   reach the peer byte-exact and in order, none lost (the socket pair
//!   drops nothing) and no counter of trouble moves;
//! - the process's resident set stays flat once warm (the long run checks
//!   it within 1 MiB).
//!
//! `cargo test` runs a short soak per feature set, a few seconds each:
//! 5,000 frames each way in a debug build, 10^5 in a release one
//! (`SOAK_SHORT_FRAMES` overrides). The long one, 10^7 frames each way by
//! default, prints its figures:
//!
//! ```sh
//! SOAK_FRAMES=10000000 cargo test --release -p devices --lib soak_long -- --ignored --nocapture
//! ```

use std::sync::Arc;
use std::time::Instant;

use vm_memory::GuestAddress;

use super::fixture::{
    transport_rig, NetLoop, BASE_FEATURES, GUEST_GSO, MRG_FEATURES, RING_EVENT_IDX, RING_INDIRECT,
};
use crate::virtio::net::device::features::*;
use crate::virtio::net::{
    NetMetrics, SeqPacket, MAX_FRAME_GSO, MAX_FRAME_NO_GSO, RX_INDEX, TX_INDEX, VNET_HDR_LEN,
};
use crate::virtio::test_utils::{DeviceRig, DirectRig, MockDriver, Rng, Segment, UsedElem};
use crate::virtio::DeviceMetrics;

/// The bytes frames are cut from: frame `seq` of a direction is a window
/// of this at an offset that depends on `seq`, so the peer and the checker
/// compute it (a copy, a compare) and nobody stores frames.
fn pattern() -> &'static [u8] {
    static P: std::sync::OnceLock<Vec<u8>> = std::sync::OnceLock::new();
    P.get_or_init(|| {
        let mut r = Rng(0x9e37_79b9_7f4a_7c15);
        (0..2 * (VNET_HDR_LEN + MAX_FRAME_GSO))
            .map(|_| r.next_u64() as u8)
            .collect()
    })
}

/// Length of frame `seq` (vnet header included): mostly small and MTU
/// sized, now and then a 64 KiB one where the feature set allows it.
fn frame_len(dir: u8, seq: u64, gso: bool) -> usize {
    let mut r = Rng(seq.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ u64::from(dir) ^ 0x5eed);
    let eth = match r.next_u64() % 16 {
        0 if gso => r.range(MAX_FRAME_NO_GSO, MAX_FRAME_GSO),
        0..=5 => r.range(14, 128),
        6..=9 => MAX_FRAME_NO_GSO,
        _ => r.range(14, MAX_FRAME_NO_GSO),
    };
    VNET_HDR_LEN + eth
}

/// Frame `seq` as the backend carries it. The RX header's bytes are non-zero
/// (a TAP leaves `num_buffers` as stale as the guest had it).
fn frame(dir: u8, seq: u64, gso: bool, out: &mut Vec<u8>) {
    let len = frame_len(dir, seq, gso);
    let off = (seq.wrapping_mul(0x9e37_79b9) as usize ^ usize::from(dir))
        % (VNET_HDR_LEN + MAX_FRAME_GSO);
    out.clear();
    out.extend_from_slice(&pattern()[off..off + len]);
    if dir == RX {
        out[..VNET_HDR_LEN].fill(0xe5);
    }
}

/// What a fresh RX buffer holds.
const STALE: u8 = 0xa7;
const RX: u8 = 0;
const TX: u8 = 0x80;
const QUEUE_SIZE: u16 = 256;
/// Guest memory per descriptor slot (its buffers and indirect table).
const SLOT: u64 = 80 << 10;

/// Splits `len` bytes into a random chain shape: the buffer lengths, and
/// how many of them are direct descriptors (the rest go into an indirect
/// table). Lengths may be 0 on TX.
fn shape(r: &mut Rng, len: usize, tx: bool, max_bufs: usize) -> (Vec<u32>, usize) {
    let mut lens = Vec::new();
    let pieces = match r.next_u64() % 8 {
        0..=2 => 1,
        3 => 2,
        4 => r.range(3, 6),
        5 => r.range(2, 8),
        // Many small buffers.
        _ => r.range(8, max_bufs),
    }
    .min(len.max(1))
    .min(max_bufs);
    let mut left = len;
    // A split header now and then: 1..=12 bytes in the first buffer.
    if pieces > 1 && r.chance(3) {
        let h = r.range(1, VNET_HDR_LEN.min(left));
        lens.push(h as u32);
        left -= h;
    }
    while lens.len() + 1 < pieces && left > 1 {
        let n = r.range(1, (left / 2).max(1));
        lens.push(n as u32);
        left -= n;
        if tx && r.chance(8) && lens.len() + 1 < pieces {
            lens.push(0);
        }
    }
    lens.push(left as u32);
    let direct = match r.next_u64() % 4 {
        0 => 0,
        1 => r.range(1, lens.len()),
        _ => lens.len(),
    };
    (lens, direct)
}

/// A running soak: the device on its event loop, the driver, the peer.
struct Soak {
    em: NetLoop,
    drv: MockDriver,
    metrics: Arc<NetMetrics>,
    peer: SeqPacket,
    rng: Rng,
    mrg: bool,
    gso: bool,
    event_idx: bool,
    /// Guest address of each descriptor slot's memory.
    slot_base: [u64; 2],
    /// RX: the buffers of each outstanding chain, by head.
    rx_bufs: Vec<Option<Vec<(u64, u32)>>>,
    /// TX: the frame number of each outstanding chain, by head.
    tx_seq: Vec<Option<u64>>,
    /// Counters: frames the peer sent / the driver received; TX chains
    /// posted / returned; frames the peer received.
    rx_sent: u64,
    rx_got: u64,
    rx_chains: u64,
    tx_posted: u64,
    tx_returned: u64,
    tx_got: u64,
    /// Used entries of the RX frame being reassembled.
    pending: Vec<UsedElem>,
    scratch: Vec<u8>,
    want: Vec<u8>,
    used: Vec<UsedElem>,
}

impl Soak {
    fn new(features: u64, seed: u64) -> Soak {
        let (
            DeviceRig {
                rig:
                    DirectRig {
                        dev: net,
                        evmgr: em,
                        ..
                    },
                mut drv,
            },
            peer,
        ) = transport_rig(64 << 20);
        let metrics = net.lock().unwrap().metrics();
        net.lock()
            .unwrap()
            .backend()
            .set_send_buffer(1 << 20)
            .unwrap();
        peer.set_send_buffer(1 << 20).unwrap();
        drv.init_with_queue_size(features, Some(QUEUE_SIZE))
            .unwrap();
        let n = u64::from(QUEUE_SIZE);
        let slot_base = [
            drv.alloc(SLOT * n, 4096).unwrap().0,
            drv.alloc(SLOT * n, 4096).unwrap().0,
        ];
        let mut s = Soak {
            em,
            drv,
            metrics,
            peer,
            rng: Rng(seed | 1),
            mrg: features & (1 << VIRTIO_NET_F_MRG_RXBUF) != 0,
            gso: features & GUEST_GSO == GUEST_GSO,
            event_idx: features & RING_EVENT_IDX != 0,
            slot_base,
            rx_bufs: vec![None; usize::from(QUEUE_SIZE)],
            tx_seq: vec![None; usize::from(QUEUE_SIZE)],
            rx_sent: 0,
            rx_got: 0,
            rx_chains: 0,
            tx_posted: 0,
            tx_returned: 0,
            tx_got: 0,
            pending: Vec::new(),
            scratch: Vec::new(),
            want: Vec::new(),
            used: Vec::new(),
        };
        s.run();
        s
    }

    fn run(&mut self) {
        while self.em.run_with_timeout(0).unwrap() > 0 {}
    }

    /// Where buffer `i` of the chain in descriptor slot `slot` goes: inside
    /// the slot, with a gap after each buffer; the indirect table at the
    /// slot's end.
    fn buf_addr(&self, q: usize, slot: u16, off: u64) -> u64 {
        self.slot_base[q] + SLOT * u64::from(slot) + off
    }

    /// Writes the chain of `lens` for queue `q` into the slot of the next
    /// free descriptor; returns the head and the buffers.
    fn post(&mut self, q: usize, lens: &[u32], direct: usize) -> (u16, Vec<(u64, u32)>) {
        // The head is the last free descriptor (MockDriver hands them out
        // from the end of its free list); its slot is ours until it is used.
        let slot = self.drv.next_head(q).expect("a free descriptor");
        let mut off = 0;
        let bufs: Vec<(u64, u32)> = lens
            .iter()
            .map(|&l| {
                let a = self.buf_addr(q, slot, off);
                off += u64::from(l) + self.rng.range(0, 3) as u64 * 16;
                (a, l)
            })
            .collect();
        assert!(off + 16 * lens.len() as u64 <= SLOT, "slot overflow");
        let segs: Vec<Segment> = bufs
            .iter()
            .map(|&(a, l)| {
                if q == RX_INDEX {
                    Segment::writable(GuestAddress(a), l)
                } else {
                    Segment::readable(GuestAddress(a), l)
                }
            })
            .collect();
        let head = if direct == segs.len() {
            self.drv.add_chain(q, &segs).unwrap()
        } else {
            let table = GuestAddress(self.buf_addr(q, slot, SLOT - 16 * segs.len() as u64));
            self.drv
                .add_chain_indirect(q, &segs, direct, table)
                .unwrap()
        };
        assert_eq!(head, slot);
        (head, bufs)
    }

    /// Keeps the RX ring full of chains of random shapes.
    fn post_rx(&mut self) -> bool {
        let mut posted = false;
        while self.drv.free_descriptors(RX_INDEX).unwrap() >= 9 {
            // Without MRG_RXBUF every chain must hold the largest frame.
            let len = if !self.mrg {
                VNET_HDR_LEN
                    + if self.gso {
                        MAX_FRAME_GSO
                    } else {
                        MAX_FRAME_NO_GSO
                    }
            } else {
                match self.rng.next_u64() % 4 {
                    0 => 1526,
                    1 => 4096,
                    _ => self.rng.range(VNET_HDR_LEN, 2048),
                }
            };
            let (lens, direct) = shape(&mut self.rng, len, false, 8);
            // Fresh buffers hold stale bytes, so a byte the device should
            // have written and did not shows.
            let (head, bufs) = self.post(RX_INDEX, &lens, direct);
            for &(a, l) in &bufs {
                self.scratch.clear();
                self.scratch.resize(l as usize, STALE);
                self.drv.write_mem(GuestAddress(a), &self.scratch).unwrap();
            }
            assert!(self.rx_bufs[usize::from(head)].replace(bufs).is_none());
            posted = true;
        }
        if posted {
            self.drv.publish(RX_INDEX).unwrap();
        }
        posted
    }

    /// Posts TX frames while descriptors are free and frames remain.
    fn post_tx(&mut self, total: u64) -> bool {
        let mut posted = false;
        while self.tx_posted < total && self.drv.free_descriptors(TX_INDEX).unwrap() >= 33 {
            let seq = self.tx_posted;
            let mut f = std::mem::take(&mut self.scratch);
            frame(TX, seq, self.gso, &mut f);
            let (lens, direct) = shape(&mut self.rng, f.len(), true, 32);
            let (head, bufs) = self.post(TX_INDEX, &lens, direct);
            let mut off = 0;
            for &(a, l) in &bufs {
                let l = l as usize;
                self.drv
                    .write_mem(GuestAddress(a), &f[off..off + l])
                    .unwrap();
                off += l;
            }
            self.scratch = f;
            assert!(self.tx_seq[usize::from(head)].replace(seq).is_none());
            self.tx_posted += 1;
            posted = true;
        }
        if posted {
            self.drv.publish(TX_INDEX).unwrap();
        }
        posted
    }

    /// The peer sends RX frames while its socket takes them.
    fn send_rx(&mut self, total: u64, window: u64) {
        while self.rx_sent < total && self.rx_sent - self.rx_got < window {
            let mut f = std::mem::take(&mut self.scratch);
            frame(RX, self.rx_sent, self.gso, &mut f);
            let r = self.peer.send(&f);
            self.scratch = f;
            match r {
                Ok(_) => self.rx_sent += 1,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                Err(e) => panic!("peer send: {e}"),
            }
        }
    }

    /// Takes the RX used entries and checks every frame they complete.
    fn take_rx(&mut self) {
        self.used.clear();
        let mut used = std::mem::take(&mut self.used);
        self.drv.used_into(RX_INDEX, &mut used).unwrap();
        for e in &used {
            let head = u16::try_from(e.id).expect("RX used id above 65535");
            let bufs = self.rx_bufs[usize::from(head)]
                .as_ref()
                .unwrap_or_else(|| panic!("RX used id {} is not an outstanding chain", e.id));
            let cap: u32 = bufs.iter().map(|b| b.1).sum();
            assert!(
                e.len <= cap && e.len > 0,
                "RX used length {} of {cap}",
                e.len
            );
            self.pending.push(*e);
            self.rx_chains += 1;
            // The first chain holds num_buffers (the header may be split).
            let first = self.pending[0];
            let nb = {
                let b = self.rx_bufs[first.id as usize]
                    .as_ref()
                    .expect("pending chain");
                let mut hdr = Vec::with_capacity(VNET_HDR_LEN);
                for &(a, l) in b {
                    let n = (VNET_HDR_LEN - hdr.len()).min(l as usize);
                    hdr.extend(self.drv.read_mem(GuestAddress(a), n).unwrap());
                    if hdr.len() == VNET_HDR_LEN {
                        break;
                    }
                }
                u16::from_le_bytes([hdr[10], hdr[11]])
            };
            assert!(nb >= 1, "num_buffers 0");
            if !self.mrg {
                assert_eq!(nb, 1);
            }
            if self.pending.len() < usize::from(nb) {
                assert_eq!(
                    e.len, cap,
                    "a chain before the last of its frame is not full"
                );
                continue;
            }
            assert_eq!(self.pending.len(), usize::from(nb));
            self.check_rx_frame(nb);
        }
        self.used = used;
    }

    fn check_rx_frame(&mut self, nb: u16) {
        let seq = self.rx_got;
        let mut want = std::mem::take(&mut self.want);
        frame(RX, seq, self.gso, &mut want);
        want[10..12].copy_from_slice(&nb.to_le_bytes());
        let mut off = 0;
        for e in std::mem::take(&mut self.pending) {
            let bufs = self.rx_bufs[e.id as usize].take().expect("outstanding");
            let mut left = e.len as usize;
            for (a, l) in bufs {
                let n = left.min(l as usize);
                let got = self.drv.read_mem(GuestAddress(a), n).unwrap();
                assert!(
                    off + n <= want.len() && got == want[off..off + n],
                    "RX frame {seq}: bytes {off}..{} differ",
                    off + n
                );
                // The byte after the used length is still the stale one.
                if n < l as usize && n > 0 {
                    let after = self.drv.read_mem(GuestAddress(a + n as u64), 1).unwrap();
                    assert_eq!(
                        after[0], STALE,
                        "RX frame {seq}: written past its used length"
                    );
                }
                off += n;
                left -= n;
            }
        }
        assert_eq!(off, want.len(), "RX frame {seq}: length");
        self.want = want;
        self.rx_got += 1;
    }

    /// Takes the TX used entries (each an outstanding chain, length 0) and
    /// checks every frame the peer received, in order.
    fn take_tx(&mut self) {
        self.used.clear();
        let mut used = std::mem::take(&mut self.used);
        self.drv.used_into(TX_INDEX, &mut used).unwrap();
        for e in &used {
            assert_eq!(e.len, 0, "TX used length");
            let seq = self.tx_seq[e.id as usize]
                .take()
                .unwrap_or_else(|| panic!("TX used id {} is not an outstanding chain", e.id));
            assert_eq!(seq, self.tx_returned, "TX chains returned out of order");
            self.tx_returned += 1;
        }
        self.used = used;
        let mut buf = std::mem::take(&mut self.scratch);
        buf.resize(VNET_HDR_LEN + MAX_FRAME_GSO + 1, 0);
        loop {
            match self.peer.recv(&mut buf) {
                Ok(n) => {
                    frame(TX, self.tx_got, self.gso, &mut self.want);
                    assert!(
                        buf[..n] == self.want[..],
                        "TX frame {} differs",
                        self.tx_got
                    );
                    self.tx_got += 1;
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                Err(e) => panic!("peer recv: {e}"),
            }
        }
        self.scratch = buf;
    }

    /// Runs until `frames` went each way; calls `tick` every 2^16 frames.
    fn soak(&mut self, frames: u64, mut tick: impl FnMut(&Soak)) {
        let mut next_tick = 0;
        while self.rx_got < frames || self.tx_got < frames {
            let rx = self.post_rx();
            let tx = self.post_tx(frames);
            self.send_rx(frames, 512);
            if rx {
                self.drv.kick(RX_INDEX);
            }
            if tx {
                self.drv.kick(TX_INDEX);
            }
            self.em.run_with_timeout(10).unwrap();
            let _ = self.drv.take_irq_count();
            self.take_rx();
            self.take_tx();
            if self.event_idx {
                // As Linux re-enables callbacks: an interrupt for the next
                // used entry.
                for q in [RX_INDEX, TX_INDEX] {
                    let seen = self.drv.used_idx(q).unwrap();
                    self.drv.set_used_event(q, seen).unwrap();
                }
            }
            if self.rx_got + self.tx_got >= next_tick {
                tick(self);
                next_tick += 1 << 16;
            }
        }
        self.run();
        self.take_rx();
        self.take_tx();
        assert_eq!((self.rx_got, self.tx_got), (frames, frames));
        assert_eq!(self.tx_returned, frames, "TX chains never returned");
    }
}

/// The process's resident set, in bytes.
fn rss() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap();
    let pages: u64 = statm.split_whitespace().nth(1).unwrap().parse().unwrap();
    pages * 4096
}

/// Checks that nothing went wrong that the traffic alone cannot show.
fn assert_clean(s: &Soak, what: &str) {
    let m = s.metrics.to_json();
    for c in [
        "malformed_chains",
        "rx_dropped",
        "tx_dropped",
        "host_errors",
        "queue_errors",
        "backend_hangups",
    ] {
        assert_eq!(m[c], 0, "{what}: {c} in {m}");
    }
    assert_eq!(m["rx_frames"], s.rx_got, "{what}");
    assert_eq!(m["tx_frames"], s.tx_got, "{what}");
    assert_eq!(m["rx_buffers"], s.rx_chains, "{what}");
    // The driver asks for interrupts (EVENT_IDX: for the next used entry).
    assert!(m["interrupts"].as_u64() > Some(0), "{what}: {m}");
}

/// Frames each way in the short soaks (`SOAK_SHORT_FRAMES` overrides).
fn short_frames() -> u64 {
    std::env::var("SOAK_SHORT_FRAMES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(if cfg!(debug_assertions) {
            5_000
        } else {
            100_000
        })
}

fn short_soak(features: u64, seed: u64, what: &str) {
    let n = short_frames();
    let t = Instant::now();
    let mut s = Soak::new(features, seed);
    s.soak(n, |_| {});
    assert_clean(&s, what);
    eprintln!(
        "{what}: {n} frames each way, {} RX chains, {:.1} s",
        s.rx_chains,
        t.elapsed().as_secs_f64()
    );
}

/// MRG_RXBUF, indirect descriptors and EVENT_IDX: frames over several RX
/// chains of random shapes, TX chains of random shapes.
#[test]
fn soak_short_mergeable() {
    short_soak(
        MRG_FEATURES | RING_INDIRECT | RING_EVENT_IDX,
        1,
        "mergeable",
    );
}

/// With guest GSO: 64 KiB frames now and then, both ways.
#[test]
fn soak_short_mergeable_gso() {
    short_soak(
        MRG_FEATURES | RING_INDIRECT | GUEST_GSO,
        2,
        "mergeable, GSO",
    );
}

/// Without MRG_RXBUF: one RX chain per frame, of random shapes.
#[test]
fn soak_short_one_chain_per_frame() {
    short_soak(
        BASE_FEATURES | RING_INDIRECT | RING_EVENT_IDX,
        3,
        "one chain per frame",
    );
}

/// The long soak: `SOAK_FRAMES` (default 10^7) frames each way, with the
/// resident set sampled after warm-up (a tenth of the frames) and at the
/// end, and checked to stay within 1 MiB.
#[test]
#[ignore]
fn soak_long() {
    let n: u64 = std::env::var("SOAK_FRAMES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10_000_000);
    let features = MRG_FEATURES | RING_INDIRECT | RING_EVENT_IDX;
    let t = Instant::now();
    let mut s = Soak::new(features, 0x50a4);
    let warm = n / 10;
    let mut rss_warm = 0;
    let mut rss_max = 0;
    s.soak(n, |s| {
        let done = s.rx_got.min(s.tx_got);
        if done >= warm {
            let r = rss();
            if rss_warm == 0 {
                rss_warm = r;
            }
            rss_max = rss_max.max(r);
        }
    });
    let secs = t.elapsed().as_secs_f64();
    let rss_end = rss();
    assert_clean(&s, "long soak");
    let m = s.metrics.to_json();
    println!(
        "soak: {n} frames each way in {secs:.1} s ({:.0} frames/s both ways); \
         RX chains {} (rx_buffers), TX chains {}; RSS after warm-up {} KiB, max {} KiB, end {} KiB; \
         passes rx {} tx {}, interrupts {} (suppressed {}), max descriptors per pass {}",
        2.0 * n as f64 / secs,
        s.rx_chains,
        s.tx_returned,
        rss_warm >> 10,
        rss_max >> 10,
        rss_end >> 10,
        m["rx_passes"],
        m["tx_passes"],
        m["interrupts"],
        m["interrupts_suppressed"],
        m["max_descs_per_pass"],
    );
    assert!(
        rss_max.max(rss_end) <= rss_warm + (1 << 20),
        "RSS grew from {rss_warm} to {}",
        rss_max.max(rss_end)
    );
}
