// SPDX-License-Identifier: Apache-2.0
//! The [`Net`] device: features, configuration space, activation and reset.
//!
//! Activation and reset arrive from a vCPU thread through the MMIO transport,
//! but every file descriptor the device polls belongs to the event loop. So
//! both only change state here and write `activate_evt`; the event handler
//! (see `event_handler`) then registers or unregisters the queue, backend and
//! re-queue descriptors to match. Nothing guest-visible depends on that delay:
//! queue notifications wait in their eventfds until they are registered.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use virtio_queue::{Queue, QueueT};
use vmm_sys_util::eventfd::EventFd;

use super::metrics::NetMetrics;
use super::rxtx::{RxVirtio, TxVirtio};
use super::tap::{self, NetBackend, Tap, TapError};
use super::{
    NetConfig, MAX_FRAME_GSO, MAX_FRAME_NO_GSO, NUM_QUEUES, RX_INDEX, TX_INDEX, VNET_HDR_LEN,
};
use crate::virtio::{ActivateError, GuestMemory, Interrupt, VirtioDevice};

/// Feature bits (virtio 1.1 §5.1.3, §6).
pub mod features {
    /// Device handles packets with partial checksum (host TX offload).
    pub const VIRTIO_NET_F_CSUM: u32 = 0;
    /// Driver handles packets with partial checksum (guest RX offload).
    pub const VIRTIO_NET_F_GUEST_CSUM: u32 = 1;
    /// Device has a MAC address in its configuration space.
    pub const VIRTIO_NET_F_MAC: u32 = 5;
    /// Driver can receive TSOv4.
    pub const VIRTIO_NET_F_GUEST_TSO4: u32 = 7;
    /// Driver can receive TSOv6.
    pub const VIRTIO_NET_F_GUEST_TSO6: u32 = 8;
    /// Driver can receive UFO.
    pub const VIRTIO_NET_F_GUEST_UFO: u32 = 10;
    /// Device can receive TSOv4.
    pub const VIRTIO_NET_F_HOST_TSO4: u32 = 11;
    /// Device can receive TSOv6.
    pub const VIRTIO_NET_F_HOST_TSO6: u32 = 12;
    /// Device can receive UFO.
    pub const VIRTIO_NET_F_HOST_UFO: u32 = 14;
    /// Driver can merge receive buffers.
    pub const VIRTIO_NET_F_MRG_RXBUF: u32 = 15;
    /// Configuration status field is available.
    pub const VIRTIO_NET_F_STATUS: u32 = 16;
    /// used_event/avail_event interrupt and notification suppression.
    pub const VIRTIO_RING_F_EVENT_IDX: u32 = 29;
    /// Compliance with virtio 1.0 and later.
    pub const VIRTIO_F_VERSION_1: u32 = 32;
    /// Status field bit: the link is up (virtio 1.1 §5.1.4).
    pub const VIRTIO_NET_S_LINK_UP: u16 = 1;
}
use features::*;

const fn bit(b: u32) -> u64 {
    1u64 << b
}

/// The offload features toggled by `NetConfig::offloads`.
pub const OFFLOAD_FEATURES: u64 = bit(VIRTIO_NET_F_CSUM)
    | bit(VIRTIO_NET_F_GUEST_CSUM)
    | bit(VIRTIO_NET_F_GUEST_TSO4)
    | bit(VIRTIO_NET_F_GUEST_TSO6)
    | bit(VIRTIO_NET_F_GUEST_UFO)
    | bit(VIRTIO_NET_F_HOST_TSO4)
    | bit(VIRTIO_NET_F_HOST_TSO6)
    | bit(VIRTIO_NET_F_HOST_UFO);

/// Length of the configuration space we expose: `mac` then `status`
/// (virtio 1.1 §5.1.4).
const CONFIG_SPACE_LEN: usize = 8;

/// Errors creating a network device.
#[derive(Debug, thiserror::Error)]
pub enum NetError {
    /// The TAP could not be opened.
    #[error("cannot open the TAP backend")]
    Tap(#[from] TapError),
    /// The configured queue size is not a power of two in 1..=32768.
    #[error("queue size {0} is not a power of two between 1 and 32768")]
    QueueSize(u16),
    /// An eventfd could not be created.
    #[error("cannot create an eventfd")]
    EventFd(#[source] std::io::Error),
}

/// State that exists only between activation and reset.
pub(crate) struct Active {
    pub(crate) rx: RxVirtio,
    pub(crate) tx: TxVirtio,
    pub(crate) interrupt: Arc<dyn Interrupt>,
    /// The event handler has seen this activation (registered the fds and
    /// run the first passes).
    pub(crate) started: bool,
    /// An RX pass hit its weight: reading waits for the RX re-queue event.
    pub(crate) rx_deferred: bool,
}

/// A virtio-net device over a [`NetBackend`] (a TAP by default).
pub struct Net<B: NetBackend = Tap> {
    pub(crate) cfg: NetConfig,
    pub(crate) mem: GuestMemory,
    pub(crate) backend: B,
    avail_features: u64,
    pub(crate) acked_features: u64,
    config_space: [u8; CONFIG_SPACE_LEN],
    queue_sizes: [u16; NUM_QUEUES],
    pub(crate) queue_evts: [EventFd; NUM_QUEUES],
    pub(crate) activate_evt: EventFd,
    pub(crate) rx_requeue_evt: EventFd,
    pub(crate) tx_requeue_evt: EventFd,
    pub(crate) metrics: Arc<NetMetrics>,
    pub(crate) active: Option<Active>,
    /// What the event handler currently has registered.
    pub(crate) registered: super::event_handler::Registered,
}

impl std::fmt::Debug for Net<Tap> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Net")
            .field("tap", &self.backend.if_name())
            .field("cfg", &self.cfg)
            .field("active", &self.active.is_some())
            .finish()
    }
}

impl Net<Tap> {
    /// Opens (or creates) the TAP `tap_name` now, so a bad name fails before
    /// the guest boots, and builds the device.
    pub fn new(tap_name: &str, cfg: NetConfig, mem: GuestMemory) -> Result<Self, NetError> {
        let tap = Tap::open_named(tap_name)?;
        Self::with_backend(tap, cfg, mem)
    }
}

impl<B: NetBackend> Net<B> {
    /// Builds the device over any backend; puts the backend's fd in
    /// non-blocking mode (the event loop must never block on it).
    pub fn with_backend(backend: B, cfg: NetConfig, mem: GuestMemory) -> Result<Self, NetError> {
        let qs = cfg.queue_size;
        if qs == 0 || qs > 32768 || !qs.is_power_of_two() {
            return Err(NetError::QueueSize(qs));
        }
        tap::set_nonblocking(backend.as_raw_fd(), true)?;
        let evt = || EventFd::new(libc::EFD_NONBLOCK).map_err(NetError::EventFd);

        let mut avail_features = bit(VIRTIO_F_VERSION_1)
            | bit(VIRTIO_NET_F_MAC)
            | bit(VIRTIO_NET_F_STATUS)
            | bit(VIRTIO_RING_F_EVENT_IDX);
        if cfg.mrg_rxbuf {
            avail_features |= bit(VIRTIO_NET_F_MRG_RXBUF);
        }
        if cfg.offloads {
            avail_features |= OFFLOAD_FEATURES;
        }
        let mut config_space = [0u8; CONFIG_SPACE_LEN];
        config_space[..6].copy_from_slice(&cfg.mac);
        config_space[6..8].copy_from_slice(&VIRTIO_NET_S_LINK_UP.to_le_bytes());

        Ok(Net {
            queue_sizes: [qs; NUM_QUEUES],
            cfg,
            mem,
            backend,
            avail_features,
            acked_features: 0,
            config_space,
            queue_evts: [evt()?, evt()?],
            activate_evt: evt()?,
            rx_requeue_evt: evt()?,
            tx_requeue_evt: evt()?,
            metrics: Arc::new(NetMetrics::default()),
            active: None,
            registered: Default::default(),
        })
    }

    /// The device's counters, shared with the caller.
    pub fn metrics(&self) -> Arc<NetMetrics> {
        self.metrics.clone()
    }

    /// The backend (for tests and benchmarks that talk to its peer).
    pub fn backend(&self) -> &B {
        &self.backend
    }

    /// Whether the device is activated (between DRIVER_OK and reset).
    pub fn is_activated(&self) -> bool {
        self.active.is_some()
    }

    fn has(&self, f: u32) -> bool {
        self.acked_features & bit(f) != 0
    }

    /// TUN_F_* flags matching what the guest accepts on receive. TUN refuses
    /// segmentation offloads without checksum offload, and so does the
    /// virtio spec (GUEST_TSO4 requires GUEST_CSUM, §5.1.3.1).
    fn tun_offload_flags(&self) -> u32 {
        if !self.has(VIRTIO_NET_F_GUEST_CSUM) {
            return 0;
        }
        let mut flags = libc::TUN_F_CSUM;
        if self.has(VIRTIO_NET_F_GUEST_TSO4) {
            flags |= libc::TUN_F_TSO4;
        }
        if self.has(VIRTIO_NET_F_GUEST_TSO6) {
            flags |= libc::TUN_F_TSO6;
        }
        if self.has(VIRTIO_NET_F_GUEST_UFO) {
            flags |= libc::TUN_F_UFO;
        }
        flags
    }

    /// Largest frame the backend may deliver under the negotiated
    /// offloads, vnet header included: 12 + 1514 unless the backend may
    /// hand us GSO frames.
    fn max_rx_frame(&self) -> usize {
        let gso = self.tun_offload_flags() & (libc::TUN_F_TSO4 | libc::TUN_F_TSO6 | libc::TUN_F_UFO)
            != 0;
        VNET_HDR_LEN + if gso { MAX_FRAME_GSO } else { MAX_FRAME_NO_GSO }
    }

    fn kick_event_handler(&self) {
        if let Err(e) = self.activate_evt.write(1) {
            NetMetrics::inc(&self.metrics.host_errors);
            log::error!("virtio-net: cannot signal the event loop: {e}");
        }
    }
}

impl<B: NetBackend + 'static> VirtioDevice for Net<B> {
    fn device_type(&self) -> u32 {
        1
    }

    fn avail_features(&self) -> u64 {
        self.avail_features
    }

    fn queue_max_sizes(&self) -> &[u16] {
        &self.queue_sizes
    }

    fn read_config(&self, offset: u64, data: &mut [u8]) {
        // Reads past the end return zeros, as for an absent field.
        data.fill(0);
        let Ok(start) = usize::try_from(offset) else {
            return;
        };
        if start < CONFIG_SPACE_LEN {
            let n = data.len().min(CONFIG_SPACE_LEN - start);
            data[..n].copy_from_slice(&self.config_space[start..start + n]);
        }
    }

    fn write_config(&mut self, offset: u64, data: &[u8]) {
        // Every field we expose is read-only for a VERSION_1 driver (the
        // MAC is writable only with the legacy interface or CTRL_MAC_ADDR).
        log::debug!(
            "virtio-net: ignored {}-byte config write at {offset:#x}",
            data.len()
        );
    }

    fn queue_events(&self) -> &[EventFd] {
        &self.queue_evts
    }

    fn activate(
        &mut self,
        acked_features: u64,
        queues: Vec<Queue>,
        interrupt: Arc<dyn Interrupt>,
    ) -> Result<(), ActivateError> {
        if queues.len() != NUM_QUEUES {
            return Err(ActivateError::QueueCount {
                expected: NUM_QUEUES,
                got: queues.len(),
            });
        }
        self.acked_features = acked_features & self.avail_features;
        // Always set the offloads, also to none: a reused TAP keeps those of
        // its last user, and GSO frames into a guest that cannot take them
        // would be dropped.
        self.backend
            .set_offload(self.tun_offload_flags())
            .map_err(|e| ActivateError::Backend(e.to_string()))?;

        let event_idx = self.has(VIRTIO_RING_F_EVENT_IDX);
        let mut queues = queues;
        // Remove the higher index first so the lower one does not move.
        let mut txq = queues.swap_remove(TX_INDEX);
        let mut rxq = queues.swap_remove(RX_INDEX);
        rxq.set_event_idx(event_idx);
        txq.set_event_idx(event_idx);
        let c = &self.cfg;
        let rx = RxVirtio::new(
            rxq,
            self.has(VIRTIO_NET_F_MRG_RXBUF),
            self.max_rx_frame(),
            c.rx_weight_bytes,
            c.rx_weight_packets,
            c.bounce_buffer,
        );
        let tx = TxVirtio::new(txq, c.tx_weight_bytes, c.tx_weight_packets, c.bounce_buffer);
        if let Some(old) = self.active.take() {
            // An activation without a reset in between: account for the old
            // starvation before dropping it.
            let mut rx = old.rx;
            rx.end_starvation(&self.metrics);
        }
        self.active = Some(Active {
            rx,
            tx,
            interrupt,
            started: false,
            rx_deferred: false,
        });
        self.metrics
            .features_negotiated
            .store(self.acked_features, Ordering::Relaxed);
        self.kick_event_handler();
        Ok(())
    }

    fn reset(&mut self) {
        if let Some(mut old) = self.active.take() {
            old.rx.end_starvation(&self.metrics);
        }
        self.acked_features = 0;
        // Kicks that were pending belong to the old queues.
        for evt in self.queue_evts.iter().chain([&self.rx_requeue_evt, &self.tx_requeue_evt]) {
            let _ = evt.read();
        }
        self.kick_event_handler();
    }
}
