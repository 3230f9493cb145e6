// SPDX-License-Identifier: Apache-2.0
//! How the balloon gives guest pages back to the host: [`PageDiscard`], the
//! seam a test or fuzz target uses to see (or fail) every call, and
//! [`Madvise`], `madvise(MADV_DONTNEED)` (the only one the VMM uses).
//!
//! The seam takes an [`IoSeg`], which outside `virtio::iov` only ever comes
//! from a checked translation of guest memory, trimmed to whole host pages:
//! no implementation can be handed memory that is not the guest's.

use std::io;

use crate::virtio::iov;
use crate::virtio::queue::IoSeg;

/// Gives whole host pages of guest memory back to the host.
pub trait PageDiscard: Send {
    /// Drops the contents of `pages` (whole host pages of guest memory): the
    /// host may free them, and the next access reads zeros.
    fn discard(&mut self, pages: IoSeg) -> io::Result<()>;
}

/// `madvise(MADV_DONTNEED)` on guest memory (`iov::discard_pages`).
#[derive(Debug, Default, Clone, Copy)]
pub struct Madvise;

impl PageDiscard for Madvise {
    fn discard(&mut self, pages: IoSeg) -> io::Result<()> {
        iov::discard_pages(pages)
    }
}
