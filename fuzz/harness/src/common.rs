// SPDX-License-Identifier: Apache-2.0
//! What device targets share: guest memory layouts and a virtio-net device
//! over a socket backend behind its MMIO transport.

use std::sync::{Arc, Mutex};

use arbitrary::Arbitrary;
use devices::virtio::mmio::MmioTransport;
use devices::virtio::net::{Net, NetConfig, Offloads, SeqPacket};
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
    /// Offloads to offer, one bit each: csum, tso4, tso6, ufo (the last three
    /// only with csum, as the device requires).
    pub offloads: u8,
    /// Offer mergeable RX buffers.
    pub mrg_rxbuf: bool,
}

impl NetSetup {
    fn offloads(self) -> Offloads {
        let bit = |n: u8| self.offloads & (1 << n) != 0;
        let csum = bit(0);
        Offloads {
            csum,
            tso4: csum && bit(1),
            tso6: csum && bit(2),
            ufo: csum && bit(3),
        }
    }

    /// The device configuration this setup stands for.
    pub fn config(self) -> NetConfig {
        NetConfig {
            mac: [0x06, 0x00, 0xac, 0x10, 0x00, 0x02],
            queue_size: 1 << (self.queue_size_log2 % 11),
            offloads: self.offloads(),
            mrg_rxbuf: self.mrg_rxbuf,
            // A pass that ends by the clock would make an input's outcome
            // depend on the machine's speed; the descriptor budget and the
            // weights still bound every pass.
            pass_time_budget_us: 0,
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

/// A guest address. Random 64-bit values almost never satisfy the ring
/// alignment and placement rules at once, so three times in four this is a
/// page-aligned slot (valid for every ring), else a byte-granular address
/// in the first MiB (alignment left to chance) or any address at all.
#[derive(Debug, Clone, Copy, Arbitrary)]
pub struct Addr {
    /// Which kind of address (see above).
    pub kind: u8,
    /// The page number, offset or address.
    pub value: u64,
}

impl Addr {
    /// A page-aligned address: page `n`.
    pub fn page(n: u8) -> Self {
        Addr {
            kind: 0,
            value: u64::from(n),
        }
    }

    /// Exactly `addr`.
    pub fn raw(addr: u64) -> Self {
        Addr {
            kind: 7,
            value: addr,
        }
    }

    /// The address. Pages 0 to 255 lie in the Large layout; pages 0 to 15
    /// and 32 to 47 in all of them.
    pub fn get(self) -> u64 {
        match self.kind % 8 {
            0..=5 => (self.value % 256) << 12,
            6 => self.value % 0x10_0000,
            _ => self.value,
        }
    }
}
