// SPDX-License-Identifier: Apache-2.0
//! Scenario `vsock`: the virtio-vsock device against a raw relay over a Unix socket pair, in
//! the same run.
//!
//! The device is driven from the driver side, as the network and block devices are: the real
//! `Vsock` on its event loop behind its MMIO transport, its RX and TX rings in guest memory, a
//! lean driver in front (descriptors written once; posting a packet is its 44-byte header and
//! an avail slot, reaping a used-index load), kicks written straight to the queues' eventfds as
//! KVM's ioeventfds would. One connection, opened by the guest to a host listener at
//! `<uds_path>_52` (Firecracker's guest-initiated path), carries every cell's traffic; the
//! host's end of it is a plain Unix stream socket, served by a peer thread.
//!
//! The raw relay is what the device's datapath costs at the least: on a connected
//! `socketpair`, the same peer thread on the other end, the relay thread moves the same
//! payloads straight between the same guest buffers and the socket, one `write` or `read`
//! per packet (the device's `writev`/`readv` of a one-segment payload is that call).
//!
//! Cells, each interleaved rounds of both sides, medians of the rounds:
//!
//! - `tx_4k`, `tx_64k`: guest → host stream, packets of 4 KiB and 64 KiB payload (Linux sends
//!   up to 64 KiB per packet), within the device's credit (it advertises 256 KiB and sends
//!   CREDIT_UPDATE as the host drains it); the host reads 256 KiB at a time. Throughput is
//!   what the host read.
//! - `rx_4k`: host → guest stream into 4 KiB RX buffers (Linux's size), the guest advertising
//!   256 KiB of credit and sending CREDIT_UPDATE as it consumes; the host writes 64 KiB at a
//!   time. Throughput is what reached guest buffers.
//! - `rr_1`: one byte each way, one transaction in flight: the host writes and waits for the
//!   answer, the guest answers each request; the rate is transactions per second, its inverse
//!   the round trip.
//!
//! CPU is that of the one thread that runs the device and the driver (the relay thread on
//! the raw side), per byte for streams and per transaction for `rr_1`; the driver's turns are
//! timed apart and reported (`harn. ns`), as in the block table.

use std::io::{Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};
use devices::virtio::mmio::MmioTransport;
use devices::virtio::queue::{VIRTQ_DESC_F_NEXT, VIRTQ_DESC_F_WRITE};
use devices::virtio::test_utils::{desc_bytes, guest_memory, MockDriver, QueueLayout};
use devices::virtio::vsock::packet::{Header, Op, HDR_LEN, TYPE_STREAM};
use devices::virtio::vsock::{
    Tunables, Vsock, VsockConfig, VsockMetrics, HELD_IOVS, RX_BATCH, RX_BATCH_BYTES,
};
use devices::virtio::{DeviceMetrics, GuestMemory, VirtioDevice};
use event_manager::{EventManager, SubscriberOps};
use serde_json::{json, Value};
use vm_memory::{Bytes, GuestAddress};
use vmm_sys_util::eventfd::EventFd;

use crate::rig::host_mem::HostRange;
use crate::rig::{ring_ranges, ring_slot, LeanRing};
use crate::scenarios::Timing;
use crate::stats::{medians, ratio, Medians, Window};
use crate::sys;

const GUEST_CID: u64 = 3;
const GUEST_PORT: u32 = 1000;
const HOST_PORT: u32 = 52;
/// The guest's receive buffer per connection (Linux's default `buf_alloc`).
const GUEST_BUF: u32 = 256 * 1024;
/// Descriptors per queue.
const QSIZE: u16 = 256;
/// RX buffers posted (one descriptor each).
const RX_SLOTS: usize = 128;
/// TX slots (two descriptors each: header, payload).
const TX_SLOTS: usize = 64;
/// What the host's peer reads or writes per call.
const PEER_CHUNK: usize = 256 * 1024;
const RX_Q: usize = 0;
const TX_Q: usize = 1;

/// One cell.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Cell {
    /// Guest → host stream, this payload per packet.
    Tx(usize),
    /// Host → guest stream into RX buffers of this payload.
    Rx(usize),
    /// One byte each way, one transaction in flight.
    Rr,
}

impl Cell {
    fn name(self) -> String {
        match self {
            Cell::Tx(p) => format!("tx_{}k", p / 1024),
            Cell::Rx(p) => format!("rx_{}k", p / 1024),
            Cell::Rr => "rr_1".into(),
        }
    }

    /// RX buffers' payload room.
    fn rx_payload(self) -> usize {
        match self {
            Cell::Rx(p) => p,
            _ => 4096,
        }
    }

    /// TX packets' payload.
    fn tx_payload(self) -> usize {
        match self {
            Cell::Tx(p) => p,
            _ => 1,
        }
    }
}

/// One window: units (bytes, or transactions) per second, CPU ns per unit of the measured
/// thread, and the driver's wall ns per unit (0 on the raw side).
type Sample = Window;

/// The host's side of a cell on the other end of a stream socket, on a thread of its own:
/// it drains (TX), fills (RX) or asks and waits (RR) until told to stop, counting bytes (or
/// transactions).
struct Peer {
    stop: Arc<AtomicBool>,
    count: Arc<AtomicU64>,
    thread: Option<JoinHandle<()>>,
}

impl Peer {
    fn start(cell: Cell, mut s: UnixStream) -> Result<Peer> {
        s.set_read_timeout(Some(Duration::from_millis(50)))?;
        s.set_write_timeout(Some(Duration::from_millis(50)))?;
        let (stop, count) = (
            Arc::new(AtomicBool::new(false)),
            Arc::new(AtomicU64::new(0)),
        );
        let (st, ct) = (stop.clone(), count.clone());
        let thread = std::thread::Builder::new()
            .name("vsock peer".into())
            .spawn(move || serve_peer(cell, &mut s, &st, &ct))
            .context("peer thread")?;
        Ok(Peer {
            stop,
            count,
            thread: Some(thread),
        })
    }

    fn count(&self) -> u64 {
        self.count.load(Ordering::Relaxed)
    }
}

impl Drop for Peer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Whether an error is a socket time-out (the peer looks at its stop flag then).
fn timed_out(e: &std::io::Error) -> bool {
    use std::io::ErrorKind::*;
    matches!(e.kind(), WouldBlock | TimedOut | Interrupted)
}

/// The peer thread's loop (see [`Peer`]).
fn serve_peer(cell: Cell, s: &mut UnixStream, stop: &AtomicBool, count: &AtomicU64) {
    let mut buf = vec![0x5au8; PEER_CHUNK];
    let add = |n: usize| count.fetch_add(n as u64, Ordering::Relaxed);
    match cell {
        Cell::Tx(_) => {
            while !stop.load(Ordering::Relaxed) {
                match s.read(&mut buf) {
                    Ok(0) => break,
                    Ok(n) => {
                        add(n);
                    }
                    Err(e) if timed_out(&e) => {}
                    Err(_) => break,
                }
            }
        }
        Cell::Rx(_) => {
            while !stop.load(Ordering::Relaxed) {
                match s.write(&buf[..65536]) {
                    Ok(n) => {
                        add(n);
                    }
                    Err(e) if timed_out(&e) => {}
                    Err(_) => break,
                }
            }
        }
        Cell::Rr => {
            while !stop.load(Ordering::Relaxed) {
                match s.write(&buf[..1]) {
                    Ok(1) => {}
                    Err(e) if timed_out(&e) => continue,
                    _ => break,
                }
                // The answer is waited for even after the stop (1 s at most), so that no
                // late answer is taken for the next window's.
                let give_up = Instant::now() + Duration::from_secs(1);
                loop {
                    match s.read(&mut buf[..1]) {
                        Ok(1) => {
                            add(1);
                            break;
                        }
                        Err(e) if timed_out(&e) && Instant::now() < give_up => {}
                        _ => return,
                    }
                }
            }
        }
    }
}

/// Counts a window after the warm-up: `turn(counting)` does one step of the measured thread
/// and returns the wall ns it spent in the driver (0 for the raw relay); `units()` reads the
/// running count (the peer's, or the driver's for RX).
fn window(
    t: &Timing,
    mut turn: impl FnMut(bool) -> Result<u64>,
    units: impl Fn() -> u64,
) -> Result<Sample> {
    let clock = sys::current_thread_cpu_clock();
    let warm_end = Instant::now() + t.warmup;
    while Instant::now() < warm_end {
        turn(false)?;
    }
    let (t0, c0, u0) = (Instant::now(), sys::clock_ns(clock), units());
    let mut harness = 0u64;
    while t0.elapsed() < t.window {
        harness += turn(true)?;
    }
    let (dt, dc, du) = (t0.elapsed(), sys::clock_ns(clock) - c0, units() - u0);
    ensure!(du > 0, "nothing moved in the window");
    Ok(Sample {
        per_s: du as f64 / dt.as_secs_f64(),
        cpu_ns: dc as f64 / du as f64,
        harness_ns: harness as f64 / du as f64,
    })
}

/// A queue the lean driver drives through host pointers.
struct Lean {
    avail: HostRange,
    used: HostRange,
    size: u16,
    next_avail: u16,
    last_used: u16,
    published: u16,
    kick: EventFd,
    pushed: bool,
}

impl Lean {
    fn new(mem: &GuestMemory, layout: QueueLayout, kick: EventFd) -> Result<Lean> {
        let (avail, used) = ring_ranges(mem, &layout)?;
        Ok(Lean {
            avail,
            used,
            size: layout.size,
            next_avail: 0,
            last_used: 0,
            published: 0,
            kick,
            pushed: false,
        })
    }

    /// Puts `head` in the next avail slot (visible at `publish`).
    fn push(&mut self, head: u16) {
        let off = ring_slot(self.next_avail, self.size, 2);
        self.avail
            .u16_at(off)
            .store(head.to_le(), Ordering::Relaxed);
        self.next_avail = self.next_avail.wrapping_add(1);
        self.pushed = true;
    }

    /// Makes what was pushed visible and kicks unless the device said not to.
    fn publish(&mut self) -> Result<()> {
        if !std::mem::take(&mut self.pushed) {
            return Ok(());
        }
        let ring = LeanRing {
            avail: &self.avail,
            used: &self.used,
            size: self.size,
            event_idx: false,
            kick: &self.kick,
        };
        ring.publish(self.next_avail, &mut self.published)
            .context("kick")
    }

    /// The used entries since the last call: (id, length).
    fn reap(&mut self, out: &mut Vec<(u16, u32)>) {
        out.clear();
        let idx = u16::from_le(self.used.u16_at(2).load(Ordering::Acquire));
        while self.last_used != idx {
            let off = ring_slot(self.last_used, self.size, 8);
            let (id, len) = self.used.read_u32_pair(off);
            out.push((id as u16, len));
            self.last_used = self.last_used.wrapping_add(1);
        }
    }
}

/// A header of the guest's connection.
/// Offsets in the packet header (virtio 1.2 §5.10.6) of the fields a
/// connection's packets differ in.
const HDR_LEN_AT: usize = 24;
const HDR_OP_AT: usize = 30;
const HDR_FWD_CNT_AT: usize = 40;

fn guest_hdr(op: Op, len: usize, fwd_cnt: u32) -> Header {
    Header {
        src_cid: GUEST_CID,
        dst_cid: u64::from(libc::VMADDR_CID_HOST),
        src_port: GUEST_PORT,
        dst_port: HOST_PORT,
        len: len as u32,
        kind: TYPE_STREAM,
        op: op as u16,
        flags: 0,
        buf_alloc: GUEST_BUF,
        fwd_cnt,
    }
}

/// The device, one open connection and the lean driver in front of it.
struct VsockRig {
    _driver: MockDriver,
    _dir: TempDir,
    em: EventManager<Arc<Mutex<Vsock>>>,
    rx: Lean,
    tx: Lean,
    rx_bufs: Vec<HostRange>,
    tx_hdrs: Vec<HostRange>,
    tx_data: Vec<HostRange>,
    tx_free: Vec<u16>,
    used: Vec<(u16, u32)>,
    /// The device's credit for the guest: its buffer, what it has taken, what was sent.
    dev_buf: u32,
    dev_fwd: u32,
    sent: u32,
    /// What the guest has taken from its buffer, and what the device last heard of it.
    guest_fwd: u32,
    told_fwd: u32,
    /// Payload bytes delivered into RX buffers.
    delivered: Arc<AtomicU64>,
    /// Requests waiting for an answer (`rr_1`).
    owed: usize,
    /// The device asked for the guest's credit.
    credit_asked: bool,
    metrics: Arc<VsockMetrics>,
}

/// A directory removed when dropped.
struct TempDir(PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

impl VsockRig {
    /// The device over guest memory, negotiated, its RX queue filled with `cell`'s buffers,
    /// a connection opened from the guest to the host's listener; returns the rig and the
    /// host's end of the connection.
    fn new(cell: Cell) -> Result<(VsockRig, UnixStream)> {
        let dir = std::env::temp_dir().join(format!("minivmm-vsockbench-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).context("bench directory")?;
        let dir = TempDir(dir);
        let uds = dir.0.join("v.sock");
        let host_listener = UnixListener::bind(format!("{}_{HOST_PORT}", uds.display()))
            .context("the host's listener")?;
        let (rx_p, tx_p) = (cell.rx_payload(), cell.tx_payload());
        let mem_len = (RX_SLOTS * (HDR_LEN + rx_p) + TX_SLOTS * (HDR_LEN + tx_p) + (4 << 20))
            .next_power_of_two();
        let mem = guest_memory(mem_len).context("guest memory")?;
        let cfg = VsockConfig {
            id: "vsock".into(),
            guest_cid: GUEST_CID,
            uds_path: uds.clone(),
        };
        let dev = Arc::new(Mutex::new(
            Vsock::new(cfg, mem.clone()).context("the vsock device")?,
        ));
        let (offered, metrics, kicks) = {
            let d = dev.lock().expect("lock");
            let kicks: Vec<EventFd> = d
                .queue_events()
                .iter()
                .map(EventFd::try_clone)
                .collect::<std::io::Result<_>>()?;
            (d.avail_features(), d.metrics(), kicks)
        };
        let t: Arc<Mutex<dyn VirtioDevice>> = dev.clone();
        let transport = MmioTransport::new(mem.clone(), t).context("transport")?;
        let mut driver = MockDriver::new(mem.clone(), transport).context("driver")?;
        // VERSION_1 only: an interrupt per pass and a kick unless NO_NOTIFY, as every rig.
        driver
            .init_with_queue_size(offered & 1 << 32, Some(QSIZE))
            .context("driver init")?;
        let mut em = EventManager::new().context("event manager")?;
        em.add_subscriber(dev);
        let (rx_layout, tx_layout) = (driver.layout(RX_Q)?, driver.layout(TX_Q)?);
        let mut rx_bufs = Vec::new();
        for i in 0..RX_SLOTS {
            let a = driver.alloc((HDR_LEN + rx_p) as u64, 64)?;
            let d = desc_bytes(a.0, (HDR_LEN + rx_p) as u32, VIRTQ_DESC_F_WRITE, 0);
            mem.write_slice(&d, GuestAddress(rx_layout.desc_table.0 + 16 * i as u64))?;
            rx_bufs.push(HostRange::new(&mem, a, HDR_LEN + rx_p)?);
        }
        let (mut tx_hdrs, mut tx_data) = (Vec::new(), Vec::new());
        for s in 0..TX_SLOTS {
            let h = driver.alloc(HDR_LEN as u64, 64)?;
            let p = driver.alloc(tx_p as u64, 64)?;
            // Written once, as a guest fills a buffer before it sends it.
            mem.write_slice(&vec![0x5au8; tx_p], p)?;
            let d = (2 * s) as u16;
            for (i, bytes) in [
                desc_bytes(h.0, HDR_LEN as u32, VIRTQ_DESC_F_NEXT, d + 1),
                desc_bytes(p.0, tx_p as u32, 0, 0),
            ]
            .into_iter()
            .enumerate()
            {
                let at = tx_layout.desc_table.0 + 16 * (u64::from(d) + i as u64);
                mem.write_slice(&bytes, GuestAddress(at))?;
            }
            let hdr = HostRange::new(&mem, h, HDR_LEN)?;
            // What no packet of the connection changes, written once; `send`
            // writes the fields that do, as Linux fills a packet's header
            // field by field.
            hdr.write_bytes(0, &guest_hdr(Op::Rw, 0, 0).to_bytes());
            tx_hdrs.push(hdr);
            tx_data.push(HostRange::new(&mem, p, tx_p)?);
        }
        let mut kicks = kicks.into_iter();
        let rx_kick = kicks.next().context("RX kick")?;
        let tx_kick = kicks.next().context("TX kick")?;
        let mut rig = VsockRig {
            _driver: driver,
            _dir: dir,
            em,
            rx: Lean::new(&mem, rx_layout, rx_kick)?,
            tx: Lean::new(&mem, tx_layout, tx_kick)?,
            rx_bufs,
            tx_hdrs,
            tx_data,
            tx_free: (0..TX_SLOTS as u16).rev().collect(),
            used: Vec::with_capacity(usize::from(QSIZE)),
            dev_buf: 0,
            dev_fwd: 0,
            sent: 0,
            guest_fwd: 0,
            told_fwd: 0,
            delivered: Arc::new(AtomicU64::new(0)),
            owed: 0,
            credit_asked: false,
            metrics,
        };
        for i in 0..RX_SLOTS {
            rig.rx.push(i as u16);
        }
        rig.rx.publish()?;
        rig.send(Op::Request, 0)?;
        let host = rig.open(&host_listener)?;
        Ok((rig, host))
    }

    /// Runs the loop until the device answers the REQUEST; the host's end.
    fn open(&mut self, l: &UnixListener) -> Result<UnixStream> {
        let end = Instant::now() + Duration::from_secs(5);
        while self.dev_buf == 0 {
            ensure!(
                Instant::now() < end,
                "no RESPONSE: {}",
                self.metrics.to_json()
            );
            self.em.run_with_timeout(10).context("event loop")?;
            self.driver_turn(Cell::Tx(0))?;
        }
        let (s, _) = l.accept().context("the host's end")?;
        Ok(s)
    }

    /// Posts a packet of the guest's connection from a free TX slot.
    fn send(&mut self, op: Op, len: usize) -> Result<()> {
        let slot = self.tx_free.pop().context("no free TX slot")?;
        let hdr = &self.tx_hdrs[usize::from(slot)];
        hdr.write_bytes(HDR_LEN_AT, &(len as u32).to_le_bytes());
        hdr.write_bytes(HDR_OP_AT, &(op as u16).to_le_bytes());
        hdr.write_bytes(HDR_FWD_CNT_AT, &self.guest_fwd.to_le_bytes());
        self.told_fwd = self.guest_fwd;
        self.tx.push(2 * slot);
        Ok(())
    }

    /// The driver's turn: reads what the device used, answers it as the cell's guest does,
    /// reposts RX buffers, sends within the device's credit, publishes and kicks.
    #[inline(never)]
    fn driver_turn(&mut self, cell: Cell) -> Result<()> {
        self.tx.reap(&mut self.used);
        for &(id, _) in &self.used {
            self.tx_free.push(id / 2);
        }
        self.rx.reap(&mut self.used);
        let used = std::mem::take(&mut self.used);
        for &(id, len) in &used {
            let buf = &self.rx_bufs[usize::from(id)];
            let h = Header::parse(&buf.read_array::<HDR_LEN>(0));
            self.dev_buf = h.buf_alloc;
            self.dev_fwd = h.fwd_cnt;
            if h.op == Op::Rw as u16 {
                let n = (len as usize).saturating_sub(HDR_LEN);
                self.guest_fwd = self.guest_fwd.wrapping_add(n as u32);
                self.delivered.fetch_add(n as u64, Ordering::Relaxed);
                if cell == Cell::Rr {
                    self.owed += n;
                }
            } else if h.op == Op::CreditRequest as u16 {
                // As Linux answers one: the guest's credit now.
                self.credit_asked = true;
            } else if h.op != Op::Response as u16 && h.op != Op::CreditUpdate as u16 {
                bail!("the device sent op {}: {}", h.op, self.metrics.to_json());
            }
            self.rx.push(id);
        }
        self.used = used;
        match cell {
            Cell::Tx(p) => {
                while !self.tx_free.is_empty()
                    && self.sent.wrapping_sub(self.dev_fwd) as usize + p <= self.dev_buf as usize
                {
                    self.send(Op::Rw, p)?;
                    self.sent = self.sent.wrapping_add(p as u32);
                }
            }
            Cell::Rx(_) => {
                let due = self.guest_fwd.wrapping_sub(self.told_fwd) >= GUEST_BUF / 2;
                if (due || self.credit_asked) && !self.tx_free.is_empty() {
                    self.credit_asked = false;
                    self.send(Op::CreditUpdate, 0)?;
                }
            }
            Cell::Rr => {
                while self.owed > 0 && !self.tx_free.is_empty() {
                    self.owed -= 1;
                    self.send(Op::Rw, 1)?;
                }
            }
        }
        self.rx.publish()?;
        self.tx.publish()
    }

    /// One step of the measured thread: the device's turn, then the driver's, timed apart.
    fn turn(&mut self, cell: Cell) -> Result<u64> {
        self.em.run_with_timeout(1).context("event loop")?;
        let t0 = Instant::now();
        self.driver_turn(cell)?;
        Ok(t0.elapsed().as_nanos() as u64)
    }

    fn measure(&mut self, t: &Timing, cell: Cell, host: &UnixStream) -> Result<Sample> {
        let peer = Peer::start(cell, host.try_clone()?)?;
        let delivered = self.delivered.clone();
        let sample = window(
            t,
            |_| self.turn(cell),
            || match cell {
                Cell::Rx(_) => delivered.load(Ordering::Relaxed),
                _ => peer.count(),
            },
        );
        drop(peer);
        sample
    }
}

/// How the raw relay moves packets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Relay {
    /// One `read` or `write` a packet.
    PerPacket,
    /// One `readv` or `writev` over as many packets' buffers as the device moves in one call
    /// at most ([`batch`]).
    Batched,
}

/// Packets one batched relay call moves: what one call of the device moves at most. A read
/// fills up to `RX_BATCH` buffers and `RX_BATCH_BYTES` of room; a write takes the packets a
/// pass deferred, up to `HELD_IOVS`, as many as the device's starting credit lets the driver
/// have in flight.
fn batch(cell: Cell) -> usize {
    match cell {
        Cell::Rx(p) => (RX_BATCH_BYTES / p).clamp(1, RX_BATCH),
        Cell::Tx(p) => {
            (Tunables::default().buf_alloc as usize / p).clamp(1, HELD_IOVS.min(TX_SLOTS))
        }
        Cell::Rr => 1,
    }
}

/// The raw relay's window: the relay thread moves `cell`'s payloads between the rig's own
/// guest buffers and one end of a socket pair, as `relay` says; the peer serves the other end
/// as it serves the device's host end.
fn raw_window(t: &Timing, cell: Cell, rig: &VsockRig, relay: Relay) -> Result<Sample> {
    let (ours, theirs) = UnixStream::pair().context("socketpair")?;
    let peer = Peer::start(cell, theirs)?;
    let fd = ours.as_raw_fd();
    let delivered = AtomicU64::new(0);
    let mut i = 0;
    let sample = window(
        t,
        |_| {
            let n = match relay {
                Relay::PerPacket => raw_step(cell, rig, fd, i)?,
                Relay::Batched => raw_batch_step(cell, rig, fd, i)?,
            };
            delivered.fetch_add(n, Ordering::Relaxed);
            i += 1;
            Ok(0)
        },
        || match cell {
            Cell::Rx(_) => delivered.load(Ordering::Relaxed),
            _ => peer.count(),
        },
    );
    drop(peer);
    sample
}

/// One packet of the raw relay through `fd`, on the rig's buffers in turn (`i`); the bytes it
/// put in a guest buffer (RX: what the count of delivered bytes grows by).
fn raw_step(cell: Cell, rig: &VsockRig, fd: std::os::fd::RawFd, i: usize) -> Result<u64> {
    match cell {
        Cell::Tx(p) => {
            let n = rig.tx_data[i % TX_SLOTS].fd_io(fd, 0, p, true)?;
            ensure!(n > 0, "the peer went away");
            Ok(0)
        }
        Cell::Rx(p) => {
            // Into the payload part, where the device's readv puts it.
            let n = rig.rx_bufs[i % RX_SLOTS].fd_io(fd, HDR_LEN, p, false)?;
            Ok(n as u64)
        }
        Cell::Rr => {
            let n = rig.rx_bufs[i % RX_SLOTS].fd_io(fd, HDR_LEN, 1, false)?;
            ensure!(n == 1, "the peer went away");
            rig.tx_data[i % TX_SLOTS].fd_io(fd, 0, 1, true)?;
            Ok(0)
        }
    }
}

/// One call of the batched relay through `fd`: [`batch`] packets' buffers of the rig's, in
/// turn (`i`), in one `writev` or `readv`; the bytes it put in guest buffers.
fn raw_batch_step(cell: Cell, rig: &VsockRig, fd: std::os::fd::RawFd, i: usize) -> Result<u64> {
    let k = batch(cell);
    // On the stack: an allocation a call would be the relay's cost, not the kernel's.
    let mut parts = [(&rig.tx_data[0], 0, 0); HELD_IOVS];
    for (j, part) in parts.iter_mut().take(k).enumerate() {
        *part = match cell {
            Cell::Rr => return raw_step(cell, rig, fd, i),
            Cell::Tx(p) => (&rig.tx_data[(i * k + j) % TX_SLOTS], 0, p),
            // Into the payload parts, where the device's readv puts it.
            Cell::Rx(p) => (&rig.rx_bufs[(i * k + j) % RX_SLOTS], HDR_LEN, p),
        };
    }
    let write = matches!(cell, Cell::Tx(_));
    let n = HostRange::fd_io_vectored(fd, &parts[..k], write)?;
    ensure!(n > 0, "the peer went away");
    Ok(if write { 0 } else { n as u64 })
}

/// One cell: interleaved rounds of the raw relays and the device, the medians and ratios.
fn cell(t: &Timing, cell: Cell) -> Result<Value> {
    let (mut rig, host) = VsockRig::new(cell)?;
    let (mut dev, mut raw, mut rawb) = (Vec::new(), Vec::new(), Vec::new());
    // The cells carry the goals: as many rounds as the limit scenario's.
    for round in 0..t.limit_rounds {
        // Every other round the device goes first.
        if round % 2 == 0 {
            raw.push(raw_window(t, cell, &rig, Relay::PerPacket)?);
            rawb.push(raw_window(t, cell, &rig, Relay::Batched)?);
            dev.push(rig.measure(t, cell, &host)?);
        } else {
            dev.push(rig.measure(t, cell, &host)?);
            rawb.push(raw_window(t, cell, &rig, Relay::Batched)?);
            raw.push(raw_window(t, cell, &rig, Relay::PerPacket)?);
        }
    }
    let batched = medians(&dev, &rawb);
    let Medians {
        dev_per_s: dp,
        raw_per_s: rp,
        dev_cpu_ns: dc,
        raw_cpu_ns: rc,
        harness_ns: h,
    } = medians(&dev, &raw);
    let m = rig.metrics.to_json();
    Ok(json!({
        "cell": cell.name(),
        "unit": if cell == Cell::Rr { "transactions" } else { "bytes" },
        "device_per_s": dp, "raw_per_s": rp,
        "device_cpu_ns": dc, "raw_cpu_ns": rc, "harness_ns": h,
        "ratio": ratio(dp, rp), "cpu_ratio": ratio(dc, rc),
        "cpu_ratio_without_harness": ratio(dc - h, rc),
        "raw_batched_per_s": batched.raw_per_s, "raw_batched_cpu_ns": batched.raw_cpu_ns,
        "batch": batch(cell),
        "ratio_batched": ratio(dp, batched.raw_per_s),
        "cpu_ratio_batched": ratio(dc, batched.raw_cpu_ns),
        "cpu_ratio_batched_without_harness": ratio(dc - h, batched.raw_cpu_ns),
        "round_ratios": dev.iter().zip(&raw).map(|(d, r)| ratio(d.per_s, r.per_s)).collect::<Vec<_>>(),
        "round_ratios_batched": dev.iter().zip(&rawb).map(|(d, r)| ratio(d.per_s, r.per_s)).collect::<Vec<_>>(),
        "device_metrics": {
            "tx_packets": m["tx_packets"], "rx_packets": m["rx_packets"],
            "tx_short_writes": m["tx_short_writes"], "rx_credit_stalls": m["rx_credit_stalls"],
            "interrupts": m["interrupts"], "passes": m["passes"],
            "tx_credit_stalls": m["tx_credit_stalls"], "tx_bytes": m["tx_bytes"],
        },
    }))
}

/// The cells by name.
const CELLS: [Cell; 4] = [Cell::Tx(4096), Cell::Tx(65536), Cell::Rx(4096), Cell::Rr];

/// `netbench --vsock-cost CELL SIDE N`: `n` units (bytes, or transactions) of one cell on one
/// side (`device` or `raw`) and nothing else, with the peer thread, for `strace -c -f`, perf
/// or callgrind: system calls and instructions per unit. Needs no root.
pub fn cost(name: &str, side: &str, n: u64) -> Result<()> {
    let c = CELLS
        .into_iter()
        .find(|c| c.name() == name)
        .with_context(|| format!("unknown cell {name:?}"))?;
    let (mut rig, host) = VsockRig::new(c)?;
    let started = Instant::now();
    let done = match side {
        "device" => {
            let peer = Peer::start(c, host.try_clone()?)?;
            let units = |rig: &VsockRig| match c {
                Cell::Rx(_) => rig.delivered.load(Ordering::Relaxed),
                _ => peer.count(),
            };
            while units(&rig) < n {
                rig.turn(c)?;
            }
            units(&rig)
        }
        "raw" | "raw-batched" => {
            let (ours, theirs) = UnixStream::pair().context("socketpair")?;
            let peer = Peer::start(c, theirs)?;
            let fd = ours.as_raw_fd();
            let (mut got, mut i) = (0u64, 0usize);
            while match c {
                Cell::Rx(_) => got,
                _ => peer.count(),
            } < n
            {
                got += if side == "raw" {
                    raw_step(c, &rig, fd, i)?
                } else {
                    raw_batch_step(c, &rig, fd, i)?
                };
                i += 1;
            }
            n
        }
        other => bail!("unknown side {other:?} (device, raw, raw-batched)"),
    };
    eprintln!(
        "netbench: vsock-cost {name} {side}: {done} units in {:.2} s; device: {}",
        started.elapsed().as_secs_f64(),
        rig.metrics.to_json()
    );
    Ok(())
}

/// Runs the cells named in `only` (every cell when it is empty); returns the rows and the
/// ratios.
pub fn vsock(t: &Timing, only: &[String]) -> Result<Value> {
    if let Some(bad) = only.iter().find(|n| !CELLS.iter().any(|c| &c.name() == *n)) {
        bail!("unknown vsock cell {bad:?} (tx_4k, tx_64k, rx_4k, rr_1)");
    }
    let mut rows = Vec::new();
    let mut ratios = serde_json::Map::new();
    for c in CELLS
        .into_iter()
        .filter(|c| only.is_empty() || only.contains(&c.name()))
    {
        let row = cell(t, c)?;
        eprintln!(
            "netbench: vsock {}: device {:.0}/s raw {:.0}/s ({:.3}), cpu {:.3} ns vs {:.3} ns ({:.3}), {}",
            c.name(),
            row["device_per_s"].as_f64().unwrap_or(0.0),
            row["raw_per_s"].as_f64().unwrap_or(0.0),
            row["ratio"].as_f64().unwrap_or(0.0),
            row["device_cpu_ns"].as_f64().unwrap_or(0.0),
            row["raw_cpu_ns"].as_f64().unwrap_or(0.0),
            row["cpu_ratio"].as_f64().unwrap_or(0.0),
            row["device_metrics"],
        );
        for k in [
            "ratio",
            "cpu_ratio",
            "ratio_batched",
            "cpu_ratio_batched",
            "cpu_ratio_batched_without_harness",
        ] {
            ratios.insert(format!("{}_{k}", c.name()), row[k].clone());
        }
        rows.push(row);
    }
    let mut v = json!({ "rows": rows });
    v.as_object_mut().expect("an object").extend(ratios);
    Ok(v)
}

/// The vsock table for the summary.
pub fn table(s: &mut String, v: &Value) {
    use std::fmt::Write as _;
    let Some(rows) = v["rows"].as_array() else {
        return;
    };
    let _ = writeln!(
        s,
        "\nVSOCK: device (guest connection to <uds_path>_52) vs raw relay (the same payloads, one read/write per packet, on a socketpair) and batched relay (one readv/writev over as many packets as the device moves in a call)"
    );
    let _ = writeln!(
        s,
        "{:<8} {:>13} {:>13} {:>7} {:>9} {:>9} {:>7} {:>9} {:>7} {:>13} {:>7} {:>7} {:>9}",
        "cell",
        "device/s",
        "raw/s",
        "ratio",
        "dev ns",
        "raw ns",
        "cpu x",
        "harn. ns",
        "cpu x-h",
        "batched/s",
        "ratio b",
        "cpu x b",
        "cpu x-h b"
    );
    for r in rows {
        let f = |k: &str| r[k].as_f64().unwrap_or(0.0);
        let _ = writeln!(
            s,
            "{:<8} {:>13.0} {:>13.0} {:>7.3} {:>9.3} {:>9.3} {:>7.3} {:>9.3} {:>7.3} {:>13.0} {:>7.3} {:>7.3} {:>9.3}",
            r["cell"].as_str().unwrap_or("?"),
            f("device_per_s"),
            f("raw_per_s"),
            f("ratio"),
            f("device_cpu_ns"),
            f("raw_cpu_ns"),
            f("cpu_ratio"),
            f("harness_ns"),
            f("cpu_ratio_without_harness"),
            f("raw_batched_per_s"),
            f("ratio_batched"),
            f("cpu_ratio_batched"),
            f("cpu_ratio_batched_without_harness"),
        );
    }
    let _ = writeln!(
        s,
        "- /s: bytes per second for tx_* and rx_*, transactions per second for rr_1 (one in flight);\n\
         - dev ns, raw ns: CPU per byte (per transaction for rr_1) of the one thread running the device's\n  \
         event loop and the driver harness, or the relay; harn. ns: wall time per unit in the harness's\n  \
         turns, least over the rounds; cpu x-h, cpu x-h b: the CPU ratios with the harness's time\n  \
         taken out."
    );
    for r in rows {
        for (key, label) in [("round_ratios", ""), ("round_ratios_batched", " batched")] {
            if let Some(rr) = r[key].as_array() {
                let _ = writeln!(
                    s,
                    "  rounds{label} {}: {}",
                    r["cell"].as_str().unwrap_or("?"),
                    rr.iter()
                        .map(|x| format!("{:.2}", x.as_f64().unwrap_or(0.0)))
                        .collect::<Vec<_>>()
                        .join(" ")
                );
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_fields_send_writes_are_where_the_header_has_them() {
        let base = guest_hdr(Op::Rw, 0, 0).to_bytes();
        let h = guest_hdr(Op::CreditUpdate, 0x0102_0304, 0x0a0b_0c0d).to_bytes();
        let mut patched = base;
        patched[HDR_LEN_AT..HDR_LEN_AT + 4].copy_from_slice(&0x0102_0304u32.to_le_bytes());
        patched[HDR_OP_AT..HDR_OP_AT + 2].copy_from_slice(&(Op::CreditUpdate as u16).to_le_bytes());
        patched[HDR_FWD_CNT_AT..HDR_FWD_CNT_AT + 4].copy_from_slice(&0x0a0b_0c0du32.to_le_bytes());
        assert_eq!(patched, h);
    }

    #[test]
    fn an_unknown_cell_is_refused_before_anything_runs() {
        let err = vsock(&Timing::smoke(), &["tx_4k".into(), "tx_5k".into()])
            .expect_err("tx_5k is no cell");
        assert!(err.to_string().contains("\"tx_5k\""), "{err}");
    }
}
