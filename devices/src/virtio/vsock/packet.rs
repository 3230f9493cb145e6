// SPDX-License-Identifier: Apache-2.0
//! The virtio-vsock packet header (virtio 1.2 §5.10.6) and the checks every
//! header from the guest goes through.
//!
//! ```text
//! struct virtio_vsock_hdr {
//!     le64 src_cid;  le64 dst_cid;  le32 src_port;  le32 dst_port;
//!     le32 len;      le16 type;     le16 op;        le32 flags;
//!     le32 buf_alloc; le32 fwd_cnt;
//! };                                                  // 44 bytes, packed
//! ```
//!
//! No bindings crate carries `virtio_vsock.h`, so the operation, type and
//! flag values are written here from the specification, each with its
//! section. A header is read out of guest memory once ([`Header::parse`]
//! over a copy) and every decision is made on that copy.
//!
//! [`Header::check_from_guest`] refuses a header the device cannot act on:
//! a source CID that is not the guest's, a destination that is not the
//! host, a payload length the chain does not carry or above
//! [`MAX_PAYLOAD`]. What is checked later, against the connection
//! (type, op, credit), is answered with RST by the muxer.

/// Bytes of the header (virtio 1.2 §5.10.6).
pub const HDR_LEN: usize = 44;

/// Most payload bytes one packet may carry, either way: the receive buffer
/// size of Linux's driver at its largest (`VIRTIO_VSOCK_MAX_PKT_BUF_SIZE`).
pub const MAX_PAYLOAD: u32 = 64 * 1024;

/// `type` of a stream socket (virtio 1.2 §5.10.6, `VIRTIO_VSOCK_TYPE_STREAM`).
pub const TYPE_STREAM: u16 = 1;

/// `flags` bits of a SHUTDOWN (virtio 1.2 §5.10.6.3): the sender will
/// receive no more data.
pub const SHUTDOWN_RCV: u32 = 1;
/// The sender will send no more data.
pub const SHUTDOWN_SEND: u32 = 2;

/// `id` of the event that tells the driver to forget its connections
/// (virtio 1.2 §5.10.6.4, `VIRTIO_VSOCK_EVENT_TRANSPORT_RESET`).
pub const EVENT_TRANSPORT_RESET: u32 = 0;

/// The operations (virtio 1.2 §5.10.6, `VIRTIO_VSOCK_OP_*`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u16)]
pub enum Op {
    /// Connection request.
    Request = 1,
    /// Connection accepted.
    Response = 2,
    /// Connection refused or torn down.
    Rst = 3,
    /// The sender will send or receive no more (`flags`).
    Shutdown = 4,
    /// Stream data.
    Rw = 5,
    /// The sender's `buf_alloc` and `fwd_cnt`, unasked.
    CreditUpdate = 6,
    /// Asks the peer for a CREDIT_UPDATE.
    CreditRequest = 7,
}

impl Op {
    /// The op of a header's `op` field, if it is one.
    pub fn from_u16(v: u16) -> Option<Op> {
        Some(match v {
            1 => Op::Request,
            2 => Op::Response,
            3 => Op::Rst,
            4 => Op::Shutdown,
            5 => Op::Rw,
            6 => Op::CreditUpdate,
            7 => Op::CreditRequest,
            _ => return None,
        })
    }
}

/// A packet header, as read from or written to guest memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Header {
    /// Sender's CID.
    pub src_cid: u64,
    /// Receiver's CID.
    pub dst_cid: u64,
    /// Sender's port.
    pub src_port: u32,
    /// Receiver's port.
    pub dst_port: u32,
    /// Payload bytes after the header.
    pub len: u32,
    /// Socket type ([`TYPE_STREAM`]).
    pub kind: u16,
    /// Operation ([`Op`] as a number: a guest may write any).
    pub op: u16,
    /// SHUTDOWN flags.
    pub flags: u32,
    /// The sender's receive buffer for this connection, in bytes.
    pub buf_alloc: u32,
    /// Bytes the sender has taken out of that buffer since the connection
    /// began (wrapping).
    pub fwd_cnt: u32,
}

/// Why a header from the guest was refused; each is counted as a
/// malformed packet and the chain returned.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum PacketError {
    /// The chain is shorter than the header.
    #[error("chain of {0} bytes is shorter than the 44-byte header")]
    Short(usize),
    /// `src_cid` is not the guest's CID.
    #[error("source CID {0} is not the guest's")]
    SrcCid(u64),
    /// `dst_cid` is not the host (CID 2).
    #[error("destination CID {0} is not the host")]
    DstCid(u64),
    /// `len` is more than the chain carries after the header.
    #[error("payload length {len} but the chain carries {avail} bytes after the header")]
    LenBeyondChain {
        /// The header's `len`.
        len: u32,
        /// Bytes after the header.
        avail: usize,
    },
    /// `len` is above [`MAX_PAYLOAD`].
    #[error("payload length {0} is above 65536")]
    LenTooLarge(u32),
}

fn u32_at(b: &[u8; HDR_LEN], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

fn u16_at(b: &[u8; HDR_LEN], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}

fn u64_at(b: &[u8; HDR_LEN], at: usize) -> u64 {
    u64::from(u32_at(b, at)) | u64::from(u32_at(b, at + 4)) << 32
}

impl Header {
    /// The header in its 44 little-endian bytes.
    pub fn parse(b: &[u8; HDR_LEN]) -> Header {
        Header {
            src_cid: u64_at(b, 0),
            dst_cid: u64_at(b, 8),
            src_port: u32_at(b, 16),
            dst_port: u32_at(b, 20),
            len: u32_at(b, 24),
            kind: u16_at(b, 28),
            op: u16_at(b, 30),
            flags: u32_at(b, 32),
            buf_alloc: u32_at(b, 36),
            fwd_cnt: u32_at(b, 40),
        }
    }

    /// The 44 bytes of the header.
    pub fn to_bytes(&self) -> [u8; HDR_LEN] {
        let mut b = [0u8; HDR_LEN];
        b[0..8].copy_from_slice(&self.src_cid.to_le_bytes());
        b[8..16].copy_from_slice(&self.dst_cid.to_le_bytes());
        b[16..20].copy_from_slice(&self.src_port.to_le_bytes());
        b[20..24].copy_from_slice(&self.dst_port.to_le_bytes());
        b[24..28].copy_from_slice(&self.len.to_le_bytes());
        b[28..30].copy_from_slice(&self.kind.to_le_bytes());
        b[30..32].copy_from_slice(&self.op.to_le_bytes());
        b[32..36].copy_from_slice(&self.flags.to_le_bytes());
        b[36..40].copy_from_slice(&self.buf_alloc.to_le_bytes());
        b[40..44].copy_from_slice(&self.fwd_cnt.to_le_bytes());
        b
    }

    /// The checks that do not need a connection, for a header the guest
    /// sent in a chain of `chain_len` bytes (header included).
    pub fn check_from_guest(&self, guest_cid: u64, chain_len: usize) -> Result<(), PacketError> {
        let avail = chain_len
            .checked_sub(HDR_LEN)
            .ok_or(PacketError::Short(chain_len))?;
        if self.src_cid != guest_cid {
            return Err(PacketError::SrcCid(self.src_cid));
        }
        if self.dst_cid != u64::from(libc::VMADDR_CID_HOST) {
            return Err(PacketError::DstCid(self.dst_cid));
        }
        if self.len > MAX_PAYLOAD {
            return Err(PacketError::LenTooLarge(self.len));
        }
        if self.len as usize > avail {
            return Err(PacketError::LenBeyondChain {
                len: self.len,
                avail,
            });
        }
        Ok(())
    }

    /// The header of a packet from the host's `host_port` to the guest's
    /// `guest_port`, with the host's credit for the connection.
    pub fn to_guest(guest_cid: u64, host_port: u32, guest_port: u32, op: Op) -> Header {
        Header {
            src_cid: u64::from(libc::VMADDR_CID_HOST),
            dst_cid: guest_cid,
            src_port: host_port,
            dst_port: guest_port,
            kind: TYPE_STREAM,
            op: op as u16,
            ..Header::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Header {
        Header {
            src_cid: 3,
            dst_cid: 2,
            src_port: 0x1122_3344,
            dst_port: 52,
            len: 100,
            kind: TYPE_STREAM,
            op: Op::Rw as u16,
            flags: 0,
            buf_alloc: 262_144,
            fwd_cnt: 0xdead_beef,
        }
    }

    #[test]
    fn a_header_is_44_little_endian_bytes_at_the_spec_s_offsets() {
        let b = sample().to_bytes();
        assert_eq!(b[0], 3);
        assert_eq!(b[8], 2);
        assert_eq!(&b[16..20], &[0x44, 0x33, 0x22, 0x11]);
        assert_eq!(u32_at(&b, 20), 52);
        assert_eq!(u32_at(&b, 24), 100);
        assert_eq!(u16_at(&b, 28), 1);
        assert_eq!(u16_at(&b, 30), 5);
        assert_eq!(u32_at(&b, 36), 262_144);
        assert_eq!(u32_at(&b, 40), 0xdead_beef);
        assert_eq!(Header::parse(&b), sample());
        let high = Header {
            src_cid: 0x0102_0304_0506_0708,
            ..sample()
        };
        assert_eq!(Header::parse(&high.to_bytes()), high);
    }

    #[test]
    fn every_field_is_read_from_its_own_bytes() {
        // Every byte distinct: a field read one byte off, or from its
        // neighbour's bytes, reads another value (a guest may set the high
        // bytes a real connection leaves zero).
        let b: [u8; HDR_LEN] = std::array::from_fn(|i| i as u8 + 1);
        let h = Header::parse(&b);
        let le32 = |at: usize| u32::from_le_bytes(b[at..at + 4].try_into().unwrap());
        assert_eq!(h.src_cid, u64::from_le_bytes(b[0..8].try_into().unwrap()));
        assert_eq!(h.dst_cid, u64::from_le_bytes(b[8..16].try_into().unwrap()));
        assert_eq!(h.src_port, le32(16));
        assert_eq!(h.dst_port, le32(20));
        assert_eq!(h.len, le32(24));
        assert_eq!(h.kind, u16::from_le_bytes([b[28], b[29]]));
        assert_eq!(h.op, u16::from_le_bytes([b[30], b[31]]));
        assert_eq!(h.flags, le32(32));
        assert_eq!(h.buf_alloc, le32(36));
        assert_eq!(h.fwd_cnt, le32(40));
        assert_eq!(h.to_bytes(), b);
    }

    #[test]
    fn every_op_round_trips_and_no_other_value_is_one() {
        for v in 1..=7u16 {
            assert_eq!(Op::from_u16(v).map(|o| o as u16), Some(v));
        }
        for v in [0u16, 8, 9, 0xffff] {
            assert_eq!(Op::from_u16(v), None);
        }
    }

    #[test]
    fn the_guest_s_header_checks() {
        let h = sample();
        assert_eq!(h.check_from_guest(3, 144), Ok(()));
        assert_eq!(
            h.check_from_guest(3, 1000),
            Ok(()),
            "trailing bytes are ignored"
        );
        assert_eq!(h.check_from_guest(3, 43), Err(PacketError::Short(43)));
        assert_eq!(h.check_from_guest(4, 144), Err(PacketError::SrcCid(3)));
        let to_self = Header { dst_cid: 3, ..h };
        assert_eq!(
            to_self.check_from_guest(3, 144),
            Err(PacketError::DstCid(3))
        );
        assert_eq!(
            h.check_from_guest(3, 143),
            Err(PacketError::LenBeyondChain {
                len: 100,
                avail: 99
            })
        );
        let big = Header {
            len: MAX_PAYLOAD + 1,
            ..h
        };
        assert_eq!(
            big.check_from_guest(3, 200_000),
            Err(PacketError::LenTooLarge(MAX_PAYLOAD + 1))
        );
        let max = Header {
            len: MAX_PAYLOAD,
            ..h
        };
        assert_eq!(
            max.check_from_guest(3, HDR_LEN + MAX_PAYLOAD as usize),
            Ok(())
        );
        // A 64-bit CID whose low half matches is another CID.
        let wide = Header {
            src_cid: 3 | 1 << 32,
            ..h
        };
        assert!(wide.check_from_guest(3, 144).is_err());
    }

    #[test]
    fn a_header_to_the_guest_comes_from_the_host() {
        let h = Header::to_guest(7, 1 << 30, 52, Op::Response);
        assert_eq!((h.src_cid, h.dst_cid), (2, 7));
        assert_eq!((h.src_port, h.dst_port), (1 << 30, 52));
        assert_eq!((h.kind, h.op, h.len), (TYPE_STREAM, 2, 0));
    }
}
