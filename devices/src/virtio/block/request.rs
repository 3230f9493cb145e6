// SPDX-License-Identifier: Apache-2.0
//! Reading one request out of a descriptor chain (virtio 1.1 §5.2.6), with
//! every check a hostile driver calls for.
//!
//! A request is a chain of device-readable bytes, then device-writable
//! bytes ([`SplitQueue::walk_mixed`]). The device makes no assumption about
//! how they are cut into descriptors (§5.2.6.1: the header may be split, or
//! share a descriptor with data): it reads them as two byte streams.
//!
//! - The readable stream starts with the 16-byte header `struct
//!   virtio_blk_req { le32 type; le32 reserved; le64 sector; }`; for OUT,
//!   DISCARD and WRITE_ZEROES the rest is the request's data, for every
//!   other type there must be no rest.
//! - The writable stream ends with the status byte; for IN and GET_ID what
//!   comes before it is where the data goes, for every other type there
//!   must be nothing before it.
//!
//! What comes of a chain ([`Parsed`]):
//! - a chain the walk refuses (outside memory, a loop, an indirect table
//!   without INDIRECT_DESC, readable after writable...) or with no writable
//!   byte has no status byte the device may write: it is returned with used
//!   length 0 and counted as malformed;
//! - a malformed request (a short header, data the wrong way, more than
//!   `seg_max + 2` buffers, a length that is not a whole number of sectors or
//!   is 0, sectors outside the capacity, `sector * 512 + len` overflowing)
//!   is answered VIRTIO_BLK_S_IOERR;
//! - OUT, DISCARD and WRITE_ZEROES on a read-only drive are answered IOERR
//!   (§5.2.6.2) before anything else is looked at;
//! - an unknown type, DISCARD or WRITE_ZEROES not negotiated, or flags the
//!   spec leaves to a later version are answered VIRTIO_BLK_S_UNSUPP;
//! - anything else is a [`Request`] to run.

use super::{SECTOR_SIZE, SEG_MAX};
use crate::virtio::iov;
use crate::virtio::queue::{split_seg, Budget, ChainError, IoSeg, MixedChain, SplitQueue};

/// `VIRTIO_BLK_T_*` (virtio 1.1 §5.2.6), from the bindings.
pub use virtio_bindings::virtio_blk::{
    VIRTIO_BLK_T_DISCARD, VIRTIO_BLK_T_FLUSH, VIRTIO_BLK_T_GET_ID, VIRTIO_BLK_T_IN,
    VIRTIO_BLK_T_OUT, VIRTIO_BLK_T_WRITE_ZEROES,
};

/// Bytes of `struct virtio_blk_req`'s header (virtio 1.1 §5.2.6).
pub const HEADER_LEN: usize = 16;
/// Bytes of one `struct virtio_blk_discard_write_zeroes` (§5.2.6).
pub const DWZ_SEG_LEN: usize = 16;
/// The unmap flag of WRITE_ZEROES (§5.2.6).
pub const WRITE_ZEROES_FLAG_UNMAP: u32 =
    virtio_bindings::virtio_blk::VIRTIO_BLK_WRITE_ZEROES_FLAG_UNMAP;

/// Status values (virtio 1.1 §5.2.6).
pub const VIRTIO_BLK_S_OK: u8 = virtio_bindings::virtio_blk::VIRTIO_BLK_S_OK as u8;
/// The request failed.
pub const VIRTIO_BLK_S_IOERR: u8 = virtio_bindings::virtio_blk::VIRTIO_BLK_S_IOERR as u8;
/// The request is not supported.
pub const VIRTIO_BLK_S_UNSUPP: u8 = virtio_bindings::virtio_blk::VIRTIO_BLK_S_UNSUPP as u8;

/// Most sectors one DISCARD or WRITE_ZEROES segment may cover (the
/// `max_discard_sectors` and `max_write_zeroes_sectors` offered): 1 GiB,
/// which bounds the work of one `fallocate` on the event loop.
pub const MAX_DWZ_SECTORS: u32 = (1 << 30) / SECTOR_SIZE as u32;
/// Segments one DISCARD or WRITE_ZEROES may carry (`max_discard_seg`,
/// `max_write_zeroes_seg`): one, as QEMU; no user-space interface takes
/// more than one range per call.
pub const MAX_DWZ_SEGS: u32 = 1;
/// Most bytes of one chain: the used length (data plus status) is a u32.
pub const MAX_REQUEST_LEN: u64 = u32::MAX as u64;

/// What a request does, with its byte range in the image.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    /// IN: read `len` bytes at `offset` into the data segments.
    Read {
        /// Byte offset in the image.
        offset: u64,
        /// Bytes.
        len: u64,
    },
    /// OUT: write the data segments at `offset`.
    Write {
        /// Byte offset in the image.
        offset: u64,
        /// Bytes.
        len: u64,
    },
    /// FLUSH.
    Flush,
    /// GET_ID: `len` bytes of the id into the data segments.
    GetId {
        /// Bytes written (at most [`ID_BYTES`](super::ID_BYTES)).
        len: usize,
    },
    /// DISCARD of `len` bytes at `offset`.
    Discard {
        /// Byte offset in the image.
        offset: u64,
        /// Bytes (0: nothing to do).
        len: u64,
    },
    /// WRITE_ZEROES of `len` bytes at `offset`.
    WriteZeroes {
        /// Byte offset in the image.
        offset: u64,
        /// Bytes (0: nothing to do).
        len: u64,
        /// The driver allows deallocation.
        unmap: bool,
    },
}

impl Op {
    /// Data bytes the request moves (what the bandwidth bucket charges).
    pub fn data_len(&self) -> u64 {
        match *self {
            Op::Read { len, .. } | Op::Write { len, .. } => len,
            _ => 0,
        }
    }
}

/// A request that passed every check.
#[derive(Debug)]
pub struct Request {
    /// The chain's head, for the used entry.
    pub head: u16,
    /// What to do.
    pub op: Op,
    /// Guest memory the data goes to (IN, GET_ID) or comes from (OUT).
    pub data: Vec<IoSeg>,
    /// The status byte.
    pub status: IoSeg,
}

/// Why a request was answered without running.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reject {
    /// Malformed: IOERR.
    Malformed(&'static str),
    /// A write-class request to a read-only drive: IOERR.
    ReadOnly,
    /// Not supported: UNSUPP.
    Unsupported(u32),
}

impl Reject {
    /// The status byte it is answered with.
    pub fn status(self) -> u8 {
        match self {
            Reject::Malformed(_) | Reject::ReadOnly => VIRTIO_BLK_S_IOERR,
            Reject::Unsupported(_) => VIRTIO_BLK_S_UNSUPP,
        }
    }
}

/// What came of one chain.
#[derive(Debug)]
pub enum Parsed {
    /// Run it.
    Ready(Request),
    /// Answer it now with the reason's status (used length 1).
    Answer {
        /// The chain's head.
        head: u16,
        /// The status byte.
        status: IoSeg,
        /// Why.
        why: Reject,
    },
    /// No status byte may be written: used length 0.
    Refused {
        /// The chain's head.
        head: u16,
        /// Why the walk refused it, or `None` for a chain without a
        /// writable byte.
        why: Option<ChainError>,
    },
}

/// What the checks depend on.
#[derive(Debug, Clone, Copy)]
pub struct Rules {
    /// Sectors of the image.
    pub capacity: u64,
    /// The drive is read-only.
    pub read_only: bool,
    /// VIRTIO_BLK_F_DISCARD negotiated.
    pub discard: bool,
    /// VIRTIO_BLK_F_WRITE_ZEROES negotiated.
    pub write_zeroes: bool,
}

/// Appends the segments covering bytes `[from, from + len)` of the byte
/// stream `segs` to `out` (fewer bytes if the stream ends first).
pub fn take_range(segs: &[IoSeg], mut from: usize, mut len: usize, out: &mut Vec<IoSeg>) {
    for &seg in segs {
        if len == 0 {
            break;
        }
        if from >= seg.len() {
            from -= seg.len();
            continue;
        }
        let (_, rest) = split_seg(seg, from);
        let (part, _) = split_seg(rest, len);
        len -= part.len();
        from = 0;
        out.push(part);
    }
}

/// A request's two byte streams around its header and status byte.
#[derive(Debug, Clone, Copy)]
struct Streams {
    /// The device-readable segments: the first this many of the chain's.
    readable_segs: usize,
    /// Readable bytes after the header.
    readable_data: u64,
    /// Writable bytes before the status byte.
    writable_data: u64,
}

/// Reads a request out of chains, reusing its buffer from one to the next.
#[derive(Debug, Default)]
pub struct Parser {
    segs: Vec<IoSeg>,
}

/// `sector * 512 + len` if it neither overflows nor ends past `capacity`
/// sectors: the byte offset.
fn byte_range(sector: u64, len: u64, capacity: u64) -> Option<u64> {
    let offset = sector.checked_mul(SECTOR_SIZE)?;
    let end = offset.checked_add(len)?;
    (end <= capacity.checked_mul(SECTOR_SIZE)?).then_some(offset)
}

impl Parser {
    /// The bytes `[from, from + N)` of the stream `segs` (zeros past its end).
    fn read<const N: usize>(&self, segs_end: usize, from: usize) -> [u8; N] {
        iov::read_array::<N>(&self.segs[..segs_end], from).0
    }

    /// Walks the chain at `head` and checks it as a request (module doc);
    /// `data` is an empty vector the request's data segments go in.
    pub fn parse(
        &mut self,
        queue: &SplitQueue,
        head: u16,
        rules: &Rules,
        mut data: Vec<IoSeg>,
        budget: &mut Budget,
    ) -> Parsed {
        self.segs.clear();
        let chain = match queue.walk_mixed(head, MAX_REQUEST_LEN, &mut self.segs, budget) {
            Ok(c) => c,
            Err(e) => return Parsed::Refused { head, why: Some(e) },
        };
        if chain.writable_len == 0 {
            return Parsed::Refused { head, why: None };
        }
        // The status byte: the last writable byte, in the last segment
        // (segments are never empty, and the writable ones come last).
        let Some(&last) = self.segs.last() else {
            return Parsed::Refused { head, why: None };
        };
        let (_, status) = split_seg(last, last.len() - 1);
        match self.check(&chain, rules, &mut data) {
            Ok(op) => Parsed::Ready(Request {
                head,
                op,
                data,
                status,
            }),
            Err(why) => Parsed::Answer { head, status, why },
        }
    }

    /// Checks a walked chain that has a status byte as a request: the
    /// header, the read-only rule, then what the type asks of the data.
    #[inline(always)]
    fn check(
        &self,
        chain: &MixedChain,
        rules: &Rules,
        data: &mut Vec<IoSeg>,
    ) -> Result<Op, Reject> {
        if chain.readable_len < HEADER_LEN as u64 {
            return Err(Reject::Malformed("header shorter than 16 readable bytes"));
        }
        if chain.bufs > SEG_MAX as usize + 2 {
            return Err(Reject::Malformed("more than seg_max data buffers"));
        }
        let header: [u8; HEADER_LEN] = self.read(chain.readable_segs, 0);
        let kind = u32::from_le_bytes([header[0], header[1], header[2], header[3]]);
        let mut sector = [0u8; 8];
        sector.copy_from_slice(&header[8..16]);
        // Bytes after the header, and before the status byte. Both fit
        // usize: the chain is at most MAX_REQUEST_LEN bytes.
        let s = Streams {
            readable_segs: chain.readable_segs,
            readable_data: chain.readable_len - HEADER_LEN as u64,
            writable_data: chain.writable_len - 1,
        };
        let writes = matches!(
            kind,
            VIRTIO_BLK_T_OUT | VIRTIO_BLK_T_DISCARD | VIRTIO_BLK_T_WRITE_ZEROES
        );
        if writes && rules.read_only {
            return Err(Reject::ReadOnly);
        }
        match kind {
            VIRTIO_BLK_T_IN | VIRTIO_BLK_T_OUT => {
                self.transfer(kind, u64::from_le_bytes(sector), s, rules, data)
            }
            VIRTIO_BLK_T_FLUSH => {
                if s.readable_data != 0 || s.writable_data != 0 {
                    return Err(Reject::Malformed("data in a FLUSH"));
                }
                Ok(Op::Flush)
            }
            VIRTIO_BLK_T_GET_ID => self.get_id(s, data),
            VIRTIO_BLK_T_DISCARD | VIRTIO_BLK_T_WRITE_ZEROES => {
                self.discard_or_zeroes(kind, s, rules)
            }
            other => Err(Reject::Unsupported(other)),
        }
    }

    /// IN or OUT (`kind`) at `sector`: whole sectors of data the way the
    /// type says, inside the disk.
    #[inline(always)]
    fn transfer(
        &self,
        kind: u32,
        sector: u64,
        s: Streams,
        rules: &Rules,
        data: &mut Vec<IoSeg>,
    ) -> Result<Op, Reject> {
        let (len, wrong) = if kind == VIRTIO_BLK_T_IN {
            (s.writable_data, s.readable_data)
        } else {
            (s.readable_data, s.writable_data)
        };
        if wrong != 0 {
            return Err(Reject::Malformed("data in the wrong direction"));
        }
        if len == 0 || !len.is_multiple_of(SECTOR_SIZE) {
            return Err(Reject::Malformed("data not a whole number of sectors"));
        }
        let Some(offset) = byte_range(sector, len, rules.capacity) else {
            return Err(Reject::Malformed("sectors outside the disk"));
        };
        let r = s.readable_segs;
        if kind == VIRTIO_BLK_T_IN {
            take_range(&self.segs[r..], 0, len as usize, data);
            Ok(Op::Read { offset, len })
        } else {
            take_range(&self.segs[..r], HEADER_LEN, len as usize, data);
            Ok(Op::Write { offset, len })
        }
    }

    /// GET_ID: no readable data, room for the id (or part of it).
    fn get_id(&self, s: Streams, data: &mut Vec<IoSeg>) -> Result<Op, Reject> {
        if s.readable_data != 0 {
            return Err(Reject::Malformed("readable data in a GET_ID"));
        }
        if s.writable_data == 0 {
            return Err(Reject::Malformed("no room for the id"));
        }
        let len = (s.writable_data as usize).min(super::ID_BYTES);
        take_range(&self.segs[s.readable_segs..], 0, len, data);
        Ok(Op::GetId { len })
    }

    /// DISCARD or WRITE_ZEROES (`kind`): negotiated, one whole segment of
    /// defined flags inside the disk.
    fn discard_or_zeroes(&self, kind: u32, s: Streams, rules: &Rules) -> Result<Op, Reject> {
        let discard = kind == VIRTIO_BLK_T_DISCARD;
        if !(if discard {
            rules.discard
        } else {
            rules.write_zeroes
        }) {
            return Err(Reject::Unsupported(kind));
        }
        if s.writable_data != 0 {
            return Err(Reject::Malformed("writable data in a DISCARD/WRITE_ZEROES"));
        }
        if s.readable_data == 0 || !s.readable_data.is_multiple_of(DWZ_SEG_LEN as u64) {
            return Err(Reject::Malformed("DISCARD/WRITE_ZEROES segments cut short"));
        }
        if s.readable_data / DWZ_SEG_LEN as u64 > u64::from(MAX_DWZ_SEGS) {
            return Err(Reject::Malformed(
                "more DISCARD/WRITE_ZEROES segments than offered",
            ));
        }
        let seg: [u8; DWZ_SEG_LEN] = self.read(s.readable_segs, HEADER_LEN);
        let mut sector = [0u8; 8];
        sector.copy_from_slice(&seg[0..8]);
        let num = u32::from_le_bytes([seg[8], seg[9], seg[10], seg[11]]);
        let flags = u32::from_le_bytes([seg[12], seg[13], seg[14], seg[15]]);
        // §5.2.6.2: UNSUPP for the unmap flag on DISCARD and any flag the
        // spec does not define.
        let allowed = if discard { 0 } else { WRITE_ZEROES_FLAG_UNMAP };
        if flags & !allowed != 0 {
            return Err(Reject::Unsupported(kind));
        }
        if num > MAX_DWZ_SECTORS {
            return Err(Reject::Malformed("more sectors than offered"));
        }
        let len = u64::from(num) * SECTOR_SIZE;
        let Some(offset) = byte_range(u64::from_le_bytes(sector), len, rules.capacity) else {
            return Err(Reject::Malformed("sectors outside the disk"));
        };
        Ok(if discard {
            Op::Discard { offset, len }
        } else {
            Op::WriteZeroes {
                offset,
                len,
                unmap: flags & WRITE_ZEROES_FLAG_UNMAP != 0,
            }
        })
    }
}
