// SPDX-License-Identifier: Apache-2.0
//! The block device's io_uring (`IoEngine::Async`): requests submitted in
//! batches, completed on the event loop.
//!
//! As the network device's `WriteRing`, what the ring may do is fixed when
//! it is built, in `Block::new`, before the VMM installs its seccomp
//! filters (operations submitted through a ring are not system calls a
//! filter sees):
//! - the ring is created disabled; the event loop polls the ring's own fd,
//!   readable while completions wait in the completion queue (no eventfd:
//!   one registered would be signalled on every batch of completions and
//!   read after it, two system calls per pass of page-cache requests,
//!   which the pass answers without waiting);
//! - `IORING_REGISTER_RESTRICTIONS` allows only READ, READV, WRITE,
//!   WRITEV, FSYNC and FALLOCATE, with no `IOSQE_*` flag (no links, no
//!   drains, no forced async workers), and no further `io_uring_register`
//!   operation;
//! - then it is enabled. Whoever submits on it can do no more to the image
//!   than the event loop's `pread`/`preadv`/`pwrite`/`pwritev`/`fdatasync`/
//!   `fallocate` could; the event-loop filter allows `io_uring_enter` only.
//!
//! `IORING_SETUP_COOP_TASKRUN`, as the network ring: a request a kernel
//! worker runs (on ext4 every buffered write: it has no non-blocking
//! buffered writes, so io_uring hands each one to an io-wq worker) is
//! posted to the event loop as task work. Without the flag the worker
//! interrupts the running loop thread with an IPI for each one; with it the
//! work waits for the thread's next entry into the kernel, which comes at
//! the latest at the loop's next `epoll_wait` (a thread already asleep
//! there is woken: the wait returns EINTR, the event manager turns again,
//! and the ring polls readable). 300,000 4 KiB page-cache writes through
//! the worker took 2.1 s with the IPIs and 1.0 s without, as long as a raw
//! `pwrite` loop (BENCHMARKS.md, "Block device").
//!
//! **Buffers stay valid until completion.** An entry points at the
//! request's vector of segments (a `Vec` owned by the device's in-flight
//! table, not moved or freed until its completion has been reaped) and at
//! guest memory, kept mapped by the queue's `GuestRegions` the in-flight
//! request holds. [`BlockRing::push`] is `unsafe` for that reason, and
//! [`BlockRing::wait_all`] is how the device gets every buffer back before
//! it drops them (reset, drop).
#![allow(unsafe_code)]

use std::io;
use std::os::fd::{AsRawFd, RawFd};

use io_uring::{opcode, types, IoUring};

use super::backend::FallocMode;
use crate::virtio::io_engine::restricted_ring;
use crate::virtio::queue::IoSeg;

/// Entries of the submission queue: also the most requests in flight (the
/// device stops taking requests from the guest at this many), so a push
/// never finds the submission queue full.
pub const RING_ENTRIES: u32 = 128;

/// One operation to submit.
#[derive(Debug, Clone, Copy)]
pub(crate) enum RingOp<'a> {
    /// READV at `offset` into `segs` (READ for one segment).
    Read { segs: &'a [IoSeg], offset: u64 },
    /// WRITEV at `offset` from `segs` (WRITE for one segment).
    Write { segs: &'a [IoSeg], offset: u64 },
    /// FSYNC with IORING_FSYNC_DATASYNC.
    Flush,
    /// FALLOCATE.
    Fallocate {
        mode: FallocMode,
        offset: u64,
        len: u64,
    },
}

/// An io_uring restricted to the block datapath's operations on one fd.
pub struct BlockRing {
    ring: IoUring,
    /// The image: the device owns it and outlives the ring.
    fd: RawFd,
    /// Entries pushed and not yet reaped.
    in_flight: usize,
}

impl std::fmt::Debug for BlockRing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BlockRing")
            .field("in_flight", &self.in_flight)
            .finish_non_exhaustive()
    }
}

/// The ring's fd, which polls readable while completions wait to be reaped.
impl AsRawFd for BlockRing {
    fn as_raw_fd(&self) -> RawFd {
        self.ring.as_raw_fd()
    }
}

impl BlockRing {
    /// Builds the ring for `fd` (see the module doc). Fails where io_uring
    /// is unavailable or refused; the device then runs `Sync`.
    pub fn new(fd: RawFd) -> io::Result<BlockRing> {
        let ring = restricted_ring(
            // No SINGLE_ISSUER: built on the VMM's build thread, used on
            // the event loop's.
            IoUring::builder().setup_coop_taskrun(),
            RING_ENTRIES,
            &[
                opcode::Read::CODE,
                opcode::Readv::CODE,
                opcode::Write::CODE,
                opcode::Writev::CODE,
                opcode::Fsync::CODE,
                opcode::Fallocate::CODE,
            ],
        )?;
        Ok(BlockRing {
            ring,
            fd,
            in_flight: 0,
        })
    }

    /// Whether another entry may be pushed.
    pub fn has_room(&self) -> bool {
        self.in_flight < RING_ENTRIES as usize
    }

    /// Queues `op` with `tag` (returned with its completion); submitted at
    /// the next [`submit`](Self::submit).
    ///
    /// # Safety
    /// The segments `op` names, and the memory they describe, must stay
    /// valid and unmoved until the completion with `tag` has been reaped.
    pub(crate) unsafe fn push(&mut self, op: RingOp<'_>, tag: u64) -> io::Result<()> {
        if !self.has_room() {
            return Err(io::Error::other("io_uring ring full"));
        }
        let fd = types::Fd(self.fd);
        // At most MAX_CHAIN_SEGS vectors: the count fits u32.
        let n = |s: &[IoSeg]| s.len() as u32;
        // One segment goes as READ or WRITE: the kernel takes the buffer
        // as it is, without copying in and importing an iovec (as the Sync
        // engine's pread64/pwrite64, see `backend`). A segment is at most
        // one descriptor's u32 length.
        let one = |s: &[IoSeg]| match s {
            [seg] => u32::try_from(seg.len()).ok().map(|len| (seg.base(), len)),
            _ => None,
        };
        let entry = match op {
            RingOp::Read { segs, offset } => match one(segs) {
                Some((base, len)) => opcode::Read::new(fd, base as *mut u8, len)
                    .offset(offset)
                    .build(),
                None => opcode::Readv::new(fd, segs.as_ptr().cast::<libc::iovec>(), n(segs))
                    .offset(offset)
                    .build(),
            },
            RingOp::Write { segs, offset } => match one(segs) {
                Some((base, len)) => opcode::Write::new(fd, base as *const u8, len)
                    .offset(offset)
                    .build(),
                None => opcode::Writev::new(fd, segs.as_ptr().cast::<libc::iovec>(), n(segs))
                    .offset(offset)
                    .build(),
            },
            RingOp::Flush => opcode::Fsync::new(fd)
                .flags(types::FsyncFlags::DATASYNC)
                .build(),
            RingOp::Fallocate { mode, offset, len } => opcode::Fallocate::new(fd, len)
                .offset(offset)
                .mode(mode.bits())
                .build(),
        }
        .user_data(tag);
        // SAFETY: the entry points at `segs` (laid out as `struct iovec`,
        // see IoSeg), or at the one segment's memory, and the memory they
        // describe, which the caller keeps valid until the completion is
        // reaped.
        unsafe { self.ring.submission().push(&entry) }
            .map_err(|_| io::Error::other("io_uring submission queue full"))?;
        self.in_flight += 1;
        Ok(())
    }

    /// Hands every queued entry to the kernel (one `io_uring_enter`;
    /// EINTR retried).
    pub fn submit(&mut self) -> io::Result<()> {
        while !self.ring.submission().is_empty() {
            match self.ring.submit() {
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    /// Appends every completion posted so far to `out` as `(tag, result)`.
    pub fn reap(&mut self, out: &mut Vec<(u64, i32)>) {
        let before = out.len();
        out.extend(self.ring.completion().map(|c| (c.user_data(), c.result())));
        self.in_flight = self.in_flight.saturating_sub(out.len() - before);
    }

    /// Submits what is queued and waits until at least one completion is
    /// posted (EINTR retried); [`reap`](Self::reap) takes it.
    pub fn wait_one(&mut self) -> io::Result<()> {
        loop {
            match self.ring.submit_and_wait(1) {
                Ok(_) => return Ok(()),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
    }

    /// Points the entries pushed from now on at `fd`: the device swapped
    /// its image, after every entry on the old one completed.
    pub fn set_fd(&mut self, fd: RawFd) {
        self.fd = fd;
    }

    /// Submits what is queued and waits until every entry in flight has
    /// completed, appending the completions to `out`: after this the
    /// kernel holds no pointer into guest memory or the device's vectors.
    /// Returns the error of `io_uring_enter` if it fails for good (the
    /// entries still in flight then stay referenced; the caller must keep
    /// their buffers).
    pub fn wait_all(&mut self, out: &mut Vec<(u64, i32)>) -> io::Result<()> {
        loop {
            self.reap(out);
            if self.in_flight == 0 {
                return Ok(());
            }
            match self.ring.submit_and_wait(1) {
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::os::fd::AsRawFd;

    use io_uring::squeue::{Entry, Flags};

    use super::*;
    use crate::virtio::io_engine::assert_registering_refused;

    /// Submits `entry` alone and returns its completion's result.
    fn submit_one(ring: &mut BlockRing, entry: &Entry) -> i32 {
        // SAFETY: the entries below point at buffers that outlive the call,
        // which returns once the entry completed.
        unsafe { ring.ring.submission().push(entry) }.expect("room");
        ring.ring.submit_and_wait(1).expect("io_uring_enter");
        let c = ring.ring.completion().next().expect("a completion");
        c.result()
    }

    #[test]
    fn test_the_ring_runs_its_six_operations_and_refuses_the_rest() {
        let dir = std::env::temp_dir().join(format!("minivmm-uring-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("img");
        std::fs::write(&path, [7u8; 8192]).unwrap();
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&path)
            .unwrap();
        let mut ring = BlockRing::new(file.as_raw_fd()).unwrap();
        let fd = types::Fd(file.as_raw_fd());
        let mut buf = [0u8; 512];
        let iov = [libc::iovec {
            iov_base: buf.as_mut_ptr().cast(),
            iov_len: 512,
        }];
        let readv = || opcode::Readv::new(fd, iov.as_ptr(), 1).build();
        assert_eq!(submit_one(&mut ring, &readv()), 512);
        assert_eq!(buf, [7u8; 512]);
        let writev = opcode::Writev::new(fd, iov.as_ptr(), 1)
            .offset(4096)
            .build();
        assert_eq!(submit_one(&mut ring, &writev), 512);
        let fsync = opcode::Fsync::new(fd)
            .flags(types::FsyncFlags::DATASYNC)
            .build();
        assert_eq!(submit_one(&mut ring, &fsync), 0);
        // Reaped, so the ring's fd polls as not readable; a completion left
        // in the queue makes it readable.
        let readable = |ring: &BlockRing| {
            let mut p = libc::pollfd {
                fd: ring.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            };
            // SAFETY: one live pollfd, of which poll writes only `revents`.
            assert!(unsafe { libc::poll(&mut p, 1, 0) } >= 0);
            p.revents & libc::POLLIN != 0
        };
        assert!(!readable(&ring));
        // SAFETY: as in `submit_one`.
        unsafe { ring.ring.submission().push(&readv()) }.expect("room");
        ring.ring.submit_and_wait(1).expect("io_uring_enter");
        assert!(readable(&ring));
        assert_eq!(ring.ring.completion().next().map(|c| c.result()), Some(512));
        assert!(!readable(&ring));
        let read = opcode::Read::new(fd, buf.as_mut_ptr(), 16)
            .offset(4096)
            .build();
        assert_eq!(submit_one(&mut ring, &read), 16);
        let write = opcode::Write::new(fd, buf.as_ptr(), 16)
            .offset(8192)
            .build();
        assert_eq!(submit_one(&mut ring, &write), 16);
        let refused = [
            ("NOP", opcode::Nop::new().build()),
            ("CLOSE", opcode::Close::new(types::Fd(-1)).build()),
            (
                "READ with IO_LINK",
                opcode::Read::new(fd, buf.as_mut_ptr(), 16)
                    .build()
                    .flags(Flags::IO_LINK),
            ),
            ("READV with IO_LINK", readv().flags(Flags::IO_LINK)),
            ("READV with ASYNC", readv().flags(Flags::ASYNC)),
            ("READV with IO_DRAIN", readv().flags(Flags::IO_DRAIN)),
        ];
        for (what, e) in &refused {
            assert_eq!(submit_one(&mut ring, e), -libc::EACCES, "{what}");
        }
        assert_registering_refused(&ring.ring, file.as_raw_fd());
        let _ = std::fs::remove_dir_all(&dir);
    }
}
