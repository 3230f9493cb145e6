// SPDX-License-Identifier: Apache-2.0
//! The few system calls the benchmark needs that std does not wrap: the raw
//! TAP loops' reads and writes (on the device's own `Tap`), clocks (monotonic and per-thread CPU), batched
//! `sendmmsg`, socket options and an `AF_PACKET` socket with a vnet header.
//!
//! Every other module is safe code; the unsafe blocks live here, each with
//! the invariant it relies on.

use std::io;
use std::net::UdpSocket;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::time::Duration;

use devices::virtio::net::{NetBackend, Tap};

/// Length of the vnet header every TAP frame carries: the device's own.
pub use devices::virtio::net::VNET_HDR_LEN;

/// TUN_F_* flags the device sets when the guest acks CSUM + TSO4/6 (+UFO,
/// which Linux accepts and ignores): the raw loop uses the same ones so both
/// sides see the same frames.
pub const TAP_OFFLOADS_GSO: u32 =
    libc::TUN_F_CSUM | libc::TUN_F_TSO4 | libc::TUN_F_TSO6 | libc::TUN_F_UFO;

fn cvt(ret: libc::c_int) -> io::Result<libc::c_int> {
    if ret < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(ret)
    }
}

/// Opens TAP `name` exactly as the device does (the device's own [`Tap`]:
/// IFF_TAP | IFF_NO_PI | IFF_VNET_HDR, a 12-byte vnet header, non-blocking)
/// with the TUN_F_* `offloads`, for the raw loops that run without the
/// device. Callers poll.
pub fn open_tap(name: &str, offloads: u32) -> io::Result<Tap> {
    let tap = Tap::open_named(name).map_err(io::Error::other)?;
    tap.set_offload(offloads).map_err(io::Error::other)?;
    Ok(tap)
}

/// Waits until `fd` is readable (or writable if `write`) or `timeout` passes.
/// Returns whether it is ready.
pub fn poll_fd(fd: RawFd, write: bool, timeout: Duration) -> bool {
    let mut pfd = libc::pollfd {
        fd,
        events: if write { libc::POLLOUT } else { libc::POLLIN },
        revents: 0,
    };
    let ms = libc::c_int::try_from(timeout.as_millis()).unwrap_or(libc::c_int::MAX);
    // SAFETY: one valid pollfd, count 1; the kernel writes only `revents`.
    let n = unsafe { libc::poll(&mut pfd, 1, ms) };
    n > 0
}

/// `read(2)` on a raw fd into `buf`.
pub fn read_fd(fd: RawFd, buf: &mut [u8]) -> io::Result<usize> {
    // SAFETY: `buf` is a live, exclusively borrowed slice of `buf.len()` bytes.
    let n = unsafe { libc::read(fd, buf.as_mut_ptr().cast(), buf.len()) };
    if n < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(n as usize)
    }
}

/// `write(2)` of `buf` on a raw fd.
pub fn write_fd(fd: RawFd, buf: &[u8]) -> io::Result<usize> {
    // SAFETY: `buf` is a live slice of `buf.len()` bytes the kernel only reads.
    let n = unsafe { libc::write(fd, buf.as_ptr().cast(), buf.len()) };
    if n < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(n as usize)
    }
}

/// CLOCK_MONOTONIC in nanoseconds: the one clock host senders and the
/// driver share (same machine, same clock).
pub fn now_ns() -> u64 {
    clock_ns(libc::CLOCK_MONOTONIC)
}

/// Reads `clock` in nanoseconds (0 if the clock is gone, e.g. its thread died).
pub fn clock_ns(clock: libc::clockid_t) -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a live local the kernel writes one timespec into.
    if unsafe { libc::clock_gettime(clock, &mut ts) } != 0 {
        return 0;
    }
    (ts.tv_sec as u64) * 1_000_000_000 + ts.tv_nsec as u64
}

/// CPU time stolen from this machine so far, in seconds over all its CPUs:
/// `/proc/stat`'s `steal`, the time the hypervisor ran something else while
/// one of this VM's vCPUs wanted to run (0 where it cannot be read).
pub fn steal_secs() -> f64 {
    let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1);
    steal_ticks(&stat) as f64 / hz as f64
}

/// The `steal` field (the eighth number) of the aggregate `cpu` line.
fn steal_ticks(stat: &str) -> u64 {
    stat.lines()
        .find(|l| l.starts_with("cpu "))
        .and_then(|l| l.split_whitespace().nth(8))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// The CPU-time clock of the calling thread, readable from any thread of
/// the process (`pthread_getcpuclockid`).
pub fn current_thread_cpu_clock() -> libc::clockid_t {
    let mut id: libc::clockid_t = 0;
    // SAFETY: `pthread_self()` is the live calling thread and `id` a live local.
    let ret = unsafe { libc::pthread_getcpuclockid(libc::pthread_self(), &mut id) };
    if ret != 0 {
        libc::CLOCK_THREAD_CPUTIME_ID
    } else {
        id
    }
}

/// Sets an integer socket option.
pub fn setsockopt_int(
    fd: RawFd,
    level: libc::c_int,
    name: libc::c_int,
    val: libc::c_int,
) -> io::Result<()> {
    // SAFETY: the option value is a live int of the size passed.
    cvt(unsafe {
        libc::setsockopt(
            fd,
            level,
            name,
            (&val as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    })
    .map(|_| ())
}

/// Sends each of `msgs` as one datagram on connected UDP socket `sock` with
/// one `sendmmsg`. Returns how many were sent (0 on EAGAIN/ENOBUFS).
pub fn sendmmsg(sock: &UdpSocket, msgs: &[&[u8]]) -> io::Result<usize> {
    let mut iovs: Vec<libc::iovec> = msgs
        .iter()
        .map(|m| libc::iovec {
            iov_base: m.as_ptr() as *mut libc::c_void,
            iov_len: m.len(),
        })
        .collect();
    // SAFETY: mmsghdr is plain data; all-zero is a valid empty header.
    let mut hdrs: Vec<libc::mmsghdr> = (0..msgs.len())
        .map(|_| unsafe { std::mem::zeroed() })
        .collect();
    for (h, iov) in hdrs.iter_mut().zip(iovs.iter_mut()) {
        h.msg_hdr.msg_iov = iov;
        h.msg_hdr.msg_iovlen = 1;
    }
    // SAFETY: every header points to one iovec in `iovs`, which points into a
    // live slice of `msgs`; all outlive the call; the kernel only reads them
    // (and writes `msg_len` into `hdrs`, which we own).
    let n = unsafe {
        libc::sendmmsg(
            sock.as_raw_fd(),
            hdrs.as_mut_ptr(),
            hdrs.len() as libc::c_uint,
            0,
        )
    };
    if n < 0 {
        let e = io::Error::last_os_error();
        match e.raw_os_error() {
            Some(libc::EAGAIN) | Some(libc::ENOBUFS) => Ok(0),
            _ => Err(e),
        }
    } else {
        Ok(n as usize)
    }
}

/// An `AF_PACKET` socket bound to one interface with PACKET_VNET_HDR: frames
/// sent on it carry a vnet header, so a 64 KiB TCP frame with a GSO header
/// leaves as one super-frame through a TAP that has TSO on (the host side of
/// the 64 KiB RX test, which no host TCP stack could produce without a peer).
#[derive(Debug)]
pub struct PacketSocket {
    fd: OwnedFd,
}

impl PacketSocket {
    /// Opens and binds the socket to interface `name`.
    pub fn bind(name: &str) -> io::Result<PacketSocket> {
        let cname = std::ffi::CString::new(name)
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "NUL in name"))?;
        // SAFETY: `cname` is a live NUL-terminated string.
        let ifindex = unsafe { libc::if_nametoindex(cname.as_ptr()) };
        if ifindex == 0 {
            return Err(io::Error::last_os_error());
        }
        let proto = 0;
        // SAFETY: plain socket(2); the fd is wrapped in an OwnedFd at once.
        let raw = cvt(unsafe {
            libc::socket(libc::AF_PACKET, libc::SOCK_RAW | libc::SOCK_CLOEXEC, proto)
        })?;
        // SAFETY: `raw` is a fresh fd that nothing else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        setsockopt_int(fd.as_raw_fd(), libc::SOL_PACKET, libc::PACKET_VNET_HDR, 1)?;
        // SAFETY: sockaddr_ll is plain data; all-zero is valid before filling.
        let mut sll: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
        sll.sll_family = libc::AF_PACKET as u16;
        // Protocol 0: the socket receives nothing (no copy of every frame
        // on the TAP); the kernel takes each sent frame's protocol from its
        // Ethernet header.
        sll.sll_protocol = 0;
        sll.sll_ifindex = ifindex as libc::c_int;
        // SAFETY: `sll` is a live sockaddr_ll of the size passed.
        cvt(unsafe {
            libc::bind(
                fd.as_raw_fd(),
                (&sll as *const libc::sockaddr_ll).cast(),
                std::mem::size_of::<libc::sockaddr_ll>() as libc::socklen_t,
            )
        })?;
        Ok(PacketSocket { fd })
    }

    /// Sends one frame (vnet header first). Returns false on ENOBUFS/EAGAIN.
    pub fn send(&self, frame: &[u8]) -> io::Result<bool> {
        // SAFETY: `frame` is a live slice the kernel only reads.
        let n = unsafe { libc::send(self.fd.as_raw_fd(), frame.as_ptr().cast(), frame.len(), 0) };
        if n < 0 {
            let e = io::Error::last_os_error();
            return match e.raw_os_error() {
                Some(libc::EAGAIN) | Some(libc::ENOBUFS) => Ok(false),
                _ => Err(e),
            };
        }
        Ok(true)
    }
}

/// Whether we run as root (euid 0).
/// Drops the page cache's copy of `file` (written back first by the
/// caller), so direct I/O on it starts without cached pages to invalidate.
pub fn drop_cached(file: &std::fs::File) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    // SAFETY: posix_fadvise takes plain integers and touches no memory of
    // ours.
    let ret = unsafe { libc::posix_fadvise(file.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
    if ret != 0 {
        return Err(io::Error::from_raw_os_error(ret));
    }
    Ok(())
}

/// `netbench --syscall-cost N`: `n` calls each of an eventfd write, an
/// `epoll_wait` with an event ready and `getppid`, timed on the wall clock;
/// prints the nanoseconds a call. What the signalling of a virtio device
/// costs on this host, beside what any call costs.
pub fn syscall_cost(n: u32) -> anyhow::Result<()> {
    use vmm_sys_util::epoll::{ControlOperation, Epoll, EpollEvent, EventSet};
    use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};
    anyhow::ensure!(n > 0, "--syscall-cost needs at least one call");
    let per_call = |f: &mut dyn FnMut() -> io::Result<()>| -> io::Result<f64> {
        let t = std::time::Instant::now();
        for _ in 0..n {
            f()?;
        }
        Ok(t.elapsed().as_nanos() as f64 / f64::from(n))
    };
    let efd = EventFd::new(EFD_NONBLOCK)?;
    let write = per_call(&mut || efd.write(1))?;
    let epoll = Epoll::new()?;
    epoll.ctl(
        ControlOperation::Add,
        efd.as_raw_fd(),
        EpollEvent::new(EventSet::IN, 1),
    )?;
    let mut events = [EpollEvent::default(); 8];
    let wait = per_call(&mut || match epoll.wait(1, &mut events)? {
        0 => Err(io::Error::other("no event ready")),
        _ => Ok(()),
    })?;
    let getppid = per_call(&mut || {
        // SAFETY: getppid takes no arguments, touches no memory of ours and
        // cannot fail.
        unsafe { libc::getppid() };
        Ok(())
    })?;
    println!(
        "netbench: syscall-cost ({n} calls each): eventfd write {write:.0} ns, epoll_wait (ready) {wait:.0} ns, getppid {getppid:.0} ns"
    );
    Ok(())
}

pub fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

static INTERRUPTED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

extern "C" fn on_signal(_: libc::c_int) {
    INTERRUPTED.store(true, std::sync::atomic::Ordering::SeqCst);
}

/// Makes SIGINT/SIGTERM set a flag instead of killing this process, so the
/// parent survives Ctrl-C long enough to delete its namespace. A handler
/// (unlike SIG_IGN) is reset by exec, so the child still dies of the signal.
pub fn catch_interrupts() {
    for sig in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
        // SAFETY: `on_signal` is async-signal-safe (one atomic store) and has
        // the `extern "C" fn(c_int)` signature `signal` expects.
        unsafe {
            libc::signal(sig, on_signal as *const () as libc::sighandler_t);
        }
    }
}

/// Whether a caught SIGINT/SIGTERM arrived.
pub fn interrupted() -> bool {
    INTERRUPTED.load(std::sync::atomic::Ordering::SeqCst)
}

/// Sends SIGTERM to process `pid` (our own child).
pub fn terminate(pid: u32) {
    if let Ok(pid) = libc::pid_t::try_from(pid) {
        // SAFETY: kill(2) with a pid we spawned and have not reaped yet, so
        // it cannot name an unrelated process.
        unsafe {
            libc::kill(pid, libc::SIGTERM);
        }
    }
}

/// Asks the kernel to send SIGTERM to this process when its parent dies, so
/// the child never outlives the parent that owns the namespace.
pub fn die_with_parent() {
    // SAFETY: PR_SET_PDEATHSIG takes a signal number by value.
    unsafe {
        libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_syscall_cost_needs_a_call_and_times_them() {
        assert!(syscall_cost(0).is_err());
        syscall_cost(100).expect("an eventfd and epoll are available");
    }

    #[test]
    fn steal_is_the_eighth_number_of_the_cpu_line() {
        let stat = "cpu  3100240 623355 3957798 3172020 16950 0 23251 86010 3644 5\n\
                    cpu0 1 2 3 4 5 6 7 8 9 10\n";
        assert_eq!(steal_ticks(stat), 86010);
        assert_eq!(steal_ticks("cpu  1 2 3\n"), 0);
        assert_eq!(steal_ticks(""), 0);
    }
}
