// SPDX-License-Identifier: Apache-2.0
//! Ethernet, ARP, IPv4 and TCP as MMDS reads and writes them.
//!
//! Reading checks every field a later step relies on and drops what fails
//! (a frame too short for its headers, a header length or total length that
//! points outside the frame, a bad IPv4 header checksum, a bad TCP checksum
//! unless the guest left it to the device, a fragment). Writing builds a
//! whole frame, vnet header first, with both checksums computed, so the
//! guest receives complete frames whatever offloads it negotiated.

use virtio_bindings::virtio_net::virtio_net_hdr_v1;

/// The vnet header every chain starts with (virtio 1.1 §5.1.6; 12 bytes
/// with VIRTIO_F_VERSION_1).
const VNET_HDR_LEN: usize = std::mem::size_of::<virtio_net_hdr_v1>();

/// Ethernet header length (IEEE 802.3: two addresses and the EtherType).
pub const ETH_HLEN: usize = libc::ETH_HLEN as usize;
const ETH_ALEN: usize = libc::ETH_ALEN as usize;
const ETHERTYPE_IPV4: u16 = libc::ETH_P_IP as u16;
const ETHERTYPE_ARP: u16 = libc::ETH_P_ARP as u16;
/// ARP for IPv4 over Ethernet is 28 bytes (RFC 826).
const ARP_LEN: usize = 28;
/// The IPv4 header without options (RFC 791).
const IPV4_HLEN: usize = 20;
/// The TCP header without options (RFC 793).
const TCP_HLEN: usize = 20;
const IPPROTO_TCP: u8 = libc::IPPROTO_TCP as u8;
/// IPv4 flags and fragment offset: More Fragments and the 13-bit offset
/// (RFC 791 §3.1).
const IP_MF_OR_OFFSET: u16 = 0x3fff;
/// `virtio_net_hdr.flags` bit: the checksum is left to the device (virtio
/// 1.1 §5.1.6).
const VNET_F_NEEDS_CSUM: u8 = virtio_bindings::virtio_net::VIRTIO_NET_HDR_F_NEEDS_CSUM as u8;
/// TTL of MMDS's packets (Firecracker's: one hop).
const MMDS_TTL: u8 = 1;
/// The TCP option kind of the maximum segment size (RFC 793).
const TCP_OPT_MSS: u8 = 2;

/// TCP flags (RFC 793 §3.1).
pub mod flags {
    /// No more data from the sender.
    pub const FIN: u8 = 0x01;
    /// Synchronize sequence numbers.
    pub const SYN: u8 = 0x02;
    /// Reset the connection.
    pub const RST: u8 = 0x04;
    /// Push function.
    pub const PSH: u8 = 0x08;
    /// The acknowledgment field is significant.
    pub const ACK: u8 = 0x10;
}

fn be16(b: &[u8], at: usize) -> u16 {
    u16::from_be_bytes([b[at], b[at + 1]])
}

fn be32(b: &[u8], at: usize) -> u32 {
    u32::from_be_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

/// Bytes of a TX chain read where they lie: a chain in guest memory, or a
/// slice.
pub trait ChainBytes {
    /// The `N` bytes at `offset`, or `None` when the chain ends first.
    fn bytes<const N: usize>(&self, offset: usize) -> Option<[u8; N]>;

    /// The `N` bytes at `a` and the `M` bytes at `b`, or `None` when the
    /// chain ends before either ends.
    #[inline(always)]
    fn two<const N: usize, const M: usize>(
        &self,
        a: usize,
        b: usize,
    ) -> Option<([u8; N], [u8; M])> {
        Some((self.bytes::<N>(a)?, self.bytes::<M>(b)?))
    }
}

impl ChainBytes for [u8] {
    fn bytes<const N: usize>(&self, offset: usize) -> Option<[u8; N]> {
        let end = offset.checked_add(N)?;
        self.get(offset..end)?.try_into().ok()
    }
}

/// Where a chain (vnet header first) holds the EtherType.
const ETHERTYPE_AT: usize = VNET_HDR_LEN + 12;
/// Where a chain holds an IPv4 header's destination address.
const IPV4_DST_AT: usize = VNET_HDR_LEN + ETH_HLEN + IPV4_HLEN - 4;
/// Where a chain holds an ARP packet's target protocol address.
const ARP_TPA_AT: usize = VNET_HDR_LEN + ETH_HLEN + ARP_LEN - 4;

/// Whether a TX chain (vnet header included) carries a frame for `ip`: an
/// ARP packet whose target is `ip`, or an IPv4 packet to `ip`. A frame that
/// says neither goes to the TAP untouched. One read takes the EtherType
/// and the place of an IPv4 destination (one bounds check, both compared
/// as they lie in the frame, no byte swap), and an ARP target is read only
/// for ARP. No length to check: each address's four bytes end where the
/// shortest header that holds it does (IPv4's 20 bytes, ARP's 28), and a
/// chain too short to hold an IPv4 header holds no frame for MMDS at all.
#[inline(always)]
pub fn is_for<C: ChainBytes + ?Sized>(chain: &C, ip: [u8; 4]) -> bool {
    let Some((ethertype, ipv4_dst)) = chain.two::<2, 4>(ETHERTYPE_AT, IPV4_DST_AT) else {
        return false;
    };
    if ethertype == ETHERTYPE_IPV4.to_be_bytes() {
        ipv4_dst == ip
    } else if ethertype == ETHERTYPE_ARP.to_be_bytes() {
        chain.bytes::<4>(ARP_TPA_AT) == Some(ip)
    } else {
        false
    }
}

/// How many of a chain's first bytes [`rules_out`] reads: up to the end
/// of an IPv4 header's destination address.
pub const HEAD_LEN: usize = IPV4_DST_AT + 4;

/// A chain's first [`HEAD_LEN`] bytes that [`rules_out`] can never rule
/// out (zeros and the ARP EtherType): what the TX path reads for a chain
/// whose first buffer was too short or in two memory regions, so that it
/// needs no test of its own.
pub static UNDECIDED_HEAD: [u8; HEAD_LEN] = {
    let mut head = [0u8; HEAD_LEN];
    let ethertype = ETHERTYPE_ARP.to_be_bytes();
    head[ETHERTYPE_AT] = ethertype[0];
    head[ETHERTYPE_AT + 1] = ethertype[1];
    head
};

/// Whether `head`, a chain's first [`HEAD_LEN`] bytes (a shorter `head`
/// rules out only what its EtherType alone does), shows that the chain
/// holds no frame for `ip` whatever follows: the frame is IPv4 to another address, or neither IPv4
/// nor ARP. Where it is true [`is_for`] is false; where it is false (ARP,
/// IPv4 to `ip`) ask [`is_for`] of the whole chain. The TX path asks this
/// of every frame on a card MMDS serves, of the first segment as the walk
/// made it: the EtherType, then for IPv4 the destination, each one load,
/// compare and branch.
#[inline(always)]
pub fn rules_out<C: ChainBytes + ?Sized>(head: &C, ip: [u8; 4]) -> bool {
    match head.bytes::<2>(ETHERTYPE_AT) {
        Some(ethertype) if ethertype == ETHERTYPE_IPV4.to_be_bytes() => {
            head.bytes::<4>(IPV4_DST_AT).is_some_and(|dst| dst != ip)
        }
        Some(ethertype) => ethertype != ETHERTYPE_ARP.to_be_bytes(),
        None => false,
    }
}

/// [`is_for`] over a chain's bytes in one slice.
pub fn slice_is_for(chain: &[u8], ip: [u8; 4]) -> bool {
    is_for(chain, ip)
}

/// An ARP request for the MMDS address.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ArpRequest {
    /// Who asked: hardware address.
    pub sha: [u8; 6],
    /// Who asked: protocol address.
    pub spa: [u8; 4],
}

/// What a frame for MMDS carries.
#[derive(Debug, PartialEq, Eq)]
pub enum Inbound<'a> {
    /// An ARP request for the MMDS address.
    Arp(ArpRequest),
    /// A TCP segment to the MMDS address.
    Tcp(Segment<'a>),
}

/// One TCP segment from the guest.
#[derive(Debug, PartialEq, Eq)]
pub struct Segment<'a> {
    /// The guest's MAC address (Ethernet source).
    pub mac: [u8; 6],
    /// The guest's IPv4 address.
    pub ip: [u8; 4],
    /// Source port.
    pub sport: u16,
    /// Destination port.
    pub dport: u16,
    /// Sequence number.
    pub seq: u32,
    /// Acknowledgment number.
    pub ack: u32,
    /// TCP flags.
    pub flags: u8,
    /// The window the guest advertises (no window scaling is offered).
    pub window: u16,
    /// The MSS option, if the segment carries one.
    pub mss: Option<u16>,
    /// The data.
    pub payload: &'a [u8],
}

/// Why a frame for MMDS was dropped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Drop {
    /// Too short for its headers, or lengths pointing outside it.
    Malformed,
    /// A checksum does not match.
    Checksum,
    /// An IPv4 fragment (MMDS does not reassemble).
    Fragment,
    /// Neither an ARP request nor TCP.
    Unsupported,
}

/// Reads a whole TX chain (vnet header first) that [`is_for`] claimed.
pub fn parse(chain: &[u8], ip: [u8; 4]) -> Result<Inbound<'_>, Drop> {
    if chain.len() < VNET_HDR_LEN + ETH_HLEN {
        return Err(Drop::Malformed);
    }
    let needs_csum = chain[0] & VNET_F_NEEDS_CSUM != 0;
    let f = &chain[VNET_HDR_LEN..];
    let mut mac = [0u8; 6];
    mac.copy_from_slice(&f[ETH_ALEN..2 * ETH_ALEN]);
    let p = &f[ETH_HLEN..];
    match be16(f, 12) {
        ETHERTYPE_ARP => parse_arp(p, ip).map(Inbound::Arp),
        ETHERTYPE_IPV4 => parse_ipv4(p, ip, needs_csum, mac).map(Inbound::Tcp),
        _ => Err(Drop::Unsupported),
    }
}

fn parse_arp(p: &[u8], ip: [u8; 4]) -> Result<ArpRequest, Drop> {
    if p.len() < ARP_LEN {
        return Err(Drop::Malformed);
    }
    let ethernet_ipv4 = be16(p, 0) == libc::ARPHRD_ETHER
        && be16(p, 2) == ETHERTYPE_IPV4
        && p[4] == ETH_ALEN as u8
        && p[5] == 4;
    if !ethernet_ipv4 || be16(p, 6) != libc::ARPOP_REQUEST || p[24..28] != ip {
        return Err(Drop::Unsupported);
    }
    let mut req = ArpRequest {
        sha: [0; 6],
        spa: [0; 4],
    };
    req.sha.copy_from_slice(&p[8..14]);
    req.spa.copy_from_slice(&p[14..18]);
    Ok(req)
}

fn parse_ipv4(p: &[u8], ip: [u8; 4], needs_csum: bool, mac: [u8; 6]) -> Result<Segment<'_>, Drop> {
    if p.len() < IPV4_HLEN || p[0] >> 4 != 4 {
        return Err(Drop::Malformed);
    }
    let ihl = usize::from(p[0] & 0xf) * 4;
    let total = usize::from(be16(p, 2));
    if ihl < IPV4_HLEN || total < ihl || total > p.len() || p[16..20] != ip {
        return Err(Drop::Malformed);
    }
    if checksum(&[&p[..ihl]]) != 0 {
        return Err(Drop::Checksum);
    }
    if be16(p, 6) & IP_MF_OR_OFFSET != 0 {
        return Err(Drop::Fragment);
    }
    if p[9] != IPPROTO_TCP {
        return Err(Drop::Unsupported);
    }
    let mut src = [0u8; 4];
    src.copy_from_slice(&p[12..16]);
    let t = &p[ihl..total];
    if t.len() < TCP_HLEN {
        return Err(Drop::Malformed);
    }
    let doff = usize::from(t[12] >> 4) * 4;
    if doff < TCP_HLEN || doff > t.len() {
        return Err(Drop::Malformed);
    }
    // With the checksum left to the device only the pseudo-header sum is
    // in the field (virtio 1.1 §5.1.6.2): nothing to check against.
    if !needs_csum && checksum(&[&pseudo_header(src, ip, t.len()), t]) != 0 {
        return Err(Drop::Checksum);
    }
    Ok(Segment {
        mac,
        ip: src,
        sport: be16(t, 0),
        dport: be16(t, 2),
        seq: be32(t, 4),
        ack: be32(t, 8),
        flags: t[13],
        window: be16(t, 14),
        mss: mss_option(&t[TCP_HLEN..doff]),
        payload: &t[doff..],
    })
}

/// The MSS option among `opts`, if present and well formed.
fn mss_option(mut opts: &[u8]) -> Option<u16> {
    while let Some(&kind) = opts.first() {
        match kind {
            0 => return None,
            1 => opts = &opts[1..],
            _ => {
                let len = usize::from(*opts.get(1)?);
                if len < 2 || len > opts.len() {
                    return None;
                }
                if kind == TCP_OPT_MSS && len == 4 {
                    return Some(be16(opts, 2));
                }
                opts = &opts[len..];
            }
        }
    }
    None
}

fn pseudo_header(src: [u8; 4], dst: [u8; 4], tcp_len: usize) -> [u8; 12] {
    let mut ph = [0u8; 12];
    ph[..4].copy_from_slice(&src);
    ph[4..8].copy_from_slice(&dst);
    ph[9] = IPPROTO_TCP;
    // A TCP segment inside an IPv4 packet is under 64 KiB.
    ph[10..12].copy_from_slice(&(tcp_len as u16).to_be_bytes());
    ph
}

/// The Internet checksum (RFC 1071) of the concatenated parts: 0 when a
/// header that carries its checksum is intact. Every part but the last
/// must have an even length.
pub fn checksum(parts: &[&[u8]]) -> u16 {
    let mut sum: u64 = 0;
    for part in parts {
        let mut words = part.chunks_exact(2);
        for w in &mut words {
            sum += u64::from(u16::from_be_bytes([w[0], w[1]]));
        }
        if let [last] = words.remainder() {
            sum += u64::from(*last) << 8;
        }
    }
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

/// Starts a frame in `out`: a zeroed vnet header (no offload, complete
/// checksums) and the Ethernet header from MMDS to `dst`.
fn ethernet(out: &mut Vec<u8>, dst: [u8; 6], ethertype: u16) {
    out.clear();
    out.resize(VNET_HDR_LEN, 0);
    out.extend_from_slice(&dst);
    out.extend_from_slice(&super::MMDS_MAC);
    out.extend_from_slice(&ethertype.to_be_bytes());
}

/// Writes MMDS's ARP reply to `req` into `out` (vnet header first).
pub fn arp_reply(out: &mut Vec<u8>, req: &ArpRequest, ip: [u8; 4]) {
    ethernet(out, req.sha, ETHERTYPE_ARP);
    out.extend_from_slice(&libc::ARPHRD_ETHER.to_be_bytes());
    out.extend_from_slice(&ETHERTYPE_IPV4.to_be_bytes());
    out.extend_from_slice(&[ETH_ALEN as u8, 4]);
    out.extend_from_slice(&libc::ARPOP_REPLY.to_be_bytes());
    out.extend_from_slice(&super::MMDS_MAC);
    out.extend_from_slice(&ip);
    out.extend_from_slice(&req.sha);
    out.extend_from_slice(&req.spa);
}

/// A TCP segment MMDS sends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Outbound<'a> {
    /// The guest's MAC and IPv4 addresses and port.
    pub mac: [u8; 6],
    /// The guest's IPv4 address.
    pub ip: [u8; 4],
    /// The guest's port.
    pub port: u16,
    /// MMDS's port.
    pub local_port: u16,
    /// Sequence number.
    pub seq: u32,
    /// Acknowledgment number.
    pub ack: u32,
    /// TCP flags.
    pub flags: u8,
    /// The window MMDS advertises.
    pub window: u16,
    /// The MSS option to send (on SYN-ACK only).
    pub mss: Option<u16>,
    /// The data.
    pub payload: &'a [u8],
}

/// Writes `seg` from MMDS at `local_ip` as a whole frame into `out`.
pub fn tcp_frame(out: &mut Vec<u8>, seg: &Outbound<'_>, local_ip: [u8; 4]) {
    ethernet(out, seg.mac, ETHERTYPE_IPV4);
    let opts = if seg.mss.is_some() { 4 } else { 0 };
    let tcp_len = TCP_HLEN + opts + seg.payload.len();
    let ip_start = out.len();
    // MMDS's segments are at most MSS-sized: well under 64 KiB.
    let total = (IPV4_HLEN + tcp_len) as u16;
    out.extend_from_slice(&[0x45, 0]);
    out.extend_from_slice(&total.to_be_bytes());
    // Identification 0 with Don't Fragment (RFC 6864 §4.1).
    out.extend_from_slice(&[0, 0, 0x40, 0, MMDS_TTL, IPPROTO_TCP, 0, 0]);
    out.extend_from_slice(&local_ip);
    out.extend_from_slice(&seg.ip);
    let ip_csum = checksum(&[&out[ip_start..]]);
    out[ip_start + 10..ip_start + 12].copy_from_slice(&ip_csum.to_be_bytes());
    let tcp_start = out.len();
    out.extend_from_slice(&seg.local_port.to_be_bytes());
    out.extend_from_slice(&seg.port.to_be_bytes());
    out.extend_from_slice(&seg.seq.to_be_bytes());
    out.extend_from_slice(&seg.ack.to_be_bytes());
    out.extend_from_slice(&[(((TCP_HLEN + opts) / 4) as u8) << 4, seg.flags]);
    out.extend_from_slice(&seg.window.to_be_bytes());
    out.extend_from_slice(&[0, 0, 0, 0]);
    if let Some(mss) = seg.mss {
        out.extend_from_slice(&[TCP_OPT_MSS, 4]);
        out.extend_from_slice(&mss.to_be_bytes());
    }
    out.extend_from_slice(seg.payload);
    let ph = pseudo_header(local_ip, seg.ip, tcp_len);
    let csum = checksum(&[&ph, &out[tcp_start..]]);
    out[tcp_start + 16..tcp_start + 18].copy_from_slice(&csum.to_be_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;

    const MMDS_IP: [u8; 4] = [169, 254, 169, 254];
    const GUEST_MAC: [u8; 6] = [6, 0, 0xac, 0x10, 0, 2];
    const GUEST_IP: [u8; 4] = [10, 0, 0, 2];

    /// A guest segment, built by the writer with the addresses swapped
    /// (the writer always sends from MMDS, so fix up what differs).
    fn guest_segment(payload: &[u8], flags_: u8, mss: Option<u16>) -> Vec<u8> {
        let mut out = Vec::new();
        tcp_frame(
            &mut out,
            &Outbound {
                mac: GUEST_MAC,
                ip: MMDS_IP,
                port: 80,
                local_port: 40000,
                seq: 1000,
                ack: 7,
                flags: flags_,
                window: 29200,
                mss,
                payload,
            },
            GUEST_IP,
        );
        // Ethernet source: the guest's MAC (the writer put MMDS's).
        out[VNET_HDR_LEN + 6..VNET_HDR_LEN + 12].copy_from_slice(&GUEST_MAC);
        out
    }

    #[test]
    fn test_tcp_round_trip_and_checksums() {
        let f = guest_segment(
            b"GET / HTTP/1.1\r\n\r\n",
            flags::ACK | flags::PSH,
            Some(1460),
        );
        assert!(slice_is_for(&f, MMDS_IP));
        assert!(!slice_is_for(&f, [169, 254, 169, 253]));
        assert!(!slice_is_for(&f[..VNET_HDR_LEN + ETH_HLEN + 19], MMDS_IP));
        let Ok(Inbound::Tcp(s)) = parse(&f, MMDS_IP) else {
            panic!("parses");
        };
        assert_eq!(
            (s.mac, s.ip, s.sport, s.dport, s.seq, s.ack),
            (GUEST_MAC, GUEST_IP, 40000, 80, 1000, 7)
        );
        assert_eq!(
            (s.flags, s.window, s.mss),
            (flags::ACK | flags::PSH, 29200, Some(1460))
        );
        assert_eq!(s.payload, b"GET / HTTP/1.1\r\n\r\n");
        // A flipped payload bit is a checksum failure, unless the guest
        // left the checksum to the device.
        let mut bad = f.clone();
        *bad.last_mut().expect("payload") ^= 1;
        assert_eq!(parse(&bad, MMDS_IP), Err(Drop::Checksum));
        bad[0] = VNET_F_NEEDS_CSUM;
        assert!(matches!(parse(&bad, MMDS_IP), Ok(Inbound::Tcp(_))));
        // A flipped IPv4 header bit.
        let mut bad = f.clone();
        bad[VNET_HDR_LEN + ETH_HLEN + 8] ^= 1;
        assert_eq!(parse(&bad, MMDS_IP), Err(Drop::Checksum));
    }

    #[test]
    fn test_ipv4_drops() {
        let f = guest_segment(b"", flags::SYN, None);
        let ip = VNET_HDR_LEN + ETH_HLEN;
        let fix = |f: &mut Vec<u8>| {
            f[ip + 10] = 0;
            f[ip + 11] = 0;
            let c = checksum(&[&f[ip..ip + IPV4_HLEN]]);
            f[ip + 10..ip + 12].copy_from_slice(&c.to_be_bytes());
        };
        let mut frag = f.clone();
        frag[ip + 6] = 0x20; // More Fragments
        fix(&mut frag);
        assert_eq!(parse(&frag, MMDS_IP), Err(Drop::Fragment));
        let mut udp = f.clone();
        udp[ip + 9] = 17;
        fix(&mut udp);
        assert_eq!(parse(&udp, MMDS_IP), Err(Drop::Unsupported));
        let mut long = f.clone();
        long[ip + 2] = 0xff;
        fix(&mut long);
        assert_eq!(parse(&long, MMDS_IP), Err(Drop::Malformed));
        let mut ihl = f.clone();
        ihl[ip] = 0x44;
        assert_eq!(parse(&ihl, MMDS_IP), Err(Drop::Malformed));
        assert_eq!(parse(&f[..ip + 30], MMDS_IP), Err(Drop::Malformed));
        assert_eq!(parse(&f[..20], MMDS_IP), Err(Drop::Malformed));
        let mut doff = f.clone();
        doff[ip + IPV4_HLEN + 12] = 0xf0;
        assert_eq!(parse(&doff, MMDS_IP), Err(Drop::Malformed));
    }

    /// What the TX path rules out from a chain's first bytes is exactly
    /// what is not for MMDS among the frames those bytes decide (IPv4 to
    /// another address, neither IPv4 nor ARP); a frame for MMDS is never
    /// ruled out, whatever its other bytes.
    #[test]
    fn test_rules_out_exactly_what_the_head_decides() {
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = move || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        let ethertypes = [
            ETHERTYPE_IPV4.to_be_bytes(),
            ETHERTYPE_ARP.to_be_bytes(),
            [0x86, 0xdd],
            [0x81, 0x00],
            [0x08, 0x01],
            [0x00, 0x08],
        ];
        for i in 0..30_000usize {
            let mut f: Vec<u8> = (0..VNET_HDR_LEN + 64).map(|_| next() as u8).collect();
            let et = ethertypes[i % ethertypes.len()];
            f[ETHERTYPE_AT..ETHERTYPE_AT + 2].copy_from_slice(&et);
            if i % 3 == 0 {
                f[IPV4_DST_AT..IPV4_DST_AT + 4].copy_from_slice(&MMDS_IP);
            }
            if i % 4 == 0 {
                f[ARP_TPA_AT..ARP_TPA_AT + 4].copy_from_slice(&MMDS_IP);
            }
            let is_ipv4 = et == ETHERTYPE_IPV4.to_be_bytes();
            let is_arp = et == ETHERTYPE_ARP.to_be_bytes();
            let to_mmds = f[IPV4_DST_AT..IPV4_DST_AT + 4] == MMDS_IP;
            let want = (is_ipv4 && !to_mmds) || !(is_ipv4 || is_arp);
            let got = rules_out(&f[..HEAD_LEN], MMDS_IP);
            assert_eq!(got, want, "{:02x?}", &f[..HEAD_LEN]);
            if got {
                assert!(!slice_is_for(&f, MMDS_IP), "{f:02x?}");
            }
        }
        let mut ipv4 = [0u8; HEAD_LEN];
        ipv4[ETHERTYPE_AT..ETHERTYPE_AT + 2].copy_from_slice(&ETHERTYPE_IPV4.to_be_bytes());
        assert!(rules_out(&ipv4[..], MMDS_IP));
        // Without the whole destination, IPv4 is not ruled out.
        assert!(!rules_out(&ipv4[..HEAD_LEN - 1], MMDS_IP));
    }

    /// The head the TX path reads when the walk showed it none rules out no
    /// chain, whatever MMDS's address.
    #[test]
    fn test_the_undecided_head_rules_nothing_out() {
        for ip in [MMDS_IP, [0; 4], [255; 4], [169, 254, 0, 1]] {
            assert!(!rules_out(&UNDECIDED_HEAD[..], ip), "{ip:?}");
        }
    }

    #[test]
    fn test_arp_request_and_reply() {
        let mut req = vec![0u8; VNET_HDR_LEN];
        req.extend_from_slice(&[0xff; 6]);
        req.extend_from_slice(&GUEST_MAC);
        req.extend_from_slice(&ETHERTYPE_ARP.to_be_bytes());
        req.extend_from_slice(&[0, 1, 8, 0, 6, 4, 0, 1]);
        req.extend_from_slice(&GUEST_MAC);
        req.extend_from_slice(&GUEST_IP);
        req.extend_from_slice(&[0; 6]);
        req.extend_from_slice(&MMDS_IP);
        assert!(slice_is_for(&req, MMDS_IP));
        assert!(!slice_is_for(&req[..req.len() - 1], MMDS_IP));
        let mut other = req.clone();
        other[VNET_HDR_LEN + 12] = 0x86;
        assert!(!slice_is_for(&other, MMDS_IP));
        // Each EtherType's address is read at its own place only: an ARP
        // frame with the address where IPv4's destination lies is not for
        // MMDS, nor an IPv4 frame with it where ARP's target lies.
        let mut arp_elsewhere = req.clone();
        arp_elsewhere[VNET_HDR_LEN + 38..].copy_from_slice(&[10, 0, 0, 1]);
        arp_elsewhere[VNET_HDR_LEN + 30..VNET_HDR_LEN + 34].copy_from_slice(&MMDS_IP);
        assert!(!slice_is_for(&arp_elsewhere, MMDS_IP));
        let mut ipv4_elsewhere = req.clone();
        ipv4_elsewhere[VNET_HDR_LEN + 12..VNET_HDR_LEN + 14]
            .copy_from_slice(&ETHERTYPE_IPV4.to_be_bytes());
        assert!(!slice_is_for(&ipv4_elsewhere, MMDS_IP));
        ipv4_elsewhere[VNET_HDR_LEN + 30..VNET_HDR_LEN + 34].copy_from_slice(&MMDS_IP);
        assert!(slice_is_for(&ipv4_elsewhere, MMDS_IP));
        assert!(slice_is_for(&ipv4_elsewhere[..VNET_HDR_LEN + 34], MMDS_IP));
        let Ok(Inbound::Arp(a)) = parse(&req, MMDS_IP) else {
            panic!("an ARP request");
        };
        assert_eq!(
            a,
            ArpRequest {
                sha: GUEST_MAC,
                spa: GUEST_IP
            }
        );
        let mut out = Vec::new();
        arp_reply(&mut out, &a, MMDS_IP);
        let f = &out[VNET_HDR_LEN..];
        assert_eq!(&f[..6], &GUEST_MAC);
        assert_eq!(&f[6..12], &super::super::MMDS_MAC);
        assert_eq!(&f[14..22], &[0, 1, 8, 0, 6, 4, 0, 2]);
        assert_eq!(&f[28..32], &MMDS_IP);
        assert_eq!(&f[38..42], &GUEST_IP);
        // A reply, not a request, is not answered.
        let mut reply = req.clone();
        reply[VNET_HDR_LEN + ETH_HLEN + 7] = 2;
        assert_eq!(parse(&reply, MMDS_IP), Err(Drop::Unsupported));
        assert_eq!(parse(&req[..40], MMDS_IP), Err(Drop::Malformed));
    }

    #[test]
    fn test_mss_option_parsing() {
        assert_eq!(mss_option(&[1, 1, 2, 4, 5, 0xb4]), Some(1460));
        assert_eq!(mss_option(&[3, 3, 7, 2, 4, 0, 100]), Some(100));
        assert_eq!(mss_option(&[0, 2, 4, 5, 0xb4]), None);
        assert_eq!(mss_option(&[2, 1, 0]), None);
        assert_eq!(mss_option(&[2, 9, 0]), None);
        assert_eq!(mss_option(&[5]), None);
    }

    #[test]
    fn test_checksum_odd_length() {
        // RFC 1071's example words, and an odd tail padded with zero.
        assert_eq!(
            checksum(&[&[0x00, 0x01, 0xf2, 0x03, 0xf4, 0xf5, 0xf6, 0xf7]]),
            !0xddf2
        );
        assert_eq!(checksum(&[&[0x12]]), !0x1200);
    }
}
