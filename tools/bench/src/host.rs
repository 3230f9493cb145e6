// SPDX-License-Identifier: Apache-2.0
//! The host side of the TAP: senders that push traffic toward the fake guest
//! (UDP floods, GSO floods through an `AF_PACKET` socket, timestamped probes),
//! the UDP sink TX frames are addressed to, and the raw TAP loops that read
//! and write the TAP with no device: the limit the device is compared to.
//!
//! Everything runs inside the benchmark's own network namespace; the only
//! destination addresses used are the TAP's and the fake guest's.

use std::net::{Ipv4Addr, SocketAddrV4, UdpSocket};
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};

use crate::frames::{self, GUEST_IP, GUEST_PORT, HOST_IP, HOST_MAC, SINK_PORT};
use crate::sys;
use devices::virtio::io_engine::{WriteRing, MAX_BATCH};
use devices::virtio::net::Tap;

/// The TAP's name inside the namespace.
pub const TAP_NAME: &str = "mvb0";

/// What a sender thread pushes toward the guest.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Traffic {
    /// UDP datagrams making Ethernet frames of this many bytes.
    Udp(usize),
    /// TCP super-frames of this many bytes with a TSO vnet header, sent on an
    /// `AF_PACKET` socket so they reach the TAP unsegmented.
    Gso(usize),
    /// One timestamped probe every this many microseconds.
    Probe(u64),
}

/// A running host-side sender; stops and joins on drop.
pub struct Sender {
    stop: Arc<AtomicBool>,
    sent: Arc<AtomicU64>,
    handle: Option<JoinHandle<Result<()>>>,
}

impl Sender {
    /// Starts a sender thread for `traffic`.
    pub fn start(traffic: Traffic) -> Result<Sender> {
        let stop = Arc::new(AtomicBool::new(false));
        let sent = Arc::new(AtomicU64::new(0));
        let (s, n) = (stop.clone(), sent.clone());
        let handle = std::thread::Builder::new()
            .name("host-sender".into())
            .spawn(move || match traffic {
                Traffic::Udp(len) => udp_flood(len, &s, &n),
                Traffic::Gso(len) => gso_flood(len, &s, &n),
                Traffic::Probe(us) => probes(us, &s, &n),
            })
            .context("spawn sender")?;
        Ok(Sender {
            stop,
            sent,
            handle: Some(handle),
        })
    }

    /// The running count of frames sent, for a [`Window`] to sample at its
    /// edges (what the sender offered during exactly that window).
    pub fn counter(&self) -> Arc<AtomicU64> {
        self.sent.clone()
    }

    fn join(&mut self) -> Result<()> {
        self.stop.store(true, Ordering::Relaxed);
        match self.handle.take() {
            Some(h) => h
                .join()
                .map_err(|_| anyhow::anyhow!("sender thread panicked"))?,
            None => Ok(()),
        }
    }
}

impl Drop for Sender {
    fn drop(&mut self) {
        let _ = self.join();
    }
}

fn guest_socket() -> Result<UdpSocket> {
    let sock =
        UdpSocket::bind(SocketAddrV4::new(Ipv4Addr::from(HOST_IP), 0)).context("bind sender")?;
    sock.connect(SocketAddrV4::new(Ipv4Addr::from(GUEST_IP), GUEST_PORT))
        .context("connect sender")?;
    sock.set_nonblocking(true)?;
    Ok(sock)
}

fn udp_flood(frame_len: usize, stop: &AtomicBool, sent: &AtomicU64) -> Result<()> {
    let sock = guest_socket()?;
    let payload = vec![0x5au8; frame_len.saturating_sub(frames::UDP_OVERHEAD).max(1)];
    let batch: Vec<&[u8]> = (0..32).map(|_| payload.as_slice()).collect();
    while !stop.load(Ordering::Relaxed) {
        let n = sys::sendmmsg(&sock, &batch)?;
        if n == 0 {
            // The TAP queue or the socket buffer is full: let the reader run.
            sys::poll_fd(sock.as_raw_fd(), true, Duration::from_millis(1));
            std::thread::yield_now();
        }
        sent.fetch_add(n as u64, Ordering::Relaxed);
    }
    Ok(())
}

fn gso_flood(frame_len: usize, stop: &AtomicBool, sent: &AtomicU64) -> Result<()> {
    let sock = sys::PacketSocket::bind(TAP_NAME).context("AF_PACKET socket on the TAP")?;
    let (hdr, frame) = frames::tso_frame(frame_len, HOST_MAC, None, true);
    // AF_PACKET's PACKET_VNET_HDR takes the 10-byte `virtio_net_hdr`
    // (no num_buffers), not the 12-byte v1 header the TAP uses.
    let mut msg = hdr.to_bytes()[..10].to_vec();
    msg.extend_from_slice(&frame);
    while !stop.load(Ordering::Relaxed) {
        if sock.send(&msg)? {
            sent.fetch_add(1, Ordering::Relaxed);
        } else {
            std::thread::sleep(Duration::from_micros(50));
        }
    }
    Ok(())
}

fn probes(interval_us: u64, stop: &AtomicBool, sent: &AtomicU64) -> Result<()> {
    let sock = guest_socket()?;
    let interval = Duration::from_micros(interval_us);
    let mut next = Instant::now();
    while !stop.load(Ordering::Relaxed) {
        let p = frames::probe_payload(sys::now_ns());
        if sock.send(&p).is_ok() {
            sent.fetch_add(1, Ordering::Relaxed);
        }
        next += interval;
        let now = Instant::now();
        if next > now {
            std::thread::sleep(next - now);
        } else {
            next = now;
        }
    }
    Ok(())
}

/// The UDP socket TX frames are addressed to. It is never read: once its
/// small receive buffer is full the kernel drops datagrams silently (no
/// ICMP goes back into the TAP), after full IP/UDP receive processing.
pub fn sink() -> Result<UdpSocket> {
    let sock = UdpSocket::bind(SocketAddrV4::new(Ipv4Addr::from(HOST_IP), SINK_PORT))
        .context("bind sink")?;
    sys::setsockopt_int(sock.as_raw_fd(), libc::SOL_SOCKET, libc::SO_RCVBUF, 4096)?;
    Ok(sock)
}

/// Datagrams the namespace's UDP layer accepted (delivered or dropped on a
/// full buffer), and checksum errors, from /proc/net/snmp.
pub fn udp_counters() -> (u64, u64) {
    let text = std::fs::read_to_string("/proc/net/snmp").unwrap_or_default();
    let mut lines = text.lines().filter(|l| l.starts_with("Udp:"));
    let (Some(h), Some(v)) = (lines.next(), lines.next()) else {
        return (0, 0);
    };
    let get = |name: &str| -> u64 {
        h.split_whitespace()
            .position(|k| k == name)
            .and_then(|i| v.split_whitespace().nth(i))
            .and_then(|x| x.parse().ok())
            .unwrap_or(0)
    };
    (
        get("InDatagrams") + get("RcvbufErrors"),
        get("InCsumErrors"),
    )
}

/// Running totals a loop hands to [`Window::tick`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counts {
    /// Frames moved: read from the TAP, or accepted by it.
    pub frames: u64,
    /// Frame bytes moved (without vnet headers).
    pub bytes: u64,
    /// Guest buffers used (RX, device only).
    pub buffers: u64,
    /// TX frames the TAP refused (the device returns them used; they are
    /// not in `frames`).
    pub dropped: u64,
    /// Device passes of the measured direction (device only).
    pub passes: u64,
}

/// One measured run: frames and bytes in the window, and CPU time of the
/// thread doing the work (device thread, or raw-loop thread).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Measured {
    /// Frames moved in the window.
    pub frames: u64,
    /// Frame bytes moved (without vnet headers).
    pub bytes: u64,
    /// Length of the window in seconds.
    pub secs: f64,
    /// CPU ns the measured thread spent in the window.
    pub cpu_ns: u64,
    /// Guest buffers used (RX, device only).
    pub buffers: u64,
    /// TX frames the TAP refused in the window (not counted in `frames`).
    pub dropped: u64,
    /// Frames the host sender offered in the window (RX runs).
    pub offered: u64,
    /// Device passes of the measured direction in the window (device only).
    pub passes: u64,
    /// CPU seconds the hypervisor stole from this machine (all its vCPUs)
    /// during the window.
    pub steal_s: f64,
}

impl Measured {
    /// Frames per second.
    pub fn fps(&self) -> f64 {
        if self.secs > 0.0 {
            self.frames as f64 / self.secs
        } else {
            0.0
        }
    }
    /// Gigabits per second of frame bytes.
    pub fn gbps(&self) -> f64 {
        if self.secs > 0.0 {
            self.bytes as f64 * 8.0 / self.secs / 1e9
        } else {
            0.0
        }
    }
    /// Share of the window the measured thread was on a CPU (1.0 = saturated).
    pub fn busy(&self) -> f64 {
        if self.secs > 0.0 {
            self.cpu_ns as f64 / (self.secs * 1e9)
        } else {
            0.0
        }
    }
    /// Share of the machine's CPU time (all vCPUs) stolen by the
    /// hypervisor during the window: other tenants taking the host's cores.
    pub fn steal(&self) -> f64 {
        let cpus = std::thread::available_parallelism().map_or(1, usize::from) as f64;
        if self.secs > 0.0 {
            self.steal_s / (self.secs * cpus)
        } else {
            0.0
        }
    }
    /// Frames per device pass (0 without passes: a raw loop).
    pub fn frames_per_pass(&self) -> f64 {
        if self.passes > 0 {
            self.frames as f64 / self.passes as f64
        } else {
            0.0
        }
    }
    /// CPU ns per frame of the measured thread.
    pub fn cpu_per_frame(&self) -> f64 {
        if self.frames > 0 {
            self.cpu_ns as f64 / self.frames as f64
        } else {
            0.0
        }
    }
    /// Frames per second the host sender offered during the window.
    pub fn offered_fps(&self) -> f64 {
        if self.secs > 0.0 {
            self.offered as f64 / self.secs
        } else {
            0.0
        }
    }
}

/// Window bookkeeping shared by all loops: counting starts after `warmup`
/// and stops `dur` later.
#[derive(Debug)]
pub struct Window {
    start: Instant,
    warm_end: Instant,
    end: Instant,
    cpu_clock: libc::clockid_t,
    /// The host sender's running count, if one feeds this run.
    offered: Option<Arc<AtomicU64>>,
    /// Counts, offered count, CPU clock and stolen seconds at the start.
    t0: Option<(Counts, u64, u64, f64)>,
    /// Result once closed.
    pub out: Measured,
}

impl Window {
    /// Opens a window measuring `cpu_clock`; `offered` is the running count
    /// of a host sender feeding the run, if any.
    pub fn new(
        warmup: Duration,
        dur: Duration,
        cpu_clock: libc::clockid_t,
        offered: Option<Arc<AtomicU64>>,
    ) -> Window {
        let start = Instant::now();
        Window {
            start,
            warm_end: start + warmup,
            end: start + warmup + dur,
            cpu_clock,
            offered,
            t0: None,
            out: Measured::default(),
        }
    }

    fn offered_now(&self) -> u64 {
        self.offered
            .as_ref()
            .map_or(0, |c| c.load(Ordering::Relaxed))
    }

    /// Call often with running totals; returns false once the window closed.
    pub fn tick(&mut self, c: Counts) -> bool {
        let now = Instant::now();
        match self.t0 {
            None if now >= self.warm_end => {
                self.t0 = Some((
                    c,
                    self.offered_now(),
                    sys::clock_ns(self.cpu_clock),
                    sys::steal_secs(),
                ));
                self.start = now;
                true
            }
            None => true,
            Some((c0, o0, cpu0, steal0)) if now >= self.end => {
                self.out = Measured {
                    frames: c.frames - c0.frames,
                    bytes: c.bytes - c0.bytes,
                    buffers: c.buffers - c0.buffers,
                    dropped: c.dropped - c0.dropped,
                    passes: c.passes - c0.passes,
                    offered: self.offered_now().saturating_sub(o0),
                    secs: (now - self.start).as_secs_f64(),
                    cpu_ns: sys::clock_ns(self.cpu_clock).saturating_sub(cpu0),
                    steal_s: (sys::steal_secs() - steal0).max(0.0),
                };
                false
            }
            Some(_) => true,
        }
    }
}

/// Raw RX limit: reads the TAP (opened with `offloads`) with no device while
/// the caller's sender floods it. Frames land in a ring of `nbufs` buffers
/// of `buf_len` bytes, the same memory footprint as the device's posted RX
/// buffers, so both sides pay the same cache misses and only the device's
/// own work differs.
pub fn raw_rx(
    offloads: u32,
    buf_len: usize,
    nbufs: usize,
    offered: Arc<AtomicU64>,
    warmup: Duration,
    dur: Duration,
) -> Result<Measured> {
    let tap = sys::open_tap(TAP_NAME, offloads).context("open TAP for the raw RX loop")?;
    let fd = tap.as_raw_fd();
    let mut ring = vec![0u8; buf_len * nbufs.max(1)];
    let mut slot = 0usize;
    let mut w = Window::new(warmup, dur, sys::current_thread_cpu_clock(), Some(offered));
    let (mut frames, mut bytes) = (0u64, 0u64);
    while w.tick(Counts {
        frames,
        bytes,
        ..Counts::default()
    }) {
        let buf = &mut ring[slot * buf_len..(slot + 1) * buf_len];
        slot = (slot + 1) % nbufs.max(1);
        match sys::read_fd(fd, buf) {
            Ok(n) => {
                frames += 1;
                bytes += n.saturating_sub(sys::VNET_HDR_LEN) as u64;
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                sys::poll_fd(fd, false, Duration::from_millis(5));
            }
            Err(e) => return Err(e).context("raw TAP read"),
        }
    }
    Ok(w.out)
}

/// Raw TX limit: writes `msg` (vnet header + frame) to the TAP in a loop.
pub fn raw_tx(msg: &[u8], warmup: Duration, dur: Duration) -> Result<Measured> {
    let tap = open_raw_tx_tap()?;
    let fd = tap.as_raw_fd();
    raw_tx_rounds(fd, msg, warmup, dur, || match sys::write_fd(fd, msg) {
        Ok(_) => Ok((1, false)),
        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => Ok((0, true)),
        Err(e) => Err(e).context("raw TAP write"),
    })
}

/// The TAP of the raw TX loops, opened as the device opens it.
fn open_raw_tx_tap() -> Result<Tap> {
    sys::open_tap(TAP_NAME, sys::TAP_OFFLOADS_GSO).context("open TAP for the raw TX loop")
}

/// The window both raw TX loops share: calls `round` (which writes `msg`s
/// to the TAP `fd` and returns the frames it took and whether the TAP was
/// full) until the window closes, waiting for writability after a full
/// round. Any error but EAGAIN ends the run: unlike the device, which
/// returns a refused frame to the guest and goes on, the raw loops count
/// only frames the TAP took, and so does the device's TX rate.
fn raw_tx_rounds(
    fd: RawFd,
    msg: &[u8],
    warmup: Duration,
    dur: Duration,
    mut round: impl FnMut() -> Result<(u64, bool)>,
) -> Result<Measured> {
    let mut w = Window::new(warmup, dur, sys::current_thread_cpu_clock(), None);
    let (mut frames, mut bytes) = (0u64, 0u64);
    let flen = msg.len().saturating_sub(sys::VNET_HDR_LEN) as u64;
    while w.tick(Counts {
        frames,
        bytes,
        ..Counts::default()
    }) {
        let (taken, full) = round()?;
        frames += taken;
        bytes += taken * flen;
        if full {
            sys::poll_fd(fd, true, Duration::from_millis(5));
        }
    }
    Ok(w.out)
}

/// Probe latency with no device: a thread blocked in `poll` on the TAP reads
/// each probe and stamps it. The floor under the device's idle latency
/// (same host path, same wake-up, no virtqueue).
pub fn raw_latency(dur: Duration) -> Result<Vec<f64>> {
    let tap = sys::open_tap(TAP_NAME, sys::TAP_OFFLOADS_GSO).context("open TAP for raw latency")?;
    let fd = tap.as_raw_fd();
    let mut buf = vec![0u8; 65562 + 64];
    let warm = Duration::from_millis(200);
    let counted_from = sys::now_ns() + warm.as_nanos() as u64;
    let end = Instant::now() + warm + dur;
    let mut samples = Vec::new();
    while Instant::now() < end {
        match sys::read_fd(fd, &mut buf) {
            Ok(n) => {
                if let Some(ts) = frames::parse_probe(&buf[..n]) {
                    let now = sys::now_ns();
                    if ts >= counted_from {
                        samples.push(now.saturating_sub(ts) as f64 / 1000.0);
                    }
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                sys::poll_fd(fd, false, Duration::from_millis(5));
            }
            Err(e) => return Err(e).context("raw TAP read"),
        }
    }
    Ok(samples)
}

/// Raw TX limit with batched system calls: the same frames as [`raw_tx`],
/// `batch` writes per `io_uring_enter`, through the device's own
/// [`WriteRing`] (same ring set-up, same flags, same submission code). The
/// limit for a device that batches its TAP writes; the plain loop stays the
/// limit a one-write-per-frame datapath is held to.
pub fn raw_tx_batched(
    msg: &[u8],
    batch: usize,
    warmup: Duration,
    dur: Duration,
) -> Result<Measured> {
    let tap = open_raw_tx_tap()?;
    let fd = tap.as_raw_fd();
    let mut ring = WriteRing::new(fd).context("io_uring set-up")?;
    let batch = batch.clamp(1, MAX_BATCH);
    let msgs = vec![msg; batch];
    let mut res = vec![0i32; batch];
    raw_tx_rounds(fd, msg, warmup, dur, || {
        ring.write_bufs(&msgs, &mut res).context("io_uring_enter")?;
        let (mut taken, mut full) = (0, false);
        for &r in &res {
            if r >= 0 {
                taken += 1;
            } else if r == -libc::EAGAIN {
                full = true;
            } else {
                return Err(std::io::Error::from_raw_os_error(-r)).context("raw TAP write");
            }
        }
        Ok((taken, full))
    })
}
