// SPDX-License-Identifier: Apache-2.0
//! Guest memory in a snapshot: written to the memory file, mapped back
//! from it.
//!
//! The memory file holds the guest's memory regions back to back, in
//! guest-physical order, each at the offset the ones before it end at
//! (the layout [`arch::x86_64::arch_memory_regions`] gives for the
//! snapshot's memory size, so the state file need not repeat it). A Full
//! snapshot writes every byte. At restore each region is mapped from its
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
}
