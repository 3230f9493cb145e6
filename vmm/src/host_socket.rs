// SPDX-License-Identifier: Apache-2.0
//! The vsock device's host socket: the listener at `uds_path`
//! ([`VsockSocket`]), bound as soon as the configuration names it and
//! removed when minivmm ends.
//!
//! Firecracker binds it when `PUT /vsock` is accepted, and its clients wait
//! for the file to appear before they go on, so minivmm does the same: the
//! pre-boot API binds it at `PUT /vsock` (a later `PUT /vsock` at another
//! path binds there first, then removes the old socket; at the same path,
//! the socket stays), and with `--vsock` or a config file the builder binds
//! it first of all, before KVM is opened. The device gets a duplicate of
//! the listener, so a build that fails (and is retried through the API)
//! leaves the socket in place.
//!
//! A path where something exists is refused ([`HostSocketError::Exists`]):
//! minivmm never removes a file it did not make. The one it made is
//! removed when minivmm ends, by a [`Remover`] (its module says why a
//! process of its own): before `main` returns, or soon after minivmm died
//! another way.

use std::io;
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};

use crate::process::remover::{Remover, RemoverError};
use crate::process::seccomp::SeccompMode;

/// Why the socket could not be bound; each is one line.
#[derive(Debug, thiserror::Error)]
pub enum HostSocketError {
    /// Something exists at the path.
    #[error(
        "vsock: uds_path '{}' exists: minivmm makes a new socket there and never removes \
         a file it did not make; remove it first",
        .0.display()
    )]
    Exists(PathBuf),
    /// `bind` or `listen` failed for another reason (no such directory, no
    /// permission).
    #[error("vsock: cannot listen on uds_path '{}'", .0.display())]
    Bind(PathBuf, #[source] io::Error),
    /// The process that removes the socket could not be started.
    #[error("vsock: uds_path '{}'", .0.display())]
    Remover(PathBuf, #[source] RemoverError),
    /// The listener could not be duplicated for the device.
    #[error("vsock: cannot hand the listener on '{}' to the device", .0.display())]
    Dup(PathBuf, #[source] io::Error),
}

/// The listener at `uds_path` and the process that removes it (see the
/// module doc).
#[derive(Debug)]
pub struct VsockSocket {
    path: PathBuf,
    listener: UnixListener,
    /// Dropped last: the socket goes once nothing holds this.
    remover: Option<Remover>,
}

impl VsockSocket {
    /// Binds a non-blocking listener at `path` and starts its remover,
    /// whose filter follows `mode`. Before any seccomp filter.
    pub fn bind(path: &Path, mode: SeccompMode) -> Result<VsockSocket, HostSocketError> {
        let listener = UnixListener::bind(path).map_err(|e| match e.kind() {
            io::ErrorKind::AddrInUse => HostSocketError::Exists(path.to_path_buf()),
            _ => HostSocketError::Bind(path.to_path_buf(), e),
        })?;
        let remover = match Remover::spawn(path, mode) {
            Ok(r) => r,
            Err(e) => {
                let _ = std::fs::remove_file(path);
                return Err(HostSocketError::Remover(path.to_path_buf(), e));
            }
        };
        let socket = VsockSocket {
            path: path.to_path_buf(),
            listener,
            remover: Some(remover),
        };
        socket
            .listener
            .set_nonblocking(true)
            .map_err(|e| HostSocketError::Bind(path.to_path_buf(), e))?;
        Ok(socket)
    }

    /// Where it is bound.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// A duplicate of the listener, for the device.
    pub fn listener(&self) -> Result<UnixListener, HostSocketError> {
        self.listener
            .try_clone()
            .map_err(|e| HostSocketError::Dup(self.path.clone(), e))
    }

    /// Removes the socket now (it is being replaced, before the VM runs).
    pub fn remove_now(mut self) {
        let _ = std::fs::remove_file(&self.path);
        if let Some(r) = self.remover.take() {
            r.disarm();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};
    use std::os::unix::net::UnixStream;

    pub(crate) struct Scratch(pub(crate) PathBuf);

    impl Scratch {
        pub(crate) fn new(tag: &str) -> Scratch {
            let d = std::env::temp_dir()
                .join(format!("minivmm-host-socket-{tag}-{}", std::process::id()));
            let _ = std::fs::remove_dir_all(&d);
            std::fs::create_dir_all(&d).unwrap();
            Scratch(d)
        }
    }

    impl Drop for Scratch {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    #[test]
    fn the_socket_listens_at_once_and_is_gone_when_dropped() {
        let d = Scratch::new("drop");
        let path = d.0.join("v.sock");
        let s = VsockSocket::bind(&path, SeccompMode::On).unwrap();
        assert_eq!(s.path(), path);
        let l = s.listener().unwrap();
        let mut c = UnixStream::connect(&path).unwrap();
        let (mut a, _) = l.accept().unwrap_or_else(|_| {
            // Non-blocking: the connection may need a moment to be queued.
            std::thread::sleep(std::time::Duration::from_millis(50));
            l.accept().unwrap()
        });
        c.write_all(b"CONNECT 52\n").unwrap();
        let mut b = [0u8; 11];
        a.set_nonblocking(false).unwrap();
        a.read_exact(&mut b).unwrap();
        assert_eq!(&b, b"CONNECT 52\n");
        drop((l, a));
        drop(s);
        assert!(!path.exists(), "the socket outlived its owner");
    }

    #[test]
    fn a_path_that_exists_or_cannot_be_bound_is_one_line() {
        let d = Scratch::new("exists");
        let file = d.0.join("taken");
        std::fs::write(&file, b"mine").unwrap();
        let e = crate::error_line(&VsockSocket::bind(&file, SeccompMode::Off).unwrap_err());
        assert!(
            e.starts_with(&format!("vsock: uds_path '{}' exists", file.display())),
            "{e}"
        );
        assert_eq!(
            std::fs::read(&file).unwrap(),
            b"mine",
            "the file was touched"
        );
        // A live socket is no less a file that exists.
        let path = d.0.join("v.sock");
        let first = VsockSocket::bind(&path, SeccompMode::Off).unwrap();
        let e = crate::error_line(&VsockSocket::bind(&path, SeccompMode::Off).unwrap_err());
        assert!(e.contains("exists"), "{e}");
        assert!(path.exists(), "the second bind removed the first's socket");
        drop(first);
        let missing = d.0.join("no/such/dir/v.sock");
        let e = crate::error_line(&VsockSocket::bind(&missing, SeccompMode::Off).unwrap_err());
        assert!(e.starts_with("vsock: cannot listen on uds_path"), "{e}");
        assert!(!e.contains('\n'));
    }

    #[test]
    fn removed_now_it_is_gone_at_once_and_a_new_socket_there_stays() {
        let d = Scratch::new("now");
        let path = d.0.join("v.sock");
        let s = VsockSocket::bind(&path, SeccompMode::On).unwrap();
        s.remove_now();
        assert!(!path.exists());
        // The old remover leaves alone what is bound there next.
        let again = VsockSocket::bind(&path, SeccompMode::On).unwrap();
        std::thread::sleep(std::time::Duration::from_millis(50));
        assert!(path.exists());
        drop(again);
        assert!(!path.exists());
    }
}
