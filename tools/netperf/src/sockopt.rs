// SPDX-License-Identifier: Apache-2.0
//! Socket calls std does not expose: buffer sizes, what a TCP socket still holds for its peer,
//! and a send with `MSG_CONFIRM`.
//!
//! netperf prints the send and receive socket buffer sizes of both ends; reading them needs
//! `getsockopt(SO_SNDBUF/SO_RCVBUF)`. This is the crate's only unsafe code.
#![allow(unsafe_code)]

use std::os::fd::AsRawFd;

fn get_int_opt(fd: &impl AsRawFd, opt: libc::c_int) -> Option<u64> {
    let mut val: libc::c_int = 0;
    let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: `fd` is a live socket borrowed for the call; `val` and `len` are valid, writable
    // locals and `len` holds the exact size of `val`, so the kernel writes at most that many
    // bytes into it.
    let rc = unsafe {
        libc::getsockopt(
            fd.as_raw_fd(),
            libc::SOL_SOCKET,
            opt,
            (&mut val as *mut libc::c_int).cast(),
            &mut len,
        )
    };
    (rc == 0).then_some(u64::try_from(val).unwrap_or(0))
}

/// `SO_SNDBUF` of a socket in bytes (as the kernel reports it, i.e. doubled), 0 if unknown.
pub fn send_buf(fd: &impl AsRawFd) -> u64 {
    get_int_opt(fd, libc::SO_SNDBUF).unwrap_or(0)
}

/// `SO_RCVBUF` of a socket in bytes (as the kernel reports it, i.e. doubled), 0 if unknown.
pub fn recv_buf(fd: &impl AsRawFd) -> u64 {
    get_int_opt(fd, libc::SO_RCVBUF).unwrap_or(0)
}

/// Sets `SO_RCVBUF` (tests: a receiver with a small window).
#[cfg(test)]
pub fn set_recv_buf(fd: &impl AsRawFd, bytes: libc::c_int) -> std::io::Result<()> {
    // SAFETY: `fd` is a live socket borrowed for the call; the option value is a valid int
    // whose exact size is passed, and the kernel only reads it.
    let rc = unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_RCVBUF,
            (&bytes as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// What a stream socket still holds for its peer (`SIOCOUTQ`): for TCP the bytes not yet
/// acknowledged (unsent plus in flight), for a Unix stream what the peer has not read yet
/// (counted as the kernel charges it, buffers and all), for `AF_VSOCK` the bytes not yet
/// acknowledged on kernels that say; `None` where the kernel does not. Callers compare two
/// readings: a change is the peer taking data in.
pub fn unacked(fd: &impl AsRawFd) -> Option<u64> {
    let mut val: libc::c_int = 0;
    // SAFETY: `fd` is a live socket borrowed for the call; SIOCOUTQ (the same request number as
    // TIOCOUTQ) writes one int into `val`, a valid, writable local of that type.
    let rc = unsafe { libc::ioctl(fd.as_raw_fd(), libc::TIOCOUTQ, &mut val) };
    (rc == 0).then(|| u64::try_from(val).unwrap_or(0))
}

/// Sends one datagram on a connected socket with `MSG_CONFIRM`: the caller has just heard
/// from the peer, so the kernel may take its neighbour entry as reachable instead of probing
/// it. A probe's answer can wait behind a flood the peer is sending us (a TAP's 1000 frames
/// ahead of an emulated guest: over ten seconds), and until it comes the neighbour entry
/// fails and what we send to the peer waits too.
pub fn send_confirm(sock: &std::net::UdpSocket, buf: &[u8]) -> std::io::Result<usize> {
    // SAFETY: `sock` is a live socket borrowed for the call; `buf` is a valid slice and the
    // kernel reads at most `buf.len()` bytes from it.
    let n = unsafe {
        libc::send(
            sock.as_raw_fd(),
            buf.as_ptr().cast(),
            buf.len(),
            libc::MSG_CONFIRM,
        )
    };
    usize::try_from(n).map_err(|_| std::io::Error::last_os_error())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_nonzero_sizes() {
        let s = std::net::UdpSocket::bind("127.0.0.1:0").expect("bind");
        assert!(send_buf(&s) > 0);
        assert!(recv_buf(&s) > 0);
    }

    #[test]
    fn unacked_counts_what_the_peer_has_not_taken() {
        use std::io::{Read, Write};
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("listen");
        let mut tx =
            std::net::TcpStream::connect(listener.local_addr().expect("addr")).expect("connect");
        let (mut rx, _) = listener.accept().expect("accept");
        assert_eq!(unacked(&tx), Some(0));
        // More than the receiver's buffer takes: the rest waits in ours, unacknowledged.
        tx.set_nonblocking(true).expect("nonblocking");
        let chunk = [7u8; 65536];
        let mut written = 0u64;
        while let Ok(n) = tx.write(&chunk) {
            written += n as u64;
        }
        let held = unacked(&tx).expect("SIOCOUTQ");
        assert!(held > 0 && held <= written, "{held} of {written}");
        let mut got = vec![0u8; 1 << 20];
        let n = rx.read(&mut got).expect("read");
        assert!(n > 0);
        // Reading opened the window: what we held moves on, and is soon acknowledged.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while unacked(&tx) == Some(held) && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        assert!(unacked(&tx).expect("SIOCOUTQ") < held);
        // Not a TCP socket: the kernel says nothing useful, and nothing breaks.
        let udp = std::net::UdpSocket::bind("127.0.0.1:0").expect("bind");
        let _ = unacked(&udp);
    }

    #[test]
    fn unacked_counts_what_a_unix_peer_has_not_read() {
        // A VSOCK test's connection on the host is a Unix stream to the VMM.
        use std::io::{Read, Write};
        let (mut tx, mut rx) = std::os::unix::net::UnixStream::pair().expect("pair");
        assert_eq!(unacked(&tx), Some(0));
        tx.write_all(&[7u8; 4096]).expect("write");
        tx.write_all(&[7u8; 4096]).expect("write");
        let held = unacked(&tx).expect("SIOCOUTQ");
        assert!(held >= 8192, "{held}");
        let mut got = [0u8; 4096];
        rx.read_exact(&mut got).expect("read");
        let less = unacked(&tx).expect("SIOCOUTQ");
        assert!(0 < less && less < held, "{less} of {held}");
        rx.read_exact(&mut got).expect("read");
        assert_eq!(unacked(&tx), Some(0));
    }

    #[test]
    fn send_confirm_delivers_the_datagram() {
        let a = std::net::UdpSocket::bind("127.0.0.1:0").expect("bind");
        let b = std::net::UdpSocket::bind("127.0.0.1:0").expect("bind");
        a.connect(b.local_addr().expect("addr")).expect("connect");
        assert_eq!(send_confirm(&a, b"report").expect("send"), 6);
        let mut got = [0u8; 16];
        let (n, from) = b.recv_from(&mut got).expect("recv");
        assert_eq!(
            (&got[..n], from),
            (&b"report"[..], a.local_addr().expect("addr"))
        );
        // Unconnected, there is nowhere to send: the error comes back, not a panic.
        let lone = std::net::UdpSocket::bind("127.0.0.1:0").expect("bind");
        assert!(send_confirm(&lone, b"x").is_err());
    }
}
