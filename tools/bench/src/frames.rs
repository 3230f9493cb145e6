// SPDX-License-Identifier: Apache-2.0
//! Frames the harness sends as the "guest": Ethernet + IPv4 + UDP (or TCP
//! for TSO) with correct checksums, preceded by a `virtio_net_hdr_v1`.
//!
//! Addresses live only inside the benchmark's namespace: the TAP is
//! 10.201.0.1, the fake guest 10.201.0.2 with a static neighbour entry.

use virtio_bindings::virtio_net;

use crate::sys::VNET_HDR_LEN;

/// The TAP's address inside the namespace.
pub const HOST_IP: [u8; 4] = [10, 201, 0, 1];
/// The fake guest's address (a permanent neighbour entry on the TAP).
pub const GUEST_IP: [u8; 4] = [10, 201, 0, 2];
/// The TAP's MAC, set when the benchmark creates it.
pub const HOST_MAC: [u8; 6] = [0x02, 0x00, 0x00, 0xc9, 0x00, 0x01];
/// The fake guest's MAC: locally administered unicast.
pub const GUEST_MAC: [u8; 6] = [0x06, 0x00, 0xac, 0x10, 0x00, 0x02];
/// UDP port of the host-side sink that TX frames go to.
pub const SINK_PORT: u16 = 9000;
/// UDP port the host sends RX traffic to (nobody listens: the guest is fake).
pub const GUEST_PORT: u16 = 7000;
/// Ethernet + IPv4 + UDP header bytes.
pub const UDP_OVERHEAD: usize = 14 + 20 + 8;
/// Ethernet + IPv4 + TCP header bytes.
pub const TCP_OVERHEAD: usize = 14 + 20 + 20;
/// MSS of the TSO frames: 1500 MTU - 40 (virtio 1.1 §5.1.6.2 gso_size).
pub const TSO_MSS: u16 = 1460;
/// Marks a latency probe's payload.
pub const PROBE_MAGIC: u64 = 0x6d76_6d62_7072_6f62;

/// `virtio_net_hdr` flag: the device completes the checksum (virtio 1.1 §5.1.6).
pub const VIRTIO_NET_HDR_F_NEEDS_CSUM: u8 = virtio_net::VIRTIO_NET_HDR_F_NEEDS_CSUM as u8;
/// `virtio_net_hdr` GSO type: TCPv4 segmentation (virtio 1.1 §5.1.6).
pub const VIRTIO_NET_HDR_GSO_TCPV4: u8 = virtio_net::VIRTIO_NET_HDR_GSO_TCPV4 as u8;

/// The 12-byte `virtio_net_hdr_v1`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct VnetHdr {
    /// flags
    pub flags: u8,
    /// gso_type
    pub gso_type: u8,
    /// hdr_len
    pub hdr_len: u16,
    /// gso_size
    pub gso_size: u16,
    /// csum_start
    pub csum_start: u16,
    /// csum_offset
    pub csum_offset: u16,
    /// num_buffers
    pub num_buffers: u16,
}

impl VnetHdr {
    /// Little-endian wire form.
    pub fn to_bytes(self) -> [u8; VNET_HDR_LEN] {
        let mut b = [0u8; VNET_HDR_LEN];
        b[0] = self.flags;
        b[1] = self.gso_type;
        b[2..4].copy_from_slice(&self.hdr_len.to_le_bytes());
        b[4..6].copy_from_slice(&self.gso_size.to_le_bytes());
        b[6..8].copy_from_slice(&self.csum_start.to_le_bytes());
        b[8..10].copy_from_slice(&self.csum_offset.to_le_bytes());
        b[10..12].copy_from_slice(&self.num_buffers.to_le_bytes());
        b
    }
}

/// Ones'-complement sum of `data` folded into 32 bits (RFC 1071), not inverted.
pub fn sum16(data: &[u8], mut acc: u32) -> u32 {
    let mut chunks = data.chunks_exact(2);
    for c in &mut chunks {
        acc += u32::from(u16::from_be_bytes([c[0], c[1]]));
    }
    if let [last] = chunks.remainder() {
        acc += u32::from(*last) << 8;
    }
    acc
}

/// Folds a 32-bit sum to 16 bits.
pub fn fold(mut acc: u32) -> u16 {
    while acc >> 16 != 0 {
        acc = (acc & 0xffff) + (acc >> 16);
    }
    acc as u16
}

/// The internet checksum (inverted fold) of `data`.
pub fn inet_checksum(data: &[u8]) -> u16 {
    !fold(sum16(data, 0))
}

fn pseudo_header_sum(src: [u8; 4], dst: [u8; 4], proto: u8, len: usize) -> u32 {
    let mut acc = sum16(&src, 0);
    acc = sum16(&dst, acc);
    acc += u32::from(proto);
    acc + len as u32
}

fn eth_ip(
    frame: &mut [u8],
    dst_mac: [u8; 6],
    src_mac: [u8; 6],
    proto: u8,
    src: [u8; 4],
    dst: [u8; 4],
) {
    frame[0..6].copy_from_slice(&dst_mac);
    frame[6..12].copy_from_slice(&src_mac);
    frame[12..14].copy_from_slice(&0x0800u16.to_be_bytes());
    let ip_len = (frame.len() - 14) as u16;
    let ip = &mut frame[14..34];
    ip[0] = 0x45;
    ip[1] = 0;
    ip[2..4].copy_from_slice(&ip_len.to_be_bytes());
    ip[4..6].copy_from_slice(&0u16.to_be_bytes());
    ip[6..8].copy_from_slice(&0x4000u16.to_be_bytes()); // DF
    ip[8] = 64;
    ip[9] = proto;
    ip[10..12].copy_from_slice(&[0, 0]);
    ip[12..16].copy_from_slice(&src);
    ip[16..20].copy_from_slice(&dst);
    let c = inet_checksum(ip);
    ip[10..12].copy_from_slice(&c.to_be_bytes());
}

/// A complete Ethernet/IPv4/UDP frame of `frame_len` bytes (>= 42) from the
/// guest to the host sink, with valid IP and UDP checksums.
pub fn udp_frame(frame_len: usize, host_mac: [u8; 6], src_port: u16) -> Vec<u8> {
    let frame_len = frame_len.max(UDP_OVERHEAD);
    let mut f = vec![0u8; frame_len];
    for (i, b) in f[UDP_OVERHEAD..].iter_mut().enumerate() {
        *b = (i % 251) as u8;
    }
    eth_ip(&mut f, host_mac, GUEST_MAC, 17, GUEST_IP, HOST_IP);
    let udp_len = frame_len - 34;
    {
        let udp = &mut f[34..];
        udp[0..2].copy_from_slice(&src_port.to_be_bytes());
        udp[2..4].copy_from_slice(&SINK_PORT.to_be_bytes());
        udp[4..6].copy_from_slice(&(udp_len as u16).to_be_bytes());
        udp[6..8].copy_from_slice(&[0, 0]);
    }
    let acc = sum16(&f[34..], pseudo_header_sum(GUEST_IP, HOST_IP, 17, udp_len));
    let mut c = !fold(acc);
    if c == 0 {
        c = 0xffff; // RFC 768: 0 means "no checksum".
    }
    f[40..42].copy_from_slice(&c.to_be_bytes());
    f
}

/// A TCPv4 frame of `frame_len` bytes for TSO (virtio 1.1 §5.1.6.2): the TCP
/// checksum field holds the pseudo-header sum the device (kernel) completes,
/// and the returned header asks for segmentation into `TSO_MSS` segments.
pub fn tso_frame(
    frame_len: usize,
    host_mac: [u8; 6],
    dst_mac: Option<[u8; 6]>,
    to_guest: bool,
) -> (VnetHdr, Vec<u8>) {
    let frame_len = frame_len.max(TCP_OVERHEAD + 1);
    let mut f = vec![0u8; frame_len];
    for (i, b) in f[TCP_OVERHEAD..].iter_mut().enumerate() {
        *b = (i % 253) as u8;
    }
    let (src, dst, smac, dmac) = if to_guest {
        (HOST_IP, GUEST_IP, host_mac, dst_mac.unwrap_or(GUEST_MAC))
    } else {
        (GUEST_IP, HOST_IP, GUEST_MAC, host_mac)
    };
    eth_ip(&mut f, dmac, smac, 6, src, dst);
    let tcp_len = frame_len - 34;
    {
        let tcp = &mut f[34..54];
        tcp[0..2].copy_from_slice(&40000u16.to_be_bytes());
        tcp[2..4].copy_from_slice(&SINK_PORT.to_be_bytes());
        tcp[4..8].copy_from_slice(&1u32.to_be_bytes());
        tcp[8..12].copy_from_slice(&1u32.to_be_bytes());
        tcp[12] = 5 << 4;
        tcp[13] = 0x18; // PSH | ACK
        tcp[14..16].copy_from_slice(&0xffffu16.to_be_bytes());
    }
    // Partial checksum: pseudo header only, not inverted (NEEDS_CSUM contract).
    let partial = fold(pseudo_header_sum(src, dst, 6, tcp_len));
    f[50..52].copy_from_slice(&partial.to_be_bytes());
    let hdr = VnetHdr {
        flags: VIRTIO_NET_HDR_F_NEEDS_CSUM,
        gso_type: VIRTIO_NET_HDR_GSO_TCPV4,
        hdr_len: TCP_OVERHEAD as u16,
        gso_size: TSO_MSS,
        csum_start: 34,
        csum_offset: 16,
        num_buffers: 0,
    };
    (hdr, f)
}

/// A latency probe payload: magic, then the CLOCK_MONOTONIC send time.
pub fn probe_payload(ts_ns: u64) -> [u8; 16] {
    let mut p = [0u8; 16];
    p[..8].copy_from_slice(&PROBE_MAGIC.to_le_bytes());
    p[8..].copy_from_slice(&ts_ns.to_le_bytes());
    p
}

/// Reads a probe's send time from a received frame that starts with the
/// vnet header, if the frame is a probe.
pub fn parse_probe(frame_with_hdr: &[u8]) -> Option<u64> {
    let off = VNET_HDR_LEN + UDP_OVERHEAD;
    let p = frame_with_hdr.get(off..off + 16)?;
    let magic = u64::from_le_bytes(p[..8].try_into().ok()?);
    (magic == PROBE_MAGIC).then(|| u64::from_le_bytes(p[8..].try_into().unwrap_or([0; 8])))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn checksum_matches_rfc1071_example() {
        // RFC 1071 §3 example words 0001 f203 f4f5 f6f7 sum to ddf2.
        let data = [0x00, 0x01, 0xf2, 0x03, 0xf4, 0xf5, 0xf6, 0xf7];
        assert_eq!(fold(sum16(&data, 0)), 0xddf2);
        assert_eq!(inet_checksum(&data), !0xddf2);
    }

    #[test]
    fn udp_frame_has_valid_checksums_and_lengths() {
        for len in [42usize, 64, 1514] {
            let f = udp_frame(len, [2, 0, 0, 0, 0, 1], 1234);
            assert_eq!(f.len(), len);
            // A header with its checksum in place sums to 0xffff.
            assert_eq!(fold(sum16(&f[14..34], 0)), 0xffff);
            let udp_len = usize::from(u16::from_be_bytes([f[38], f[39]]));
            assert_eq!(udp_len, len - 34);
            let acc = sum16(&f[34..], pseudo_header_sum(GUEST_IP, HOST_IP, 17, udp_len));
            assert_eq!(fold(acc), 0xffff);
            assert_eq!(&f[30..34], &HOST_IP);
        }
    }

    #[test]
    fn tso_frame_header_describes_frame() {
        let (h, f) = tso_frame(65000, [2, 0, 0, 0, 0, 1], None, false);
        assert_eq!(f.len(), 65000);
        assert_eq!(h.gso_type, VIRTIO_NET_HDR_GSO_TCPV4);
        assert_eq!(usize::from(h.hdr_len), TCP_OVERHEAD);
        assert_eq!(u16::from_be_bytes([f[16], f[17]]) as usize, 65000 - 14);
        let b = h.to_bytes();
        assert_eq!(u16::from_le_bytes([b[4], b[5]]), TSO_MSS);
        assert_eq!(u16::from_le_bytes([b[6], b[7]]), 34);
        assert_eq!(u16::from_le_bytes([b[8], b[9]]), 16);
    }

    #[test]
    fn probe_roundtrip_and_rejects_other_frames() {
        let mut buf = vec![0u8; VNET_HDR_LEN + UDP_OVERHEAD];
        buf.extend_from_slice(&probe_payload(123_456));
        assert_eq!(parse_probe(&buf), Some(123_456));
        buf[VNET_HDR_LEN + UDP_OVERHEAD] ^= 1;
        assert_eq!(parse_probe(&buf), None);
        assert_eq!(parse_probe(&buf[..20]), None);
    }
}
