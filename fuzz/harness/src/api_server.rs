// SPDX-License-Identifier: Apache-2.0
//! Target `api_server`: the API socket's connections (`vmm::api::connections`)
//! driven as the production loop drives them, by clients, a VMM and a clock
//! the input controls.
//!
//! Each client is an in-memory connection: what it sends waits in its
//! outbox until the input hands some of it over (so requests arrive split
//! anywhere and interleaved across connections), what the server writes is
//! held to a window the input opens and closes (a client that reads slowly
//! or never), and a client may shut its writing side or go away. A readiness
//! event reaches the server only when something changed on a connection
//! and the input delivers it, as an edge-triggered epoll would report it.
//! The VMM takes, holds, answers or drops commands when the input says, and
//! time moves only when the input says, by up to a minute at a time, past
//! any deadline. Requests carry unique tags (`PATCH /machine-config` and
//! `PATCH /drives`, whose first trip asks for an image), mixed with plain
//! requests, bad paths, bad HTTP and raw bytes.
//!
//! Oracles, after every step:
//! - no tag is applied twice, and none that its client was told was not
//!   applied (a time-out, a full VMM queue) is ever applied, to the end;
//! - every answer a client reads is the answer to its own next request, in
//!   order (a tagged answer names the request's tag), and no request is
//!   answered twice;
//! - at most 16 connections, at most 32 requests with the VMM, a bounded
//!   number of bytes buffered, and no deadline left behind by a tick;
//! - at most one log line per second of the clock, and one to start;
//!
//! - nothing is written to a client after the server shut its writing side;
//!
//! and at the end, when the VMM answered everything and every client read
//! everything with every event delivered: every whole request on a
//! connection the server kept reading was answered (nothing waits for an
//! edge that never comes), a connection that lingers has answered exactly
//! up to its closing request and shut its writing side, and a day later
//! every connection is closed.

use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::io::{ErrorKind, Read, Write};
use std::path::Path;
use std::rc::Rc;
use std::time::Duration;

use arbitrary::Arbitrary;
use serde_json::{json, Value};
use vmm::api::command::{Answer, ApiCommand, Claimed, OpenedImage, Ticket};
use vmm::api::connections::{
    Connections, HalfClose, PhaseKind, Vmm, MAX_BUFFERED, MAX_CONNECTIONS, MAX_IN_FLIGHT,
};
use vmm::api::http::{self, Parsed, Response};
use vmm::api::routes::{route, ApiRequest};

/// One request or stretch of bytes a client sends.
#[derive(Debug, Clone, Arbitrary)]
pub enum Piece {
    /// `PATCH /machine-config` with a fresh tag, applied by the VMM on its
    /// first trip.
    Tagged {
        /// `Expect: 100-continue`.
        expect: bool,
        /// `Connection: close`.
        close: bool,
        /// Spaces after the JSON body (a longer body arrives in more reads).
        pad: u16,
    },
    /// `PATCH /drives/d` with a fresh tag: the VMM asks for the image, and
    /// applies the request on its second trip.
    Drive,
    /// `GET /`.
    Get,
    /// A path the router refuses itself.
    BadPath,
    /// HTTP the parser refuses (the connection is then closed).
    BadHttp,
    /// Anything.
    Raw(Vec<u8>),
}

/// What the VMM does with its commands.
#[derive(Debug, Clone, Copy, Arbitrary)]
pub enum VmmStep {
    /// Claims and answers up to this many queued commands.
    Answer(u8),
    /// Claims the next queued command and keeps it, unanswered.
    Hold,
    /// Answers the oldest command it holds.
    Release,
    /// Claims the next queued command and drops it without an answer.
    Drop,
}

/// How far the clock moves.
#[derive(Debug, Clone, Copy, Arbitrary)]
pub enum Span {
    /// Milliseconds.
    Ms(u8),
    /// Seconds.
    Secs(u8),
}

/// One step of the input, and whether every waiting event and answer
/// reaches the server right after it (as a prompt event loop would
/// deliver them) or stays waiting for a later step.
#[derive(Debug, Clone, Arbitrary)]
pub struct Step {
    op: Op,
    deliver: bool,
}

/// One action of a client, the VMM or the clock.
#[derive(Debug, Clone, Arbitrary)]
pub enum Op {
    /// A new client connects.
    Connect,
    /// Client `c` puts a piece in its outbox and hands all of it to the
    /// server.
    Request(u8, Piece),
    /// Client `c` puts a piece in its outbox.
    Write(u8, Piece),
    /// Client `c` hands up to `n` bytes of its outbox to the server.
    Send(u8, u16),
    /// Client `c` reads up to `n` bytes, and its window opens by as many.
    Read(u8, u16),
    /// Client `c` lets the server write `n` more bytes.
    Open(u8, u16),
    /// Client `c` shuts its writing side.
    Shut(u8),
    /// Client `c` goes away.
    Close(u8),
    /// The server gets the events of client `c`, if it has any.
    Event(u8),
    /// The server gets every event waiting.
    Events,
    /// The VMM works.
    Vmm(VmmStep),
    /// The server learns of the VMM's answers.
    Answers,
    /// Time passes, then a tick.
    Advance(Span),
}

/// A whole input.
#[derive(Debug, Clone, Arbitrary)]
pub struct Input {
    steps: Vec<Step>,
}

/// Runs one input.
pub fn run(data: &[u8]) {
    crate::with_input(data, |input: &Input| {
        let mut world = World::new();
        for step in input.steps.iter().take(400) {
            world.step(&step.op);
            if step.deliver {
                world.events();
                world.conns.answers(world.now);
                world.read_answers();
            }
            world.check();
        }
        world.drain();
    });
}

/// Both ends of one connection.
#[derive(Debug, Default)]
struct Pipe {
    to_server: VecDeque<u8>,
    to_client: Vec<u8>,
    room: usize,
    shut: bool,
    gone: bool,
    closed: bool,
    /// The server shut its writing side.
    server_shut: bool,
}

/// The server's end.
struct Stream(Rc<RefCell<Pipe>>);

impl Read for Stream {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let mut p = self.0.borrow_mut();
        if p.to_server.is_empty() {
            return if p.shut || p.gone {
                Ok(0)
            } else {
                Err(ErrorKind::WouldBlock.into())
            };
        }
        let n = buf.len().min(p.to_server.len());
        for (b, v) in buf.iter_mut().zip(p.to_server.drain(..n)) {
            *b = v;
        }
        Ok(n)
    }
}

impl Write for Stream {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let mut p = self.0.borrow_mut();
        assert!(!p.server_shut, "a write after the writing side was shut");
        if p.gone {
            return Err(ErrorKind::BrokenPipe.into());
        }
        let n = buf.len().min(p.room);
        if n == 0 {
            return Err(ErrorKind::WouldBlock.into());
        }
        p.room -= n;
        p.to_client.extend_from_slice(&buf[..n]);
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl HalfClose for Stream {
    fn shut_write(&mut self) {
        self.0.borrow_mut().server_shut = true;
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        self.0.borrow_mut().closed = true;
    }
}

/// The VMM: queued commands, the ones it holds, and what it applied.
#[derive(Default)]
struct FakeVmm {
    queue: VecDeque<ApiCommand>,
    held: VecDeque<Claimed>,
    applied: Vec<u64>,
}

/// The server's handle on the VMM.
struct Port(Rc<RefCell<FakeVmm>>);

impl Vmm for Port {
    fn send(&mut self, request: ApiRequest, image: Option<OpenedImage>) -> Option<Ticket> {
        let (cmd, ticket) = ApiCommand::new(request, image, None);
        self.0.borrow_mut().queue.push_back(cmd);
        Some(ticket)
    }

    fn open_image(&mut self, path: &Path, _read_only: bool) -> OpenedImage {
        OpenedImage::Failed(format!("not opened: {}", path.display()))
    }
}

fn tag_of(v: &Value) -> Option<u64> {
    v.get("n").and_then(Value::as_u64)
}

impl FakeVmm {
    /// Applies a claimed command: its answer.
    fn apply(&mut self, c: &Claimed) -> Answer {
        match (&c.request, &c.image) {
            (ApiRequest::PatchDrive(_, v), None) => Answer::Open {
                path: v["path_on_host"].as_str().unwrap_or("/").into(),
                read_only: false,
            },
            (ApiRequest::PatchMachineConfig(v) | ApiRequest::PatchDrive(_, v), _) => {
                let n = tag_of(v).expect("every tagged request has its tag");
                self.applied.push(n);
                Response::json(json!({ "n": n }).to_string()).into()
            }
            _ => Response::json("{}".into()).into(),
        }
    }

    fn step(&mut self, s: VmmStep) {
        match s {
            VmmStep::Answer(k) => {
                for _ in 0..k {
                    let Some(cmd) = self.queue.pop_front() else {
                        break;
                    };
                    if let Some(c) = cmd.claim() {
                        let a = self.apply(&c);
                        c.reply.send(a);
                    }
                }
            }
            VmmStep::Hold => {
                if let Some(c) = self.queue.pop_front().and_then(ApiCommand::claim) {
                    self.held.push_back(c);
                }
            }
            VmmStep::Release => {
                if let Some(c) = self.held.pop_front() {
                    let a = self.apply(&c);
                    c.reply.send(a);
                }
            }
            VmmStep::Drop => {
                drop(self.queue.pop_front().and_then(ApiCommand::claim));
            }
        }
    }
}

/// One client and what it knows.
struct Client {
    pipe: Rc<RefCell<Pipe>>,
    /// Its token, `None` when it was refused.
    token: Option<u64>,
    outbox: Vec<u8>,
    /// Every byte handed to the server.
    sent: Vec<u8>,
    /// The requests in them, as the server's parser splits them; an `Err`
    /// ends the stream.
    requests: Vec<Result<http::Request, ()>>,
    /// How far `sent` was split into `requests`.
    parsed: usize,
    /// Every byte read from the server.
    inbox: Vec<u8>,
    /// Answers parsed from the inbox so far.
    answers: usize,
    /// Something changed since the server last looked.
    event: bool,
}

impl Client {
    /// Hands up to `n` bytes of the outbox to the server, unless the
    /// writing side is shut.
    fn send(&mut self, n: usize) {
        let n = n.min(self.outbox.len());
        let open = !self.pipe.borrow().shut && !self.pipe.borrow().gone;
        if n > 0 && open {
            let bytes: Vec<u8> = self.outbox.drain(..n).collect();
            self.hand_over(&bytes);
        }
    }

    /// Hands `bytes` to the server, and splits what it now has into
    /// requests as the server's own parser does.
    fn hand_over(&mut self, bytes: &[u8]) {
        self.pipe
            .borrow_mut()
            .to_server
            .extend(bytes.iter().copied());
        self.sent.extend_from_slice(bytes);
        self.event = true;
        while !matches!(self.requests.last(), Some(Err(()))) {
            match http::parse(&self.sent[self.parsed..]) {
                Ok(Parsed::Request(r, used)) => {
                    self.parsed += used;
                    self.requests.push(Ok(r));
                }
                Ok(Parsed::Incomplete { .. }) => break,
                Err(_) => self.requests.push(Err(())),
            }
        }
    }
}

/// One answer at the front of `buf`: status, body, bytes taken; `100
/// Continue` is an answer of its own here (status 100).
fn answer_at(buf: &[u8]) -> Option<(u16, String, usize)> {
    let head_end = buf.windows(4).position(|w| w == b"\r\n\r\n")? + 4;
    let head = std::str::from_utf8(&buf[..head_end]).expect("answers are ASCII");
    let status: u16 = head.get(9..12)?.parse().expect("a status");
    let len = head
        .lines()
        .find_map(|l| l.strip_prefix("Content-Length: "))
        .map_or(0, |v| v.parse::<usize>().expect("a length"));
    let body = buf.get(head_end..head_end + len)?;
    let body = String::from_utf8(body.to_vec()).expect("bodies are UTF-8");
    Some((status, body, head_end + len))
}

struct World {
    conns: Connections<Stream, Port>,
    vmm: Rc<RefCell<FakeVmm>>,
    clients: Vec<Client>,
    now: Duration,
    next_tag: u64,
    /// Tags whose client was told they were not applied.
    refused: BTreeSet<u64>,
    /// Tags whose client got the VMM's answer.
    answered: BTreeMap<u64, usize>,
}

impl World {
    fn new() -> World {
        let vmm = Rc::new(RefCell::new(FakeVmm::default()));
        World {
            conns: Connections::new(Port(vmm.clone())),
            vmm,
            clients: Vec::new(),
            now: Duration::ZERO,
            next_tag: 0,
            refused: BTreeSet::new(),
            answered: BTreeMap::new(),
        }
    }

    fn client(&mut self, i: u8) -> Option<&mut Client> {
        let n = self.clients.len();
        (n > 0).then(|| &mut self.clients[usize::from(i) % n])
    }

    fn render(&mut self, piece: &Piece) -> Vec<u8> {
        let mut tagged = |path: &str, extra: &str, body_extra: &str, pad: u16| {
            self.next_tag += 1;
            let mut body = format!(r#"{{"n":{}{body_extra}}}"#, self.next_tag);
            body.extend(std::iter::repeat_n(' ', usize::from(pad)));
            format!(
                "PATCH {path} HTTP/1.1\r\n{extra}Content-Length: {}\r\n\r\n{body}",
                body.len()
            )
        };
        let text = match piece {
            Piece::Tagged { expect, close, pad } => {
                let mut extra = String::new();
                if *expect {
                    extra.push_str("Expect: 100-continue\r\n");
                }
                if *close {
                    extra.push_str("Connection: close\r\n");
                }
                tagged("/machine-config", &extra, "", *pad)
            }
            Piece::Drive => tagged(
                "/drives/d",
                "",
                r#","drive_id":"d","path_on_host":"/img""#,
                0,
            ),
            Piece::Get => "GET / HTTP/1.1\r\n\r\n".into(),
            Piece::BadPath => "GET /vsock HTTP/1.1\r\n\r\n".into(),
            Piece::BadHttp => "GET / HTTP/9\r\n\r\n".into(),
            Piece::Raw(b) => return b.iter().take(256).copied().collect(),
        };
        text.into_bytes()
    }

    fn step(&mut self, op: &Op) {
        let now = self.now;
        match op {
            Op::Connect => {
                let pipe = Rc::new(RefCell::new(Pipe::default()));
                let token = self.conns.accept(Stream(pipe.clone()), now);
                assert_eq!(token.is_none(), pipe.borrow().closed, "refused but open");
                self.clients.push(Client {
                    pipe,
                    token,
                    outbox: Vec::new(),
                    sent: Vec::new(),
                    requests: Vec::new(),
                    parsed: 0,
                    inbox: Vec::new(),
                    answers: 0,
                    // A new connection is writable: an event comes.
                    event: true,
                });
            }
            Op::Write(i, piece) => {
                let bytes = self.render(piece);
                if let Some(c) = self.client(*i) {
                    c.outbox.extend_from_slice(&bytes);
                }
            }
            Op::Request(i, piece) => {
                let bytes = self.render(piece);
                if let Some(c) = self.client(*i) {
                    c.outbox.extend_from_slice(&bytes);
                    c.send(usize::MAX);
                }
            }
            Op::Send(i, n) => {
                if let Some(c) = self.client(*i) {
                    c.send(usize::from(*n));
                }
            }
            Op::Read(i, n) => {
                if let Some(c) = self.client(*i) {
                    let mut p = c.pipe.borrow_mut();
                    let n = usize::from(*n).min(p.to_client.len());
                    if !p.gone {
                        c.inbox.extend(p.to_client.drain(..n));
                        p.room = p.room.saturating_add(n);
                        c.event |= n > 0;
                    }
                }
            }
            Op::Open(i, n) => {
                if let Some(c) = self.client(*i) {
                    let mut p = c.pipe.borrow_mut();
                    p.room = p.room.saturating_add(usize::from(*n));
                    c.event = true;
                }
            }
            Op::Shut(i) => {
                if let Some(c) = self.client(*i) {
                    c.pipe.borrow_mut().shut = true;
                    c.event = true;
                }
            }
            Op::Close(i) => {
                if let Some(c) = self.client(*i) {
                    c.pipe.borrow_mut().gone = true;
                    c.event = true;
                }
            }
            Op::Event(i) => {
                let token = self
                    .client(*i)
                    .and_then(|c| std::mem::take(&mut c.event).then_some(c.token).flatten());
                if let Some(t) = token {
                    self.conns.ready(t, now);
                }
            }
            Op::Events => self.events(),
            Op::Vmm(s) => self.vmm.borrow_mut().step(*s),
            Op::Answers => self.conns.answers(now),
            Op::Advance(span) => {
                self.now += match span {
                    Span::Ms(ms) => Duration::from_millis(u64::from(*ms)),
                    Span::Secs(s) => Duration::from_secs(u64::from(*s)),
                };
                self.conns.tick(self.now);
                for (_, _, deadline) in self.conns.phases() {
                    assert!(deadline > self.now, "a deadline left behind by a tick");
                }
            }
        }
        self.read_answers();
    }

    fn events(&mut self) {
        let tokens: Vec<u64> = self
            .clients
            .iter_mut()
            .filter_map(|c| std::mem::take(&mut c.event).then_some(c.token).flatten())
            .collect();
        for t in tokens {
            self.conns.ready(t, self.now);
        }
    }

    /// Matches what each client read against its requests.
    fn read_answers(&mut self) {
        for c in &mut self.clients {
            while let Some((status, body, used)) = answer_at(&c.inbox) {
                c.inbox.drain(..used);
                if status == 100 {
                    continue;
                }
                let Some(req) = c.requests.get(c.answers) else {
                    panic!(
                        "answer {} to a request never sent: {status} {body}",
                        c.answers
                    );
                };
                c.answers += 1;
                judge(req, status, &body, &mut self.refused, &mut self.answered);
            }
        }
    }

    fn check(&mut self) {
        let vmm = self.vmm.borrow();
        let applied: BTreeSet<u64> = vmm.applied.iter().copied().collect();
        assert_eq!(applied.len(), vmm.applied.len(), "a request applied twice");
        if let Some(n) = self.refused.intersection(&applied).next() {
            panic!("tag {n} was applied after its client was told it was not");
        }
        for n in self.answered.keys() {
            assert!(
                applied.contains(n),
                "tag {n} answered as applied but never applied"
            );
        }
        assert!(self.conns.len() <= MAX_CONNECTIONS);
        assert!(
            vmm.queue.len() + vmm.held.len() <= MAX_IN_FLIGHT,
            "{} commands with the VMM",
            vmm.queue.len() + vmm.held.len()
        );
        assert!(self.conns.in_flight() <= MAX_IN_FLIGHT);
        // A request of the largest size, its buffer doubled, and an answer.
        let bound = MAX_CONNECTIONS * (2 * MAX_BUFFERED + 4096);
        assert!(
            self.conns.buffered() <= bound,
            "{} bytes buffered",
            self.conns.buffered()
        );
        assert!(self.conns.log_lines() <= 1 + self.now.as_secs());
        for c in &self.clients {
            let closed = c.pipe.borrow().closed;
            let open = c
                .token
                .is_some_and(|t| self.conns.phases().iter().any(|p| p.0 == t));
            assert_eq!(
                closed, !open,
                "a connection the server dropped is open, or the reverse"
            );
        }
    }

    /// Everything answered, read and delivered; then the liveness oracle.
    fn drain(&mut self) {
        for _ in 0..10_000 {
            self.vmm.borrow_mut().step(VmmStep::Answer(u8::MAX));
            while self.vmm.borrow().held.front().is_some() {
                self.vmm.borrow_mut().step(VmmStep::Release);
            }
            self.conns.answers(self.now);
            for c in &mut self.clients {
                let opened = {
                    let mut p = c.pipe.borrow_mut();
                    c.inbox.append(&mut p.to_client);
                    // The window opening is an edge, as a read is.
                    let opened = p.room < usize::MAX / 2;
                    p.room = usize::MAX;
                    opened
                };
                c.event |= opened;
                c.send(usize::MAX);
            }
            self.read_answers();
            self.check();
            let idle = self.vmm.borrow().queue.is_empty() && self.clients.iter().all(|c| !c.event);
            if idle {
                break;
            }
            self.events();
        }
        let phases = self.conns.phases();
        for c in &self.clients {
            let Some(t) = c.token else { continue };
            let Some(p) = phases.iter().find(|p| p.0 == t) else {
                continue;
            };
            match p.1 {
                PhaseKind::Reading => {
                    let whole = c.requests.len();
                    assert_eq!(c.answers, whole, "connection {t}: requests left unanswered");
                }
                // Its last answer is the one to the first request that
                // closes the connection, or to bytes the parser refused.
                PhaseKind::Lingering => {
                    let last = c
                        .requests
                        .iter()
                        .position(|r| r.as_ref().is_ok_and(|r| r.close) || r.is_err());
                    assert_eq!(
                        Some(c.answers),
                        last.map(|i| i + 1),
                        "connection {t} lingers early"
                    );
                    assert!(c.pipe.borrow().server_shut, "connection {t} lingers unshut");
                }
                k => panic!("connection {t} stuck in {k:?}"),
            }
        }
        self.now += Duration::from_secs(86_400);
        self.conns.tick(self.now);
        assert!(self.conns.is_empty(), "connections open a day later");
        assert_eq!(self.conns.buffered(), 0);
        self.check();
    }
}

/// Checks one answer against the request it answers.
fn judge(
    req: &Result<http::Request, ()>,
    status: u16,
    body: &str,
    refused: &mut BTreeSet<u64>,
    answered: &mut BTreeMap<u64, usize>,
) {
    let Ok(req) = req else {
        assert_eq!(status, 400, "bad HTTP answered {status} {body}");
        return;
    };
    let routed = route(req);
    let tag = match &routed {
        Ok(ApiRequest::PatchMachineConfig(v) | ApiRequest::PatchDrive(_, v)) => tag_of(v),
        _ => None,
    };
    if routed.is_err() {
        assert_eq!(status, 400, "a refused route answered {status} {body}");
    }
    let Some(n) = tag else {
        return;
    };
    match status {
        200 => {
            let v: Value = serde_json::from_str(body).expect("the VMM's JSON");
            assert_eq!(
                tag_of(&v),
                Some(n),
                "the answer to tag {n} is another's: {body}"
            );
            *answered.entry(n).or_default() += 1;
            assert_eq!(answered[&n], 1, "tag {n} answered twice");
        }
        400 if body.contains("the request was not applied") => {
            assert!(refused.insert(n), "tag {n} refused twice");
        }
        // A VMM that dropped the command: not applied, by this VMM.
        400 => assert!(body.contains("without answering"), "tag {n}: {body}"),
        s => panic!("tag {n} answered {s} {body}"),
    }
}
