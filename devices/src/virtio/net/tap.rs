// SPDX-License-Identifier: Apache-2.0
//! Backends of the network device: the TAP device and unprivileged sockets.
//!
//! The datapath does `readv`/`writev` directly on the backend's file
//! descriptor (see `pass`), so a backend is just a non-blocking fd that keeps
//! frame boundaries and carries the 12-byte `virtio_net_hdr_v1` in front of
//! every frame (virtio 1.1 §5.1.6). A TAP opened with IFF_VNET_HDR and
//! TUNSETVNETHDRSZ 12 does exactly that; an `AF_UNIX` datagram or
//! `SOCK_SEQPACKET` socket does it trivially (the peer sees the header as part
//! of the message), which lets tests and benchmarks run without privileges.
//!
//! A [`Tap`] is opened by name ([`Tap::open_named`], which creates a missing
//! interface when the process may) or adopted from a descriptor a privileged
//! launcher opened ([`Tap::from_fd`], Cloud Hypervisor's `fd=`). The same type
//! serves the VMM and the datapath benchmark's raw TAP loops.
//!
//! This module is one of the few allowed to use `unsafe`: the TUN and
//! interface ioctls (issued through vmm-sys-util's helpers) and
//! `socketpair`/`fcntl` have no safe wrapper in our dependencies.
#![allow(unsafe_code)]

use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::fs::OpenOptionsExt;
use std::os::unix::net::UnixDatagram;

use vmm_sys_util::ioctl::{ioctl_with_mut_ref, ioctl_with_ref, ioctl_with_val};

use super::VNET_HDR_LEN;
use crate::virtio::iov::IoVecs;

/// The TUN ioctl numbers (linux/if_tun.h), built with vmm-sys-util's macros.
mod ioctls {
    use std::os::raw::{c_int, c_uint};

    const TUNTAP: c_uint = b'T' as c_uint;
    vmm_sys_util::ioctl_iow_nr!(TUNSETIFF, TUNTAP, 202, c_int);
    vmm_sys_util::ioctl_iow_nr!(TUNSETOFFLOAD, TUNTAP, 208, c_uint);
    vmm_sys_util::ioctl_ior_nr!(TUNGETIFF, TUNTAP, 210, c_uint);
    vmm_sys_util::ioctl_iow_nr!(TUNSETVNETHDRSZ, TUNTAP, 216, c_int);
    vmm_sys_util::ioctl_ior_nr!(TUNGETSNDBUF, TUNTAP, 211, c_int);
    #[cfg(test)]
    vmm_sys_util::ioctl_iow_nr!(TUNSETSNDBUF, TUNTAP, 212, c_int);
}

/// The flags every TAP we use carries: Ethernet frames, no packet-info
/// prefix, a vnet header in front of every frame.
const TAP_FLAGS: libc::c_int = libc::IFF_TAP | libc::IFF_NO_PI | libc::IFF_VNET_HDR;

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
    /// A descriptor handed over as a TAP is not one.
    #[error("fd {fd} is not a TAP attached to an interface")]
    NotATap {
        /// The descriptor.
        fd: RawFd,
        /// The ioctl error.
        #[source]
        source: io::Error,
    },
    /// A TAP descriptor opened without the flags the device needs.
    #[error(
        "TAP {name:?} (fd {fd}) was opened with flags {flags:#x}; minivmm needs \
         IFF_TAP | IFF_NO_PI | IFF_VNET_HDR ({TAP_FLAGS:#x}) and no IFF_MULTI_QUEUE"
    )]
    WrongFlags {
        /// The descriptor.
        fd: RawFd,
        /// The interface it is attached to.
        name: String,
        /// The flags TUNGETIFF reported.
        flags: i32,
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
    /// An interface query (flags, MTU) failed.
    #[error("cannot query interface {name:?}")]
    Query {
        /// The interface.
        name: String,
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

    /// Whether the device may write TX frames to the fd itself, in batches
    /// through io_uring (`IoEngine::Async`), instead of calling
    /// [`send_frame`](Self::send_frame) for each. The writes of a batch are
    /// independent, so only a backend that never pushes back (EAGAIN) may
    /// say yes: otherwise a frame after a refused one could overtake it. A
    /// backend that overrides `send_frame` (to inject faults) must say no
    /// too. The default is no.
    fn batched_writes(&self) -> bool {
        false
    }
}

/// `struct ifreq` (linux/if.h): the name, then a 24-byte union of which
/// we use the short `ifr_flags` (TUNSETIFF, TUNGETIFF, SIOCGIFFLAGS) or the
/// int `ifr_mtu` (SIOCGIFMTU), both at its start; 40 bytes on 64-bit Linux.
#[repr(C)]
#[derive(Default)]
struct IfReq {
    name: [u8; libc::IFNAMSIZ],
    data: [u8; 24],
}

impl IfReq {
    fn named(name: &str) -> Result<IfReq, TapError> {
        let bytes = name.as_bytes();
        if bytes.is_empty() || bytes.len() >= libc::IFNAMSIZ || bytes.contains(&0) {
            return Err(TapError::InvalidName(name.to_string()));
        }
        let mut ifr = IfReq::default();
        ifr.name[..bytes.len()].copy_from_slice(bytes);
        Ok(ifr)
    }

    fn name(&self) -> String {
        let len = self
            .name
            .iter()
            .position(|&b| b == 0)
            .unwrap_or(self.name.len());
        String::from_utf8_lossy(&self.name[..len]).into_owned()
    }

    fn flags(&self) -> libc::c_int {
        libc::c_int::from(i16::from_ne_bytes([self.data[0], self.data[1]]))
    }

    fn set_flags(&mut self, flags: libc::c_int) {
        // ifr_flags is a C short; every IFF_* flag we set fits.
        self.data[..2].copy_from_slice(&(flags as i16).to_ne_bytes());
    }

    fn int(&self) -> i32 {
        i32::from_ne_bytes([self.data[0], self.data[1], self.data[2], self.data[3]])
    }
}

/// Runs an interface query ioctl (SIOCGIFFLAGS, SIOCGIFMTU) on `name`
/// through a throw-away datagram socket, which needs no privilege.
fn query_interface(name: &str, request: libc::c_ulong) -> Result<IfReq, TapError> {
    let mut ifr = IfReq::named(name)?;
    interface_ioctl(request, &mut ifr).map_err(|source| TapError::Query {
        name: name.to_string(),
        source,
    })?;
    Ok(ifr)
}

/// Runs the interface ioctl `request` (one that reads or writes a
/// `struct ifreq`) on `ifr` through a throw-away datagram socket.
fn interface_ioctl(request: libc::c_ulong, ifr: &mut IfReq) -> io::Result<()> {
    // SAFETY: plain socket(2); the fd is wrapped in an OwnedFd at once.
    let raw = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if raw < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `raw` is a new fd that nothing else owns.
    let sock = unsafe { OwnedFd::from_raw_fd(raw) };
    // SAFETY: the interface ioctls read and write one `struct ifreq`
    // (40 bytes); `ifr` is a live, exclusively borrowed repr(C) value of
    // that size and layout. The kernel keeps no reference to it.
    let ret = unsafe { ioctl_with_mut_ref(&sock, request, ifr) };
    if ret < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
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
    /// A created TAP is not persistent: it disappears with this process.
    pub fn open_named(name: &str) -> Result<Tap, TapError> {
        let mut ifr = IfReq::named(name)?;
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC)
            .open("/dev/net/tun")
            .map_err(TapError::OpenTun)?;
        ifr.set_flags(TAP_FLAGS);
        // SAFETY: `file` is an open /dev/net/tun fd; TUNSETIFF reads and
        // writes a `struct ifreq` (40 bytes), and `ifr` is a live, exclusively
        // borrowed repr(C) value of that size and layout. The kernel keeps no
        // reference to it.
        let ret = unsafe { ioctl_with_mut_ref(&file, ioctls::TUNSETIFF(), &mut ifr) };
        if ret < 0 {
            return Err(TapError::SetIff {
                name: name.to_string(),
                source: io::Error::last_os_error(),
            });
        }
        // The kernel may have completed a name pattern such as "tap%d".
        let tap = Tap {
            file,
            if_name: ifr.name(),
        };
        tap.set_vnet_hdr_size()?;
        Ok(tap)
    }

    /// Adopts a TAP descriptor opened elsewhere (a launcher with the
    /// privileges minivmm should not need). It must be attached to an
    /// interface with IFF_TAP | IFF_NO_PI | IFF_VNET_HDR; the vnet header
    /// size is set here and the descriptor made non-blocking and
    /// close-on-exec.
    pub fn from_fd(fd: OwnedFd) -> Result<Tap, TapError> {
        let raw = fd.as_raw_fd();
        let mut ifr = IfReq::default();
        // SAFETY: TUNGETIFF writes one `struct ifreq` (40 bytes) into `ifr`,
        // a live, exclusively borrowed repr(C) value of that size. On any
        // other kind of fd the kernel refuses the request without writing.
        let ret = unsafe { ioctl_with_mut_ref(&fd, ioctls::TUNGETIFF(), &mut ifr) };
        if ret < 0 {
            return Err(TapError::NotATap {
                fd: raw,
                source: io::Error::last_os_error(),
            });
        }
        let flags = ifr.flags();
        if flags & TAP_FLAGS != TAP_FLAGS || flags & libc::IFF_MULTI_QUEUE != 0 {
            return Err(TapError::WrongFlags {
                fd: raw,
                name: ifr.name(),
                flags,
            });
        }
        // SAFETY: F_SETFD only changes the descriptor flags of a fd we own.
        unsafe { libc::fcntl(raw, libc::F_SETFD, libc::FD_CLOEXEC) };
        set_nonblocking(raw, true)?;
        let tap = Tap {
            file: File::from(fd),
            if_name: ifr.name(),
        };
        tap.set_vnet_hdr_size()?;
        Ok(tap)
    }

    fn set_vnet_hdr_size(&self) -> Result<(), TapError> {
        let hdr_len = VNET_HDR_LEN as libc::c_int;
        // SAFETY: TUNSETVNETHDRSZ reads one `int` through the reference,
        // which points to a live local; the fd is an attached TAP.
        let ret = unsafe { ioctl_with_ref(&self.file, ioctls::TUNSETVNETHDRSZ(), &hdr_len) };
        if ret < 0 {
            return Err(TapError::SetVnetHdrSize(io::Error::last_os_error()));
        }
        Ok(())
    }

    /// The interface name the kernel attached us to.
    pub fn if_name(&self) -> &str {
        &self.if_name
    }

    /// Whether the interface is administratively up (IFF_UP). A TAP that is
    /// down drops every frame the guest sends.
    pub fn is_up(&self) -> Result<bool, TapError> {
        let ifr = query_interface(&self.if_name, libc::SIOCGIFFLAGS as libc::c_ulong)?;
        Ok(ifr.flags() & libc::IFF_UP != 0)
    }

    /// The interface's MTU on the host side.
    pub fn mtu(&self) -> Result<u32, TapError> {
        let ifr = query_interface(&self.if_name, libc::SIOCGIFMTU as libc::c_ulong)?;
        Ok(ifr.int().max(0) as u32)
    }

    /// Whether a network interface called `name` exists in this process's
    /// network namespace (used to say when opening a TAP creates it).
    pub fn exists(name: &str) -> Result<bool, TapError> {
        let ifr = IfReq::named(name)?;
        let cname = std::ffi::CString::new(&ifr.name[..name.len()])
            .map_err(|_| TapError::InvalidName(name.to_string()))?;
        // SAFETY: `cname` is a live NUL-terminated string.
        Ok(unsafe { libc::if_nametoindex(cname.as_ptr()) } != 0)
    }
}

impl Tap {
    /// The TAP's send buffer in bytes (TUNGETSNDBUF); `c_int::MAX` is
    /// unlimited, the default.
    pub fn send_buffer(&self) -> io::Result<libc::c_int> {
        let mut n: libc::c_int = 0;
        // SAFETY: TUNGETSNDBUF writes one int through the pointer, which
        // points to a live local; the fd is our TAP.
        let ret = unsafe { ioctl_with_mut_ref(&self.file, ioctls::TUNGETSNDBUF(), &mut n) };
        if ret < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(n)
    }
}

impl AsRawFd for Tap {
    fn as_raw_fd(&self) -> RawFd {
        self.file.as_raw_fd()
    }
}

impl NetBackend for Tap {
    fn set_offload(&self, flags: u32) -> Result<(), TapError> {
        // SAFETY: TUNSETOFFLOAD takes the flags by value and reads no
        // memory; the fd is our TAP.
        let ret = unsafe {
            ioctl_with_val(
                &self.file,
                ioctls::TUNSETOFFLOAD(),
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

    /// A TAP pushes back only once its send buffer is limited
    /// (TUNSETSNDBUF; unlimited, INT_MAX, is what `/dev/net/tun` gives):
    /// a descriptor from a launcher may come limited.
    fn batched_writes(&self) -> bool {
        match self.send_buffer() {
            Ok(libc::c_int::MAX) => true,
            Ok(n) => {
                log::info!(
                    "virtio-net: TAP {} has a {n}-byte send buffer (TUNSETSNDBUF), so it can \
                     push back: TX writes one frame per system call to keep frames in order",
                    self.if_name
                );
                false
            }
            Err(e) => {
                log::info!(
                    "virtio-net: cannot read TAP {}'s send buffer ({e}): TX writes one frame \
                     per system call",
                    self.if_name
                );
                false
            }
        }
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
    /// The device may batch its writes (see [`SeqPacket::with_batched_writes`]).
    batched: bool,
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
        Ok((
            SeqPacket {
                fd: a,
                batched: false,
            },
            SeqPacket {
                fd: b,
                batched: false,
            },
        ))
    }

    /// Lets the device batch its TX writes on this end (io_uring,
    /// `IoEngine::Async`). A socket pushes back (EAGAIN) once its send
    /// buffer is full, and a frame after a refused one of the same batch
    /// could then overtake it: only for a peer that keeps up (tests and
    /// benchmarks whose peer drains a large buffer).
    pub fn with_batched_writes(mut self) -> Self {
        self.batched = true;
        self
    }

    /// Another handle to the same socket (for a sender or receiver thread).
    pub fn try_clone(&self) -> Result<SeqPacket, TapError> {
        Ok(SeqPacket {
            fd: self.fd.try_clone().map_err(TapError::Socket)?,
            batched: self.batched,
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

impl NetBackend for SeqPacket {
    fn batched_writes(&self) -> bool {
        self.batched
    }
}

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
pub(crate) fn enter_private_netns() -> bool {
    use minivmm_tests::print_skip;
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        print_skip("needs root (CAP_NET_ADMIN) to create a TAP");
        return false;
    }
    if !std::path::Path::new("/dev/net/tun").exists() {
        print_skip("/dev/net/tun is missing");
        return false;
    }
    // SAFETY: unshare only changes the namespaces of the calling thread;
    // each test runs on its own thread, so no other test is affected.
    if unsafe { libc::unshare(libc::CLONE_NEWNET) } != 0 {
        let e = io::Error::last_os_error();
        print_skip(&format!("unshare(CLONE_NEWNET) failed: {e}"));
        return false;
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::virtio::queue::IoSeg;

    /// A new TAP named after `pattern`, in a private network namespace
    /// (see [`enter_private_netns`]); `None` where the test has to skip.
    fn private_tap(pattern: &str) -> Option<Tap> {
        enter_private_netns().then(|| Tap::open_named(pattern).unwrap())
    }

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
        let Some(tap) = private_tap("mvtest%d") else {
            return;
        };
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

    /// A TAP is batched only while it cannot push back: a fresh one has an
    /// unlimited send buffer; once limited (TUNSETSNDBUF, as a launcher may
    /// hand it over) a write can meet EAGAIN, and a batch could reorder.
    #[test]
    fn test_real_tap_is_batched_only_with_an_unlimited_send_buffer() {
        let Some(tap) = private_tap("mvsnd%d") else {
            return;
        };
        assert_eq!(tap.send_buffer().unwrap(), libc::c_int::MAX);
        assert!(tap.batched_writes());
        let limit: libc::c_int = 65536;
        // SAFETY: TUNSETSNDBUF reads one int through the pointer, which
        // points to a live local; the fd is our TAP.
        let ret = unsafe { ioctl_with_ref(&tap.file, ioctls::TUNSETSNDBUF(), &limit) };
        assert_eq!(ret, 0, "{}", io::Error::last_os_error());
        assert_eq!(tap.send_buffer().unwrap(), limit);
        assert!(!tap.batched_writes());
    }

    /// Why the device puts a host byte after the guest buffers of every
    /// RX read, even from a TAP: a read into buffers shorter than the frame
    /// returns only what fit (`tun_chr_read_iter` caps `tun_put_user`'s
    /// full length at the buffer's), through `read` (one buffer) and
    /// `readv` (several) alike, so without that byte a truncated frame
    /// would look like one that fills the buffers exactly.
    #[test]
    fn test_real_tap_read_returns_only_what_fit() {
        let Some(tap) = private_tap("mvlen%d") else {
            return;
        };
        let mut ifr = query_interface(tap.if_name(), libc::SIOCGIFFLAGS as libc::c_ulong).unwrap();
        ifr.set_flags(ifr.flags() | libc::IFF_UP);
        interface_ioctl(libc::SIOCSIFFLAGS as libc::c_ulong, &mut ifr).unwrap();
        assert!(tap.is_up().unwrap());

        // A packet socket on the interface: what it sends, the TAP reads.
        // SAFETY: plain socket(2); wrapped in an OwnedFd at once.
        let raw = unsafe { libc::socket(libc::AF_PACKET, libc::SOCK_RAW | libc::SOCK_CLOEXEC, 0) };
        assert!(raw >= 0, "{}", io::Error::last_os_error());
        // SAFETY: `raw` is a new fd nothing else owns.
        let pkt = unsafe { OwnedFd::from_raw_fd(raw) };
        let name = std::ffi::CString::new(tap.if_name()).unwrap();
        // SAFETY: `name` is a live NUL-terminated string.
        let ifindex = unsafe { libc::if_nametoindex(name.as_ptr()) };
        assert_ne!(ifindex, 0);
        // SAFETY: an all-zero sockaddr_ll is valid; the fields follow.
        let mut to: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
        to.sll_family = libc::AF_PACKET as u16;
        to.sll_ifindex = ifindex as i32;
        to.sll_halen = 6;
        to.sll_addr[..6].copy_from_slice(&[0xff; 6]);
        const ETHERTYPE: [u8; 2] = [0x88, 0xb5]; // local experimental
        let mut frame = vec![0xffu8; 6];
        frame.extend([0x02, 0, 0, 0, 0, 1]);
        frame.extend(ETHERTYPE);
        frame.extend((0..186u8).map(|i| i.wrapping_mul(7)));
        let send = || {
            // SAFETY: `frame` and `to` are live for the call, with their
            // lengths passed.
            let ret = unsafe {
                libc::sendto(
                    pkt.as_raw_fd(),
                    frame.as_ptr().cast(),
                    frame.len(),
                    0,
                    (&to as *const libc::sockaddr_ll).cast(),
                    std::mem::size_of::<libc::sockaddr_ll>() as libc::socklen_t,
                )
            };
            assert_eq!(ret, frame.len() as isize, "{}", io::Error::last_os_error());
        };
        let whole = VNET_HDR_LEN + frame.len();
        // Reads our frame into `lens`-long buffers, skipping what the
        // kernel sends on its own (IPv6 autoconfiguration); returns the
        // length the read reported and the bytes the buffers got.
        let read_ours = |lens: &[usize]| -> (usize, Vec<u8>) {
            send();
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
            loop {
                assert!(std::time::Instant::now() < deadline, "our frame never came");
                let mut bufs: Vec<Vec<u8>> = lens.iter().map(|&l| vec![0u8; l]).collect();
                let segs: Vec<IoSeg> = bufs
                    .iter_mut()
                    // SAFETY: each buffer is live and not otherwise borrowed
                    // until the segments are dropped after the read.
                    .map(|b| unsafe { IoSeg::new(b.as_mut_ptr() as usize, b.len()) })
                    .collect();
                match tap.recv_frame(IoVecs::guest(&segs)) {
                    Ok(n) => {
                        let got: Vec<u8> = bufs.concat();
                        if got[VNET_HDR_LEN + 12..VNET_HDR_LEN + 14] == ETHERTYPE {
                            return (n, got);
                        }
                    }
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                        std::thread::sleep(std::time::Duration::from_millis(5));
                    }
                    Err(e) => panic!("TAP read: {e}"),
                }
            }
        };
        let (n, got) = read_ours(&[100]);
        assert_eq!(n, 100, "read(2) of a {whole}-byte frame into 100 bytes");
        assert_eq!(got[VNET_HDR_LEN..], frame[..100 - VNET_HDR_LEN]);
        let (n, _) = read_ours(&[40, 60]);
        assert_eq!(
            n, 100,
            "readv(2) of a {whole}-byte frame into 40 + 60 bytes"
        );
        // With one byte more than the buffers, as the device reads, the
        // truncation shows.
        let (n, _) = read_ours(&[40, 60, 1]);
        assert_eq!(n, 101);
        let (n, got) = read_ours(&[whole, 1]);
        assert_eq!(n, whole);
        assert_eq!(got[VNET_HDR_LEN..whole], frame[..]);
    }

    #[test]
    fn test_from_fd_refuses_what_is_not_a_tap() {
        let (a, _b) = SeqPacket::pair().unwrap();
        let fd = a.fd.as_raw_fd();
        let err = Tap::from_fd(a.fd).unwrap_err();
        assert!(
            matches!(err, TapError::NotATap { fd: f, .. } if f == fd),
            "{err}"
        );
        assert!(err.to_string().contains("not a TAP"), "{err}");
    }

    /// Adopting a TAP fd, the launcher's way: a fd opened with the right
    /// flags is taken over (vnet header size set, non-blocking), one opened
    /// without IFF_VNET_HDR is refused naming the flags; the interface's
    /// state and MTU are read back.
    #[test]
    fn test_real_tap_from_fd_and_queries() {
        if !enter_private_netns() {
            return;
        }
        let open = |flags: libc::c_int| -> (OwnedFd, String) {
            let file = OpenOptions::new()
                .read(true)
                .write(true)
                .open("/dev/net/tun")
                .unwrap();
            let mut ifr = IfReq::named("mvfd%d").unwrap();
            ifr.set_flags(flags);
            // SAFETY: as in `Tap::open_named`.
            let ret = unsafe { ioctl_with_mut_ref(&file, ioctls::TUNSETIFF(), &mut ifr) };
            assert_eq!(ret, 0, "{}", io::Error::last_os_error());
            (OwnedFd::from(file), ifr.name())
        };
        let (fd, name) = open(TAP_FLAGS);
        assert!(Tap::exists(&name).unwrap());
        assert!(!Tap::exists("mvnosuch0").unwrap());
        let tap = Tap::from_fd(fd).unwrap();
        assert_eq!(tap.if_name(), name);
        assert!(!tap.is_up().unwrap(), "a new TAP is down");
        assert_eq!(tap.mtu().unwrap(), 1500);
        // Non-blocking: a read with nothing queued returns at once. Asked
        // while the link is down: once up, the kernel's own IPv6 packets
        // (router solicitation, MLD) may reach the TAP at any moment.
        let mut buf = [0u8; 64];
        let err = nix_read(tap.as_raw_fd(), &mut buf).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::WouldBlock);
        let st = std::process::Command::new("ip")
            .args(["link", "set", "dev", &name, "up", "mtu", "9000"])
            .status();
        if st.is_ok_and(|s| s.success()) {
            assert!(tap.is_up().unwrap());
            assert_eq!(tap.mtu().unwrap(), 9000);
        }

        let (fd, name) = open(libc::IFF_TAP | libc::IFF_NO_PI);
        let err = Tap::from_fd(fd).unwrap_err();
        assert!(
            matches!(&err, TapError::WrongFlags { name: n, .. } if *n == name),
            "{err}"
        );
        assert!(err.to_string().contains("IFF_VNET_HDR"), "{err}");
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
