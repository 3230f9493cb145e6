// SPDX-License-Identifier: Apache-2.0
//! The system calls and copies on I/O vectors over guest memory.
//!
//! This is where the zero-copy datapath hands guest memory to the kernel. An
//! [`IoSeg`] over guest memory only comes from a checked translation in
//! [`crate::virtio::queue`], which also explains why it stays mapped: the
//! device holds the queue's `Arc<GuestRegions>` (and through it the
//! `GuestMemoryMmap`) for as long as it holds segments. The only other
//! segments are host buffers built here and borrowed for one call.
#![allow(unsafe_code)]

use std::io;
use std::os::fd::RawFd;

use vm_memory::VolatileSlice;

use crate::virtio::queue::{IoSeg, IOV_MAX};

fn cvt(ret: isize) -> io::Result<usize> {
    if ret < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(ret as usize)
    }
}

// readv/writev go to the kernel through syscall(2) rather than libc's
// wrappers: those are thread-cancellation points and bracket the call with
// __pthread_enable/disable_asynccancel, about 35 of the 50 user-space
// instructions each frame's system call cost under callgrind. The device
// thread is never cancelled.

/// One `readv` from `fd` into `segs[from..]` and then `tail` (a host buffer
/// used to detect frames longer than the guest buffers). `segs` is restored
/// before returning. Inlined into the RX pass, where the push and pop fold
/// away (out of line they cost about 30 instructions per frame).
#[inline]
pub(crate) fn readv(
    fd: RawFd,
    segs: &mut Vec<IoSeg>,
    from: usize,
    tail: &mut [u8],
) -> io::Result<usize> {
    // SAFETY: `tail` is a live, exclusively borrowed host buffer, and the
    // segment is popped before the borrow ends.
    segs.push(unsafe { IoSeg::new(tail.as_mut_ptr() as usize, tail.len()) });
    let live = &segs[from.min(segs.len() - 1)..];
    let count = live.len().min(IOV_MAX) as libc::c_int;
    // SAFETY: readv(fd, iov, iovcnt): IoSeg has the layout of `struct
    // iovec` (asserted where it is defined). Every segment but the last is mapped guest memory (see the
    // module docs); the last points to `tail`. The kernel writes at most
    // `len` bytes into each.
    let ret = unsafe { libc::syscall(libc::SYS_readv, fd, live.as_ptr(), count) } as isize;
    segs.pop();
    cvt(ret)
}

/// One `writev` of `segs` to `fd`.
pub(crate) fn writev(fd: RawFd, segs: &[IoSeg]) -> io::Result<usize> {
    let count = segs.len().min(IOV_MAX) as libc::c_int;
    // SAFETY: writev(fd, iov, iovcnt): IoSeg has the layout of `struct
    // iovec`; every segment is mapped guest memory (see the module docs). The kernel only reads.
    let ret = unsafe { libc::syscall(libc::SYS_writev, fd, segs.as_ptr(), count) } as isize;
    cvt(ret)
}

/// `read` into a host buffer (the bounce-buffer baseline).
pub(crate) fn read(fd: RawFd, buf: &mut [u8]) -> io::Result<usize> {
    // SAFETY: `buf` is a live, exclusively borrowed slice of `buf.len()` bytes.
    let ret = unsafe { libc::read(fd, buf.as_mut_ptr().cast(), buf.len()) };
    cvt(ret)
}

/// `write` from a host buffer (the bounce-buffer baseline).
pub(crate) fn write(fd: RawFd, buf: &[u8]) -> io::Result<usize> {
    // SAFETY: `buf` is a live slice of `buf.len()` readable bytes.
    let ret = unsafe { libc::write(fd, buf.as_ptr().cast(), buf.len()) };
    cvt(ret)
}

fn volatile(seg: &IoSeg) -> VolatileSlice<'_> {
    // SAFETY: the segment is mapped guest memory that outlives the returned
    // slice (module docs), and its length is unchanged.
    unsafe { VolatileSlice::new(seg.base() as *mut u8, seg.len()) }
}

/// Copies `data` into the segments from byte `offset` on, in order; returns
/// the bytes copied (fewer when the segments end first).
pub(crate) fn copy_to_segs(segs: &[IoSeg], mut offset: usize, data: &[u8]) -> usize {
    let mut done = 0;
    for seg in segs {
        if done == data.len() {
            break;
        }
        if offset >= seg.len() {
            offset -= seg.len();
            continue;
        }
        let n = (seg.len() - offset).min(data.len() - done);
        if let Ok(dst) = volatile(seg).subslice(offset, n) {
            dst.copy_from(&data[done..done + n]);
        }
        done += n;
        offset = 0;
    }
    done
}

/// Writes a few bytes (a header field) at byte `offset` of the segments.
/// The same as [`copy_to_segs`] without the bulk-copy machinery.
pub(crate) fn write_bytes_at(segs: &[IoSeg], mut offset: usize, data: &[u8]) {
    let mut bytes = data.iter();
    for seg in segs {
        if offset >= seg.len() {
            offset -= seg.len();
            continue;
        }
        for i in offset..seg.len() {
            let Some(b) = bytes.next() else {
                return;
            };
            // SAFETY: i < len, so the byte is inside the segment: mapped
            // guest memory (module docs), written volatile because the guest
            // may access it concurrently.
            unsafe { std::ptr::write_volatile((seg.base() + i) as *mut u8, *b) };
        }
        offset = 0;
    }
}

/// Copies the segments in order into `out` (bounce-buffer baseline).
pub(crate) fn copy_from_segs(segs: &[IoSeg], out: &mut Vec<u8>) {
    out.clear();
    for seg in segs {
        let start = out.len();
        out.resize(start + seg.len(), 0);
        volatile(seg).copy_to(&mut out[start..]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::virtio::queue::GuestRegions;
    use crate::virtio::GuestMemory;
    use vm_memory::{Bytes, GuestAddress};

    #[test]
    fn test_copies_go_through_split_segments() {
        let mem =
            GuestMemory::from_ranges(&[(GuestAddress(0), 0x1000), (GuestAddress(0x1000), 0x1000)])
                .unwrap();
        let regions = GuestRegions::new(&mem).unwrap();
        let mut segs = Vec::new();
        assert!(regions.push_segments(0xf00, 0x200, &mut segs));
        assert_eq!(segs.len(), 2);
        let data: Vec<u8> = (0..0x200).map(|i| i as u8).collect();
        assert_eq!(copy_to_segs(&segs, 0, &data), 0x200);
        let mut back = Vec::new();
        copy_from_segs(&segs, &mut back);
        assert_eq!(back, data);
        assert_eq!(mem.read_obj::<u8>(GuestAddress(0x10ff)).unwrap(), 0xff);
        assert_eq!(mem.read_obj::<u8>(GuestAddress(0x1100)).unwrap(), 0);
        // From an offset across the boundary, and past the end.
        assert_eq!(copy_to_segs(&segs, 0xff, &[0xaa, 0xbb]), 2);
        assert_eq!(mem.read_obj::<u8>(GuestAddress(0xfff)).unwrap(), 0xaa);
        assert_eq!(mem.read_obj::<u8>(GuestAddress(0x1000)).unwrap(), 0xbb);
        assert_eq!(copy_to_segs(&segs, 0x1ff, &[1, 2, 3]), 1);
        write_bytes_at(&segs, 0xff, &[5, 6]);
        assert_eq!(mem.read_obj::<u16>(GuestAddress(0xfff)).unwrap(), 0x0605);
        write_bytes_at(&segs, 0x1ff, &[7, 8]);
        assert_eq!(mem.read_obj::<u8>(GuestAddress(0x10ff)).unwrap(), 7);
    }
}
