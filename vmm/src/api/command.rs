// SPDX-License-Identifier: Apache-2.0
//! One request on its way from the API thread to the VMM, and its answer on
//! the way back.
//!
//! The API thread hands the VMM an [`ApiCommand`] and keeps its
//! [`Ticket`]; both hold one slot under a lock, whose state only moves
//! forward:
//!
//! ```text
//! Pending ──claim (VMM)──▶ Taken ──Reply::send──▶ Answered ──Ticket::answer──▶ Collected
//!    └──────abandon (API thread, at its deadline)──▶ Abandoned
//! ```
//!
//! Claiming and abandoning are one decision under that lock: the VMM
//! applies a request only once it claimed it, and the API thread answers
//! "did not answer in time" only once it abandoned it. So a client told
//! that its request timed out can rely on it never being applied, and a
//! request the VMM took is always answered with what the VMM did (the API
//! thread waits for that answer however long the VMM takes; each request
//! is bounded work there). A command the VMM claimed and dropped without an
//! answer (a bug) is answered with a fault rather than never.
//!
//! The VMM wakes the API thread after each answer through an eventfd the
//! API thread polls, so that thread never waits on the VMM.
//!
//! `PATCH /drives/{id}` with a `path_on_host` takes two trips: the event
//! loop may open no file (its seccomp filter), so its first answer is
//! [`Answer::Open`] (the path and the drive's read-only setting); the API
//! thread, whose filter allows opening and locking an image and nothing
//! more, opens it with [`open_image`] (the same steps as at start:
//! `FileBackend`'s open, regular-file check and lock) and sends the request
//! again with the [`OpenedImage`] (`connections` does both trips). The path
//! resolves where the API thread runs: inside the jail, if minivmm was
//! jailed. The event loop checks everything that needs no file before it
//! asks, so a bad request opens nothing.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

use devices::virtio::block::{BlockError, FileBackend, FileId};
use vmm_sys_util::eventfd::EventFd;

use super::http::Response;
use super::routes::ApiRequest;

/// What the VMM answers a command with.
#[derive(Debug)]
pub enum Answer {
    /// The client's answer.
    Reply(Response),
    /// `PATCH /drives` with a `path_on_host`: open this image (read-only or
    /// not, as the drive is) and send the request again with it.
    Open {
        /// The image, as the client named it.
        path: PathBuf,
        /// Whether the drive is read-only.
        read_only: bool,
    },
}

impl From<Response> for Answer {
    fn from(r: Response) -> Self {
        Answer::Reply(r)
    }
}

/// What the API thread found opening an image for `PATCH /drives`
/// ([`open_image`]).
#[derive(Debug)]
pub enum OpenedImage {
    /// A regular file, opened as the drive is (read-only or not) and
    /// locked; not probed yet (the event loop does that).
    Image(FileBackend),
    /// A regular file whose lock another open file holds: another
    /// process's image, another drive's, or this drive's own (named again
    /// so that the guest sees its new size).
    Locked {
        /// Which file it is.
        id: FileId,
        /// Its size in bytes.
        size: u64,
        /// The error to report if it is not this drive's.
        error: String,
    },
    /// Why it could not be opened, in one line.
    Failed(String),
}

impl OpenedImage {
    /// Which file was opened, if one was.
    pub fn file(&self) -> Option<FileId> {
        match self {
            OpenedImage::Image(b) => Some(b.id()),
            OpenedImage::Locked { id, .. } => Some(*id),
            OpenedImage::Failed(_) => None,
        }
    }
}

/// Opens the image `path` for a drive (`read_only` as the drive is) as
/// the builder does at start, less the `fallocate` probes: on the API
/// thread, whose filter allows this and nothing more.
pub fn open_image(path: &Path, read_only: bool) -> OpenedImage {
    let line = |e: BlockError| crate::one_line(e.to_string());
    let image = match FileBackend::open_unlocked(path, read_only) {
        Ok(i) => i,
        Err(e) => return OpenedImage::Failed(line(e)),
    };
    let (id, size) = (image.id(), image.size());
    match image.lock() {
        Ok(b) => OpenedImage::Image(b),
        Err(e @ BlockError::Locked(_)) => OpenedImage::Locked {
            id,
            size,
            error: line(e),
        },
        Err(e) => OpenedImage::Failed(line(e)),
    }
}

/// Where a command stands; see the module doc.
#[derive(Debug)]
enum State {
    Pending,
    Taken,
    Answered(Answer),
    Abandoned,
    Collected,
}

#[derive(Debug)]
struct Slot(Mutex<State>);

impl Slot {
    fn lock(&self) -> MutexGuard<'_, State> {
        // A thread that panicked holding the lock ended the process (the
        // panic hook); the state it left is still a valid one.
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// One request for the VMM and where its answer goes.
#[derive(Debug)]
pub struct ApiCommand {
    request: ApiRequest,
    image: Option<OpenedImage>,
    reply: Reply,
}

/// A command the VMM claimed: it applies the request and answers through
/// `reply`.
#[derive(Debug)]
pub struct Claimed {
    /// What the client asked.
    pub request: ApiRequest,
    /// The disk image the API thread opened for the request, when an
    /// earlier answer asked for one ([`Answer::Open`]).
    pub image: Option<OpenedImage>,
    /// Where the answer goes.
    pub reply: Reply,
}

impl ApiCommand {
    /// A command for `request` (with the `image` the VMM asked for, on a
    /// second trip) and the API thread's ticket for its answer; `wake` is
    /// signalled after the answer is in.
    pub fn new(
        request: ApiRequest,
        image: Option<OpenedImage>,
        wake: Option<Arc<EventFd>>,
    ) -> (ApiCommand, Ticket) {
        let slot = Arc::new(Slot(Mutex::new(State::Pending)));
        let ticket = Ticket { slot: slot.clone() };
        let reply = Reply { slot, wake };
        let cmd = ApiCommand {
            request,
            image,
            reply,
        };
        (cmd, ticket)
    }

    /// What the client asked.
    pub fn request(&self) -> &ApiRequest {
        &self.request
    }

    /// The VMM's side of the decision: the request to apply, or `None`
    /// when the API thread gave up on it first and told the client it was
    /// not applied (then the VMM must drop it).
    pub fn claim(self) -> Option<Claimed> {
        {
            let mut state = self.reply.slot.lock();
            if !matches!(*state, State::Pending) {
                return None;
            }
            *state = State::Taken;
        }
        Some(Claimed {
            request: self.request,
            image: self.image,
            reply: self.reply,
        })
    }
}

/// The VMM's way back to the API thread for one claimed command.
#[derive(Debug)]
pub struct Reply {
    slot: Arc<Slot>,
    wake: Option<Arc<EventFd>>,
}

impl Reply {
    /// Answers the command and wakes the API thread.
    pub fn send(mut self, answer: impl Into<Answer>) {
        self.finish(answer.into());
    }

    fn finish(&mut self, answer: Answer) {
        {
            let mut state = self.slot.lock();
            if !matches!(*state, State::Taken) {
                return;
            }
            *state = State::Answered(answer);
        }
        if let Some(w) = &self.wake {
            // A full counter means a wake-up is pending already.
            let _ = w.write(1);
        }
    }
}

impl Drop for Reply {
    fn drop(&mut self) {
        // Claimed and never answered: the client still gets an answer.
        self.finish(Response::fault("the VMM dropped the request without answering it").into());
    }
}

/// The API thread's side of one command.
#[derive(Debug)]
pub struct Ticket {
    slot: Arc<Slot>,
}

impl Ticket {
    /// The VMM's answer, once it is in (taken from the slot: a second call
    /// returns `None`).
    pub fn answer(&self) -> Option<Answer> {
        let mut state = self.slot.lock();
        if !matches!(*state, State::Answered(_)) {
            return None;
        }
        match std::mem::replace(&mut *state, State::Collected) {
            State::Answered(a) => Some(a),
            _ => None,
        }
    }

    /// The API thread's side of the decision: gives up on a command the VMM
    /// has not claimed, which it then never applies (true); false when the
    /// VMM claimed it already, and its answer is or will be here.
    pub fn abandon(&self) -> bool {
        let mut state = self.slot.lock();
        if matches!(*state, State::Pending) {
            *state = State::Abandoned;
            return true;
        }
        false
    }

    /// Whether the VMM still holds the command (in its queue, or working
    /// on it): what the API thread counts to bound the queue.
    pub fn held_by_vmm(&self) -> bool {
        Arc::strong_count(&self.slot) > 1
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn command() -> (ApiCommand, Ticket) {
        ApiCommand::new(ApiRequest::GetVersion, None, None)
    }

    fn status(a: Option<Answer>) -> Option<u16> {
        match a {
            Some(Answer::Reply(r)) => Some(r.status),
            Some(Answer::Open { .. }) => Some(0),
            None => None,
        }
    }

    #[test]
    fn a_claimed_command_is_answered_once_and_cannot_be_abandoned() {
        let (cmd, ticket) = command();
        assert!(ticket.held_by_vmm());
        assert_eq!(cmd.request(), &ApiRequest::GetVersion);
        let claimed = cmd.claim().expect("pending");
        assert!(!ticket.abandon(), "abandoned after the VMM took it");
        assert_eq!(status(ticket.answer()), None, "answered before the VMM did");
        claimed.reply.send(Response::no_content());
        assert!(!ticket.held_by_vmm());
        assert_eq!(status(ticket.answer()), Some(204));
        assert_eq!(status(ticket.answer()), None, "answered twice");
        assert!(!ticket.abandon());
    }

    #[test]
    fn an_abandoned_command_is_never_claimed() {
        let (cmd, ticket) = command();
        assert!(ticket.abandon());
        assert!(ticket.held_by_vmm(), "still in the VMM's queue");
        assert!(cmd.claim().is_none(), "claimed after the time-out answer");
        assert!(!ticket.held_by_vmm());
        assert_eq!(status(ticket.answer()), None);
        assert!(!ticket.abandon(), "abandoned twice");
    }

    #[test]
    fn a_claimed_command_dropped_unanswered_is_answered_with_a_fault() {
        let (cmd, ticket) = command();
        drop(cmd.claim());
        match ticket.answer() {
            Some(Answer::Reply(r)) => {
                assert_eq!(r.status, 400);
                assert!(r.body.unwrap_or_default().contains("without answering"));
            }
            other => panic!("{other:?}"),
        }
        // Dropped unclaimed: nothing was applied and nothing answers.
        let (cmd, ticket) = command();
        drop(cmd);
        assert_eq!(status(ticket.answer()), None);
        assert!(
            ticket.abandon(),
            "an unclaimed command can still be abandoned"
        );
    }

    #[test]
    fn an_answer_wakes_the_api_thread() {
        let wake = Arc::new(EventFd::new(libc::EFD_NONBLOCK).unwrap());
        let (cmd, ticket) = ApiCommand::new(ApiRequest::GetVersion, None, Some(wake.clone()));
        assert!(wake.read().is_err(), "woken before the answer");
        let claimed = cmd.claim().unwrap();
        assert!(wake.read().is_err(), "woken by the claim");
        claimed.reply.send(Answer::Open {
            path: "/x".into(),
            read_only: true,
        });
        assert_eq!(wake.read().unwrap(), 1);
        assert_eq!(status(ticket.answer()), Some(0));
    }
}
