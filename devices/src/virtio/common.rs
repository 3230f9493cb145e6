// SPDX-License-Identifier: Apache-2.0
//! [`VirtioCommon`]: the state every virtio device keeps for its transport,
//! written once.
//!
//! A device's identity towards the transport is the same handful of facts
//! whatever the device is: its ID, the features it offers and those the
//! driver accepted, the size of each queue and the eventfd that carries
//! each queue's notifications. A device embeds one [`VirtioCommon`] and
//! returns it from [`VirtioDevice::common`](super::VirtioDevice::common);
//! the trait's getters read it, so a device implements only what is its
//! own (configuration space, activation, reset). Cloud Hypervisor's
//! `VirtioCommon` has the same role.

use vmm_sys_util::eventfd::EventFd;

/// The state every device keeps for the transport.
#[derive(Debug)]
pub struct VirtioCommon {
    /// Device ID (virtio 1.1 §5).
    pub device_type: u32,
    /// The feature bits the device offers (including VIRTIO_F_VERSION_1).
    pub avail_features: u64,
    /// The features of the current activation (0 before it and after a
    /// reset): those the driver accepted, limited to the offered ones.
    pub acked_features: u64,
    /// QueueNumMax of each queue; its length is the number of queues.
    pub queue_sizes: Vec<u16>,
    /// One notification eventfd per queue (see
    /// [`VirtioDevice::queue_events`](super::VirtioDevice::queue_events)).
    pub queue_evts: Vec<EventFd>,
}

impl VirtioCommon {
    /// A device of type `device_type` offering `avail_features`, with one
    /// queue of each size in `queue_sizes` and a non-blocking eventfd per
    /// queue; no features acked.
    pub fn new(
        device_type: u32,
        avail_features: u64,
        queue_sizes: Vec<u16>,
    ) -> std::io::Result<Self> {
        let queue_evts = queue_sizes
            .iter()
            .map(|_| EventFd::new(libc::EFD_NONBLOCK))
            .collect::<std::io::Result<_>>()?;
        Ok(VirtioCommon {
            device_type,
            avail_features,
            acked_features: 0,
            queue_sizes,
            queue_evts,
        })
    }

    /// Takes the features a driver acked at activation, dropping any the
    /// device did not offer, and returns them.
    pub fn ack_features(&mut self, acked: u64) -> u64 {
        self.acked_features = acked & self.avail_features;
        self.acked_features
    }

    /// Whether feature bit `bit` is acked in the current activation.
    pub fn has_feature(&self, bit: u32) -> bool {
        self.acked_features & (1u64 << bit) != 0
    }
}
