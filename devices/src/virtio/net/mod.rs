// SPDX-License-Identifier: Apache-2.0
//! virtio-net (virtio 1.1 §5.1) with a TAP backend and a zero-copy datapath.
//!
//! The device is split the way the reference VMMs split theirs, so each part
//! can be read and tested on its own:
//!
//! - [`device`]: the [`Net`] type, the features it offers, its configuration
//!   space and the [`VirtioDevice`](super::VirtioDevice) side (activation and
//!   reset, called from a vCPU thread through the MMIO transport).
//! - [`rx`] and [`tx`]: the datapath. [`RxVirtio`](rx::RxVirtio) moves frames
//!   from the backend into guest RX buffers with one `readv` per frame
//!   (spreading a frame over as many posted chains as it needs when
//!   VIRTIO_NET_F_MRG_RXBUF is negotiated); [`TxVirtio`](tx::TxVirtio) writes
//!   each TX chain with one `writev`, or a batch of them through the
//!   [`io_engine`](crate::virtio::io_engine). The rings are
//!   [`SplitQueue`](crate::virtio::queue::SplitQueue)s.
//! - [`pass`]: what bounds a pass in either direction: a byte or packet
//!   weight, as vhost-net has, so neither direction can starve the other, a
//!   fixed descriptor budget whatever the weights, so no guest input can
//!   make a pass unbounded, and a time budget.
//! - [`event_handler`]: the event-manager glue. Every file descriptor the
//!   device waits on is registered there with a `u32` token; activation and
//!   reset only change state and kick an internal `EventFd`, and the handler
//!   brings the epoll registrations in line with that state.
//! - [`tap`]: the [`NetBackend`] trait, the TAP device and the unprivileged
//!   socket backends used by tests and benchmarks; with the shared
//!   [`iov`](crate::virtio::iov) and [`io_engine`](crate::virtio::io_engine),
//!   the only place of the device allowed `unsafe`.
//! - [`metrics`]: [`NetMetrics`], lock-free counters with a JSON view whose
//!   field names are a contract with the VMM's `--metrics` file.
//! - `tests` (unit tests only): the suites that drive the whole device from
//!   the driver side.
//!
//! Threads: everything in this module runs on the thread that drives the
//! `EventManager`, except [`VirtioDevice::activate`](super::VirtioDevice::activate),
//! [`VirtioDevice::reset`](super::VirtioDevice::reset) and the config-space
//! accessors, which the MMIO transport calls from a vCPU thread. The device is
//! shared as `Arc<Mutex<Net>>`, so the two never run at the same time.

pub mod device;
pub mod event_handler;
pub mod metrics;
pub mod pass;
pub mod rx;
pub mod tap;
pub mod tx;

/// The engine choice is shared with the block device; net re-exports it so
/// `net::IoEngine` keeps working.
pub use crate::virtio::io_engine::IoEngine;
pub use device::{Net, NetError};
pub use metrics::NetMetrics;
pub use tap::{NetBackend, SeqPacket, Tap, TapError};

use virtio_bindings::virtio_net::virtio_net_hdr_v1;

use crate::rate_limiter::RateLimiterConfig;
use crate::virtio::queue::{MAX_QUEUE_SIZE, PASS_WEIGHT_BYTES, PASS_WEIGHT_CHAINS};

/// Index of the receive queue (virtio 1.1 §5.1.2).
pub const RX_INDEX: usize = 0;
/// Index of the transmit queue (virtio 1.1 §5.1.2).
pub const TX_INDEX: usize = 1;
/// Number of queues of a single-queue-pair network device.
pub const NUM_QUEUES: usize = 2;

/// Length of `struct virtio_net_hdr_v1` (virtio 1.1 §5.1.6): with
/// VIRTIO_F_VERSION_1 the header always carries `num_buffers`, so it is 12
/// bytes whether or not VIRTIO_NET_F_MRG_RXBUF is negotiated.
pub const VNET_HDR_LEN: usize = std::mem::size_of::<virtio_net_hdr_v1>();
/// Offset of `num_buffers` inside `virtio_net_hdr_v1` (virtio 1.1 §5.1.6).
pub const NUM_BUFFERS_OFFSET: usize = std::mem::offset_of!(virtio_net_hdr_v1, num_buffers);
const _: () = assert!(VNET_HDR_LEN == 12 && NUM_BUFFERS_OFFSET == 10);
/// Largest Ethernet frame without segmentation offloads: 1500-byte MTU plus a
/// 14-byte Ethernet header.
pub const MAX_FRAME_NO_GSO: usize = 1514;
/// Largest frame a TAP hands over with TSO/UFO: a 64 KiB IP packet plus the
/// Ethernet header (65535 + 14 rounded as Linux' virtio-net does, 65550).
pub const MAX_FRAME_GSO: usize = 65550;

/// Configuration of one network device, plain data chosen by the VMM.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NetConfig {
    /// MAC address the guest sees in the configuration space.
    pub mac: [u8; 6],
    /// QueueNumMax offered for both queues; a power of two up to
    /// [`MAX_QUEUE_SIZE`] (see [`NetConfig::validate`]).
    pub queue_size: u16,
    /// Bytes after which a TX pass yields to the event loop; 0 disables.
    pub tx_weight_bytes: u64,
    /// Frames after which a TX pass yields to the event loop; 0 disables.
    pub tx_weight_packets: u64,
    /// Bytes after which an RX pass yields to the event loop; 0 disables.
    pub rx_weight_bytes: u64,
    /// Frames after which an RX pass yields to the event loop; 0 disables.
    pub rx_weight_packets: u64,
    /// Microseconds after which a pass (either direction) yields to the
    /// event loop, whatever the weights; 0 disables. It bounds how long one
    /// direction's flood delays the other (see [`pass`]).
    pub pass_time_budget_us: u64,
    /// Which checksum and segmentation offloads to offer.
    pub offloads: Offloads,
    /// Offer VIRTIO_NET_F_MRG_RXBUF.
    pub mrg_rxbuf: bool,
    /// Offer VIRTIO_NET_F_MTU with this MTU (68 to 65535); frames up to
    /// MTU + 14 bytes are then accepted from the backend without offloads.
    pub mtu: Option<u16>,
    /// Limits on frames from the backend to the guest.
    pub rx_rate_limiter: RateLimiterConfig,
    /// Limits on frames from the guest to the backend.
    pub tx_rate_limiter: RateLimiterConfig,
    /// Benchmark baseline only: copy every frame through a 64 KiB host buffer
    /// (as vmm-reference does) instead of `readv`/`writev` on guest memory.
    pub bounce_buffer: bool,
    /// How TX frames reach the backend.
    pub io_engine: IoEngine,
}

/// vhost-net's `VHOST_NET_WEIGHT`: bytes per pass before yielding (the
/// shared [`PASS_WEIGHT_BYTES`]).
pub const DEFAULT_WEIGHT_BYTES: u64 = PASS_WEIGHT_BYTES;
/// vhost-net's `VHOST_NET_PKT_WEIGHT`: frames per pass before yielding (the
/// shared [`PASS_WEIGHT_CHAINS`]).
pub const DEFAULT_WEIGHT_PACKETS: u64 = PASS_WEIGHT_CHAINS as u64;
/// Default time budget of a pass in µs. In netbench's seed001 experiment
/// (the RX latency of a probe every 1 ms under a TX flood of 1-byte UDP
/// frames, BENCHMARKS.md), packet weight 256 with a 100 µs budget kept the
/// probe's p99 at 241 µs, against 1,539 µs with the weight alone and
/// 391 µs with a 200 µs budget; 50 µs gained only 13 µs more (227 µs).
pub const DEFAULT_PASS_TIME_BUDGET_US: u64 = 100;
/// Default QueueNumMax: what Firecracker and QEMU offer.
pub const DEFAULT_QUEUE_SIZE: u16 = 256;
/// The MAC address a device gets unless the VMM chooses one: a locally
/// administered unicast address (bit 1 of the first octet set, bit 0
/// clear), stable across runs.
pub const DEFAULT_MAC: [u8; 6] = [0x06, 0x00, 0xac, 0x10, 0x00, 0x02];

/// Why a [`NetConfig`] cannot make a device: one variant per setting with
/// bounds.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NetConfigError {
    /// `queue_size` is not a power of two in 1..=[`MAX_QUEUE_SIZE`].
    #[error("queue size {0} is not a power of two between 1 and {max}", max = MAX_QUEUE_SIZE)]
    QueueSize(u16),
    /// `mtu` is outside [`MTU_RANGE`](device::MTU_RANGE).
    #[error("MTU {0} is outside 68 to 65535")]
    Mtu(u16),
    /// `offloads` is a selection no driver may negotiate.
    #[error("the offloads cannot be negotiated: {0}")]
    Offloads(&'static str),
}

impl Default for NetConfig {
    fn default() -> Self {
        NetConfig {
            mac: DEFAULT_MAC,
            queue_size: DEFAULT_QUEUE_SIZE,
            tx_weight_bytes: DEFAULT_WEIGHT_BYTES,
            tx_weight_packets: DEFAULT_WEIGHT_PACKETS,
            rx_weight_bytes: DEFAULT_WEIGHT_BYTES,
            rx_weight_packets: DEFAULT_WEIGHT_PACKETS,
            pass_time_budget_us: DEFAULT_PASS_TIME_BUDGET_US,
            offloads: Offloads::ALL,
            mrg_rxbuf: true,
            mtu: None,
            rx_rate_limiter: RateLimiterConfig::default(),
            tx_rate_limiter: RateLimiterConfig::default(),
            bounce_buffer: false,
            io_engine: IoEngine::default(),
        }
    }
}

/// The offloads a device offers, each in both directions (the device's
/// HOST_* feature and the driver's GUEST_* one). TSO and UFO need checksum
/// offload (virtio 1.1 §5.1.3.1), which [`Offloads::validate`] checks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Offloads {
    /// VIRTIO_NET_F_CSUM and VIRTIO_NET_F_GUEST_CSUM.
    pub csum: bool,
    /// VIRTIO_NET_F_HOST_TSO4 and VIRTIO_NET_F_GUEST_TSO4.
    pub tso4: bool,
    /// VIRTIO_NET_F_HOST_TSO6 and VIRTIO_NET_F_GUEST_TSO6.
    pub tso6: bool,
    /// VIRTIO_NET_F_HOST_UFO and VIRTIO_NET_F_GUEST_UFO.
    pub ufo: bool,
}

impl Offloads {
    /// Every offload (the default).
    pub const ALL: Offloads = Offloads {
        csum: true,
        tso4: true,
        tso6: true,
        ufo: true,
    };
    /// No offload: every frame is complete and checksummed.
    pub const NONE: Offloads = Offloads {
        csum: false,
        tso4: false,
        tso6: false,
        ufo: false,
    };

    /// Whether the combination is one a driver may negotiate.
    pub fn validate(&self) -> Result<(), &'static str> {
        if !self.csum && (self.tso4 || self.tso6 || self.ufo) {
            return Err("TSO and UFO need checksum offload (csum)");
        }
        Ok(())
    }
}

impl NetConfig {
    /// Checks every setting with bounds; [`Net::new`] and
    /// [`Net::with_backend`] refuse a configuration that fails.
    ///
    /// The queue size is the QueueNumMax offered: a power of two up to
    /// [`MAX_QUEUE_SIZE`] (virtio 1.1 §2.6, "Queue Size value is always a
    /// power of 2. The maximum Queue Size value is 32768"). 1 is a power of
    /// two and the spec sets no other minimum, so it is accepted: a driver
    /// then has one descriptor per queue (Linux's `vring_create_virtqueue`
    /// checks only for a power of two), and frames longer than one buffer
    /// are dropped without MRG_RXBUF or wait for the next buffer with it.
    pub fn validate(&self) -> Result<(), NetConfigError> {
        let qs = self.queue_size;
        if qs == 0 || qs > MAX_QUEUE_SIZE || !qs.is_power_of_two() {
            return Err(NetConfigError::QueueSize(qs));
        }
        if let Some(mtu) = self.mtu {
            if !device::MTU_RANGE.contains(&mtu) {
                return Err(NetConfigError::Mtu(mtu));
            }
        }
        self.offloads.validate().map_err(NetConfigError::Offloads)
    }

    /// The time budget of a pass, if any.
    pub fn pass_time_budget(&self) -> Option<std::time::Duration> {
        (self.pass_time_budget_us != 0)
            .then(|| std::time::Duration::from_micros(self.pass_time_budget_us))
    }
}

#[cfg(test)]
mod tests;
