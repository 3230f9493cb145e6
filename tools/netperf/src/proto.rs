// SPDX-License-Identifier: Apache-2.0
//! The control protocol shared by client and server, and small I/O helpers.
//!
//! Each test opens one TCP control connection to the server's port and exchanges JSON objects,
//! one per line:
//!
//! 1. client → server: `{"proto":2,"test":"TCP_RR","duration_s":10.0,"msg_size":16384,
//!    "req_size":1,"resp_size":1}`; UDP tests add `"client_port":P`, the port of the UDP
//!    socket the client has already bound on the address its control connection comes from.
//! 2. server → client: `{"ok":true,"data_port":P,"recv_buf":N,"send_buf":N}` after it has bound
//!    a fresh data socket (TCP listener or UDP socket) on the address the control connection
//!    reached, or `{"ok":false,"error":"..."}`. A UDP data socket is connected to the client's
//!    data socket, and the server counts and answers datagrams from that socket only.
//! 3. the data phase on that port. TCP tests end it by a write shutdown from the sender
//!    (client for STREAM/RR, server for MAERTS); UDP tests end it by the client sending
//!    `{"done":true}` on the control connection, since datagrams carry no end-of-stream.
//!    Every UDP_RR datagram starts with [`RR_SEQ_LEN`] bytes of sequence number (the request's,
//!    echoed in its response) ahead of the request or response bytes.
//! 4. server → client: its counts, e.g. `{"bytes":N,"messages":N,"transactions":N}`, so the
//!    client reports what the receiver actually got, not what it handed to its own kernel.
//!
//! The VSOCK tests run the TCP tests' exchange over vsock stream connections ([`Conn`] is
//! what both kinds of stream give): the control connection reaches the server's vsock port
//! (`AF_VSOCK`, or through a Firecracker-style VMM's `CONNECT` protocol on its Unix socket),
//! and `data_port` is a vsock port (32 bits).

use std::fmt;
use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::{Shutdown, TcpStream};
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::str::FromStr;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use serde_json::Value;

/// Protocol version carried in every request; a mismatch is refused. Version 2: UDP tests
/// name the client's data port, UDP_RR datagrams carry a 64-bit sequence number. Version 3:
/// UDP_STREAM progress reports are datagrams to the client's data port.
pub const PROTO_VERSION: u64 = 3;
/// Default control port, netperf's `netserver` port.
pub const DEFAULT_PORT: u16 = 12865;
/// Longest control line accepted, so a bogus peer cannot make us buffer without bound.
const MAX_LINE: u64 = 4096;
/// Largest message, request or response size accepted (TCP).
pub const MAX_TCP_MSG: usize = 16 << 20;
/// Largest UDP payload over IPv4 (65535 - 20 IP - 8 UDP).
pub const MAX_UDP_MSG: usize = 65507;
/// Bytes of sequence number ahead of every UDP_RR request and response. 64 bits, so no reply
/// of a run can carry the tag of another request, however late it comes (the request bytes
/// themselves are too few for a tag: netperf's default request is one byte).
pub const RR_SEQ_LEN: usize = 8;

/// The tests, named as netperf names them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TestKind {
    /// Client sends a TCP byte stream to the server.
    TcpStream,
    /// Server sends a TCP byte stream to the client (STREAM reversed).
    TcpMaerts,
    /// One TCP request, one response, repeated.
    TcpRr,
    /// Client sends UDP datagrams to the server.
    UdpStream,
    /// One UDP request datagram, one response datagram, repeated.
    UdpRr,
    /// TCP_STREAM over vsock connections.
    VsockStream,
    /// TCP_MAERTS over vsock connections.
    VsockMaerts,
    /// TCP_RR over vsock connections.
    VsockRr,
}

impl TestKind {
    /// Every test, in the order `--help` lists them.
    pub const ALL: [TestKind; 8] = [
        TestKind::TcpStream,
        TestKind::TcpMaerts,
        TestKind::TcpRr,
        TestKind::UdpStream,
        TestKind::UdpRr,
        TestKind::VsockStream,
        TestKind::VsockMaerts,
        TestKind::VsockRr,
    ];

    /// The netperf name (the VSOCK tests' are ours).
    pub fn name(self) -> &'static str {
        match self {
            TestKind::TcpStream => "TCP_STREAM",
            TestKind::TcpMaerts => "TCP_MAERTS",
            TestKind::TcpRr => "TCP_RR",
            TestKind::UdpStream => "UDP_STREAM",
            TestKind::UdpRr => "UDP_RR",
            TestKind::VsockStream => "VSOCK_STREAM",
            TestKind::VsockMaerts => "VSOCK_MAERTS",
            TestKind::VsockRr => "VSOCK_RR",
        }
    }

    /// Whether the test uses UDP data sockets.
    pub fn is_udp(self) -> bool {
        matches!(self, TestKind::UdpStream | TestKind::UdpRr)
    }

    /// Whether the test is request/response.
    pub fn is_rr(self) -> bool {
        matches!(self, TestKind::TcpRr | TestKind::UdpRr | TestKind::VsockRr)
    }

    /// Whether the test runs over vsock connections.
    pub fn is_vsock(self) -> bool {
        matches!(
            self,
            TestKind::VsockStream | TestKind::VsockMaerts | TestKind::VsockRr
        )
    }

    /// The stream test whose data phase this one runs: a VSOCK test is its TCP namesake over
    /// another kind of stream.
    pub fn stream_kind(self) -> TestKind {
        match self {
            TestKind::VsockStream => TestKind::TcpStream,
            TestKind::VsockMaerts => TestKind::TcpMaerts,
            TestKind::VsockRr => TestKind::TcpRr,
            other => other,
        }
    }
}

/// A connected stream a test runs over: TCP, or a vsock connection (an `AF_VSOCK` socket, or
/// the Unix socket of a Firecracker-style VMM once its `CONNECT` line is answered), both
/// held as `UnixStream`, whose calls (read, write, `SO_RCVTIMEO`, shutdown) are the socket
/// layer's and work on either family.
pub trait Conn: io::Read + io::Write + AsRawFd + Send + Sized + 'static {
    /// A second handle on the same connection.
    fn try_clone_conn(&self) -> io::Result<Self>;
    /// `SO_RCVTIMEO`.
    fn read_timeout(&self, d: Option<Duration>) -> io::Result<()>;
    /// `SO_SNDTIMEO`.
    fn write_timeout(&self, d: Option<Duration>) -> io::Result<()>;
    /// Tells the peer no more data comes.
    fn shutdown_write(&self) -> io::Result<()>;
    /// `TCP_NODELAY` where there is such a thing (vsock sends at once anyway).
    fn no_delay(&self) -> io::Result<()>;
}

/// `Conn` for a std stream type whose calls have the same names (`no_delay` given).
macro_rules! std_conn {
    ($t:ty, $no_delay:expr) => {
        impl Conn for $t {
            fn try_clone_conn(&self) -> io::Result<Self> {
                self.try_clone()
            }
            fn read_timeout(&self, d: Option<Duration>) -> io::Result<()> {
                self.set_read_timeout(d)
            }
            fn write_timeout(&self, d: Option<Duration>) -> io::Result<()> {
                self.set_write_timeout(d)
            }
            fn shutdown_write(&self) -> io::Result<()> {
                self.shutdown(Shutdown::Write)
            }
            fn no_delay(&self) -> io::Result<()> {
                let f: fn(&Self) -> io::Result<()> = $no_delay;
                f(self)
            }
        }
    };
}

std_conn!(TcpStream, |s| s.set_nodelay(true));
std_conn!(UnixStream, |_| Ok(()));

impl fmt::Display for TestKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for TestKind {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        TestKind::ALL
            .into_iter()
            .find(|t| t.name().eq_ignore_ascii_case(s))
            .ok_or_else(|| {
                let names: Vec<_> = TestKind::ALL.iter().map(|t| t.name()).collect();
                format!("unknown test '{s}' (expected one of {})", names.join(", "))
            })
    }
}

/// Parameters of one test, as carried in the control request.
#[derive(Debug, Clone, PartialEq)]
pub struct TestParams {
    /// Which test.
    pub test: TestKind,
    /// Data phase length.
    pub duration: Duration,
    /// Send size for the STREAM tests.
    pub msg_size: usize,
    /// Request size for the RR tests.
    pub req_size: usize,
    /// Response size for the RR tests.
    pub resp_size: usize,
}

impl TestParams {
    /// Checks the sizes against the transport's limits.
    pub fn validate(&self) -> Result<()> {
        let max = match self.test {
            TestKind::UdpRr => MAX_UDP_MSG - RR_SEQ_LEN,
            TestKind::UdpStream => MAX_UDP_MSG,
            TestKind::TcpStream | TestKind::TcpMaerts | TestKind::TcpRr => MAX_TCP_MSG,
            TestKind::VsockStream | TestKind::VsockMaerts | TestKind::VsockRr => MAX_TCP_MSG,
        };
        let check = |what: &str, v: usize| -> Result<()> {
            if v == 0 || v > max {
                bail!("{what} {v} out of range for {} (1..={max})", self.test);
            }
            Ok(())
        };
        if self.test.is_rr() {
            check("request size", self.req_size)?;
            check("response size", self.resp_size)?;
        } else {
            check("message size", self.msg_size)?;
        }
        let secs = self.duration.as_secs_f64();
        if !(secs > 0.0 && secs <= 86_400.0) {
            bail!("test length {secs} s out of range (0..=86400)");
        }
        Ok(())
    }

    /// The request object.
    pub fn to_json(&self) -> Value {
        serde_json::json!({
            "proto": PROTO_VERSION,
            "test": self.test.name(),
            "duration_s": self.duration.as_secs_f64(),
            "msg_size": self.msg_size,
            "req_size": self.req_size,
            "resp_size": self.resp_size,
        })
    }

    /// Parses and validates a request object.
    pub fn from_json(v: &Value) -> Result<Self> {
        let proto = v.get("proto").and_then(Value::as_u64);
        if proto != Some(PROTO_VERSION) {
            bail!("unsupported protocol version {proto:?} (this server speaks {PROTO_VERSION})");
        }
        let test: TestKind = v
            .get("test")
            .and_then(Value::as_str)
            .ok_or_else(|| anyhow!("request has no test name"))?
            .parse()
            .map_err(|e: String| anyhow!(e))?;
        let secs = v
            .get("duration_s")
            .and_then(Value::as_f64)
            .ok_or_else(|| anyhow!("request has no duration"))?;
        if !(secs > 0.0 && secs <= 86_400.0) {
            bail!("test length {secs} s out of range (0..=86400)");
        }
        let size = |k: &str| -> Result<usize> {
            let n = v
                .get(k)
                .and_then(Value::as_u64)
                .ok_or_else(|| anyhow!("request has no {k}"))?;
            usize::try_from(n).with_context(|| format!("{k} too large"))
        };
        let p = TestParams {
            test,
            duration: Duration::from_secs_f64(secs),
            msg_size: size("msg_size")?,
            req_size: size("req_size")?,
            resp_size: size("resp_size")?,
        };
        p.validate()?;
        Ok(p)
    }
}

/// One end of a control connection: JSON lines with bounded length and timeouts.
pub struct Control<S: Conn = TcpStream> {
    stream: S,
    reader: BufReader<S>,
    /// The start of a line a timed-out `recv` had read, kept for the next call (callers that
    /// poll with short timeouts must not lose half a message).
    partial: String,
}

impl<S: Conn> Control<S> {
    /// Wraps a connected stream; control messages are tiny, so Nagle only adds delay.
    pub fn new(stream: S) -> io::Result<Self> {
        stream.no_delay()?;
        let reader = BufReader::new(stream.try_clone_conn()?);
        Ok(Self {
            stream,
            reader,
            partial: String::new(),
        })
    }

    /// Sends one object as a line, giving up after `timeout`.
    pub fn send(&mut self, v: &Value, timeout: Duration) -> io::Result<()> {
        self.stream.write_timeout(Some(nonzero(timeout)))?;
        let mut line = v.to_string();
        line.push('\n');
        self.stream.write_all(line.as_bytes())
    }

    /// Receives one object, giving up after `timeout` (per read; lines arrive in one segment).
    ///
    /// A closed connection is an error of kind `UnexpectedEof`.
    pub fn recv(&mut self, timeout: Duration) -> io::Result<Value> {
        self.stream.read_timeout(Some(nonzero(timeout)))?;
        let room = MAX_LINE.saturating_sub(self.partial.len() as u64);
        // On an error (a timeout) read_line keeps what it read in `partial`.
        let n = (&mut self.reader).take(room).read_line(&mut self.partial)?;
        let line = std::mem::take(&mut self.partial);
        if n == 0 && line.is_empty() {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "control connection closed by peer",
            ));
        }
        if !line.ends_with('\n') {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "control message too long or truncated",
            ));
        }
        serde_json::from_str(line.trim_end())
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))
    }
}

/// Socket timeouts of zero mean "block forever" to the kernel (and std rejects them), so the
/// shortest timeout we set is one millisecond.
pub fn nonzero(d: Duration) -> Duration {
    d.max(Duration::from_millis(1))
}

/// Reads exactly `buf.len()` bytes. `Ok(false)` if the stream ended cleanly before the first
/// byte; an end in the middle is an `UnexpectedEof` error. Retries `EINTR`.
pub fn read_full(r: &mut impl Read, buf: &mut [u8]) -> io::Result<bool> {
    let mut got = 0;
    while got < buf.len() {
        match r.read(&mut buf[got..]) {
            Ok(0) if got == 0 => return Ok(false),
            Ok(0) => {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "connection closed in the middle of a message",
                ))
            }
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(true)
}

/// The sending side of a TCP stream test (the client's STREAM, the server's MAERTS): writes
/// `buf` over and over until `end` and returns the bytes written. A write of nothing (the
/// peer closed the connection) is a `WriteZero` error; `EINTR` is retried.
pub fn send_stream(w: &mut impl Write, buf: &[u8], end: Instant) -> io::Result<u64> {
    let mut sent = 0u64;
    while Instant::now() < end {
        match w.write(buf) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => sent += n as u64,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(sent)
}

/// The receiving side of a TCP stream test: reads into `buf` until the sender's write
/// shutdown and returns the bytes read, or `None` once `deadline` passes with the sender still
/// sending. `EINTR` is retried.
pub fn receive_stream(
    r: &mut impl Read,
    buf: &mut [u8],
    deadline: Instant,
) -> io::Result<Option<u64>> {
    let mut received = 0u64;
    loop {
        match r.read(buf) {
            Ok(0) => return Ok(Some(received)),
            Ok(n) => received += n as u64,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
        if Instant::now() > deadline {
            return Ok(None);
        }
    }
}

/// Whether an I/O error is a socket timeout (`SO_RCVTIMEO`/`SO_SNDTIMEO` expiring shows as
/// `EAGAIN`, i.e. `WouldBlock`).
pub fn is_timeout(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
    )
}

/// A one-line description of why an I/O step failed, naming the likely cause of the common
/// cases (peer gone, peer silent) rather than only the errno.
pub fn describe(e: &io::Error, peer: &str, waited: Duration) -> String {
    match e.kind() {
        _ if is_timeout(e) => format!(
            "{peer} stopped responding (no progress for {:.1} s)",
            waited.as_secs_f64()
        ),
        io::ErrorKind::ConnectionReset | io::ErrorKind::ConnectionAborted => {
            format!("{peer} went away (connection reset)")
        }
        io::ErrorKind::BrokenPipe => format!("{peer} went away (broken pipe)"),
        io::ErrorKind::WriteZero => format!("{peer} closed the connection"),
        io::ErrorKind::UnexpectedEof => format!("{peer} went away ({e})"),
        io::ErrorKind::ConnectionRefused => {
            format!("{peer} is not listening (connection refused / port unreachable)")
        }
        _ => format!("{e}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_names_round_trip_case_insensitively() {
        for t in TestKind::ALL {
            assert_eq!(t.name().parse::<TestKind>(), Ok(t));
            assert_eq!(t.name().to_lowercase().parse::<TestKind>(), Ok(t));
        }
        let err = "TCP_CRR".parse::<TestKind>().expect_err("unknown");
        assert!(err.contains("unknown test 'TCP_CRR'"), "{err}");
    }

    fn params(test: TestKind) -> TestParams {
        TestParams {
            test,
            duration: Duration::from_millis(1500),
            msg_size: 1000,
            req_size: 1,
            resp_size: 2,
        }
    }

    #[test]
    fn request_round_trips() {
        for t in TestKind::ALL {
            let p = params(t);
            assert_eq!(TestParams::from_json(&p.to_json()).expect("valid"), p);
        }
    }

    #[test]
    fn bad_requests_are_refused() {
        let mut v = params(TestKind::TcpStream).to_json();
        v["proto"] = 99.into();
        assert!(TestParams::from_json(&v).is_err());

        let mut v = params(TestKind::UdpStream).to_json();
        v["msg_size"] = 70_000.into();
        assert!(TestParams::from_json(&v).is_err());

        // The sequence number counts against the datagram size.
        let mut v = params(TestKind::UdpRr).to_json();
        v["resp_size"] = (MAX_UDP_MSG - RR_SEQ_LEN + 1).into();
        assert!(TestParams::from_json(&v).is_err());
        v["resp_size"] = (MAX_UDP_MSG - RR_SEQ_LEN).into();
        assert!(TestParams::from_json(&v).is_ok());

        let mut v = params(TestKind::TcpRr).to_json();
        v["req_size"] = 0.into();
        assert!(TestParams::from_json(&v).is_err());

        let mut v = params(TestKind::TcpRr).to_json();
        v["duration_s"] = (-1.0).into();
        assert!(TestParams::from_json(&v).is_err());

        let mut v = params(TestKind::TcpRr).to_json();
        v["test"] = "SCTP_RR".into();
        assert!(TestParams::from_json(&v).is_err());
    }

    #[test]
    fn read_full_distinguishes_clean_and_torn_ends() {
        let mut buf = [0u8; 4];
        assert!(!read_full(&mut &b""[..], &mut buf).expect("clean end"));
        assert!(read_full(&mut &b"abcd"[..], &mut buf).expect("full"));
        assert_eq!(&buf, b"abcd");
        let e = read_full(&mut &b"ab"[..], &mut buf).expect_err("torn");
        assert_eq!(e.kind(), io::ErrorKind::UnexpectedEof);
    }

    /// A writer that takes `room` bytes in all, then writes nothing (a closed peer), with an
    /// EINTR before every accepted write.
    struct Sink {
        room: usize,
        interrupt: bool,
    }

    impl Write for Sink {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            self.interrupt = !self.interrupt;
            if self.interrupt {
                return Err(io::ErrorKind::Interrupted.into());
            }
            let n = buf.len().min(self.room);
            self.room -= n;
            Ok(n)
        }

        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn send_stream_counts_until_the_end_and_reports_a_closed_peer() {
        let now = Instant::now();
        let mut sink = Sink {
            room: 10,
            interrupt: false,
        };
        assert_eq!(send_stream(&mut sink, b"abcd", now).expect("no time"), 0);
        let later = now + Duration::from_secs(60);
        let e = send_stream(&mut sink, b"abcd", later).expect_err("closed");
        assert_eq!(e.kind(), io::ErrorKind::WriteZero);
        assert_eq!(sink.room, 0, "every byte it took was written first");
        assert_eq!(
            describe(&e, "server", later - now),
            "server closed the connection"
        );
    }

    #[test]
    fn receive_stream_counts_to_the_end_or_gives_up_at_the_deadline() {
        let mut buf = [0u8; 3];
        let later = Instant::now() + Duration::from_secs(60);
        let got = receive_stream(&mut &b"abcdefgh"[..], &mut buf, later).expect("read");
        assert_eq!(got, Some(8));
        let past = Instant::now() - Duration::from_millis(1);
        let got = receive_stream(&mut &b"abcdefgh"[..], &mut buf, past).expect("read");
        assert_eq!(got, None);
    }
}
