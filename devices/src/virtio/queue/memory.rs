// SPDX-License-Identifier: Apache-2.0
//! Guest memory as the datapath sees it: a snapshot of the regions, taken
//! once per activation, and the host-side views built from it.
//!
//! vm-memory checks every access against its region list, which is what a
//! VMM wants on cold paths and what cost most of the per-frame instructions
//! on the hot one (callgrind: ~420 instructions per TX frame in the chain
//! walk alone). [`GuestRegions`] keeps the few regions of a VM as plain
//! `(guest base, length, host address)` triples, so translating a buffer is a
//! short linear scan and an addition.
//!
//! This module is where raw host pointers into guest memory come from:
//! - [`IoSeg`]: a host range for `readv`/`writev`, made only from a checked
//!   translation (or, in `iov`, from a host buffer borrowed for one call);
//! - [`HostArea`]: a ring area or indirect table, made only from a range that
//!   lies inside one region, with volatile and atomic accessors that take
//!   offsets the owner keeps in bounds by construction.
//!
//! Both stay valid because [`GuestRegions`] holds a clone of the
//! `GuestMemoryMmap` (which owns the mappings through `Arc`s), every holder
//! of segments or areas keeps an `Arc<GuestRegions>` next to them, and guest
//! memory is never unmapped while a VM runs.
//!
//! Guest memory is shared with the guest, which may write any byte at any
//! time from another vCPU. Nothing here ever forms a Rust reference to it:
//! every access is a volatile or atomic access through a raw pointer, and
//! each value read is copied out once and then only used from the copy.
#![allow(unsafe_code)]

use std::sync::atomic::{AtomicU16, Ordering};

use vm_memory::{GuestMemoryBackend, GuestMemoryRegion, MemoryRegionAddress};

use crate::virtio::GuestMemory;

/// Largest number of segments one `readv`/`writev` accepts (Linux UIO_MAXIOV).
pub const IOV_MAX: usize = 1024;

/// Why guest memory cannot be used by the datapath.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum MemoryError {
    /// A region is not mapped in this process (no host address).
    #[error("guest memory region at {0:#x} has no host mapping")]
    NoHostAddress(u64),
    /// A region ends past the 64-bit guest or host address space.
    #[error("guest memory region at {0:#x} wraps the address space")]
    Wraps(u64),
}

/// One guest memory region: `[gpa, gpa + len)` is mapped at `host`.
/// Neither `gpa + len` nor `host + len` overflows (checked in `new`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Region {
    gpa: u64,
    len: u64,
    host: usize,
}

/// A snapshot of guest memory for the datapath.
pub struct GuestRegions {
    /// Sorted by guest address, non-overlapping (vm-memory guarantees both).
    regions: Box<[Region]>,
    /// Keeps every mapping alive as long as any translation from it is used.
    _mapped: GuestMemory,
    /// Where the buffers a device may write are marked, when the VM tracks
    /// dirty pages for Diff snapshots.
    dirty: Option<std::sync::Arc<super::dirty::DirtyPages>>,
}

impl std::fmt::Debug for GuestRegions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list()
            .entries(
                self.regions
                    .iter()
                    .map(|r| (r.gpa, r.gpa.wrapping_add(r.len))),
            )
            .finish()
    }
}

impl GuestRegions {
    /// Takes the snapshot.
    pub fn new(mem: &GuestMemory) -> Result<Self, MemoryError> {
        let mut regions = Vec::with_capacity(mem.num_regions());
        for r in mem.iter() {
            let gpa = r.start_addr().0;
            let host = r
                .get_host_address(MemoryRegionAddress(0))
                .map_err(|_| MemoryError::NoHostAddress(gpa))? as usize;
            let len = r.len();
            let host_len = usize::try_from(len).map_err(|_| MemoryError::Wraps(gpa))?;
            if gpa.checked_add(len).is_none() || host.checked_add(host_len).is_none() {
                return Err(MemoryError::Wraps(gpa));
            }
            regions.push(Region { gpa, len, host });
        }
        Ok(GuestRegions {
            regions: regions.into_boxed_slice(),
            _mapped: mem.clone(),
            dirty: None,
        })
    }

    /// Has every writable buffer translated through this view marked in
    /// `log` (see [`super::dirty`]).
    pub fn with_dirty_log(mut self, log: Option<std::sync::Arc<super::dirty::DirtyPages>>) -> Self {
        self.dirty = log;
        self
    }

    /// Marks `[gpa, gpa + len)` as possibly written by the device, when
    /// dirty pages are tracked.
    #[inline]
    pub(crate) fn mark_written(&self, gpa: u64, len: u32) {
        if let Some(log) = &self.dirty {
            log.mark(gpa, u64::from(len));
        }
    }

    /// Whether this snapshot was taken of the same mappings as `mem`.
    pub fn is_snapshot_of(&self, mem: &GuestMemory) -> bool {
        self.regions.len() == mem.num_regions()
            && self.regions.iter().zip(mem.iter()).all(|(a, b)| {
                a.gpa == b.start_addr().0
                    && a.len == b.len()
                    && b.get_host_address(MemoryRegionAddress(0))
                        .is_ok_and(|h| h as usize == a.host)
            })
    }

    /// The region holding `gpa` and the offset of `gpa` in it.
    #[inline]
    fn find(&self, gpa: u64) -> Option<(&Region, u64)> {
        // A VM has one to three regions: a scan beats a binary search.
        self.regions.iter().find_map(|r| {
            let off = gpa.wrapping_sub(r.gpa);
            (off < r.len).then_some((r, off))
        })
    }

    /// The host address of `[gpa, gpa + len)` if the whole range lies inside
    /// one region (`len` > 0).
    #[inline]
    pub(crate) fn host_range(&self, gpa: u64, len: u64) -> Option<usize> {
        let (r, off) = self.find(gpa)?;
        // off < r.len, so the subtraction cannot wrap; off fits usize
        // because r.len does (checked in `new`).
        (len > 0 && len <= r.len - off).then_some(r.host + off as usize)
    }

    /// `[gpa, gpa + len)` as one host segment, if the whole range lies
    /// inside one region (`len` > 0): the balloon's way from a page frame
    /// number the guest sent to the memory it names.
    #[inline]
    pub(crate) fn segment(&self, gpa: u64, len: u64) -> Option<IoSeg> {
        let host = self.host_range(gpa, len)?;
        // SAFETY: `host_range` found [host, host + len) inside one region,
        // which `self._mapped` keeps mapped; `len` fits usize because the
        // region's length does (checked in `new`).
        Some(unsafe { IoSeg::new(host, len as usize) })
    }

    /// `[gpa, gpa + len)` as a [`HostArea`] aligned to `align` bytes on the
    /// host side too, if it lies inside one region.
    pub(crate) fn area(&self, gpa: u64, len: usize, align: usize) -> Option<HostArea> {
        let host = self.host_range(gpa, len as u64)?;
        (host % align == 0).then_some(HostArea { base: host, len })
    }

    /// Appends the segments covering `len` bytes at `gpa` (several when the
    /// range crosses region boundaries). Returns false, leaving `out` as it
    /// was, when any byte of the range is not guest memory.
    #[inline]
    pub(crate) fn push_segments(&self, gpa: u64, len: u32, out: &mut Vec<IoSeg>) -> bool {
        self.push_segments_seen(gpa, len, out, |_| {})
    }

    /// [`push_segments`](Self::push_segments), handing `seen` the segment
    /// when the range is one segment (the usual case) while it is still at
    /// hand; a range over several regions is not shown to it.
    #[inline(always)]
    pub(crate) fn push_segments_seen(
        &self,
        gpa: u64,
        len: u32,
        out: &mut Vec<IoSeg>,
        seen: impl FnOnce(IoSeg),
    ) -> bool {
        let Some((r, off)) = self.find(gpa) else {
            return false;
        };
        let len = u64::from(len);
        if len <= r.len - off {
            // SAFETY: [host + off, host + off + len) lies inside region `r`,
            // which `self._mapped` keeps mapped.
            let seg = unsafe { IoSeg::new(r.host + off as usize, len as usize) };
            seen(seg);
            out.push(seg);
            return true;
        }
        self.push_split(gpa, len, out)
    }

    /// The slow path of `push_segments`: a range over several regions.
    #[cold]
    fn push_split(&self, mut gpa: u64, mut len: u64, out: &mut Vec<IoSeg>) -> bool {
        let start = out.len();
        while len > 0 {
            let Some((r, off)) = self.find(gpa) else {
                out.truncate(start);
                return false;
            };
            let n = len.min(r.len - off);
            // SAFETY: [host + off, host + off + n) lies inside region `r`,
            // which `self._mapped` keeps mapped.
            out.push(unsafe { IoSeg::new(r.host + off as usize, n as usize) });
            len -= n;
            // r.gpa + r.len does not overflow (checked in `new`), and
            // gpa + n <= r.gpa + r.len.
            gpa += n;
        }
        true
    }
}

/// One contiguous host-virtual range, laid out exactly like `struct iovec`
/// so a slice of segments can be handed to `readv`/`writev`. The address is
/// an integer so the device stays `Send`; it only becomes a pointer again in
/// the system call or a volatile copy.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IoSeg {
    base: usize,
    len: usize,
}

const _: () = assert!(std::mem::size_of::<IoSeg>() == std::mem::size_of::<libc::iovec>());
const _: () = assert!(std::mem::align_of::<IoSeg>() == std::mem::align_of::<libc::iovec>());

impl IoSeg {
    /// # Safety
    ///
    /// `[base, base + len)` must be host memory that the process may read and
    /// write, and must stay mapped as long as the segment is used: guest
    /// memory kept alive by a [`GuestRegions`], or a host buffer borrowed for
    /// the duration of one system call.
    pub(crate) unsafe fn new(base: usize, len: usize) -> Self {
        IoSeg { base, len }
    }

    /// Host address of the first byte.
    pub fn base(&self) -> usize {
        self.base
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the segment is empty (never, for one made by a translation).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

/// A ring area or indirect table: `len` bytes of guest memory at host
/// address `base`, inside one region of the [`GuestRegions`] it came from.
///
/// The accessors are `unsafe` only because they take a byte offset that the
/// caller must keep inside the area: each owner (the rings in `queue`, the
/// descriptor tables in `chain`) derives its offsets from an index it masks
/// or range-checks against the length it created the area with, and says so
/// at the call. Debug builds check the offsets again.
#[derive(Debug, Clone, Copy)]
pub(crate) struct HostArea {
    base: usize,
    len: usize,
}

impl HostArea {
    /// Length of the area in bytes.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    #[inline]
    fn ptr(&self, off: usize, size: usize) -> *mut u8 {
        debug_assert!(off + size <= self.len, "{off}+{size} > {}", self.len);
        (self.base + off) as *mut u8
    }

    /// Atomic 16-bit load with acquire ordering (`avail.idx`).
    ///
    /// # Safety
    ///
    /// `off + 2 <= len`, and `off` is 2-aligned in an area created with
    /// `align` >= 2.
    #[inline]
    pub(crate) unsafe fn load_u16_acquire(&self, off: usize) -> u16 {
        let p = self.ptr(off, 2).cast::<u16>();
        // SAFETY: in bounds and aligned per the contract; the area is mapped
        // guest memory (module docs), only ever accessed through raw
        // pointers, never through references.
        u16::from_le(unsafe { AtomicU16::from_ptr(p) }.load(Ordering::Acquire))
    }

    /// Atomic 16-bit store with release ordering (`used.idx`).
    ///
    /// # Safety
    ///
    /// As for [`load_u16_acquire`](Self::load_u16_acquire).
    #[inline]
    pub(crate) unsafe fn store_u16_release(&self, off: usize, v: u16) {
        let p = self.ptr(off, 2).cast::<u16>();
        // SAFETY: as in `load_u16_acquire`.
        unsafe { AtomicU16::from_ptr(p) }.store(v.to_le(), Ordering::Release);
    }

    /// Volatile 16-bit read.
    ///
    /// # Safety
    ///
    /// As for [`load_u16_acquire`](Self::load_u16_acquire).
    #[inline]
    pub(crate) unsafe fn read_u16(&self, off: usize) -> u16 {
        let p = self.ptr(off, 2).cast::<u16>();
        // SAFETY: in bounds and aligned per the contract; mapped guest memory.
        u16::from_le(unsafe { std::ptr::read_volatile(p) })
    }

    /// Volatile 16-bit write.
    ///
    /// # Safety
    ///
    /// As for [`load_u16_acquire`](Self::load_u16_acquire).
    #[inline]
    pub(crate) unsafe fn write_u16(&self, off: usize, v: u16) {
        let p = self.ptr(off, 2).cast::<u16>();
        // SAFETY: in bounds and aligned per the contract; mapped guest memory.
        unsafe { std::ptr::write_volatile(p, v.to_le()) }
    }

    /// Volatile write of two consecutive 32-bit values (a used element).
    ///
    /// # Safety
    ///
    /// `off + 8 <= len`, and `off` is 4-aligned in an area created with
    /// `align` >= 4.
    #[inline]
    pub(crate) unsafe fn write_u32_pair(&self, off: usize, a: u32, b: u32) {
        let p = self.ptr(off, 8).cast::<u32>();
        // SAFETY: in bounds and aligned per the contract; mapped guest memory.
        unsafe {
            std::ptr::write_volatile(p, a.to_le());
            std::ptr::write_volatile(p.add(1), b.to_le());
        }
    }

    /// One volatile copy of the 16 bytes at `off` (a descriptor), as two
    /// little-endian 64-bit words.
    ///
    /// # Safety
    ///
    /// `off + 16 <= len` (any alignment).
    #[inline]
    pub(crate) unsafe fn read_16(&self, off: usize) -> [u64; 2] {
        let p = self.ptr(off, 16);
        if p as usize & 7 == 0 {
            let p = p.cast::<u64>();
            // SAFETY: in bounds per the contract, 8-aligned (just checked);
            // mapped guest memory.
            unsafe {
                [
                    u64::from_le(std::ptr::read_volatile(p)),
                    u64::from_le(std::ptr::read_volatile(p.add(1))),
                ]
            }
        } else {
            // An indirect table may sit at any address.
            // SAFETY: in bounds per the contract; [u8; 16] has alignment 1.
            let b = unsafe { std::ptr::read_volatile(p.cast::<[u8; 16]>()) };
            let [a0, a1, a2, a3, a4, a5, a6, a7, b0, b1, b2, b3, b4, b5, b6, b7] = b;
            [
                u64::from_le_bytes([a0, a1, a2, a3, a4, a5, a6, a7]),
                u64::from_le_bytes([b0, b1, b2, b3, b4, b5, b6, b7]),
            ]
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use vm_memory::{Bytes, GuestAddress, GuestRegionMmap, MmapRegion};

    fn three_regions() -> GuestMemory {
        GuestMemory::from_ranges(&[
            (GuestAddress(0), 0x1000),
            (GuestAddress(0x1000), 0x1000),
            (GuestAddress(0x4000), 0x1000),
        ])
        .unwrap()
    }

    #[test]
    fn segments_split_at_region_boundaries_and_refuse_holes() {
        let mem = three_regions();
        let r = GuestRegions::new(&mem).unwrap();
        assert!(r.is_snapshot_of(&mem));
        let mut segs = Vec::new();
        // Inside one region: one segment.
        assert!(r.push_segments(0x10, 0x100, &mut segs));
        assert_eq!(segs.len(), 1);
        // Crosses the boundary between two adjacent regions: two segments,
        // and the second one is the start of the second mapping.
        assert!(r.push_segments(0xf00, 0x200, &mut segs));
        assert_eq!(segs.len(), 3);
        assert_eq!((segs[1].len(), segs[2].len()), (0x100, 0x100));
        mem.write_obj(0xabu8, GuestAddress(0x1000)).unwrap();
        // SAFETY: the segment is mapped guest memory kept alive by `mem`.
        let first = unsafe { std::ptr::read_volatile(segs[2].base() as *const u8) };
        assert_eq!(first, 0xab);
        // Runs into the hole at 0x2000, starts in it, or wraps: refused,
        // nothing appended.
        for (gpa, len) in [(0x1f00, 0x200), (0x3000, 1), (u64::MAX, 2), (0x4fff, 2)] {
            assert!(!r.push_segments(gpa, len, &mut segs), "{gpa:#x}+{len}");
        }
        assert_eq!(segs.len(), 3);
        // A zero-length range is nothing to map, but must start in memory.
        assert!(r.push_segments(0x4fff, 0, &mut segs));
    }

    #[test]
    fn areas_must_lie_inside_one_region_and_be_aligned() {
        let mem = three_regions();
        let r = GuestRegions::new(&mem).unwrap();
        assert!(r.area(0, 0x1000, 16).is_some());
        // Adjacent regions are still two mappings: an area may not span them.
        assert!(r.area(0xff0, 0x20, 16).is_none());
        assert!(r.area(0x4ff0, 0x20, 16).is_none());
        assert!(r.area(0x2000, 2, 2).is_none());
        assert!(r.area(0x4002, 4, 4).is_none());
        assert!(r.area(0x4004, 4, 4).is_some());
        assert!(r.area(0x10, 0, 2).is_none());
        // Address 0 is an ordinary guest address.
        let a = r.area(0, 16, 4).unwrap();
        assert_eq!(a.len(), 16);
        // SAFETY: every offset below is in bounds and aligned for its size.
        unsafe {
            a.write_u32_pair(0, 7, 9);
            assert_eq!(mem.read_obj::<u32>(GuestAddress(4)).unwrap(), 9);
            a.store_u16_release(2, 0x1234);
            assert_eq!(a.load_u16_acquire(2), 0x1234);
            assert_eq!(a.read_u16(2), 0x1234);
            a.write_u16(8, 0x5678);
            assert_eq!(a.read_16(0), [0x0000_0009_1234_0007, 0x5678]);
            // The same bytes read from an odd address.
            let b = r.area(1, 16, 1).unwrap();
            assert_eq!(b.read_16(0)[0], 0x7800_0000_0912_3400);
        }
    }

    #[test]
    fn a_snapshot_matches_only_the_mappings_it_was_taken_of() {
        // A device checks that the queues the transport hands it were
        // translated through its own guest memory; any difference in the
        // region count, a start, a length or a mapping must be noticed.
        let mem = three_regions();
        let r = GuestRegions::new(&mem).unwrap();
        assert!(r.is_snapshot_of(&mem));
        assert!(
            r.is_snapshot_of(&mem.clone()),
            "a clone shares the mappings"
        );
        let same_layout_other_mapping = three_regions();
        assert!(!r.is_snapshot_of(&same_layout_other_mapping));
        let fewer = GuestMemory::from_ranges(&[(GuestAddress(0), 0x1000)]).unwrap();
        assert!(!r.is_snapshot_of(&fewer));
        let one = GuestRegions::new(&fewer).unwrap();
        assert!(!one.is_snapshot_of(&mem));
        // The same first mapping plus one more region: the count differs
        // while every region both have matches.
        let grown = fewer
            .insert_region(Arc::new(
                GuestRegionMmap::from_range(GuestAddress(0x4000), 0x1000, None).unwrap(),
            ))
            .unwrap();
        assert!(!one.is_snapshot_of(&grown));
        assert!(!GuestRegions::new(&grown).unwrap().is_snapshot_of(&fewer));
        // The same host mapping seen at another guest address, or shorter:
        // each field alone must tell them apart.
        let host = fewer.get_host_address(GuestAddress(0)).unwrap();
        for (gpa, len) in [(0x8000, 0x1000), (0, 0x800)] {
            // SAFETY: [host, host + len) lies inside the live anonymous
            // mapping of `fewer`, which outlives `alias`; a raw region does
            // not unmap on drop.
            let raw = unsafe {
                MmapRegion::build_raw(
                    host,
                    len,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                )
            }
            .unwrap();
            let region = GuestRegionMmap::new(raw, GuestAddress(gpa)).unwrap();
            let alias = GuestMemory::from_regions(vec![region]).unwrap();
            assert!(!one.is_snapshot_of(&alias), "{gpa:#x}+{len:#x}");
        }
    }

    #[test]
    fn translated_segments_are_never_empty() {
        let mem = three_regions();
        let r = GuestRegions::new(&mem).unwrap();
        let mut segs = Vec::new();
        assert!(r.push_segments(0xfff, 2, &mut segs));
        assert!(segs.iter().all(|s| !s.is_empty() && s.len() == 1));
        let mut byte = [0u8; 1];
        // SAFETY: a zero-length segment over a live local buffer.
        let empty = unsafe { IoSeg::new(byte.as_mut_ptr() as usize, 0) };
        assert!(empty.is_empty());
    }
}
