// SPDX-License-Identifier: Apache-2.0
//! The API socket: a Unix-socket HTTP server on a thread of its own that
//! hands each request to the VMM as one typed [`ApiCommand`] and writes the
//! answer back.
//!
//! Nothing a client does reaches further than this thread:
//! - every connection is non-blocking and polled with epoll, so a silent
//!   client holds no thread; a connection with an unfinished request is
//!   closed after [`IDLE_TIMEOUT`] without a byte;
//! - a connection buffers at most one request, bounded by the parser
//!   ([`http::MAX_HEAD_BYTES`] + [`http::MAX_BODY_BYTES`]), and at most
//!   [`MAX_CONNECTIONS`] are open: one more is accepted and closed at once;
//! - the VMM sees only routed requests, one at a time, through a channel;
//!   its answer comes back through a channel of one, or a fault after
//!   [`VMM_TIMEOUT`] ([`super::command`]);
//! - an answer the client does not read is dropped with the connection
//!   rather than waited on;
//! - the one file this thread opens is a disk image for `PATCH /drives`,
//!   when the VMM asks for it (the two trips of [`super::command`]; this
//!   thread may open and lock an image and nothing more, see
//!   `seccomp::api_rules`).

use std::collections::HashMap;
use std::io::{ErrorKind, Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::mpsc::Sender;
use std::time::{Duration, Instant};

use vmm_sys_util::epoll::{ControlOperation, Epoll, EpollEvent, EventSet};
use vmm_sys_util::eventfd::EventFd;

use super::command::{ask, ApiCommand};
use super::http::{self, Parsed, Response};
use super::routes::route;

/// Most open connections.
pub const MAX_CONNECTIONS: usize = 16;
/// How long a connection may sit on an unfinished request.
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(5);
/// Bytes read per `read` call.
const READ_CHUNK: usize = 4096;

const LISTENER: u64 = u64::MAX;
const STOP: u64 = u64::MAX - 1;

/// Why the server could not start.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    /// The socket path is taken.
    #[error("API socket {} already exists; remove it or choose another path", .0.display())]
    Exists(PathBuf),
    /// The API thread's seccomp filter could not be installed.
    #[error("API socket: {0}")]
    Filter(#[source] crate::process::seccomp::SeccompError),
    /// bind, epoll or eventfd failed.
    #[error("API socket {}: {source}", path.display())]
    Io {
        /// The socket path.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
}

struct Conn {
    stream: UnixStream,
    buf: Vec<u8>,
    last_byte: Instant,
    continue_sent: bool,
}

/// A bound API socket, ready to serve.
pub struct ApiServer {
    listener: UnixListener,
    epoll: Epoll,
    stop: EventFd,
    conns: HashMap<u64, Conn>,
    next_token: u64,
}

impl std::fmt::Debug for ApiServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ApiServer")
            .field("connections", &self.conns.len())
            .finish_non_exhaustive()
    }
}

impl ApiServer {
    /// Binds `path` (which must not exist, as Firecracker requires).
    pub fn bind(path: &Path) -> Result<Self, ServerError> {
        if path.symlink_metadata().is_ok() {
            return Err(ServerError::Exists(path.to_path_buf()));
        }
        let io = |source| ServerError::Io {
            path: path.to_path_buf(),
            source,
        };
        let listener = UnixListener::bind(path).map_err(io)?;
        listener.set_nonblocking(true).map_err(io)?;
        let epoll = Epoll::new().map_err(io)?;
        let stop = EventFd::new(libc::EFD_NONBLOCK).map_err(io)?;
        epoll
            .ctl(
                ControlOperation::Add,
                listener.as_raw_fd(),
                EpollEvent::new(EventSet::IN, LISTENER),
            )
            .map_err(io)?;
        epoll
            .ctl(
                ControlOperation::Add,
                stop.as_raw_fd(),
                EpollEvent::new(EventSet::IN, STOP),
            )
            .map_err(io)?;
        Ok(ApiServer {
            listener,
            epoll,
            stop,
            conns: HashMap::new(),
            next_token: 0,
        })
    }

    /// An `EventFd` whose signal makes [`serve`](Self::serve) return.
    pub fn stopper(&self) -> std::io::Result<EventFd> {
        self.stop.try_clone()
    }

    /// Serves until the stopper is signalled, sending each routed request
    /// to `vmm` and kicking `wake` (the VMM's event-loop eventfd) after.
    pub fn serve(mut self, vmm: Sender<ApiCommand>, wake: Option<EventFd>) {
        let mut events = vec![EpollEvent::default(); 32];
        loop {
            let n = match self.epoll.wait(500, &mut events) {
                Ok(n) => n,
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                Err(e) => {
                    log::error!("API socket: epoll failed, the API stops: {e}");
                    return;
                }
            };
            for ev in &events[..n] {
                match ev.data() {
                    STOP => return,
                    LISTENER => self.accept(),
                    token => self.readable(token, &vmm, wake.as_ref()),
                }
            }
            self.expire();
        }
    }

    fn accept(&mut self) {
        loop {
            let stream = match self.listener.accept() {
                Ok((s, _)) => s,
                Err(e) if e.kind() == ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                Err(e) => {
                    log::warn!("API socket: accept failed: {e}");
                    return;
                }
            };
            if self.conns.len() >= MAX_CONNECTIONS {
                log::warn!("API socket: {MAX_CONNECTIONS} connections open; one more refused");
                continue;
            }
            if stream.set_nonblocking(true).is_err() {
                continue;
            }
            let token = self.next_token;
            self.next_token += 1;
            if self
                .epoll
                .ctl(
                    ControlOperation::Add,
                    stream.as_raw_fd(),
                    EpollEvent::new(EventSet::IN | EventSet::READ_HANG_UP, token),
                )
                .is_err()
            {
                continue;
            }
            self.conns.insert(
                token,
                Conn {
                    stream,
                    buf: Vec::new(),
                    last_byte: Instant::now(),
                    continue_sent: false,
                },
            );
        }
    }

    fn close(&mut self, token: u64) {
        if let Some(c) = self.conns.remove(&token) {
            let _ = self.epoll.ctl(
                ControlOperation::Delete,
                c.stream.as_raw_fd(),
                EpollEvent::default(),
            );
        }
    }

    /// Closes connections that sat on an unfinished request too long.
    fn expire(&mut self) {
        let stale: Vec<u64> = self
            .conns
            .iter()
            .filter(|(_, c)| !c.buf.is_empty() && c.last_byte.elapsed() > IDLE_TIMEOUT)
            .map(|(t, _)| *t)
            .collect();
        for t in stale {
            log::warn!("API socket: a client sent half a request and went quiet; closed");
            self.close(t);
        }
    }

    fn readable(&mut self, token: u64, vmm: &Sender<ApiCommand>, wake: Option<&EventFd>) {
        let Some(c) = self.conns.get_mut(&token) else {
            return;
        };
        let mut chunk = [0u8; READ_CHUNK];
        let mut eof = false;
        loop {
            match c.stream.read(&mut chunk) {
                Ok(0) => {
                    eof = true;
                    break;
                }
                Ok(n) => {
                    c.buf.extend_from_slice(&chunk[..n]);
                    c.last_byte = Instant::now();
                    // The parser refuses more than this; stop reading on.
                    if c.buf.len() > http::MAX_HEAD_BYTES + http::MAX_BODY_BYTES + 4 {
                        break;
                    }
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                Err(_) => {
                    eof = true;
                    break;
                }
            }
        }
        // Answer every whole request in the buffer, in order.
        loop {
            let Some(c) = self.conns.get_mut(&token) else {
                return;
            };
            match http::parse(&c.buf) {
                Ok(Parsed::Incomplete { continue_expected }) => {
                    if continue_expected && !c.continue_sent {
                        c.continue_sent = true;
                        let _ = c.stream.write_all(http::CONTINUE);
                    }
                    break;
                }
                Ok(Parsed::Request(req, used)) => {
                    c.buf.drain(..used);
                    c.continue_sent = false;
                    let answer = match route(&req) {
                        Ok(request) => ask(vmm, wake, request),
                        Err(msg) => Response::fault(&msg),
                    };
                    if !send(&mut c.stream, &answer, req.close) || req.close {
                        self.close(token);
                        return;
                    }
                }
                Err(e) => {
                    // The stream cannot be resynchronised after a bad
                    // request: answer and close.
                    send(&mut c.stream, &Response::fault(&e.to_string()), true);
                    self.close(token);
                    return;
                }
            }
        }
        if eof {
            self.close(token);
        }
    }
}

/// Writes an answer; false when the client is gone or does not read.
fn send(stream: &mut UnixStream, r: &Response, close: bool) -> bool {
    let bytes = r.to_bytes(close);
    let mut off = 0;
    let deadline = Instant::now() + Duration::from_secs(1);
    while off < bytes.len() {
        match stream.write(&bytes[off..]) {
            Ok(0) => return false,
            Ok(n) => off += n,
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) if e.kind() == ErrorKind::WouldBlock && Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(1));
            }
            Err(_) => return false,
        }
    }
    true
}

#[cfg(test)]
mod tests {
    use std::sync::mpsc;

    use super::*;
    use crate::api::command::{Answer, OpenedImage, VMM_TIMEOUT};
    use crate::api::routes::{Action, ApiRequest};

    struct Running {
        path: PathBuf,
        stop: EventFd,
        thread: Option<std::thread::JoinHandle<()>>,
        vmm: Option<std::thread::JoinHandle<Vec<ApiRequest>>>,
    }

    impl Drop for Running {
        fn drop(&mut self) {
            let _ = self.stop.write(1);
            if let Some(t) = self.thread.take() {
                let _ = t.join();
            }
            let _ = std::fs::remove_file(&self.path);
        }
    }

    /// A server on a socket of this test thread's own under `tag`: its
    /// path, stopper, thread, and the commands it sends the "VMM".
    fn serve_at(
        tag: &str,
    ) -> (
        PathBuf,
        EventFd,
        std::thread::JoinHandle<()>,
        mpsc::Receiver<ApiCommand>,
    ) {
        let dir = std::env::temp_dir().join(format!(
            "{tag}-{}-{:?}",
            std::process::id(),
            std::thread::current().id()
        ));
        let _ = std::fs::create_dir_all(&dir);
        let path = dir.join("api.sock");
        let _ = std::fs::remove_file(&path);
        let server = ApiServer::bind(&path).unwrap();
        let stop = server.stopper().unwrap();
        let (tx, rx) = mpsc::channel::<ApiCommand>();
        let thread = std::thread::spawn(move || server.serve(tx, None));
        (path, stop, thread, rx)
    }

    /// A server whose "VMM" answers 204 to everything and records it, or
    /// never answers when `silent`.
    fn start(silent: bool) -> Running {
        let (path, stop, thread, rx) = serve_at("minivmm-api-test");
        let vmm = std::thread::spawn(move || {
            let mut seen = Vec::new();
            let mut held = Vec::new();
            for cmd in rx {
                seen.push(cmd.request.clone());
                if silent {
                    held.push(cmd.reply);
                } else {
                    let _ = cmd.reply.send(Response::no_content().into());
                }
            }
            seen
        });
        Running {
            path,
            stop,
            thread: Some(thread),
            vmm: Some(vmm),
        }
    }

    fn exchange(stream: &mut UnixStream, req: &[u8]) -> String {
        stream.write_all(req).unwrap();
        stream.set_read_timeout(Some(VMM_TIMEOUT * 2)).unwrap();
        let mut got = Vec::new();
        let mut b = [0u8; 4096];
        // One answer: read until its head and body are in. Other tests of
        // this process send signals (the pause kick, SIGUSR1 to the
        // process) that may land on this thread: a read they interrupt is
        // read again.
        loop {
            let n = match stream.read(&mut b) {
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                r => r.unwrap(),
            };
            if n == 0 {
                break;
            }
            got.extend_from_slice(&b[..n]);
            let s = String::from_utf8_lossy(&got);
            if let Some(h) = s.find("\r\n\r\n") {
                let len = s[..h]
                    .lines()
                    .find_map(|l| l.strip_prefix("Content-Length: "))
                    .map_or(0, |v| v.parse::<usize>().unwrap());
                if got.len() >= h + 4 + len {
                    break;
                }
            }
        }
        String::from_utf8(got).unwrap()
    }

    #[test]
    fn requests_reach_the_vmm_and_faults_do_not() {
        let mut srv = start(false);
        let mut c = UnixStream::connect(&srv.path).unwrap();
        let ok = exchange(
            &mut c,
            b"PUT /actions HTTP/1.1\r\nContent-Length: 33\r\n\r\n{\"action_type\": \"FlushMetrics\"}  ",
        );
        assert!(ok.starts_with("HTTP/1.1 204 No Content\r\n"), "{ok}");
        // The same connection stays usable after an error the router found.
        let bad = exchange(&mut c, b"GET /balloon HTTP/1.1\r\n\r\n");
        assert!(bad.starts_with("HTTP/1.1 400 Bad Request\r\n"), "{bad}");
        assert!(
            bad.ends_with(r#"{"fault_message":"the balloon device is not supported by minivmm"}"#),
            "{bad}"
        );
        let ok = exchange(&mut c, b"GET / HTTP/1.1\r\n\r\n");
        assert!(ok.starts_with("HTTP/1.1 204"), "{ok}");
        drop(c);
        let _ = srv.stop.write(1);
        srv.thread.take().unwrap().join().unwrap();
        let seen = srv.vmm.take().unwrap().join().unwrap();
        assert_eq!(
            seen,
            [
                ApiRequest::Action(Action::FlushMetrics),
                ApiRequest::GetInstanceInfo
            ]
        );
    }

    #[test]
    fn a_malformed_request_is_answered_and_the_connection_closed() {
        let srv = start(false);
        let mut c = UnixStream::connect(&srv.path).unwrap();
        let big = format!(
            "PUT /drives/x HTTP/1.1\r\nContent-Length: {}\r\n\r\n",
            http::MAX_BODY_BYTES + 1
        );
        let r = exchange(&mut c, big.as_bytes());
        assert!(r.starts_with("HTTP/1.1 400"), "{r}");
        assert!(r.contains("exceeds the limit of 51200 bytes"), "{r}");
        let mut b = [0u8; 16];
        assert_eq!(c.read(&mut b).unwrap(), 0, "closed after a bad request");
    }

    #[test]
    fn a_silent_client_does_not_block_another_and_is_closed() {
        let srv = start(false);
        let mut quiet = UnixStream::connect(&srv.path).unwrap();
        quiet
            .write_all(b"PUT /machine-config HTTP/1.1\r\n")
            .unwrap();
        let mut other = UnixStream::connect(&srv.path).unwrap();
        let t0 = Instant::now();
        let r = exchange(&mut other, b"GET /version HTTP/1.1\r\n\r\n");
        assert!(r.starts_with("HTTP/1.1 204"), "{r}");
        assert!(
            t0.elapsed() < IDLE_TIMEOUT,
            "served while the other was quiet"
        );
        quiet.set_read_timeout(Some(IDLE_TIMEOUT * 3)).unwrap();
        let mut b = [0u8; 16];
        assert_eq!(quiet.read(&mut b).unwrap(), 0, "the quiet client is closed");
        assert!(t0.elapsed() >= IDLE_TIMEOUT);
    }

    #[test]
    fn connections_beyond_the_bound_are_refused_and_the_rest_served() {
        let srv = start(false);
        let held: Vec<UnixStream> = (0..MAX_CONNECTIONS)
            .map(|_| UnixStream::connect(&srv.path).unwrap())
            .collect();
        // Let the server accept them all.
        let mut probe = held[0].try_clone().unwrap();
        let r = exchange(&mut probe, b"GET / HTTP/1.1\r\n\r\n");
        assert!(r.starts_with("HTTP/1.1 204"), "{r}");
        let mut extra = UnixStream::connect(&srv.path).unwrap();
        extra
            .set_read_timeout(Some(Duration::from_secs(5)))
            .unwrap();
        let mut b = [0u8; 16];
        assert_eq!(extra.read(&mut b).unwrap(), 0, "one more is closed at once");
        let r = exchange(&mut probe, b"GET / HTTP/1.1\r\n\r\n");
        assert!(r.starts_with("HTTP/1.1 204"), "{r}");
    }

    #[test]
    fn a_vmm_that_does_not_answer_gets_a_fault_not_a_hang() {
        // Bounded by VMM_TIMEOUT; the answer is a 400 with a reason.
        let srv = start(true);
        let mut c = UnixStream::connect(&srv.path).unwrap();
        let r = exchange(&mut c, b"GET / HTTP/1.1\r\n\r\n");
        assert!(r.contains("the VMM did not answer in time"), "{r}");
    }

    /// A server whose "VMM" asks for `image` to be opened on the first trip
    /// of every request and answers with what the second trip brought.
    fn start_opener(image: PathBuf) -> (Running, std::thread::JoinHandle<Vec<String>>) {
        let (path, stop, thread, rx) = serve_at("minivmm-api-open");
        let vmm = std::thread::spawn(move || {
            let mut seen = Vec::new();
            for cmd in rx {
                let answer = match cmd.image {
                    None => Answer::Open {
                        path: image.clone(),
                        read_only: true,
                    },
                    Some(OpenedImage::Image(b)) => {
                        use devices::virtio::block::BlockBackend;
                        seen.push(format!("image {}", b.info().size));
                        Response::no_content().into()
                    }
                    Some(other) => {
                        seen.push(format!("{other:?}"));
                        Response::fault("not opened").into()
                    }
                };
                let _ = cmd.reply.send(answer);
            }
            seen
        });
        let running = Running {
            path,
            stop,
            thread: Some(thread),
            vmm: None,
        };
        (running, vmm)
    }

    #[test]
    fn the_image_the_vmm_asks_for_is_opened_here_and_sent_back_with_the_request() {
        let dir = std::env::temp_dir().join(format!("minivmm-api-img-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let image = dir.join("new.img");
        std::fs::write(&image, vec![0u8; 8192]).unwrap();
        let (mut srv, vmm) = start_opener(image.clone());
        let mut c = UnixStream::connect(&srv.path).unwrap();
        let body = format!(r#"{{"drive_id":"d","path_on_host":"{}"}}"#, image.display());
        let req = format!(
            "PATCH /drives/d HTTP/1.1\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        );
        let r = exchange(&mut c, req.as_bytes());
        assert!(r.starts_with("HTTP/1.1 204"), "{r}");
        // A file that cannot be opened reaches the VMM as the reason.
        std::fs::remove_file(&image).unwrap();
        let r = exchange(&mut c, req.as_bytes());
        assert!(r.contains("not opened"), "{r}");
        drop(c);
        let _ = srv.stop.write(1);
        srv.thread.take().unwrap().join().unwrap();
        let seen = vmm.join().unwrap();
        assert_eq!(seen.len(), 2, "{seen:?}");
        assert_eq!(seen[0], "image 8192");
        assert!(
            seen[1].starts_with("Failed(") && seen[1].contains("new.img"),
            "{seen:?}"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn an_existing_path_is_refused() {
        let srv = start(false);
        let e = ApiServer::bind(&srv.path).unwrap_err();
        assert!(e.to_string().contains("already exists"), "{e}");
    }
}
