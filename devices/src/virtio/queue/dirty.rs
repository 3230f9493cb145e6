// SPDX-License-Identifier: Apache-2.0
//! The guest pages the devices wrote, for Diff snapshots.
//!
//! KVM's dirty log sees only what the guest's vCPUs write; the devices
//! write guest memory from the VMM (a received frame, a block read, the
//! entropy device's bytes, a status byte), which KVM never sees. So every
//! buffer a device may write is marked here when its chain is walked (a
//! writable descriptor is marked whether or not the device ends up writing
//! all of it: a superset is safe, a missed page is not), and a Diff
//! snapshot writes the union of both logs. The used rings, which the
//! device writes through its ring views, are added by the snapshot from the
//! queues' addresses.
//!
//! One bit per 4 KiB guest page, flat over guest-physical addresses, set
//! and taken with atomics: the event loop (datapath) and a vCPU thread (a
//! chain walked on an exit) may mark at once.

use std::sync::atomic::{AtomicU64, Ordering};

use vm_memory::{GuestMemoryBackend, GuestMemoryRegion};

use crate::virtio::GuestMemory;

/// The size of a page as the logs count it.
pub const PAGE_SIZE: u64 = 4096;

/// One bit per guest page the devices may have written since the last
/// [`take`](Self::take).
#[derive(Debug)]
pub struct DirtyPages {
    words: Box<[AtomicU64]>,
}

impl DirtyPages {
    /// A log covering every page of `mem`'s regions (from guest-physical 0
    /// to the end of the last region).
    pub fn new(mem: &GuestMemory) -> Self {
        let end = mem
            .iter()
            .map(|r| r.start_addr().0.saturating_add(r.len()))
            .max()
            .unwrap_or(0);
        let pages = end.div_ceil(PAGE_SIZE);
        let words = usize::try_from(pages.div_ceil(64)).unwrap_or(0);
        DirtyPages {
            words: (0..words).map(|_| AtomicU64::new(0)).collect(),
        }
    }

    /// Marks every page of `[gpa, gpa + len)`; pages past the log (not
    /// guest memory, which no translated buffer is) are ignored.
    pub fn mark(&self, gpa: u64, len: u64) {
        if len == 0 {
            return;
        }
        let first = gpa / PAGE_SIZE;
        let last = gpa.saturating_add(len - 1) / PAGE_SIZE;
        for page in first..=last {
            let Some(word) = usize::try_from(page / 64)
                .ok()
                .and_then(|w| self.words.get(w))
            else {
                return;
            };
            word.fetch_or(1 << (page % 64), Ordering::Relaxed);
        }
    }

    /// Whether the page holding `gpa` is marked.
    pub fn is_marked(&self, gpa: u64) -> bool {
        let page = gpa / PAGE_SIZE;
        usize::try_from(page / 64)
            .ok()
            .and_then(|w| self.words.get(w))
            .is_some_and(|w| w.load(Ordering::Relaxed) & (1 << (page % 64)) != 0)
    }

    /// The marked pages, one bit per page from guest-physical 0 (bit `n`
    /// of word `w` is page `64 * w + n`), and the log emptied.
    pub fn take(&self) -> Vec<u64> {
        self.words
            .iter()
            .map(|w| w.swap(0, Ordering::Relaxed))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use vm_memory::GuestAddress;

    #[test]
    fn marks_cover_every_page_a_range_touches_and_take_empties_the_log() {
        let mem = GuestMemory::from_ranges(&[(GuestAddress(0), 1 << 20)]).unwrap();
        let log = DirtyPages::new(&mem);
        log.mark(0x1fff, 2); // the last byte of page 1, the first of page 2
        log.mark(0x10_0000 - 1, 10); // the last page, and past the end
        log.mark(0x5000, 0);
        assert!(!log.is_marked(0x0fff));
        assert!(log.is_marked(0x1000) && log.is_marked(0x2000));
        assert!(!log.is_marked(0x3000) && !log.is_marked(0x5000));
        assert!(log.is_marked(0xff000));
        let words = log.take();
        assert_eq!(words.len(), 4); // 256 pages
        assert_eq!(words[0], 0b110);
        assert_eq!(words[3], 1 << 63);
        assert!(log.take().iter().all(|w| *w == 0));
        assert!(!log.is_marked(0x1000));
        // A range of exactly one page marks that page and not the next.
        log.mark(0x5000, PAGE_SIZE);
        assert!(log.is_marked(0x5000) && !log.is_marked(0x6000));
        assert!(!log.is_marked(0x4fff));
        let _ = log.take();
        // A range at the top of the address space does not wrap.
        log.mark(u64::MAX - 10, 100);
        assert!(log.take().iter().all(|w| *w == 0));
    }
}
