// SPDX-License-Identifier: Apache-2.0
//! The control plane Firecracker's clients speak: HTTP/1.1 on a Unix socket.
//!
//! - [`http`]: the wire format, a bounded incremental request parser and
//!   the answers (`204`, `200` with JSON, `400` with `fault_message`);
//! - [`routes`]: Firecracker's paths and methods to typed requests, with
//!   the checks that need no VMM state (id in the path against the body,
//!   the `/actions` and `/vm` bodies, features minivmm does not have).
//!
//! - [`connections`]: every connection as a state machine over abstract
//!   streams and time: bounded buffers, deadlines, the connection bound;
//! - [`server`]: the socket on its own thread, epoll and the clock driving
//!   [`connections`], each routed request sent to the VMM as one command;
//! - [`command`]: a request on its way to the VMM and its answer back,
//!   with the one decision between a time-out and the request's application;
//! - [`preboot`]: the requests before `InstanceStart`, which build the
//!   configuration in the config-file layout;
//! - [`runtime`]: the requests once the VM runs, served on the event loop;
//! - [`mmds`]: `PUT`, `PATCH` and `GET /mmds` on the store, before and
//!   after boot alike;
//! - [`patch`]: `PATCH` on a running device, whatever its kind, through its
//!   control;
//! - [`balloon`]: the balloon's paths once the VM runs.

use std::path::{Path, PathBuf};
use std::sync::mpsc::{self, Receiver};

use seccompiler::BpfProgram;
use vmm_sys_util::eventfd::EventFd;

use crate::process::seccomp::{self, Thread};

pub mod balloon;
pub mod command;
pub mod connections;
pub mod http;
pub mod mmds;
pub mod patch;
pub mod preboot;
pub mod routes;
pub mod runtime;
pub mod server;

use command::ApiCommand;
use server::{ApiServer, ServerError};

/// The VMM's end of the API: the commands, in arrival order, and the
/// eventfd the API thread signals after each (the event loop's wake-up).
#[derive(Debug)]
pub struct ApiChannel {
    /// Routed requests, each with where its answer goes.
    pub commands: Receiver<ApiCommand>,
    /// Signalled after each command is sent.
    pub wake: EventFd,
    /// The socket's path.
    pub path: PathBuf,
}

/// Binds the API socket at `path` and starts its thread (`fc_api`, as
/// Firecracker names it), which installs `filter` before it reads a byte
/// and takes request bodies of up to `body_limit` bytes.
/// Returns once the thread is filtered and serving; a filter the kernel
/// refuses is an error here, before anything of the VM exists.
pub fn start(
    path: &Path,
    filter: Option<BpfProgram>,
    body_limit: usize,
) -> Result<ApiChannel, ServerError> {
    let io = |source| ServerError::Io {
        path: path.to_path_buf(),
        source,
    };
    let server = ApiServer::bind(path)?.with_body_limit(body_limit);
    let wake = EventFd::new(libc::EFD_NONBLOCK).map_err(io)?;
    let thread_wake = wake.try_clone().map_err(io)?;
    let (tx, commands) = mpsc::channel();
    let (ready_tx, ready) = mpsc::sync_channel(1);
    std::thread::Builder::new()
        .name("fc_api".into())
        .spawn(move || {
            let filtered = seccomp::apply(Thread::Api, filter.as_ref());
            let ok = filtered.is_ok();
            let _ = ready_tx.send(filtered);
            if ok {
                server.serve(tx, Some(thread_wake));
            }
        })
        .map_err(io)?;
    match ready.recv() {
        Ok(Ok(())) => Ok(ApiChannel {
            commands,
            wake,
            path: path.to_path_buf(),
        }),
        Ok(Err(e)) => Err(ServerError::Filter(e)),
        Err(_) => Err(io(std::io::Error::other("the API thread ended at start"))),
    }
}
