// SPDX-License-Identifier: Apache-2.0
//! Backends of the network device: the TAP device and unprivileged sockets.
//!
//! The datapath does `readv`/`writev` directly on the backend's file
//! descriptor (see `rxtx`), so a backend is just a non-blocking fd that keeps
//! frame boundaries and carries the 12-byte `virtio_net_hdr_v1` in front of
//! every frame (virtio 1.1 §5.1.6). A TAP opened with IFF_VNET_HDR and
//! TUNSETVNETHDRSZ 12 does exactly that; an `AF_UNIX` datagram or
//! `SOCK_SEQPACKET` socket does it trivially (the peer sees the header as part
//! of the message), which lets tests and benchmarks run without privileges.
//!
//! This module is one of the few allowed to use `unsafe`: the TUN ioctls and
//! `socketpair`/`fcntl` have no safe wrapper in our dependencies.
#![allow(unsafe_code)]

use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::fs::OpenOptionsExt;
use std::os::unix::net::UnixDatagram;

use super::iov::IoVecs;
use super::VNET_HDR_LEN;

/// Errors of the TAP and socket backends.
#[derive(Debug, thiserror::Error)]
pub enum TapError {
    /// `/dev/net/tun` could not be opened.
    #[error("cannot open /dev/net/tun")]
    OpenTun(#[source] io::Error),
    /// The interface name does not fit `IFNAMSIZ` or contains a NUL byte.
    #[error("invalid TAP name {0:?}: 1 to 15 bytes without NUL")]
    InvalidName(String),
    /// TUNSETIFF failed (no such TAP and no right to create one, or the TAP
    /// is attached to another process).
    #[error("cannot attach to TAP {name:?}")]
    SetIff {
        /// The requested interface name.
        name: String,
        /// The ioctl error.
        #[source]
        source: io::Error,
    },
    /// TUNSETVNETHDRSZ failed.
    #[error("cannot set the vnet header size of the TAP")]
    SetVnetHdrSize(#[source] io::Error),
    /// TUNSETOFFLOAD failed.
    #[error("cannot set TAP offloads {flags:#x}")]
    SetOffload {
        /// The TUN_F_* flags requested.
        flags: u32,
        /// The ioctl error.
        #[source]
        source: io::Error,
    },
    /// A socket or fd flag operation failed.
    #[error("socket backend setup failed")]
    Socket(#[source] io::Error),
}

/// A frame source and sink for the network device.
///
/// The fd must keep frame boundaries: one `readv` returns one frame and one
/// `writev` sends one, each starting with the 12-byte vnet header.
/// `Net::with_backend` puts the fd in non-blocking mode.
///
/// The device polls the fd for readiness and moves frames through
/// [`recv_frame`](Self::recv_frame) and [`send_frame`](Self::send_frame),
/// which default to one `readv`/`writev` on it; a test backend overrides them
/// to inject faults (EAGAIN, EIO, short reads and writes...).
pub trait NetBackend: AsRawFd + Send {
    /// Tells the backend which offloads the guest accepts on receive, as
    /// TUN_F_* flags (`libc::TUN_F_CSUM`, ...). Backends without offload
    /// state accept anything.
    fn set_offload(&self, _flags: u32) -> Result<(), TapError> {
        Ok(())
    }

    /// Receives one frame into `bufs`; returns its length (EAGAIN:
    /// `ErrorKind::WouldBlock` when there is none).
    #[inline]
    fn recv_frame(&self, bufs: IoVecs<'_>) -> io::Result<usize> {
        bufs.readv(self.as_raw_fd())
    }

    /// Sends the bytes of `bufs` as one frame; returns the bytes taken.
    #[inline]
    fn send_frame(&self, bufs: IoVecs<'_>) -> io::Result<usize> {
        bufs.writev(self.as_raw_fd())
    }
}

// `struct ifreq` as TUNSETIFF reads it: the name, then a union of which only
// the short `ifr_flags` is used here; padded to the kernel's 40 bytes.
#[repr(C)]
struct IfReqFlags {
    name: [u8; libc::IFNAMSIZ],
    flags: libc::c_short,
    _pad: [u8; 22],
}

/// A TAP interface opened with IFF_TAP | IFF_NO_PI | IFF_VNET_HDR, a 12-byte
/// vnet header and O_NONBLOCK.
#[derive(Debug)]
pub struct Tap {
    file: File,
    if_name: String,
}

impl Tap {
    /// Opens the TAP `name`, creating it if it does not exist (which needs
    /// CAP_NET_ADMIN; attaching to an existing TAP owned by us does not).
    pub fn open_named(name: &str) -> Result<Tap, TapError> {
        let bytes = name.as_bytes();
        if bytes.is_empty() || bytes.len() >= libc::IFNAMSIZ || bytes.contains(&0) {
            return Err(TapError::InvalidName(name.to_string()));
        }
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC)
            .open("/dev/net/tun")
            .map_err(TapError::OpenTun)?;

        let mut ifr = IfReqFlags {
            name: [0; libc::IFNAMSIZ],
            flags: (libc::IFF_TAP | libc::IFF_NO_PI | libc::IFF_VNET_HDR) as libc::c_short,
            _pad: [0; 22],
        };
        ifr.name[..bytes.len()].copy_from_slice(bytes);
        // SAFETY: `file` is an open /dev/net/tun fd; TUNSETIFF reads and
        // writes a `struct ifreq` (40 bytes on Linux), and `ifr` is a live,
        // exclusively borrowed 40-byte repr(C) value with the same layout for
        // the name and flags fields. The kernel keeps no reference to it.
        let ret = unsafe { libc::ioctl(file.as_raw_fd(), libc::TUNSETIFF as _, &mut ifr) };
        if ret < 0 {
            return Err(TapError::SetIff {
                name: name.to_string(),
                source: io::Error::last_os_error(),
            });
        }

        let hdr_len: libc::c_int = VNET_HDR_LEN as libc::c_int;
        // SAFETY: TUNSETVNETHDRSZ reads one `int` through the pointer, which
        // points to a live local; the fd is the TAP attached above.
        let ret = unsafe { libc::ioctl(file.as_raw_fd(), libc::TUNSETVNETHDRSZ as _, &hdr_len) };
        if ret < 0 {
            return Err(TapError::SetVnetHdrSize(io::Error::last_os_error()));
        }

        // The kernel may have completed a name pattern such as "tap%d".
        let len = ifr
            .name
            .iter()
            .position(|&b| b == 0)
            .unwrap_or(ifr.name.len());
        let if_name = String::from_utf8_lossy(&ifr.name[..len]).into_owned();
        Ok(Tap { file, if_name })
    }

    /// The interface name the kernel attached us to.
    pub fn if_name(&self) -> &str {
        &self.if_name
    }
}

impl AsRawFd for Tap {
    fn as_raw_fd(&self) -> RawFd {
        self.file.as_raw_fd()
    }
}

impl NetBackend for Tap {
    fn set_offload(&self, flags: u32) -> Result<(), TapError> {
        // TUNSETOFFLOAD takes the flags by value, as an unsigned long.
        // SAFETY: the ioctl reads no memory (the argument is passed by
        // value) and the fd is our TAP.
        let ret = unsafe {
            libc::ioctl(
                self.file.as_raw_fd(),
                libc::TUNSETOFFLOAD as _,
                libc::c_ulong::from(flags),
            )
        };
        if ret < 0 {
            return Err(TapError::SetOffload {
                flags,
                source: io::Error::last_os_error(),
            });
        }
        Ok(())
    }
}

impl NetBackend for UnixDatagram {}

/// One end of an `AF_UNIX`/`SOCK_SEQPACKET` socket pair: reliable, ordered
/// and frame-preserving, the unprivileged stand-in for a TAP in tests and
/// benchmarks. Sends block (or return EAGAIN) when the peer does not read,
/// which exercises the device's TX back-pressure path.
#[derive(Debug)]
pub struct SeqPacket {
    fd: OwnedFd,
}

impl SeqPacket {
    /// Creates a connected pair; both ends start in blocking mode.
    pub fn pair() -> Result<(SeqPacket, SeqPacket), TapError> {
        let mut fds = [-1 as libc::c_int; 2];
        // SAFETY: socketpair writes two fds into the 2-element array we pass.
        let ret = unsafe {
            libc::socketpair(
                libc::AF_UNIX,
                libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC,
                0,
                fds.as_mut_ptr(),
            )
        };
        if ret < 0 {
            return Err(TapError::Socket(io::Error::last_os_error()));
        }
        // SAFETY: on success both fds are new, open and owned by nobody else.
        let (a, b) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
        Ok((SeqPacket { fd: a }, SeqPacket { fd: b }))
    }

    /// Another handle to the same socket (for a sender or receiver thread).
    pub fn try_clone(&self) -> Result<SeqPacket, TapError> {
        Ok(SeqPacket {
            fd: self.fd.try_clone().map_err(TapError::Socket)?,
        })
    }

    /// Sends one message (a vnet header followed by a frame, for the device).
    pub fn send(&self, buf: &[u8]) -> io::Result<usize> {
        // SAFETY: `buf` is a live slice of `buf.len()` readable bytes.
        let ret = unsafe {
            libc::send(
                self.fd.as_raw_fd(),
                buf.as_ptr().cast(),
                buf.len(),
                libc::MSG_NOSIGNAL,
            )
        };
        if ret < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(ret as usize)
    }

    /// Receives one message into `buf`; a longer message is truncated.
    pub fn recv(&self, buf: &mut [u8]) -> io::Result<usize> {
        // SAFETY: `buf` is a live, exclusively borrowed slice of
        // `buf.len()` writable bytes.
        let ret = unsafe { libc::recv(self.fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0) };
        if ret < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(ret as usize)
    }

    /// Switches the socket between blocking and non-blocking mode.
    pub fn set_nonblocking(&self, nonblocking: bool) -> Result<(), TapError> {
        set_nonblocking(self.fd.as_raw_fd(), nonblocking)
    }

    /// Sets SO_SNDBUF (the kernel doubles it and enforces a minimum); a
    /// small value makes the device hit EAGAIN quickly in tests.
    pub fn set_send_buffer(&self, bytes: usize) -> Result<(), TapError> {
        let val = libc::c_int::try_from(bytes).unwrap_or(libc::c_int::MAX);
        // SAFETY: SO_SNDBUF reads one `int` through the pointer, which points
        // to a live local whose size we pass.
        let ret = unsafe {
            libc::setsockopt(
                self.fd.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_SNDBUF,
                (&val as *const libc::c_int).cast(),
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            )
        };
        if ret < 0 {
            return Err(TapError::Socket(io::Error::last_os_error()));
        }
        Ok(())
    }
}

impl AsRawFd for SeqPacket {
    fn as_raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}

impl NetBackend for SeqPacket {}

/// Sets or clears O_NONBLOCK on `fd`.
pub(crate) fn set_nonblocking(fd: RawFd, nonblocking: bool) -> Result<(), TapError> {
    // SAFETY: F_GETFL only reads the fd's flags; an invalid fd yields EBADF.
    let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    if flags < 0 {
        return Err(TapError::Socket(io::Error::last_os_error()));
    }
    let new = if nonblocking {
        flags | libc::O_NONBLOCK
    } else {
        flags & !libc::O_NONBLOCK
    };
    if new != flags {
        // SAFETY: F_SETFL only changes the fd's status flags.
        let ret = unsafe { libc::fcntl(fd, libc::F_SETFL, new) };
        if ret < 0 {
            return Err(TapError::Socket(io::Error::last_os_error()));
        }
    }
    Ok(())
}

/// Moves the calling thread into a fresh network namespace, for tests that
/// need a real TAP: whatever they create or send stays inside it and
/// disappears with the thread. Returns false (after printing why) when the
/// test must be skipped: not root, no /dev/net/tun, or unshare refused.
#[cfg(test)]
pub(crate) fn enter_private_netns(test: &str) -> bool {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("SKIP {test}: needs root (CAP_NET_ADMIN) to create a TAP");
        return false;
    }
    if !std::path::Path::new("/dev/net/tun").exists() {
        eprintln!("SKIP {test}: /dev/net/tun is missing");
        return false;
    }
    // SAFETY: unshare only changes the namespaces of the calling thread;
    // each test runs on its own thread, so no other test is affected.
    if unsafe { libc::unshare(libc::CLONE_NEWNET) } != 0 {
        eprintln!(
            "SKIP {test}: unshare(CLONE_NEWNET) failed: {}",
            io::Error::last_os_error()
        );
        return false;
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_invalid_names() {
        assert!(matches!(Tap::open_named(""), Err(TapError::InvalidName(_))));
        assert!(matches!(
            Tap::open_named("a-name-that-is-too-long"),
            Err(TapError::InvalidName(_))
        ));
        assert!(matches!(
            Tap::open_named("a\0b"),
            Err(TapError::InvalidName(_))
        ));
    }

    #[test]
    fn test_seqpacket_keeps_boundaries() {
        let (a, b) = SeqPacket::pair().unwrap();
        a.send(&[1, 2, 3]).unwrap();
        a.send(&[4; 10]).unwrap();
        let mut buf = [0u8; 64];
        assert_eq!(b.recv(&mut buf).unwrap(), 3);
        assert_eq!(&buf[..3], &[1, 2, 3]);
        assert_eq!(b.recv(&mut buf).unwrap(), 10);
        b.set_nonblocking(true).unwrap();
        let err = b.recv(&mut buf).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::WouldBlock);
    }

    /// Opening a real TAP needs root (CAP_NET_ADMIN) and /dev/net/tun; the
    /// test runs inside a private network namespace so the interface it
    /// creates is invisible to the host and disappears with the namespace.
    #[test]
    fn test_real_tap_open_and_offload() {
        if !enter_private_netns("test_real_tap_open_and_offload") {
            return;
        }
        let tap = Tap::open_named("mvtest%d").unwrap();
        assert!(tap.if_name().starts_with("mvtest"), "{}", tap.if_name());
        tap.set_offload(libc::TUN_F_CSUM | libc::TUN_F_TSO4 | libc::TUN_F_TSO6)
            .unwrap();
        tap.set_offload(0).unwrap();
        // A nonsense flag is refused by the kernel and reported.
        assert!(matches!(
            tap.set_offload(0x8000_0000),
            Err(TapError::SetOffload { .. })
        ));
        // Non-blocking: nothing to read yet.
        let mut buf = [0u8; 64];
        let err = nix_read(tap.as_raw_fd(), &mut buf).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::WouldBlock);
    }

    fn nix_read(fd: RawFd, buf: &mut [u8]) -> io::Result<usize> {
        // SAFETY: `buf` is a live, exclusively borrowed slice.
        let r = unsafe { libc::read(fd, buf.as_mut_ptr().cast(), buf.len()) };
        if r < 0 {
            Err(io::Error::last_os_error())
        } else {
            Ok(r as usize)
        }
    }
}
