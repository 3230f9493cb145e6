// SPDX-License-Identifier: Apache-2.0
//! The API socket's connections as a state machine: bytes in, requests to
//! the VMM, answers out, each step bounded in time and in memory.
//!
//! [`Connections`] owns every open connection and never blocks: it reads
//! and writes only what a non-blocking stream takes, and learns the VMM's
//! answers by polling their [`Ticket`]s. Time is whatever `now` its caller
//! passes (a [`Duration`] since any fixed start), and a stream is anything
//! that reads and writes, so the production loop (`server`, over a Unix
//! socket, epoll and the monotonic clock) and the fuzz target (over
//! in-memory streams and a clock it moves) drive the same code; the
//! production one is monomorphised over `UnixStream`, nothing dynamic.
//!
//! A connection is in one of three phases, each with a deadline fixed when
//! the phase begins (progress never moves it):
//!
//! - **reading** a request, for at most [`IDLE_TIMEOUT`] from the accept or
//!   from the end of the previous answer, whatever it trickles; then it is
//!   closed. A request is at most the parser's bounds, and a connection
//!   reads nothing more while its request is with the VMM or its answer
//!   is going out, so it buffers at most [`MAX_BUFFERED`] bytes (with a
//!   larger payload limit, [`max_buffered`] of it);
//! - **waiting** for the VMM, for at most [`VMM_TIMEOUT`] from the request:
//!   then, if the VMM has not claimed the request, the request is abandoned
//!   (never applied) and answered so; a request the VMM claimed is answered
//!   with what the VMM did, whenever it answers (see `command`);
//! - **answering**: the answer goes out as the socket takes it, and must be
//!   out within [`ANSWER_TIMEOUT`] of being ready; a client that does not
//!   read it loses the connection. One answer is pending at most, and no
//!   further request is read before it is out;
//! - **lingering**, after the last answer of a connection that closes (a
//!   refused request, `Connection: close`) while its client may still be
//!   sending: the writing side is shut (the client reads the answer, then
//!   the end), and what the client still sends is read and dropped, at
//!   most [`LINGER_BYTES`] beyond the body limit and for at most
//!   [`LINGER_TIMEOUT`], until the client closes. Closing at once would
//!   fail the client's write of the rest of its body (`EPIPE`), and most
//!   clients then report that instead of the answer they were sent.
//!
//! At most [`MAX_CONNECTIONS`] are open. A new one takes the place of the
//! idle connection that has waited longest (reading, and preferably not
//! started on a request) and is refused only when every open connection
//! has a request in progress, so idle connections cannot lock clients out.
//! At most [`MAX_IN_FLIGHT`] requests are with the VMM or in its queue, the
//! abandoned ones included: beyond that a request is answered at once
//! that the VMM is behind. What happens to connections (refused, closed
//! for a newer one, closed with half a request, answers not read) is
//! counted and logged in one line at most once per [`LOG_INTERVAL`].

use std::collections::BTreeMap;
use std::io::{ErrorKind, Read, Write};
use std::path::Path;
use std::time::Duration;

use super::command::{Answer, OpenedImage, Ticket};
use super::http::{self, Parsed, Response};
use super::routes::{route, ApiRequest};

/// Most open connections.
pub const MAX_CONNECTIONS: usize = 16;
/// How long a connection has for a whole request, from its accept or the
/// end of its previous answer.
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(5);
/// How long the VMM has to claim a request.
pub const VMM_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a client has to read an answer, from when it is ready.
pub const ANSWER_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a closing connection reads and drops what its client still
/// sends.
pub const LINGER_TIMEOUT: Duration = Duration::from_secs(2);
/// Most bytes a closing connection reads and drops, beyond the body limit.
pub const LINGER_BYTES: usize = 1 << 20;
/// Most requests with the VMM or in its queue.
pub const MAX_IN_FLIGHT: usize = 2 * MAX_CONNECTIONS;
/// Bytes read per `read` call.
const READ_CHUNK: usize = 4096;
/// Most bytes a connection reads ahead: a request at the parser's bounds
/// (a longer one is refused), and the start of the next.
pub const MAX_BUFFERED: usize = max_buffered(http::MAX_BODY_BYTES);

/// Most bytes a connection reads ahead when bodies may hold `body_limit`.
pub const fn max_buffered(body_limit: usize) -> usize {
    http::MAX_HEAD_BYTES + body_limit + READ_CHUNK
}
/// At most one log line about connections per this span.
pub const LOG_INTERVAL: Duration = Duration::from_secs(1);

/// What the connections need from the VMM.
pub trait Vmm {
    /// Hands the VMM one request (with the image it asked for, on a second
    /// trip); `None` when the VMM is gone.
    fn send(&mut self, request: ApiRequest, image: Option<OpenedImage>) -> Option<Ticket>;
    /// Opens a disk image the VMM asked for ([`Answer::Open`]).
    fn open_image(&mut self, path: &Path, read_only: bool) -> OpenedImage;
}

/// A stream whose writing side can be shut, so that its client reads the
/// end of the answers while it may still send.
pub trait HalfClose {
    /// Shuts the writing side; a failure is the end of the connection,
    /// which the next read reports.
    fn shut_write(&mut self);
}

impl HalfClose for std::os::unix::net::UnixStream {
    fn shut_write(&mut self) {
        let _ = self.shutdown(std::net::Shutdown::Write);
    }
}

/// Which phase a connection is in (see the module doc).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PhaseKind {
    /// Reading a request.
    Reading,
    /// Its request is with the VMM.
    Waiting,
    /// Its answer is going out.
    Answering,
    /// Its last answer is out and it drops what its client still sends.
    Lingering,
}

enum Phase {
    Reading {
        since: Duration,
        continue_sent: bool,
    },
    Waiting {
        ticket: Ticket,
        /// The request again, for a second trip with an image: kept for
        /// `PATCH /drives` only, the one request that may take two.
        again: Option<ApiRequest>,
        close: bool,
        deadline: Duration,
    },
    Answering {
        close: bool,
        deadline: Duration,
    },
    Lingering {
        deadline: Duration,
        /// Bytes it may still drop.
        left: usize,
    },
}

struct Conn<S> {
    stream: S,
    inbuf: Vec<u8>,
    out: Vec<u8>,
    phase: Phase,
    eof: bool,
}

impl<S> Conn<S> {
    fn deadline(&self) -> Duration {
        match self.phase {
            Phase::Reading { since, .. } => since + IDLE_TIMEOUT,
            Phase::Waiting { deadline, .. }
            | Phase::Answering { deadline, .. }
            | Phase::Lingering { deadline, .. } => deadline,
        }
    }
}

/// What happened to connections since the last log line.
#[derive(Debug, Default)]
struct Tally {
    refused: u64,
    evicted: u64,
    half_requests: u64,
    unread: u64,
    last: Option<Duration>,
    lines: u64,
}

impl Tally {
    fn pending(&self) -> bool {
        self.refused + self.evicted + self.half_requests + self.unread > 0
    }

    /// When the next line may be written, if one is waiting.
    fn due(&self) -> Option<Duration> {
        self.pending()
            .then(|| self.last.map_or(Duration::ZERO, |l| l + LOG_INTERVAL))
    }

    /// Writes the line if one is waiting and the last is old enough.
    fn flush(&mut self, now: Duration) {
        if let Some(line) = self.take_line(now) {
            log::warn!("{line}");
        }
    }

    /// The line to write now, if one is waiting and the last is old
    /// enough; the counts start again from it.
    fn take_line(&mut self, now: Duration) -> Option<String> {
        if self.due().is_none_or(|d| d > now) {
            return None;
        }
        let counts = [
            (
                self.refused,
                format!("connection(s) refused ({MAX_CONNECTIONS} open, none idle)"),
            ),
            (
                self.evicted,
                "idle connection(s) closed for newer ones".to_string(),
            ),
            (
                self.half_requests,
                format!(
                    "connection(s) ended with half a request (closed by the client, or \
                     not whole after {} s)",
                    IDLE_TIMEOUT.as_secs()
                ),
            ),
            (
                self.unread,
                format!(
                    "connection(s) closed with an answer unread for {} s",
                    ANSWER_TIMEOUT.as_secs()
                ),
            ),
        ];
        let parts: Vec<String> = counts
            .into_iter()
            .filter(|(n, _)| *n > 0)
            .map(|(n, what)| format!("{n} {what}"))
            .collect();
        *self = Tally {
            last: Some(now),
            lines: self.lines + 1,
            ..Tally::default()
        };
        Some(format!("API socket: {}", parts.join(", ")))
    }
}

/// Why a connection is closed, for the tally.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Why {
    /// The client closed, finished, or failed: nothing to report.
    Done,
    Evicted,
    HalfRequest,
    Unread,
}

/// Every open connection of the API socket; see the module doc.
pub struct Connections<S, V> {
    conns: BTreeMap<u64, Conn<S>>,
    vmm: V,
    next_token: u64,
    /// Requests given up on that the VMM still holds in its queue.
    abandoned: Vec<Ticket>,
    tally: Tally,
    /// Most bytes of a request body (`--http-api-max-payload-size`).
    body_limit: usize,
}

impl<S, V> std::fmt::Debug for Connections<S, V> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Connections")
            .field("open", &self.conns.len())
            .field("abandoned", &self.abandoned.len())
            .finish_non_exhaustive()
    }
}

impl<S: Read + Write + HalfClose, V: Vmm> Connections<S, V> {
    /// No connection yet; requests go to `vmm`.
    pub fn new(vmm: V) -> Self {
        Connections {
            conns: BTreeMap::new(),
            vmm,
            next_token: 0,
            abandoned: Vec::new(),
            tally: Tally::default(),
            body_limit: http::MAX_BODY_BYTES,
        }
    }

    /// Takes bodies of up to `limit` bytes instead of Firecracker's default.
    pub fn with_body_limit(mut self, limit: usize) -> Self {
        self.body_limit = limit;
        self
    }

    /// The VMM side, as given.
    pub fn vmm(&mut self) -> &mut V {
        &mut self.vmm
    }

    /// Takes a new connection (non-blocking): its token, or `None` when it
    /// was refused (and closed) because every open one is busy.
    pub fn accept(&mut self, stream: S, now: Duration) -> Option<u64> {
        if !self.make_room(now) {
            self.tally.refused += 1;
            self.tally.flush(now);
            return None;
        }
        let token = self.next_token;
        self.next_token += 1;
        self.conns.insert(
            token,
            Conn {
                stream,
                inbuf: Vec::new(),
                out: Vec::new(),
                phase: Phase::Reading {
                    since: now,
                    continue_sent: false,
                },
                eof: false,
            },
        );
        Some(token)
    }

    /// Whether a new connection fits, after closing the idle one that
    /// waited longest (preferring those with no byte of a request yet) if
    /// all are taken.
    fn make_room(&mut self, now: Duration) -> bool {
        if self.conns.len() < MAX_CONNECTIONS {
            return true;
        }
        // What has arrived counts: a connection whose request (or end) is
        // in its socket, not read yet, is not idle, and one that ended
        // makes room itself.
        let reading: Vec<u64> = self
            .conns
            .iter()
            .filter(|(_, c)| matches!(c.phase, Phase::Reading { .. } | Phase::Lingering { .. }))
            .map(|(t, _)| *t)
            .collect();
        for t in reading {
            self.progress(t, now);
        }
        if self.conns.len() < MAX_CONNECTIONS {
            return true;
        }
        // A lingering connection has had its answers: it goes first, and
        // its close is not news (rank 0).
        let idle = self
            .conns
            .iter()
            .filter_map(|(t, c)| match c.phase {
                Phase::Lingering { deadline, .. } => Some(((0, deadline), *t)),
                Phase::Reading { since, .. } => {
                    Some(((1 + u8::from(!c.inbuf.is_empty()), since), *t))
                }
                _ => None,
            })
            .min();
        let Some(((rank, _), t)) = idle else {
            return false;
        };
        let why = if rank == 0 { Why::Done } else { Why::Evicted };
        self.close(t, why, now);
        true
    }

    /// Closes `token` without a word (the caller could not poll it).
    pub fn drop_connection(&mut self, token: u64) {
        self.close(token, Why::Done, Duration::ZERO);
    }

    /// The connection `token` may be readable or writable: goes as far as
    /// it can without blocking.
    pub fn ready(&mut self, token: u64, now: Duration) {
        self.progress(token, now);
    }

    /// Collects the VMM's answers that came in and goes on with their
    /// connections.
    pub fn answers(&mut self, now: Duration) {
        let waiting: Vec<u64> = self
            .conns
            .iter()
            .filter(|(_, c)| matches!(c.phase, Phase::Waiting { .. }))
            .map(|(t, _)| *t)
            .collect();
        for t in waiting {
            self.progress(t, now);
        }
    }

    /// Applies every deadline that passed by `now`, and writes the log
    /// line if one is due.
    pub fn tick(&mut self, now: Duration) {
        let late: Vec<u64> = self
            .conns
            .iter()
            .filter(|(_, c)| c.deadline() <= now)
            .map(|(t, _)| *t)
            .collect();
        for t in late {
            self.expire(t, now);
        }
        self.abandoned.retain(Ticket::held_by_vmm);
        self.tally.flush(now);
    }

    /// The earliest deadline or log line due, for the caller's wait.
    pub fn next_deadline(&self) -> Option<Duration> {
        self.conns
            .values()
            .map(Conn::deadline)
            .chain(self.tally.due())
            .min()
    }

    /// Open connections.
    pub fn len(&self) -> usize {
        self.conns.len()
    }

    /// Whether no connection is open.
    pub fn is_empty(&self) -> bool {
        self.conns.is_empty()
    }

    /// Bytes buffered for all connections, in and out.
    pub fn buffered(&self) -> usize {
        self.conns
            .values()
            .map(|c| c.inbuf.capacity() + c.out.capacity())
            .sum()
    }

    /// Requests with the VMM or in its queue.
    pub fn in_flight(&self) -> usize {
        let waiting = self
            .conns
            .values()
            .filter(|c| matches!(&c.phase, Phase::Waiting { ticket, .. } if ticket.held_by_vmm()))
            .count();
        let abandoned = self.abandoned.iter().filter(|t| t.held_by_vmm()).count();
        waiting + abandoned
    }

    /// Each connection's token, phase and deadline.
    pub fn phases(&self) -> Vec<(u64, PhaseKind, Duration)> {
        self.conns
            .iter()
            .map(|(t, c)| {
                let kind = match c.phase {
                    Phase::Reading { .. } => PhaseKind::Reading,
                    Phase::Waiting { .. } => PhaseKind::Waiting,
                    Phase::Answering { .. } => PhaseKind::Answering,
                    Phase::Lingering { .. } => PhaseKind::Lingering,
                };
                (*t, kind, c.deadline())
            })
            .collect()
    }

    /// Log lines written so far.
    pub fn log_lines(&self) -> u64 {
        self.tally.lines
    }
}

/// A fault answer for a request that was not applied.
fn not_applied(why: &str) -> Response {
    Response::fault(&format!("{why}; the request was not applied"))
}

impl<S: Read + Write + HalfClose, V: Vmm> Connections<S, V> {
    /// Closes `token` (dropping its stream closes it), for `why`. A request
    /// still waiting for the VMM is abandoned: applied only if the VMM
    /// claimed it already.
    fn close(&mut self, token: u64, why: Why, now: Duration) {
        let Some(c) = self.conns.remove(&token) else {
            return;
        };
        if let Phase::Waiting { ticket, .. } = c.phase {
            ticket.abandon();
            if ticket.held_by_vmm() {
                self.abandoned.push(ticket);
            }
        }
        match why {
            Why::Done => return,
            Why::Evicted => self.tally.evicted += 1,
            Why::HalfRequest => self.tally.half_requests += 1,
            Why::Unread => self.tally.unread += 1,
        }
        self.tally.flush(now);
    }

    /// The deadline of `token`'s phase passed.
    fn expire(&mut self, token: u64, now: Duration) {
        let Some(c) = self.conns.get_mut(&token) else {
            return;
        };
        match &mut c.phase {
            // An idle keep-alive connection is closed quietly; one that
            // sent half a request is counted.
            Phase::Reading { .. } if c.inbuf.is_empty() => self.close(token, Why::Done, now),
            Phase::Reading { .. } => self.close(token, Why::HalfRequest, now),
            Phase::Answering { .. } => self.close(token, Why::Unread, now),
            // Its client had the answers, and the time to take them.
            Phase::Lingering { .. } => self.close(token, Why::Done, now),
            Phase::Waiting {
                ticket,
                close,
                deadline,
                ..
            } => {
                if ticket.abandon() {
                    let close = *close;
                    let r = not_applied("the VMM did not take the request in time");
                    self.answer(token, r, close, now);
                } else {
                    // The VMM is applying it: its answer comes, however late.
                    *deadline = Duration::MAX;
                }
                self.progress(token, now);
            }
        }
    }

    /// Puts `r` on `token`'s way out: the phase is answering from `now`. A
    /// request still with the VMM was abandoned first.
    fn answer(&mut self, token: u64, r: Response, close: bool, now: Duration) {
        let Some(c) = self.conns.get_mut(&token) else {
            return;
        };
        c.out.extend_from_slice(&r.to_bytes(close));
        let before = std::mem::replace(
            &mut c.phase,
            Phase::Answering {
                close,
                deadline: now + ANSWER_TIMEOUT,
            },
        );
        if let Phase::Waiting { ticket, .. } = before {
            if ticket.held_by_vmm() {
                self.abandoned.push(ticket);
            }
        }
    }

    /// Goes as far as `token` can without blocking.
    fn progress(&mut self, token: u64, now: Duration) {
        loop {
            let Some(c) = self.conns.get_mut(&token) else {
                return;
            };
            if !c.out.is_empty() && !write_out(&mut c.stream, &mut c.out) {
                self.close(token, Why::Done, now);
                return;
            }
            let go_on = match c.phase {
                Phase::Reading { .. } => self.read_step(token, now),
                Phase::Waiting { .. } => self.wait_step(token, now),
                Phase::Answering { close, .. } => {
                    if !c.out.is_empty() {
                        return;
                    }
                    if close {
                        if c.eof {
                            self.close(token, Why::Done, now);
                            return;
                        }
                        c.stream.shut_write();
                        // What was read ahead is dropped with the rest.
                        c.inbuf = Vec::new();
                        c.phase = Phase::Lingering {
                            deadline: now + LINGER_TIMEOUT,
                            left: self.body_limit + LINGER_BYTES,
                        };
                        continue;
                    }
                    c.phase = Phase::Reading {
                        since: now,
                        continue_sent: false,
                    };
                    true
                }
                Phase::Lingering { .. } => self.linger_step(token, now),
            };
            if !go_on {
                return;
            }
        }
    }

    /// One step of reading a request: false when there is nothing to do
    /// until more bytes come (or the connection is gone).
    fn read_step(&mut self, token: u64, now: Duration) -> bool {
        let Some(c) = self.conns.get_mut(&token) else {
            return false;
        };
        let Phase::Reading { continue_sent, .. } = &mut c.phase else {
            return false;
        };
        match http::parse_limited(&c.inbuf, self.body_limit) {
            Ok(Parsed::Request(req, used)) => {
                c.inbuf.drain(..used);
                if c.inbuf.is_empty() {
                    // A request's buffer is not kept while the connection idles.
                    c.inbuf = Vec::new();
                }
                match route(&req) {
                    Ok(request) => self.send_to_vmm(token, request, None, req.close, now),
                    Err(msg) => self.answer(token, Response::fault(&msg), req.close, now),
                }
                true
            }
            Ok(Parsed::Incomplete { continue_expected }) => {
                if continue_expected && !*continue_sent {
                    *continue_sent = true;
                    c.out.extend_from_slice(http::CONTINUE);
                    return true;
                }
                if c.eof {
                    let why = if c.inbuf.is_empty() {
                        Why::Done
                    } else {
                        Why::HalfRequest
                    };
                    self.close(token, why, now);
                    return false;
                }
                match read_in(&mut c.stream, &mut c.inbuf) {
                    Some(more) => {
                        c.eof = !more;
                        true
                    }
                    None => false,
                }
            }
            Err(e) => {
                // The stream cannot be resynchronised after a bad request:
                // answer and close.
                self.answer(token, Response::fault(&e.to_string()), true, now);
                true
            }
        }
    }

    /// Reads and drops what `token`'s client still sends, as far as it can
    /// without blocking; closes the connection at its end or at the bound.
    /// Always false: nothing follows but the close.
    fn linger_step(&mut self, token: u64, now: Duration) -> bool {
        let Some(c) = self.conns.get_mut(&token) else {
            return false;
        };
        let Phase::Lingering { left, .. } = &mut c.phase else {
            return false;
        };
        let mut chunk = [0u8; READ_CHUNK];
        loop {
            match c.stream.read(&mut chunk) {
                Ok(n) if n > 0 && n < *left => *left -= n,
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) if e.kind() == ErrorKind::WouldBlock => return false,
                // The end, an error, or the bound.
                _ => {
                    self.close(token, Why::Done, now);
                    return false;
                }
            }
        }
    }

    /// Hands `request` to the VMM for `token`, or answers at once why not.
    fn send_to_vmm(
        &mut self,
        token: u64,
        request: ApiRequest,
        image: Option<OpenedImage>,
        close: bool,
        now: Duration,
    ) {
        let in_flight = self.in_flight();
        if in_flight >= MAX_IN_FLIGHT {
            let why = format!("the VMM has {in_flight} requests it has not answered yet");
            return self.answer(token, not_applied(&why), close, now);
        }
        let again = matches!(request, ApiRequest::PatchDrive(..) if image.is_none())
            .then(|| request.clone());
        let Some(ticket) = self.vmm.send(request, image) else {
            return self.answer(token, not_applied("the VMM is shutting down"), close, now);
        };
        if let Some(c) = self.conns.get_mut(&token) {
            c.phase = Phase::Waiting {
                ticket,
                again,
                close,
                deadline: now + VMM_TIMEOUT,
            };
        }
    }

    /// One step of waiting for the VMM: false while its answer is not in.
    fn wait_step(&mut self, token: u64, now: Duration) -> bool {
        let Some(c) = self.conns.get_mut(&token) else {
            return false;
        };
        let Phase::Waiting {
            ticket,
            again,
            close,
            ..
        } = &mut c.phase
        else {
            return false;
        };
        let Some(a) = ticket.answer() else {
            return false;
        };
        let close = *close;
        match (a, again.take()) {
            (Answer::Reply(r), _) => self.answer(token, r, close, now),
            (Answer::Open { path, read_only }, Some(request)) => {
                let image = self.vmm.open_image(&path, read_only);
                self.send_to_vmm(token, request, Some(image), close, now);
            }
            (Answer::Open { .. }, None) => {
                let r = Response::fault("the VMM asked for the disk image again");
                self.answer(token, r, close, now);
            }
        }
        true
    }
}

/// Writes what `stream` takes of `out`; false when the client is gone.
fn write_out<S: Write>(stream: &mut S, out: &mut Vec<u8>) -> bool {
    let mut off = 0;
    let ok = loop {
        if off == out.len() {
            break true;
        }
        match stream.write(&out[off..]) {
            Ok(0) => break false,
            Ok(n) => off += n,
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) if e.kind() == ErrorKind::WouldBlock => break true,
            Err(_) => break false,
        }
    };
    out.drain(..off);
    if out.is_empty() {
        // An answer's buffer is not kept for the next one.
        *out = Vec::new();
    }
    ok
}

/// Reads what has arrived: `Some(true)` when bytes came, `Some(false)` at
/// the end of the stream (or an error, which ends it as well), `None` when
/// nothing is there yet. Called only while the buffer holds less than a
/// whole request at the parser's bounds, so it stays within
/// [`MAX_BUFFERED`].
fn read_in<S: Read>(stream: &mut S, buf: &mut Vec<u8>) -> Option<bool> {
    let mut chunk = [0u8; READ_CHUNK];
    loop {
        match stream.read(&mut chunk) {
            Ok(0) => return Some(false),
            Ok(n) => {
                buf.extend_from_slice(&chunk[..n]);
                return Some(true);
            }
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) if e.kind() == ErrorKind::WouldBlock => return None,
            Err(_) => return Some(false),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::cell::RefCell;
    use std::collections::VecDeque;
    use std::rc::Rc;

    use super::*;
    use crate::api::command::ApiCommand;

    /// Both ends of an in-memory connection, as the client sees them.
    #[derive(Default)]
    struct Pipe {
        to_server: VecDeque<u8>,
        to_client: Vec<u8>,
        /// Bytes the server may write before it would block.
        room: usize,
        /// The client shut its writing side.
        shut: bool,
        /// The client closed the connection.
        gone: bool,
        /// The server closed it.
        closed: bool,
        /// The server shut its writing side.
        server_shut: bool,
        /// The next read is interrupted (EINTR).
        interrupt_read: bool,
        /// Reads fail (the connection was reset).
        reset: bool,
        /// The next write is interrupted.
        interrupt_write: bool,
        /// Writes take nothing and say so (`Ok(0)`).
        zero: bool,
    }

    type Client = Rc<RefCell<Pipe>>;

    struct Stream(Client);

    impl Read for Stream {
        fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
            let mut p = self.0.borrow_mut();
            if std::mem::take(&mut p.interrupt_read) {
                return Err(ErrorKind::Interrupted.into());
            }
            if p.reset {
                return Err(ErrorKind::ConnectionReset.into());
            }
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
            if std::mem::take(&mut p.interrupt_write) {
                return Err(ErrorKind::Interrupted.into());
            }
            if p.zero {
                return Ok(0);
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

    /// The VMM: a queue of commands the test claims and answers itself;
    /// every image "opened" is a failure naming its path.
    #[derive(Default)]
    struct Queue {
        commands: VecDeque<ApiCommand>,
        gone: bool,
    }

    impl Vmm for Queue {
        fn send(&mut self, request: ApiRequest, image: Option<OpenedImage>) -> Option<Ticket> {
            if self.gone {
                return None;
            }
            let (cmd, ticket) = ApiCommand::new(request, image, None);
            self.commands.push_back(cmd);
            Some(ticket)
        }

        fn open_image(&mut self, path: &Path, _read_only: bool) -> OpenedImage {
            OpenedImage::Failed(format!("opened {}", path.display()))
        }
    }

    type Conns = Connections<Stream, Queue>;

    const S: Duration = Duration::from_secs(1);
    const MS: Duration = Duration::from_millis(1);

    fn connect(c: &mut Conns, now: Duration) -> (Client, Option<u64>) {
        let client = Rc::new(RefCell::new(Pipe {
            room: usize::MAX,
            ..Pipe::default()
        }));
        let token = c.accept(Stream(client.clone()), now);
        (client, token)
    }

    fn send(c: &mut Conns, client: &Client, token: u64, bytes: &[u8], now: Duration) {
        client.borrow_mut().to_server.extend(bytes.iter().copied());
        c.ready(token, now);
    }

    /// What the client got, taken.
    fn got(client: &Client) -> String {
        String::from_utf8(std::mem::take(&mut client.borrow_mut().to_client)).unwrap()
    }

    /// The VMM claims and answers every queued command with `status`.
    fn vmm_answers(c: &mut Conns, status: u16, now: Duration) -> Vec<ApiRequest> {
        let mut applied = Vec::new();
        while let Some(cmd) = c.vmm().commands.pop_front() {
            if let Some(claimed) = cmd.claim() {
                applied.push(claimed.request);
                let r = Response { status, body: None };
                claimed.reply.send(r);
            }
        }
        c.answers(now);
        applied
    }

    const GET: &[u8] = b"GET / HTTP/1.1\r\n\r\n";

    #[test]
    fn pipelined_requests_are_answered_in_order_one_at_a_time() {
        let mut c = Conns::new(Queue::default());
        let (client, t) = connect(&mut c, Duration::ZERO);
        let t = t.unwrap();
        send(&mut c, &client, t, &GET.repeat(3), MS);
        // One request with the VMM at a time; the rest wait in the buffer.
        assert_eq!(c.vmm().commands.len(), 1);
        assert_eq!(c.phases(), [(t, PhaseKind::Waiting, MS + VMM_TIMEOUT)]);
        for i in 0..3 {
            assert_eq!(vmm_answers(&mut c, 204, 2 * MS).len(), 1, "request {i}");
            assert_eq!(
                got(&client),
                "HTTP/1.1 204 No Content\r\nServer: minivmm\r\n\r\n"
            );
        }
        assert!(c.vmm().commands.is_empty());
        assert_eq!(c.phases(), [(t, PhaseKind::Reading, 2 * MS + IDLE_TIMEOUT)]);
        assert_eq!(c.buffered(), 0, "buffers kept while idle");
    }

    #[test]
    fn an_answer_not_read_in_time_costs_the_connection_not_a_wait() {
        let mut c = Conns::new(Queue::default());
        let (client, t) = connect(&mut c, Duration::ZERO);
        let t = t.unwrap();
        client.borrow_mut().room = 10;
        send(&mut c, &client, t, &GET.repeat(2), Duration::ZERO);
        vmm_answers(&mut c, 204, S);
        // The socket took 10 bytes; the rest waits, and so does the second
        // request, unread.
        assert_eq!(got(&client), "HTTP/1.1 2");
        assert_eq!(c.phases(), [(t, PhaseKind::Answering, S + ANSWER_TIMEOUT)]);
        assert!(c.vmm().commands.is_empty(), "the next request was read");
        // More room: the answer goes on where it stopped.
        client.borrow_mut().room = 5;
        c.ready(t, 2 * S);
        assert_eq!(got(&client), "04 No");
        c.tick(S + ANSWER_TIMEOUT - MS);
        assert_eq!(c.len(), 1);
        c.tick(S + ANSWER_TIMEOUT);
        assert_eq!(c.len(), 0, "kept past its deadline");
        assert!(client.borrow().closed);
        assert_eq!(c.log_lines(), 1);
        // A client that is gone is closed at the first write.
        let (client, t) = connect(&mut c, 10 * S);
        let t = t.unwrap();
        send(&mut c, &client, t, GET, 10 * S);
        client.borrow_mut().gone = true;
        vmm_answers(&mut c, 204, 10 * S);
        assert!(c.is_empty());
    }

    #[test]
    fn a_request_not_taken_in_time_is_never_applied_and_one_taken_is_answered_late() {
        let mut c = Conns::new(Queue::default());
        let (client, t) = connect(&mut c, Duration::ZERO);
        let t = t.unwrap();
        send(&mut c, &client, t, GET, Duration::ZERO);
        c.tick(VMM_TIMEOUT - MS);
        assert_eq!(got(&client), "");
        c.tick(VMM_TIMEOUT);
        let answer = got(&client);
        assert!(answer.starts_with("HTTP/1.1 400"), "{answer}");
        assert!(
            answer
                .contains("the VMM did not take the request in time; the request was not applied"),
            "{answer}"
        );
        assert!(
            vmm_answers(&mut c, 204, VMM_TIMEOUT).is_empty(),
            "applied after all"
        );
        assert_eq!(got(&client), "", "answered twice");
        // Taken before its deadline: answered with what the VMM did, late.
        send(&mut c, &client, t, GET, 20 * S);
        let cmd = c.vmm().commands.pop_front().unwrap();
        let claimed = cmd.claim().unwrap();
        c.tick(20 * S + VMM_TIMEOUT);
        assert_eq!(got(&client), "");
        assert_eq!(c.phases(), [(t, PhaseKind::Waiting, Duration::MAX)]);
        assert_eq!(c.next_deadline(), Some(Duration::MAX));
        claimed.reply.send(Response::no_content());
        c.answers(40 * S);
        assert!(got(&client).starts_with("HTTP/1.1 204"));
    }

    #[test]
    fn a_connection_has_the_idle_time_for_a_request_whatever_it_trickles() {
        let mut c = Conns::new(Queue::default());
        let (silent, _) = connect(&mut c, Duration::ZERO);
        let (slow, t) = connect(&mut c, Duration::ZERO);
        let t = t.unwrap();
        for i in 0..=IDLE_TIMEOUT.as_secs() * 2 {
            send(&mut c, &slow, t, b"G", S / 2 * i as u32);
            c.tick(S / 2 * i as u32);
        }
        assert!(silent.borrow().closed && slow.borrow().closed);
        assert!(c.is_empty());
        // The silent one is not worth a line; half a request is.
        assert_eq!(c.log_lines(), 1);
        // The clock of a kept-alive connection starts again after an answer.
        let (client, t) = connect(&mut c, 100 * S);
        let t = t.unwrap();
        send(&mut c, &client, t, GET, 104 * S);
        vmm_answers(&mut c, 204, 104 * S);
        c.tick(108 * S);
        assert_eq!(c.len(), 1);
        c.tick(109 * S);
        assert!(c.is_empty());
    }

    #[test]
    fn idle_connections_give_way_busy_ones_do_not_and_refusals_are_logged_once_a_second() {
        let mut c = Conns::new(Queue::default());
        let mut clients = Vec::new();
        for i in 0..MAX_CONNECTIONS as u32 {
            let (client, t) = connect(&mut c, MS * i);
            clients.push((client, t.unwrap()));
        }
        // A connection whose client left, not noticed yet, makes room
        // itself: nobody gives way for the newcomer.
        clients[3].0.borrow_mut().gone = true;
        let (back, t3) = connect(&mut c, MS * 20);
        assert!(clients[3].0.borrow().closed && !clients[4].0.borrow().closed);
        assert_eq!((c.len(), c.log_lines()), (MAX_CONNECTIONS, 0));
        clients[3] = (back, t3.unwrap());
        // Half a request makes a connection the last to give way, and a
        // whole one, not read yet, makes it busy.
        let (first, t0) = &clients[0];
        send(&mut c, first, *t0, b"GET", S);
        clients[1].0.borrow_mut().to_server.extend(GET);
        assert_eq!(c.phases()[1].1, PhaseKind::Reading);
        let (newcomer, t) = connect(&mut c, S);
        assert!(!first.borrow().closed);
        assert_eq!(c.phases()[1].1, PhaseKind::Waiting, "its request was read");
        assert!(
            clients[2].0.borrow().closed,
            "the oldest empty one gives way"
        );
        assert_eq!(c.len(), MAX_CONNECTIONS);
        // Every connection busy: refused, whatever their age.
        send(&mut c, &newcomer, t.unwrap(), GET, S);
        for (client, t) in &clients[3..] {
            send(&mut c, client, *t, GET, S);
        }
        send(&mut c, first, *t0, b" / HTTP/1.1\r\n\r\n", S);
        assert!(c.phases().iter().all(|p| p.1 == PhaseKind::Waiting));
        // The eviction was logged at once; what follows within a second
        // waits for the next line.
        assert_eq!(c.log_lines(), 1);
        for i in 0..100 {
            assert!(connect(&mut c, S + MS * i).1.is_none(), "accepted {i}");
        }
        assert_eq!(c.log_lines(), 1);
        c.tick(S + S / 2);
        assert_eq!(c.log_lines(), 1);
        assert_eq!(c.next_deadline(), Some(2 * S));
        c.tick(2 * S);
        assert_eq!(c.log_lines(), 2, "the refusals counted a second later");
        // Then one refusal alone is logged at once.
        assert!(connect(&mut c, 4 * S).1.is_none());
        assert_eq!(c.log_lines(), 3);
        assert_eq!(c.len(), MAX_CONNECTIONS);
    }

    #[test]
    fn the_vmm_queue_is_bounded_by_requests_not_yet_taken() {
        let mut c = Conns::new(Queue::default());
        let (client, t) = connect(&mut c, Duration::ZERO);
        let t = t.unwrap();
        let mut now = Duration::ZERO;
        for _ in 0..MAX_IN_FLIGHT {
            send(&mut c, &client, t, GET, now);
            now += VMM_TIMEOUT;
            c.tick(now);
            assert!(got(&client).contains("did not take the request in time"));
        }
        assert_eq!(c.in_flight(), MAX_IN_FLIGHT);
        send(&mut c, &client, t, GET, now);
        let answer = got(&client);
        assert!(
            answer.contains(
                "the VMM has 32 requests it has not answered yet; the request was not applied"
            ),
            "{answer}"
        );
        // Once the VMM drops what it was given up on, requests go through.
        assert!(vmm_answers(&mut c, 204, now).is_empty());
        c.tick(now);
        assert_eq!(c.in_flight(), 0);
        send(&mut c, &client, t, GET, now);
        assert_eq!(c.in_flight(), 1);
        // A VMM that is gone: answered at once.
        c.vmm().gone = true;
        vmm_answers(&mut c, 204, now);
        got(&client);
        send(&mut c, &client, t, GET, now);
        assert!(got(&client).contains("the VMM is shutting down"));
    }

    #[test]
    fn continue_half_close_bad_requests_and_images() {
        let mut c = Conns::new(Queue::default());
        let (client, t) = connect(&mut c, Duration::ZERO);
        let t = t.unwrap();
        let body = br#"{"drive_id":"d","path_on_host":"/img"}"#;
        let head = format!(
            "PATCH /drives/d HTTP/1.1\r\nExpect: 100-continue\r\nContent-Length: {}\r\n\r\n",
            body.len()
        );
        send(&mut c, &client, t, head.as_bytes(), Duration::ZERO);
        assert_eq!(got(&client).as_bytes(), http::CONTINUE);
        send(&mut c, &client, t, body, Duration::ZERO);
        // The VMM asks for the image; it comes back with the request.
        let first = c.vmm().commands.pop_front().unwrap().claim().unwrap();
        first.reply.send(Answer::Open {
            path: "/img".into(),
            read_only: false,
        });
        c.answers(MS);
        let second = c.vmm().commands.pop_front().unwrap().claim().unwrap();
        assert!(matches!(&second.image, Some(OpenedImage::Failed(m)) if m == "opened /img"));
        // Asked again: refused rather than looping.
        second.reply.send(Answer::Open {
            path: "/img".into(),
            read_only: false,
        });
        c.answers(MS);
        assert!(got(&client).contains("asked for the disk image again"));
        // Shut for writing after a request: answered, then closed.
        send(&mut c, &client, t, GET, MS);
        client.borrow_mut().shut = true;
        vmm_answers(&mut c, 204, MS);
        assert!(got(&client).starts_with("HTTP/1.1 204"));
        assert!(c.is_empty());
        // A malformed request: answered and closed; a bad path: answered.
        let (client, t) = connect(&mut c, S);
        let t = t.unwrap();
        send(&mut c, &client, t, b"GET /vsock HTTP/1.1\r\n\r\n", S);
        // A method the path does not take: refused by the router itself.
        let answer = got(&client);
        assert!(answer.starts_with("HTTP/1.1 400") && answer.contains("fault_message"));
        send(&mut c, &client, t, b"GET / HTTP/9\r\n\r\n", S);
        assert!(got(&client).contains("unsupported HTTP version"));
        // The client reads the end; what it sends after is dropped until
        // it closes.
        assert!(client.borrow().server_shut && !client.borrow().closed);
        send(&mut c, &client, t, GET, S);
        assert_eq!((c.vmm().commands.len(), c.buffered()), (0, 0));
        assert_eq!(c.phases(), [(t, PhaseKind::Lingering, S + LINGER_TIMEOUT)]);
        client.borrow_mut().gone = true;
        c.ready(t, S);
        assert!(client.borrow().closed && c.is_empty());
        // Connection: close.
        let (client, t) = connect(&mut c, S);
        let t = t.unwrap();
        send(
            &mut c,
            &client,
            t,
            b"GET / HTTP/1.1\r\nConnection: close\r\n\r\n",
            S,
        );
        vmm_answers(&mut c, 204, S);
        assert!(got(&client).contains("Connection: close"));
        assert!(client.borrow().server_shut);
        // A client that never closes has the lingering time, no more.
        c.tick(S + LINGER_TIMEOUT - MS);
        assert!(!client.borrow().closed);
        c.tick(S + LINGER_TIMEOUT);
        assert!(client.borrow().closed && c.is_empty());
        assert_eq!(c.log_lines(), 0, "a lingering close is not news");
    }

    #[test]
    fn a_refused_body_is_dropped_before_the_close_within_bounds() {
        let mut c = Conns::new(Queue::default()).with_body_limit(1000);
        let (client, t) = connect(&mut c, Duration::ZERO);
        let t = t.unwrap();
        let head = b"PUT /boot-source HTTP/1.1\r\nContent-Length: 5000\r\n\r\n";
        send(&mut c, &client, t, head, Duration::ZERO);
        let answer = got(&client);
        assert!(answer.starts_with("HTTP/1.1 400"), "{answer}");
        assert!(client.borrow().server_shut && !client.borrow().closed);
        // The body the client goes on writing is read and dropped: its
        // writes succeed, and the answer waits for it in its socket. An
        // interrupted read is read again.
        client.borrow_mut().interrupt_read = true;
        send(&mut c, &client, t, &[b' '; 5000], MS);
        assert!(!client.borrow().interrupt_read, "not read again");
        assert!(
            client.borrow().to_server.is_empty(),
            "the body was not read"
        );
        assert_eq!(c.buffered(), 0);
        assert!(c.vmm().commands.is_empty());
        // It closes once it read the answer.
        client.borrow_mut().gone = true;
        c.ready(t, MS);
        assert!(client.borrow().closed && c.is_empty());
        // A read that fails ends it too.
        let (client, t) = connect(&mut c, MS);
        let t = t.unwrap();
        send(&mut c, &client, t, head, MS);
        assert!(!client.borrow().closed);
        client.borrow_mut().reset = true;
        c.ready(t, MS);
        assert!(client.borrow().closed && c.is_empty());
        // One that sends without end is closed at the bound: the body
        // limit and LINGER_BYTES.
        let (client, t) = connect(&mut c, S);
        let t = t.unwrap();
        send(&mut c, &client, t, head, S);
        send(&mut c, &client, t, &vec![b' '; 1000 + LINGER_BYTES - 1], S);
        assert!(!client.borrow().closed, "closed before the bound");
        send(&mut c, &client, t, b" ", S);
        assert!(client.borrow().closed && c.is_empty());
        // Lingering connections make room before idle ones do.
        let mut clients = Vec::new();
        for i in 0..MAX_CONNECTIONS {
            let (client, t) = connect(&mut c, S);
            let t = t.unwrap();
            if i % 2 == 1 {
                send(
                    &mut c,
                    &client,
                    t,
                    b"GET / HTTP/9\r\n\r\n",
                    S + MS * i as u32,
                );
            }
            clients.push(client);
        }
        for i in 0..MAX_CONNECTIONS / 2 {
            assert!(c.accept(Stream(Rc::default()), 2 * S).is_some());
            // The oldest lingering one went.
            assert!(clients[2 * i + 1].borrow().closed, "{i}");
            assert!(!clients[2 * i].borrow().closed, "{i}");
        }
        assert_eq!(c.log_lines(), 0, "a lingering one's close is not news");
        assert!(c.accept(Stream(Rc::default()), 3 * S).is_some());
        assert!(clients[0].borrow().closed);
        assert_eq!(c.log_lines(), 1, "an idle one's close is logged");
    }

    #[test]
    fn interrupted_calls_are_tried_again_and_a_write_of_nothing_ends_the_connection() {
        let mut c = Conns::new(Queue::default());
        let (client, t) = connect(&mut c, Duration::ZERO);
        let t = t.unwrap();
        // The read and the write are each interrupted once.
        client.borrow_mut().interrupt_read = true;
        client.borrow_mut().interrupt_write = true;
        send(&mut c, &client, t, b"GET / HTT", Duration::ZERO);
        assert!(c.buffered() > 0, "half a request is buffered");
        assert!(!client.borrow().interrupt_read, "not read again");
        send(&mut c, &client, t, b"P/1.1\r\n\r\n", Duration::ZERO);
        vmm_answers(&mut c, 204, MS);
        assert!(got(&client).starts_with("HTTP/1.1 204"));
        assert!(!client.borrow().interrupt_write, "not written again");
        // A socket that takes nothing: the client is gone.
        client.borrow_mut().zero = true;
        send(&mut c, &client, t, GET, MS);
        vmm_answers(&mut c, 204, MS);
        assert!(c.is_empty());
        // A read that fails ends the connection.
        let (client, t) = connect(&mut c, S);
        let t = t.unwrap();
        client.borrow_mut().reset = true;
        c.ready(t, S);
        assert!(client.borrow().closed && c.is_empty());
        // A connection the caller could not poll is dropped without a word.
        let (client, t) = connect(&mut c, S);
        c.drop_connection(t.unwrap());
        assert!(client.borrow().closed && c.is_empty());
        assert_eq!(c.log_lines(), 0);
    }

    #[test]
    fn a_log_line_names_what_happened_and_counts_start_again() {
        let mut t = Tally::default();
        assert_eq!((t.due(), t.take_line(S)), (None, None));
        t.refused = 3;
        t.unread = 1;
        assert_eq!(t.due(), Some(Duration::ZERO));
        assert_eq!(
            t.take_line(S).as_deref(),
            Some(
                "API socket: 3 connection(s) refused (16 open, none idle), \
                 1 connection(s) closed with an answer unread for 5 s"
            )
        );
        assert_eq!((t.lines, t.refused, t.unread), (1, 0, 0));
        t.evicted = 1;
        t.half_requests = 2;
        assert_eq!(t.due(), Some(2 * S));
        assert_eq!(t.take_line(2 * S - MS), None);
        assert_eq!(
            t.take_line(2 * S).as_deref(),
            Some(
                "API socket: 1 idle connection(s) closed for newer ones, \
                 2 connection(s) ended with half a request (closed by the client, or not \
                 whole after 5 s)"
            )
        );
        assert_eq!(t.lines, 2);
    }
}
