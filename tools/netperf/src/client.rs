// SPDX-License-Identifier: Apache-2.0
//! Client mode: runs one test against an `mvperf server`.
//!
//! Honesty rules, which shape every test below:
//! - Only completed work counts. STREAM throughput uses the bytes the *receiver* got (the server
//!   reports its count for TCP_STREAM and UDP_STREAM); an RR transaction counts once its whole
//!   response has arrived.
//! - Nothing blocks without a timeout, and every timeout follows progress: a wait fails after
//!   the grace period without any (a connection made, a control message, a byte or transaction
//!   moved, the server taking in what our socket still held), so a server that goes silent in
//!   any phase fails the run one grace after its last sign of life, while one that is slow (an
//!   emulated guest on a host loaded by other work) but keeps going is waited for. The whole
//!   run is also capped at `-l` + [`CAP_GRACES`] graces, whatever the server does, except
//!   while a UDP_STREAM's backlog drains: that wait is bounded by what was sent (every report
//!   must count more datagrams than the last within a grace, and never more than were sent).
//! - A peer that vanishes is an error with one line naming what was going on, not a result.

use std::io;
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpStream, ToSocketAddrs, UdpSocket};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use serde_json::{json, Value};

use crate::proto::{
    describe, is_timeout, read_full, receive_stream, send_stream, Conn, Control, TestKind,
    TestParams, RR_SEQ_LEN,
};
use crate::sockopt;
use crate::stats::Histogram;
use crate::vsock::VsockPeer;

/// Where the server is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    /// Its control address (TCP and UDP tests).
    Ip(SocketAddr),
    /// Its vsock control port, reached through `peer` (VSOCK tests).
    Vsock(VsockPeer, u32),
}

impl std::fmt::Display for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Target::Ip(a) => write!(f, "{a}"),
            Target::Vsock(peer, port) => write!(f, "{} port {port}", peer.describe()),
        }
    }
}

/// Client configuration.
#[derive(Debug, Clone)]
pub struct ClientConfig {
    /// Where the server is.
    pub server: Target,
    /// Test and sizes.
    pub params: TestParams,
    /// The longest any wait may go without progress (see the module docs).
    pub grace: Duration,
    /// How long a UDP_RR request waits for its response before it counts as lost.
    pub udp_timeout: Duration,
}

/// Socket buffer sizes of both ends, in bytes as the kernels report them.
#[derive(Debug, Clone, Copy, Default)]
pub struct SockSizes {
    /// Our send buffer.
    pub local_send: u64,
    /// Our receive buffer.
    pub local_recv: u64,
    /// The server's send buffer.
    pub remote_send: u64,
    /// The server's receive buffer.
    pub remote_recv: u64,
}

impl SockSizes {
    /// Records our own buffer sizes from the socket a test uses.
    fn record_local(&mut self, sock: &impl std::os::fd::AsRawFd) {
        self.local_send = sockopt::send_buf(sock);
        self.local_recv = sockopt::recv_buf(sock);
    }
}

/// What a STREAM test measured.
#[derive(Debug, Clone, Default)]
pub struct StreamResult {
    /// Bytes the sender handed to its socket.
    pub bytes_sent: u64,
    /// Bytes the receiver actually got: the figure throughput is computed from.
    pub bytes_received: u64,
    /// Datagrams sent (UDP only).
    pub messages_sent: u64,
    /// Datagrams the server received (UDP only).
    pub messages_received: u64,
    /// Sends that failed with `ENOBUFS` (UDP only; netperf's "Errors").
    pub send_errors: u64,
    /// UDP_STREAM: from the end of sending until the server's counts arrived, while the
    /// backlog the sender built up (in the host's queues and the receiver's) drained.
    pub drain: Duration,
    /// UDP_STREAM: the server's time from its first counted datagram to its last. When a
    /// backlog drained after sending stopped this is longer than the send phase, and the
    /// received throughput is computed over it instead.
    pub receive_span: Duration,
}

/// What an RR test measured.
#[derive(Debug, Clone, Default)]
pub struct RrResult {
    /// Transactions whose response arrived.
    pub transactions: u64,
    /// UDP requests whose response never came within the timeout.
    pub lost: u64,
    /// UDP responses that arrived after their request had been given up.
    pub late: u64,
    /// Round-trip time of each completed transaction.
    pub latency: Histogram,
}

/// Per-test measurements.
#[derive(Debug, Clone)]
pub enum Measured {
    /// TCP_STREAM, TCP_MAERTS, UDP_STREAM.
    Stream(StreamResult),
    /// TCP_RR, UDP_RR.
    Rr(RrResult),
}

/// The result of one test.
#[derive(Debug, Clone)]
pub struct Outcome {
    /// Test parameters as run.
    pub params: TestParams,
    /// Where the server is.
    pub server: Target,
    /// Measured data-phase time (for TCP_STREAM: until the server confirmed receipt).
    pub elapsed: Duration,
    /// Socket buffer sizes.
    pub sizes: SockSizes,
    /// UDP_RR response timeout.
    pub udp_timeout: Duration,
    /// The counts.
    pub measured: Measured,
}

/// Resolves `host` to one address. Numeric addresses never touch the resolver, which matters in
/// a static binary inside a guest without NSS configuration.
pub fn resolve(host: &str, port: u16) -> Result<SocketAddr> {
    let bare = host
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host);
    if let Ok(ip) = bare.parse::<IpAddr>() {
        return Ok(SocketAddr::new(ip, port));
    }
    // A busybox initramfs may have no /etc/hosts; loopback needs no resolver.
    if bare.eq_ignore_ascii_case("localhost") {
        return Ok(SocketAddr::new(Ipv4Addr::LOCALHOST.into(), port));
    }
    (bare, port)
        .to_socket_addrs()
        .with_context(|| format!("cannot resolve host '{host}'"))?
        .next()
        .ok_or_else(|| anyhow!("host '{host}' has no address"))
}

/// The whole run is capped at `-l` plus this many grace periods, progress or not.
pub const CAP_GRACES: u32 = 10;

/// The time budget of one run (see the module docs): the grace period for every wait, the
/// test length, and the cap of the whole run.
struct Budget {
    grace: Duration,
    length: Duration,
    cap: Duration,
    cap_at: Instant,
}

impl Budget {
    fn new(cfg: &ClientConfig) -> Self {
        let cap = cfg.params.duration + cfg.grace * CAP_GRACES;
        Self {
            grace: cfg.grace,
            length: cfg.params.duration,
            cap,
            cap_at: Instant::now() + cap,
        }
    }

    /// Timeout for one blocking step: the grace period, cut short by the cap; an error naming
    /// `what` once the cap has passed.
    fn step(&self, what: &str) -> Result<Duration> {
        let left = self.cap_at.saturating_duration_since(Instant::now());
        if left.is_zero() {
            bail!(
                "{what}: the run's cap passed ({:.1} s: the test length plus {CAP_GRACES} \
                 graces) with the server still making progress",
                self.cap.as_secs_f64()
            );
        }
        Ok(left.min(self.grace))
    }

    /// Starts the data phase now: its start and end.
    fn data_phase(&self) -> (Instant, Instant) {
        let start = Instant::now();
        (start, start + self.length)
    }
}

/// Runs one test and returns its outcome. An error means the test did not complete (server
/// unreachable, refused, vanished or silent, or nothing at all got through).
pub fn run(cfg: &ClientConfig) -> Result<Outcome> {
    let b = Budget::new(cfg);
    let (elapsed, sizes, measured) = match &cfg.server {
        Target::Ip(addr) => run_ip(cfg, &b, *addr)?,
        Target::Vsock(peer, port) => run_vsock(cfg, &b, peer, *port)?,
    };
    let p = &cfg.params;
    match &measured {
        Measured::Stream(s) if s.bytes_received == 0 => bail!(
            "{}: no data reached the receiver in {:.2} s ({} bytes sent)",
            p.test,
            elapsed.as_secs_f64(),
            s.bytes_sent
        ),
        Measured::Rr(r) if r.transactions == 0 => bail!(
            "{}: no transaction completed in {:.2} s ({} lost)",
            p.test,
            elapsed.as_secs_f64(),
            r.lost
        ),
        _ => {}
    }
    Ok(Outcome {
        params: p.clone(),
        server: cfg.server.clone(),
        elapsed,
        sizes,
        udp_timeout: cfg.udp_timeout,
        measured,
    })
}

/// What one data phase gives: its time, the socket sizes, the counts.
type Ran = (Duration, SockSizes, Measured);

/// A TCP or UDP test against the server at `server`.
fn run_ip(cfg: &ClientConfig, b: &Budget, server: SocketAddr) -> Result<Ran> {
    let p = &cfg.params;
    if p.test.is_vsock() {
        bail!("{} needs a vsock server (--uds or --cid), not -H", p.test);
    }
    let g = b.step("connecting")?;
    let ctrl_stream = TcpStream::connect_timeout(&server, g).map_err(|e| {
        anyhow!(
            "cannot connect to mvperf server at {server}: {}",
            describe(&e, "server", g)
        )
    })?;
    // A UDP test's data socket exists before the request, which names its port: the server
    // then counts and answers datagrams from this socket only.
    let udp = if p.test.is_udp() {
        let local = ctrl_stream
            .local_addr()
            .context("control connection address")?;
        Some(udp_socket(local.ip())?)
    } else {
        None
    };
    let mut ctrl = Control::new(ctrl_stream).context("control connection setup")?;
    let mut request = request(cfg);
    if p.test == TestKind::UdpStream {
        // Count reports while we wait for results (see `udp_stream_finish`).
        request["progress"] = true.into();
    }
    if let Some(sock) = &udp {
        request["client_port"] = sock
            .local_addr()
            .context("UDP socket address")?
            .port()
            .into();
    }
    let (data_port, mut sizes) = negotiate(b, p, &mut ctrl, &request)?;
    let data_port = u16::try_from(data_port)
        .map_err(|_| anyhow!("server reply has no valid data port: {data_port}"))?;
    let addr = SocketAddr::new(server.ip(), data_port);
    let dial = |_port: u32, g: Duration| TcpStream::connect_timeout(&addr, g);
    let t = DataTest {
        cfg,
        budget: b,
        ctrl: &mut ctrl,
        dial: &dial,
        port: u32::from(data_port),
        sizes: &mut sizes,
    };
    let (elapsed, measured) = match (p.test, udp) {
        (TestKind::UdpStream, Some(sock)) => t.udp_stream(sock, addr)?,
        (TestKind::UdpRr, Some(sock)) => t.udp_rr(sock, addr)?,
        (TestKind::UdpStream | TestKind::UdpRr, None) => {
            bail!("{}: no UDP data socket was set up", p.test)
        }
        _ => t.stream_test()?,
    };
    Ok((elapsed, sizes, measured))
}

/// A VSOCK test against the server on vsock port `port`, reached through `peer`: the TCP
/// tests' exchange over vsock connections.
fn run_vsock(cfg: &ClientConfig, b: &Budget, peer: &VsockPeer, port: u32) -> Result<Ran> {
    let p = &cfg.params;
    if !p.test.is_vsock() {
        bail!("{} runs over TCP or UDP (-H), not vsock", p.test);
    }
    let g = b.step("connecting")?;
    let ctrl_stream = peer.connect(port, g).map_err(|e| {
        anyhow!(
            "cannot connect to mvperf server at {} port {port}: {}",
            peer.describe(),
            describe(&e, "server", g)
        )
    })?;
    let mut ctrl = Control::new(ctrl_stream).context("control connection setup")?;
    let (data_port, mut sizes) = negotiate(b, p, &mut ctrl, &request(cfg))?;
    let dial = |port: u32, g: Duration| peer.connect(port, g);
    let t = DataTest {
        cfg,
        budget: b,
        ctrl: &mut ctrl,
        dial: &dial,
        port: data_port,
        sizes: &mut sizes,
    };
    let (elapsed, measured) = t.stream_test()?;
    Ok((elapsed, sizes, measured))
}

/// The test request: the parameters, and our grace, which the server waits as long as for
/// each step of ours.
fn request(cfg: &ClientConfig) -> Value {
    let mut request = cfg.params.to_json();
    request["grace_s"] = cfg.grace.as_secs_f64().into();
    request
}

/// Sends the test request and reads the server's answer: its data port and socket sizes.
fn negotiate<S: Conn>(
    b: &Budget,
    p: &TestParams,
    ctrl: &mut Control<S>,
    request: &Value,
) -> Result<(u32, SockSizes)> {
    let g = b.step("sending test request")?;
    ctrl.send(request, g)
        .map_err(|e| anyhow!("sending test request: {}", describe(&e, "server", g)))?;
    let g = b.step("waiting for the server to accept the test")?;
    let reply = ctrl.recv(g).map_err(|e| {
        anyhow!(
            "waiting for the server to accept the test: {}",
            describe(&e, "server", g)
        )
    })?;
    if reply.get("ok").and_then(Value::as_bool) != Some(true) {
        let why = reply
            .get("error")
            .and_then(Value::as_str)
            .unwrap_or("no reason given");
        bail!("server refused the {} test: {why}", p.test);
    }
    let data_port = reply
        .get("data_port")
        .and_then(Value::as_u64)
        .and_then(|v| u32::try_from(v).ok())
        .ok_or_else(|| anyhow!("server reply has no valid data port: {reply}"))?;
    let sizes = SockSizes {
        remote_recv: reply.get("recv_buf").and_then(Value::as_u64).unwrap_or(0),
        remote_send: reply.get("send_buf").and_then(Value::as_u64).unwrap_or(0),
        ..SockSizes::default()
    };
    Ok((data_port, sizes))
}

/// One test's data phase, which consumes it: the configuration, the time budget, the control
/// connection (the server reports on it), how to open a connection to the server's data
/// port, and the socket sizes, where the test records its own socket's.
struct DataTest<'a, S: Conn> {
    cfg: &'a ClientConfig,
    budget: &'a Budget,
    ctrl: &'a mut Control<S>,
    dial: &'a dyn Fn(u32, Duration) -> io::Result<S>,
    port: u32,
    sizes: &'a mut SockSizes,
}

fn set_tcp_timeouts(s: &impl Conn, t: Duration) -> Result<()> {
    s.read_timeout(Some(t))?;
    s.write_timeout(Some(t))?;
    Ok(())
}

/// Waits for the server's report of the test (which it sends once its side of the data phase
/// is over) while there is progress: `unacked` reads what our data socket still holds for the
/// server, and any change in it is progress (a STREAM test's backlog draining into a slow
/// receiver); without it (`None`), only the report itself is.
fn await_report<S: Conn>(
    ctrl: &mut Control<S>,
    b: &Budget,
    mut unacked: impl FnMut() -> Option<u64>,
) -> Result<Value> {
    let mut last = unacked();
    let mut give_up = Instant::now() + b.grace;
    loop {
        let left = give_up.saturating_duration_since(Instant::now());
        if left.is_zero() {
            bail!(
                "waiting for results: server stopped responding (no progress for {:.1} s)",
                b.grace.as_secs_f64()
            );
        }
        let wait = b.step("waiting for results")?.min(left).min(PROGRESS_POLL);
        match ctrl.recv(wait) {
            Ok(v) => return Ok(v),
            Err(e) if is_timeout(&e) => {}
            Err(e) => bail!("waiting for results: {}", describe(&e, "server", b.grace)),
        }
        let now = unacked();
        if now != last {
            last = now;
            give_up = Instant::now() + b.grace;
        }
    }
}

/// No progress to watch while waiting for a report but the report itself.
const NO_PROBE: fn() -> Option<u64> = || None;

/// What a TCP stream test (either direction) measured: bytes only, since
/// TCP has no messages to count.
fn tcp_measured(sent: u64, received: u64) -> Measured {
    Measured::Stream(StreamResult {
        bytes_sent: sent,
        bytes_received: received,
        ..StreamResult::default()
    })
}

fn report_u64(report: &Value, key: &str) -> Result<u64> {
    if let Some(why) = report.get("error").and_then(Value::as_str) {
        bail!("the server failed the test: {why}");
    }
    report
        .get(key)
        .and_then(Value::as_u64)
        .ok_or_else(|| anyhow!("server results lack '{key}': {report}"))
}

impl<S: Conn> DataTest<'_, S> {
    /// Runs the stream test this one is (a VSOCK test runs its TCP namesake's).
    fn stream_test(self) -> Result<(Duration, Measured)> {
        match self.cfg.params.test.stream_kind() {
            TestKind::TcpStream => self.tcp_stream(),
            TestKind::TcpMaerts => self.tcp_maerts(),
            TestKind::TcpRr => self.tcp_rr(),
            other => bail!("{other} is not a stream test"),
        }
    }

    /// Opens the data connection and records its buffer sizes.
    fn connect_tcp(&mut self) -> Result<S> {
        let g = self.budget.step("opening the data connection")?;
        let s = (self.dial)(self.port, g).map_err(|e| {
            anyhow!(
                "opening the data connection to port {}: {}",
                self.port,
                describe(&e, "server", g)
            )
        })?;
        set_tcp_timeouts(&s, g)?;
        self.sizes.record_local(&s);
        Ok(s)
    }

    /// Connects the UDP data socket to the server's, so an ICMP port unreachable (server
    /// gone) comes back as ECONNREFUSED and datagrams from anyone else are dropped, and
    /// records its buffer sizes.
    fn connect_udp(&mut self, sock: &UdpSocket, addr: SocketAddr) -> Result<()> {
        sock.connect(addr)
            .with_context(|| format!("connecting the UDP socket to {addr}"))?;
        self.sizes.record_local(sock);
        Ok(())
    }

    fn tcp_stream(mut self) -> Result<(Duration, Measured)> {
        let mut data = self.connect_tcp()?;
        let buf = vec![0x5au8; self.cfg.params.msg_size];
        let g = self.budget.grace;
        let (start, end) = self.budget.data_phase();
        // Every write that moves a byte is progress; one that blocks a grace long is not.
        let sent = send_stream(&mut data, &buf, end)
            .map_err(|e| anyhow!("sending data: {}", describe(&e, "server", g)))?;
        data.shutdown_write()
            .map_err(|e| anyhow!("ending the stream: {}", describe(&e, "server", g)))?;
        // The server replies once it has read everything up to our FIN, so the elapsed time
        // includes draining what was still queued: bytes and time describe the same delivery.
        // A slow receiver takes long for that; each byte it takes in is progress.
        let report = await_report(self.ctrl, self.budget, || sockopt::unacked(&data))?;
        let elapsed = start.elapsed();
        let received = report_u64(&report, "bytes")?;
        if received > sent {
            bail!("server claims {received} bytes but only {sent} were sent");
        }
        Ok((elapsed, tcp_measured(sent, received)))
    }

    fn tcp_maerts(mut self) -> Result<(Duration, Measured)> {
        let mut data = self.connect_tcp()?;
        let mut buf = vec![0u8; self.cfg.params.msg_size.max(64 * 1024)];
        let g = self.budget.grace;
        let (start, _) = self.budget.data_phase();
        let received = receive_stream(&mut data, &mut buf, self.budget.cap_at)
            .map_err(|e| anyhow!("receiving data: {}", describe(&e, "server", g)))?
            .ok_or_else(|| anyhow!("receiving data: server kept sending past the run's cap"))?;
        let elapsed = start.elapsed();
        // A server killed mid-test also ends the stream with a FIN; only its report proves the
        // stream ended because the test did.
        let report = await_report(self.ctrl, self.budget, NO_PROBE)?;
        let sent = report_u64(&report, "bytes_sent")?;
        if sent != received {
            bail!("server sent {sent} bytes but {received} arrived");
        }
        Ok((elapsed, tcp_measured(sent, received)))
    }

    fn tcp_rr(mut self) -> Result<(Duration, Measured)> {
        let mut data = self.connect_tcp()?;
        data.no_delay()?;
        let req = vec![0x5au8; self.cfg.params.req_size];
        let mut resp = vec![0u8; self.cfg.params.resp_size];
        let mut r = RrResult::default();
        let g = self.budget.grace;
        let (start, end) = self.budget.data_phase();
        while Instant::now() < end {
            let t = Instant::now();
            data.write_all(&req)
                .map_err(|e| anyhow!("sending request: {}", describe(&e, "server", g)))?;
            match read_full(&mut data, &mut resp) {
                Ok(true) => {}
                Ok(false) => bail!("waiting for response: server went away (connection closed)"),
                Err(e) => bail!("waiting for response: {}", describe(&e, "server", g)),
            }
            r.latency.record(t.elapsed());
            r.transactions += 1;
        }
        let elapsed = start.elapsed();
        data.shutdown_write()
            .map_err(|e| anyhow!("ending the test: {}", describe(&e, "server", g)))?;
        let report = await_report(self.ctrl, self.budget, NO_PROBE)?;
        let served = report_u64(&report, "transactions")?;
        if served != r.transactions {
            bail!(
                "server served {served} transactions but {} completed here",
                r.transactions
            );
        }
        Ok((elapsed, Measured::Rr(r)))
    }

    fn udp_stream(mut self, sock: UdpSocket, addr: SocketAddr) -> Result<(Duration, Measured)> {
        self.connect_udp(&sock, addr)?;
        let buf = vec![0x5au8; self.cfg.params.msg_size];
        let mut s = StreamResult::default();
        let g = self.budget.grace;
        let (start, end) = self.budget.data_phase();
        sock.set_write_timeout(Some(g))?;
        while Instant::now() < end {
            match sock.send(&buf) {
                Ok(n) => {
                    s.messages_sent += 1;
                    s.bytes_sent += n as u64;
                }
                // A full device queue drops the datagram; netperf counts these as send errors.
                Err(e) if e.raw_os_error() == Some(libc::ENOBUFS) => s.send_errors += 1,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => bail!("sending datagrams: {}", describe(&e, "server", g)),
            }
        }
        let elapsed = start.elapsed();
        let report = udp_stream_finish(self.ctrl, &sock, self.budget, s.messages_sent)?;
        s.drain = start.elapsed().saturating_sub(elapsed);
        s.messages_received = report_u64(&report, "messages")?;
        s.receive_span = report
            .get("rx_span_s")
            .and_then(Value::as_f64)
            .filter(|v| v.is_finite() && *v >= 0.0)
            .map_or(Duration::ZERO, Duration::from_secs_f64);
        s.bytes_received = report_u64(&report, "bytes")?;
        check_received_le_sent(&s)?;
        Ok((elapsed, Measured::Stream(s)))
    }

    fn udp_rr(mut self, sock: UdpSocket, addr: SocketAddr) -> Result<(Duration, Measured)> {
        let p = &self.cfg.params;
        self.connect_udp(&sock, addr)?;
        // Each request starts with a 64-bit sequence number that the server echoes, so a response
        // that arrives after we gave up on its request is never mistaken for the current one.
        let mut req = vec![0x5au8; RR_SEQ_LEN + p.req_size];
        let mut resp = vec![0u8; 65536];
        let mut r = RrResult::default();
        let g = self.budget.grace;
        let (start, end) = self.budget.data_phase();
        sock.set_write_timeout(Some(g))?;
        // Never wait for one response longer than a grace, however long --udp-timeout-ms is.
        let udp_timeout = self.cfg.udp_timeout.min(g);
        sock.set_read_timeout(Some(udp_timeout))?;
        let mut seq = 0u64;
        while Instant::now() < end {
            seq += 1;
            req[..RR_SEQ_LEN].copy_from_slice(&seq.to_le_bytes());
            let t = Instant::now();
            match sock.send(&req) {
                Ok(_) => {}
                Err(e) if e.raw_os_error() == Some(libc::ENOBUFS) => {
                    r.lost += 1;
                    continue;
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => bail!("sending request: {}", describe(&e, "server", g)),
            }
            loop {
                match sock.recv(&mut resp) {
                    Ok(n) if answers(&resp[..n], seq, p.resp_size) => {
                        r.latency.record(t.elapsed());
                        r.transactions += 1;
                        break;
                    }
                    Ok(_) => {
                        r.late += 1;
                        if t.elapsed() >= udp_timeout {
                            r.lost += 1;
                            break;
                        }
                    }
                    Err(e) if is_timeout(&e) => {
                        r.lost += 1;
                        break;
                    }
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(e) => bail!("waiting for response: {}", describe(&e, "server", g)),
                }
            }
        }
        let elapsed = start.elapsed();
        let report = udp_finish(self.ctrl, self.budget)?;
        let served = report_u64(&report, "transactions")?;
        if served < r.transactions {
            bail!(
                "server answered {served} requests but {} responses arrived",
                r.transactions
            );
        }
        Ok((elapsed, Measured::Rr(r)))
    }
}

/// The UDP data socket, bound on the address the control connection comes from, so that the
/// server sees the address it was told.
fn udp_socket(local: IpAddr) -> Result<UdpSocket> {
    UdpSocket::bind((local, 0)).with_context(|| format!("binding a UDP socket on {local}"))
}

/// The receiver cannot have more than was sent: a server claiming so is broken or counts
/// someone else's traffic.
fn check_received_le_sent(s: &StreamResult) -> Result<()> {
    if s.messages_received > s.messages_sent || s.bytes_received > s.bytes_sent {
        bail!(
            "server claims {} datagrams ({} bytes) but only {} ({} bytes) were sent",
            s.messages_received,
            s.bytes_received,
            s.messages_sent,
            s.bytes_sent
        );
    }
    Ok(())
}

/// Tells the server the UDP data phase is over and collects its counts.
fn udp_finish<S: Conn>(ctrl: &mut Control<S>, b: &Budget) -> Result<Value> {
    let wait = b.step("ending the test")?;
    ctrl.send(&json!({"done": true}), wait)
        .map_err(|e| anyhow!("ending the test: {}", describe(&e, "server", wait)))?;
    await_report(ctrl, b, NO_PROBE)
}

/// How long one wait for the results lasts before the progress datagrams are read.
const PROGRESS_POLL: Duration = Duration::from_millis(100);

/// Ends a UDP_STREAM test and collects the server's counts, waiting as long as the server's
/// count keeps growing. An unpaced sender can queue far more than a slow receiver takes in
/// a grace period (a TAP's 1000 frames ahead of an emulated guest: tens of seconds), and the
/// end-of-test message waits behind that backlog; the server reports its count twice a second
/// meanwhile (we asked for it with `"progress": true`). The reports come as datagrams to our
/// data socket, not on the control connection: the server's TCP needs our ACKs to send, and
/// those wait behind the same backlog (a flooded guest's reports were held for as long as the
/// backlog took, and the client gave up). The wait fails only when no report shows progress
/// for a grace period. The run's cap does not end it: the backlog is finite (the count only
/// grows, and never past `sent`), and a guest kept off the CPU by a loaded host drained the
/// 5 s test's backlog for longer than the cap while counting on.
fn udp_stream_finish<S: Conn>(
    ctrl: &mut Control<S>,
    sock: &UdpSocket,
    b: &Budget,
    sent: u64,
) -> Result<Value> {
    let grace = b.grace;
    let wait = b.step("ending the test")?;
    ctrl.send(&json!({"done": true}), wait)
        .map_err(|e| anyhow!("ending the test: {}", describe(&e, "server", wait)))?;
    sock.set_nonblocking(true)?;
    let mut buf = [0u8; 512];
    let mut counted = 0u64;
    let mut progressed = Instant::now();
    loop {
        let wait = grace.saturating_sub(progressed.elapsed());
        if wait.is_zero() {
            bail!(
                "waiting for results: server stopped making progress (no new datagram counted \
                 for {:.1} s, {counted} of {sent} so far)",
                grace.as_secs_f64()
            );
        }
        match ctrl.recv(wait.min(PROGRESS_POLL)) {
            Ok(v) => return Ok(v),
            Err(e) if is_timeout(&e) => {}
            Err(e) => bail!("waiting for results: {}", describe(&e, "server", grace)),
        }
        loop {
            let n = match sock.recv(&mut buf) {
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                // Drained (`WouldBlock`), or an ICMP error from the path: the control
                // connection decides whether the server is gone.
                Err(_) => break,
            };
            let Some(p) = serde_json::from_slice::<Value>(&buf[..n])
                .ok()
                .and_then(|v| v.get("progress").cloned())
            else {
                bail!("the server sent a datagram that is not a progress report");
            };
            let n = report_u64(&p, "messages")?;
            if n > sent {
                bail!("server claims {n} datagrams but only {sent} were sent");
            }
            if n > counted {
                counted = n;
                progressed = Instant::now();
            }
        }
    }
}

/// Whether a UDP_RR datagram is the response to request `seq`: the full 64-bit sequence
/// number echoed, then `resp_size` bytes.
fn answers(datagram: &[u8], seq: u64, resp_size: usize) -> bool {
    datagram.len() == RR_SEQ_LEN + resp_size && datagram[..RR_SEQ_LEN] == seq.to_le_bytes()
}

#[cfg(test)]
mod tests {
    use std::io::Write;

    use super::*;

    #[test]
    fn resolve_numeric_addresses_without_dns() {
        for (host, port, want) in [
            ("127.0.0.1", 5, "127.0.0.1:5"),
            ("::1", 6, "[::1]:6"),
            ("LocalHost", 8, "127.0.0.1:8"),
            ("[::1]", 7, "[::1]:7"),
        ] {
            assert_eq!(
                resolve(host, port).expect(host),
                want.parse::<SocketAddr>().expect("addr")
            );
        }
    }

    #[test]
    fn server_reports_are_checked() {
        assert_eq!(report_u64(&json!({"bytes": 7}), "bytes").expect("ok"), 7);
        let e = report_u64(&json!({"error": "disk on fire"}), "bytes").expect_err("error");
        assert!(
            e.to_string()
                .contains("server failed the test: disk on fire"),
            "{e}"
        );
        assert!(report_u64(&json!({"bytes": -1}), "bytes").is_err());
    }

    #[test]
    fn rr_responses_match_only_their_own_request() {
        let reply = |seq: u64, len: usize| {
            let mut d = seq.to_le_bytes().to_vec();
            d.resize(RR_SEQ_LEN + len, 0xa5);
            d
        };
        assert!(answers(&reply(257, 1), 257, 1));
        // 256 requests late: a one-byte tag would have matched.
        assert!(!answers(&reply(1, 1), 257, 1));
        assert!(!answers(&reply(257 + (1 << 32), 1), 257, 1));
        assert!(!answers(&reply(257, 2), 257, 1));
        assert!(!answers(&reply(257, 1)[..RR_SEQ_LEN], 257, 1));
    }

    #[test]
    fn udp_stream_receiver_cannot_exceed_sender() {
        let sent = StreamResult {
            bytes_sent: 3000,
            messages_sent: 3,
            bytes_received: 2000,
            messages_received: 2,
            ..StreamResult::default()
        };
        assert!(check_received_le_sent(&sent).is_ok());
        let all = StreamResult {
            bytes_received: 3000,
            messages_received: 3,
            ..sent.clone()
        };
        assert!(check_received_le_sent(&all).is_ok());
        let more_messages = StreamResult {
            messages_received: 4,
            ..sent.clone()
        };
        let e = check_received_le_sent(&more_messages).expect_err("more datagrams than sent");
        assert!(e.to_string().contains("only 3"), "{e}");
        let more_bytes = StreamResult {
            bytes_received: 3001,
            ..sent
        };
        assert!(check_received_le_sent(&more_bytes).is_err());
    }

    /// A budget of `grace` per wait whose cap is `cap` from now.
    fn budget(grace: Duration, cap: Duration) -> Budget {
        Budget {
            grace,
            length: Duration::from_secs(1),
            cap,
            cap_at: Instant::now() + cap,
        }
    }

    #[test]
    fn negotiation_gives_the_data_port_and_the_servers_buffer_sizes() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("listen");
        let client = TcpStream::connect(listener.local_addr().expect("addr")).expect("connect");
        let (server, _) = listener.accept().expect("accept");
        let server = std::thread::spawn(move || {
            let mut ctrl = Control::new(server).expect("control");
            let req = ctrl.recv(Duration::from_secs(5)).expect("request");
            let reply = json!({"ok": true, "data_port": 70000, "recv_buf": 111, "send_buf": 222});
            ctrl.send(&reply, Duration::from_secs(5)).expect("reply");
            req
        });
        let cfg = rr_config(
            "127.0.0.1:1".parse().expect("addr"),
            Duration::from_secs(1),
            Duration::from_secs(2),
        );
        let mut ctrl = Control::new(client).expect("control");
        let b = Budget::new(&cfg);
        let (port, sizes) = negotiate(&b, &cfg.params, &mut ctrl, &request(&cfg)).expect("ok");
        // A vsock port may be past 65535.
        assert_eq!(port, 70000);
        assert_eq!((sizes.remote_recv, sizes.remote_send), (111, 222));
        let req = server.join().expect("fake server");
        assert_eq!(req["grace_s"].as_f64(), Some(2.0), "{req}");
    }

    #[test]
    fn a_server_that_leaves_while_the_report_is_awaited_fails_at_once() {
        // The grace is long: only a closed connection, not a silence, can end the wait soon.
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("listen");
        let client = TcpStream::connect(listener.local_addr().expect("addr")).expect("connect");
        let (server, _) = listener.accept().expect("accept");
        let b = budget(Duration::from_secs(20), Duration::from_secs(60));
        let mut ctrl = Control::new(client).expect("control");
        let leaving = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(300));
            drop(server);
        });
        let t = Instant::now();
        let e = await_report(&mut ctrl, &b, NO_PROBE).expect_err("the server left");
        let took = t.elapsed();
        leaving.join().expect("server thread");
        assert!(
            e.to_string()
                .starts_with("waiting for results: server went away"),
            "{e}"
        );
        assert!(took < Duration::from_secs(5), "{took:?}");
    }

    #[test]
    fn a_step_waits_a_grace_until_the_cap() {
        let b = budget(Duration::from_secs(2), Duration::from_secs(60));
        assert_eq!(b.step("x").expect("before the cap"), Duration::from_secs(2));
        let near = budget(Duration::from_secs(2), Duration::from_millis(500));
        assert!(near.step("x").expect("before the cap") <= Duration::from_millis(500));
        let past = budget(Duration::from_secs(2), Duration::ZERO);
        let e = past.step("waiting").expect_err("past the cap").to_string();
        assert!(e.starts_with("waiting: the run's cap passed"), "{e}");
        let cfg = ClientConfig {
            server: Target::Ip("127.0.0.1:1".parse().expect("addr")),
            params: TestParams {
                test: TestKind::TcpRr,
                duration: Duration::from_secs(5),
                msg_size: 1,
                req_size: 1,
                resp_size: 1,
            },
            grace: Duration::from_secs(60),
            udp_timeout: Duration::from_millis(250),
        };
        assert_eq!(Budget::new(&cfg).cap, Duration::from_secs(605));
    }
    /// A server's end of `udp_stream_finish`: it reads `done`, then sends `reports` (counts)
    /// as progress datagrams `every` apart, then the result line if `result` is given.
    fn finish_against(
        reports: Vec<u64>,
        every: Duration,
        result: Option<Value>,
        grace: Duration,
        sent: u64,
        cap: Duration,
    ) -> (Result<Value>, Duration) {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("listen");
        let client_ctrl =
            TcpStream::connect(listener.local_addr().expect("addr")).expect("connect");
        let (server_ctrl, _) = listener.accept().expect("accept");
        let client_udp = UdpSocket::bind("127.0.0.1:0").expect("bind");
        let server_udp = UdpSocket::bind("127.0.0.1:0").expect("bind");
        client_udp
            .connect(server_udp.local_addr().expect("addr"))
            .expect("connect");
        server_udp
            .connect(client_udp.local_addr().expect("addr"))
            .expect("connect");
        let server = std::thread::spawn(move || {
            let mut ctrl = Control::new(server_ctrl).expect("control");
            let done = ctrl.recv(Duration::from_secs(5)).expect("done");
            assert_eq!(done, json!({"done": true}));
            for n in reports {
                std::thread::sleep(every);
                let r = json!({"progress": {"messages": n, "bytes": n * 100}});
                server_udp.send(r.to_string().as_bytes()).expect("report");
            }
            if let Some(v) = result {
                ctrl.send(&v, Duration::from_secs(5)).expect("result");
            }
            // Keep the connection open until the client is done with it.
            let _ = ctrl.recv(Duration::from_secs(10));
        });
        let mut ctrl = Control::new(client_ctrl).expect("control");
        let b = budget(grace, cap);
        let t = Instant::now();
        let out = udp_stream_finish(&mut ctrl, &client_udp, &b, sent);
        let took = t.elapsed();
        drop(ctrl);
        server.join().expect("fake server");
        (out, took)
    }

    /// A backlog whose count keeps growing is waited for, also past the run's cap: the cap is
    /// for a run that never ends, and a finite backlog whose count grows ends.
    #[test]
    fn udp_stream_waits_for_results_while_the_count_grows() {
        let grace = Duration::from_millis(400);
        let result = json!({"messages": 9, "bytes": 900});
        for cap in [Duration::from_secs(30), Duration::from_millis(500)] {
            // Nine reports 150 ms apart: the results come 1.35 s after `done`, three graces.
            let (out, took) = finish_against(
                (1..=9).collect(),
                Duration::from_millis(150),
                Some(result.clone()),
                grace,
                20,
                cap,
            );
            assert_eq!(out.expect("results"), result, "cap {cap:?}");
            assert!(took >= Duration::from_millis(1350), "took {took:?}");
        }
    }

    #[test]
    fn udp_stream_gives_up_one_grace_after_the_count_stops() {
        let grace = Duration::from_millis(400);
        // The count grows to 3 by 300 ms, then reports keep coming without growth.
        let (out, took) = finish_against(
            vec![1, 2, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3],
            Duration::from_millis(100),
            None,
            grace,
            20,
            Duration::from_secs(30),
        );
        let e = out.expect_err("stalled server").to_string();
        assert!(e.contains("stopped making progress"), "{e}");
        assert!(e.contains("3 of 20"), "{e}");
        // The last growth at about 300 ms, one grace later the end.
        assert!(took >= Duration::from_millis(650), "took {took:?}");
        assert!(took < Duration::from_millis(1100), "took {took:?}");
    }

    #[test]
    fn udp_stream_refuses_reports_past_what_was_sent() {
        let grace = Duration::from_millis(400);
        let (out, _) = finish_against(
            vec![21],
            Duration::from_millis(10),
            None,
            grace,
            20,
            Duration::from_secs(30),
        );
        let e = out.expect_err("impossible count").to_string();
        assert!(e.contains("server claims 21 datagrams but only 20"), "{e}");
    }

    /// A TCP_RR server that takes `pause` before each of its steps (the setup reply, the data
    /// connection, the report), as a guest on a loaded host does, serving transactions at once
    /// in between. Returns its control address.
    fn slow_rr_server(pause: Duration) -> SocketAddr {
        let ctrl_listener = std::net::TcpListener::bind("127.0.0.1:0").expect("listen");
        let addr = ctrl_listener.local_addr().expect("addr");
        std::thread::spawn(move || {
            let (ctrl, _) = ctrl_listener.accept().expect("accept");
            let mut ctrl = Control::new(ctrl).expect("control");
            let req = ctrl.recv(Duration::from_secs(5)).expect("request");
            assert!(req["grace_s"].as_f64().is_some(), "{req}");
            let data_listener = std::net::TcpListener::bind("127.0.0.1:0").expect("listen");
            let port = data_listener.local_addr().expect("addr").port();
            std::thread::sleep(pause);
            ctrl.send(
                &json!({"ok": true, "data_port": port}),
                Duration::from_secs(5),
            )
            .expect("reply");
            std::thread::sleep(pause);
            let (mut data, _) = data_listener.accept().expect("data");
            let mut byte = [0u8; 1];
            let mut transactions = 0u64;
            while read_full(&mut data, &mut byte).expect("request") {
                data.write_all(&byte).expect("response");
                transactions += 1;
            }
            std::thread::sleep(pause);
            let report = json!({"transactions": transactions});
            ctrl.send(&report, Duration::from_secs(5)).expect("report");
            let _ = ctrl.recv(Duration::from_secs(10));
        });
        addr
    }

    fn rr_config(server: SocketAddr, length: Duration, grace: Duration) -> ClientConfig {
        ClientConfig {
            server: Target::Ip(server),
            params: TestParams {
                test: TestKind::TcpRr,
                duration: length,
                msg_size: 1,
                req_size: 1,
                resp_size: 1,
            },
            grace,
            udp_timeout: Duration::from_millis(250),
        }
    }

    /// A 0.3 s TCP_RR with a 1 s grace against [`slow_rr_server`] pausing `pause` at each
    /// step: the run's configuration, outcome and time.
    fn run_against_slow_server(pause: Duration) -> (ClientConfig, Result<Outcome>, Duration) {
        let cfg = rr_config(
            slow_rr_server(pause),
            Duration::from_millis(300),
            Duration::from_secs(1),
        );
        let t = Instant::now();
        let out = run(&cfg);
        (cfg, out, t.elapsed())
    }

    #[test]
    fn a_slow_server_that_keeps_going_is_waited_for() {
        // Each of three steps takes 0.7 s, within the 1 s grace: the run takes longer than the
        // test length plus one grace (the old fixed budget, which failed it) and passes.
        let (cfg, out, took) = run_against_slow_server(Duration::from_millis(700));
        let out = out.expect("a slow server still completes");
        assert!(took > cfg.params.duration + cfg.grace, "took {took:?}");
        let Measured::Rr(r) = out.measured else {
            panic!("not an RR result")
        };
        assert!(r.transactions > 0);
    }

    #[test]
    fn a_server_that_stops_fails_the_run_one_grace_later() {
        let (_, out, took) = run_against_slow_server(Duration::from_secs(3));
        let e = out.expect_err("a stalled server").to_string();
        assert!(
            e.contains("waiting for the server to accept the test: server stopped responding"),
            "{e}"
        );
        assert!(
            took >= Duration::from_secs(1) && took < Duration::from_millis(1800),
            "{took:?}"
        );
    }

    #[test]
    fn a_stream_backlog_draining_into_a_slow_receiver_is_progress() {
        // The server, its receive buffer small, reads 192 KiB every 100 ms and reports only
        // after the client's FIN: the backlog the client queued in 0.3 s (megabytes) takes
        // several graces of 0.4 s to drain, but every read shows as our socket holding less.
        let ctrl_listener = std::net::TcpListener::bind("127.0.0.1:0").expect("listen");
        let addr = ctrl_listener.local_addr().expect("addr");
        let server = std::thread::spawn(move || {
            let (ctrl, _) = ctrl_listener.accept().expect("accept");
            let mut ctrl = Control::new(ctrl).expect("control");
            ctrl.recv(Duration::from_secs(5)).expect("request");
            let data_listener = std::net::TcpListener::bind("127.0.0.1:0").expect("listen");
            // Accepted sockets inherit it; a small window moves with every read.
            sockopt::set_recv_buf(&data_listener, 128 * 1024).expect("SO_RCVBUF");
            let port = data_listener.local_addr().expect("addr").port();
            ctrl.send(
                &json!({"ok": true, "data_port": port}),
                Duration::from_secs(5),
            )
            .expect("reply");
            let (mut data, _) = data_listener.accept().expect("data");
            let mut buf = vec![0u8; 64 * 1024];
            let mut total = 0u64;
            'ticks: loop {
                std::thread::sleep(Duration::from_millis(100));
                let tick_end = total + 192 * 1024;
                while total < tick_end {
                    match std::io::Read::read(&mut data, &mut buf).expect("read") {
                        0 => break 'ticks,
                        n => total += n as u64,
                    }
                }
            }
            ctrl.send(&json!({"bytes": total}), Duration::from_secs(5))
                .expect("report");
            let _ = ctrl.recv(Duration::from_secs(10));
        });
        let cfg = backlog_config(Target::Ip(addr), TestKind::TcpStream, 65536);
        let (out, took) = timed_run(&cfg);
        server.join().expect("fake server");
        assert_backlog_drained(&cfg, out, took);
    }

    /// A 0.3 s stream test of `msg_size` writes with a 0.4 s grace, against `server`.
    fn backlog_config(server: Target, test: TestKind, msg_size: usize) -> ClientConfig {
        ClientConfig {
            server,
            params: TestParams {
                test,
                duration: Duration::from_millis(300),
                msg_size,
                req_size: 1,
                resp_size: 1,
            },
            grace: Duration::from_millis(400),
            udp_timeout: Duration::from_millis(250),
        }
    }

    fn timed_run(cfg: &ClientConfig) -> (Result<Outcome>, Duration) {
        let t = Instant::now();
        let out = run(cfg);
        (out, t.elapsed())
    }

    /// The run passed, all that was sent arrived, and draining it took over two graces.
    fn assert_backlog_drained(cfg: &ClientConfig, out: Result<Outcome>, took: Duration) {
        let out = out.expect("the backlog drains");
        assert!(
            took > cfg.params.duration + cfg.grace * 2,
            "the run took {took:?}: the backlog drained too fast to show anything"
        );
        let Measured::Stream(s) = out.measured else {
            panic!("not a stream result")
        };
        assert_eq!(s.bytes_received, s.bytes_sent);
    }

    /// A VMM's side of a host connection to the guest's vsock port: reads the `CONNECT`
    /// line a byte at a time (what follows is the test's), answers `OK`, and says the port.
    fn uds_accept(l: &std::os::unix::net::UnixListener) -> (std::os::unix::net::UnixStream, u32) {
        use std::io::Read;
        let (mut s, _) = l.accept().expect("accept");
        let mut line = Vec::new();
        let mut b = [0u8; 1];
        while line.last() != Some(&b'\n') && s.read(&mut b).expect("CONNECT line") == 1 {
            line.push(b[0]);
        }
        let line = String::from_utf8(line).expect("UTF-8");
        let port = line
            .strip_prefix("CONNECT ")
            .and_then(|p| p.trim().parse().ok())
            .expect("CONNECT <port>");
        s.write_all(b"OK 1073741824\n").expect("OK");
        (s, port)
    }

    #[test]
    fn a_vsock_stream_backlog_draining_into_a_slow_guest_is_progress() {
        // Through a VMM's Unix socket, the guest's server reads 16 KiB every 100 ms and reports
        // only after the client's FIN: what the client's socket still holds (a Unix stream's
        // send buffer) takes several graces of 0.4 s to drain, each read progress.
        let dir = std::env::temp_dir().join(format!("mvperf-client-uds-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("scratch directory");
        let uds = dir.join("v.sock");
        let l = std::os::unix::net::UnixListener::bind(&uds).expect("the VMM's socket");
        let server = std::thread::spawn(move || {
            let (ctrl, port) = uds_accept(&l);
            assert_eq!(port, 12865);
            let mut ctrl = Control::new(ctrl).expect("control");
            let req = ctrl.recv(Duration::from_secs(5)).expect("request");
            // The guest's server waits as long as the client does for each step.
            assert_eq!(req["grace_s"].as_f64(), Some(0.4), "{req}");
            ctrl.send(
                &json!({"ok": true, "data_port": 1025}),
                Duration::from_secs(5),
            )
            .expect("reply");
            let (mut data, port) = uds_accept(&l);
            assert_eq!(port, 1025);
            let mut buf = vec![0u8; 16 * 1024];
            let mut total = 0u64;
            loop {
                std::thread::sleep(Duration::from_millis(100));
                match std::io::Read::read(&mut data, &mut buf).expect("read") {
                    0 => break,
                    n => total += n as u64,
                }
            }
            // A client that gave up is gone: its error is the test's.
            let _ = ctrl.send(&json!({"bytes": total}), Duration::from_secs(5));
            let _ = ctrl.recv(Duration::from_secs(10));
        });
        let target = Target::Vsock(VsockPeer::Uds(uds), 12865);
        let cfg = backlog_config(target, TestKind::VsockStream, 16 * 1024);
        let (out, took) = timed_run(&cfg);
        server.join().expect("fake guest");
        let _ = std::fs::remove_dir_all(&dir);
        assert_backlog_drained(&cfg, out, took);
    }
}
