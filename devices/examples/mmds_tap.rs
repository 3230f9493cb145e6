// SPDX-License-Identifier: Apache-2.0
//! MMDS against the host kernel's own TCP: a TAP whose frames (vnet header
//! first) go to an [`MmdsStack`] and whose answers go back into the TAP, so
//! that `curl http://169.254.169.254/` run on the host side of the TAP talks
//! to MMDS as a guest would. For debugging MMDS with a real TCP stack.
//!
//! Usage (root, in a network namespace): `mmds_tap TAP SECONDS`.

use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::{AsRawFd, FromRawFd};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use devices::mmds::{lock, Mmds, MmdsMetrics, MmdsStack, MmdsVersion, DEFAULT_IPV4};

fn open_tap(name: &str) -> std::io::Result<File> {
    // SAFETY: a NUL-terminated path; the fd is owned by the File at once.
    let fd = unsafe { libc::open(c"/dev/net/tun".as_ptr(), libc::O_RDWR | libc::O_NONBLOCK) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: fd is a fresh descriptor nobody else owns.
    let f = unsafe { File::from_raw_fd(fd) };
    let mut ifr = [0u8; 40];
    ifr[..name.len()].copy_from_slice(name.as_bytes());
    let flags = (libc::IFF_TAP | libc::IFF_NO_PI | libc::IFF_VNET_HDR) as u16;
    ifr[16..18].copy_from_slice(&flags.to_ne_bytes());
    // SAFETY: TUNSETIFF reads and writes the 40-byte ifreq above.
    if unsafe { libc::ioctl(f.as_raw_fd(), 0x400454ca, ifr.as_mut_ptr()) } < 0 {
        return Err(std::io::Error::last_os_error());
    }
    let sz: libc::c_int = 12;
    // SAFETY: TUNSETVNETHDRSZ reads one int.
    if unsafe { libc::ioctl(f.as_raw_fd(), 0x400454d8, &sz) } < 0 {
        return Err(std::io::Error::last_os_error());
    }
    if std::env::var_os("MMDS_TAP_OFFLOAD").is_some() {
        // TUNSETOFFLOAD: TUN_F_CSUM | TUN_F_TSO4 | TUN_F_TSO6, so the host
        // kernel sends partial checksums and GSO frames, as a guest does.
        // SAFETY: TUNSETOFFLOAD takes its flags by value.
        if unsafe { libc::ioctl(f.as_raw_fd(), 0x400454d0, 7usize) } < 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(f)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let name = args.next().ok_or("usage: mmds_tap TAP SECONDS")?;
    let secs: u64 = args.next().and_then(|s| s.parse().ok()).unwrap_or(60);
    let v2 = args.next().as_deref() == Some("--v2");
    let mut tap = open_tap(&name)?;
    let store = Arc::new(Mutex::new(Mmds::default()));
    lock(&store).put(serde_json::json!({"latest": {"meta-data": {"ami-id": "ami-1"}}}))?;
    lock(&store).configure(if v2 { MmdsVersion::V2 } else { MmdsVersion::V1 }, false);
    let mut stack = MmdsStack::new(DEFAULT_IPV4, store);
    let m = MmdsMetrics::default();
    let end = Instant::now() + Duration::from_secs(secs);
    let mut buf = vec![0u8; 70000];
    while Instant::now() < end {
        match tap.read(&mut buf) {
            Ok(n) => {
                let chain = &buf[..n];
                let claimed = stack.claims(chain);
                eprintln!("frame {n} bytes claimed={claimed} flags={:#x}", chain[0]);
                if claimed {
                    stack.receive(chain, Instant::now(), &m);
                    while let Some(f) = stack.poll() {
                        eprintln!("  answer {} bytes", f.len());
                        tap.write_all(f)?;
                    }
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                std::thread::sleep(Duration::from_millis(2))
            }
            Err(e) => return Err(e.into()),
        }
    }
    eprintln!("{}", serde_json::to_string(&m)?);
    Ok(())
}
