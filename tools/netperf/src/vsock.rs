// SPDX-License-Identifier: Apache-2.0
//! vsock connections for the VSOCK tests, both ways a program reaches a vsock port:
//!
//! - `AF_VSOCK` ([`VsockPeer::Cid`], [`VsockListener::bind_vsock`]): inside a guest, to the
//!   host (CID 2) or listening for the host; std has no such socket, hence this module's
//!   `unsafe` (`socket`, `bind`, `listen`, `accept4`, `connect`, `getsockname` on
//!   `sockaddr_vm`);
//! - a Firecracker-style VMM's Unix sockets, on the host: to reach the guest's port P a
//!   program connects to the VMM's `uds_path`, writes `CONNECT P\n` and reads `OK <its port>\n`
//!   ([`VsockPeer::Uds`]); the guest's connections to the host's port P arrive on the Unix
//!   socket `<uds_path>_P` ([`VsockListener::bind_path`]).
//!
//! Every connection is held as a `UnixStream`: an `AF_VSOCK` descriptor takes the same
//! socket-layer calls (read, write, `SO_RCVTIMEO`/`SO_SNDTIMEO`, shutdown, dup), and nothing
//! here asks it for a Unix address.
#![allow(unsafe_code)]

use std::io::{self, Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// The host's CID (virtio 1.2 §5.10.4).
pub const HOST_CID: u32 = libc::VMADDR_CID_HOST;
/// Longest `OK <port>\n` line a VMM answers with (`OK 4294967295\n` is 14 bytes).
const MAX_OK_LINE: usize = 32;
/// Ports tried before giving up on binding `<base>_<port>`.
const PATH_PORT_TRIES: u32 = 64;

/// Where a VSOCK test's connections go.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum VsockPeer {
    /// `AF_VSOCK` to this CID (a guest's client reaches the host at 2).
    Cid(u32),
    /// A Firecracker-style VMM's Unix socket (`uds_path`) and its `CONNECT` protocol.
    Uds(PathBuf),
}

impl VsockPeer {
    /// A connection to vsock port `port`, set up within `timeout`.
    pub fn connect(&self, port: u32, timeout: Duration) -> io::Result<UnixStream> {
        match self {
            VsockPeer::Cid(cid) => connect_cid(*cid, port),
            VsockPeer::Uds(path) => connect_uds(path, port, timeout),
        }
    }

    /// The peer in words, for banners and errors.
    pub fn describe(&self) -> String {
        match self {
            VsockPeer::Cid(cid) => format!("vsock CID {cid}"),
            VsockPeer::Uds(path) => format!("vsock through {}", path.display()),
        }
    }
}

fn cvt(r: libc::c_int) -> io::Result<libc::c_int> {
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

fn vsock_socket() -> io::Result<OwnedFd> {
    // SAFETY: socket(2) takes integers only.
    let fd =
        cvt(unsafe { libc::socket(libc::AF_VSOCK, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0) })?;
    // SAFETY: `fd` was just made and nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

fn sockaddr(cid: u32, port: u32) -> libc::sockaddr_vm {
    // SAFETY: sockaddr_vm is plain data; all zeros is a valid value.
    let mut a: libc::sockaddr_vm = unsafe { std::mem::zeroed() };
    a.svm_family = libc::AF_VSOCK as libc::sa_family_t;
    a.svm_cid = cid;
    a.svm_port = port;
    a
}

const SOCKADDR_VM_LEN: libc::socklen_t = std::mem::size_of::<libc::sockaddr_vm>() as _;

/// The local address of a vsock socket: (CID, port).
fn local_addr(fd: RawFd) -> io::Result<(u32, u32)> {
    let mut a = sockaddr(0, 0);
    let mut len = SOCKADDR_VM_LEN;
    // SAFETY: getsockname writes at most `len` bytes into `a`, a live sockaddr_vm of that size.
    cvt(unsafe { libc::getsockname(fd, (&mut a as *mut libc::sockaddr_vm).cast(), &mut len) })?;
    Ok((a.svm_cid, a.svm_port))
}

/// An `AF_VSOCK` connection to `cid`:`port` (the kernel's connect time-out, 2 s, applies).
pub fn connect_cid(cid: u32, port: u32) -> io::Result<UnixStream> {
    let fd = vsock_socket()?;
    let a = sockaddr(cid, port);
    // SAFETY: `a` is a sockaddr_vm that lives across the call, of the length given.
    cvt(unsafe {
        libc::connect(
            fd.as_raw_fd(),
            (&a as *const libc::sockaddr_vm).cast(),
            SOCKADDR_VM_LEN,
        )
    })?;
    Ok(UnixStream::from(fd))
}

/// A connection to the guest's vsock port `port` through the VMM's Unix socket at `path`:
/// `CONNECT port\n`, then `OK <n>\n` read a byte at a time (nothing after it is consumed).
/// A VMM that closes the connection instead (nothing listens on that port in the guest)
/// is `ConnectionRefused`.
pub fn connect_uds(path: &Path, port: u32, timeout: Duration) -> io::Result<UnixStream> {
    let mut s = UnixStream::connect(path)?;
    s.set_read_timeout(Some(timeout.max(Duration::from_millis(1))))?;
    s.set_write_timeout(Some(timeout.max(Duration::from_millis(1))))?;
    s.write_all(format!("CONNECT {port}\n").as_bytes())?;
    let mut line = Vec::new();
    let mut b = [0u8; 1];
    while line.last() != Some(&b'\n') {
        match s.read(&mut b) {
            Ok(0) => {
                return Err(io::Error::new(
                    io::ErrorKind::ConnectionRefused,
                    format!("the VMM closed the connection: nothing listens on vsock port {port}"),
                ))
            }
            Ok(_) => line.push(b[0]),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
        if line.len() > MAX_OK_LINE {
            break;
        }
    }
    let ok = std::str::from_utf8(&line)
        .ok()
        .and_then(|l| l.strip_prefix("OK "))
        .and_then(|l| l.strip_suffix('\n'))
        .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()));
    if !ok {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!(
                "the VMM answered {:?} to CONNECT {port}, not OK <port>",
                String::from_utf8_lossy(&line)
            ),
        ));
    }
    Ok(s)
}

/// Where a server takes vsock connections (see the module doc).
#[derive(Debug)]
pub enum VsockListener {
    /// An `AF_VSOCK` listener on a port of every CID this machine has.
    Vsock {
        /// The socket.
        fd: OwnedFd,
        /// Its port.
        port: u32,
    },
    /// The Unix socket `<base>_<port>` (removed when dropped).
    Path {
        /// The listener.
        listener: UnixListener,
        /// Its path.
        path: PathBuf,
        /// Its port.
        port: u32,
    },
}

impl VsockListener {
    /// Listens on `AF_VSOCK` port `port` (`None`: a port the kernel picks).
    pub fn bind_vsock(port: Option<u32>) -> io::Result<VsockListener> {
        let fd = vsock_socket()?;
        let a = sockaddr(libc::VMADDR_CID_ANY, port.unwrap_or(libc::VMADDR_PORT_ANY));
        // SAFETY: `a` is a sockaddr_vm that lives across the call, of the length given.
        cvt(unsafe {
            libc::bind(
                fd.as_raw_fd(),
                (&a as *const libc::sockaddr_vm).cast(),
                SOCKADDR_VM_LEN,
            )
        })?;
        // SAFETY: listen(2) takes integers only.
        cvt(unsafe { libc::listen(fd.as_raw_fd(), 64) })?;
        let (_, port) = local_addr(fd.as_raw_fd())?;
        Ok(VsockListener::Vsock { fd, port })
    }

    /// Listens on the Unix socket `<base>_<port>`, the host's side of a guest's connections
    /// to the host's port through a Firecracker-style VMM (`None`: the first free port above
    /// 1023 from a clock-seeded start).
    pub fn bind_path(base: &Path, port: Option<u32>) -> io::Result<VsockListener> {
        let bind = |port: u32| {
            let mut p = base.as_os_str().to_owned();
            p.push(format!("_{port}"));
            let path = PathBuf::from(p);
            UnixListener::bind(&path).map(|listener| VsockListener::Path {
                listener,
                path,
                port,
            })
        };
        if let Some(port) = port {
            return bind(port);
        }
        let seed = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        let mut last = io::Error::from(io::ErrorKind::AddrInUse);
        for i in 0..PATH_PORT_TRIES {
            let port = 1024 + (seed.wrapping_add(i.wrapping_mul(7919)) % 60_000);
            match bind(port) {
                Ok(l) => return Ok(l),
                Err(e) => last = e,
            }
        }
        Err(last)
    }

    /// The port connections come to.
    pub fn port(&self) -> u32 {
        match self {
            VsockListener::Vsock { port, .. } | VsockListener::Path { port, .. } => *port,
        }
    }

    /// Waits for one connection.
    pub fn accept(&self) -> io::Result<UnixStream> {
        match self {
            VsockListener::Vsock { fd, .. } => loop {
                // SAFETY: null address pointers: accept4 writes no address.
                let r = unsafe {
                    libc::accept4(
                        fd.as_raw_fd(),
                        std::ptr::null_mut(),
                        std::ptr::null_mut(),
                        libc::SOCK_CLOEXEC,
                    )
                };
                match cvt(r) {
                    // SAFETY: `r` was just made by accept4 and nothing else owns it.
                    Ok(r) => return Ok(UnixStream::from(unsafe { OwnedFd::from_raw_fd(r) })),
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(e) => return Err(e),
                }
            },
            VsockListener::Path { listener, .. } => listener.accept().map(|(s, _)| s),
        }
    }

    /// Waits at most `timeout` for one connection.
    pub fn accept_timeout(&self, timeout: Duration) -> io::Result<UnixStream> {
        let give_up = Instant::now() + timeout;
        loop {
            let left = give_up.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(io::ErrorKind::TimedOut.into());
            }
            let mut p = libc::pollfd {
                fd: self.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            };
            let ms = libc::c_int::try_from(left.as_millis().max(1)).unwrap_or(libc::c_int::MAX);
            // SAFETY: poll(2) reads and writes the one live pollfd given.
            match cvt(unsafe { libc::poll(&mut p, 1, ms) }) {
                Ok(0) => {}
                Ok(_) => return self.accept(),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
    }
}

impl AsRawFd for VsockListener {
    fn as_raw_fd(&self) -> RawFd {
        match self {
            VsockListener::Vsock { fd, .. } => fd.as_raw_fd(),
            VsockListener::Path { listener, .. } => listener.as_raw_fd(),
        }
    }
}

impl Drop for VsockListener {
    fn drop(&mut self) {
        if let VsockListener::Path { path, .. } = self {
            let _ = std::fs::remove_file(path);
        }
    }
}

/// The guest's side of `minivmm.vsock_hello=PORT`: connects to the host's vsock port
/// `port`, writes `MINIVMM-VSOCK-HELLO <cid>\n` with the guest's own CID (the local address
/// of the connection), shuts the connection down and returns the line.
pub fn hello(port: u32) -> io::Result<String> {
    let mut s = connect_cid(HOST_CID, port)?;
    let (cid, _) = local_addr(s.as_raw_fd())?;
    let line = format!("MINIVMM-VSOCK-HELLO {cid}\n");
    s.set_write_timeout(Some(Duration::from_secs(10)))?;
    s.write_all(line.as_bytes())?;
    s.shutdown(std::net::Shutdown::Write)?;
    Ok(line)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dir(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("mvperf-vsock-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    /// A VMM's side of one host connection: reads the CONNECT line, answers `reply`.
    fn vmm(l: UnixListener, reply: &'static [u8]) -> std::thread::JoinHandle<String> {
        std::thread::spawn(move || {
            let (mut s, _) = l.accept().unwrap();
            let mut line = Vec::new();
            let mut b = [0u8; 1];
            while line.last() != Some(&b'\n') && s.read(&mut b).unwrap() == 1 {
                line.push(b[0]);
            }
            s.write_all(reply).unwrap();
            String::from_utf8(line).unwrap()
        })
    }

    #[test]
    fn the_connect_protocol_is_firecrackers() {
        let d = dir("uds");
        let uds = d.join("v.sock");
        let t = vmm(UnixListener::bind(&uds).unwrap(), b"OK 1073741824\nhello");
        let mut s = connect_uds(&uds, 12865, Duration::from_secs(5)).unwrap();
        assert_eq!(t.join().unwrap(), "CONNECT 12865\n");
        let mut rest = [0u8; 5];
        s.read_exact(&mut rest).unwrap();
        assert_eq!(&rest, b"hello", "bytes after the OK line were consumed");
        std::fs::remove_file(&uds).unwrap();
        let t = vmm(UnixListener::bind(&uds).unwrap(), b"");
        let e = connect_uds(&uds, 7, Duration::from_secs(5)).unwrap_err();
        t.join().unwrap();
        assert_eq!(e.kind(), io::ErrorKind::ConnectionRefused);
        assert!(e.to_string().contains("vsock port 7"), "{e}");
        std::fs::remove_file(&uds).unwrap();
        let t = vmm(UnixListener::bind(&uds).unwrap(), b"NO\n");
        let e = connect_uds(&uds, 7, Duration::from_secs(5)).unwrap_err();
        t.join().unwrap();
        assert_eq!(e.kind(), io::ErrorKind::InvalidData);
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn a_path_listener_takes_the_guests_connections_and_goes_when_dropped() {
        let d = dir("path");
        let base = d.join("v.sock");
        let l = VsockListener::bind_path(&base, Some(52)).unwrap();
        assert_eq!(l.port(), 52);
        let path = d.join("v.sock_52");
        assert!(path.exists());
        let e = l.accept_timeout(Duration::from_millis(50)).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::TimedOut);
        let mut c = UnixStream::connect(&path).unwrap();
        let mut a = l.accept_timeout(Duration::from_secs(5)).unwrap();
        c.write_all(b"x").unwrap();
        let mut b = [0u8; 1];
        a.read_exact(&mut b).unwrap();
        let any = VsockListener::bind_path(&base, None).unwrap();
        assert!((1024..61_024).contains(&any.port()));
        assert_ne!(any.port(), 52);
        drop((l, any));
        assert!(!path.exists());
        let _ = std::fs::remove_dir_all(&d);
    }
}
