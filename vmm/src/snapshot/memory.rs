// SPDX-License-Identifier: Apache-2.0
//! Guest memory in a snapshot: written to the memory file, mapped back
//! from it.
//!
//! The memory file holds the guest's memory regions back to back, in
//! guest-physical order, each at the offset the ones before it end at
//! (the layout [`arch::x86_64::arch_memory_regions`] gives for the
//! snapshot's memory size, so the state file need not repeat it). A Full
//! snapshot writes every byte. A Diff snapshot writes only the pages
//! written since the last snapshot (or the load), each at its offset in a
//! sparse file of the full size: the rest are holes. [`rebase`] copies a
//! Diff's pages onto its base (Firecracker's `rebase-snap`), which then
//! loads as a Full memory file. At restore each region is mapped from its
//! offset privately (`MAP_PRIVATE`): nothing is read at load, a page comes
//! from the file the first time the guest touches it, and what the guest
//! writes stays in this process, so the file is never changed by a
//! restored VM and loads again as it was.

use std::fs::File;

use arch::x86_64::arch_memory_regions;
use vm_memory::mmap::MmapRegionBuilder;
use vm_memory::{
    Bytes, FileOffset, GuestAddress, GuestMemoryBackend, GuestMemoryMmap, GuestMemoryRegion,
    GuestRegionMmap,
};

/// Errors writing or mapping guest memory.
#[derive(Debug, thiserror::Error)]
pub enum SnapshotMemoryError {
    /// Writing the memory file failed.
    #[error("cannot write the memory file")]
    Write(#[source] std::io::Error),
    /// The memory file is smaller than the snapshot's memory.
    #[error("the memory file holds {actual} bytes; the snapshot's guest memory is {expected}")]
    Size {
        /// The guest memory's size.
        expected: u64,
        /// The file's.
        actual: u64,
    },
    /// The memory file cannot be examined.
    #[error("cannot read the memory file")]
    Stat(#[source] std::io::Error),
    /// Mapping a region failed.
    #[error("cannot map guest memory from the memory file")]
    Map(#[source] vm_memory::mmap::MmapRegionError),
    /// The regions do not make a guest memory (never for the arch layout).
    #[error("cannot assemble guest memory from the memory file")]
    Assemble,
    /// A rebase's file cannot be opened, read or written.
    #[error("rebase: {0}")]
    Rebase(String, #[source] std::io::Error),
}

/// Writes the pages of `mem` whose bit is set in `pages` (one bit per page
/// from guest-physical 0, as `DirtyPages::take` gives them) into `file`,
/// an empty file, at their offsets in the memory file's layout, and sizes
/// it as a whole memory file: what is not written is a hole (a Diff
/// snapshot). Contiguous pages go in one `pwrite`. Returns the bytes
/// written.
pub fn write_pages(
    mem: &GuestMemoryMmap<()>,
    pages: &[u64],
    file: &File,
) -> Result<u64, SnapshotMemoryError> {
    use std::os::unix::fs::FileExt;
    const PAGE: u64 = devices::virtio::queue::dirty::PAGE_SIZE;
    let set = |page: u64| {
        usize::try_from(page / 64)
            .ok()
            .and_then(|w| pages.get(w))
            .is_some_and(|w| w & (1 << (page % 64)) != 0)
    };
    let mut offset = 0u64;
    let mut written = 0u64;
    let mut buf = Vec::new();
    for region in mem.iter() {
        let (start, len) = (region.start_addr().0, region.len());
        let mut page = start / PAGE;
        let end = (start + len) / PAGE;
        while page < end {
            if !set(page) {
                page += 1;
                continue;
            }
            let run = (page..end).take_while(|&p| set(p)).count() as u64;
            let gpa = page * PAGE;
            buf.resize((run * PAGE) as usize, 0);
            mem.read_slice(&mut buf, GuestAddress(gpa))
                .map_err(|e| SnapshotMemoryError::Write(std::io::Error::other(e.to_string())))?;
            file.write_all_at(&buf, offset + (gpa - start))
                .map_err(SnapshotMemoryError::Write)?;
            written += run * PAGE;
            page += run;
        }
        offset += len;
    }
    file.set_len(offset).map_err(SnapshotMemoryError::Write)?;
    Ok(written)
}

/// The next data range of `fd` at or after `from` (`SEEK_DATA` then
/// `SEEK_HOLE`), or `None` past the last one.
#[allow(unsafe_code)]
fn next_data(fd: &File, from: u64) -> std::io::Result<Option<(u64, u64)>> {
    use std::os::fd::AsRawFd;
    let Ok(from) = libc::off_t::try_from(from) else {
        return Ok(None);
    };
    // SAFETY: lseek on a descriptor `fd` owns only moves its offset.
    let data = unsafe { libc::lseek(fd.as_raw_fd(), from, libc::SEEK_DATA) };
    if data < 0 {
        let e = std::io::Error::last_os_error();
        return if e.raw_os_error() == Some(libc::ENXIO) {
            Ok(None)
        } else {
            Err(e)
        };
    }
    // SAFETY: as above.
    let hole = unsafe { libc::lseek(fd.as_raw_fd(), data, libc::SEEK_HOLE) };
    if hole < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(Some((data as u64, hole as u64)))
}

/// Copies every data range of the Diff memory file `diff` onto `base` at
/// the same offset (Firecracker's `rebase-snap`): `base` then holds the
/// memory the Diff's snapshot saw and loads with that snapshot's state
/// file. Returns the bytes copied.
pub fn rebase(base: &std::path::Path, diff: &std::path::Path) -> Result<u64, SnapshotMemoryError> {
    use std::os::unix::fs::FileExt;
    let err = |what: &str, p: &std::path::Path| {
        let what = format!("{what} '{}'", p.display());
        move |e| SnapshotMemoryError::Rebase(what, e)
    };
    let d = File::open(diff).map_err(err("cannot open the diff file", diff))?;
    let b = File::options()
        .write(true)
        .open(base)
        .map_err(err("cannot open the base file", base))?;
    let (dlen, blen) = (
        d.metadata().map_err(err("cannot read", diff))?.len(),
        b.metadata().map_err(err("cannot read", base))?.len(),
    );
    if dlen > blen {
        return Err(SnapshotMemoryError::Rebase(
            format!("the diff file is {dlen} bytes, its base only {blen}"),
            std::io::Error::from(std::io::ErrorKind::InvalidInput),
        ));
    }
    let mut copied = 0u64;
    let mut at = 0u64;
    let mut buf = vec![0u8; 1 << 20];
    while let Some((start, end)) = next_data(&d, at).map_err(err("cannot seek in", diff))? {
        let mut pos = start;
        while pos < end {
            let n = usize::try_from(end - pos)
                .unwrap_or(usize::MAX)
                .min(buf.len());
            d.read_exact_at(&mut buf[..n], pos)
                .map_err(err("cannot read", diff))?;
            b.write_all_at(&buf[..n], pos)
                .map_err(err("cannot write", base))?;
            pos += n as u64;
        }
        copied += end - start;
        at = end;
    }
    Ok(copied)
}

/// The regions of `mem_mib` MiB of guest memory and their offsets in the
/// memory file.
pub fn file_layout(mem_mib: u64) -> Vec<(GuestAddress, usize, u64)> {
    let mut offset = 0u64;
    arch_memory_regions(mem_mib << 20)
        .into_iter()
        .map(|(addr, len)| {
            let at = offset;
            offset += len as u64;
            (addr, len, at)
        })
        .collect()
}

/// Writes every region of `mem` into `file`, an empty file (a Full
/// snapshot), with `write` alone; returns the bytes written. The vCPUs
/// are paused and no device pass runs meanwhile (this runs on the event
/// loop), so the copy is of one instant.
pub fn write_full(mem: &GuestMemoryMmap<()>, file: &mut File) -> Result<u64, SnapshotMemoryError> {
    let mut total = 0u64;
    for region in mem.iter() {
        let len = region.len() as usize;
        mem.write_all_volatile_to(region.start_addr(), file, len)
            .map_err(|e| SnapshotMemoryError::Write(std::io::Error::other(e.to_string())))?;
        total += len as u64;
    }
    Ok(total)
}

/// Maps `mem_mib` MiB of guest memory privately from `file` (see the
/// module doc), which must hold at least that much.
pub fn map_from_file(
    file: &File,
    mem_mib: u64,
) -> Result<GuestMemoryMmap<()>, SnapshotMemoryError> {
    let layout = file_layout(mem_mib);
    let expected: u64 = layout.iter().map(|(_, len, _)| *len as u64).sum();
    let actual = file.metadata().map_err(SnapshotMemoryError::Stat)?.len();
    if actual < expected {
        return Err(SnapshotMemoryError::Size { expected, actual });
    }
    let mut regions = Vec::with_capacity(layout.len());
    for (addr, len, offset) in layout {
        let file = file.try_clone().map_err(SnapshotMemoryError::Stat)?;
        let mapping = MmapRegionBuilder::new(len)
            .with_file_offset(FileOffset::new(file, offset))
            .with_mmap_prot(libc::PROT_READ | libc::PROT_WRITE)
            .with_mmap_flags(libc::MAP_PRIVATE | libc::MAP_NORESERVE)
            .build()
            .map_err(SnapshotMemoryError::Map)?;
        regions.push(GuestRegionMmap::new(mapping, addr).ok_or(SnapshotMemoryError::Assemble)?);
    }
    GuestMemoryMmap::from_regions(regions).map_err(|_| SnapshotMemoryError::Assemble)
}

#[cfg(test)]
mod tests {
    use super::*;
    use vm_memory::Bytes;

    fn temp(name: &str) -> std::path::PathBuf {
        std::env::temp_dir().join(format!("minivmm-snapmem-{name}-{}", std::process::id()))
    }

    #[test]
    fn memory_written_whole_maps_back_privately_and_the_file_stays() {
        let mem = GuestMemoryMmap::<()>::from_ranges(&arch_memory_regions(32 << 20)).unwrap();
        mem.write_obj(0xdead_beef_u32, GuestAddress(0x1000))
            .unwrap();
        mem.write_obj(0x1234_u16, GuestAddress((32 << 20) - 2))
            .unwrap();
        let path = temp("full");
        let mut f = File::options()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&path)
            .unwrap();
        assert_eq!(write_full(&mem, &mut f).unwrap(), 32 << 20);

        let back = map_from_file(&f, 32).unwrap();
        assert_eq!(
            back.read_obj::<u32>(GuestAddress(0x1000)).unwrap(),
            0xdead_beef
        );
        assert_eq!(
            back.read_obj::<u16>(GuestAddress((32 << 20) - 2)).unwrap(),
            0x1234
        );
        // A write to the restored memory stays in this process.
        back.write_obj(0u32, GuestAddress(0x1000)).unwrap();
        let again = map_from_file(&f, 32).unwrap();
        assert_eq!(
            again.read_obj::<u32>(GuestAddress(0x1000)).unwrap(),
            0xdead_beef
        );

        // A file too small for the memory size is refused.
        let err = map_from_file(&f, 64).unwrap_err();
        assert!(matches!(err, SnapshotMemoryError::Size { .. }), "{err}");
        std::fs::remove_file(&path).unwrap();
    }

    #[test]
    fn a_diff_holds_only_its_pages_and_rebases_onto_its_base() {
        let mem = GuestMemoryMmap::<()>::from_ranges(&arch_memory_regions(32 << 20)).unwrap();
        mem.write_obj(0x1111_u32, GuestAddress(0x1000)).unwrap();
        let base_path = temp("base");
        let mut base = File::create(&base_path).unwrap();
        write_full(&mem, &mut base).unwrap();
        drop(base);

        // The guest writes two pages, one of them twice as far in; only the
        // first and third page of a run of three are logged as dirty.
        mem.write_obj(0x2222_u32, GuestAddress(0x1000)).unwrap();
        mem.write_obj(0x3333_u32, GuestAddress(0x40_0000)).unwrap();
        mem.write_obj(0x4444_u32, GuestAddress(0x40_1000)).unwrap();
        let log = devices::virtio::queue::dirty::DirtyPages::new(&mem);
        log.mark(0x1000, 4);
        log.mark(0x40_0000, 0x2000);
        let diff_path = temp("diff");
        let diff = File::create(&diff_path).unwrap();
        assert_eq!(write_pages(&mem, &log.take(), &diff).unwrap(), 3 * 4096);
        drop(diff);
        let meta = std::fs::metadata(&diff_path).unwrap();
        assert_eq!(meta.len(), 32 << 20);
        {
            use std::os::unix::fs::MetadataExt;
            // Sparse: three pages of data (the file system's blocks).
            assert!(meta.blocks() * 512 < 1 << 20, "{} blocks", meta.blocks());
        }
        assert_eq!(rebase(&base_path, &diff_path).unwrap(), 3 * 4096);
        let back = map_from_file(&File::open(&base_path).unwrap(), 32).unwrap();
        assert_eq!(back.read_obj::<u32>(GuestAddress(0x1000)).unwrap(), 0x2222);
        assert_eq!(
            back.read_obj::<u32>(GuestAddress(0x40_0000)).unwrap(),
            0x3333
        );
        assert_eq!(
            back.read_obj::<u32>(GuestAddress(0x40_1000)).unwrap(),
            0x4444
        );

        // A diff larger than its base, and a missing file, are one line each.
        let small = temp("small");
        std::fs::write(&small, [0u8; 4096]).unwrap();
        let e = rebase(&small, &diff_path).unwrap_err();
        assert!(e.to_string().contains("only 4096"), "{e}");
        let e = rebase(&temp("none"), &diff_path).unwrap_err();
        assert!(e.to_string().contains("cannot open the base file"), "{e}");
        for p in [base_path, diff_path, small] {
            std::fs::remove_file(p).unwrap();
        }
    }
}
