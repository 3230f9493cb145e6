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
        // Listening before the file appears: a host agent connects as soon
        // as it sees the file.
        let listener = crate::listen::bind_listening(path).map_err(|e| match e.kind() {
            io::ErrorKind::AddrInUse | io::ErrorKind::AlreadyExists => {
                HostSocketError::Exists(path.to_path_buf())
            }
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

    /// The pid of the process that removes it.
    #[cfg(test)]
    fn remover_pid(&self) -> Option<libc::pid_t> {
        self.remover.as_ref().map(Remover::pid)
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
        let pid = s.remover_pid().expect("a remover");
        s.remove_now();
        assert!(!path.exists());
        // Its remover ended and was reaped (a socket replaced again and
        // again leaves no zombie behind; dropped, it would stay one).
        assert!(
            !Path::new(&format!("/proc/{pid}")).exists(),
            "the remover {pid} was not reaped"
        );
        // The old remover leaves alone what is bound there next.
        let again = VsockSocket::bind(&path, SeccompMode::On).unwrap();
        std::thread::sleep(std::time::Duration::from_millis(50));
        assert!(path.exists());
        drop(again);
        assert!(!path.exists());
    }

    /// The vsock device's whole datapath on the event loop under the loop's
    /// real filter: a host agent's connection accepted, its `CONNECT` line
    /// read, `OK` written, data both ways, a guest connection to a host
    /// listener made, shut for writing and reset, the time-out timer armed.
    /// A call outside the list would end this test binary with status 148.
    #[test]
    fn the_vsock_datapath_runs_under_the_event_loops_filter() {
        use crate::process::seccomp::{apply, filter, install_sigsys_handler, Thread};
        use devices::virtio::test_utils::{guest_memory, DeviceRig, Segment};
        use devices::virtio::vsock::packet::{Header, Op, HDR_LEN, SHUTDOWN_SEND, TYPE_STREAM};
        use devices::virtio::vsock::{Vsock, VsockConfig};
        use std::os::unix::net::UnixListener;
        use vm_memory::GuestAddress;

        let d = Scratch::new("filtered");
        let uds = d.0.join("v.sock");
        let socket = VsockSocket::bind(&uds, SeccompMode::Off).unwrap();
        let mem = guest_memory(16 << 20).unwrap();
        let cfg = VsockConfig {
            id: "vsock".into(),
            guest_cid: 3,
            uds_path: uds.clone(),
        };
        let dev = Vsock::with_listener(cfg, mem.clone(), socket.listener().unwrap()).unwrap();
        let mut rig = DeviceRig::new(&mem, dev);
        rig.drv
            .init(1 << virtio_bindings::virtio_config::VIRTIO_F_VERSION_1)
            .unwrap();
        rig.run_until_idle();
        let rx: Vec<(u16, GuestAddress)> = (0..8)
            .map(|_| {
                let a = rig.drv.alloc(HDR_LEN as u64 + 4096, 8).unwrap();
                let seg = Segment::writable(a, HDR_LEN as u32 + 4096);
                (rig.drv.submit(0, &[seg]).unwrap(), a)
            })
            .collect();
        // The host's side, made before the filter (std's sockets are
        // blocking ones, which the loop's list does not allow).
        let listener_52 = UnixListener::bind(format!("{}_52", uds.display())).unwrap();
        let mut agent = UnixStream::connect(&uds).unwrap();
        agent.write_all(b"CONNECT 1234\nping").unwrap();
        let hdr = |src_port, dst_port, op: Op, len: usize| Header {
            src_cid: 3,
            dst_cid: 2,
            src_port,
            dst_port,
            len: len as u32,
            kind: TYPE_STREAM,
            op: op as u16,
            flags: 0,
            buf_alloc: 65536,
            fwd_cnt: 0,
        };
        install_sigsys_handler().unwrap();
        let prog = filter(Thread::EventLoop, SeccompMode::On).unwrap();
        let (rig, received, metrics) = std::thread::spawn(move || {
            apply(Thread::EventLoop, prog.as_ref()).unwrap();
            let mut rig = rig;
            let mut received = Vec::new();
            let take = |rig: &mut DeviceRig<Vsock>, received: &mut Vec<(Header, Vec<u8>)>| {
                for _ in 0..50 {
                    rig.run_once(20);
                }
                for u in rig.drv.used(0).unwrap() {
                    let addr = rx.iter().find(|(h, _)| u32::from(*h) == u.id).unwrap().1;
                    let b = rig.drv.read_mem(addr, u.len as usize).unwrap();
                    let h = Header::parse(&b[..HDR_LEN].try_into().unwrap());
                    received.push((h, b[HDR_LEN..].to_vec()));
                }
            };
            let send = |rig: &mut DeviceRig<Vsock>, h: Header, data: &[u8]| {
                let a = rig.drv.alloc((HDR_LEN + data.len()) as u64, 8).unwrap();
                let mut bytes = h.to_bytes().to_vec();
                bytes.extend_from_slice(data);
                rig.drv.write_mem(a, &bytes).unwrap();
                let seg = Segment::readable(a, bytes.len() as u32);
                rig.drv.submit(1, &[seg]).unwrap();
            };
            take(&mut rig, &mut received);
            let host_port = received.first().map_or(0, |(h, _)| h.src_port);
            send(&mut rig, hdr(1234, host_port, Op::Response, 0), b"");
            take(&mut rig, &mut received);
            send(&mut rig, hdr(1234, host_port, Op::Rw, 4), b"pong");
            send(&mut rig, hdr(2000, 52, Op::Request, 0), b"");
            take(&mut rig, &mut received);
            let shut = Header {
                flags: SHUTDOWN_SEND,
                ..hdr(2000, 52, Op::Shutdown, 0)
            };
            send(&mut rig, shut, b"");
            take(&mut rig, &mut received);
            send(&mut rig, hdr(2000, 52, Op::Rst, 0), b"");
            take(&mut rig, &mut received);
            let metrics = rig.metrics();
            (rig, received, metrics)
        })
        .join()
        .unwrap();
        let ops: Vec<(u16, u32, Vec<u8>)> = received
            .iter()
            .map(|(h, d)| (h.op, h.dst_port, d.clone()))
            .collect();
        assert_eq!(ops[0].0, Op::Request as u16, "{ops:?}");
        assert_eq!(ops[0].1, 1234);
        assert!(
            ops.iter()
                .any(|(op, port, d)| *op == Op::Rw as u16 && *port == 1234 && d == b"ping"),
            "{ops:?}"
        );
        assert!(
            ops.iter()
                .any(|(op, port, _)| *op == Op::Response as u16 && *port == 2000),
            "{ops:?}"
        );
        let mut got = [0u8; 64];
        agent
            .set_read_timeout(Some(std::time::Duration::from_secs(5)))
            .unwrap();
        let mut all = Vec::new();
        while !all.ends_with(b"pong") {
            let n = agent.read(&mut got).unwrap();
            assert!(n > 0, "EOF after {all:?}");
            all.extend_from_slice(&got[..n]);
        }
        assert_eq!(
            all,
            format!("OK {}\npong", received[0].0.src_port).as_bytes()
        );
        let (mut guest_conn, _) = listener_52.accept().unwrap();
        guest_conn
            .set_read_timeout(Some(std::time::Duration::from_secs(5)))
            .unwrap();
        assert_eq!(guest_conn.read(&mut got).unwrap(), 0, "shut for writing");
        assert_eq!(metrics["conns_opened_host"], 1, "{metrics}");
        assert_eq!(metrics["conns_opened_guest"], 1, "{metrics}");
        drop(rig);
    }
}
