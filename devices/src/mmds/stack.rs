// SPDX-License-Identifier: Apache-2.0
//! [`MmdsStack`]: MMDS on one network card.
//!
//! The TX path rules most frames out by their first bytes
//! ([`packet::rules_out`], on the segment the chain walk hands it) and asks
//! [`MmdsStack::claims`] of the rest (six bytes of the chain read); a
//! claimed frame is handed to [`MmdsStack::receive`] and never reaches the
//! TAP. The RX path asks [`MmdsStack::poll`] for a frame before each read
//! from the TAP while [`MmdsStack::has_output`] says there may be one, so
//! MMDS's answers go ahead of the TAP's frames. A card without MMDS has no
//! stack: its TX pass is compiled without the claim, and its RX pass pays
//! a branch per frame.
//!
//! Answers are made when the guest's frame arrives; `poll` only writes out
//! what is due (an ARP reply first, then resets, then the connections in
//! turn), so a pass over the RX ring costs no more per MMDS frame than
//! building it.

use std::time::Instant;

use super::metrics::MmdsMetrics;
use super::packet::{self, arp_reply, ArpRequest, ChainBytes, Inbound};
use super::tcp::Tcp;
use super::SharedMmds;

/// MMDS on one card.
#[derive(Debug)]
pub struct MmdsStack {
    ip: [u8; 4],
    mmds: SharedMmds,
    /// The last ARP request for the address not answered yet.
    arp: Option<ArpRequest>,
    tcp: Tcp,
    /// A claimed chain, copied out of guest memory.
    inbound: Vec<u8>,
    /// The frame `poll` hands out.
    outbound: Vec<u8>,
    /// Something may be due: set by every received frame, cleared when
    /// `poll` finds nothing.
    pending: bool,
}

impl MmdsStack {
    /// MMDS at `ip` over the store `mmds`.
    pub fn new(ip: [u8; 4], mmds: SharedMmds) -> Self {
        MmdsStack {
            ip,
            mmds,
            arp: None,
            tcp: Tcp::default(),
            inbound: Vec::new(),
            outbound: Vec::new(),
            pending: false,
        }
    }

    /// The address MMDS answers at.
    pub fn ip(&self) -> [u8; 4] {
        self.ip
    }

    /// Whether a TX chain carries a frame for MMDS (see
    /// [`packet::is_for`]).
    #[inline(always)]
    pub fn claims<C: ChainBytes + ?Sized>(&self, chain: &C) -> bool {
        packet::is_for(chain, self.ip)
    }

    /// The buffer a claimed chain is copied into before
    /// [`receive_inbound`](Self::receive_inbound).
    pub(crate) fn inbound(&mut self) -> &mut Vec<u8> {
        &mut self.inbound
    }

    /// Takes the chain in the inbound buffer.
    pub(crate) fn receive_inbound(&mut self, now: Instant, m: &MmdsMetrics) {
        let chain = std::mem::take(&mut self.inbound);
        self.receive(&chain, now, m);
        self.inbound = chain;
    }

    /// Takes one claimed chain (vnet header first) from the guest.
    pub fn receive(&mut self, chain: &[u8], now: Instant, m: &MmdsMetrics) {
        MmdsMetrics::inc(&m.mmds_rx_frames);
        match packet::parse(chain, self.ip) {
            Ok(Inbound::Arp(req)) => self.arp = Some(req),
            Ok(Inbound::Tcp(seg)) => self.tcp.receive(&seg, &self.mmds, now, m),
            Err(_) => MmdsMetrics::inc(&m.mmds_rx_dropped),
        }
        self.pending = true;
    }

    /// Whether [`poll`](Self::poll) may have a frame.
    #[inline]
    pub fn has_output(&self) -> bool {
        self.pending
    }

    /// The next frame for the guest (vnet header first, no offload,
    /// checksums complete), if any.
    pub fn poll(&mut self) -> Option<&[u8]> {
        if let Some(req) = self.arp.take() {
            arp_reply(&mut self.outbound, &req, self.ip);
            return Some(&self.outbound);
        }
        if self.tcp.poll(&mut self.outbound, self.ip) {
            return Some(&self.outbound);
        }
        self.pending = false;
        None
    }

    /// Forgets every connection and pending answer (the device was
    /// reset).
    pub fn reset(&mut self) {
        self.arp = None;
        self.tcp.clear();
        self.pending = false;
    }

    /// Connections open now.
    pub fn connections(&self) -> usize {
        self.tcp.connections()
    }

    /// Bytes held for the guest's connections.
    pub fn held_bytes(&self) -> usize {
        self.tcp.held_bytes() + self.inbound.capacity() + self.outbound.capacity()
    }
}
