// SPDX-License-Identifier: Apache-2.0
//! The system calls and copies on I/O vectors over guest memory.
//!
//! This is where the zero-copy datapath hands guest memory to the kernel. An
//! [`IoSeg`] over guest memory only comes from a checked translation in
//! [`crate::virtio::queue`], which also explains why it stays mapped: the
//! device holds the queue's `Arc<GuestRegions>` (and through it the
//! `GuestMemoryMmap`) for as long as it holds segments. The only other
//! segments are host buffers built here and borrowed for one call.
//!
//! A backend sees the segments of one call as [`IoVecs`], which it can
//! `readv`/`writev` on its fd or fill and read safely (an in-memory test
//! backend), but not keep past the call.
#![allow(unsafe_code)]

use std::io;
use std::os::fd::RawFd;

use vm_memory::VolatileSlice;

use crate::virtio::queue::IoSeg;

#[inline]
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
//
// One segment goes through read/write instead, as the io_uring TX path
// uses WRITE for it: the kernel then takes it as a single user buffer
// (ITER_UBUF) without copying in and walking an iovec array (`import_iovec`,
// `copy_iovec_from_user`), which a `perf` profile of 64 KiB RX frames put at
// about 1 % of the device thread against the raw loop's `read`. A guest
// receive always has at least two (the truncation byte); a TX chain of one
// descriptor, or a bounce buffer, has one.

/// The buffers of one backend call, valid for that call only: guest memory
/// segments from checked translations and, on receive, a host byte after
/// them that catches frames longer than the guest buffers. A backend gets
/// one from the device and can only read or fill it through the methods
/// here, so it cannot keep a segment past the call.
#[derive(Debug, Clone, Copy)]
pub struct IoVecs<'a> {
    segs: &'a [IoSeg],
}

impl<'a> IoVecs<'a> {
    /// Segments of guest memory, kept mapped for `'a` by the `GuestRegions`
    /// of the queue that translated them (see the module docs).
    #[inline]
    pub(crate) fn guest(segs: &'a [IoSeg]) -> Self {
        IoVecs { segs }
    }

    /// Bytes in all the segments.
    pub fn len(&self) -> usize {
        self.segs.iter().map(IoSeg::len).sum()
    }

    /// Whether there is no byte to transfer.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The vector count for the system call. The chain walk and the RX
    /// cache keep it within IOV_MAX; should that ever fail the kernel refuses
    /// the call (EINVAL) rather than a cap here silently dropping vectors
    /// (on receive the last is the truncation byte, on send the end of the
    /// frame).
    #[inline]
    fn count(&self) -> libc::c_int {
        libc::c_int::try_from(self.segs.len()).unwrap_or(libc::c_int::MAX)
    }

    /// One `readv` from `fd` into the segments (`read` for one segment).
    #[inline]
    pub fn readv(&self, fd: RawFd) -> io::Result<usize> {
        if let [seg] = self.segs {
            // SAFETY: read(fd, buf, len) writes at most `len` bytes at
            // `base`, a writable segment mapped for 'a (as below).
            let ret = unsafe { libc::syscall(libc::SYS_read, fd, seg.base() as *mut u8, seg.len()) }
                as isize;
            return cvt(ret);
        }
        let count = self.count();
        // SAFETY: readv(fd, iov, iovcnt): IoSeg has the layout of `struct
        // iovec` (asserted where it is defined), and every segment is
        // writable memory that stays mapped for 'a: guest memory (module
        // docs) or a host buffer borrowed for 'a (`with_tail`, `host_buf`).
        // The kernel writes at most `len` bytes into each.
        let ret = unsafe { libc::syscall(libc::SYS_readv, fd, self.segs.as_ptr(), count) } as isize;
        cvt(ret)
    }

    /// One `writev` of the segments to `fd` (`write` for one segment).
    #[inline]
    pub fn writev(&self, fd: RawFd) -> io::Result<usize> {
        if let [seg] = self.segs {
            // SAFETY: write(fd, buf, len) reads at most `len` bytes at
            // `base`, a segment mapped for 'a (as below).
            let ret =
                unsafe { libc::syscall(libc::SYS_write, fd, seg.base() as *const u8, seg.len()) }
                    as isize;
            return cvt(ret);
        }
        let count = self.count();
        // SAFETY: writev(fd, iov, iovcnt): IoSeg has the layout of `struct
        // iovec`; every segment is mapped for 'a (as in `readv`). The kernel
        // only reads.
        let ret =
            unsafe { libc::syscall(libc::SYS_writev, fd, self.segs.as_ptr(), count) } as isize;
        cvt(ret)
    }

    /// One `getrandom(2)` straight into the first segment (no host
    /// buffer); the bytes it filled, fewer than the segment's length on a
    /// short return (the caller asks again for the rest). The entropy
    /// device hands its source one segment a call, so a chain costs one
    /// system call per segment.
    ///
    /// `GRND_NONBLOCK`: the event loop must never sleep, and the only wait
    /// getrandom has, for the kernel's pool to be initialised at early
    /// boot, comes back as EAGAIN instead.
    pub fn getrandom(&self) -> io::Result<usize> {
        let Some(seg) = self.segs.first() else {
            return Ok(0);
        };
        // SAFETY: getrandom(buf, len, flags) writes at most `len` bytes at
        // `base`, a writable segment mapped for 'a (as in `readv`).
        let ret = unsafe {
            libc::syscall(
                libc::SYS_getrandom,
                seg.base() as *mut u8,
                seg.len(),
                libc::GRND_NONBLOCK,
            )
        } as isize;
        cvt(ret)
    }

    /// Copies `data` into the segments in order, as a `readv` of a
    /// `data.len()`-byte message would; returns the bytes copied.
    pub fn scatter(&self, data: &[u8]) -> usize {
        copy_to_segs(self.segs, 0, data)
    }

    /// The bytes of the segments in order, as a `writev` would send them.
    pub fn gather(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.len());
        copy_from_segs(self.segs, &mut out);
        out
    }
}

/// Host page size the balloon gives memory back in (x86-64's base page).
pub(crate) const HOST_PAGE_SIZE: usize = 4096;

/// The whole host pages inside `seg` (its start rounded up, its end down to
/// [`HOST_PAGE_SIZE`]), or `None` when it holds none: what may be given
/// back of a range the guest named.
pub(crate) fn whole_pages(seg: IoSeg) -> Option<IoSeg> {
    let start = seg.base().checked_next_multiple_of(HOST_PAGE_SIZE)?;
    let end = (seg.base() + seg.len()) & !(HOST_PAGE_SIZE - 1);
    // SAFETY: [start, end) lies inside the segment's own range, which its
    // holder keeps mapped (module docs).
    (end > start).then(|| unsafe { IoSeg::new(start, end - start) })
}

/// `a` and `b` as one segment when `b` starts where `a` ends: both are
/// mapped guest memory, so the range they cover together is too (two
/// regions' mappings may touch; a range over both is still the guest's).
pub(crate) fn join_segs(a: IoSeg, b: IoSeg) -> Option<IoSeg> {
    let end = a.base().checked_add(a.len())?;
    // SAFETY: [a.base, b.base + b.len) is the union of the two segments'
    // ranges, which touch, and each of which its holder keeps mapped.
    (end == b.base()).then(|| unsafe { IoSeg::new(a.base(), a.len() + b.len()) })
}

/// Gives the pages of `seg` back to the host: `madvise(MADV_DONTNEED)`, the
/// balloon's one way to drop guest memory. The segment must be whole host
/// pages of guest memory (see [`whole_pages`]); anything else is refused
/// with EINVAL before any system call.
///
/// Guest memory is a private anonymous mapping (the VMM's `kvm::memory`):
/// DONTNEED frees the pages and leaves the range mapped, and the next
/// access, by the guest or the device, reads zeros. Nothing in the process
/// holds a Rust reference into guest memory (every access is volatile or
/// atomic through a raw pointer, `queue::memory`), so no reference sees its
/// contents change.
pub(crate) fn discard_pages(seg: IoSeg) -> io::Result<()> {
    if seg.is_empty()
        || !seg.base().is_multiple_of(HOST_PAGE_SIZE)
        || !seg.len().is_multiple_of(HOST_PAGE_SIZE)
    {
        return Err(io::Error::from_raw_os_error(libc::EINVAL));
    }
    // SAFETY: madvise(addr, len, MADV_DONTNEED) on [base, base + len): whole
    // pages (checked above) of guest memory from a checked translation,
    // kept mapped by the `GuestRegions` its holder keeps (module docs). The
    // call only drops the pages' contents (see above); it never unmaps.
    let ret = unsafe {
        libc::madvise(
            seg.base() as *mut libc::c_void,
            seg.len(),
            libc::MADV_DONTNEED,
        )
    };
    if ret == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Calls `f` with `segs[from..]` followed by `tail` (a host buffer used to
/// detect frames longer than the guest buffers). `segs` is restored before
/// returning. Inlined into the RX pass, where the push and pop fold away
/// (out of line they cost about 30 instructions per frame).
#[inline]
pub(crate) fn with_tail<R>(
    segs: &mut Vec<IoSeg>,
    from: usize,
    tail: &mut [u8],
    f: impl FnOnce(IoVecs<'_>) -> R,
) -> R {
    // SAFETY: `tail` is a live, exclusively borrowed host buffer, and the
    // segment is popped before the borrow ends (the IoVecs handed to `f`
    // cannot outlive the call).
    segs.push(unsafe { IoSeg::new(tail.as_mut_ptr() as usize, tail.len()) });
    let live = &segs[from.min(segs.len() - 1)..];
    let r = f(IoVecs { segs: live });
    segs.pop();
    r
}

/// Fills `buf` from `getrandom(2)` (the kernel's CSPRNG), asking again
/// after a short return: MMDS's session tokens and sequence numbers.
pub(crate) fn fill_random(buf: &mut [u8]) -> io::Result<()> {
    let mut done = 0;
    while done < buf.len() {
        match host_buf(&mut buf[done..], |io| io.getrandom()) {
            Ok(0) => return Err(io::Error::from(io::ErrorKind::UnexpectedEof)),
            Ok(n) => done += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Calls `f` with a host buffer as the only segment (the bounce-buffer
/// baseline).
pub(crate) fn host_buf<R>(buf: &mut [u8], f: impl FnOnce(IoVecs<'_>) -> R) -> R {
    // SAFETY: `buf` is a live, exclusively borrowed host buffer for the whole
    // call of `f`, which cannot keep the IoVecs.
    let seg = [unsafe { IoSeg::new(buf.as_mut_ptr() as usize, buf.len()) }];
    f(IoVecs { segs: &seg })
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
/// The same as [`copy_to_segs`] without the bulk-copy machinery. When the
/// first segment holds them all (the usual case), eight bytes a store
/// whatever their alignment: a vsock RX header byte by byte cost about 450
/// instructions a packet.
#[inline]
pub(crate) fn write_bytes_at(segs: &[IoSeg], mut offset: usize, data: &[u8]) {
    if let Some(seg) = segs.first() {
        if offset
            .checked_add(data.len())
            .is_some_and(|end| end <= seg.len())
        {
            let at = seg.base() + offset;
            let mut words = data.chunks_exact(8);
            for (i, word) in (&mut words).enumerate() {
                let mut w = [0u8; 8];
                w.copy_from_slice(word);
                // SAFETY: [at, at + data.len()) lies inside the segment
                // (checked above): mapped guest memory (module docs);
                // `Unaligned` needs no alignment. Volatile because the guest
                // may access it concurrently.
                unsafe {
                    std::ptr::write_volatile(
                        (at + 8 * i) as *mut Unaligned<u64>,
                        Unaligned(u64::from_ne_bytes(w)),
                    );
                }
            }
            let tail = data.len() - data.len() % 8;
            for (i, b) in words.remainder().iter().enumerate() {
                // SAFETY: as above, one byte of the same range.
                unsafe { std::ptr::write_volatile((at + tail + i) as *mut u8, *b) };
            }
            return;
        }
    }
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

/// The `N` bytes at byte `offset` of the segments (a request header), and
/// how many of them the segments hold (the rest are zeros). Read once, so a
/// guest rewriting them meanwhile changes nothing the caller checks. When
/// the first segment holds them all (the usual case), eight bytes a load
/// whatever their alignment: a vsock header byte by byte cost about 400
/// instructions a packet.
#[inline]
pub(crate) fn read_array<const N: usize>(segs: &[IoSeg], offset: usize) -> ([u8; N], usize) {
    if let Some(seg) = segs.first() {
        if offset.checked_add(N).is_some_and(|end| end <= seg.len()) {
            let at = seg.base() + offset;
            let mut out = [0u8; N];
            let mut words = out.chunks_exact_mut(8);
            for (i, word) in (&mut words).enumerate() {
                // SAFETY: [at, at + N) lies inside the segment (checked
                // above): mapped guest memory (module docs); `Unaligned`
                // needs no alignment. Volatile because the guest may write
                // it concurrently.
                let w = unsafe { std::ptr::read_volatile((at + 8 * i) as *const Unaligned<u64>) };
                word.copy_from_slice(&{ w.0 }.to_ne_bytes());
            }
            let tail = N - N % 8;
            for (i, b) in words.into_remainder().iter_mut().enumerate() {
                // SAFETY: as above, one byte of the same range.
                *b = unsafe { std::ptr::read_volatile((at + tail + i) as *const u8) };
            }
            return (out, N);
        }
    }
    let mut out = [0u8; N];
    let n = read_bytes_at(segs, offset, &mut out);
    (out, n)
}

/// A value read from an address of any alignment.
#[repr(C, packed)]
#[derive(Clone, Copy)]
struct Unaligned<T: Copy>(T);

/// The `N` bytes at `at`, read volatile: two or four bytes (an EtherType,
/// an IPv4 address) in one load, as a volatile load of an array is one load
/// per byte.
///
/// # Safety
///
/// `[at, at + N)` must lie inside one segment over mapped guest memory, or
/// inside a static.
#[inline(always)]
unsafe fn load<const N: usize>(at: usize) -> [u8; N] {
    let mut out = [0u8; N];
    match N {
        2 => {
            // SAFETY: [at, at + 2) is mapped guest memory (the caller's
            // contract); `Unaligned` needs no alignment. Volatile because
            // the guest may write it concurrently.
            let v = unsafe { std::ptr::read_volatile(at as *const Unaligned<u16>) };
            out.copy_from_slice(&{ v.0 }.to_ne_bytes());
        }
        4 => {
            // SAFETY: as for two bytes, with [at, at + 4).
            let v = unsafe { std::ptr::read_volatile(at as *const Unaligned<u32>) };
            out.copy_from_slice(&{ v.0 }.to_ne_bytes());
        }
        _ => {
            for (i, b) in out.iter_mut().enumerate() {
                // SAFETY: at + i < at + N: mapped guest memory (the
                // caller's contract); a byte needs no alignment. Volatile as
                // above.
                *b = unsafe { std::ptr::read_volatile((at + i) as *const u8) };
            }
        }
    }
    out
}

/// The first `L` bytes of a segment, or of a static buffer, read in place:
/// an address with at least `L` readable bytes behind it, so a read inside
/// them has no bounds check left at run time.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Prefix<const L: usize>(usize);

impl<const L: usize> Prefix<L> {
    /// The first `L` bytes of `seg`, if it has that many.
    #[inline(always)]
    pub(crate) fn of(seg: IoSeg) -> Option<Self> {
        (seg.len() >= L).then_some(Prefix(seg.base()))
    }

    /// The bytes of `buf`.
    #[inline(always)]
    pub(crate) fn of_static(buf: &'static [u8; L]) -> Self {
        Prefix(buf.as_ptr() as usize)
    }

    /// The `N` bytes at byte `offset`, or `None` when they end past `L`
    /// (decided at compile time for a constant offset).
    #[inline(always)]
    pub(crate) fn read<const N: usize>(self, offset: usize) -> Option<[u8; N]> {
        if offset.checked_add(N)? > L {
            return None;
        }
        // SAFETY: [0, L) at the address is readable: a segment of at least
        // L bytes (`of`: mapped guest memory, module docs) or a static of L
        // bytes (`of_static`), and [offset, offset + N) lies inside it
        // (checked above).
        Some(unsafe { load::<N>(self.0 + offset) })
    }
}

/// The `N` bytes at byte `offset` of the segments, or `None` when the
/// segments end first. When the first segment holds them all (the usual
/// case for a header field), one load (two or four bytes) or `N` volatile
/// byte loads with no segment walk; otherwise [`read_bytes_at`]. Read once,
/// as there.
#[inline(always)]
pub(crate) fn read_small<const N: usize>(segs: &[IoSeg], offset: usize) -> Option<[u8; N]> {
    if let Some(seg) = segs.first() {
        if offset.checked_add(N).is_some_and(|end| end <= seg.len()) {
            // SAFETY: [base + offset, base + offset + N) lies inside the
            // segment (checked above), mapped guest memory (module docs).
            return Some(unsafe { load::<N>(seg.base() + offset) });
        }
    }
    let mut out = [0u8; N];
    (read_bytes_at(segs, offset, &mut out) == N).then_some(out)
}

/// The `N` bytes at byte `a` and the `M` bytes at byte `b` of the
/// segments, or `None` when the segments end before either ends: two
/// fields of a frame's headers with one bounds check when the first
/// segment holds both (the usual case), else as two [`read_small`]s.
#[inline(always)]
pub(crate) fn read_two<const N: usize, const M: usize>(
    segs: &[IoSeg],
    a: usize,
    b: usize,
) -> Option<([u8; N], [u8; M])> {
    if let (Some(seg), Some(end_a), Some(end_b)) =
        (segs.first(), a.checked_add(N), b.checked_add(M))
    {
        if end_a.max(end_b) <= seg.len() {
            let base = seg.base();
            // SAFETY: both ranges lie inside the segment (checked above),
            // mapped guest memory (module docs).
            return Some(unsafe { (load::<N>(base + a), load::<M>(base + b)) });
        }
    }
    Some((read_small::<N>(segs, a)?, read_small::<M>(segs, b)?))
}

/// Reads `out.len()` bytes at byte `offset` of the segments, in order;
/// returns the bytes read (fewer when the segments end first). The
/// counterpart of [`write_bytes_at`].
pub(crate) fn read_bytes_at(segs: &[IoSeg], mut offset: usize, out: &mut [u8]) -> usize {
    let mut done = 0;
    for seg in segs {
        if done == out.len() {
            break;
        }
        if offset >= seg.len() {
            offset -= seg.len();
            continue;
        }
        for i in offset..seg.len() {
            let Some(b) = out.get_mut(done) else {
                break;
            };
            // SAFETY: i < len, so the byte is inside the segment: mapped
            // guest memory (module docs), read volatile because the guest
            // may write it concurrently.
            *b = unsafe { std::ptr::read_volatile((seg.base() + i) as *const u8) };
            done += 1;
        }
        offset = 0;
    }
    done
}

/// Copies the segments in order into `out` (bounce-buffer baseline).
/// Every byte of `out` is written, so a buffer reused at the size it had
/// is not cleared first (clearing it cost as much as the copy).
pub(crate) fn copy_from_segs(segs: &[IoSeg], out: &mut Vec<u8>) {
    out.resize(segs.iter().map(IoSeg::len).sum(), 0);
    let mut at = 0;
    for seg in segs {
        let end = at + seg.len();
        volatile(seg).copy_to(&mut out[at..end]);
        at = end;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::virtio::queue::GuestRegions;
    use crate::virtio::GuestMemory;
    use vm_memory::{Bytes, GuestAddress};

    /// More vectors than one system call takes is refused by the kernel,
    /// with nothing read or sent: never a silent truncation.
    #[test]
    fn test_more_than_iov_max_vectors_is_refused_not_truncated() {
        use crate::virtio::net::SeqPacket;
        use crate::virtio::queue::IOV_MAX;
        use std::os::fd::AsRawFd;

        let (a, b) = SeqPacket::pair().unwrap();
        b.set_nonblocking(true).unwrap();
        a.send(&[7u8; 2000]).unwrap();
        let mut buf = vec![0u8; IOV_MAX + 1];
        let base = buf.as_mut_ptr() as usize;
        // SAFETY: every segment is one byte of `buf`, alive for the test.
        let segs: Vec<IoSeg> = (0..=IOV_MAX)
            .map(|i| unsafe { IoSeg::new(base + i, 1) })
            .collect();
        let v = IoVecs::guest(&segs);
        let err = v.readv(b.as_raw_fd()).unwrap_err();
        assert_eq!(err.raw_os_error(), Some(libc::EINVAL));
        let err = v.writev(b.as_raw_fd()).unwrap_err();
        assert_eq!(err.raw_os_error(), Some(libc::EINVAL));
        // The message is still there, whole, and nothing reached the peer.
        let mut got = [0u8; 4000];
        assert_eq!(b.recv(&mut got).unwrap(), 2000);
        a.set_nonblocking(true).unwrap();
        assert!(a.recv(&mut got).is_err());
        assert!(buf.iter().all(|&x| x == 0));
        // IOV_MAX vectors are fine.
        a.send(&[9u8; 2000]).unwrap();
        assert_eq!(
            IoVecs::guest(&segs[..IOV_MAX])
                .readv(b.as_raw_fd())
                .unwrap(),
            IOV_MAX
        );
    }

    /// One segment takes the read/write path, more the readv/writev one:
    /// both move a message whole, and truncate it the same way.
    #[test]
    fn test_one_and_several_segments_move_the_same_bytes() {
        use crate::virtio::net::SeqPacket;
        use std::os::fd::AsRawFd;

        let (a, b) = SeqPacket::pair().unwrap();
        b.set_nonblocking(true).unwrap();
        let msg: Vec<u8> = (0..300).map(|i| (i * 7) as u8).collect();
        for cuts in [&[300usize][..], &[100, 200], &[1, 298, 1]] {
            let mut buf = msg.clone();
            let base = buf.as_mut_ptr() as usize;
            let mut at = 0;
            let segs: Vec<IoSeg> = cuts
                .iter()
                .map(|&n| {
                    at += n;
                    // SAFETY: the segments cover `buf` exactly, alive for
                    // the test.
                    unsafe { IoSeg::new(base + at - n, n) }
                })
                .collect();
            assert_eq!(IoVecs::guest(&segs).writev(a.as_raw_fd()).unwrap(), 300);
            let mut got = [0u8; 400];
            assert_eq!(b.recv(&mut got).unwrap(), 300);
            assert_eq!(got[..300], msg[..]);

            buf.fill(0);
            a.send(&msg).unwrap();
            assert_eq!(IoVecs::guest(&segs).readv(b.as_raw_fd()).unwrap(), 300);
            assert_eq!(buf, msg);
            // Longer than the segments: what fits, and the rest is gone.
            buf.fill(0);
            a.send(&[msg.clone(), msg.clone()].concat()).unwrap();
            assert_eq!(IoVecs::guest(&segs).readv(b.as_raw_fd()).unwrap(), 300);
            assert_eq!(buf, msg);
            assert!(b.recv(&mut got).is_err());
        }
    }

    /// getrandom fills the first segment in place, whole, and nothing
    /// around it; a second segment is left for the next call.
    #[test]
    fn test_getrandom_fills_the_first_segment_in_place() {
        let mut buf = [0u8; 4096];
        let base = buf.as_mut_ptr() as usize;
        // Two segments with a gap and a margin: 1..2001 and 2049..4049.
        // SAFETY: both lie inside `buf`, alive for the test.
        let segs = unsafe { [IoSeg::new(base + 1, 2000), IoSeg::new(base + 2049, 2000)] };
        assert_eq!(IoVecs::guest(&segs).getrandom().unwrap(), 2000);
        assert_eq!(buf[0], 0, "before the segment");
        assert!(buf[2001..].iter().all(|&b| b == 0), "after it");
        // 64 random bytes all zero: 2^-512. Filled to its end.
        assert!(buf[1..65].iter().any(|&b| b != 0));
        assert!(buf[1937..2001].iter().any(|&b| b != 0), "filled to the end");
        assert_eq!(IoVecs::guest(&segs[1..]).getrandom().unwrap(), 2000);
        assert!(buf[3985..4049].iter().any(|&b| b != 0));
        assert_eq!(IoVecs::guest(&[]).getrandom().unwrap(), 0);
    }

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

    /// A prefix is made only of a segment that long, and reads only inside
    /// its length, from a segment or a static alike.
    #[test]
    fn test_prefix_reads_inside_its_length_only() {
        let mut buf: [u8; 50] = std::array::from_fn(|i| i as u8 + 1);
        // SAFETY: the segment is `buf`, alive for the test.
        let seg = unsafe { IoSeg::new(buf.as_mut_ptr() as usize, buf.len()) };
        assert!(Prefix::<51>::of(seg).is_none());
        let p = Prefix::<50>::of(seg).expect("50 bytes");
        assert_eq!(p.read::<2>(0), Some([1, 2]));
        assert_eq!(p.read::<4>(46), Some([47, 48, 49, 50]));
        assert_eq!(p.read::<4>(47), None);
        assert_eq!(p.read::<1>(usize::MAX), None);
        // A shorter prefix of the same segment ends where it says.
        let short = Prefix::<10>::of(seg).expect("10 of 50 bytes");
        assert_eq!(short.read::<2>(8), Some([9, 10]));
        assert_eq!(short.read::<2>(9), None);
        static S: [u8; 4] = [9, 8, 7, 6];
        let st = Prefix::of_static(&S);
        assert_eq!(st.read::<2>(2), Some([7, 6]));
        assert_eq!(st.read::<4>(0), Some(S));
        assert_eq!(st.read::<2>(3), None);
    }

    /// A header read in one segment and across segments gives the same
    /// bytes; what the segments do not hold is zero and not counted.
    #[test]
    fn test_arrays_are_read_whole_or_across_segments() {
        // 8-aligned, so the one-segment reads below take the word path.
        let mut words = [0u64; 8];
        for (i, w) in words.iter_mut().enumerate() {
            let b: [u8; 8] = std::array::from_fn(|j| (8 * i + j) as u8);
            *w = u64::from_ne_bytes(b);
        }
        let buf = &mut words;
        let base = buf.as_mut_ptr() as usize;
        // SAFETY: every segment lies inside `buf`, alive for the test.
        let seg = |at: usize, n: usize| unsafe { IoSeg::new(base + at, n) };
        let one = [seg(0, 64)];
        let want: [u8; 16] = std::array::from_fn(|i| 8 + i as u8);
        assert_eq!(read_array::<16>(&one, 8), (want, 16));
        for cuts in [
            &[seg(0, 10), seg(10, 54)][..],
            &[seg(0, 8), seg(8, 1), seg(9, 15), seg(24, 40)],
            &[seg(0, 23), seg(23, 1)],
        ] {
            assert_eq!(read_array::<16>(cuts, 8), (want, 16), "{cuts:?}");
        }
        // Short: the bytes there are, zeros after.
        let short = [seg(0, 4), seg(4, 8)];
        let mut part = [0u8; 16];
        part[..4].copy_from_slice(&[8, 9, 10, 11]);
        assert_eq!(read_array::<16>(&short, 8), (part, 4));
        assert_eq!(read_array::<16>(&short, 12), ([0; 16], 0));
        assert_eq!(read_array::<16>(&[], 0), ([0; 16], 0));
        // Near the end of the address space the fast path's bound cannot
        // wrap.
        assert_eq!(read_array::<16>(&short, usize::MAX - 4), ([0; 16], 0));
        let mut out = [0u8; 3];
        assert_eq!(read_bytes_at(&short, 10, &mut out), 2);
        assert_eq!(out, [10, 11, 0]);
        // Any alignment and size in one segment: whole words, then the
        // tail byte by byte (a vsock header is 44 bytes).
        assert_eq!(
            read_array::<16>(&one, 3).0,
            std::array::from_fn::<u8, 16, _>(|i| 3 + i as u8)
        );
        assert_eq!(
            read_array::<44>(&one, 5),
            (std::array::from_fn(|i| 5 + i as u8), 44)
        );
        assert_eq!(
            read_array::<13>(&one, 51),
            (std::array::from_fn(|i| 51 + i as u8), 13)
        );
        // One byte past the segment: across segments, and short.
        assert_eq!(read_array::<13>(&one, 52).1, 12);
        assert_eq!(read_array::<3>(&one, 8), ([8, 9, 10], 3));
        // The whole segment, and one byte past it.
        assert_eq!(read_array::<64>(&one, 0).1, 64);
        assert_eq!(read_array::<64>(&one, 8).1, 56);
    }

    /// A header written in one segment (words, then the tail) and across
    /// segments lands on the same bytes and on no other, at any offset and
    /// length; past the segments' end nothing is written.
    #[test]
    fn test_bytes_are_written_whole_or_across_segments_and_nowhere_else() {
        let data: [u8; 44] = std::array::from_fn(|i| 0x80 | i as u8);
        for offset in [0, 1, 3, 5, 8, 19] {
            for len in [0, 1, 7, 8, 9, 16, 44] {
                let mut want = [0u8; 72];
                want[offset..offset + len].copy_from_slice(&data[..len]);
                // 8-aligned storage, so offset 0 is an aligned word.
                let mut words = [0u64; 9];
                let base = words.as_mut_ptr() as usize;
                // SAFETY: every segment lies inside `words`, alive while
                // it is used.
                let seg = |at: usize, n: usize| unsafe { IoSeg::new(base + at, n) };
                for cuts in [
                    vec![seg(0, 72)],
                    vec![seg(0, offset + len)],
                    vec![seg(0, offset + 1), seg(offset + 1, 71 - offset)],
                    vec![seg(0, 9), seg(9, 1), seg(10, 62)],
                ] {
                    words = [0; 9];
                    write_bytes_at(&cuts, offset, &data[..len]);
                    let got: Vec<u8> = words.iter().flat_map(|w| w.to_ne_bytes()).collect();
                    assert_eq!(got, want, "offset {offset} len {len} {cuts:?}");
                }
            }
        }
        // Past the end: what fits, and nothing beyond the segments.
        let mut words = [0u64; 2];
        let base = words.as_mut_ptr() as usize;
        // SAFETY: the segments lie inside `words`, alive for the test.
        let segs = unsafe { [IoSeg::new(base, 4), IoSeg::new(base + 4, 2)] };
        write_bytes_at(&segs, 3, &[1, 2, 3, 4, 5]);
        assert_eq!(words[0].to_ne_bytes(), [0, 0, 0, 1, 2, 3, 0, 0]);
        assert_eq!(words[1], 0);
        write_bytes_at(&segs, usize::MAX - 2, &[9; 8]);
        assert_eq!(words[0].to_ne_bytes(), [0, 0, 0, 1, 2, 3, 0, 0]);
    }

    /// Header fields (two and four bytes in one load, other sizes byte by
    /// byte) read the same at any alignment, within one segment and across
    /// segments, and not at all past the end; two fields at once likewise.
    #[test]
    fn test_small_fields_are_read_at_any_alignment_or_across_segments() {
        let mut buf: [u8; 64] = std::array::from_fn(|i| i as u8);
        let base = buf.as_mut_ptr() as usize;
        // SAFETY: every segment lies inside `buf`, alive for the test.
        let seg = |at: usize, n: usize| unsafe { IoSeg::new(base + at, n) };
        let one = [seg(0, 64)];
        for off in 0..8 {
            let o = off as u8;
            assert_eq!(read_small::<2>(&one, off), Some([o, o + 1]));
            assert_eq!(read_small::<4>(&one, off), Some([o, o + 1, o + 2, o + 3]));
            assert_eq!(read_small::<3>(&one, off), Some([o, o + 1, o + 2]));
        }
        assert_eq!(read_small::<4>(&one, 60), Some([60, 61, 62, 63]));
        assert_eq!(read_small::<4>(&one, 61), None);
        assert_eq!(read_small::<2>(&one, usize::MAX - 1), None);
        assert_eq!(read_small::<2>(&[], 0), None);
        let split = [seg(0, 41), seg(41, 2), seg(43, 21)];
        assert_eq!(read_small::<4>(&split, 40), Some([40, 41, 42, 43]));
        assert_eq!(read_small::<2>(&split, 42), Some([42, 43]));
        assert_eq!(read_small::<4>(&split, 62), None);

        // The EtherType and an IPv4 destination of a frame behind a vnet
        // header, as MMDS's claim reads them.
        let want = Some(([24, 25], [42, 43, 44, 45]));
        assert_eq!(read_two::<2, 4>(&one, 24, 42), want);
        assert_eq!(read_two::<2, 4>(&[seg(0, 46)], 24, 42), want);
        assert_eq!(
            read_two::<4, 2>(&[seg(0, 46)], 42, 24),
            Some(([42, 43, 44, 45], [24, 25]))
        );
        for cuts in [
            &[seg(0, 45), seg(45, 19)][..],
            &[seg(0, 25), seg(25, 39)],
            &[seg(0, 12), seg(12, 34)],
        ] {
            assert_eq!(read_two::<2, 4>(cuts, 24, 42), want, "{cuts:?}");
        }
        // One byte short of either field, in one segment or across two.
        assert_eq!(read_two::<2, 4>(&[seg(0, 45)], 24, 42), None);
        assert_eq!(read_two::<2, 4>(&[seg(0, 20), seg(20, 5)], 24, 42), None);
        assert_eq!(read_two::<4, 2>(&[seg(0, 45)], 42, 24), None);
        assert_eq!(read_two::<2, 4>(&one, usize::MAX, 0), None);
        assert_eq!(read_two::<2, 4>(&one, 0, usize::MAX - 2), None);
        assert_eq!(read_two::<2, 4>(&[], 0, 0), None);
    }

    #[test]
    fn test_empty_only_when_no_segment_holds_a_byte() {
        let mut buf = [0u8; 4];
        assert!(host_buf(&mut buf, |io| !io.is_empty() && io.len() == 4));
        assert!(host_buf(&mut [], |io| io.is_empty()));
    }
}
