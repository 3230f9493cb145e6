// SPDX-License-Identifier: Apache-2.0
//! Batched writes: one `io_uring_enter` for a whole batch of buffers, each
//! written to one fd as a write of its own.
//!
//! Any device whose backend takes one request per system call can use it;
//! the network device does for TX. A TAP takes one frame per `write`, and on
//! the development hosts a system call's entry and exit cost about a tenth
//! of a small frame's whole cost (BENCHMARKS.md). [`WriteRing`] hands a
//! batch of frames to the kernel in one submission instead: each frame is
//! still one write of its own (a TAP keeps frame boundaries per write), from
//! the guest's memory, zero-copy.
//!
//! What the ring may do is fixed when it is built, before the VMM installs
//! its seccomp filters, because operations submitted through a ring are not
//! system calls a filter sees (`restricted_ring`, which the block
//! device's ring is built with too):
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
//! [`WriteRing::write_frames`] returns, and no guest buffer is referenced after.
#![allow(unsafe_code)]

use std::io;
use std::os::fd::RawFd;

use io_uring::{opcode, register::Restriction, types, IoUring};

use crate::virtio::queue::IoSeg;

/// Writes per submission at most: the ring's size. The network device's TX
/// pass fills at most this many chains before it writes them; 32 makes the system call's cost
/// per frame a thirtieth while a batch of the smallest frames (about 3 µs of
/// TAP work each here) stays within the default 100 µs pass time budget.
pub const MAX_BATCH: usize = 32;

/// What [`WriteRing::write_frames`] leaves for a frame it did not write.
pub const NOT_TRIED: i32 = i32::MIN;

/// How a device submits its backend I/O (the name and the values are
/// Firecracker's block `io_engine`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum IoEngine {
    /// Batched submissions through io_uring: for the network device up to
    /// [`MAX_BATCH`] TX frames per `io_uring_enter` on a ring that may only
    /// write to the backend; for the block device several requests per
    /// submission, completed on the event loop. Falls back to `Sync` where
    /// the host refuses io_uring.
    #[default]
    Async,
    /// One system call per frame or request (`writev`, `preadv`, `pwritev`).
    Sync,
}

/// An io_uring that may only write to one backend fd.
pub struct WriteRing {
    ring: IoUring,
    /// The backend: the device owns it and outlives the ring.
    fd: RawFd,
}

impl std::fmt::Debug for WriteRing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WriteRing").finish_non_exhaustive()
    }
}

impl WriteRing {
    /// Builds a ring restricted to writes on `fd` (see the module doc).
    /// Fails where io_uring is unavailable (old kernel, `io_uring_disabled`
    /// sysctl, a seccomp filter already in place); the device then writes
    /// frame by frame.
    pub fn new(fd: RawFd) -> io::Result<WriteRing> {
        let ring = restricted_ring(
            // No IORING_SETUP_SINGLE_ISSUER: the ring is built on the thread
            // that builds the VM, and used on the event loop's.
            IoUring::builder().setup_coop_taskrun(),
            MAX_BATCH as u32,
            &[opcode::Write::CODE, opcode::Writev::CODE],
        )?;
        Ok(WriteRing { ring, fd })
    }

    /// Writes each of `frames` frames (`frame(i)`: the segments of frame
    /// `i`) as one write to the backend, all in one submission, and stores
    /// in `out[i]` what the write returned: bytes written, or a negated
    /// errno. At most [`MAX_BATCH`] frames; the others get [`NOT_TRIED`]. The
    /// writes are independent: one refused frame does not stop the others.
    /// (`-EAGAIN`, the one refusal that leaves a frame to retry, would let
    /// the frames after it overtake it; a TAP does not return it unless its
    /// send buffer was limited with `TUNSETSNDBUF`.)
    ///
    /// # Errors
    /// When `io_uring_enter` itself fails (not `EINTR`): the frames it did
    /// not write keep [`NOT_TRIED`], and the ring must be dropped at once:
    /// entries it did not take are still queued and point at buffers the
    /// caller will reuse.
    pub fn write_frames<'a>(
        &mut self,
        frames: usize,
        frame: impl Fn(usize) -> &'a [IoSeg],
        out: &mut [i32],
    ) -> io::Result<()> {
        out.fill(NOT_TRIED);
        let n = frames.min(out.len()).min(MAX_BATCH);
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
            for c in self.ring.completion() {
                // Only our own indices come back (user_data is the index).
                if let Some(r) = out.get_mut(c.user_data() as usize) {
                    *r = c.result();
                    left -= 1;
                }
            }
        }
        Ok(())
    }

    /// Writes each of `bufs` (host memory) as one frame, exactly as
    /// [`write_frames`](Self::write_frames) writes guest frames: the
    /// benchmark's batched raw loop goes through here, so the limit it
    /// measures batches the way the device does.
    ///
    /// # Errors
    /// As `write_frames`.
    pub fn write_bufs(&mut self, bufs: &[&[u8]], out: &mut [i32]) -> io::Result<()> {
        // SAFETY: an empty placeholder; only the first `bufs.len()`
        // entries, set below, are written from.
        let mut segs = [unsafe { IoSeg::new(0, 0) }; MAX_BATCH];
        for (seg, buf) in segs.iter_mut().zip(bufs) {
            // SAFETY: `buf` is borrowed for this whole call, which returns
            // only once the kernel is done with it (see `write_frames`).
            *seg = unsafe { IoSeg::new(buf.as_ptr() as usize, buf.len()) };
        }
        let segs = &segs;
        self.write_frames(bufs.len(), |i| std::slice::from_ref(&segs[i]), out)
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

/// Builds a ring of `entries` entries with `builder`'s setup, disabled
/// until it is restricted to the opcodes `ops` with no `IOSQE_*` flag (no
/// links, drains or forced async workers) and no further
/// `io_uring_register` operation, then enabled: what the ring may do is
/// fixed before the VMM's seccomp filters, which do not see what a ring
/// runs.
pub(crate) fn restricted_ring(
    builder: &mut io_uring::Builder,
    entries: u32,
    ops: &[u8],
) -> io::Result<IoUring> {
    let ring = builder.setup_r_disabled().build(entries)?;
    let submitter = ring.submitter();
    let mut rules: Vec<Restriction> = ops.iter().map(|&op| Restriction::sqe_op(op)).collect();
    rules.push(Restriction::sqe_flags_allowed(0));
    submitter.register_restrictions(&mut rules)?;
    submitter.register_enable_rings()?;
    Ok(ring)
}

/// Checks that a [`restricted_ring`] refuses any further `io_uring_register`
/// operation, here registering `fd` as a fixed file.
#[cfg(test)]
pub(crate) fn assert_registering_refused(ring: &IoUring, fd: RawFd) {
    let err = ring.submitter().register_files(&[fd]).unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::EACCES));
}

/// A ring without the restrictions that only the calling thread may submit
/// on (IORING_SETUP_SINGLE_ISSUER): from the event loop's thread every
/// submission fails, which is how the device's fallback is tested.
#[cfg(test)]
pub(crate) fn single_issuer_ring(fd: RawFd) -> io::Result<WriteRing> {
    let ring = IoUring::builder()
        .setup_single_issuer()
        .build(MAX_BATCH as u32)?;
    Ok(WriteRing { ring, fd })
}

#[cfg(test)]
mod tests {
    use std::os::fd::AsRawFd;
    use std::os::linux::net::SocketAddrExt;
    use std::os::unix::net::{SocketAddr, UnixDatagram};
    use std::sync::mpsc;
    use std::time::Duration;

    use io_uring::squeue::{Entry, Flags};

    use super::*;
    use crate::virtio::net::tap::SeqPacket;

    impl WriteRing {
        /// Submits `entry` alone and returns its completion's result.
        ///
        /// # Safety
        /// What `entry` points at must stay valid until this returns.
        unsafe fn submit_one(&mut self, entry: &Entry) -> i32 {
            // SAFETY: the caller keeps the entry's buffers alive until we
            // return, and we return once it has completed.
            unsafe { self.ring.submission().push(entry) }.expect("an empty ring has room");
            self.ring.submit_and_wait(1).expect("io_uring_enter");
            self.ring
                .completion()
                .next()
                .expect("a completion")
                .result()
        }
    }

    /// `len` bytes that differ from frame to frame (`seed`) and along the
    /// frame, so a frame cut short, reordered or pieced together wrongly
    /// shows.
    fn pattern(len: usize, seed: u8) -> Vec<u8> {
        (0..len)
            .map(|i| seed.wrapping_mul(31).wrapping_add((i * 7 + i / 251) as u8))
            .collect()
    }

    /// `frame` cut into segments of `lens` bytes, which add up to its
    /// length. The segments point into `frame`, which must outlive them.
    fn cut(frame: &[u8], lens: &[usize]) -> Vec<IoSeg> {
        assert_eq!(lens.iter().sum::<usize>(), frame.len());
        let mut off = 0;
        lens.iter()
            .map(|&l| {
                // SAFETY: a range of `frame`, which the caller keeps alive
                // while the segment is used.
                let seg = unsafe { IoSeg::new(frame.as_ptr() as usize + off, l) };
                off += l;
                seg
            })
            .collect()
    }

    /// `frames` as one segment each.
    fn whole(frames: &[Vec<u8>]) -> Vec<Vec<IoSeg>> {
        frames.iter().map(|f| cut(f, &[f.len()])).collect()
    }

    /// Writes the frames of `segs` in one call and returns what each write
    /// returned; panics if the submission itself fails.
    fn write(ring: &mut WriteRing, segs: &[Vec<IoSeg>]) -> Vec<i32> {
        let mut out = vec![0; segs.len()];
        if let Err(e) = ring.write_frames(segs.len(), |i| &segs[i], &mut out) {
            panic!("the submission failed: {e}");
        }
        out
    }

    /// Every message waiting at `peer`, which must be non-blocking.
    fn received(peer: &SeqPacket) -> Vec<Vec<u8>> {
        let mut buf = vec![0u8; 1 << 16];
        std::iter::from_fn(|| peer.recv(&mut buf).ok().map(|n| buf[..n].to_vec())).collect()
    }

    /// Every write of `out` took its frame of `frames` whole, and the peer
    /// received them all, in order.
    fn assert_sent_whole(out: &[i32], frames: &[Vec<u8>], peer: &SeqPacket) {
        let lens: Vec<i32> = frames.iter().map(|f| f.len() as i32).collect();
        assert_eq!(out, lens);
        assert_eq!(received(peer), frames);
    }

    /// A socket pair whose device end takes a whole batch without EAGAIN
    /// (SO_SNDBUF as large as the host allows) and whose peer does not
    /// block.
    fn roomy_pair() -> (SeqPacket, SeqPacket) {
        let (dev, peer) = SeqPacket::pair().unwrap();
        dev.set_send_buffer(usize::MAX).unwrap();
        peer.set_nonblocking(true).unwrap();
        (dev, peer)
    }

    #[test]
    fn test_host_buffers_go_out_as_frames_like_guest_ones() {
        // The benchmark's batched raw loop writes through write_bufs.
        let (dev, peer) = roomy_pair();
        let mut ring = WriteRing::new(dev.as_raw_fd()).unwrap();
        let frames: Vec<Vec<u8>> = (0..5).map(|i| pattern(60 + 700 * i, i as u8)).collect();
        let bufs: Vec<&[u8]> = frames.iter().map(Vec::as_slice).collect();
        let mut out = vec![0; bufs.len()];
        ring.write_bufs(&bufs, &mut out).unwrap();
        assert_sent_whole(&out, &frames, &peer);
    }

    #[test]
    fn test_a_full_batch_of_every_shape_reaches_the_peer_whole_and_in_order() {
        let (dev, peer) = roomy_pair();
        let mut ring = WriteRing::new(dev.as_raw_fd()).unwrap();
        // One segment goes as a plain WRITE, more as a WRITEV: both, with
        // empty segments and a frame in many pieces among them.
        let shapes: [&[usize]; 7] = [
            &[60],
            &[12, 1514],
            &[1],
            &[12, 0, 100, 88],
            &[9000],
            &[4; 19],
            &[12, 100, 1, 0, 2887],
        ];
        let lens: Vec<&[usize]> = (0..MAX_BATCH).map(|i| shapes[i % shapes.len()]).collect();
        let frames: Vec<Vec<u8>> = lens
            .iter()
            .enumerate()
            .map(|(i, l)| pattern(l.iter().sum(), i as u8))
            .collect();
        let segs: Vec<Vec<IoSeg>> = frames.iter().zip(&lens).map(|(f, l)| cut(f, l)).collect();
        let out = write(&mut ring, &segs);
        assert_sent_whole(&out, &frames, &peer);
    }

    #[test]
    fn test_frames_past_the_ring_size_are_not_tried() {
        let (dev, peer) = roomy_pair();
        let mut ring = WriteRing::new(dev.as_raw_fd()).unwrap();
        let frames: Vec<Vec<u8>> = (0..MAX_BATCH + 8).map(|i| pattern(100, i as u8)).collect();
        let out = write(&mut ring, &whole(&frames));
        assert_eq!(out[..MAX_BATCH], [100; MAX_BATCH]);
        assert_eq!(out[MAX_BATCH..], [NOT_TRIED; 8]);
        assert_eq!(received(&peer), frames[..MAX_BATCH]);
    }

    /// Without RWF_NOWAIT io_uring would park a write to a full socket until
    /// the peer reads, O_NONBLOCK or not, and `write_frames` would wait.
    #[test]
    fn test_a_full_backend_answers_eagain_at_once_and_takes_the_rest_later() {
        let (dev, peer) = SeqPacket::pair().unwrap();
        peer.set_nonblocking(true).unwrap();
        // The kernel doubles it: room for two of these frames.
        dev.set_send_buffer(4096).unwrap();
        let frames: Vec<Vec<u8>> = (0..8).map(|i| pattern(3000, i)).collect();
        let mut ring = WriteRing::new(dev.as_raw_fd()).unwrap();
        let (done, finished) = mpsc::channel();
        // The thread owns the frames: if it hangs in the kernel, what the
        // stuck write points at stays alive.
        std::thread::spawn(move || {
            let segs = whole(&frames);
            let out = write(&mut ring, &segs);
            done.send((ring, frames, out)).unwrap();
        });
        let (mut ring, frames, out) = match finished.recv_timeout(Duration::from_secs(10)) {
            Ok(done) => done,
            Err(mpsc::RecvTimeoutError::Timeout) => panic!("write_frames waited for the peer"),
            Err(mpsc::RecvTimeoutError::Disconnected) => panic!("the writing thread panicked"),
        };
        let sent = out.iter().take_while(|&&r| r == 3000).count();
        assert!((1..frames.len()).contains(&sent), "{out:?}");
        assert!(out[sent..].iter().all(|&r| r == -libc::EAGAIN), "{out:?}");
        let mut got = received(&peer);
        assert_eq!(got, frames[..sent]);
        // What was refused goes on the same ring once the peer reads.
        while got.len() < frames.len() {
            let rest = whole(&frames[got.len()..]);
            let out = write(&mut ring, &rest);
            assert_eq!(out[0], 3000, "an empty socket refused a frame");
            got.extend(received(&peer));
        }
        assert_eq!(got, frames);
    }

    #[test]
    fn test_a_vanished_peer_fails_the_writes_and_the_ring_writes_on_after() {
        let (dev, peer) = UnixDatagram::pair().unwrap();
        let mut ring = WriteRing::new(dev.as_raw_fd()).unwrap();
        let frames: Vec<Vec<u8>> = (0..3).map(|i| pattern(200, i)).collect();
        let segs = whole(&frames);
        drop(peer);
        let out = write(&mut ring, &segs);
        // The first write finds the peer gone (ECONNREFUSED), the others
        // the socket no longer connected: refusals, not a full backend.
        assert_eq!(out[0], -libc::ECONNREFUSED);
        assert_eq!(out[1..], [-libc::ENOTCONN; 2]);
        // Pointed at another peer, the same fd on the same ring writes.
        let name = format!("minivmm-uring-test-{}", std::process::id());
        let addr = SocketAddr::from_abstract_name(name).unwrap();
        let peer = UnixDatagram::bind_addr(&addr).unwrap();
        dev.connect_addr(&addr).unwrap();
        let out = write(&mut ring, &segs);
        assert_eq!(out, [200; 3]);
        peer.set_nonblocking(true).unwrap();
        let mut buf = [0u8; 512];
        for f in &frames {
            let n = peer.recv(&mut buf).unwrap();
            assert_eq!(buf[..n], f[..]);
        }
    }

    #[test]
    fn test_the_ring_refuses_other_operations_sqe_flags_and_registrations() {
        let (dev, peer) = roomy_pair();
        let mut ring = WriteRing::new(dev.as_raw_fd()).unwrap();
        let fd = types::Fd(dev.as_raw_fd());
        // Something to read, so that a READ let through completes rather
        // than waits.
        peer.send(&[1; 8]).unwrap();
        let data = [0x5au8; 16];
        let mut buf = [0u8; 16];
        let write = || opcode::Write::new(fd, data.as_ptr(), 16).build();
        let writev_iov = [libc::iovec {
            iov_base: data.as_ptr() as *mut libc::c_void,
            iov_len: 16,
        }];
        let writev = || opcode::Writev::new(fd, writev_iov.as_ptr(), 1).build();
        // A plain WRITE and WRITEV go through: the refusals below are the
        // restrictions' doing.
        for e in [write(), writev()] {
            // SAFETY: `data` and `writev_iov` outlive the call.
            assert_eq!(unsafe { ring.submit_one(&e) }, 16);
        }
        let refused = [
            ("NOP", opcode::Nop::new().build()),
            ("READ", opcode::Read::new(fd, buf.as_mut_ptr(), 16).build()),
            ("FSYNC", opcode::Fsync::new(fd).build()),
            ("WRITE with IO_LINK", write().flags(Flags::IO_LINK)),
            ("WRITE with IO_HARDLINK", write().flags(Flags::IO_HARDLINK)),
            ("WRITE with IO_DRAIN", write().flags(Flags::IO_DRAIN)),
            ("WRITEV with ASYNC", writev().flags(Flags::ASYNC)),
        ];
        for (what, e) in &refused {
            // SAFETY: `data`, `buf` and `writev_iov` outlive the call.
            let res = unsafe { ring.submit_one(e) };
            assert_eq!(res, -libc::EACCES, "{what}");
        }
        assert_eq!(received(&peer), vec![data.to_vec(); 2]);
        assert_registering_refused(&ring.ring, dev.as_raw_fd());
        let mut rules = [Restriction::sqe_op(opcode::Nop::CODE)];
        let err = ring.ring.submitter().register_restrictions(&mut rules);
        assert!(err.is_err(), "restrictions registered twice");
    }

    /// The VMM builds the ring with the VM and submits on the event loop's
    /// thread; a ring tied to its builder (IORING_SETUP_SINGLE_ISSUER) fails
    /// every submission there with EEXIST.
    #[test]
    fn test_a_ring_built_on_one_thread_writes_from_another() {
        let (dev, peer) = roomy_pair();
        let mut ring = WriteRing::new(dev.as_raw_fd()).unwrap();
        let frames: Vec<Vec<u8>> = (0..4).map(|i| pattern(300, i)).collect();
        let segs = whole(&frames);
        let out = std::thread::scope(|s| s.spawn(|| write(&mut ring, &segs)).join().unwrap());
        assert_eq!(out, [300; 4]);
        assert_eq!(received(&peer), frames);
    }

    /// The check above fails when it should: a single-issuer ring refuses
    /// a submission from another thread as a whole.
    #[test]
    fn test_a_single_issuer_ring_fails_from_another_thread() {
        let (dev, peer) = roomy_pair();
        let mut ring = single_issuer_ring(dev.as_raw_fd()).unwrap();
        let frames = vec![pattern(300, 1)];
        let segs = whole(&frames);
        let mut out = [0];
        let res = std::thread::scope(|s| {
            s.spawn(|| ring.write_frames(1, |i| &segs[i], &mut out))
                .join()
                .unwrap()
        });
        assert_eq!(res.unwrap_err().raw_os_error(), Some(libc::EEXIST));
        assert_eq!(out, [NOT_TRIED]);
        assert!(received(&peer).is_empty());
    }
}
