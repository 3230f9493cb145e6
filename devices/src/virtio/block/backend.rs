// SPDX-License-Identifier: Apache-2.0
//! The image file behind a block device, and the seam where tests inject
//! faults.
//!
//! [`BlockBackend`] is every operation the datapath does on the image: one
//! `preadv`/`pwritev` (`pread64`/`pwrite64` for one segment) between the
//! file and guest memory (the segments come from the chain walk, zero
//! copy), `fdatasync`, and `fallocate` for DISCARD and WRITE_ZEROES. [`FileBackend`] does them on a raw image file; a test
//! backend wraps it and fails on demand. The io_uring engine submits the
//! same operations on the backend's fd and passes every completion through
//! [`BlockBackend::completed`], where a test backend rewrites the result
//! (an EIO, a short transfer) as the kernel could have returned it.
//!
//! [`FileBackend::open`] does what must happen before any seccomp filter,
//! in `Block::new`: `open` (non-blocking, so a FIFO cannot hang the VMM),
//! `fstat` (a regular file only), `fcntl` (back to blocking), `flock`
//! (exclusive for read-write, shared for read-only, never waiting: two VMs
//! never write one image) and, for a writable image, the `fallocate` probes
//! that decide whether DISCARD and WRITE_ZEROES are offered.
//!
//! An image swapped in while the VM runs (`PATCH /drives`) goes through the
//! same steps, split where the threads' seccomp filters split them:
//! [`FileBackend::open_unlocked`] (open, fstat, fcntl) and
//! [`UnlockedImage::lock`] (flock) on the VMM's API thread, which may open
//! files but not `fallocate`, then [`FileBackend::probe`] on the event
//! loop, which may `fallocate` (in the two modes the datapath uses) but
//! not open files.
#![allow(unsafe_code)]

use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use super::error::BlockError;
use crate::virtio::queue::IoSeg;

/// What `fallocate` is asked to do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FallocMode {
    /// Deallocate the range (it reads as zeros after): DISCARD, and
    /// WRITE_ZEROES with the unmap flag.
    PunchHole,
    /// Zero the range, keeping it allocated: WRITE_ZEROES without unmap.
    ZeroRange,
}

impl FallocMode {
    /// The `fallocate(2)` mode bits; the file size never changes.
    pub fn bits(self) -> libc::c_int {
        libc::FALLOC_FL_KEEP_SIZE
            | match self {
                FallocMode::PunchHole => libc::FALLOC_FL_PUNCH_HOLE,
                FallocMode::ZeroRange => libc::FALLOC_FL_ZERO_RANGE,
            }
    }
}

/// The kind of an operation, as [`BlockBackend::completed`] sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum OpKind {
    /// `preadv`/READV.
    Read,
    /// `pwritev`/WRITEV.
    Write,
    /// `fdatasync`/FSYNC with DATASYNC.
    Flush,
    /// `fallocate`/FALLOCATE.
    Fallocate,
}

/// What the device learns about the image when it is opened.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DiskInfo {
    /// The file size in bytes (capacity is this rounded down to sectors).
    pub size: u64,
    /// `fallocate(PUNCH_HOLE)` works here: DISCARD can be offered.
    pub punch_hole: bool,
    /// `fallocate(ZERO_RANGE)` works here (with `punch_hole`,
    /// WRITE_ZEROES can be offered).
    pub zero_range: bool,
}

/// The operations the block datapath does on its image (see the module
/// doc). Each is one system call; retries (EINTR) and short transfers are
/// the caller's business, so a test backend sees every attempt.
pub trait BlockBackend: AsRawFd + Send {
    /// What the image looked like when opened.
    fn info(&self) -> DiskInfo;
    /// One `preadv` at `offset` into `segs`; bytes read.
    fn read_at(&mut self, segs: &[IoSeg], offset: u64) -> io::Result<usize>;
    /// One `pwritev` at `offset` from `segs`; bytes written.
    fn write_at(&mut self, segs: &[IoSeg], offset: u64) -> io::Result<usize>;
    /// `fdatasync`.
    fn datasync(&mut self) -> io::Result<()>;
    /// `fallocate(mode)` over `[offset, offset + len)`.
    fn fallocate(&mut self, mode: FallocMode, offset: u64, len: u64) -> io::Result<()>;
    /// What an io_uring completion of `kind` that returned `res` (bytes,
    /// or a negated errno) reports to the device: `res` for a real file.
    fn completed(&mut self, kind: OpKind, res: i32) -> i32 {
        let _ = kind;
        res
    }
}

fn cvt(ret: isize) -> io::Result<usize> {
    if ret < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(ret as usize)
    }
}

/// The vector count for `preadv`/`pwritev`: the chain walk keeps a
/// request's segments within IOV_MAX; beyond it the kernel refuses the call
/// (EINVAL) rather than a cap here silently dropping vectors.
fn iov_count(segs: &[IoSeg]) -> libc::c_int {
    libc::c_int::try_from(segs.len()).unwrap_or(libc::c_int::MAX)
}

/// `offset` as `off_t`; an offset past `i64::MAX` is refused (the device
/// never asks for one: requests are checked against the capacity).
fn off(offset: u64) -> io::Result<libc::off_t> {
    libc::off_t::try_from(offset).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))
}

// preadv/pwritev go to the kernel through syscall(2), as the network
// device's readv/writev do (`iov`): libc's wrappers are thread-cancellation
// points, and the event loop is never cancelled. The system call takes the
// offset as `pos_l` and `pos_h`; with 64-bit longs the kernel reads it
// whole from `pos_l` (`pos_from_hilo` shifts `pos_h` out), so `pos_h` is 0.
//
// One segment (a request of one data buffer, what a guest's 4 KiB I/O
// usually is) goes as pread64/pwrite64 instead: the kernel then takes the
// buffer as it is, without copying in and importing an iovec array
// (`copy_iovec_from_user`, `__import_iovec`), which a `perf` profile of
// 4 KiB page-cache reads put at about 75 ns of the request's kernel time.
const _: () = assert!(libc::c_long::BITS == 64);

/// Reads `segs.len()` vectors at `offset` of `fd`.
pub(crate) fn preadv(fd: RawFd, segs: &[IoSeg], offset: u64) -> io::Result<usize> {
    // SAFETY: the pair reads from `fd` into the segments: writable guest
    // memory from a checked translation, kept mapped by the queue's
    // GuestRegions that the request holds (or a test's host buffer
    // borrowed for the call). The kernel writes at most `len` bytes into
    // each.
    unsafe { transfer(fd, segs, offset, libc::SYS_pread64, libc::SYS_preadv) }
}

/// Writes `segs.len()` vectors at `offset` of `fd`.
pub(crate) fn pwritev(fd: RawFd, segs: &[IoSeg], offset: u64) -> io::Result<usize> {
    // SAFETY: as in `preadv`; the pair only reads the segments.
    unsafe { transfer(fd, segs, offset, libc::SYS_pwrite64, libc::SYS_pwritev) }
}

/// One positioned transfer between `fd` and the segments: `one(fd, buf,
/// count, pos)` for a single segment, `many(fd, iov, iovcnt, pos_l, pos_h)`
/// for more (see above for both).
///
/// # Safety
/// `one` and `many` are `pread64`/`preadv` or `pwrite64`/`pwritev`, and
/// every segment is memory the call may write (a read) or read (a write)
/// for its whole `len`.
#[inline(always)]
unsafe fn transfer(
    fd: RawFd,
    segs: &[IoSeg],
    offset: u64,
    one: libc::c_long,
    many: libc::c_long,
) -> io::Result<usize> {
    let pos = off(offset)?;
    let ret = if let [seg] = segs {
        // SAFETY: the caller's contract for the one segment; the call
        // touches `len` bytes at `base` and nothing else.
        unsafe { libc::syscall(one, fd, seg.base(), seg.len(), pos) }
    } else {
        // SAFETY: IoSeg has the layout of `struct iovec` (asserted where it
        // is defined) and the caller vouches for every segment; the kernel
        // touches at most `len` bytes of each.
        unsafe {
            libc::syscall(
                many,
                fd,
                segs.as_ptr().cast::<libc::iovec>(),
                iov_count(segs),
                pos,
                0,
            )
        }
    };
    cvt(ret as isize)
}

fn fallocate_fd(fd: RawFd, mode: FallocMode, offset: u64, len: u64) -> io::Result<()> {
    let (offset, len) = (off(offset)?, off(len)?);
    // SAFETY: fallocate takes plain integers and touches no memory of ours.
    let ret = unsafe { libc::fallocate(fd, mode.bits(), offset, len) };
    cvt(ret as isize).map(drop)
}

/// Which file an image is: its device and inode, which every path to the
/// file shares (so two spellings of one path, or a hard link, are one).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct FileId {
    /// `st_dev`.
    pub dev: u64,
    /// `st_ino`.
    pub ino: u64,
}

/// A raw image file, opened and locked by [`FileBackend::open`].
#[derive(Debug)]
pub struct FileBackend {
    file: File,
    info: DiskInfo,
    id: FileId,
    read_only: bool,
}

/// An image opened and found to be a regular file, not locked yet: the
/// first half of [`FileBackend::open`], for a caller that wants to know
/// which file a lock it cannot take protects ([`UnlockedImage::lock`]).
#[derive(Debug)]
pub struct UnlockedImage {
    file: File,
    path: PathBuf,
    size: u64,
    id: FileId,
    read_only: bool,
}

/// Bytes the `fallocate` probes work on, past the end of the file: one
/// block of any file system, so nothing inside the image is touched.
const PROBE_LEN: u64 = 4096;

impl FileBackend {
    /// Opens `path` (read-only or read-write), refuses anything but a
    /// regular file, takes the lock and, when writable, probes `fallocate`
    /// (see the module doc).
    pub fn open(path: &Path, read_only: bool) -> Result<Self, BlockError> {
        Self::open_with(path, read_only, 0)
    }

    /// [`open`](Self::open) with `O_DIRECT`: the image's I/O bypasses the
    /// host's page cache. Every transfer must then be aligned as the file
    /// system requires (offset, length and guest buffer, typically to 512
    /// bytes or the device's logical block); one that is not fails with
    /// EINVAL and is answered IOERR. The VMM does not offer this (a guest's
    /// buffers need not be so aligned, which would take a bounce buffer, as
    /// Cloud Hypervisor's `direct=on` has); the datapath benchmark measures
    /// the device with it against a raw loop that also bypasses the cache.
    /// A file system without direct I/O (tmpfs) refuses the open.
    pub fn open_direct(path: &Path, read_only: bool) -> Result<Self, BlockError> {
        Self::open_with(path, read_only, libc::O_DIRECT)
    }

    /// [`open`](Self::open) with `flags` (0 or `O_DIRECT`) kept on the fd.
    fn open_with(path: &Path, read_only: bool, flags: libc::c_int) -> Result<Self, BlockError> {
        let mut backend = Self::open_unlocked_with(path, read_only, flags)?.lock()?;
        backend.probe();
        Ok(backend)
    }

    /// Opens `path` and checks that it is a regular file, without taking
    /// the lock or probing: `open`, `fstat` and `fcntl` only, so a thread
    /// whose seccomp filter allows no more (the API thread) can call it.
    pub fn open_unlocked(path: &Path, read_only: bool) -> Result<UnlockedImage, BlockError> {
        Self::open_unlocked_with(path, read_only, 0)
    }

    /// [`open_unlocked`](Self::open_unlocked) with `flags` (0 or `O_DIRECT`)
    /// kept on the fd.
    fn open_unlocked_with(
        path: &Path,
        read_only: bool,
        flags: libc::c_int,
    ) -> Result<UnlockedImage, BlockError> {
        let open_err = |source| BlockError::Open {
            path: path.to_path_buf(),
            source,
        };
        let file = OpenOptions::new()
            .read(true)
            .write(!read_only)
            // Non-blocking so that a FIFO swapped in after the check above
            // cannot hang the open; cleared below for the regular file.
            .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC | flags)
            .open(path)
            .map_err(|e| {
                // A directory cannot be opened for writing: say what it is
                // rather than how the open failed.
                if e.raw_os_error() == Some(libc::EISDIR) {
                    BlockError::NotAFile(path.to_path_buf())
                } else {
                    open_err(e)
                }
            })?;
        let meta = file.metadata().map_err(open_err)?;
        if !meta.is_file() {
            return Err(BlockError::NotAFile(path.to_path_buf()));
        }
        let fd = file.as_raw_fd();
        // Blocking again; F_SETFL sets O_DIRECT too, so it is passed on.
        // SAFETY: fcntl(F_SETFL) on our own open fd; no memory involved.
        let ret = unsafe { libc::fcntl(fd, libc::F_SETFL, flags) };
        if ret < 0 {
            return Err(open_err(io::Error::last_os_error()));
        }
        Ok(UnlockedImage {
            file,
            path: path.to_path_buf(),
            size: meta.len(),
            id: FileId {
                dev: meta.dev(),
                ino: meta.ino(),
            },
            read_only,
        })
    }

    /// Finds out, for a writable image, whether its file system punches
    /// holes and zeroes ranges (what DISCARD and WRITE_ZEROES need): both
    /// tried on a block wholly past the end of the file (KEEP_SIZE, so the
    /// size does not change); the hole punched last frees what zeroing may
    /// have allocated there. A read-only image offers neither.
    pub fn probe(&mut self) {
        if self.read_only {
            return;
        }
        let fd = self.file.as_raw_fd();
        let at = self.info.size.next_multiple_of(PROBE_LEN);
        self.info.zero_range = fallocate_fd(fd, FallocMode::ZeroRange, at, PROBE_LEN).is_ok();
        self.info.punch_hole = fallocate_fd(fd, FallocMode::PunchHole, at, PROBE_LEN).is_ok();
    }

    /// The open file.
    pub fn file(&self) -> &File {
        &self.file
    }

    /// Which file this is.
    pub fn id(&self) -> FileId {
        self.id
    }
}

impl UnlockedImage {
    /// Which file this is.
    pub fn id(&self) -> FileId {
        self.id
    }

    /// The file's size when it was opened.
    pub fn size(&self) -> u64 {
        self.size
    }

    /// Takes the lock (exclusive for read-write, shared for read-only,
    /// never waiting): [`BlockError::Locked`] if another open file holds a
    /// conflicting one. The image is not probed yet
    /// ([`FileBackend::probe`]).
    pub fn lock(self) -> Result<FileBackend, BlockError> {
        let op = if self.read_only {
            libc::LOCK_SH
        } else {
            libc::LOCK_EX
        };
        // SAFETY: flock on our own open fd; no memory involved.
        if unsafe { libc::flock(self.file.as_raw_fd(), op | libc::LOCK_NB) } < 0 {
            let e = io::Error::last_os_error();
            return Err(if e.raw_os_error() == Some(libc::EWOULDBLOCK) {
                BlockError::Locked(self.path)
            } else {
                BlockError::Open {
                    path: self.path,
                    source: e,
                }
            });
        }
        Ok(FileBackend {
            file: self.file,
            info: DiskInfo {
                size: self.size,
                punch_hole: false,
                zero_range: false,
            },
            id: self.id,
            read_only: self.read_only,
        })
    }
}

impl AsRawFd for FileBackend {
    fn as_raw_fd(&self) -> RawFd {
        self.file.as_raw_fd()
    }
}

impl BlockBackend for FileBackend {
    fn info(&self) -> DiskInfo {
        self.info
    }

    fn read_at(&mut self, segs: &[IoSeg], offset: u64) -> io::Result<usize> {
        preadv(self.file.as_raw_fd(), segs, offset)
    }

    fn write_at(&mut self, segs: &[IoSeg], offset: u64) -> io::Result<usize> {
        pwritev(self.file.as_raw_fd(), segs, offset)
    }

    fn datasync(&mut self) -> io::Result<()> {
        self.file.sync_data()
    }

    fn fallocate(&mut self, mode: FallocMode, offset: u64, len: u64) -> io::Result<()> {
        fallocate_fd(self.file.as_raw_fd(), mode, offset, len)
    }
}
