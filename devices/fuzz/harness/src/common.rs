// SPDX-License-Identifier: Apache-2.0
//! What device targets share: guest memory layouts and a virtio-net device
//! over a socket backend behind its MMIO transport.

use std::sync::{Arc, Mutex};

use arbitrary::Arbitrary;
use devices::virtio::mmio::MmioTransport;
use devices::virtio::net::{Net, NetConfig, SeqPacket};
use devices::virtio::{GuestMemory, VirtioDevice};
use vm_memory::GuestAddress;

/// Guest memory shapes a target may ask for. Small, so that random ring
/// addresses often land inside it, and with a hole, so that ranges crossing
/// a region boundary or the hole are tried too.
#[derive(Debug, Clone, Copy, Arbitrary)]
pub enum MemLayout {
    /// 64 KiB at 0.
    Small,
    /// 64 KiB at 0 and 64 KiB at 128 KiB (a 64 KiB hole between).
    Split,
    /// 1 MiB at 0: room for the largest queues.
    Large,
}

impl MemLayout {
    /// The (start, length) of each region.
    pub fn regions(self) -> &'static [(u64, usize)] {
        match self {
            MemLayout::Small => &[(0, 0x1_0000)],
            MemLayout::Split => &[(0, 0x1_0000), (0x2_0000, 0x1_0000)],
            MemLayout::Large => &[(0, 0x10_0000)],
        }
    }
}

/// Creates zeroed guest memory of `layout`.
pub fn guest_memory(layout: MemLayout) -> GuestMemory {
    let ranges: Vec<(GuestAddress, usize)> = layout
        .regions()
        .iter()
        .map(|&(start, len)| (GuestAddress(start), len))
        .collect();
    GuestMemory::from_ranges(&ranges).expect("fixed, valid memory layout")
}

/// The device configuration knobs a target varies.
#[derive(Debug, Clone, Copy, Arbitrary)]
pub struct NetSetup {
    /// log2 of QueueNumMax, folded into 0..=10 (1 to 1024 entries).
    pub queue_size_log2: u8,
    /// Offer checksum/TSO/UFO offloads.
    pub offloads: bool,
    /// Offer mergeable RX buffers.
    pub mrg_rxbuf: bool,
}

impl NetSetup {
    /// The device configuration this setup stands for.
    pub fn config(self) -> NetConfig {
        NetConfig {
            mac: [0x06, 0x00, 0xac, 0x10, 0x00, 0x02],
            queue_size: 1 << (self.queue_size_log2 % 11),
            offloads: self.offloads,
            mrg_rxbuf: self.mrg_rxbuf,
            ..NetConfig::default()
        }
    }
}

/// A virtio-net device on a `SOCK_SEQPACKET` backend, behind its transport.
pub struct NetUnderTest {
    /// The device, also reachable through the transport.
    pub net: Arc<Mutex<Net<SeqPacket>>>,
    /// The transport the guest driver talks to.
    pub transport: MmioTransport,
    /// The other end of the backend (the "network").
    pub peer: SeqPacket,
    /// The device configuration.
    pub config: NetConfig,
    /// Guest memory.
    pub mem: GuestMemory,
}

impl NetUnderTest {
    /// Builds the device and its transport over `mem`.
    pub fn new(mem: GuestMemory, config: NetConfig) -> Self {
        let (backend, peer) = SeqPacket::pair().expect("socketpair for the backend");
        let net = Net::with_backend(backend, config.clone(), mem.clone())
            .expect("a valid net configuration");
        let net = Arc::new(Mutex::new(net));
        let dev: Arc<Mutex<dyn VirtioDevice>> = net.clone();
        let transport = MmioTransport::new(mem.clone(), dev).expect("transport for the device");
        NetUnderTest {
            net,
            transport,
            peer,
            config,
            mem,
        }
    }

    /// Whether the device itself says it is activated.
    pub fn device_activated(&self) -> bool {
        self.net
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .is_activated()
    }

    /// The features the device offers.
    pub fn offered_features(&self) -> u64 {
        self.net
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .avail_features()
    }
}

/// A guest address: mostly near the bottom of memory, where the layouts
/// put RAM, sometimes anywhere.
#[derive(Debug, Clone, Copy, Arbitrary)]
pub enum Addr {
    /// An address below 1 MiB + 64 KiB (byte granular).
    Near(u16, u8),
    /// Any 64-bit address.
    Raw(u64),
}

impl Addr {
    /// The address.
    pub fn get(self) -> u64 {
        match self {
            Addr::Near(lo, hi) => (u64::from(hi & 0x0f) << 16) | u64::from(lo),
            Addr::Raw(a) => a,
        }
    }
}
