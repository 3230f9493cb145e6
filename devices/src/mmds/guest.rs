// SPDX-License-Identifier: Apache-2.0
//! The guest's side of MMDS, for tests, the fuzz target and the
//! benchmark: frames a guest's kernel would send (an ARP request, TCP
//! segments to port 80) and a reading of the frames MMDS sends back.

use super::packet::{self, flags, Inbound, Outbound, ETH_HLEN};
use super::MMDS_MAC;

/// The vnet header's length (virtio 1.1 §5.1.6).
const VNET: usize = 12;

/// One guest TCP connection to MMDS, and the addresses it uses.
#[derive(Debug, Clone)]
pub struct GuestClient {
    /// The guest's MAC address.
    pub mac: [u8; 6],
    /// The guest's IPv4 address.
    pub ip: [u8; 4],
    /// MMDS's address.
    pub mmds_ip: [u8; 4],
    /// The guest's port.
    pub port: u16,
    /// The next sequence number the guest sends.
    pub seq: u32,
    /// What the guest acknowledges.
    pub ack: u32,
    /// The window the guest advertises.
    pub window: u16,
}

/// A frame MMDS sent, as the guest reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reply {
    /// An ARP reply: MMDS's MAC and address.
    Arp {
        /// The MAC MMDS answered with.
        mac: [u8; 6],
        /// The address it answered for.
        ip: [u8; 4],
    },
    /// A TCP segment.
    Tcp {
        /// The guest port it is for.
        port: u16,
        /// Sequence number.
        seq: u32,
        /// Acknowledgment number.
        ack: u32,
        /// Flags.
        flags: u8,
        /// Advertised window.
        window: u16,
        /// Data.
        payload: Vec<u8>,
    },
}

impl GuestClient {
    /// A client at 10.0.0.2 on `port`, MMDS at `mmds_ip`.
    pub fn new(mmds_ip: [u8; 4], port: u16) -> Self {
        GuestClient {
            mac: [6, 0, 0xac, 0x10, 0, 2],
            ip: [10, 0, 0, 2],
            mmds_ip,
            port,
            seq: 1000,
            ack: 0,
            window: 64240,
        }
    }

    /// An ARP request for MMDS's address (vnet header first).
    pub fn arp_request(&self) -> Vec<u8> {
        let mut f = vec![0u8; VNET];
        f.extend_from_slice(&[0xff; 6]);
        f.extend_from_slice(&self.mac);
        f.extend_from_slice(&(libc::ETH_P_ARP as u16).to_be_bytes());
        f.extend_from_slice(&[0, 1, 8, 0, 6, 4, 0, 1]);
        f.extend_from_slice(&self.mac);
        f.extend_from_slice(&self.ip);
        f.extend_from_slice(&[0; 6]);
        f.extend_from_slice(&self.mmds_ip);
        f
    }

    /// A segment from the guest with the client's numbers (the sequence
    /// number does not advance: see [`send`](Self::send)).
    pub fn segment(&self, flags_: u8, payload: &[u8], mss: Option<u16>) -> Vec<u8> {
        let mut out = Vec::new();
        // The writer builds frames from MMDS: swap the roles, then put the
        // guest's MAC as the source and MMDS's as the destination.
        packet::tcp_frame(
            &mut out,
            &Outbound {
                mac: MMDS_MAC,
                ip: self.mmds_ip,
                port: 80,
                local_port: self.port,
                seq: self.seq,
                ack: self.ack,
                flags: flags_,
                window: self.window,
                mss,
                payload,
            },
            self.ip,
        );
        out[VNET + 6..VNET + 12].copy_from_slice(&self.mac);
        out
    }

    /// [`segment`](Self::segment), advancing the sequence number past what
    /// it carries.
    pub fn send(&mut self, flags_: u8, payload: &[u8]) -> Vec<u8> {
        let f = self.segment(flags_, payload, (flags_ & flags::SYN != 0).then_some(1460));
        let len = payload.len() as u32
            + u32::from(flags_ & flags::SYN != 0)
            + u32::from(flags_ & flags::FIN != 0);
        self.seq = self.seq.wrapping_add(len);
        f
    }
}

/// Reads a frame MMDS sent (vnet header first), checking what a guest's
/// kernel would: the vnet header asks nothing of the guest, the Ethernet
/// addresses, and for TCP both checksums. `None` for anything else.
pub fn read_reply(frame: &[u8], guest_mac: [u8; 6], guest_ip: [u8; 4]) -> Option<Reply> {
    if frame.len() < VNET + ETH_HLEN || frame[..10].iter().any(|&b| b != 0) {
        return None;
    }
    let f = &frame[VNET..];
    if f[..6] != guest_mac || f[6..12] != MMDS_MAC {
        return None;
    }
    if u16::from_be_bytes([f[12], f[13]]) == libc::ETH_P_ARP as u16 {
        if f.len() < ETH_HLEN + 28 || f[20..22] != [0, 2] || f[38..42] != guest_ip {
            return None;
        }
        let mut mac = [0u8; 6];
        mac.copy_from_slice(&f[22..28]);
        let mut ip = [0u8; 4];
        ip.copy_from_slice(&f[28..32]);
        return Some(Reply::Arp { mac, ip });
    }
    // Read it back as the guest's kernel: the same parser, the guest as
    // the destination, every checksum verified (the vnet header asks for
    // none to be left to the guest).
    match packet::parse(frame, guest_ip) {
        Ok(Inbound::Tcp(s)) => Some(Reply::Tcp {
            port: s.dport,
            seq: s.seq,
            ack: s.ack,
            flags: s.flags,
            window: s.window,
            payload: s.payload.to_vec(),
        }),
        _ => None,
    }
}
