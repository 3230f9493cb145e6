// SPDX-License-Identifier: Apache-2.0
//! Socket calls std does not expose: buffer sizes, and a send with `MSG_CONFIRM`.
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
