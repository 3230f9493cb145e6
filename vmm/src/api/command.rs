// SPDX-License-Identifier: Apache-2.0
//! The protocol between the API thread and the event loop: one routed
//! request as an [`ApiCommand`], its [`Answer`], and the two trips of a
//! drive's image swap, both halves of it here.
//!
//! The API thread calls [`ask`] for every routed request: the command goes
//! to the event loop through a channel, the eventfd wakes it, and the
//! answer comes back through a channel of one, or a fault after
//! [`VMM_TIMEOUT`] so that the API stays responsive while the VMM is busy.
//!
//! `PATCH /drives/{id}` with a `path_on_host` takes two trips: the event
//! loop may open no file (its seccomp filter), so its first answer is
//! [`Answer::Open`] (the path and the drive's read-only setting); the API
//! thread, whose filter allows opening and locking an image and nothing
//! more, opens it with [`open_image`] (the same steps as at start:
//! `FileBackend`'s open, regular-file check and lock) and sends the request
//! again with the [`OpenedImage`]. The path resolves where the API thread
//! runs: inside the jail, if minivmm was jailed. The event loop checks
//! everything that needs no file before it asks, so a bad request opens
//! nothing.

use std::path::{Path, PathBuf};
use std::sync::mpsc::{self, Receiver, Sender, SyncSender};
use std::time::Duration;

use devices::virtio::block::{BlockError, FileBackend, FileId};
use vmm_sys_util::eventfd::EventFd;

use super::http::Response;
use super::routes::ApiRequest;

/// How long the VMM may take to answer one request.
pub const VMM_TIMEOUT: Duration = Duration::from_secs(10);

/// One request for the VMM and where its answer goes.
#[derive(Debug)]
pub struct ApiCommand {
    /// What the client asked.
    pub request: ApiRequest,
    /// The disk image the VMM asked this thread to open for the request
    /// ([`Answer::Open`]); `None` the first time.
    pub image: Option<OpenedImage>,
    /// Where the answer goes (a channel of one).
    pub reply: SyncSender<Answer>,
}

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

/// Hands one request to the VMM and waits for its answer; opens the image
/// the VMM asks for, if it does, and hands the request over again with it.
pub fn ask(vmm: &Sender<ApiCommand>, wake: Option<&EventFd>, request: ApiRequest) -> Response {
    let (path, read_only) = match exchange(vmm, wake, request.clone(), None) {
        Answer::Reply(r) => return r,
        Answer::Open { path, read_only } => (path, read_only),
    };
    let image = open_image(&path, read_only);
    match exchange(vmm, wake, request, Some(image)) {
        Answer::Reply(r) => r,
        Answer::Open { .. } => Response::fault("the VMM asked for the image again"),
    }
}

/// One command to the VMM and its answer (a fault after [`VMM_TIMEOUT`]).
fn exchange(
    vmm: &Sender<ApiCommand>,
    wake: Option<&EventFd>,
    request: ApiRequest,
    image: Option<OpenedImage>,
) -> Answer {
    let (reply, answer): (SyncSender<Answer>, Receiver<Answer>) = mpsc::sync_channel(1);
    if vmm
        .send(ApiCommand {
            request,
            image,
            reply,
        })
        .is_err()
    {
        return Response::fault("the VMM is shutting down").into();
    }
    if let Some(w) = wake {
        // A full counter means a wake-up is pending already.
        let _ = w.write(1);
    }
    answer
        .recv_timeout(VMM_TIMEOUT)
        .unwrap_or_else(|_| Response::fault("the VMM did not answer in time").into())
}
