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
        let gso =
            self.tun_offload_flags() & (libc::TUN_F_TSO4 | libc::TUN_F_TSO6 | libc::TUN_F_UFO) != 0;
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
        for evt in self
            .queue_evts
            .iter()
            .chain([&self.rx_requeue_evt, &self.tx_requeue_evt])
        {
            let _ = evt.read();
        }
        self.kick_event_handler();
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;
    use std::process::Command;
    use std::time::{Duration, Instant};

    use event_manager::{EventManager, SubscriberOps};
    use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

    use super::super::tap::{enter_private_netns, SeqPacket};
    use super::super::test_driver::*;
    use super::*;

    fn mem() -> GuestMemory {
        GuestMemoryMmap::from_ranges(&[(GuestAddress(0), MEM_SIZE as usize)]).unwrap()
    }

    fn net(cfg: NetConfig) -> Net<SeqPacket> {
        let (a, _b) = SeqPacket::pair().unwrap();
        Net::with_backend(a, cfg, mem()).unwrap()
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

        let n = net(NetConfig {
            offloads: false,
            mrg_rxbuf: false,
            queue_size: 1024,
            ..NetConfig::default()
        });
        assert_eq!(n.avail_features() & OFFLOAD_FEATURES, 0);
        assert_eq!(n.avail_features() & bit(VIRTIO_NET_F_MRG_RXBUF), 0);
        assert_eq!(n.queue_max_sizes(), &[1024, 1024]);
    }

    #[test]
    fn test_bad_queue_size() {
        for qs in [0, 3, 100, 65535] {
            let (a, _b) = SeqPacket::pair().unwrap();
            let cfg = NetConfig {
                queue_size: qs,
                ..NetConfig::default()
            };
            assert!(matches!(
                Net::with_backend(a, cfg, mem()),
                Err(NetError::QueueSize(q)) if q == qs
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
        // Past the end: zeros, no panic.
        let mut b4 = [0xffu8; 4];
        n.read_config(6, &mut b4);
        assert_eq!(b4, [1, 0, 0, 0]);
        n.read_config(u64::MAX, &mut b4);
        assert_eq!(b4, [0; 4]);
        // Writes are ignored.
        n.write_config(0, &[9; 6]);
        n.read_config(0, &mut buf);
        assert_eq!(buf[..6], [1, 2, 3, 4, 5, 6]);
    }

    #[test]
    fn test_activate_wrong_queue_count() {
        let mut n = net(NetConfig::default());
        let m = mem();
        let q = TestQueue::new(&m, GuestAddress(0x10000), 256).create_queue();
        let err = n
            .activate(
                MRG_FEATURES,
                vec![q],
                std::sync::Arc::new(TestIrq::default()),
            )
            .unwrap_err();
        assert!(matches!(
            err,
            ActivateError::QueueCount {
                expected: 2,
                got: 1
            }
        ));
        assert!(!n.is_activated());
    }

    #[test]
    fn test_offload_flags_and_max_frame() {
        let mut n = net(NetConfig::default());
        n.acked_features = MRG_FEATURES;
        assert_eq!(n.tun_offload_flags(), 0);
        assert_eq!(n.max_rx_frame(), 12 + 1514);
        n.acked_features = MRG_FEATURES | bit(VIRTIO_NET_F_GUEST_CSUM);
        assert_eq!(n.tun_offload_flags(), libc::TUN_F_CSUM);
        assert_eq!(n.max_rx_frame(), 12 + 1514);
        n.acked_features = MRG_FEATURES | GUEST_GSO | bit(VIRTIO_NET_F_GUEST_UFO);
        assert_eq!(
            n.tun_offload_flags(),
            libc::TUN_F_CSUM | libc::TUN_F_TSO4 | libc::TUN_F_TSO6 | libc::TUN_F_UFO
        );
        assert_eq!(n.max_rx_frame(), 12 + 65550);
        // TSO without checksum offload is not a valid combination: no GSO.
        n.acked_features = MRG_FEATURES | bit(VIRTIO_NET_F_GUEST_TSO4);
        assert_eq!(n.tun_offload_flags(), 0);
    }

    #[test]
    fn test_unoffered_features_are_not_acked() {
        let mut h = Harness::new(
            NetConfig {
                offloads: false,
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
        let mut h = Harness::new(NetConfig::default(), MRG_FEATURES);
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
        net: Arc<std::sync::Mutex<Net<Tap>>>,
        em: EventManager<Arc<std::sync::Mutex<Net<Tap>>>>,
        rxq: TestQueue,
        txq: TestQueue,
        bufs: HashMap<u16, u64>,
        tx_addr: u64,
    }

    impl TapRig {
        /// None (after printing why) when the test must be skipped.
        fn new(test: &str, features: u64) -> Option<TapRig> {
            if !enter_private_netns(test) {
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
                    eprintln!("SKIP {test}: `ip {args:?}` failed");
                    return None;
                }
            }
            let m = mem();
            let net = Arc::new(std::sync::Mutex::new(
                Net::with_backend(tap, NetConfig::default(), m.clone()).unwrap(),
            ));
            let mut em = EventManager::new().unwrap();
            em.add_subscriber(net.clone());
            let mut rxq = TestQueue::new(&m, GuestAddress(0x10000), 256);
            let txq = TestQueue::new(&m, GuestAddress(0x80000), 256);
            net.lock()
                .unwrap()
                .activate(
                    features,
                    vec![rxq.create_queue(), txq.create_queue()],
                    Arc::new(TestIrq::default()),
                )
                .unwrap();
            let mut bufs = HashMap::new();
            for i in 0..64u64 {
                let a = 0x100000 + i * 0x800;
                bufs.insert(rxq.add_chain(&m, &[(a, 1526, F_WRITE)]), a);
            }
            net.lock().unwrap().queue_events()[RX_INDEX]
                .write(1)
                .unwrap();
            Some(TapRig {
                m,
                net,
                em,
                rxq,
                txq,
                bufs,
                tx_addr: 0x200000,
            })
        }

        fn metrics(&self) -> serde_json::Value {
            self.net.lock().unwrap().metrics().to_json()
        }

        /// Sends a frame (vnet header included) from the "guest" and waits
        /// for an RX frame that `pick` accepts; returns (used length, vnet
        /// header, frame). Every received frame must fit one buffer.
        fn exchange(
            &mut self,
            frame: Vec<u8>,
            pick: &dyn Fn(&[u8]) -> bool,
        ) -> (u32, Vec<u8>, Vec<u8>) {
            let m = &self.m;
            m.write_slice(&frame, GuestAddress(self.tx_addr)).unwrap();
            self.txq
                .add_chain(m, &[(self.tx_addr, frame.len() as u32, 0)]);
            self.tx_addr += 0x10000;
            self.net.lock().unwrap().queue_events()[TX_INDEX]
                .write(1)
                .unwrap();
            let deadline = Instant::now() + Duration::from_secs(5);
            while Instant::now() < deadline {
                self.em.run_with_timeout(50).unwrap();
                for (id, len) in self.rxq.take_used(m) {
                    let a = self.bufs[&(id as u16)];
                    let mut data = vec![0u8; len as usize];
                    m.read_slice(&mut data, GuestAddress(a)).unwrap();
                    let nb = u16::from_le_bytes([data[10], data[11]]);
                    assert_eq!(nb, 1, "every frame fits one 1526-byte buffer");
                    if pick(&data[12..]) {
                        return (len, data[..12].to_vec(), data[12..].to_vec());
                    }
                }
            }
            panic!("no matching reply from the TAP");
        }

        /// ARPs for the host; returns the host's MAC.
        fn arp(&mut self) -> Vec<u8> {
            let (_, _, arp) = self.exchange(arp_request(), &|f| {
                f.len() >= 42 && f[12..14] == [0x08, 0x06] && f[20..22] == [0, 2]
            });
            assert_eq!(arp[28..32], HOST_IP);
            assert_eq!(arp[38..42], GUEST_IP);
            arp[22..28].to_vec()
        }
    }

    /// The guest side (this test) ARPs for the host and pings it, up to a
    /// full 1500-byte IP packet; the echo reply comes back in exactly one
    /// 1526-byte buffer.
    #[test]
    fn test_real_tap_arp_and_mtu_ping() {
        let Some(mut rig) = TapRig::new("test_real_tap_arp_and_mtu_ping", MRG_FEATURES) else {
            return;
        };
        let host_mac = rig.arp();
        for payload in [56usize, 1472] {
            let (len, _, reply) = rig.exchange(icmp_echo(&host_mac, payload), &|f| {
                f.len() >= 34 && f[12..14] == [0x08, 0x00] && f[23] == 1 && f[34] == 0
            });
            assert_eq!(reply.len(), 14 + 20 + 8 + payload);
            assert_eq!(len as usize, 12 + 14 + 20 + 8 + payload);
            assert_eq!(
                reply[42..],
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
        let features = MRG_FEATURES
            | bit(VIRTIO_NET_F_CSUM)
            | bit(VIRTIO_NET_F_HOST_TSO4)
            | bit(VIRTIO_NET_F_GUEST_CSUM);
        let Some(mut rig) = TapRig::new("test_real_tap_tso_frame_accepted", features) else {
            return;
        };
        let host_mac = rig.arp();
        let payload = 3000usize;
        // virtio_net_hdr_v1: NEEDS_CSUM, GSO_TCPV4, hdr_len 54, gso_size
        // 1448, csum_start 34 (the TCP header), csum_offset 16.
        let mut f = vec![1u8, 1];
        f.extend(54u16.to_le_bytes());
        f.extend(1448u16.to_le_bytes());
        f.extend(34u16.to_le_bytes());
        f.extend(16u16.to_le_bytes());
        f.extend([0, 0]);
        f.extend(&host_mac);
        f.extend(GUEST_MAC);
        f.extend([0x08, 0x00]);
        let tcp_len = 20 + payload;
        let mut ip = vec![0x45, 0];
        ip.extend(((20 + tcp_len) as u16).to_be_bytes());
        ip.extend([0, 2, 0x40, 0, 64, 6, 0, 0]);
        ip.extend(GUEST_IP);
        ip.extend(HOST_IP);
        let c = csum(&ip);
        ip[10..12].copy_from_slice(&c.to_be_bytes());
        let mut tcp = Vec::new();
        tcp.extend(40000u16.to_be_bytes());
        tcp.extend(9u16.to_be_bytes());
        tcp.extend(1000u32.to_be_bytes());
        tcp.extend(77u32.to_be_bytes());
        tcp.extend([0x50, 0x18]); // data offset 5, PSH|ACK
        tcp.extend(64240u16.to_be_bytes());
        tcp.extend([0, 0, 0, 0]);
        tcp.extend((0..payload).map(|i| (i % 251) as u8));
        // CHECKSUM_PARTIAL: the field holds the pseudo-header sum, not
        // inverted; the receiver of the offload completes it.
        let mut pseudo = Vec::new();
        pseudo.extend(GUEST_IP);
        pseudo.extend(HOST_IP);
        pseudo.extend([0, 6]);
        pseudo.extend((tcp_len as u16).to_be_bytes());
        let partial = !csum(&pseudo);
        tcp[16..18].copy_from_slice(&partial.to_be_bytes());
        f.extend(ip);
        f.extend(tcp);
        assert!(f.len() > 12 + 1514, "the frame is larger than one MTU");

        let (_, _, rst) = rig.exchange(f, &|r| {
            r.len() >= 54 && r[12..14] == [0x08, 0x00] && r[23] == 6 && r[47] & 0x04 != 0
        });
        assert_eq!(rst[34..36], 9u16.to_be_bytes());
        assert_eq!(rst[36..38], 40000u16.to_be_bytes());
        let json = rig.metrics();
        assert_eq!(json["tx_dropped"], 0);
        // The ARP request (42 bytes) and the TCP frame.
        assert_eq!(json["tx_bytes"], (42 + 14 + 20 + tcp_len) as u64);
    }
}
