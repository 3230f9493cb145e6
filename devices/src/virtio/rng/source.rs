// SPDX-License-Identifier: Apache-2.0
//! Where the entropy device's bytes come from: [`EntropySource`], the seam
//! a test uses to make the host fail, and [`Getrandom`], the kernel's
//! generator (the only source the VMM uses).

use std::io;

use crate::virtio::iov::IoVecs;

/// A source of random bytes, called once per buffer segment.
pub trait EntropySource: Send {
    /// Fills `buf` (one segment of guest memory) as far as it can and
    /// returns the bytes it filled: fewer than `buf.len()` is a short
    /// return, which the device asks again for the rest.
    fn fill(&mut self, buf: IoVecs<'_>) -> io::Result<usize>;
}

/// `getrandom(2)` straight into guest memory ([`IoVecs::getrandom`]).
#[derive(Debug, Default, Clone, Copy)]
pub struct Getrandom;

impl EntropySource for Getrandom {
    fn fill(&mut self, buf: IoVecs<'_>) -> io::Result<usize> {
        buf.getrandom()
    }
}
