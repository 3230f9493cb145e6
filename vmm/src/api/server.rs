// SPDX-License-Identifier: Apache-2.0
//! The API socket: a Unix-socket HTTP server on a thread of its own that
//! hands each request to the VMM as one typed [`ApiCommand`] and writes the
//! answer back.
//!
//! This file is the production loop around [`Connections`], the state
//! machine that holds every connection, its bounds and its deadlines (see
//! there): the listening socket, epoll, the monotonic clock, and the
//! channel to the VMM. Nothing a client does reaches further than this
//! thread, and the thread never waits for anything but epoll:
//! - every connection is non-blocking and edge-triggered in epoll; the
//!   state machine reads and writes until the socket would block, and an
//!   answer the client does not read is dropped with the connection after
//!   its deadline rather than waited on;
//! - the VMM gets each routed request through a channel and the event
//!   loop's eventfd, and answers through the command's slot and this
//!   thread's own eventfd ([`ApiCommand`]), so a slow or stuck VMM holds
//!   up no connection but the one whose request it has;
//! - the one file this thread opens is a disk image for `PATCH /drives`,
//!   when the VMM asks for it ([`Answer::Open`](super::command::Answer)):
//!   the VMM's own thread may open no file (its seccomp filter), this one
//!   may open and lock an image (and nothing more, see
//!   `seccomp::api_rules`), and the request goes to the VMM again with the
//!   open image. The path resolves where this thread runs: inside the
//!   jail, if minivmm was jailed.

use std::io::ErrorKind;
use std::os::fd::AsRawFd;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::mpsc::Sender;
use std::sync::Arc;
use std::time::{Duration, Instant};

use vmm_sys_util::epoll::{ControlOperation, Epoll, EpollEvent, EventSet};
use vmm_sys_util::eventfd::EventFd;

use super::command::{open_image, ApiCommand, OpenedImage, Ticket};
use super::connections::{Connections, Vmm};
use super::routes::ApiRequest;

const LISTENER: u64 = u64::MAX;
const STOP: u64 = u64::MAX - 1;
const ANSWERS: u64 = u64::MAX - 2;
/// The longest epoll wait: deadlines are looked at at least this often.
const MAX_WAIT: Duration = Duration::from_secs(1);
/// The wait while the listener has connections it could not accept (the
/// descriptor limit): tried again this soon.
const ACCEPT_RETRY: Duration = Duration::from_millis(100);

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

/// The VMM as the production loop reaches it: the command channel, the
/// event loop's wake-up, and this thread's eventfd for the answers.
struct ChannelVmm {
    commands: Sender<ApiCommand>,
    wake: Option<EventFd>,
    answers: Arc<EventFd>,
}

impl Vmm for ChannelVmm {
    fn send(&mut self, request: ApiRequest, image: Option<OpenedImage>) -> Option<Ticket> {
        let (cmd, ticket) = ApiCommand::new(request, image, Some(self.answers.clone()));
        self.commands.send(cmd).ok()?;
        if let Some(w) = &self.wake {
            // A full counter means a wake-up is pending already.
            let _ = w.write(1);
        }
        Some(ticket)
    }

    fn open_image(&mut self, path: &Path, read_only: bool) -> OpenedImage {
        open_image(path, read_only)
    }
}

/// A bound API socket, ready to serve.
pub struct ApiServer {
    listener: UnixListener,
    epoll: Epoll,
    stop: EventFd,
    answers: Arc<EventFd>,
    body_limit: usize,
}

impl std::fmt::Debug for ApiServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ApiServer").finish_non_exhaustive()
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
        let listener = crate::listen::bind_listening(path).map_err(|e| match e.kind() {
            ErrorKind::AlreadyExists | ErrorKind::AddrInUse => {
                ServerError::Exists(path.to_path_buf())
            }
            _ => io(e),
        })?;
        listener.set_nonblocking(true).map_err(io)?;
        let epoll = Epoll::new().map_err(io)?;
        let stop = EventFd::new(libc::EFD_NONBLOCK).map_err(io)?;
        let answers = EventFd::new(libc::EFD_NONBLOCK).map_err(io)?;
        for (fd, events, token) in [
            // Edge-triggered: a connection the descriptor limit keeps in
            // the backlog is tried again on a timer, not in a busy loop.
            (
                listener.as_raw_fd(),
                EventSet::IN | EventSet::EDGE_TRIGGERED,
                LISTENER,
            ),
            (stop.as_raw_fd(), EventSet::IN, STOP),
            (answers.as_raw_fd(), EventSet::IN, ANSWERS),
        ] {
            epoll
                .ctl(ControlOperation::Add, fd, EpollEvent::new(events, token))
                .map_err(io)?;
        }
        Ok(ApiServer {
            listener,
            epoll,
            stop,
            answers: Arc::new(answers),
            body_limit: super::http::MAX_BODY_BYTES,
        })
    }

    /// Takes request bodies of up to `limit` bytes
    /// (`--http-api-max-payload-size`) instead of Firecracker's default.
    pub fn with_body_limit(mut self, limit: usize) -> Self {
        self.body_limit = limit;
        self
    }

    /// An `EventFd` whose signal makes [`serve`](Self::serve) return.
    pub fn stopper(&self) -> std::io::Result<EventFd> {
        self.stop.try_clone()
    }

    /// Serves until the stopper is signalled, sending each routed request
    /// to `vmm` and kicking `wake` (the VMM's event-loop eventfd) after.
    pub fn serve(self, vmm: Sender<ApiCommand>, wake: Option<EventFd>) {
        let start = Instant::now();
        let mut conns = Connections::new(ChannelVmm {
            commands: vmm,
            wake,
            answers: self.answers.clone(),
        })
        .with_body_limit(self.body_limit);
        let mut events = vec![EpollEvent::default(); 32];
        let mut backlog = false;
        loop {
            let most = if backlog { ACCEPT_RETRY } else { MAX_WAIT };
            let wait = conns
                .next_deadline()
                .map_or(most, |d| d.saturating_sub(start.elapsed()).min(most));
            // Rounded up, so that the deadline has passed when it wakes.
            let ms = wait.as_micros().div_ceil(1000) as i32;
            let n = match self.epoll.wait(ms, &mut events) {
                Ok(n) => n,
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                Err(e) => {
                    log::error!("API socket: epoll failed, the API stops: {e}");
                    return;
                }
            };
            let now = start.elapsed();
            for ev in &events[..n] {
                match ev.data() {
                    STOP => return,
                    LISTENER => backlog = self.accept(&mut conns, now, backlog),
                    ANSWERS => {
                        let _ = self.answers.read();
                        conns.answers(now);
                    }
                    token => conns.ready(token, now),
                }
            }
            if backlog && n == 0 {
                backlog = self.accept(&mut conns, now, backlog);
            }
            conns.tick(now);
        }
    }

    /// Accepts every waiting connection; true when some could not be (and
    /// wait in the backlog), which is logged when it starts (`backlog` is
    /// whether it had).
    fn accept(
        &self,
        conns: &mut Connections<UnixStream, ChannelVmm>,
        now: Duration,
        backlog: bool,
    ) -> bool {
        loop {
            let stream = match self.listener.accept() {
                Ok((s, _)) => s,
                Err(e) if e.kind() == ErrorKind::WouldBlock => return false,
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                Err(e) => {
                    if !backlog {
                        log::warn!("API socket: accept failed, tried again shortly: {e}");
                    }
                    return true;
                }
            };
            if stream.set_nonblocking(true).is_err() {
                continue;
            }
            let fd = stream.as_raw_fd();
            let Some(token) = conns.accept(stream, now) else {
                continue;
            };
            let events =
                EventSet::IN | EventSet::OUT | EventSet::READ_HANG_UP | EventSet::EDGE_TRIGGERED;
            if self
                .epoll
                .ctl(ControlOperation::Add, fd, EpollEvent::new(events, token))
                .is_err()
            {
                conns.drop_connection(token);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::io::{Read, Write};
    use std::sync::mpsc;

    use super::*;
    use crate::api::command::Answer;
    use crate::api::connections::{IDLE_TIMEOUT, MAX_CONNECTIONS};
    use crate::api::http::{self, Response};
    use crate::api::routes::Action;

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
    /// never takes a request when `silent`.
    fn start(silent: bool) -> Running {
        let (path, stop, thread, rx) = serve_at("minivmm-api-test");
        let vmm = std::thread::spawn(move || {
            let mut seen = Vec::new();
            let mut held = Vec::new();
            for cmd in rx {
                seen.push(cmd.request().clone());
                if silent {
                    held.push(cmd);
                } else if let Some(c) = cmd.claim() {
                    c.reply.send(Response::no_content());
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

    /// Reads one answer (head and body) from `stream`.
    fn read_answer(stream: &mut UnixStream) -> String {
        stream
            .set_read_timeout(Some(Duration::from_secs(20)))
            .unwrap();
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

    fn exchange(stream: &mut UnixStream, req: &[u8]) -> String {
        stream.write_all(req).unwrap();
        read_answer(stream)
    }

    /// Whether the server closed `stream` within `within`.
    fn closed(stream: &mut UnixStream, within: Duration) -> bool {
        stream.set_read_timeout(Some(within)).unwrap();
        let mut b = [0u8; 16];
        loop {
            match stream.read(&mut b) {
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                r => return matches!(r, Ok(0)),
            }
        }
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
        let bad = exchange(&mut c, b"GET /nope HTTP/1.1\r\n\r\n");
        assert!(bad.starts_with("HTTP/1.1 400 Bad Request\r\n"), "{bad}");
        assert!(
            bad.ends_with(r#"{"fault_message":"invalid request: unknown path /nope"}"#),
            "{bad}"
        );
        // Pipelined: answered in order, each once.
        c.write_all(b"GET / HTTP/1.1\r\n\r\nGET /version HTTP/1.1\r\n\r\n")
            .unwrap();
        let mut both = String::new();
        while both.matches("HTTP/1.1 204").count() < 2 {
            let more = read_answer(&mut c);
            assert!(more.starts_with("HTTP/1.1 204"), "{more}");
            both.push_str(&more);
        }
        assert_eq!(both.matches("HTTP/1.1").count(), 2, "{both}");
        drop(c);
        let _ = srv.stop.write(1);
        srv.thread.take().unwrap().join().unwrap();
        let seen = srv.vmm.take().unwrap().join().unwrap();
        assert_eq!(
            seen,
            [
                ApiRequest::Action(Action::FlushMetrics),
                ApiRequest::GetInstanceInfo,
                ApiRequest::GetVersion,
            ]
        );
    }

    #[test]
    fn a_malformed_request_is_answered_its_body_dropped_and_the_connection_closed() {
        let srv = start(false);
        let mut c = UnixStream::connect(&srv.path).unwrap();
        let big = format!(
            "PUT /drives/x HTTP/1.1\r\nContent-Length: {}\r\n\r\n",
            http::MAX_BODY_BYTES + 1
        );
        let r = exchange(&mut c, big.as_bytes());
        assert!(r.starts_with("HTTP/1.1 400"), "{r}");
        assert!(r.contains("exceeds the limit of 51200 bytes"), "{r}");
        // A client that writes its whole body before it reads (as most
        // do) can: the server reads and drops it rather than closing on
        // it, which would fail the write (EPIPE) and lose the answer.
        let body = vec![b' '; http::MAX_BODY_BYTES + 1];
        c.write_all(&body).expect("the rest of the body is taken");
        assert!(
            closed(&mut c, Duration::from_secs(5)),
            "the end follows the answer"
        );
        // The end came from the shut writing side, not from a close at the
        // lingering's end: the server still takes what the client sends.
        c.write_all(b"more").expect("the server lingers");
        drop(c);
        // The connection is gone once the client is: the next client is
        // served with one connection open.
        let mut c = UnixStream::connect(&srv.path).unwrap();
        let r = exchange(&mut c, b"GET / HTTP/1.1\r\nConnection: close\r\n\r\n");
        assert!(r.starts_with("HTTP/1.1 204"), "{r}");
        assert!(closed(&mut c, Duration::from_secs(5)));
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
        assert!(
            closed(&mut quiet, IDLE_TIMEOUT * 3),
            "the quiet client is closed"
        );
        assert!(t0.elapsed() >= IDLE_TIMEOUT - Duration::from_millis(100));
    }

    #[test]
    fn idle_connections_give_way_and_busy_ones_make_others_wait_outside() {
        let srv = start(true);
        let mut idle: Vec<UnixStream> = (0..MAX_CONNECTIONS)
            .map(|_| UnixStream::connect(&srv.path).unwrap())
            .collect();
        // Each newcomer takes the place of the idle connection that waited
        // longest, and is served: here by the router, as the "VMM" is silent.
        let mut newcomers = Vec::new();
        for (i, old) in idle.iter_mut().take(2).enumerate() {
            std::thread::sleep(Duration::from_millis(50));
            let mut c = UnixStream::connect(&srv.path).unwrap();
            let r = exchange(&mut c, b"GET /vsock HTTP/1.1\r\n\r\n");
            assert!(
                r.starts_with("HTTP/1.1 400") && r.contains("fault_message"),
                "{r}"
            );
            assert!(closed(old, Duration::from_secs(2)), "idle {i} stayed");
            newcomers.push(c);
        }
        // Requests the silent VMM holds make every connection busy: a new
        // one is closed at once, unserved.
        idle.drain(..2);
        idle.append(&mut newcomers);
        for c in &mut idle {
            c.write_all(b"GET / HTTP/1.1\r\n\r\n").unwrap();
        }
        std::thread::sleep(Duration::from_millis(200));
        let mut extra = UnixStream::connect(&srv.path).unwrap();
        assert!(
            closed(&mut extra, Duration::from_secs(5)),
            "one more is closed at once"
        );
        // Meanwhile the server goes on: a connection still open is served.
        let mut last = idle.pop().unwrap();
        assert!(!closed(&mut last, Duration::from_millis(100)));
    }

    /// A server whose "VMM" asks for `image` to be opened on the first trip
    /// of every request and answers with what the second trip brought.
    fn start_opener(image: PathBuf) -> (Running, std::thread::JoinHandle<Vec<String>>) {
        let (path, stop, thread, rx) = serve_at("minivmm-api-open");
        let vmm = std::thread::spawn(move || {
            let mut seen = Vec::new();
            for cmd in rx {
                let Some(c) = cmd.claim() else { continue };
                let answer = match c.image {
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
                c.reply.send(answer);
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
