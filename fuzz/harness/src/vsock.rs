// SPDX-License-Identifier: Apache-2.0
//! Target `vsock_datapath`: the real virtio-vsock device, on its event
//! loop, behind its MMIO transport, over real Unix sockets in a temporary
//! directory (each of the device's sockets with the least send buffer the
//! kernel allows, so that a host agent that does not read soon refuses the
//! guest's bytes and the device holds TX chains), driven by a guest that sends arbitrary packets (any op, type,
//! CID, port, length, credit, header cut anywhere) and host agents that
//! connect with `CONNECT` lines (good and bad), listen on
//! `<uds_path>_<port>`, write, read, half-close and go away.
//!
//! Oracles, after every step:
//! - the event loop goes idle within a bounded number of iterations;
//! - every pass is bounded (`max_descs_per_pass` at most `MAX_PASS_READS`);
//! - memory is bounded: at most `max_connections` connections, each holding
//!   at most its `buf_alloc` (and an `OK` line) for its host socket, at most
//!   `MAX_QUEUED_RSTS` RSTs waiting;
//! - every RX packet is well formed: from CID 2 to the guest's CID, a
//!   stream type, an op the spec defines, a used length of header plus
//!   `len`; only a chain with no room for data comes back empty;
//! - credit is never exceeded: on a connection whose credit the guest kept
//!   honest (a fixed `buf_alloc`, a `fwd_cnt` that only counts what it
//!   received), no RW packet carries more than the guest's room as it last
//!   said it;
//! - every TX chain is returned exactly once: a used entry names a chain
//!   posted and not yet returned, with length 0; once the loop is idle the
//!   chains not returned are exactly those the device holds for host
//!   sockets that did not take their bytes, at most three quarters of the
//!   TX ring's descriptors; a TRANSPORT_RESET returns them all;
//!
//! and at the end, every TX chain was returned (a TRANSPORT_RESET first)
//! and no host descriptor leaks: after a driver reset the device holds no
//! connection and no socket waiting to close, its `conns_active` gauge is
//! 0, and every host agent's socket sees its end closed.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use arbitrary::Arbitrary;
use devices::virtio::iov::IoVecs;
use devices::virtio::mmio::MmioTransport;
use devices::virtio::queue::MAX_PASS_READS;
use devices::virtio::test_utils::{MockDriver, Segment};
use devices::virtio::vsock::packet::{Header, Op, HDR_LEN, TYPE_STREAM};
use devices::virtio::vsock::{
    Tunables, UnixBackend, Vsock, VsockBackend, VsockConfig, MAX_QUEUED_RSTS,
};
use devices::virtio::{GuestMemory, VirtioDevice};
use event_manager::{EventManager, SubscriberOps};
use vm_memory::{Bytes, GuestAddress};

const CID: u64 = 3;
const MEM_LEN: usize = 0x20_0000;
const IDLE_ITERATIONS: usize = 4096;
const MAX_CONNS: usize = 4;
const BUF_ALLOC: u32 = 8192;
/// The host ports guests connect to (listeners may or may not be there).
const PORTS: [u32; 3] = [1000, 1001, 1002];

/// Which host port a packet goes to.
#[derive(Debug, Clone, Copy, Arbitrary)]
pub enum Dst {
    /// One of [`PORTS`].
    Listen(u8),
    /// A port the device assigned to a host-initiated connection.
    Assigned(u8),
    /// Anything.
    Raw(u32),
}

/// A packet from the guest.
#[derive(Debug, Clone, Arbitrary)]
pub struct GuestPacket {
    /// The op: 1..=7 mostly, anything with `raw_op`.
    op: u8,
    raw_op: Option<u16>,
    /// The guest's port, from a small set.
    src_port: u8,
    dst: Dst,
    /// Payload bytes, folded into 0..=6000.
    len: u16,
    /// `len` in the header differs from the payload by this much.
    len_skew: Option<i8>,
    /// SHUTDOWN flags.
    flags: u8,
    /// Honest credit unless set: then these raw values (the connection's
    /// credit is no longer modelled).
    raw_credit: Option<(u32, u32)>,
    /// The guest's `buf_alloc` for a REQUEST or RESPONSE, folded into
    /// 0..=16384.
    buf_alloc: u16,
    /// Wrong source or destination CID, wrong type.
    bad_cid: bool,
    bad_dst_cid: bool,
    bad_type: bool,
    /// Cut the chain at these offsets.
    cuts: Vec<u8>,
}

/// One step.
#[derive(Debug, Clone, Arbitrary)]
pub enum Step {
    /// The guest sends a packet.
    Send(GuestPacket),
    /// The guest posts RX buffers: count folded into 1..=8, payload room
    /// into 0..=4096, header cut or not.
    PostRx {
        /// How many.
        count: u8,
        /// Payload room of each.
        room: u16,
        /// Header and payload in two descriptors.
        split: bool,
    },
    /// A host agent connects and writes a line (a good CONNECT mostly).
    HostConnect {
        /// The guest port asked for, folded into 2000..=2003.
        port: u8,
        /// Bytes written instead of the line.
        garbage: Option<Vec<u8>>,
    },
    /// A host listener appears on one of [`PORTS`].
    Listen(u8),
    /// A host socket writes bytes (folded into 1..=9000).
    HostWrite {
        /// Which host socket.
        idx: u8,
        /// How many bytes.
        len: u16,
    },
    /// A host socket reads what it can.
    HostRead(u8),
    /// A host socket shuts its write side.
    HostShutdown(u8),
    /// A host socket goes away.
    HostClose(u8),
    /// The event loop runs once more.
    Run,
    /// The device is told to send TRANSPORT_RESET; an event buffer posted.
    TransportReset,
    /// The driver resets the device and starts again.
    Reset,
}

/// The input: the steps.
#[derive(Debug, Clone, Arbitrary)]
pub struct Input {
    /// At most 64 are run.
    pub steps: Vec<Step>,
}

/// Runs one input.
pub fn run(data: &[u8]) {
    crate::with_input(data, |input: &Input| Rig::run(input));
}

/// The guest's model of one connection's credit.
#[derive(Debug, Default, Clone, Copy)]
struct GuestConn {
    buf_alloc: u32,
    /// Bytes received (what an honest `fwd_cnt` may reach).
    received: u32,
    /// The `fwd_cnt` it last sent.
    fwd_sent: u32,
    /// The guest sent raw credit: no oracle on it.
    tainted: bool,
}

struct Rig {
    dir: PathBuf,
    uds: PathBuf,
    mem: GuestMemory,
    dev: Arc<Mutex<Vsock<SmallSendBuf>>>,
    em: EventManager<Arc<Mutex<Vsock<SmallSendBuf>>>>,
    driver: MockDriver,
    features: u64,
    listeners: HashMap<u32, UnixListener>,
    host: Vec<UnixStream>,
    /// Guest side: (guest port, host port) -> credit model.
    conns: HashMap<(u32, u32), GuestConn>,
    assigned: Vec<u32>,
    /// RX chains posted: head -> (buffer address, length).
    rx: HashMap<u16, (u64, u32)>,
    /// TX chains posted and not yet returned: head -> ring descriptors.
    tx: HashMap<u16, usize>,
    next_buf: u64,
    /// Driver resets so far: each lays out new rings from the driver's
    /// area, which holds [`MAX_RESETS`] of them.
    resets: usize,
}

/// Driver resets honoured per input (later ones are skipped): the rings of
/// each take about 16 KiB of the driver's 256 KiB area.
const MAX_RESETS: usize = 8;

fn temp_dir() -> PathBuf {
    static N: AtomicU64 = AtomicU64::new(0);
    let base = std::path::Path::new("/dev/shm");
    let base = if base.is_dir() {
        base.to_path_buf()
    } else {
        std::env::temp_dir()
    };
    let d = base.join(format!(
        "mvfz-vsock-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ));
    std::fs::create_dir_all(&d).expect("a temporary directory");
    d
}

impl Drop for Rig {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The real backend, each socket it makes or accepts with the least send
/// buffer the kernel allows (a few KiB): a host agent that does not read
/// refuses the guest's bytes after a packet or two, as a slow agent does
/// after 200 KiB, within the few steps of an input.
#[derive(Debug, Default)]
pub struct SmallSendBuf(UnixBackend);

/// Sets `s`'s send buffer to the kernel's least.
#[allow(unsafe_code)]
fn shrink(s: &UnixStream) {
    use std::os::fd::AsRawFd;
    let one: libc::c_int = 1;
    // SAFETY: setsockopt reads `size_of::<c_int>()` bytes at `&one`, which
    // lives across the call; the socket's fd is open. A failure leaves the
    // default buffer, which the oracles hold to as well.
    unsafe {
        libc::setsockopt(
            s.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_SNDBUF,
            (&one as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        );
    }
}

impl VsockBackend for SmallSendBuf {
    type Stream = UnixStream;

    fn accept(&mut self, l: &UnixListener) -> std::io::Result<UnixStream> {
        let s = self.0.accept(l)?;
        shrink(&s);
        Ok(s)
    }
    fn connect(&mut self, path: &std::path::Path) -> std::io::Result<UnixStream> {
        let s = self.0.connect(path)?;
        shrink(&s);
        Ok(s)
    }
    fn recv(&mut self, s: &mut UnixStream, bufs: IoVecs<'_>) -> std::io::Result<usize> {
        self.0.recv(s, bufs)
    }
    fn send(&mut self, s: &mut UnixStream, bufs: IoVecs<'_>) -> std::io::Result<usize> {
        self.0.send(s, bufs)
    }
    fn read_bytes(&mut self, s: &mut UnixStream, buf: &mut [u8]) -> std::io::Result<usize> {
        self.0.read_bytes(s, buf)
    }
    fn write_bytes(&mut self, s: &mut UnixStream, buf: &[u8]) -> std::io::Result<usize> {
        self.0.write_bytes(s, buf)
    }
    fn shutdown_write(&mut self, s: &mut UnixStream) -> std::io::Result<()> {
        self.0.shutdown_write(s)
    }
}

/// minivmm runs with `SIGPIPE` ignored (Rust's runtime sets it before
/// `main`), so a write to a socket whose peer has gone fails with `EPIPE`,
/// on the device's side and on the host's. A libFuzzer process starts from
/// libFuzzer's own `main`, where the signal would end the campaign instead
/// (it did, once the device closed host sockets on bad packets). One of
/// the harness's two `unsafe` blocks (with `shrink`'s): no safe call sets
/// a signal's disposition.
#[allow(unsafe_code)]
fn ignore_sigpipe() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    // SAFETY: sets the disposition of one signal to "ignore"; no handler
    // runs, and no other code of the process relies on SIGPIPE.
    ONCE.call_once(|| unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_IGN);
    });
}

impl Rig {
    fn run(input: &Input) {
        ignore_sigpipe();
        let dir = temp_dir();
        let uds = dir.join("v");
        let mem = GuestMemory::from_ranges(&[(GuestAddress(0), MEM_LEN)]).expect("guest memory");
        let tun = Tunables {
            max_connections: MAX_CONNS,
            buf_alloc: BUF_ALLOC,
            // Time-outs never fire within one input: they are the unit
            // tests' business.
            connect_timeout: Duration::from_secs(60),
            shutdown_timeout: Duration::from_secs(60),
            queue_size: 64,
        };
        let cfg = VsockConfig {
            id: "vsock0".into(),
            guest_cid: CID,
            uds_path: uds.clone(),
        };
        let dev = Vsock::with_backend(cfg, tun, mem.clone(), SmallSendBuf::default())
            .expect("the device");
        let dev = Arc::new(Mutex::new(dev));
        let features = dev.lock().expect("lock").avail_features();
        let d: Arc<Mutex<dyn VirtioDevice>> = dev.clone();
        let transport = MmioTransport::new(mem.clone(), d).expect("transport");
        let driver =
            MockDriver::with_alloc_range(mem.clone(), transport, GuestAddress(0), 0x4_0000);
        let mut em = EventManager::new().expect("event manager");
        em.add_subscriber(dev.clone());
        let mut rig = Rig {
            dir,
            uds,
            mem,
            dev,
            em,
            driver,
            features,
            listeners: HashMap::new(),
            host: Vec::new(),
            conns: HashMap::new(),
            assigned: Vec::new(),
            rx: HashMap::new(),
            tx: HashMap::new(),
            next_buf: 0x8_0000,
            resets: 0,
        };
        rig.init();
        for step in input.steps.iter().take(64) {
            rig.step(step);
            rig.check();
        }
        rig.finish();
    }

    fn init(&mut self) {
        self.driver.reset();
        self.rx.clear();
        // A reset forgets the chains the device held, with the rings.
        self.tx.clear();
        self.conns.clear();
        self.driver
            .init_with_queue_size(self.features, Some(64))
            .expect("the driver starts the device");
        self.idle();
    }

    fn alloc(&mut self, len: u64) -> u64 {
        if self.next_buf + len >= MEM_LEN as u64 {
            self.next_buf = 0x8_0000;
        }
        let a = self.next_buf;
        self.next_buf = (a + len + 15) & !15;
        a
    }

    fn idle(&mut self) {
        for _ in 0..IDLE_ITERATIONS {
            if self.em.run_with_timeout(0).expect("epoll") == 0 {
                self.collect_rx();
                self.collect_tx();
                return;
            }
        }
        panic!("the event loop never went idle");
    }

    fn step(&mut self, step: &Step) {
        match step {
            Step::Send(p) => self.send(p),
            Step::PostRx { count, room, split } => self.post_rx(*count, *room, *split),
            Step::HostConnect { port, garbage } => {
                if let Ok(mut s) = UnixStream::connect(&self.uds) {
                    let line = match garbage {
                        Some(g) => g.clone(),
                        None => format!("CONNECT {}\n", 2000 + u32::from(*port % 4)).into_bytes(),
                    };
                    let _ = s.set_nonblocking(true);
                    let _ = s.write(&line);
                    self.host.push(s);
                }
            }
            Step::Listen(i) => {
                let port = PORTS[usize::from(*i) % PORTS.len()];
                let mut p = self.uds.clone().into_os_string();
                p.push(format!("_{port}"));
                if let Ok(l) = UnixListener::bind(p) {
                    let _ = l.set_nonblocking(true);
                    self.listeners.insert(port, l);
                }
            }
            Step::HostWrite { idx, len } => {
                let n = usize::from(*len) % 9000 + 1;
                if let Some(s) = self.host_at(*idx) {
                    let _ = s.write(&vec![0x5a; n]);
                }
            }
            Step::HostRead(idx) => {
                if let Some(s) = self.host_at(*idx) {
                    let _ = s.read(&mut [0u8; 16384]);
                }
            }
            Step::HostShutdown(idx) => {
                if let Some(s) = self.host_at(*idx) {
                    let _ = s.shutdown(std::net::Shutdown::Write);
                }
            }
            Step::HostClose(idx) => {
                if !self.host.is_empty() {
                    let i = usize::from(*idx) % self.host.len();
                    self.host.swap_remove(i);
                }
            }
            Step::Run => {}
            Step::TransportReset => {
                self.transport_reset();
                if let Ok(a) = self.driver.alloc(4, 4) {
                    let _ = self.driver.submit(2, &[Segment::writable(a, 4)]);
                }
            }
            Step::Reset if self.resets < MAX_RESETS => {
                self.resets += 1;
                self.init();
            }
            Step::Reset => {}
        }
        self.accept_all();
        self.idle();
    }

    fn host_at(&mut self, idx: u8) -> Option<&mut UnixStream> {
        let n = self.host.len();
        (n > 0).then(|| &mut self.host[usize::from(idx) % n])
    }

    fn accept_all(&mut self) {
        for l in self.listeners.values() {
            while let Ok((s, _)) = l.accept() {
                let _ = s.set_nonblocking(true);
                self.host.push(s);
            }
        }
    }

    fn send(&mut self, p: &GuestPacket) {
        let src_port = 100 + u32::from(p.src_port % 4);
        let dst_port = match p.dst {
            Dst::Listen(i) => PORTS[usize::from(i) % PORTS.len()],
            Dst::Assigned(i) if !self.assigned.is_empty() => {
                self.assigned[usize::from(i) % self.assigned.len()]
            }
            Dst::Assigned(_) => PORTS[0],
            Dst::Raw(v) => v,
        };
        let op = p.raw_op.unwrap_or(u16::from(p.op % 7) + 1);
        let key = (src_port, dst_port);
        let len = usize::from(p.len) % 6001;
        let mut hdr = Header {
            src_cid: if p.bad_cid { CID + 1 } else { CID },
            dst_cid: if p.bad_dst_cid { CID } else { 2 },
            src_port,
            dst_port,
            len: len as u32,
            kind: if p.bad_type { 2 } else { TYPE_STREAM },
            op,
            flags: u32::from(p.flags % 4),
            ..Header::default()
        };
        if let Some(skew) = p.len_skew {
            hdr.len = (len as i64 + i64::from(skew)).max(0) as u32;
        }
        let opens = op == Op::Request as u16 || op == Op::Response as u16;
        // A packet the device drops before it looks for a connection (a
        // wrong CID or type, a length past the chain) changes nothing the
        // device holds, so it must not change the model either: a dropped
        // REQUEST after raw credit would otherwise make an honest model
        // of a connection the device still credits by the raw values.
        let reaches = !p.bad_cid && !p.bad_dst_cid && !p.bad_type && hdr.len as usize <= len;
        // The model of a key the guest already used: a REQUEST or RESPONSE
        // on it resets the device's connection, whose RW packets may
        // already wait in RX buffers, under the old credit.
        let existed = self.conns.contains_key(&key);
        let mut scratch = GuestConn::default();
        let c = match reaches {
            true => self.conns.entry(key).or_default(),
            false => self.conns.get_mut(&key).map_or(&mut scratch, |c| &mut *c),
        };
        if opens && reaches {
            *c = GuestConn {
                buf_alloc: u32::from(p.buf_alloc) % 16385,
                tainted: existed,
                ..GuestConn::default()
            };
        }
        match p.raw_credit {
            Some((b, f)) => {
                c.tainted |= reaches;
                hdr.buf_alloc = b;
                hdr.fwd_cnt = f;
            }
            None => {
                // Honest: a fixed buffer, everything received consumed.
                let fwd = c.received;
                if reaches {
                    c.fwd_sent = fwd;
                }
                hdr.buf_alloc = c.buf_alloc;
                hdr.fwd_cnt = fwd;
            }
        }
        self.post_tx(&hdr, len, &p.cuts);
    }

    fn post_tx(&mut self, hdr: &Header, len: usize, cuts: &[u8]) {
        let mut bytes = hdr.to_bytes().to_vec();
        bytes.resize(HDR_LEN + len, 0xa5);
        let mut ends: Vec<usize> = cuts.iter().take(6).map(|&c| usize::from(c) * 24).collect();
        ends.push(bytes.len());
        ends.sort_unstable();
        let mut segs = Vec::new();
        let mut at = 0;
        for end in ends {
            let end = end.min(bytes.len());
            if end <= at {
                continue;
            }
            let a = self.alloc((end - at) as u64);
            self.mem
                .write_slice(&bytes[at..end], GuestAddress(a))
                .expect("guest memory");
            segs.push(Segment::readable(GuestAddress(a), (end - at) as u32));
            at = end;
        }
        let Ok(head) = self.driver.submit(1, &segs) else {
            return;
        };
        let prev = self.tx.insert(head, segs.len());
        assert!(prev.is_none(), "TX head {head} posted while out");
        self.idle();
    }

    /// Reads back every used TX chain: each one posted and out, length 0.
    fn collect_tx(&mut self) {
        for e in self.driver.used(1).unwrap_or_default() {
            assert_eq!(e.len, 0, "a TX chain came back with a length");
            assert!(
                self.tx.remove(&(e.id as u16)).is_some(),
                "TX chain {} returned twice or never posted",
                e.id
            );
        }
    }

    /// The device forgets every connection; the chains it held come back.
    fn transport_reset(&mut self) {
        self.dev.lock().expect("lock").transport_reset();
        self.conns.clear();
        self.idle();
        assert!(
            self.tx.is_empty(),
            "TX chains {:?} not returned after a TRANSPORT_RESET",
            self.tx
        );
    }

    fn post_rx(&mut self, count: u8, room: u16, split: bool) {
        let room = u32::from(room) % 4097;
        for _ in 0..count % 8 + 1 {
            let a = self.alloc(u64::from(room) + HDR_LEN as u64);
            let total = room + HDR_LEN as u32;
            let segs = if split && room > 0 {
                vec![
                    Segment::writable(GuestAddress(a), HDR_LEN as u32),
                    Segment::writable(GuestAddress(a + HDR_LEN as u64), room),
                ]
            } else {
                vec![Segment::writable(GuestAddress(a), total)]
            };
            match self.driver.submit(0, &segs) {
                Ok(head) => {
                    self.rx.insert(head, (a, total));
                }
                Err(_) => return,
            }
        }
    }

    /// Reads back every used RX chain and checks the packet in it.
    fn collect_rx(&mut self) {
        for e in self.driver.used(0).unwrap_or_default() {
            let Some((a, total)) = self.rx.remove(&(e.id as u16)) else {
                panic!("RX used id {} was never posted (or came back twice)", e.id);
            };
            assert!(
                e.len <= total,
                "RX used length {} past the chain's {total}",
                e.len
            );
            if e.len == 0 {
                // Refused: only a chain with no room for data may be.
                assert!(
                    total <= HDR_LEN as u32,
                    "an RX chain of {total} bytes came back empty"
                );
                continue;
            }
            let mut b = [0u8; HDR_LEN];
            self.mem
                .read_slice(&mut b, GuestAddress(a))
                .expect("guest memory");
            let h = Header::parse(&b);
            assert_eq!(
                e.len as usize,
                HDR_LEN + h.len as usize,
                "used length {h:?}"
            );
            assert_eq!(
                (h.src_cid, h.dst_cid, h.kind),
                (2, CID, TYPE_STREAM),
                "{h:?}"
            );
            let op = Op::from_u16(h.op).unwrap_or_else(|| panic!("op {} to the guest", h.op));
            self.guest_got(op, &h);
        }
    }

    fn guest_got(&mut self, op: Op, h: &Header) {
        let key = (h.dst_port, h.src_port);
        if op == Op::Request && !self.assigned.contains(&h.src_port) {
            self.assigned.push(h.src_port);
            self.assigned.truncate(8);
        }
        if op == Op::Rst {
            self.conns.remove(&key);
            return;
        }
        let Some(c) = self.conns.get_mut(&key) else {
            return;
        };
        if op == Op::Rw {
            let room = c
                .buf_alloc
                .saturating_sub(c.received.wrapping_sub(c.fwd_sent));
            assert!(
                c.tainted || h.len <= room,
                "credit exceeded: {} bytes to a guest with room for {room} ({c:?})",
                h.len
            );
            c.received = c.received.wrapping_add(h.len);
        }
    }

    fn check(&mut self) {
        let dev = self.dev.lock().expect("lock");
        let m = dev.metrics();
        let max = m.queue.max_descs_per_pass.load(Ordering::Relaxed);
        assert!(
            max <= u64::from(MAX_PASS_READS),
            "a pass read {max} descriptors"
        );
        let conns = dev.connections();
        assert!(conns <= MAX_CONNS, "{conns} connections");
        assert_eq!(
            m.conns_active.load(Ordering::Relaxed),
            conns as u64,
            "the gauge"
        );
        let bound = conns * (BUF_ALLOC as usize + 32);
        assert!(
            dev.pending_bytes() <= bound,
            "{} bytes held",
            dev.pending_bytes()
        );
        assert!(dev.queued_rsts() <= MAX_QUEUED_RSTS);
        assert_eq!(
            dev.sockets_closing(),
            0,
            "a socket left to close after an event"
        );
        // The chains not returned are the ones held, within three quarters
        // of the ring.
        assert_eq!(
            dev.held_chains(),
            self.tx.len(),
            "TX chains out that the device does not hold"
        );
        let descs: usize = self.tx.values().sum();
        assert!(descs <= 64 / 4 * 3, "{descs} TX descriptors held");
    }

    fn finish(&mut self) {
        self.transport_reset();
        self.driver.reset();
        self.idle();
        {
            let dev = self.dev.lock().expect("lock");
            assert_eq!(dev.connections(), 0, "connections after a reset");
            assert_eq!(dev.sockets_closing(), 0);
            assert_eq!(dev.metrics().conns_active.load(Ordering::Relaxed), 0);
        }
        // Every host socket connected to the device sees its end closed.
        self.accept_all();
        for s in &mut self.host {
            let mut buf = [0u8; 16384];
            loop {
                match s.read(&mut buf) {
                    Ok(0) => break,
                    Ok(_) => continue,
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                        panic!("a host socket's peer is still open after a reset")
                    }
                    Err(_) => break,
                }
            }
        }
    }
}
