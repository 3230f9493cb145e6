// SPDX-License-Identifier: Apache-2.0
//! Server mode (`mvperf server`), the counterpart of netperf's `netserver`.
//!
//! The server accepts control connections forever and serves each on its own thread, so clients
//! may run tests concurrently. With `--vsock` it also takes the VSOCK tests on vsock port
//! `--port` (`AF_VSOCK`, in a guest), or with `--uds BASE` on the Unix socket `BASE_<port>`
//! (the host's side of a guest's connections through a Firecracker-style VMM); their data
//! connections come to a fresh vsock port the same way. Every blocking call of a session has a
//! timeout that follows progress: a step (a read, a write, the data connection) fails after the
//! step timeout without any, the client's grace when it names one (`grace_s`) and
//! [`STEP_TIMEOUT`] at least, and a whole session is capped at the test length plus
//! [`SESSION_CAP_STEPS`] steps. A session's failure (a client that vanishes, a bogus request)
//! ends only that session: it is logged as one line on stderr and the accept loop carries on.

use std::io::{self, Write};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use serde_json::{json, Value};

use crate::proto::{
    describe, is_timeout, read_full, receive_stream, send_stream, Conn, Control, TestKind,
    TestParams, RR_SEQ_LEN,
};
use crate::sockopt;
use crate::vsock::VsockListener;

/// How long a client may take for each step without progress, at least: sending its request,
/// connecting the data socket, any single read or write in the data phase, the end-of-test
/// message after the last datagram. A client asks for more with its grace (`grace_s`).
const STEP_TIMEOUT: Duration = Duration::from_secs(10);
/// A session is abandoned as stuck after the test length plus this many step timeouts, even
/// with a client that is still sending.
const SESSION_CAP_STEPS: u32 = 10;
/// The longest step timeout a client may ask for.
const MAX_STEP: Duration = Duration::from_secs(3600);
/// More concurrent sessions than this are refused, bounding threads and sockets.
const MAX_SESSIONS: usize = 64;
/// UDP receive timeout, the granularity at which a UDP worker notices it should stop.
const UDP_POLL: Duration = Duration::from_millis(50);
/// After the client says the UDP data phase is over, datagrams still in flight are counted
/// until the socket has been idle for `UDP_POLL`, but no longer than this.
const UDP_MAX_DRAIN: Duration = Duration::from_secs(1);
/// UDP_STREAM with `"progress": true`: how often the worker sends the client its counts, as
/// a datagram to the client's data port. The counting thread reports, so a receiver busy
/// enough to starve other threads still reports whenever it counts; and a datagram, because
/// the control connection would need the client's ACKs, which wait behind the client's own
/// backlog. A report lost on the way costs one interval. Also how often the control thread
/// looks at the counts to push its deadline back.
const PROGRESS_INTERVAL: Duration = Duration::from_millis(500);
/// Read size for stream sinks: larger than any default message so each syscall drains a lot.
const SINK_BUF: usize = 256 * 1024;

/// Where VSOCK tests come from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum VsockSide {
    /// `AF_VSOCK` ports.
    Socket,
    /// The Unix sockets `<base>_<port>`.
    Path(PathBuf),
}

impl VsockSide {
    fn listen(&self, port: Option<u32>) -> io::Result<VsockListener> {
        match self {
            VsockSide::Socket => VsockListener::bind_vsock(port),
            VsockSide::Path(base) => VsockListener::bind_path(base, port),
        }
    }
}

/// Server configuration.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// Address to listen on.
    pub bind: IpAddr,
    /// Control port (0 picks a free one; the chosen port is printed).
    pub port: u16,
    /// Also serve VSOCK tests, on vsock port `port` (12865 with `port` 0).
    pub vsock: Option<VsockSide>,
}

/// Binds the control port, prints `mvperf server listening on ADDR` on stdout, and serves
/// forever. Returns only if binding fails.
pub fn run(cfg: &ServerConfig) -> Result<()> {
    let listener = TcpListener::bind((cfg.bind, cfg.port))
        .with_context(|| format!("cannot listen on {}:{}", cfg.bind, cfg.port))?;
    let addr = listener.local_addr().context("listener address")?;
    // Scripts wait for this line (and learn the port from it when --port 0).
    let mut out = std::io::stdout().lock();
    if let Err(e) = writeln!(out, "mvperf server listening on {addr}").and_then(|()| out.flush()) {
        eprintln!("mvperf server: listening on {addr} (stdout unusable: {e})");
    }
    drop(out);
    let sessions = Arc::new(AtomicUsize::new(0));
    if let Some(side) = &cfg.vsock {
        serve_vsock(side, cfg.port, &sessions);
    }
    loop {
        let stream = match listener.accept() {
            Ok((s, _)) => s,
            Err(e) => {
                // EMFILE and friends: back off rather than spin; the listener itself is fine.
                eprintln!("mvperf server: accept failed: {e}");
                thread::sleep(Duration::from_millis(100));
                continue;
            }
        };
        let peer = stream
            .peer_addr()
            .map_or_else(|_| "?".to_string(), |a| a.to_string());
        if sessions.fetch_add(1, Ordering::SeqCst) >= MAX_SESSIONS {
            sessions.fetch_sub(1, Ordering::SeqCst);
            refuse(stream, "server busy: too many concurrent tests");
            continue;
        }
        spawn_session(&sessions, peer, move || session(stream));
    }
}

/// Serves `f`, one session, on a thread of its own, counted in `sessions`.
fn spawn_session(
    sessions: &Arc<AtomicUsize>,
    peer: String,
    f: impl FnOnce() -> Result<String> + Send + 'static,
) {
    let guard = SessionGuard(Arc::clone(sessions));
    let spawned = thread::Builder::new()
        .name(format!("session {peer}"))
        .spawn(move || {
            let _guard = guard;
            match f() {
                Ok(summary) => eprintln!("mvperf server: {peer}: {summary}"),
                Err(e) => eprintln!("mvperf server: {peer}: {e:#}"),
            }
        });
    if let Err(e) = spawned {
        eprintln!("mvperf server: cannot start a session thread: {e}");
    }
}

/// Listens for VSOCK tests on `side`'s port `port` and serves them on a thread of its own.
/// A machine without vsock keeps its TCP server: the failure is one line on stderr.
fn serve_vsock(side: &VsockSide, port: u16, sessions: &Arc<AtomicUsize>) {
    let port = u32::from(if port == 0 {
        crate::proto::DEFAULT_PORT
    } else {
        port
    });
    let listener = match side.listen(Some(port)) {
        Ok(l) => l,
        Err(e) => {
            eprintln!("mvperf server: no VSOCK tests: cannot listen on vsock port {port}: {e}");
            return;
        }
    };
    let mut out = std::io::stdout().lock();
    let _ =
        writeln!(out, "mvperf server listening on vsock port {port}").and_then(|()| out.flush());
    drop(out);
    let (side, sessions) = (side.clone(), Arc::clone(sessions));
    let spawned = thread::Builder::new()
        .name("vsock accept".into())
        .spawn(move || loop {
            let stream = match listener.accept() {
                Ok(s) => s,
                Err(e) => {
                    eprintln!("mvperf server: vsock accept failed: {e}");
                    thread::sleep(Duration::from_millis(100));
                    continue;
                }
            };
            if sessions.fetch_add(1, Ordering::SeqCst) >= MAX_SESSIONS {
                sessions.fetch_sub(1, Ordering::SeqCst);
                refuse(stream, "server busy: too many concurrent tests");
                continue;
            }
            let side = side.clone();
            spawn_session(&sessions, "vsock".into(), move || {
                serve(stream, DataSide::Vsock(side))
            });
        });
    if let Err(e) = spawned {
        eprintln!("mvperf server: cannot start the vsock accept thread: {e}");
    }
}

/// Decrements the session count however the session thread ends.
struct SessionGuard(Arc<AtomicUsize>);

impl Drop for SessionGuard {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

fn refuse<S: Conn>(stream: S, why: &str) {
    if let Ok(mut c) = Control::new(stream) {
        // Best effort: the client may already be gone, and there is nothing else to tell.
        let _ = c.send(&json!({"ok": false, "error": why}), STEP_TIMEOUT);
    }
}

/// How a session's data connection is made.
enum DataSide {
    /// A TCP listener or UDP socket on the address the control connection reached, for the
    /// client at `peer_ip`.
    Ip { local_ip: IpAddr, peer_ip: IpAddr },
    /// A fresh vsock port.
    Vsock(VsockSide),
}

/// Serves one TCP control connection; returns a one-line summary for the log.
fn session(stream: TcpStream) -> Result<String> {
    let local_ip = stream.local_addr().context("control local address")?.ip();
    let peer_ip = stream.peer_addr().context("control peer address")?.ip();
    serve(stream, DataSide::Ip { local_ip, peer_ip })
}

/// Serves one control connection, its data connections made as `side` says.
fn serve<S: Accepted>(stream: S, side: DataSide) -> Result<String> {
    let mut ctrl = Control::new(stream).context("control setup")?;
    let req = match ctrl.recv(STEP_TIMEOUT) {
        Ok(r) => r,
        Err(e) => {
            if e.kind() == io::ErrorKind::InvalidData {
                // Someone who is not an mvperf client: say so before hanging up.
                let why = format!("not an mvperf test request: {e}");
                let _ = ctrl.send(&json!({"ok": false, "error": why}), STEP_TIMEOUT);
            }
            bail!(
                "reading test request: {}",
                describe(&e, "client", STEP_TIMEOUT)
            );
        }
    };
    let params = match TestParams::from_json(&req) {
        Ok(p) => p,
        Err(e) => {
            let _ = ctrl.send(
                &json!({"ok": false, "error": format!("{e:#}")}),
                STEP_TIMEOUT,
            );
            return Err(e.context("bad request"));
        }
    };
    let step = step_timeout(&req);
    let limits = Limits {
        step,
        cap: Instant::now() + params.duration + step * SESSION_CAP_STEPS,
    };
    let result = match &side {
        DataSide::Ip { local_ip, peer_ip } if params.test.is_udp() => {
            udp_session(&mut ctrl, &req, &params, *local_ip, *peer_ip, limits)
        }
        _ => S::data_listener(&side, params.test)
            .and_then(|l| stream_session(&mut ctrl, &params, l.as_ref(), limits)),
    };
    let report = match result {
        Ok(r) => r,
        Err(e) => {
            // Tell the client why, if it is still listening, so its error names the cause.
            let _ = ctrl.send(&json!({"error": format!("{e:#}")}), step);
            return Err(e.context(format!("{} failed", params.test)));
        }
    };
    ctrl.send(&report, step)
        .map_err(|e| anyhow!("sending results: {}", describe(&e, "client", step)))?;
    Ok(format!("{} done: {report}", params.test))
}

/// A session's time limits: each step's, and the cap of the whole session.
#[derive(Debug, Clone, Copy)]
struct Limits {
    step: Duration,
    cap: Instant,
}

/// The step timeout for a request: the client's grace if it names one (`grace_s`), within
/// [`STEP_TIMEOUT`] and [`MAX_STEP`].
fn step_timeout(req: &Value) -> Duration {
    // A negative grace is no duration, and no grace.
    req.get("grace_s")
        .and_then(Value::as_f64)
        .and_then(|g| Duration::try_from_secs_f64(g.min(MAX_STEP.as_secs_f64())).ok())
        .map_or(STEP_TIMEOUT, |g| g.clamp(STEP_TIMEOUT, MAX_STEP))
}

fn ok_reply(port: u16, sock: &impl std::os::fd::AsRawFd) -> Value {
    json!({
        "ok": true,
        "data_port": port,
        "recv_buf": sockopt::recv_buf(sock),
        "send_buf": sockopt::send_buf(sock),
    })
}

/// A listener for a session's data connection: the kind of stream it gives, its port.
trait DataListener<S> {
    /// The port the client connects to.
    fn data_port(&self) -> u32;
    /// Waits, up to `step`, for the client's data connection.
    fn accept_data(&self, step: Duration) -> Result<S>;
    /// The listener's socket, for its buffer sizes.
    fn socket(&self) -> &dyn AsRawFd;
}

/// A stream type a control connection may be, and the data listener of a stream test over
/// it: TCP tests over TCP, VSOCK tests over vsock connections.
trait Accepted: Conn {
    fn data_listener(side: &DataSide, test: TestKind) -> Result<Box<dyn DataListener<Self>>>;
}

impl Accepted for TcpStream {
    fn data_listener(side: &DataSide, test: TestKind) -> Result<Box<dyn DataListener<Self>>> {
        match side {
            DataSide::Ip { local_ip, peer_ip } if !test.is_vsock() => {
                let l =
                    TcpListener::bind(SocketAddr::new(*local_ip, 0)).context("data listener")?;
                Ok(Box::new((l, *peer_ip)))
            }
            _ => Err(anyhow!(
                "{test} needs a vsock connection (mvperf -t {test} --uds/--cid)"
            )),
        }
    }
}

impl Accepted for UnixStream {
    fn data_listener(side: &DataSide, test: TestKind) -> Result<Box<dyn DataListener<Self>>> {
        match side {
            DataSide::Vsock(v) if test.is_vsock() => {
                Ok(Box::new(v.listen(None).context("data listener")?))
            }
            _ => Err(anyhow!("only the VSOCK tests run over vsock, not {test}")),
        }
    }
}

impl DataListener<TcpStream> for (TcpListener, IpAddr) {
    fn data_port(&self) -> u32 {
        self.0.local_addr().map_or(0, |a| u32::from(a.port()))
    }

    /// Waits, up to `step`, for the data connection from the same host as the control
    /// connection.
    fn accept_data(&self, step: Duration) -> Result<TcpStream> {
        let (listener, peer_ip) = (&self.0, self.1);
        // std has no accept timeout: poll a non-blocking listener instead.
        listener.set_nonblocking(true)?;
        let give_up = Instant::now() + step;
        loop {
            match listener.accept() {
                Ok((s, from)) if from.ip() == peer_ip => {
                    s.set_nonblocking(false)?;
                    return Ok(s);
                }
                // A stranger on our ephemeral port is dropped; keep waiting for our client.
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    if Instant::now() >= give_up {
                        bail!("client never opened the data connection");
                    }
                    thread::sleep(Duration::from_millis(2));
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e).context("accepting the data connection"),
            }
        }
    }

    fn socket(&self) -> &dyn AsRawFd {
        &self.0
    }
}

impl DataListener<UnixStream> for VsockListener {
    fn data_port(&self) -> u32 {
        self.port()
    }

    /// The first connection to the fresh port (a vsock port carries no address to check a
    /// second connection against; the test then fails on the stranger's bytes).
    fn accept_data(&self, step: Duration) -> Result<UnixStream> {
        self.accept_timeout(step).map_err(|e| match e.kind() {
            io::ErrorKind::TimedOut => anyhow!("client never opened the data connection"),
            _ => anyhow!(e).context("accepting the data connection"),
        })
    }

    fn socket(&self) -> &dyn AsRawFd {
        self
    }
}

/// The data phase of a stream test (TCP, or VSOCK over vsock connections): a fresh data
/// listener announced, the client's connection taken, the test run, the counts returned.
fn stream_session<S: Conn>(
    ctrl: &mut Control<S>,
    p: &TestParams,
    listener: &dyn DataListener<S>,
    limits: Limits,
) -> Result<Value> {
    let Limits { step, cap } = limits;
    let reply = json!({
        "ok": true,
        "data_port": listener.data_port(),
        "recv_buf": sockopt::recv_buf(&listener.socket().as_raw_fd()),
        "send_buf": sockopt::send_buf(&listener.socket().as_raw_fd()),
    });
    ctrl.send(&reply, step)
        .map_err(|e| anyhow!("sending setup reply: {}", describe(&e, "client", step)))?;
    let mut data = listener.accept_data(step)?;
    data.read_timeout(Some(step))?;
    data.write_timeout(Some(step))?;
    let start = Instant::now();
    let fail = |what: &str, e: io::Error| anyhow!("{what}: {}", describe(&e, "client", step));
    match p.test.stream_kind() {
        TestKind::TcpStream => {
            let mut buf = vec![0u8; SINK_BUF];
            let bytes = receive_stream(&mut data, &mut buf, cap)
                .map_err(|e| fail("receiving stream", e))?
                .ok_or_else(|| anyhow!("client kept sending past the session's cap"))?;
            Ok(json!({"bytes": bytes, "elapsed_s": start.elapsed().as_secs_f64()}))
        }
        TestKind::TcpMaerts => {
            let buf = vec![0x5au8; p.msg_size];
            let end = start + p.duration;
            let bytes = send_stream(&mut data, &buf, end).map_err(|e| fail("sending stream", e))?;
            data.shutdown_write()
                .map_err(|e| fail("ending stream", e))?;
            Ok(json!({"bytes_sent": bytes, "elapsed_s": start.elapsed().as_secs_f64()}))
        }
        TestKind::TcpRr => {
            data.no_delay()?;
            let mut req = vec![0u8; p.req_size];
            let resp = vec![0xa5u8; p.resp_size];
            let mut transactions = 0u64;
            // The client ends the test with a write shutdown between transactions.
            while read_full(&mut data, &mut req).map_err(|e| fail("reading request", e))? {
                data.write_all(&resp)
                    .map_err(|e| fail("sending response", e))?;
                transactions += 1;
                if Instant::now() > cap {
                    bail!("client kept sending past the session's cap");
                }
            }
            Ok(json!({"transactions": transactions, "elapsed_s": start.elapsed().as_secs_f64()}))
        }
        other => bail!("{other} is not a stream test"),
    }
}

/// The port of the client's UDP data socket, from a UDP test request.
fn client_data_port(req: &Value) -> Result<u16> {
    req.get("client_port")
        .and_then(Value::as_u64)
        .and_then(|p| u16::try_from(p).ok())
        .filter(|&p| p != 0)
        .ok_or_else(|| anyhow!("UDP test request has no valid client_port"))
}

/// The worker's running counts of the client's datagrams, for progress reports.
#[derive(Debug, Default)]
struct Live {
    messages: AtomicU64,
    bytes: AtomicU64,
}

/// Counts kept by a UDP worker thread.
#[derive(Debug, Default)]
struct UdpCounts {
    messages: u64,
    bytes: u64,
    responses: u64,
    send_errors: u64,
    /// Datagrams from anyone but the test's client socket (queued before the socket was
    /// connected): neither counted nor answered.
    foreign: u64,
    /// UDP_RR datagrams from the client of the wrong size: not answered.
    malformed: u64,
    /// From the first counted datagram to the last: the receiver's own window.
    span: Duration,
}

/// Whether the request sets `key` to true.
fn req_flag(req: &Value, key: &str) -> bool {
    req.get(key).and_then(Value::as_bool) == Some(true)
}

/// Waits for the client's end-of-test message while the worker counts datagrams. The client
/// sends it after its data phase, which starts after a setup a slow client takes long for, and
/// a client that flooded a slow path sends it behind its own backlog, which can take far longer
/// than the test to drain: so the wait lasts as long as datagrams keep coming, and fails one
/// step after the test length and the latest datagram (or the session's start), or at the cap.
/// The error carries how long the wait went without progress.
fn wait_done_while_counting<S: Conn>(
    ctrl: &mut Control<S>,
    live: &Live,
    p: &TestParams,
    limits: Limits,
) -> Result<Value, (io::Error, Duration)> {
    let mut deadline = Instant::now() + p.duration + limits.step;
    let mut progressed = Instant::now();
    let mut last = 0;
    loop {
        let left = deadline
            .min(limits.cap)
            .saturating_duration_since(Instant::now());
        if left.is_zero() {
            let e = io::Error::from(io::ErrorKind::TimedOut);
            return Err((e, progressed.elapsed()));
        }
        match ctrl.recv(left.min(PROGRESS_INTERVAL)) {
            Ok(v) => return Ok(v),
            Err(e) if is_timeout(&e) => {}
            Err(e) => return Err((e, progressed.elapsed())),
        }
        let messages = live.messages.load(Ordering::Relaxed);
        if messages != last {
            progressed = Instant::now();
            deadline = deadline.max(progressed + limits.step);
            last = messages;
        }
    }
}

fn udp_session<S: Conn>(
    ctrl: &mut Control<S>,
    ctrl_req: &Value,
    p: &TestParams,
    local_ip: IpAddr,
    peer_ip: IpAddr,
    limits: Limits,
) -> Result<Value> {
    let peer = SocketAddr::new(peer_ip, client_data_port(ctrl_req)?);
    let sock = UdpSocket::bind(SocketAddr::new(local_ip, 0)).context("data socket")?;
    // Connected, the kernel drops datagrams from every other source; the worker also checks
    // each sender for the few that may have queued between bind and connect.
    sock.connect(peer)
        .with_context(|| format!("connecting the data socket to the client's {peer}"))?;
    sock.set_read_timeout(Some(UDP_POLL))?;
    sock.set_write_timeout(Some(limits.step))?;
    let reply = ok_reply(sock.local_addr()?.port(), &sock);
    let progress = p.test == TestKind::UdpStream && req_flag(ctrl_req, "progress");
    let report_every = progress.then_some(PROGRESS_INTERVAL);
    let stop = Arc::new(AtomicBool::new(false));
    let live = Arc::new(Live::default());
    let worker = {
        let (stop, live) = (Arc::clone(&stop), Arc::clone(&live));
        let p = p.clone();
        thread::Builder::new()
            .name("udp worker".into())
            .spawn(move || udp_worker(&sock, &p, peer, &stop, &live, report_every))
            .context("starting the UDP worker")?
    };
    // The socket is bound before the reply goes out, so no early datagram is refused.
    let outcome = ctrl.send(&reply, limits.step).and_then(|()| {
        wait_done_while_counting(ctrl, &live, p, limits)
            .map_err(|(e, waited)| io::Error::new(e.kind(), describe(&e, "client", waited)))
    });
    stop.store(true, Ordering::SeqCst);
    let counts = worker.join().map_err(|_| anyhow!("UDP worker panicked"))?;
    match outcome {
        Ok(v) if v.get("done").and_then(Value::as_bool) == Some(true) => {}
        Ok(v) => bail!("unexpected control message {v}"),
        Err(e) => bail!("waiting for the end of the test: {e}"),
    }
    Ok(json!({
        "messages": counts.messages,
        "bytes": counts.bytes,
        "transactions": counts.responses,
        "send_errors": counts.send_errors,
        "foreign": counts.foreign,
        "malformed": counts.malformed,
        "rx_span_s": counts.span.as_secs_f64(),
    }))
}

fn udp_worker(
    sock: &UdpSocket,
    p: &TestParams,
    peer: SocketAddr,
    stop: &AtomicBool,
    live: &Live,
    report_every: Option<Duration>,
) -> UdpCounts {
    let mut c = UdpCounts::default();
    let mut reported = Instant::now();
    let mut confirmed = 0u64;
    let mut buf = vec![0u8; 65536];
    // A response is the request's sequence number, then the response bytes.
    let mut resp = vec![0xa5u8; RR_SEQ_LEN + p.resp_size];
    let mut drain_until: Option<Instant> = None;
    let mut first: Option<Instant> = None;
    loop {
        if drain_until.is_none() && stop.load(Ordering::SeqCst) {
            drain_until = Some(Instant::now() + UDP_MAX_DRAIN);
        }
        if drain_until.is_some_and(|t| Instant::now() >= t) {
            break;
        }
        match sock.recv_from(&mut buf) {
            Ok((_, from)) if from != peer => c.foreign += 1,
            Ok((n, _)) if p.test == TestKind::UdpRr && n != RR_SEQ_LEN + p.req_size => {
                c.malformed += 1;
            }
            Ok((n, _)) => {
                c.messages += 1;
                c.bytes += n as u64;
                live.messages.store(c.messages, Ordering::Relaxed);
                live.bytes.store(c.bytes, Ordering::Relaxed);
                c.span = first.get_or_insert_with(Instant::now).elapsed();
                if p.test == TestKind::UdpRr {
                    resp[..RR_SEQ_LEN].copy_from_slice(&buf[..RR_SEQ_LEN]);
                    match sock.send(&resp) {
                        Ok(_) => c.responses += 1,
                        Err(_) => c.send_errors += 1,
                    }
                }
            }
            Err(e) if is_timeout(&e) => {
                if drain_until.is_some() {
                    break;
                }
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            // ICMP errors from an earlier send (client port gone) surface here; the control
            // connection decides whether the client is really gone.
            Err(_) => thread::sleep(Duration::from_millis(1)),
        }
        if report_every.is_some_and(|every| reported.elapsed() >= every) {
            reported = Instant::now();
            let report = json!({"progress": {"messages": c.messages, "bytes": c.bytes}});
            let line = report.to_string();
            // Datagrams from the client since the last report are its answer that the path
            // works: say so (`MSG_CONFIRM`), or the kernel probes the client's address and,
            // the answer stuck behind the client's flood, holds the reports until it comes.
            let sent = if c.messages > confirmed {
                sockopt::send_confirm(sock, line.as_bytes())
            } else {
                sock.send(line.as_bytes())
            };
            confirmed = c.messages;
            // A full queue or an ICMP error from an earlier datagram: the next report retries.
            drop(sent);
        }
    }
    c
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Connects the two ends of a UDP test as `run` and the client do: the server polls
    /// every `UDP_POLL`, the client waits up to 2 s for an answer.
    fn connect_pair(server: &UdpSocket, client: &UdpSocket) {
        server
            .connect(client.local_addr().expect("addr"))
            .expect("connect");
        server.set_read_timeout(Some(UDP_POLL)).expect("timeout");
        client
            .connect(server.local_addr().expect("addr"))
            .expect("connect");
        client
            .set_read_timeout(Some(Duration::from_secs(2)))
            .expect("timeout");
    }

    /// A second of UDP `test` with datagrams of `msg_size` (STREAM) or 1-byte requests and
    /// `resp_size`-byte responses (RR).
    fn udp_params(test: TestKind, msg_size: usize, resp_size: usize) -> TestParams {
        TestParams {
            test,
            duration: Duration::from_secs(1),
            msg_size,
            req_size: 1,
            resp_size,
        }
    }

    /// Runs `udp_worker` on `server` for `p` on a thread until the returned flag is set.
    fn start_worker(
        server: UdpSocket,
        p: TestParams,
        peer: SocketAddr,
        report_every: Option<Duration>,
    ) -> (Arc<AtomicBool>, thread::JoinHandle<UdpCounts>) {
        let stop = Arc::new(AtomicBool::new(false));
        let worker = {
            let stop = Arc::clone(&stop);
            thread::spawn(move || {
                udp_worker(&server, &p, peer, &stop, &Live::default(), report_every)
            })
        };
        (stop, worker)
    }

    #[test]
    fn udp_worker_counts_and_echoes_only_its_peer() {
        let server = UdpSocket::bind("127.0.0.1:0").expect("bind");
        let client = UdpSocket::bind("127.0.0.1:0").expect("bind");
        let stranger = UdpSocket::bind("127.0.0.1:0").expect("bind");
        let peer = client.local_addr().expect("addr");
        let server_addr = server.local_addr().expect("addr");
        // Queued before the server connects: only the sender check can keep it out.
        stranger.send_to(&[7u8; 24], server_addr).expect("send");
        connect_pair(&server, &client);
        let p = udp_params(TestKind::UdpRr, 1, 4);
        let (stop, worker) = start_worker(server, p, peer, None);
        let mut got = [0u8; 64];
        for seq in [1u64, 2, 0x0102_0304_0506_0708] {
            let mut req = seq.to_le_bytes().to_vec();
            req.push(0xee);
            client.send(&req).expect("send");
            let n = client.recv(&mut got).expect("reply");
            assert_eq!(n, RR_SEQ_LEN + 4);
            assert_eq!(&got[..RR_SEQ_LEN], &seq.to_le_bytes());
            assert_eq!(&got[RR_SEQ_LEN..n], &[0xa5; 4]);
        }
        // After connect the kernel drops a stranger's datagrams before we see them.
        stranger.send_to(&[7u8; 9], server_addr).expect("send");
        // A datagram of the wrong size is neither counted nor answered.
        client.send(&[1u8; 3]).expect("send");
        client
            .set_read_timeout(Some(Duration::from_millis(300)))
            .expect("timeout");
        assert!(
            client.recv(&mut got).is_err(),
            "a malformed request was answered"
        );
        stop.store(true, Ordering::SeqCst);
        let c = worker.join().expect("worker");
        assert_eq!((c.messages, c.bytes, c.responses), (3, 27, 3));
        assert_eq!((c.foreign, c.malformed), (1, 1));
    }

    #[test]
    fn udp_worker_reports_its_count_to_the_peer_while_it_counts() {
        let server = UdpSocket::bind("127.0.0.1:0").expect("bind");
        let client = UdpSocket::bind("127.0.0.1:0").expect("bind");
        let peer = client.local_addr().expect("addr");
        connect_pair(&server, &client);
        let p = udp_params(TestKind::UdpStream, 100, 1);
        let (stop, worker) = start_worker(server, p, peer, Some(Duration::from_millis(100)));
        let mut seen = Vec::new();
        let mut got = [0u8; 512];
        for _ in 0..3 {
            for _ in 0..5 {
                client.send(&[0u8; 100]).expect("send");
            }
            let n = client.recv(&mut got).expect("a progress report");
            let v: Value = serde_json::from_slice(&got[..n]).expect("JSON");
            let messages = v["progress"]["messages"].as_u64().expect("messages");
            assert_eq!(v["progress"]["bytes"].as_u64(), Some(messages * 100), "{v}");
            seen.push(messages);
        }
        stop.store(true, Ordering::SeqCst);
        let counts = worker.join().expect("worker");
        assert_eq!(counts.messages, 15);
        // The reports follow the count as it grows and never run ahead of it.
        assert!(seen.windows(2).all(|w| w[0] <= w[1]), "{seen:?}");
        assert!(
            *seen.last().unwrap() >= 5 && *seen.last().unwrap() <= 15,
            "{seen:?}"
        );
        assert!(seen[0] <= 15, "{seen:?}");
    }

    #[test]
    fn a_client_grace_sets_the_step_timeout_within_bounds() {
        let with = |g: Value| step_timeout(&json!({"grace_s": g}));
        assert_eq!(step_timeout(&json!({})), STEP_TIMEOUT);
        assert_eq!(with(json!(60.0)), Duration::from_secs(60));
        assert_eq!(with(json!(1.5)), STEP_TIMEOUT);
        assert_eq!(with(json!(1e12)), MAX_STEP);
        assert_eq!(with(json!(-3)), STEP_TIMEOUT);
        assert_eq!(with(json!("sixty")), STEP_TIMEOUT);
        assert_eq!(with(json!(0)), STEP_TIMEOUT);
        assert_eq!(with(json!(1e300)), MAX_STEP);
    }
}
