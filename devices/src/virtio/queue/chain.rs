// SPDX-License-Identifier: Apache-2.0
//! Descriptor chains (virtio 1.1 §2.6.5): walking, checking, translating.
//!
//! [`SplitQueue::walk`] follows a chain from its head, through at most one
//! indirect table, and appends the host segments of its buffers to a vector
//! the caller hands to `readv`/`writev`. Each descriptor is copied out of
//! guest memory once; every decision is made on that copy.
//!
//! A chain is refused ([`ChainError`]) when it:
//! - has a head or `next` index outside its table, or loops (more
//!   descriptors than its table has entries; a direct chain is at most the
//!   queue size long);
//! - has a buffer that is not guest memory, or one of the wrong direction
//!   for the caller ([`ChainRules::device_writes`]);
//! - uses an indirect table without VIRTIO_RING_F_INDIRECT_DESC, sets
//!   INDIRECT together with NEXT, nests one inside another, or points to a
//!   table whose length is 0, not a multiple of 16, larger than the queue
//!   size in entries, or not inside one guest memory region;
//! - is shorter than [`ChainRules::min_len`] or longer than
//!   [`ChainRules::max_len`] bytes;
//! - has more than [`MAX_CHAIN_SEGS`] buffers or host segments, zero-length
//!   buffers included, which one system call could not take (and with which
//!   a chain through a large indirect table could otherwise cost tens of
//!   thousands of reads).
//!
//! So a chain costs at most `MAX_CHAIN_SEGS + 2` descriptor reads, good or
//! refused, whatever the queue size.
//!
//! [`SplitQueue::walk_mixed`] walks a chain of both kinds (a block request:
//! a device-readable header and data, then device-writable data and a
//! status byte) under the same rules, with the order virtio 1.1 §2.6.4.2
//! requires of the driver: every device-readable buffer before every
//! device-writable one ([`ChainError::ReadableAfterWritable`] otherwise).

use super::{
    Budget, HostArea, IoSeg, SplitQueue, IOV_MAX, VIRTQ_DESC_F_INDIRECT, VIRTQ_DESC_F_NEXT,
    VIRTQ_DESC_F_WRITE,
};

/// Most buffers (and host segments) in one chain: one fewer than IOV_MAX so
/// a receive can add a host byte to detect truncation.
pub const MAX_CHAIN_SEGS: usize = IOV_MAX - 1;

/// Why a descriptor chain from the guest was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum ChainError {
    /// The avail entry names a descriptor outside the table.
    #[error("head index outside the descriptor table")]
    HeadOutOfRange,
    /// A buffer or indirect table is not guest memory.
    #[error("descriptor outside guest memory")]
    OutsideMemory,
    /// A chain the device only reads (TX) has a device-writable buffer.
    #[error("device-writable descriptor in a chain the device reads")]
    WriteOnlyOnTx,
    /// A chain the device writes (RX) has a device-readable buffer.
    #[error("device-readable descriptor in a chain the device writes")]
    ReadOnlyOnRx,
    /// The chain loops or is longer than its table.
    #[error("chain loops or is longer than its descriptor table")]
    Unterminated,
    /// A `next` index is outside the table.
    #[error("next index outside the descriptor table")]
    NextOutOfRange,
    /// INDIRECT without VIRTIO_RING_F_INDIRECT_DESC negotiated.
    #[error("indirect descriptor without VIRTIO_RING_F_INDIRECT_DESC")]
    IndirectNotNegotiated,
    /// INDIRECT together with NEXT (virtio 1.1 §2.6.5.3.1).
    #[error("indirect descriptor with the NEXT flag")]
    IndirectWithNext,
    /// An indirect table inside an indirect table.
    #[error("nested indirect descriptor")]
    NestedIndirect,
    /// An indirect table of 0 bytes, not a multiple of 16, or with more
    /// entries than the queue size.
    #[error("indirect table length invalid")]
    IndirectTableLength,
    /// The chain is shorter than the device's minimum (the 12-byte
    /// `virtio_net_hdr_v1` for the network device).
    #[error("chain shorter than the device's header")]
    TooShort,
    /// The chain is longer than the device accepts.
    #[error("chain longer than the device accepts")]
    TooLong,
    /// More than [`MAX_CHAIN_SEGS`] buffers or host segments.
    #[error("chain needs more than 1023 I/O vectors")]
    TooManySegments,
    /// A device-readable buffer after a device-writable one in a mixed
    /// chain (virtio 1.1 §2.6.4.2).
    #[error("device-readable descriptor after a device-writable one")]
    ReadableAfterWritable,
}

/// What a device accepts in a chain.
#[derive(Debug, Clone, Copy)]
pub struct ChainRules {
    /// Every buffer is device-writable (RX) rather than device-readable (TX).
    pub device_writes: bool,
    /// Fewest bytes in a chain.
    pub min_len: usize,
    /// Most bytes in a chain.
    pub max_len: usize,
}

/// A chain that passed the checks; its segments were appended to the
/// caller's vector.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Chain {
    /// Head index: what the used element returns.
    pub head: u16,
    /// Bytes in all its buffers.
    pub len: usize,
    /// Segments it appended.
    pub nsegs: usize,
    /// Descriptors of the ring's own table it holds (an indirect table
    /// counts one): what the driver cannot reuse until the chain is used.
    pub ring_descs: usize,
}

/// A mixed chain that passed the checks ([`SplitQueue::walk_mixed`]): its
/// segments were appended to the caller's vector, the device-readable ones
/// first.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MixedChain {
    /// Head index: what the used element returns.
    pub head: u16,
    /// Segments it appended.
    pub nsegs: usize,
    /// How many of them (the first) are device-readable.
    pub readable_segs: usize,
    /// Bytes in its device-readable buffers.
    pub readable_len: u64,
    /// Bytes in its device-writable buffers.
    pub writable_len: u64,
    /// Buffers (descriptors that are not an indirect table), zero-length
    /// ones included.
    pub bufs: usize,
    /// Descriptors of the ring's own table it holds (an indirect table
    /// counts one).
    pub ring_descs: usize,
}

/// The first `n` bytes of `seg` and the rest (`n <= seg.len()`): both
/// inside the original segment, so they stay mapped as long as it does.
pub fn split_seg(seg: IoSeg, n: usize) -> (IoSeg, IoSeg) {
    let n = n.min(seg.len());
    // SAFETY: [base, base + n) and [base + n, base + len) are the two parts
    // of the segment's own range, which the caller's segment guarantees is
    // mapped for as long as it is used.
    unsafe {
        (
            IoSeg::new(seg.base(), n),
            IoSeg::new(seg.base() + n, seg.len() - n),
        )
    }
}

/// One descriptor as copied out of guest memory.
struct Desc {
    addr: u64,
    len: u32,
    flags: u16,
    next: u16,
}

impl Desc {
    /// `struct virtq_desc { le64 addr; le32 len; le16 flags; le16 next; }`
    /// as two little-endian words.
    #[inline]
    fn parse([addr, rest]: [u64; 2]) -> Self {
        Desc {
            addr,
            len: rest as u32,
            flags: (rest >> 32) as u16,
            next: (rest >> 48) as u16,
        }
    }
}

/// Runs `walk` with the length of `segs` before it, and removes what it
/// appended if it fails: a refused chain leaves the caller's vector as it
/// was.
#[inline(always)]
fn undo_segs_on_error<T>(
    segs: &mut Vec<IoSeg>,
    walk: impl FnOnce(&mut Vec<IoSeg>, usize) -> Result<T, ChainError>,
) -> Result<T, ChainError> {
    let start = segs.len();
    let res = walk(segs, start);
    if res.is_err() {
        segs.truncate(start);
    }
    res
}

/// Where a walk stands in a chain: the table being read (the ring's, then
/// possibly one indirect) and how many descriptors of it were read, which
/// bounds a looping chain by the table's size.
struct DescCursor<'q> {
    queue: &'q SplitQueue,
    table: HostArea,
    entries: u32,
    in_indirect: bool,
    idx: u16,
    read_here: u32,
    /// Descriptors of the ring's own table read so far (an indirect table
    /// counts one).
    ring_descs: usize,
}

impl<'q> DescCursor<'q> {
    #[inline(always)]
    fn new(queue: &'q SplitQueue, head: u16) -> Result<Self, ChainError> {
        if head > queue.mask {
            return Err(ChainError::HeadOutOfRange);
        }
        Ok(DescCursor {
            queue,
            table: queue.desc,
            entries: u32::from(queue.addrs.size),
            in_indirect: false,
            idx: head,
            read_here: 0,
            ring_descs: 0,
        })
    }

    /// The next buffer descriptor of the chain (never an indirect one: its
    /// table is checked and entered), charging every read to `budget`.
    #[inline(always)]
    fn next_buffer(&mut self, budget: &mut Budget) -> Result<Desc, ChainError> {
        loop {
            self.read_here += 1;
            if self.read_here > self.entries {
                return Err(ChainError::Unterminated);
            }
            budget.charge(1);
            // SAFETY: idx < entries (the head was checked in `new` and every
            // `next` in `advance`), and the table is 16 * entries bytes: the
            // ring's by SplitQueue's invariant, an indirect one as entered
            // below.
            let d = Desc::parse(unsafe { self.table.read_16(16 * usize::from(self.idx)) });
            if !self.in_indirect {
                self.ring_descs += 1;
            }
            if d.flags & VIRTQ_DESC_F_INDIRECT == 0 {
                return Ok(d);
            }
            self.enter_indirect(&d)?;
        }
    }

    /// Checks the indirect descriptor `d` and continues the walk at the
    /// first entry of its table.
    #[inline(always)]
    fn enter_indirect(&mut self, d: &Desc) -> Result<(), ChainError> {
        if self.in_indirect {
            return Err(ChainError::NestedIndirect);
        }
        if !self.queue.features.indirect {
            return Err(ChainError::IndirectNotNegotiated);
        }
        if d.flags & VIRTQ_DESC_F_NEXT != 0 {
            return Err(ChainError::IndirectWithNext);
        }
        if d.len == 0 || d.len & 15 != 0 || d.len / 16 > u32::from(self.queue.addrs.size) {
            return Err(ChainError::IndirectTableLength);
        }
        self.table = self
            .queue
            .mem
            .area(d.addr, d.len as usize, 1)
            .ok_or(ChainError::OutsideMemory)?;
        self.entries = d.len / 16;
        self.in_indirect = true;
        self.idx = 0;
        self.read_here = 0;
        Ok(())
    }

    /// Moves to the descriptor after `d`: false at the end of the chain.
    #[inline(always)]
    fn advance(&mut self, d: &Desc) -> Result<bool, ChainError> {
        if d.flags & VIRTQ_DESC_F_NEXT == 0 {
            return Ok(false);
        }
        if u32::from(d.next) >= self.entries {
            return Err(ChainError::NextOutOfRange);
        }
        self.idx = d.next;
        Ok(true)
    }
}

/// Looks at a chain's first segment while [`SplitQueue::walk_with`] has
/// it in hand, so a device can decide something about a frame's headers
/// without finding the segment again. `()` looks at nothing and compiles
/// to nothing.
pub trait FirstSeg {
    /// The fewest bytes a first buffer must have to be shown, at least 1:
    /// the walk compares the buffer's length with this in place of the
    /// zero test every buffer gets (a shorter one gets that test next), so
    /// a first buffer long enough pays no more tests than without a look.
    const MIN_LEN: u32;

    /// The host segment of the chain's first buffer, when that buffer has
    /// at least [`MIN_LEN`](Self::MIN_LEN) bytes and lies in one memory
    /// region; not called otherwise (the chain may still turn out
    /// refused).
    fn seen(&mut self, seg: IoSeg);
}

impl FirstSeg for () {
    const MIN_LEN: u32 = 1;

    #[inline(always)]
    fn seen(&mut self, _: IoSeg) {}
}

/// What a walk has counted so far.
struct Walked {
    bufs: usize,
    len: u64,
}

impl SplitQueue {
    /// Walks the chain at `head`, appending its segments to `segs` and
    /// charging every descriptor read to `budget`. On error `segs` is left
    /// as it was.
    #[inline]
    pub fn walk(
        &self,
        head: u16,
        rules: &ChainRules,
        segs: &mut Vec<IoSeg>,
        budget: &mut Budget,
    ) -> Result<Chain, ChainError> {
        self.walk_with(head, rules, segs, budget, &mut ())
    }

    /// [`walk`](Self::walk), showing `first` the chain's first segment as
    /// [`FirstSeg`] says.
    #[inline(always)]
    pub fn walk_with<F: FirstSeg>(
        &self,
        head: u16,
        rules: &ChainRules,
        segs: &mut Vec<IoSeg>,
        budget: &mut Budget,
        first: &mut F,
    ) -> Result<Chain, ChainError> {
        undo_segs_on_error(segs, |segs, start| {
            self.walk_inner(head, rules, segs, budget, start, first)
        })
    }

    /// The walk, its first buffer taken before the loop so that only it is
    /// shown to `first`.
    #[inline(always)]
    fn walk_inner<F: FirstSeg>(
        &self,
        head: u16,
        rules: &ChainRules,
        segs: &mut Vec<IoSeg>,
        budget: &mut Budget,
        start: usize,
        first: &mut F,
    ) -> Result<Chain, ChainError> {
        let mut cursor = DescCursor::new(self, head)?;
        let mut walked = Walked { bufs: 0, len: 0 };
        let mut d = cursor.next_buffer(budget)?;
        self.take_buffer(&d, rules, segs, start, &mut walked, first)?;
        while cursor.advance(&d)? {
            d = cursor.next_buffer(budget)?;
            self.take_buffer(&d, rules, segs, start, &mut walked, &mut ())?;
        }
        if walked.len < rules.min_len as u64 {
            return Err(ChainError::TooShort);
        }
        Ok(Chain {
            head,
            // At most MAX_CHAIN_SEGS buffers of u32::MAX bytes, or max_len.
            len: walked.len as usize,
            nsegs: segs.len() - start,
            ring_descs: cursor.ring_descs,
        })
    }

    /// Checks one buffer of a chain against `rules` and appends its
    /// segments, showing it to `first` as [`FirstSeg`] says.
    #[inline(always)]
    fn take_buffer<F: FirstSeg>(
        &self,
        d: &Desc,
        rules: &ChainRules,
        segs: &mut Vec<IoSeg>,
        start: usize,
        walked: &mut Walked,
        first: &mut F,
    ) -> Result<(), ChainError> {
        if (d.flags & VIRTQ_DESC_F_WRITE != 0) != rules.device_writes {
            return Err(if rules.device_writes {
                ChainError::ReadOnlyOnRx
            } else {
                ChainError::WriteOnlyOnTx
            });
        }
        walked.bufs += 1;
        walked.len += u64::from(d.len);
        if walked.len > rules.max_len as u64 {
            return Err(ChainError::TooLong);
        }
        // An empty buffer adds no segment. With `()` (MIN_LEN 1) the first
        // test is that zero test and the second never passes.
        if d.len >= F::MIN_LEN {
            if !self
                .mem
                .push_segments_seen(d.addr, d.len, segs, |s| first.seen(s))
            {
                return Err(ChainError::OutsideMemory);
            }
        } else if d.len > 0 && !self.mem.push_segments(d.addr, d.len, segs) {
            return Err(ChainError::OutsideMemory);
        }
        if rules.device_writes {
            self.mem.mark_written(d.addr, d.len);
        }
        if walked.bufs > MAX_CHAIN_SEGS || segs.len() - start > MAX_CHAIN_SEGS {
            return Err(ChainError::TooManySegments);
        }
        Ok(())
    }

    /// Walks the chain at `head` whose device-readable buffers come before
    /// its device-writable ones, appending its segments to `segs` (readable
    /// first) and charging every descriptor read to `budget`. The same
    /// limits as [`walk`](Self::walk) apply (at most `max_len` bytes in
    /// all); on error `segs` is left as it was.
    pub fn walk_mixed(
        &self,
        head: u16,
        max_len: u64,
        segs: &mut Vec<IoSeg>,
        budget: &mut Budget,
    ) -> Result<MixedChain, ChainError> {
        undo_segs_on_error(segs, |segs, start| {
            self.walk_mixed_inner(head, max_len, segs, budget, start)
        })
    }

    fn walk_mixed_inner(
        &self,
        head: u16,
        max_len: u64,
        segs: &mut Vec<IoSeg>,
        budget: &mut Budget,
        start: usize,
    ) -> Result<MixedChain, ChainError> {
        let mut cursor = DescCursor::new(self, head)?;
        let mut seen_writable = false;
        let mut out = MixedChain {
            head,
            nsegs: 0,
            readable_segs: 0,
            readable_len: 0,
            writable_len: 0,
            bufs: 0,
            ring_descs: 0,
        };
        loop {
            let d = cursor.next_buffer(budget)?;
            let writable = d.flags & VIRTQ_DESC_F_WRITE != 0;
            if writable {
                seen_writable = true;
            } else if seen_writable {
                return Err(ChainError::ReadableAfterWritable);
            }
            out.bufs += 1;
            if writable {
                out.writable_len += u64::from(d.len);
            } else {
                out.readable_len += u64::from(d.len);
            }
            if out.readable_len + out.writable_len > max_len {
                return Err(ChainError::TooLong);
            }
            if d.len > 0 && !self.mem.push_segments(d.addr, d.len, segs) {
                return Err(ChainError::OutsideMemory);
            }
            if writable {
                self.mem.mark_written(d.addr, d.len);
            } else {
                out.readable_segs = segs.len() - start;
            }
            if out.bufs > MAX_CHAIN_SEGS || segs.len() - start > MAX_CHAIN_SEGS {
                return Err(ChainError::TooManySegments);
            }
            if !cursor.advance(&d)? {
                break;
            }
        }
        out.nsegs = segs.len() - start;
        out.ring_descs = cursor.ring_descs;
        Ok(out)
    }
}
