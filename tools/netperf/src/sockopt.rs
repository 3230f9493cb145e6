// SPDX-License-Identifier: Apache-2.0
//! Socket buffer sizes, which std does not expose.
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_nonzero_sizes() {
        let s = std::net::UdpSocket::bind("127.0.0.1:0").expect("bind");
        assert!(send_buf(&s) > 0);
        assert!(recv_buf(&s) > 0);
    }
}
