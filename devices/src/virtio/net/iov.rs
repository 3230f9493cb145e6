// SPDX-License-Identifier: Apache-2.0
//! I/O vectors over guest memory, and the `readv`/`writev` calls that use them.
//!
//! This is where the zero-copy datapath touches raw pointers. An [`IoSeg`] is
//! only ever created by [`push_guest_range`], from a `VolatileSlice` that
//! vm-memory checked to lie inside one mapped guest memory region, so every
//! segment the kernel reads or writes is guest RAM. The device keeps its
//! `GuestMemoryMmap` (which owns the mappings through an `Arc`) for as long as
//! it holds segments, and guest memory is never unmapped while the VM runs,
//! so a segment stays valid between the time it is built and the syscall.
#![allow(unsafe_code)]

use std::io;
use std::os::fd::RawFd;

use vm_memory::{GuestAddress, GuestMemoryBackend, VolatileSlice};

use crate::virtio::GuestMemory;

/// One contiguous host-virtual range of guest memory, laid out exactly like
/// `struct iovec` so a slice of segments can be handed to `readv`/`writev`.
/// The address is kept as an integer so the device stays `Send`; it is only
/// turned back into a pointer by the kernel during the syscall.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct IoSeg {
    base: usize,
    len: usize,
}

const _: () = assert!(std::mem::size_of::<IoSeg>() == std::mem::size_of::<libc::iovec>());
const _: () = assert!(std::mem::align_of::<IoSeg>() == std::mem::align_of::<libc::iovec>());

impl IoSeg {
    /// Length of the segment in bytes.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.len
    }
}

/// Largest number of segments one `readv`/`writev` accepts (Linux UIO_MAXIOV).
pub(crate) const IOV_MAX: usize = 1024;

/// Appends the segments covering `len` bytes of guest memory at `addr`
/// (more than one when the range crosses a memory region boundary).
/// Returns false, leaving `out` as it was, when any byte of the range is not
/// guest memory.
pub(crate) fn push_guest_range(
    mem: &GuestMemory,
    addr: GuestAddress,
    len: usize,
    out: &mut Vec<IoSeg>,
) -> bool {
    // Fast path: nearly every buffer lies inside one region, and one region
    // lookup is far cheaper than the general multi-region iterator (the chain
    // walk was the largest user-space cost per frame under callgrind).
    if let Ok(slice) = mem.get_slice(addr, len) {
        out.push(IoSeg {
            base: slice.ptr_guard_mut().as_ptr() as usize,
            len: slice.len(),
        });
        return true;
    }
    let start = out.len();
    for slice in GuestMemoryBackend::get_slices(mem, addr, len) {
        match slice {
            Ok(slice) => out.push(IoSeg {
                base: slice.ptr_guard_mut().as_ptr() as usize,
                len: slice.len(),
            }),
            Err(_) => {
                out.truncate(start);
                return false;
            }
        }
    }
    true
}

fn cvt(ret: isize) -> io::Result<usize> {
    if ret < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(ret as usize)
    }
}

/// One `readv` from `fd` into `segs` and then `tail` (a host buffer used to
/// detect frames longer than the guest buffers). `segs` is restored before
/// returning.
pub(crate) fn readv(fd: RawFd, segs: &mut Vec<IoSeg>, tail: &mut [u8]) -> io::Result<usize> {
    segs.push(IoSeg {
        base: tail.as_mut_ptr() as usize,
        len: tail.len(),
    });
    let count = segs.len().min(IOV_MAX) as libc::c_int;
    // SAFETY: IoSeg has the layout of `struct iovec` (asserted above). Every
    // segment but the last was built by `push_guest_range` from a slice
    // vm-memory checked to be inside a mapped guest region, and the device
    // holds the `GuestMemoryMmap` (so the mapping) for the whole call; the
    // last points to `tail`, which is exclusively borrowed for the call. The
    // kernel writes at most `len` bytes into each.
    let ret = unsafe { libc::readv(fd, segs.as_ptr().cast::<libc::iovec>(), count) };
    segs.pop();
    cvt(ret)
}

/// One `writev` of `segs` to `fd`.
pub(crate) fn writev(fd: RawFd, segs: &[IoSeg]) -> io::Result<usize> {
    let count = segs.len().min(IOV_MAX) as libc::c_int;
    // SAFETY: IoSeg has the layout of `struct iovec`; every segment was built
    // by `push_guest_range` inside a mapped guest region that stays mapped
    // while the device holds its `GuestMemoryMmap`. The kernel only reads.
    let ret = unsafe { libc::writev(fd, segs.as_ptr().cast::<libc::iovec>(), count) };
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
    // SAFETY: the segment was built by `push_guest_range` from a VolatileSlice
    // over a mapped guest region that outlives the returned slice (the device
    // holds the memory), and its length is unchanged.
    unsafe { VolatileSlice::new(seg.base as *mut u8, seg.len) }
}

/// Copies `data` into the segments in order (bounce-buffer baseline);
/// returns the bytes copied.
pub(crate) fn copy_to_segs(segs: &[IoSeg], data: &[u8]) -> usize {
    let mut done = 0;
    for seg in segs {
        if done == data.len() {
            break;
        }
        let n = seg.len.min(data.len() - done);
        if let Ok(dst) = volatile(seg).subslice(0, n) {
            dst.copy_from(&data[done..done + n]);
        }
        done += n;
    }
    done
}

/// Copies the segments in order into `out` (bounce-buffer baseline).
pub(crate) fn copy_from_segs(segs: &[IoSeg], out: &mut Vec<u8>) {
    out.clear();
    for seg in segs {
        let start = out.len();
        out.resize(start + seg.len, 0);
        volatile(seg).copy_to(&mut out[start..]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

    #[test]
    fn test_push_guest_range_splits_and_rejects() {
        let mem: GuestMemory = GuestMemoryMmap::from_ranges(&[
            (GuestAddress(0), 0x1000),
            (GuestAddress(0x1000), 0x1000),
            (GuestAddress(0x4000), 0x1000),
        ])
        .unwrap();
        let mut segs = Vec::new();
        // Crosses the boundary between two adjacent regions: two segments.
        assert!(push_guest_range(
            &mem,
            GuestAddress(0xf00),
            0x200,
            &mut segs
        ));
        assert_eq!(segs.len(), 2);
        assert_eq!(segs[0].len() + segs[1].len(), 0x200);
        // Runs into the hole at 0x2000: refused, nothing appended.
        assert!(!push_guest_range(
            &mem,
            GuestAddress(0x1f00),
            0x200,
            &mut segs
        ));
        assert!(!push_guest_range(&mem, GuestAddress(0x8000), 1, &mut segs));
        assert!(!push_guest_range(
            &mem,
            GuestAddress(u64::MAX),
            2,
            &mut segs
        ));
        assert_eq!(segs.len(), 2);

        // The bounce copies go through the same segments.
        copy_to_segs(&segs, &[7u8; 0x200]);
        let mut back = Vec::new();
        copy_from_segs(&segs, &mut back);
        assert_eq!(back, vec![7u8; 0x200]);
        assert_eq!(mem.read_obj::<u8>(GuestAddress(0x10ff)).unwrap(), 7);
        assert_eq!(mem.read_obj::<u8>(GuestAddress(0x1100)).unwrap(), 0);
    }
}
