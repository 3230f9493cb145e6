// SPDX-License-Identifier: Apache-2.0
//! The host side of the vsock device: every system call on a Unix socket
//! goes through [`VsockBackend`], the seam the fault-injection tests use
//! (as the block device's `BlockBackend` and the network device's
//! `NetBackend` are theirs).
//!
//! [`UnixBackend`] is the real one: non-blocking `AF_UNIX` stream sockets,
//! data moved with one `readv`/`writev` between guest memory and the
//! socket ([`IoVecs`]). A write to a peer that has gone returns `EPIPE`
//! rather than raising `SIGPIPE`: Rust programs start with `SIGPIPE`
//! ignored, minivmm included.
//!
//! Sockets are made non-blocking by the system call that makes them
//! (`accept4` and `socket` with `SOCK_NONBLOCK`), so that no `fcntl` or
//! `ioctl` follows on the event loop, and a guest's connect never blocks
//! on a host listener whose backlog is full (it fails with `EAGAIN`). These
//! two calls have no safe wrapper that takes the flag, hence this module's
//! `unsafe`; and bytes move with `read`, `write`, `readv` and `writev`
//! only (std's socket reads would be `recvfrom`), so the event loop's
//! seccomp list needs no call for them beyond what the network device has.
#![allow(unsafe_code)]

use std::io;
use std::net::Shutdown;
use std::os::fd::{AsRawFd, FromRawFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::Path;

/// Flags of every socket the device makes on the event loop.
const SOCK_FLAGS: libc::c_int = libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC;

fn owned(fd: libc::c_int) -> io::Result<UnixStream> {
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` was just returned by accept4/socket, is open and owned by
    // nothing else; the stream takes it over and closes it.
    Ok(unsafe { UnixStream::from_raw_fd(fd) })
}

/// `accept4(SOCK_NONBLOCK | SOCK_CLOEXEC)` on `listener`.
fn accept_nonblocking(listener: &UnixListener) -> io::Result<UnixStream> {
    // SAFETY: accept4 with null address pointers writes no address; the
    // listener's fd is open for the call.
    let fd = unsafe {
        libc::accept4(
            listener.as_raw_fd(),
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            SOCK_FLAGS,
        )
    };
    owned(fd)
}

/// A non-blocking stream socket connected to the listener at `path`.
fn connect_nonblocking(path: &Path) -> io::Result<UnixStream> {
    let bytes = path.as_os_str().as_bytes();
    // SAFETY: sockaddr_un is plain data; all zeros is a valid value.
    let mut addr: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    // The path and its terminating NUL must fit sun_path.
    if bytes.len() >= addr.sun_path.len() || bytes.contains(&0) {
        return Err(io::Error::from_raw_os_error(libc::ENAMETOOLONG));
    }
    addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
    for (d, s) in addr.sun_path.iter_mut().zip(bytes) {
        *d = *s as libc::c_char;
    }
    // SAFETY: socket(2) takes no pointer.
    let s = owned(unsafe { libc::socket(libc::AF_UNIX, libc::SOCK_STREAM | SOCK_FLAGS, 0) })?;
    let len = std::mem::size_of::<libc::sa_family_t>() + bytes.len() + 1;
    // SAFETY: `addr` is a sockaddr_un that lives across the call and `len`
    // (at most its size: checked above) covers the family and the
    // NUL-terminated path; the socket's fd is open.
    let r = unsafe {
        libc::connect(
            s.as_raw_fd(),
            (&addr as *const libc::sockaddr_un).cast(),
            len as libc::socklen_t,
        )
    };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(s)
}

use crate::virtio::iov::IoVecs;

/// Every operation the device makes on its Unix sockets.
pub trait VsockBackend: Send {
    /// A connected stream socket, non-blocking.
    type Stream: AsRawFd + Send;

    /// Accepts a host connection waiting on `listener` (`EAGAIN` when none).
    fn accept(&mut self, listener: &UnixListener) -> io::Result<Self::Stream>;
    /// Connects to the host listener at `path` for a guest's connection
    /// request, without blocking (`ECONNREFUSED`, `ENOENT`, `EAGAIN` when its
    /// backlog is full).
    fn connect(&mut self, path: &Path) -> io::Result<Self::Stream>;
    /// One `readv` from the socket into `bufs` (0: the peer sent EOF).
    fn recv(&mut self, s: &mut Self::Stream, bufs: IoVecs<'_>) -> io::Result<usize>;
    /// One `writev` of `bufs` to the socket; may write fewer bytes.
    fn send(&mut self, s: &mut Self::Stream, bufs: IoVecs<'_>) -> io::Result<usize>;
    /// Reads into a host buffer (the `CONNECT` line).
    fn read_bytes(&mut self, s: &mut Self::Stream, buf: &mut [u8]) -> io::Result<usize>;
    /// Writes a host buffer (`OK <port>\n`, data the socket refused before).
    fn write_bytes(&mut self, s: &mut Self::Stream, buf: &[u8]) -> io::Result<usize>;
    /// Tells the peer no more data comes (`shutdown(SHUT_WR)`).
    fn shutdown_write(&mut self, s: &mut Self::Stream) -> io::Result<()>;
}

/// The real backend: Unix stream sockets.
#[derive(Debug, Default)]
pub struct UnixBackend;

impl VsockBackend for UnixBackend {
    type Stream = UnixStream;

    fn accept(&mut self, listener: &UnixListener) -> io::Result<UnixStream> {
        accept_nonblocking(listener)
    }

    fn connect(&mut self, path: &Path) -> io::Result<UnixStream> {
        connect_nonblocking(path)
    }

    #[inline]
    fn recv(&mut self, s: &mut UnixStream, bufs: IoVecs<'_>) -> io::Result<usize> {
        bufs.readv(s.as_raw_fd())
    }

    #[inline]
    fn send(&mut self, s: &mut UnixStream, bufs: IoVecs<'_>) -> io::Result<usize> {
        bufs.writev(s.as_raw_fd())
    }

    fn read_bytes(&mut self, s: &mut UnixStream, buf: &mut [u8]) -> io::Result<usize> {
        // SAFETY: read(2) writes at most `buf.len()` bytes into `buf`, which
        // is exclusively borrowed for the call; the socket's fd is open.
        let n = unsafe { libc::read(s.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
        usize::try_from(n).map_err(|_| io::Error::last_os_error())
    }

    fn write_bytes(&mut self, s: &mut UnixStream, buf: &[u8]) -> io::Result<usize> {
        // SAFETY: write(2) reads at most `buf.len()` bytes from `buf`, which
        // lives across the call; the socket's fd is open.
        let n = unsafe { libc::write(s.as_raw_fd(), buf.as_ptr().cast(), buf.len()) };
        usize::try_from(n).map_err(|_| io::Error::last_os_error())
    }

    fn shutdown_write(&mut self, s: &mut UnixStream) -> io::Result<()> {
        s.shutdown(Shutdown::Write)
    }
}

/// Binds the host listener at `path`, non-blocking. A path that exists is
/// refused by `bind` itself (`EADDRINUSE`): minivmm never removes a file it
/// did not make.
pub fn bind_listener(path: &Path) -> io::Result<UnixListener> {
    let l = UnixListener::bind(path)?;
    l.set_nonblocking(true)?;
    Ok(l)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::virtio::iov::host_buf;

    fn dir(name: &str) -> std::path::PathBuf {
        let d = std::env::temp_dir().join(format!("minivmm-vsock-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn the_unix_backend_moves_bytes_and_reports_a_gone_peer() {
        let d = dir("be");
        let path = d.join("l.sock");
        let _ = std::fs::remove_file(&path);
        let l = bind_listener(&path).unwrap();
        assert!(bind_listener(&path).is_err(), "an existing path is refused");
        let mut b = UnixBackend;
        assert_eq!(
            b.accept(&l).unwrap_err().kind(),
            io::ErrorKind::WouldBlock,
            "the listener does not block"
        );
        let mut ours = b.connect(&path).unwrap();
        let mut theirs = b.accept(&l).unwrap();
        for s in [&ours, &theirs] {
            // SAFETY: F_GETFL on an open fd takes no pointer.
            let fl = unsafe { libc::fcntl(s.as_raw_fd(), libc::F_GETFL) };
            assert_ne!(fl & libc::O_NONBLOCK, 0, "made non-blocking");
        }
        let mut msg = *b"hello";
        assert_eq!(host_buf(&mut msg, |v| b.send(&mut ours, v)).unwrap(), 5);
        let mut got = [0u8; 8];
        assert_eq!(host_buf(&mut got, |v| b.recv(&mut theirs, v)).unwrap(), 5);
        assert_eq!(&got[..5], b"hello");
        assert_eq!(
            b.read_bytes(&mut theirs, &mut got).unwrap_err().kind(),
            io::ErrorKind::WouldBlock
        );
        b.shutdown_write(&mut ours).unwrap();
        assert_eq!(b.read_bytes(&mut theirs, &mut got).unwrap(), 0, "EOF");
        drop(theirs);
        let err = b.write_bytes(&mut ours, b"x").unwrap_err();
        assert_eq!(err.raw_os_error(), Some(libc::EPIPE));
        drop(l);
        std::fs::remove_file(&path).unwrap();
        let err = b.connect(&path).unwrap_err();
        assert_eq!(err.raw_os_error(), Some(libc::ENOENT));
        let long = d.join("x".repeat(120));
        let err = b.connect(&long).unwrap_err();
        assert_eq!(err.raw_os_error(), Some(libc::ENAMETOOLONG));
        let _ = std::fs::remove_dir_all(&d);
    }

    /// The address handed to `connect` is as long as the path and its NUL:
    /// a path of the most bytes `sun_path` holds (107) connects.
    #[test]
    fn a_path_as_long_as_sun_path_holds_connects() {
        let d = dir("longest");
        // sun_path's 108 bytes, less the NUL and the '/' before the name.
        let room = 108 - 2 - d.as_os_str().len();
        let path = d.join("p".repeat(room));
        assert_eq!(path.as_os_str().len(), 107);
        let l = bind_listener(&path).unwrap();
        let mut b = UnixBackend;
        let _ours = b.connect(&path).unwrap();
        assert!(b.accept(&l).is_ok());
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn a_connect_to_a_full_backlog_fails_at_once_instead_of_blocking() {
        let d = dir("backlog");
        let path = d.join("full.sock");
        let _ = std::fs::remove_file(&path);
        let _l = bind_listener(&path).unwrap();
        let mut b = UnixBackend;
        let mut held = Vec::new();
        let err = loop {
            match b.connect(&path) {
                Ok(s) => held.push(s),
                Err(e) => break e,
            }
            assert!(held.len() < 100_000, "the backlog never filled");
        };
        assert_eq!(err.raw_os_error(), Some(libc::EAGAIN));
        assert!(!held.is_empty());
        let _ = std::fs::remove_dir_all(&d);
    }
}
