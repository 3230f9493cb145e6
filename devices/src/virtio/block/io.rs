// SPDX-License-Identifier: Apache-2.0
//! Running requests: one system call at a time (`IoEngine::Sync`) or
//! through the io_uring (`IoEngine::Async`, [`AsyncEngine`]), and answering
//! each exactly once.
//!
//! **Errors and short transfers.** A transfer that moved fewer bytes than
//! asked (a short `preadv`/`pwritev`, or a completion that says so) goes on
//! with the remainder: POSIX allows a regular file to do that (a signal, a
//! transfer over 2 GiB, a file system's own limits), and virtio-blk has no
//! partial status, so only the whole transfer is OK. A transfer that moves
//! nothing (0: the file shrank under the device) or fails (EIO, ENOSPC,
//! EAGAIN, which a blocking regular file never returns in the normal
//! course) is answered VIRTIO_BLK_S_IOERR. EINTR is retried. Retries and
//! continuations are bounded ([`MAX_ATTEMPTS`]), so a backend that keeps
//! moving one byte at a time cannot hold the event loop.
//!
//! **Used length.** The bytes the device wrote into the chain: for IN the
//! data bytes actually read (all of them when OK) plus the status byte, for
//! GET_ID the id bytes plus the status byte, 1 otherwise.
//!
//! **In flight.** A request handed to the ring is owned by its slot in
//! [`AsyncEngine`] until its completion is reaped: its vector of segments
//! is what the kernel reads the iovec array from, and the memory they
//! describe is kept mapped by the engine's clone of guest memory. On reset
//! (and drop) the engine waits for every completion before it lets a
//! request go ([`AsyncEngine::quiesce`]): the kernel then holds no pointer
//! into guest memory, and no completion can land in the buffers of a
//! driver that has started over. Cancelling instead (IORING_OP_ASYNC_CANCEL)
//! would need a fifth opcode and still wait for a request already running
//! in a kernel worker, which a regular file's I/O usually is. Should
//! waiting itself fail, the requests and a clone of guest memory are leaked
//! rather than freed under the kernel.
//!
//! The one `unsafe` call here is that contract: handing a slot's vector to
//! the ring ([`BlockRing::push`]), which only this module's slot table can
//! promise to keep.
#![allow(unsafe_code)]

use std::io;

use super::backend::{BlockBackend, FallocMode, OpKind};
use super::metrics::{BlockMetrics, Tally};
use super::request::{Op, Request, VIRTIO_BLK_S_IOERR, VIRTIO_BLK_S_OK};
use super::uring::{BlockRing, RingOp, RING_ENTRIES};
use super::{ID_BYTES, SEG_MAX};
use crate::virtio::events;
use crate::virtio::iov;
use crate::virtio::queue::{split_seg, IoSeg, SplitQueue};
use crate::virtio::GuestMemory;
use crate::warn::warn_rate_limited;

/// Attempts of one request at most: EINTR retries and continuations of
/// short transfers together.
pub const MAX_ATTEMPTS: u32 = 64;

/// Drops the first `n` bytes of `segs[*start..]`, moving `start` past the
/// segments they used up.
fn advance(segs: &mut [IoSeg], start: &mut usize, mut n: usize) {
    while n > 0 && *start < segs.len() {
        let seg = segs[*start];
        if seg.len() <= n {
            n -= seg.len();
            *start += 1;
        } else {
            segs[*start] = split_seg(seg, n).1;
            n = 0;
        }
    }
}

/// Vectors of data segments of answered requests, for the next requests to
/// reuse: a request then allocates nothing (an allocation and a free per
/// request were about a sixth of the device's user-space instructions per
/// request). Bounded: no more vectors than requests can be outstanding at
/// once (the ring's, and the one being read), and none longer than a
/// request of `SEG_MAX` data buffers needs, so a guest's odd request
/// cannot make the pool hold more memory than ordinary ones do.
#[derive(Debug, Default)]
pub(crate) struct SegPool {
    free: Vec<Vec<IoSeg>>,
}

/// Most vectors the pool keeps.
pub(crate) const POOL_VECS: usize = RING_ENTRIES as usize + 1;
/// Largest capacity of a vector the pool keeps.
pub(crate) const POOL_VEC_CAP: usize = SEG_MAX as usize + 2;

impl SegPool {
    /// An empty vector, from the pool if it has one.
    pub(crate) fn take(&mut self) -> Vec<IoSeg> {
        self.free.pop().unwrap_or_default()
    }

    /// Takes `v` back, emptied, unless the pool is full or `v` is larger
    /// than a request needs.
    pub(crate) fn give(&mut self, mut v: Vec<IoSeg>) {
        if self.free.len() < POOL_VECS && v.capacity() <= POOL_VEC_CAP {
            v.clear();
            self.free.push(v);
        }
    }

    /// Vectors held.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.free.len()
    }
}

/// Writes the status byte, returns the chain with `data_written + 1` bytes
/// and counts the outcome (successes in `tally`, failures at once).
pub(crate) fn finish(
    queue: &mut SplitQueue,
    req: &Request,
    status: u8,
    data_written: u64,
    tally: &mut Tally,
    metrics: &BlockMetrics,
) {
    iov::write_bytes_at(std::slice::from_ref(&req.status), 0, &[status]);
    // data_written <= the chain's writable bytes - 1 < u32::MAX.
    let used = u32::try_from(data_written + 1).unwrap_or(u32::MAX);
    queue.add_used(req.head, used);
    if status != VIRTIO_BLK_S_OK {
        let n = events::inc(&metrics.io_errors);
        warn_rate_limited!(count = n, "virtio-blk: {:?} failed", req.op);
        return;
    }
    let t = tally;
    match req.op {
        Op::Read { len, .. } => {
            t.read_count += 1;
            t.read_bytes += len;
        }
        Op::Write { len, .. } => {
            t.write_count += 1;
            t.write_bytes += len;
        }
        Op::Flush => t.flush_count += 1,
        Op::GetId { .. } => t.get_id_count += 1,
        Op::Discard { .. } => t.discard_count += 1,
        Op::WriteZeroes { .. } => t.write_zeroes_count += 1,
    }
}

/// What a request needs from the image, if anything.
pub(crate) enum Needs {
    /// Nothing: answered as it is (GET_ID, FLUSH of an `Unsafe` cache, an
    /// empty range) with this status and these data bytes written.
    Nothing(u8, u64),
    /// A system call or a ring entry.
    Io,
}

/// Runs the requests that need no I/O: GET_ID (the id, zero padded),
/// FLUSH with `flush` off, DISCARD/WRITE_ZEROES of 0 sectors.
pub(crate) fn without_io(req: &Request, id: &[u8; ID_BYTES], flush: bool) -> Needs {
    match req.op {
        Op::GetId { len } => {
            let n = iov::copy_to_segs(&req.data, 0, &id[..len.min(ID_BYTES)]);
            Needs::Nothing(VIRTIO_BLK_S_OK, n as u64)
        }
        Op::Flush if !flush => Needs::Nothing(VIRTIO_BLK_S_OK, 0),
        Op::Discard { len: 0, .. } | Op::WriteZeroes { len: 0, .. } => {
            Needs::Nothing(VIRTIO_BLK_S_OK, 0)
        }
        _ => Needs::Io,
    }
}

/// The `fallocate` mode of a DISCARD or WRITE_ZEROES.
fn falloc_mode(op: &Op) -> FallocMode {
    match op {
        Op::WriteZeroes { unmap: false, .. } => FallocMode::ZeroRange,
        _ => FallocMode::PunchHole,
    }
}

/// Runs `req` with one system call at a time (see the module doc);
/// returns its status and the data bytes written into guest memory.
pub(crate) fn run_sync<B: BlockBackend>(backend: &mut B, req: &mut Request) -> (u8, u64) {
    let mut attempts = 0;
    let mut done = 0u64;
    let mut start = 0usize;
    let op = req.op;
    loop {
        attempts += 1;
        if attempts > MAX_ATTEMPTS {
            return (VIRTIO_BLK_S_IOERR, read_bytes(&op, done));
        }
        let res = match op {
            Op::Read { offset, len } | Op::Write { offset, len } => {
                let segs = &req.data[start..];
                let r = if matches!(op, Op::Read { .. }) {
                    backend.read_at(segs, offset + done)
                } else {
                    backend.write_at(segs, offset + done)
                };
                match r {
                    Ok(0) => Err(io::Error::from_raw_os_error(libc::EIO)),
                    Ok(n) => {
                        let n = (n as u64).min(len - done);
                        done += n;
                        advance(&mut req.data, &mut start, n as usize);
                        if done < len {
                            continue;
                        }
                        Ok(())
                    }
                    Err(e) => Err(e),
                }
            }
            Op::Flush => backend.datasync(),
            Op::Discard { offset, len } | Op::WriteZeroes { offset, len, .. } => {
                backend.fallocate(falloc_mode(&op), offset, len)
            }
            Op::GetId { .. } => Ok(()),
        };
        match res {
            Ok(()) => return (VIRTIO_BLK_S_OK, read_bytes(&op, done)),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(_) => return (VIRTIO_BLK_S_IOERR, read_bytes(&op, done)),
        }
    }
}

/// Data bytes written into guest memory by a request that moved `done`
/// bytes: only IN writes guest memory.
fn read_bytes(op: &Op, done: u64) -> u64 {
    match op {
        Op::Read { .. } => done,
        _ => 0,
    }
}

/// A request on the ring.
#[derive(Debug)]
struct InFlight {
    req: Request,
    /// Bytes moved so far.
    done: u64,
    /// `req.data[start..]` is what is left to move.
    start: usize,
    attempts: u32,
}

/// How one completion ended.
enum Step {
    /// Submit the rest (or again).
    Again,
    /// Answer with this status.
    Done(u8),
}

/// The io_uring engine: the ring and the requests in flight on it.
#[derive(Debug)]
pub struct AsyncEngine {
    ring: BlockRing,
    /// Requests by tag (the slot index); `RING_ENTRIES` slots.
    slots: Vec<Option<InFlight>>,
    free: Vec<usize>,
    /// Keeps the memory of the in-flight requests mapped.
    mem: GuestMemory,
    completions: Vec<(u64, i32)>,
    /// Entries pushed since the last submission.
    unsubmitted: bool,
}

impl AsyncEngine {
    /// Wraps a ring built for the image.
    pub(crate) fn new(ring: BlockRing, mem: GuestMemory) -> Self {
        let n = RING_ENTRIES as usize;
        AsyncEngine {
            ring,
            slots: (0..n).map(|_| None).collect(),
            free: (0..n).rev().collect(),
            mem,
            completions: Vec::with_capacity(n),
            unsubmitted: false,
        }
    }

    /// The ring, whose fd polls readable while completions wait.
    pub(crate) fn ring(&self) -> &BlockRing {
        &self.ring
    }

    /// Whether another request may go in flight.
    pub(crate) fn has_room(&self) -> bool {
        !self.free.is_empty() && self.ring.has_room()
    }

    /// Requests in flight.
    pub(crate) fn in_flight(&self) -> usize {
        self.slots.len() - self.free.len()
    }

    /// Queues the entry for the slot's request (what is left of it).
    fn push_slot(&mut self, slot: usize) -> io::Result<()> {
        let Some(f) = self.slots[slot].as_ref() else {
            return Err(io::Error::other("empty slot"));
        };
        let segs = &f.req.data[f.start..];
        let op = match f.req.op {
            Op::Read { offset, .. } => RingOp::Read {
                segs,
                offset: offset + f.done,
            },
            Op::Write { offset, .. } => RingOp::Write {
                segs,
                offset: offset + f.done,
            },
            Op::Flush => RingOp::Flush,
            Op::Discard { offset, len } | Op::WriteZeroes { offset, len, .. } => {
                RingOp::Fallocate {
                    mode: falloc_mode(&f.req.op),
                    offset,
                    len,
                }
            }
            // Never pushed: answered without I/O.
            Op::GetId { .. } => return Err(io::Error::other("GET_ID on the ring")),
        };
        // SAFETY: the segments are `slots[slot].req.data`, a vector neither
        // moved nor freed until the completion tagged `slot` is reaped
        // (`complete` and `quiesce` are the only places a slot is emptied,
        // after its completion); the guest memory they describe stays
        // mapped through `self.mem`.
        unsafe { self.ring.push(op, slot as u64) }?;
        self.unsubmitted = true;
        Ok(())
    }

    /// Puts `req` in flight; gives it back if the ring has no room or
    /// refuses the entry (the caller then runs it synchronously).
    pub(crate) fn start(&mut self, req: Request) -> Result<(), Request> {
        let Some(slot) = self.free.pop() else {
            return Err(req);
        };
        self.slots[slot] = Some(InFlight {
            req,
            done: 0,
            start: 0,
            attempts: 1,
        });
        if self.push_slot(slot).is_err() {
            self.free.push(slot);
            let f = self.slots[slot].take().expect("the slot was just filled");
            return Err(f.req);
        }
        Ok(())
    }

    /// Submits what was queued. On failure the entries stay queued and go
    /// with the next submission.
    pub(crate) fn submit(&mut self, metrics: &BlockMetrics) -> io::Result<()> {
        if !self.unsubmitted {
            return Ok(());
        }
        self.ring.submit()?;
        self.unsubmitted = false;
        events::inc(&metrics.ring_submissions);
        metrics.max_in_flight.fetch_max(
            self.in_flight() as u64,
            std::sync::atomic::Ordering::Relaxed,
        );
        Ok(())
    }

    /// What one completion means for its request.
    fn step<B: BlockBackend>(backend: &mut B, f: &mut InFlight, res: i32) -> Step {
        let kind = match f.req.op {
            Op::Read { .. } => OpKind::Read,
            Op::Write { .. } => OpKind::Write,
            Op::Flush => OpKind::Flush,
            _ => OpKind::Fallocate,
        };
        let res = backend.completed(kind, res);
        let again = f.attempts < MAX_ATTEMPTS;
        if res == -libc::EINTR {
            return if again {
                Step::Again
            } else {
                Step::Done(VIRTIO_BLK_S_IOERR)
            };
        }
        if res < 0 {
            return Step::Done(VIRTIO_BLK_S_IOERR);
        }
        match f.req.op {
            Op::Read { len, .. } | Op::Write { len, .. } => {
                if res == 0 {
                    return Step::Done(VIRTIO_BLK_S_IOERR);
                }
                let n = (res as u64).min(len - f.done);
                f.done += n;
                advance(&mut f.req.data, &mut f.start, n as usize);
                if f.done == len {
                    Step::Done(VIRTIO_BLK_S_OK)
                } else if again {
                    Step::Again
                } else {
                    Step::Done(VIRTIO_BLK_S_IOERR)
                }
            }
            _ => Step::Done(VIRTIO_BLK_S_OK),
        }
    }

    /// Reaps every completion posted so far: requests done are answered
    /// into `queue` (their vectors go back to `pool`), the others submitted
    /// again. Returns the requests answered.
    pub(crate) fn complete<B: BlockBackend>(
        &mut self,
        backend: &mut B,
        queue: &mut SplitQueue,
        tally: &mut Tally,
        pool: &mut SegPool,
        metrics: &BlockMetrics,
    ) -> usize {
        let mut completions = std::mem::take(&mut self.completions);
        completions.clear();
        self.ring.reap(&mut completions);
        let mut answered = 0;
        for &(tag, res) in &completions {
            let slot = tag as usize;
            let Some(mut f) = self.slots.get_mut(slot).and_then(Option::take) else {
                events::inc(&metrics.host_errors);
                log::error!("virtio-blk: io_uring completion with unknown tag {tag}");
                continue;
            };
            let step = Self::step(backend, &mut f, res);
            let status = match step {
                Step::Again => {
                    f.attempts += 1;
                    self.slots[slot] = Some(f);
                    if self.push_slot(slot).is_ok() {
                        continue;
                    }
                    // Cannot happen (the slot's own entry was just reaped,
                    // so the ring has room); answered as failed, never lost.
                    f = self.slots[slot].take().expect("the slot was just filled");
                    VIRTIO_BLK_S_IOERR
                }
                Step::Done(status) => status,
            };
            self.free.push(slot);
            let written = read_bytes(&f.req.op, f.done);
            finish(queue, &f.req, status, written, tally, metrics);
            pool.give(f.req.data);
            answered += 1;
        }
        self.completions = completions;
        if let Err(e) = self.submit(metrics) {
            events::inc(&metrics.host_errors);
            log::error!("virtio-blk: io_uring submission failed: {e}");
        }
        answered
    }

    /// Waits until a completion is posted ([`complete`](Self::complete)
    /// answers it).
    pub(crate) fn wait(&mut self) -> io::Result<()> {
        self.ring.wait_one()
    }

    /// Points later requests at the image `fd` (nothing may be in flight).
    pub(crate) fn set_fd(&mut self, fd: std::os::fd::RawFd) {
        self.ring.set_fd(fd);
    }

    /// Waits for every request in flight and forgets them unanswered (the
    /// driver reset the device: there is no queue to answer into). See the
    /// module doc.
    pub(crate) fn quiesce(&mut self) {
        let mut done = Vec::new();
        let res = self.ring.wait_all(&mut done);
        if let Err(e) = res {
            log::error!(
                "virtio-blk: cannot wait for {} requests in flight ({e}); their buffers are leaked",
                self.in_flight()
            );
            for slot in self.slots.iter_mut() {
                if let Some(f) = slot.take() {
                    std::mem::forget(f);
                }
            }
            std::mem::forget(self.mem.clone());
            // The ring must not be used again: every slot is taken.
            self.free.clear();
            return;
        }
        for (i, slot) in self.slots.iter_mut().enumerate() {
            if slot.take().is_some() {
                self.free.push(i);
            }
        }
        self.unsubmitted = false;
    }
}

impl Drop for AsyncEngine {
    fn drop(&mut self) {
        if self.in_flight() > 0 {
            self.quiesce();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A vector with room for `cap` segments.
    fn with_cap(cap: usize) -> Vec<IoSeg> {
        Vec::with_capacity(cap)
    }

    #[test]
    fn test_the_pool_hands_back_emptied_vectors_and_keeps_a_bounded_number() {
        let mut pool = SegPool::default();
        assert_eq!(
            pool.take().capacity(),
            0,
            "an empty pool makes a new vector"
        );
        let mut v = with_cap(8);
        // SAFETY: the segment is never used for I/O; only its value is kept.
        v.push(unsafe { IoSeg::new(0x1000, 16) });
        pool.give(v);
        assert_eq!(pool.len(), 1);
        let back = pool.take();
        assert!(
            back.is_empty() && back.capacity() >= 8,
            "emptied, capacity kept"
        );
        assert_eq!(pool.len(), 0);
        // Request-sized vectors only: room for SEG_MAX (126) data buffers,
        // the header and the status byte.
        pool.give(with_cap(128));
        assert_eq!(pool.len(), 1);
        pool.give(with_cap(129));
        assert_eq!(
            pool.len(),
            1,
            "a vector larger than a request needs is dropped"
        );
        // At most one per request the ring holds (128) and the one being
        // read.
        for _ in 0..200 {
            pool.give(with_cap(4));
        }
        assert_eq!(pool.len(), 129);
    }
}
