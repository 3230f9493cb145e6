// SPDX-License-Identifier: Apache-2.0
//! Batched TX writes: one `io_uring_enter` for a whole batch of frames.
//!
//! A TAP takes one frame per `write`, and on the development hosts a system
//! call's entry and exit cost about a tenth of a small frame's whole cost
//! (BENCHMARKS.md). [`TxRing`] hands a batch of frames to the kernel in one
//! submission instead: each frame is still one write of its own (a TAP keeps
//! frame boundaries per write), from the guest's memory, zero-copy.
//!
//! What the ring may do is fixed when it is built, before the VMM installs
//! its seccomp filters, because operations submitted through a ring are not
//! system calls a filter sees:
//! - the ring is created disabled, and `IORING_REGISTER_RESTRICTIONS`
//!   allows only `WRITE` and `WRITEV` with no `IOSQE_*` flag (no links, no
//!   forced async workers) and no further `io_uring_register` operation;
//! - then it is enabled. Whoever gets to submit on it can only write, which
//!   the event-loop thread may do with `writev` anyway; its filter allows
//!   `io_uring_enter` but not `io_uring_setup` or `io_uring_register`.
//!
//! The backend's fd is not registered as a fixed file: a registered file is
//! released when the kernel tears the ring down, asynchronously after its
//! fd is closed, and until then a TAP stays attached, so reopening it (a
//! restarted VMM, the benchmark's next round) fails with EBUSY.
//!
//! Every write carries `RWF_NOWAIT`: the kernel does it inline in
//! `io_uring_enter`, on the device thread (which is then charged for it),
//! and answers `-EAGAIN` when the backend is full instead of parking the
//! write on a kernel worker. So every submitted write has completed when
//! [`TxRing::write_frames`] returns, and no guest buffer is referenced after.
#![allow(unsafe_code)]

use std::io;
use std::os::fd::RawFd;

use io_uring::{opcode, register::Restriction, types, IoUring};

use crate::virtio::queue::IoSeg;

/// Frames per submission at most: the ring's size. A TX pass fills at most
/// this many chains before it writes them; 32 makes the system call's cost
/// per frame a thirtieth while a batch of the smallest frames (about 3 µs of
/// TAP work each here) stays within the default 100 µs pass time budget.
pub const TX_BATCH: usize = 32;

/// How many times a write that came back `-EINTR` is resubmitted before it
/// counts as refused (a TAP write does not return it; a backend might).
const EINTR_RETRIES: u32 = 8;

/// An io_uring that may only write frames to one backend fd.
pub struct TxRing {
    ring: IoUring,
    /// The backend: the device owns it and outlives the ring.
    fd: RawFd,
}

impl std::fmt::Debug for TxRing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TxRing").finish_non_exhaustive()
    }
}

impl TxRing {
    /// Builds a ring restricted to writes on `fd` (see the module doc).
    /// Fails where io_uring is unavailable (old kernel, `io_uring_disabled`
    /// sysctl, a seccomp filter already in place); the device then writes
    /// frame by frame.
    pub fn new(fd: RawFd) -> io::Result<TxRing> {
        let ring = IoUring::builder()
            .setup_r_disabled()
            // No IORING_SETUP_SINGLE_ISSUER: the ring is built on the thread
            // that builds the VM, and used on the event loop's.
            .setup_coop_taskrun()
            .build(TX_BATCH as u32)?;
        let submitter = ring.submitter();
        let mut rules = [
            Restriction::sqe_op(opcode::Write::CODE),
            Restriction::sqe_op(opcode::Writev::CODE),
            // No IOSQE_* flag: no links, drains or forced async workers.
            Restriction::sqe_flags_allowed(0),
        ];
        submitter.register_restrictions(&mut rules)?;
        submitter.register_enable_rings()?;
        Ok(TxRing { ring, fd })
    }

    /// Writes each of `frames` frames (`frame(i)`: the segments of frame
    /// `i`) as one write to the registered fd, all in one submission, and
    /// stores in `out[i]` the bytes written of frame `i` or its error. At most [`TX_BATCH`] frames;
    /// frames past that get `WouldBlock` (not tried). The writes are
    /// independent: one refused frame does not stop the others. (`EAGAIN`,
    /// the one refusal that leaves a frame to retry, would let the frames
    /// after it overtake it; a TAP does not return it unless its send buffer
    /// was limited with `TUNSETSNDBUF`.)
    ///
    /// # Errors
    /// When `io_uring_enter` itself fails (not `EINTR`): the frames it did
    /// not write keep `WouldBlock` in `out`, and the ring must be dropped at
    /// once: entries it did not take are still queued and point at buffers
    /// the caller will reuse.
    pub fn write_frames<'a>(
        &mut self,
        frames: usize,
        frame: impl Fn(usize) -> &'a [IoSeg],
        out: &mut [io::Result<usize>],
    ) -> io::Result<()> {
        let n = frames.min(out.len()).min(TX_BATCH);
        for r in out.iter_mut() {
            *r = Err(io::ErrorKind::WouldBlock.into());
        }
        let mut tries = [0u32; TX_BATCH];
        for i in 0..n {
            self.push(i, frame(i))?;
        }
        let mut left = n;
        while left > 0 {
            // Returns once every write completed: they all run inline
            // (RWF_NOWAIT), so this does not sleep on the backend. A failed
            // call took no entry.
            match self.ring.submit_and_wait(left) {
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            }
            let mut retry = [0usize; TX_BATCH];
            let mut nretry = 0;
            for c in self.ring.completion() {
                let i = c.user_data() as usize;
                let res = c.result();
                left -= 1;
                if res == -libc::EINTR && tries[i] < EINTR_RETRIES {
                    tries[i] += 1;
                    retry[nretry] = i;
                    nretry += 1;
                } else if res >= 0 {
                    out[i] = Ok(res as usize);
                } else {
                    out[i] = Err(io::Error::from_raw_os_error(-res));
                }
            }
            for &i in &retry[..nretry] {
                self.push(i, frame(i))?;
                left += 1;
            }
        }
        Ok(())
    }

    /// Queues the write of frame `i`.
    fn push(&mut self, i: usize, segs: &[IoSeg]) -> io::Result<()> {
        let file = types::Fd(self.fd);
        let entry = match segs {
            // One segment: a plain write, which skips the vector import.
            [seg] => opcode::Write::new(file, seg.base() as *const u8, seg.len() as u32)
                .rw_flags(libc::RWF_NOWAIT)
                .build(),
            _ => opcode::Writev::new(file, segs.as_ptr().cast::<libc::iovec>(), segs.len() as u32)
                .rw_flags(libc::RWF_NOWAIT)
                .build(),
        }
        .user_data(i as u64);
        // SAFETY: the entry points at `segs` (an array with the layout of
        // `struct iovec`, see `IoSeg`) and at the guest memory they describe,
        // which stays mapped while the device holds its `GuestMemory`. Both
        // outlive the write: `write_frames` returns only once every entry it
        // queued has completed, or with an error after which the caller
        // drops the ring with any entry the kernel did not take.
        let pushed = unsafe { self.ring.submission().push(&entry) };
        pushed.map_err(|_| io::Error::other("io_uring submission queue full"))
    }
}
