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

use event_manager::EventSet;
use vmm_sys_util::eventfd::EventFd;

use super::metrics::NetMetrics;
use super::rx::RxVirtio;
use super::tap::{self, NetBackend, Tap, TapError};
use super::tx::TxVirtio;
use super::{
    IoEngine, NetConfig, NetConfigError, Offloads, MAX_FRAME_GSO, MAX_FRAME_NO_GSO, NUM_QUEUES,
    RX_INDEX, TX_INDEX, VNET_HDR_LEN,
};
use crate::mmds::MmdsStack;
use serde::{Deserialize, Serialize};

use crate::rate_limiter::persist::{
    restore_limiter, save_limiter, BucketStateError, RateLimiterState,
};
use crate::rate_limiter::{Limiter, RateLimiter, RateLimiterConfig, RateLimiterError};
use crate::virtio::events::{self, Activation};
use crate::virtio::io_engine::WriteRing;
use crate::virtio::metrics::Counters;
use crate::virtio::persist::{self, PersistError};
use crate::virtio::queue::SplitQueue;
use crate::virtio::{
    check_queues, read_config_space, ActivateError, DeviceMetrics, GuestMemory, Interrupt,
    VirtioCommon, VirtioDevice,
};

/// virtio device ID of a network card (virtio 1.1 §5.1.1).
pub const NET_DEVICE_ID: u32 = virtio_bindings::virtio_ids::VIRTIO_ID_NET;

/// Feature bits (virtio 1.1 §5.1.3, §6), from `virtio-bindings`.
pub mod features {
    pub use virtio_bindings::virtio_config::VIRTIO_F_VERSION_1;
    pub use virtio_bindings::virtio_net::{
        VIRTIO_NET_F_CSUM, VIRTIO_NET_F_GUEST_CSUM, VIRTIO_NET_F_GUEST_TSO4,
        VIRTIO_NET_F_GUEST_TSO6, VIRTIO_NET_F_GUEST_UFO, VIRTIO_NET_F_HOST_TSO4,
        VIRTIO_NET_F_HOST_TSO6, VIRTIO_NET_F_HOST_UFO, VIRTIO_NET_F_MAC, VIRTIO_NET_F_MRG_RXBUF,
        VIRTIO_NET_F_MTU, VIRTIO_NET_F_STATUS,
    };
    pub use virtio_bindings::virtio_ring::{VIRTIO_RING_F_EVENT_IDX, VIRTIO_RING_F_INDIRECT_DESC};
    /// Status field bit: the link is up (virtio 1.1 §5.1.4).
    pub const VIRTIO_NET_S_LINK_UP: u16 = virtio_bindings::virtio_net::VIRTIO_NET_S_LINK_UP as u16;
}
use features::*;

const fn bit(b: u32) -> u64 {
    1u64 << b
}

/// The feature bits an [`Offloads`] selection offers.
pub const fn offload_features(o: Offloads) -> u64 {
    let mut f = 0;
    if o.csum {
        f |= bit(VIRTIO_NET_F_CSUM) | bit(VIRTIO_NET_F_GUEST_CSUM);
    }
    if o.tso4 {
        f |= bit(VIRTIO_NET_F_HOST_TSO4) | bit(VIRTIO_NET_F_GUEST_TSO4);
    }
    if o.tso6 {
        f |= bit(VIRTIO_NET_F_HOST_TSO6) | bit(VIRTIO_NET_F_GUEST_TSO6);
    }
    if o.ufo {
        f |= bit(VIRTIO_NET_F_HOST_UFO) | bit(VIRTIO_NET_F_GUEST_UFO);
    }
    f
}

/// Every offload feature the device can offer.
pub const OFFLOAD_FEATURES: u64 = offload_features(Offloads::ALL);

/// Length of the configuration space we expose: `mac`, `status`,
/// `max_virtqueue_pairs` and `mtu` (virtio 1.1 §5.1.4).
pub(crate) const CONFIG_SPACE_LEN: usize = 12;
/// Offset of `max_virtqueue_pairs` in the configuration space.
const CONFIG_MAX_PAIRS_OFFSET: usize = 8;
/// Offset of `mtu` in the configuration space.
const CONFIG_MTU_OFFSET: usize = 10;
/// The MTU range VIRTIO_NET_F_MTU allows: IPv4's minimum to the largest
/// IP packet (the range Firecracker accepts too).
pub const MTU_RANGE: std::ops::RangeInclusive<u16> = 68..=65535;

/// Errors creating a network device.
#[derive(Debug, thiserror::Error)]
pub enum NetError {
    /// The TAP could not be opened.
    #[error("cannot open the TAP backend")]
    Tap(#[from] TapError),
    /// The configuration has a setting out of bounds
    /// ([`NetConfig::validate`]).
    #[error("invalid network device configuration")]
    Config(#[from] NetConfigError),
    /// An eventfd could not be created.
    #[error("cannot create an eventfd")]
    EventFd(#[source] std::io::Error),
    /// A rate limiter is misconfigured or its timer could not be created.
    #[error("{0} rate limiter")]
    RateLimiter(&'static str, #[source] RateLimiterError),
}

/// State that exists only between activation and reset.
pub(crate) struct Active {
    pub(crate) rx: RxVirtio,
    pub(crate) tx: TxVirtio,
    pub(crate) activation: Activation,
    /// An RX pass hit its weight: reading waits for the RX re-queue event.
    pub(crate) rx_deferred: bool,
}

/// What the event handler currently has in the epoll set: state of the
/// device that only [`event_handler`](super::event_handler) changes, kept
/// here so that the handler depends on the device and not the other way.
#[derive(Debug, Default)]
pub(crate) struct Registered {
    /// Queue and re-queue eventfds.
    pub(crate) queues: bool,
    /// Interest registered for the backend fd, if any.
    pub(crate) backend: Option<EventSet>,
    /// The backend hung up (a socket peer closed); it is not polled again
    /// until a device reset.
    pub(crate) backend_hup: bool,
    /// The RX limiter's timerfd.
    pub(crate) rx_timer: bool,
    /// The TX limiter's timerfd.
    pub(crate) tx_timer: bool,
    /// The TX re-queue eventfd holds a count: a TX pass yielded and the
    /// passes after it keep yielding. Epoll is level-triggered, so the
    /// eventfd is left readable until a pass ends otherwise, instead of
    /// being written and read again for every pass (two system calls of
    /// about four per yielded pass).
    pub(crate) tx_requeued: bool,
    /// The same for the RX re-queue eventfd. While RX passes keep
    /// yielding the backend is not polled for input (`Active::rx_deferred`),
    /// so each epoll round runs one RX pass, from this eventfd.
    pub(crate) rx_requeued: bool,
}

/// A virtio-net device over a [`NetBackend`] (a TAP by default).
pub struct Net<B: NetBackend = Tap> {
    pub(crate) cfg: NetConfig,
    pub(crate) mem: GuestMemory,
    pub(crate) backend: B,
    /// ID, features, queue sizes and notification eventfds.
    pub(crate) common: VirtioCommon,
    config_space: [u8; CONFIG_SPACE_LEN],
    pub(crate) activate_evt: EventFd,
    pub(crate) rx_requeue_evt: EventFd,
    pub(crate) tx_requeue_evt: EventFd,
    pub(crate) metrics: Arc<NetMetrics>,
    /// Limits on frames to the guest; `None` without any bucket. Its
    /// buckets and timer outlive activations: a reset does not refill them.
    pub(crate) rx_limiter: Option<RateLimiter>,
    /// Limits on frames from the guest; `None` without any bucket.
    pub(crate) tx_limiter: Option<RateLimiter>,
    pub(crate) active: Option<Active>,
    /// Batches TX writes (`IoEngine::Async`); `None` writes frame by frame.
    /// Built with the device, before any seccomp filter, and kept across
    /// resets.
    pub(crate) tx_ring: Option<WriteRing>,
    /// What the event handler currently has registered.
    pub(crate) registered: Registered,
    /// MMDS on this card, if it serves it.
    pub(crate) mmds: Option<MmdsStack>,
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
        cfg.validate()?;
        let qs = cfg.queue_size;
        tap::set_nonblocking(backend.as_raw_fd(), true)?;
        let evt = || EventFd::new(libc::EFD_NONBLOCK).map_err(NetError::EventFd);

        let mut avail_features = bit(VIRTIO_F_VERSION_1)
            | bit(VIRTIO_NET_F_MAC)
            | bit(VIRTIO_NET_F_STATUS)
            | bit(VIRTIO_RING_F_EVENT_IDX)
            | bit(VIRTIO_RING_F_INDIRECT_DESC);
        if cfg.mrg_rxbuf {
            avail_features |= bit(VIRTIO_NET_F_MRG_RXBUF);
        }
        avail_features |= offload_features(cfg.offloads);
        let mut config_space = [0u8; CONFIG_SPACE_LEN];
        config_space[..6].copy_from_slice(&cfg.mac);
        config_space[6..8].copy_from_slice(&VIRTIO_NET_S_LINK_UP.to_le_bytes());
        config_space[CONFIG_MAX_PAIRS_OFFSET..CONFIG_MAX_PAIRS_OFFSET + 2]
            .copy_from_slice(&1u16.to_le_bytes());
        if let Some(mtu) = cfg.mtu {
            avail_features |= bit(VIRTIO_NET_F_MTU);
            config_space[CONFIG_MTU_OFFSET..CONFIG_MTU_OFFSET + 2]
                .copy_from_slice(&mtu.to_le_bytes());
        }

        // No bucket, no limiter: the unlimited datapath pays one branch per
        // frame and owns no timerfd.
        let limiter = |dir, c: &RateLimiterConfig| {
            (!c.is_unlimited())
                .then(|| RateLimiter::new(c).map_err(|e| NetError::RateLimiter(dir, e)))
                .transpose()
        };
        let rx_limiter = limiter("RX", &cfg.rx_rate_limiter)?;
        let tx_limiter = limiter("TX", &cfg.tx_rate_limiter)?;
        let batch = cfg.io_engine == IoEngine::Async && !cfg.bounce_buffer;
        let tx_ring = if batch && backend.batched_writes() {
            WriteRing::new(backend.as_raw_fd())
                .map_err(|e| {
                    log::info!(
                        "virtio-net: io_uring unavailable ({e}); TX writes one frame per system call"
                    )
                })
                .ok()
        } else {
            None
        };

        let common = VirtioCommon::new(NET_DEVICE_ID, avail_features, vec![qs; NUM_QUEUES])
            .map_err(NetError::EventFd)?;
        Ok(Net {
            cfg,
            mem,
            backend,
            common,
            config_space,
            activate_evt: evt()?,
            rx_requeue_evt: evt()?,
            tx_requeue_evt: evt()?,
            metrics: Arc::new(NetMetrics::default()),
            rx_limiter,
            tx_limiter,
            tx_ring,
            active: None,
            registered: Default::default(),
            mmds: None,
        })
    }

    /// Makes this card serve MMDS (or stop, with `None`): frames to the
    /// stack's address are answered by it and never reach the backend.
    pub fn set_mmds(&mut self, stack: Option<MmdsStack>) {
        self.mmds = stack;
    }

    /// MMDS on this card, if it serves it.
    pub fn mmds(&self) -> Option<&MmdsStack> {
        self.mmds.as_ref()
    }

    /// The device's counters, shared with the caller.
    pub fn metrics(&self) -> Arc<NetMetrics> {
        self.metrics.clone()
    }

    /// Replaces the RX and/or TX rate limits while the device runs
    /// (`PATCH /network-interfaces/{id}`); `None` leaves a direction as it
    /// is. A limiter keeps its timer and any frame it holds back, which is
    /// tried first against the new buckets. A direction that had no limiter
    /// gets one (its timer created here, by the event loop's thread); one
    /// that is made unlimited keeps a limiter without buckets, which lets
    /// everything through. The stored configuration follows, so a later
    /// reset or a `GET` sees what is in force. On `Err` nothing changed.
    pub fn set_rate_limits(
        &mut self,
        rx: Option<&RateLimiterConfig>,
        tx: Option<&RateLimiterConfig>,
    ) -> Result<(), NetError> {
        for cfg in [rx, tx].into_iter().flatten() {
            cfg.validate()
                .map_err(|e| NetError::RateLimiter("new", e))?;
        }
        let apply = |limiter: &mut Option<RateLimiter>, dir, cfg: &RateLimiterConfig| {
            match limiter {
                Some(l) => l.update(cfg),
                None if cfg.is_unlimited() => Ok(()),
                None => RateLimiter::new(cfg).map(|l| *limiter = Some(l)),
            }
            .map_err(|e| NetError::RateLimiter(dir, e))
        };
        if let Some(cfg) = rx {
            apply(&mut self.rx_limiter, "RX", cfg)?;
            self.cfg.rx_rate_limiter = *cfg;
        }
        if let Some(cfg) = tx {
            apply(&mut self.tx_limiter, "TX", cfg)?;
            self.cfg.tx_rate_limiter = *cfg;
        }
        Ok(())
    }

    /// The RX and TX limits in force (unlimited where none is set).
    pub fn rate_limits(&self) -> (RateLimiterConfig, RateLimiterConfig) {
        (self.cfg.rx_rate_limiter, self.cfg.tx_rate_limiter)
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
        self.common.has_feature(f)
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
    /// offloads, vnet header included: 12 + 1514 (or the configured MTU
    /// plus the Ethernet header, if larger) unless the backend may hand us
    /// GSO frames.
    fn max_rx_frame(&self) -> usize {
        let gso =
            self.tun_offload_flags() & (libc::TUN_F_TSO4 | libc::TUN_F_TSO6 | libc::TUN_F_UFO) != 0;
        let mtu_frame = self.cfg.mtu.map_or(0, |m| usize::from(m) + 14);
        VNET_HDR_LEN
            + if gso {
                MAX_FRAME_GSO
            } else {
                MAX_FRAME_NO_GSO.max(mtu_frame)
            }
    }

    fn kick_event_handler(&self) {
        self.metrics
            .host_errors()
            .kick_event_loop(&self.activate_evt);
    }
}

impl<B: NetBackend + 'static> VirtioDevice for Net<B> {
    fn common(&self) -> &VirtioCommon {
        &self.common
    }

    fn read_config(&self, offset: u64, data: &mut [u8]) {
        read_config_space(&self.config_space, offset, data);
    }

    fn write_config(&mut self, offset: u64, data: &[u8]) {
        // Every field we expose is read-only for a VERSION_1 driver (the
        // MAC is writable only with the legacy interface or CTRL_MAC_ADDR).
        events::ignored_config_write(
            &self.metrics.config_writes_ignored,
            "virtio-net",
            offset,
            data.len(),
        );
    }

    fn activate(
        &mut self,
        acked_features: u64,
        queues: Vec<SplitQueue>,
        interrupt: Arc<dyn Interrupt>,
    ) -> Result<(), ActivateError> {
        check_queues(&queues, NUM_QUEUES, &self.mem)?;
        self.common.ack_features(acked_features);
        // Always set the offloads, also to none: a reused TAP keeps those of
        // its last user, and GSO frames into a guest that cannot take them
        // would be dropped.
        self.backend
            .set_offload(self.tun_offload_flags())
            .map_err(|e| ActivateError::Backend(e.to_string()))?;

        let mut queues = queues;
        // Remove the higher index first so the lower one does not move.
        let txq = queues.swap_remove(TX_INDEX);
        let rxq = queues.swap_remove(RX_INDEX);
        let c = &self.cfg;
        let rx = RxVirtio::new(
            rxq,
            self.has(VIRTIO_NET_F_MRG_RXBUF),
            self.max_rx_frame(),
            c.rx_weight_bytes,
            c.rx_weight_packets,
            c.bounce_buffer,
        )
        .with_time_budget(c.pass_time_budget());
        let tx = TxVirtio::new(txq, c.tx_weight_bytes, c.tx_weight_packets, c.bounce_buffer)
            .with_time_budget(c.pass_time_budget());
        if let Some(old) = self.active.take() {
            // An activation without a reset in between: account for the old
            // starvation before dropping it.
            let mut rx = old.rx;
            rx.end_starvation(&self.metrics);
        }
        self.active = Some(Active {
            rx,
            tx,
            activation: Activation::new(interrupt),
            rx_deferred: false,
        });
        self.metrics
            .features_negotiated
            .store(self.common.acked_features, Ordering::Relaxed);
        self.kick_event_handler();
        Ok(())
    }

    fn reset(&mut self) {
        if let Some(mut old) = self.active.take() {
            old.rx.end_starvation(&self.metrics);
        }
        if let Some(m) = self.mmds.as_mut() {
            m.reset();
        }
        self.common.acked_features = 0;
        // A backend that hung up is polled again: a reset is the driver's
        // way to start over, and a backend that is really gone reports its
        // hangup again (rate-limited).
        self.registered.backend_hup = false;
        self.registered.tx_requeued = false;
        self.registered.rx_requeued = false;
        events::discard_pending(
            self.common
                .queue_evts
                .iter()
                .chain([&self.rx_requeue_evt, &self.tx_requeue_evt]),
        );
        self.kick_event_handler();
    }

    fn device_metrics(&self) -> Arc<dyn DeviceMetrics> {
        self.metrics.clone()
    }

    fn save_state(&self) -> serde_json::Value {
        persist::to_value(&NetState {
            rx_rate_limiter: save_limiter(self.rx_limiter.as_ref()),
            tx_rate_limiter: save_limiter(self.tx_limiter.as_ref()),
        })
    }

    fn restore_state(&mut self, state: &serde_json::Value) -> Result<(), PersistError> {
        let s: NetState = persist::from_value(state)?;
        let err = |dir: &'static str| {
            move |e: BucketStateError| PersistError::Device(format!("{dir}_rate_limiter: {e}"))
        };
        // Checked whole before either limiter changes.
        let (rx_cfg, tx_cfg) = (self.cfg.rx_rate_limiter, self.cfg.tx_rate_limiter);
        Limiter::restore(&rx_cfg, &s.rx_rate_limiter, 0).map_err(err("rx"))?;
        Limiter::restore(&tx_cfg, &s.tx_rate_limiter, 0).map_err(err("tx"))?;
        restore_limiter(&mut self.rx_limiter, &rx_cfg, &s.rx_rate_limiter).map_err(err("rx"))?;
        restore_limiter(&mut self.tx_limiter, &tx_cfg, &s.tx_rate_limiter).map_err(err("tx"))
    }
}

/// What a card keeps in a snapshot besides its transport: its limiters'
/// buckets. (Its MMDS stack is not saved: its TCP connections end with
/// the process, and the guest opens new ones.)
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct NetState {
    rx_rate_limiter: RateLimiterState,
    tx_rate_limiter: RateLimiterState,
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;
    use std::process::Command;
    use std::time::{Duration, Instant};

    use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

    use super::super::tap::{enter_private_netns, SeqPacket};
    use super::super::tests::fixture::*;
    use super::*;
    use minivmm_tests::print_skip;

    fn mem() -> GuestMemory {
        GuestMemoryMmap::from_ranges(&[(GuestAddress(0), MEM_SIZE as usize)]).unwrap()
    }

    fn net(cfg: NetConfig) -> Net<SeqPacket> {
        let (a, _b) = SeqPacket::pair().unwrap();
        Net::with_backend(a, cfg, mem()).unwrap()
    }

    /// Why a device cannot be made with the default configuration changed
    /// by `change` (it must not be).
    fn refusal(change: impl FnOnce(&mut NetConfig)) -> NetError {
        let mut cfg = NetConfig::default();
        change(&mut cfg);
        let (a, _b) = SeqPacket::pair().unwrap();
        Net::with_backend(a, cfg, mem())
            .err()
            .expect("the configuration is refused")
    }

    #[test]
    fn test_features_offered() {
        let n = net(NetConfig::default());
        assert_eq!(n.device_type(), 1);
        assert_eq!(n.queue_max_sizes(), &[256, 256]);
        let f = n.avail_features();
        for b in [
            VIRTIO_F_VERSION_1,
            VIRTIO_NET_F_MAC,
            VIRTIO_NET_F_STATUS,
            VIRTIO_NET_F_MRG_RXBUF,
            VIRTIO_RING_F_EVENT_IDX,
        ] {
            assert_ne!(f & bit(b), 0, "feature {b} missing");
        }
        assert_eq!(f & OFFLOAD_FEATURES, OFFLOAD_FEATURES);

        assert_eq!(f & bit(VIRTIO_NET_F_MTU), 0, "MTU only when configured");

        let n = net(NetConfig {
            offloads: Offloads::NONE,
            mrg_rxbuf: false,
            queue_size: 1024,
            ..NetConfig::default()
        });
        assert_eq!(n.avail_features() & OFFLOAD_FEATURES, 0);
        assert_eq!(n.avail_features() & bit(VIRTIO_NET_F_MRG_RXBUF), 0);
        assert_eq!(n.queue_max_sizes(), &[1024, 1024]);
    }

    #[test]
    fn test_offloads_toggle_one_by_one() {
        let only = |o: Offloads| {
            net(NetConfig {
                offloads: o,
                ..NetConfig::default()
            })
            .avail_features()
                & OFFLOAD_FEATURES
        };
        let csum = bit(VIRTIO_NET_F_CSUM) | bit(VIRTIO_NET_F_GUEST_CSUM);
        let c = Offloads {
            csum: true,
            ..Offloads::NONE
        };
        assert_eq!(only(c), csum);
        assert_eq!(
            only(Offloads { tso4: true, ..c }),
            csum | bit(VIRTIO_NET_F_HOST_TSO4) | bit(VIRTIO_NET_F_GUEST_TSO4)
        );
        assert_eq!(
            only(Offloads { tso6: true, ..c }),
            csum | bit(VIRTIO_NET_F_HOST_TSO6) | bit(VIRTIO_NET_F_GUEST_TSO6)
        );
        assert_eq!(
            only(Offloads { ufo: true, ..c }),
            csum | bit(VIRTIO_NET_F_HOST_UFO) | bit(VIRTIO_NET_F_GUEST_UFO)
        );
        // TSO without checksum offload is refused.
        let tso4_only = Offloads {
            tso4: true,
            ..Offloads::NONE
        };
        assert!(matches!(
            refusal(|c| c.offloads = tso4_only),
            NetError::Config(NetConfigError::Offloads(_))
        ));
    }

    #[test]
    fn test_mtu_is_offered_in_features_and_config_space() {
        let mut n = net(NetConfig {
            mtu: Some(9000),
            ..NetConfig::default()
        });
        assert_ne!(n.avail_features() & bit(VIRTIO_NET_F_MTU), 0);
        let mut b = [0u8; 2];
        n.read_config(CONFIG_MTU_OFFSET as u64, &mut b);
        assert_eq!(u16::from_le_bytes(b), 9000);
        // Without GSO the device takes jumbo frames up to MTU + 14.
        n.common.acked_features = bit(VIRTIO_F_VERSION_1) | bit(VIRTIO_NET_F_MTU);
        assert_eq!(n.max_rx_frame(), 12 + 9014);
        n.write_config(CONFIG_MTU_OFFSET as u64, &[0, 0]);
        n.read_config(CONFIG_MTU_OFFSET as u64, &mut b);
        assert_eq!(u16::from_le_bytes(b), 9000, "read-only");
        for bad in [0, 67] {
            assert!(matches!(
                refusal(|c| c.mtu = Some(bad)),
                NetError::Config(NetConfigError::Mtu(m)) if m == bad
            ));
        }
    }

    #[test]
    fn test_config_validate_owns_the_bounds() {
        let with_qs = |queue_size| NetConfig {
            queue_size,
            ..NetConfig::default()
        };
        assert_eq!(NetConfig::default().validate(), Ok(()));
        for qs in [1, 2, 256, 32768] {
            assert_eq!(with_qs(qs).validate(), Ok(()), "{qs}");
        }
        for qs in [0, 3, 100, 65535] {
            assert_eq!(with_qs(qs).validate(), Err(NetConfigError::QueueSize(qs)));
        }
        assert_eq!(
            NetConfigError::QueueSize(3).to_string(),
            "queue size 3 is not a power of two between 1 and 32768"
        );
        let mtu = NetConfig {
            mtu: Some(67),
            ..NetConfig::default()
        };
        assert_eq!(mtu.validate(), Err(NetConfigError::Mtu(67)));
        let offloads = NetConfig {
            offloads: Offloads {
                csum: false,
                ..Offloads::ALL
            },
            ..NetConfig::default()
        };
        assert!(matches!(
            offloads.validate(),
            Err(NetConfigError::Offloads(_))
        ));
        assert_eq!(NetConfig::default().mac, super::super::DEFAULT_MAC);
    }

    #[test]
    fn test_bad_queue_size() {
        for qs in [0, 3, 100, 65535] {
            assert!(matches!(
                refusal(|c| c.queue_size = qs),
                NetError::Config(NetConfigError::QueueSize(q)) if q == qs
            ));
        }
    }

    #[test]
    fn test_bad_tap_name_fails_at_creation() {
        let err = Net::new("no/such\0tap", NetConfig::default(), mem()).unwrap_err();
        assert!(matches!(err, NetError::Tap(TapError::InvalidName(_))));
    }

    #[test]
    fn test_config_space() {
        let mut n = net(NetConfig {
            mac: [1, 2, 3, 4, 5, 6],
            ..NetConfig::default()
        });
        let mut buf = [0xffu8; 8];
        n.read_config(0, &mut buf);
        assert_eq!(buf, [1, 2, 3, 4, 5, 6, 1, 0]);
        let mut b2 = [0u8; 2];
        n.read_config(6, &mut b2);
        assert_eq!(u16::from_le_bytes(b2), VIRTIO_NET_S_LINK_UP);
        // status, then max_virtqueue_pairs = 1.
        let mut b4 = [0xffu8; 4];
        n.read_config(6, &mut b4);
        assert_eq!(b4, [1, 0, 1, 0]);
        // Past the end: zeros, no panic.
        let mut b4 = [0xffu8; 4];
        n.read_config(CONFIG_SPACE_LEN as u64 - 1, &mut b4);
        assert_eq!(b4, [0; 4]);
        n.read_config(u64::MAX, &mut b4);
        assert_eq!(b4, [0; 4]);
        // Writes are ignored, and counted.
        n.write_config(0, &[9; 6]);
        n.read_config(0, &mut buf);
        assert_eq!(buf[..6], [1, 2, 3, 4, 5, 6]);
        assert_eq!(
            n.metrics()
                .config_writes_ignored
                .load(std::sync::atomic::Ordering::Relaxed),
            1
        );
    }

    #[test]
    fn test_offload_flags_and_max_frame() {
        let mut n = net(NetConfig::default());
        n.common.acked_features = MRG_FEATURES;
        assert_eq!(n.tun_offload_flags(), 0);
        assert_eq!(n.max_rx_frame(), 12 + 1514);
        n.common.acked_features = MRG_FEATURES | bit(VIRTIO_NET_F_GUEST_CSUM);
        assert_eq!(n.tun_offload_flags(), libc::TUN_F_CSUM);
        assert_eq!(n.max_rx_frame(), 12 + 1514);
        n.common.acked_features = MRG_FEATURES | GUEST_GSO | bit(VIRTIO_NET_F_GUEST_UFO);
        assert_eq!(
            n.tun_offload_flags(),
            libc::TUN_F_CSUM | libc::TUN_F_TSO4 | libc::TUN_F_TSO6 | libc::TUN_F_UFO
        );
        assert_eq!(n.max_rx_frame(), 12 + 65550);
        // TSO without checksum offload is not a valid combination: no GSO.
        n.common.acked_features = MRG_FEATURES | bit(VIRTIO_NET_F_GUEST_TSO4);
        assert_eq!(n.tun_offload_flags(), 0);
    }

    #[test]
    fn test_unoffered_features_are_not_acked() {
        let mut h = NetFixture::new(
            NetConfig {
                offloads: Offloads::NONE,
                ..NetConfig::default()
            },
            MRG_FEATURES | GUEST_GSO,
        );
        assert_eq!(h.metric(|m| &m.features_negotiated), MRG_FEATURES);
        // Without guest GSO, reads start with 1526 bytes posted.
        h.post_rx(&[1526]);
        h.kick_rx();
        h.peer.send(&frame(100, 1)).unwrap();
        h.run_until_idle();
        assert_eq!(h.metric(|m| &m.rx_frames), 1);
    }

    #[test]
    fn test_metrics_json_after_traffic() {
        let mut h = NetFixture::new(NetConfig::default(), MRG_FEATURES);
        h.post_rx(&[1526]);
        h.kick_rx();
        h.peer.send(&frame(12 + 1514, 1)).unwrap();
        h.post_tx(&frame(12 + 100, 2), &[]);
        h.kick_tx();
        h.run_until_idle();
        let json = h.dev().metrics().to_json();
        assert_eq!(json["rx_frames"], 1);
        assert_eq!(json["rx_bytes"], 1514);
        assert_eq!(json["rx_buffers"], 1);
        assert_eq!(json["tx_frames"], 1);
        assert_eq!(json["tx_bytes"], 100);
        assert_eq!(json["features_negotiated"], MRG_FEATURES);
        assert_eq!(json["malformed_chains"], 0);
    }

    // ---- a real TAP, inside a private network namespace ----

    const GUEST_MAC: [u8; 6] = [0x06, 0x00, 0xac, 0x10, 0x00, 0x02];
    const GUEST_IP: [u8; 4] = [10, 77, 0, 2];
    const HOST_IP: [u8; 4] = [10, 77, 0, 1];

    fn csum(data: &[u8]) -> u16 {
        let mut sum = 0u32;
        for c in data.chunks(2) {
            sum += u32::from(u16::from_be_bytes([c[0], *c.get(1).unwrap_or(&0)]));
        }
        while sum > 0xffff {
            sum = (sum & 0xffff) + (sum >> 16);
        }
        !(sum as u16)
    }

    fn arp_request() -> Vec<u8> {
        let mut f = vec![0u8; 12];
        f.extend([0xff; 6]);
        f.extend(GUEST_MAC);
        f.extend([0x08, 0x06, 0, 1, 0x08, 0, 6, 4, 0, 1]);
        f.extend(GUEST_MAC);
        f.extend(GUEST_IP);
        f.extend([0; 6]);
        f.extend(HOST_IP);
        f
    }

    fn icmp_echo(dst_mac: &[u8], payload: usize) -> Vec<u8> {
        let mut f = vec![0u8; 12];
        f.extend(dst_mac);
        f.extend(GUEST_MAC);
        f.extend([0x08, 0x00]);
        let total = (20 + 8 + payload) as u16;
        let mut ip = vec![0x45, 0];
        ip.extend(total.to_be_bytes());
        ip.extend([0, 1, 0x40, 0, 64, 1, 0, 0]);
        ip.extend(GUEST_IP);
        ip.extend(HOST_IP);
        let c = csum(&ip);
        ip[10..12].copy_from_slice(&c.to_be_bytes());
        let mut icmp = vec![8, 0, 0, 0, 0x12, 0x34, 0, 1];
        icmp.extend((0..payload).map(|i| i as u8));
        let c = csum(&icmp);
        icmp[2..4].copy_from_slice(&c.to_be_bytes());
        f.extend(ip);
        f.extend(icmp);
        f
    }

    /// A device over a real TAP in a private namespace, driven from the
    /// driver side; the host side is that namespace's kernel stack.
    struct TapRig {
        m: GuestMemory,
        rig: DirectRig<Net<Tap>>,
        rxq: DriverQueue,
        txq: DriverQueue,
        /// Buffer address of each posted RX descriptor.
        bufs: HashMap<u16, u64>,
        /// Used RX entries not yet assembled into frames.
        used: std::collections::VecDeque<(u32, u32)>,
        tx_addr: u64,
    }

    /// One frame as the driver reassembles it from the used ring.
    struct Received {
        num_buffers: u16,
        lens: Vec<u32>,
        hdr: Vec<u8>,
        frame: Vec<u8>,
    }

    /// RX buffers kept posted: more than the 43 a 64 KiB frame needs.
    const RIG_RX_BUFS: usize = 64;

    /// Checksum offload both ways, which TSO either way depends on (virtio
    /// 1.1 §5.1.3.1).
    const CSUM_OFFLOADS: u64 = bit(VIRTIO_NET_F_CSUM) | bit(VIRTIO_NET_F_GUEST_CSUM);

    impl TapRig {
        /// A device on a real TAP, activated with MRG_FEATURES and
        /// `offloads`; None (after printing why) when the test must be
        /// skipped.
        fn new(offloads: u64) -> Option<TapRig> {
            let features = MRG_FEATURES | offloads;
            if !enter_private_netns() {
                return None;
            }
            let tap = Tap::open_named("mvnet%d").unwrap();
            let name = tap.if_name().to_string();
            for args in [
                vec!["link", "set", "dev", &name, "up"],
                vec!["addr", "add", "10.77.0.1/24", "dev", &name],
            ] {
                let st = Command::new("ip").args(&args).status();
                if !st.is_ok_and(|s| s.success()) {
                    print_skip(&format!("`ip {args:?}` failed"));
                    return None;
                }
            }
            let m = mem();
            let net = Net::with_backend(tap, NetConfig::default(), m.clone()).unwrap();
            let mut direct = DirectRig::new(m.clone(), net);
            let rxq = DriverQueue::packed(&m, GuestAddress(0x10000), 256);
            let txq = DriverQueue::packed(&m, GuestAddress(0x80000), 256);
            let rings = [rxq.ring_addrs(), txq.ring_addrs()];
            direct.activate_rings(features, &rings).unwrap();
            let mut rig = TapRig {
                m,
                rig: direct,
                rxq,
                txq,
                bufs: HashMap::new(),
                used: Default::default(),
                tx_addr: 0x200000,
            };
            rig.post_rx(RIG_RX_BUFS);
            Some(rig)
        }

        /// Posts `n` 1526-byte RX buffers and kicks.
        fn post_rx(&mut self, n: usize) {
            for _ in 0..n {
                // One 2 KiB slot per descriptor index, reused with the index.
                let a = 0x100000 + u64::from(self.rxq.next_desc()) * 0x800;
                let head = self
                    .rxq
                    .post_chain(&self.m, &[(a, 1526, VIRTQ_DESC_F_WRITE)])
                    .unwrap();
                self.bufs.insert(head, a);
            }
            self.rig.dev().queue_events()[RX_INDEX].write(1).unwrap();
        }

        fn metrics(&self) -> serde_json::Value {
            self.rig.dev().metrics().to_json()
        }

        /// Sends a frame (vnet header included) from the "guest".
        fn send(&mut self, frame: &[u8]) {
            let m = &self.m;
            m.write_slice(frame, GuestAddress(self.tx_addr)).unwrap();
            self.txq
                .post_chain(m, &[(self.tx_addr, frame.len() as u32, 0)])
                .unwrap();
            self.tx_addr += 0x10000;
            if self.tx_addr > 0x3000000 {
                self.tx_addr = 0x200000;
            }
            self.rig.dev().queue_events()[TX_INDEX].write(1).unwrap();
        }

        /// Runs the device until a received frame satisfies `pick`.
        fn wait_for(&mut self, pick: &dyn Fn(&Received) -> bool) -> Received {
            let deadline = Instant::now() + Duration::from_secs(5);
            while Instant::now() < deadline {
                self.rig.run_once(20);
                let m = self.m.clone();
                self.used.extend(self.rxq.take_used(&m));
                while let Some(&(id, len)) = self.used.front() {
                    let a = self.bufs[&(id as u16)];
                    let mut data = vec![0u8; len as usize];
                    m.read_slice(&mut data, GuestAddress(a)).unwrap();
                    let nb = u16::from_le_bytes([data[10], data[11]]);
                    if self.used.len() < usize::from(nb) {
                        break;
                    }
                    let mut lens = Vec::new();
                    let mut frame = Vec::new();
                    for (i, (id, len)) in self.used.drain(..usize::from(nb)).enumerate() {
                        let a = self.bufs[&(id as u16)];
                        let mut d = vec![0u8; len as usize];
                        m.read_slice(&mut d, GuestAddress(a)).unwrap();
                        frame.extend_from_slice(if i == 0 { &d[12..] } else { &d[..] });
                        lens.push(len);
                    }
                    self.post_rx(usize::from(nb));
                    let r = Received {
                        num_buffers: nb,
                        lens,
                        hdr: data[..12].to_vec(),
                        frame,
                    };
                    if pick(&r) {
                        return r;
                    }
                }
            }
            panic!("no matching frame from the TAP");
        }

        /// ARPs for the host; returns the host's MAC.
        fn arp(&mut self) -> Vec<u8> {
            self.send(&arp_request());
            let r = self.wait_for(&|r| {
                let f = &r.frame;
                f.len() >= 42 && f[12..14] == [0x08, 0x06] && f[20..22] == [0, 2]
            });
            assert_eq!(r.frame[28..32], HOST_IP);
            assert_eq!(r.frame[38..42], GUEST_IP);
            r.frame[22..28].to_vec()
        }
    }

    /// A TCP segment from the guest (10.77.0.2:sport) to the host
    /// (10.77.0.1:dport), vnet header included. With `gso_size` the frame is
    /// a TSO frame for the device to hand over; the checksum is always left
    /// to the offload (NEEDS_CSUM with the pseudo-header sum in place).
    #[allow(clippy::too_many_arguments)]
    fn tcp_frame(
        host_mac: &[u8],
        sport: u16,
        dport: u16,
        seq: u32,
        ack: u32,
        flags: u8,
        options: &[u8],
        payload: &[u8],
        gso_size: u16,
    ) -> Vec<u8> {
        let thl = 20 + options.len();
        let (gso_type, hdr_len) = if gso_size > 0 {
            (1u8, 34 + thl)
        } else {
            (0, 0)
        };
        let mut f = vec![1u8, gso_type];
        f.extend((hdr_len as u16).to_le_bytes());
        f.extend(gso_size.to_le_bytes());
        f.extend(34u16.to_le_bytes());
        f.extend(16u16.to_le_bytes());
        f.extend([0, 0]);
        f.extend(host_mac);
        f.extend(GUEST_MAC);
        f.extend([0x08, 0x00]);
        let tcp_len = thl + payload.len();
        let mut ip = vec![0x45, 0];
        ip.extend(((20 + tcp_len) as u16).to_be_bytes());
        ip.extend([0, 2, 0x40, 0, 64, 6, 0, 0]);
        ip.extend(GUEST_IP);
        ip.extend(HOST_IP);
        let c = csum(&ip);
        ip[10..12].copy_from_slice(&c.to_be_bytes());
        let mut tcp = Vec::new();
        tcp.extend(sport.to_be_bytes());
        tcp.extend(dport.to_be_bytes());
        tcp.extend(seq.to_be_bytes());
        tcp.extend(ack.to_be_bytes());
        tcp.extend([((thl / 4) as u8) << 4, flags]);
        tcp.extend(65535u16.to_be_bytes());
        tcp.extend([0, 0, 0, 0]);
        tcp.extend(options);
        tcp.extend(payload);
        // CHECKSUM_PARTIAL: the field holds the pseudo-header sum, not
        // inverted; whoever completes the offload finishes it.
        let mut pseudo = Vec::new();
        pseudo.extend(GUEST_IP);
        pseudo.extend(HOST_IP);
        pseudo.extend([0, 6]);
        pseudo.extend((tcp_len as u16).to_be_bytes());
        let partial = !csum(&pseudo);
        tcp[16..18].copy_from_slice(&partial.to_be_bytes());
        f.extend(ip);
        f.extend(tcp);
        f
    }

    /// The guest side (this test) ARPs for the host and pings it, up to a
    /// full 1500-byte IP packet; every reply comes back in exactly one
    /// 1526-byte buffer.
    #[test]
    fn test_real_tap_arp_and_mtu_ping() {
        let Some(mut rig) = TapRig::new(0) else {
            return;
        };
        let host_mac = rig.arp();
        for payload in [56usize, 1472] {
            rig.send(&icmp_echo(&host_mac, payload));
            let r = rig.wait_for(&|r| {
                let f = &r.frame;
                f.len() >= 35 && f[12..14] == [0x08, 0x00] && f[23] == 1 && f[34] == 0
            });
            assert_eq!(r.num_buffers, 1);
            assert_eq!(r.frame.len(), 14 + 20 + 8 + payload);
            assert_eq!(r.lens, vec![(12 + 14 + 20 + 8 + payload) as u32]);
            assert_eq!(
                r.frame[42..],
                (0..payload).map(|i| i as u8).collect::<Vec<_>>()[..]
            );
        }
        let json = rig.metrics();
        assert_eq!(json["tx_frames"], 3);
        assert_eq!(json["rx_buffers"], json["rx_frames"]);
        assert_eq!(json["malformed_chains"], 0);
    }

    /// HOST_TSO4 through a real TAP: one 3000-byte TCP segment handed over
    /// with a GSO vnet header and a partial checksum is accepted by the
    /// kernel (a wrong header would be refused with EINVAL), which answers
    /// the closed port with a RST.
    #[test]
    fn test_real_tap_tso_frame_accepted() {
        let Some(mut rig) = TapRig::new(CSUM_OFFLOADS | bit(VIRTIO_NET_F_HOST_TSO4)) else {
            return;
        };
        let host_mac = rig.arp();
        let payload: Vec<u8> = (0..3000).map(|i| (i % 251) as u8).collect();
        let f = tcp_frame(&host_mac, 40000, 9, 1000, 77, 0x18, &[], &payload, 1448);
        assert!(f.len() > 12 + 1514, "the frame is larger than one MTU");
        rig.send(&f);
        let r = rig.wait_for(&|r| {
            let f = &r.frame;
            f.len() >= 54 && f[12..14] == [0x08, 0x00] && f[23] == 6 && f[47] & 0x04 != 0
        });
        assert_eq!(r.frame[34..36], 9u16.to_be_bytes());
        assert_eq!(r.frame[36..38], 40000u16.to_be_bytes());
        let json = rig.metrics();
        assert_eq!(json["tx_dropped"], 0);
        // The ARP request (42 bytes) and the TCP frame.
        assert_eq!(json["tx_bytes"], (42 + 14 + 20 + 20 + 3000) as u64);
    }

    /// GUEST_TSO4 + MRG_RXBUF through a real TAP: the host's TCP stack sends
    /// its first flight to the guest as one GSO frame larger than a buffer,
    /// which the device spreads over several 1526-byte buffers with the
    /// right `num_buffers` (the case Cloud Hypervisor got wrong).
    #[test]
    fn test_real_tap_gso_rx_spans_buffers() {
        let Some(mut rig) = TapRig::new(CSUM_OFFLOADS | bit(VIRTIO_NET_F_GUEST_TSO4)) else {
            return;
        };
        let host_mac = rig.arp();
        const DATA: usize = 60000;
        // The host connects to the "guest" and writes; a thread created
        // from this one shares its network namespace.
        let client = std::thread::spawn(|| {
            use std::io::Write;
            let mut s = std::net::TcpStream::connect_timeout(
                &"10.77.0.2:5001".parse().unwrap(),
                Duration::from_secs(5),
            )
            .unwrap();
            let data: Vec<u8> = (0..DATA).map(|i| (i % 253) as u8).collect();
            s.set_write_timeout(Some(Duration::from_secs(5))).unwrap();
            let _ = s.write_all(&data);
            // Keep the socket open until the test has seen the data.
            std::thread::sleep(Duration::from_millis(500));
        });
        let syn = rig.wait_for(&|r| {
            let f = &r.frame;
            f.len() >= 54 && f[23] == 6 && f[36..38] == 5001u16.to_be_bytes() && f[47] == 0x02
        });
        let f = &syn.frame;
        let sport = u16::from_be_bytes([f[34], f[35]]);
        let their_seq = u32::from_be_bytes([f[38], f[39], f[40], f[41]]);
        // SYN-ACK with MSS 1460, window 65535 (no scaling).
        let mss = [2u8, 4, 0x05, 0xb4];
        rig.send(&tcp_frame(
            &host_mac,
            5001,
            sport,
            5000,
            their_seq.wrapping_add(1),
            0x12,
            &mss,
            &[],
            0,
        ));
        // Collect data segments until one arrives as a GSO frame.
        let big = rig.wait_for(&|r| {
            let f = &r.frame;
            f.len() > 1514 && f[23] == 6 && f[34..36] == sport.to_be_bytes()
        });
        eprintln!(
            "GSO frame of {} bytes in {} buffers",
            big.frame.len(),
            big.num_buffers
        );
        assert!(big.num_buffers >= 2, "num_buffers {}", big.num_buffers);
        assert_eq!(big.lens.len(), usize::from(big.num_buffers));
        assert!(big.lens[..big.lens.len() - 1].iter().all(|&l| l == 1526));
        // virtio_net_hdr: GSO_TCPV4 with the MSS we advertised.
        assert_eq!(big.hdr[1], 1);
        assert_eq!(u16::from_le_bytes([big.hdr[4], big.hdr[5]]), 1460);
        let seq = u32::from_be_bytes([big.frame[38], big.frame[39], big.frame[40], big.frame[41]]);
        let off = seq.wrapping_sub(their_seq.wrapping_add(1)) as usize;
        let thl = usize::from(big.frame[46] >> 4) * 4;
        let data = &big.frame[34 + thl..];
        assert!(data.len() > 1460);
        for (i, b) in data.iter().enumerate() {
            assert_eq!(*b, ((off + i) % 253) as u8, "payload byte {i}");
        }
        let json = rig.metrics();
        assert!(json["rx_buffers"].as_u64() > json["rx_frames"].as_u64());
        assert_eq!(json["rx_dropped"], 0);
        drop(rig);
        let _ = client.join();
    }
}
