// SPDX-License-Identifier: Apache-2.0
//! The [`Vsock`] device: the host listener, features, configuration space,
//! activation, reset and TRANSPORT_RESET.
//!
//! The listener is bound when the device is made (before seccomp), and
//! lives as long as the device: host processes may connect before the
//! guest's driver is up; their `CONNECT` is refused then (the socket
//! closed), as a guest that listens on nothing would refuse it.
//!
//! As for the other devices, activation and reset arrive from a vCPU
//! thread through the MMIO transport and only change state here and write
//! `activate_evt`; the event handler brings the epoll registrations in line.
//! A reset forgets every connection: their host sockets are closed (the
//! driver that starts over has forgotten them too).

use std::os::unix::net::UnixListener;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use virtio_bindings::virtio_ids::VIRTIO_ID_VSOCK;
use vmm_sys_util::eventfd::EventFd;
use vmm_sys_util::timerfd::TimerFd;

use super::backend::{bind_listener, UnixBackend, VsockBackend};
use super::metrics::VsockMetrics;
use super::muxer::{HoldLimits, Muxer};
use super::pass::{VsockVirtio, TX_INDEX};
use super::{Tunables, VsockConfig, MIN_GUEST_CID};
use crate::virtio::events::{self, Activation};
use crate::virtio::metrics::Counters;
use crate::virtio::queue::SplitQueue;
use crate::virtio::{
    check_queues, read_config_space, ActivateError, DeviceMetrics, GuestMemory, Interrupt,
    VirtioCommon, VirtioDevice,
};

/// Feature bits (virtio 1.1 §6), from `virtio-bindings`.
pub mod features {
    pub use virtio_bindings::virtio_config::VIRTIO_F_VERSION_1;
    pub use virtio_bindings::virtio_ring::{VIRTIO_RING_F_EVENT_IDX, VIRTIO_RING_F_INDIRECT_DESC};
}
use features::*;

/// Bytes of `struct virtio_vsock_config { le64 guest_cid; }` (virtio 1.2
/// §5.10.4).
pub const CONFIG_LEN: usize = 8;

/// Why a vsock device could not be made.
#[derive(Debug, thiserror::Error)]
pub enum VsockError {
    /// The guest CID is reserved or out of range.
    #[error("vsock guest_cid {0} is invalid: it must be at least 3 and below 4294967295")]
    Cid(u64),
    /// The socket path exists, or cannot be bound.
    #[error("cannot listen on vsock uds_path {}: {source}", path.display())]
    Bind {
        /// The path.
        path: std::path::PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// An eventfd or the timer could not be made.
    #[error("cannot create the vsock device's event descriptors")]
    Events(#[source] std::io::Error),
    /// A bound is outside what the device can do.
    #[error("vsock: {0}")]
    Tunables(&'static str),
}

/// State that exists only between activation and reset.
pub(crate) struct Active {
    pub(crate) virtio: VsockVirtio,
    pub(crate) activation: Activation,
    /// The last TX, RX or event pass yielded: the re-queue event runs it
    /// again.
    pub(crate) tx_yielded: bool,
    pub(crate) rx_yielded: bool,
    pub(crate) ev_yielded: bool,
    /// A queue broke; nothing runs until a reset.
    pub(crate) broken: bool,
}

/// What the event handler has in the epoll set (only it changes this).
#[derive(Debug, Default)]
pub(crate) struct Registered {
    /// The queue eventfds.
    pub(crate) queues: bool,
    /// The re-queue eventfd.
    pub(crate) requeue: bool,
    /// The re-queue eventfd holds a count.
    pub(crate) requeued: bool,
    /// What the time-out timer is armed for.
    pub(crate) timer: Option<Instant>,
}

/// A virtio-vsock device over Unix sockets (or, in tests, any
/// [`VsockBackend`]).
pub struct Vsock<B: VsockBackend = UnixBackend> {
    pub(crate) cfg: VsockConfig,
    mem: GuestMemory,
    pub(crate) common: VirtioCommon,
    config_space: [u8; CONFIG_LEN],
    pub(crate) activate_evt: EventFd,
    pub(crate) requeue_evt: EventFd,
    /// Fires at the earliest connection deadline.
    pub(crate) timer: TimerFd,
    pub(crate) muxer: Muxer<B>,
    pub(crate) metrics: Arc<VsockMetrics>,
    pub(crate) active: Option<Active>,
    pub(crate) registered: Registered,
}

impl<B: VsockBackend> std::fmt::Debug for Vsock<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Vsock")
            .field("cfg", &self.cfg)
            .field("active", &self.active.is_some())
            .finish_non_exhaustive()
    }
}

impl Vsock<UnixBackend> {
    /// Binds the listener at `uds_path` and builds the device with the
    /// default bounds: everything that must happen before the VMM's seccomp
    /// filters.
    pub fn new(cfg: VsockConfig, mem: GuestMemory) -> Result<Self, VsockError> {
        Self::with_backend(cfg, Tunables::default(), mem, UnixBackend)
    }

    /// Builds the device with the default bounds over `listener`, which
    /// the caller bound at `cfg.uds_path` (the VMM binds it when the
    /// configuration is accepted, before the VM is built, so that a host
    /// agent sees the socket appear as Firecracker's clients expect). It
    /// is made non-blocking here, before seccomp.
    pub fn with_listener(
        cfg: VsockConfig,
        mem: GuestMemory,
        listener: UnixListener,
    ) -> Result<Self, VsockError> {
        let tun = Tunables::default();
        check(&cfg, &tun)?;
        listener
            .set_nonblocking(true)
            .map_err(|source| VsockError::Bind {
                path: cfg.uds_path.clone(),
                source,
            })?;
        Self::assemble(cfg, tun, mem, UnixBackend, listener)
    }
}

/// The checks of a configuration and its bounds.
fn check(cfg: &VsockConfig, tun: &Tunables) -> Result<(), VsockError> {
    if cfg.guest_cid < MIN_GUEST_CID || cfg.guest_cid >= u64::from(u32::MAX) {
        return Err(VsockError::Cid(cfg.guest_cid));
    }
    let qs = tun.queue_size;
    if qs == 0 || !qs.is_power_of_two() || qs > crate::virtio::queue::MAX_QUEUE_SIZE {
        return Err(VsockError::Tunables(
            "queue size must be a power of two up to 32768",
        ));
    }
    if tun.max_connections == 0 || tun.buf_alloc == 0 {
        return Err(VsockError::Tunables(
            "connections and buffer must be above 0",
        ));
    }
    Ok(())
}

impl<B: VsockBackend> Vsock<B> {
    /// Builds the device over `backend` with the bounds `tun`.
    pub fn with_backend(
        cfg: VsockConfig,
        tun: Tunables,
        mem: GuestMemory,
        backend: B,
    ) -> Result<Self, VsockError> {
        check(&cfg, &tun)?;
        let listener = bind_listener(&cfg.uds_path).map_err(|source| VsockError::Bind {
            path: cfg.uds_path.clone(),
            source,
        })?;
        Self::assemble(cfg, tun, mem, backend, listener)
    }

    fn assemble(
        cfg: VsockConfig,
        tun: Tunables,
        mem: GuestMemory,
        backend: B,
        listener: UnixListener,
    ) -> Result<Self, VsockError> {
        let evt = || EventFd::new(libc::EFD_NONBLOCK).map_err(VsockError::Events);
        let f = 1u64 << VIRTIO_F_VERSION_1
            | 1 << VIRTIO_RING_F_EVENT_IDX
            | 1 << VIRTIO_RING_F_INDIRECT_DESC;
        let common = VirtioCommon::new(VIRTIO_ID_VSOCK, f, vec![tun.queue_size; 3])
            .map_err(VsockError::Events)?;
        let metrics = Arc::<VsockMetrics>::default();
        let muxer = Muxer::new(
            backend,
            listener,
            cfg.uds_path.clone(),
            cfg.guest_cid,
            tun,
            metrics.clone(),
        );
        Ok(Vsock {
            config_space: cfg.guest_cid.to_le_bytes(),
            cfg,
            mem,
            common,
            activate_evt: evt()?,
            requeue_evt: evt()?,
            timer: crate::rate_limiter::nonblocking_timer().map_err(VsockError::Events)?,
            muxer,
            metrics,
            active: None,
            registered: Registered::default(),
        })
    }

    /// The counters, shared with the VMM's metrics writer.
    pub fn metrics(&self) -> Arc<VsockMetrics> {
        self.metrics.clone()
    }

    /// The configuration.
    pub fn config(&self) -> &VsockConfig {
        &self.cfg
    }

    /// Whether the device is activated (between DRIVER_OK and reset).
    pub fn is_activated(&self) -> bool {
        self.active.is_some()
    }

    /// The backend (tests reach the fault-injecting one through this).
    pub fn backend_mut(&mut self) -> &mut B {
        &mut self.muxer.backend
    }

    /// Connections open now.
    pub fn connections(&self) -> usize {
        self.muxer.connections()
    }

    /// Guest bytes held for host sockets that have not taken them.
    pub fn pending_bytes(&self) -> usize {
        self.muxer.pending_bytes()
    }

    /// RSTs waiting for RX buffers.
    pub fn queued_rsts(&self) -> usize {
        self.muxer.queued_rsts()
    }

    /// Host sockets waiting to leave the poll set and be closed.
    pub fn sockets_closing(&self) -> usize {
        self.muxer.graveyard.len()
    }

    /// For every open connection: (guest port, host port, bytes the guest
    /// may still send as it was told, bytes sent to the guest it has not
    /// taken, the guest's buffer).
    pub fn credit_view(&self) -> Vec<(u32, u32, u32, u32, u32)> {
        self.muxer
            .slots
            .iter()
            .flatten()
            .map(|c| {
                (
                    c.guest_port,
                    c.host_port,
                    c.guest_credit(),
                    c.tx_cnt.wrapping_sub(c.peer_fwd_cnt),
                    c.peer_buf_alloc,
                )
            })
            .collect()
    }

    /// Tells the guest to forget every connection (a snapshot restored, the
    /// host side gone): the connections are dropped, their host sockets
    /// closed, and VIRTIO_VSOCK_EVENT_TRANSPORT_RESET goes into the next
    /// event buffer the guest posts (virtio 1.2 §5.10.6.4).
    pub fn transport_reset(&mut self) {
        self.muxer.kill_all();
        if let Some(a) = self.active.as_mut() {
            a.virtio.event_pending = true;
        }
        self.kick_event_handler();
    }

    pub(crate) fn kick_event_handler(&self) {
        self.metrics
            .host_errors()
            .kick_event_loop(&self.activate_evt);
    }

    fn deactivate(&mut self) {
        self.active = None;
        self.muxer.kill_all();
        // The rings went with the reset: the chains held are forgotten
        // with them, never written into a used ring the driver set up anew.
        self.muxer.returned.clear();
    }

    /// Puts the held chains the muxer is done with in the TX used ring;
    /// without a working ring (a broken queue waits for a reset) they are
    /// forgotten.
    pub(crate) fn return_held(&mut self) {
        if self.muxer.returned.is_empty() {
            return;
        }
        match self.active.as_mut() {
            Some(a) if !a.broken => a.virtio.return_held(&mut self.muxer, &self.metrics),
            _ => self.muxer.returned.clear(),
        }
    }

    /// TX chains held for host sockets that have not taken their bytes.
    pub fn held_chains(&self) -> usize {
        self.muxer.held_chains()
    }
}

impl<B: VsockBackend + 'static> VirtioDevice for Vsock<B> {
    fn common(&self) -> &VirtioCommon {
        &self.common
    }

    /// A snapshot takes the rings as `used.idx` says: every chain taken
    /// before it returned. The held chains are not, so what they still owe
    /// their host sockets is copied into their connections (which go on
    /// in this process) and they are returned now, with the interrupt.
    fn quiesce(&mut self) -> Result<(), crate::virtio::persist::PersistError> {
        self.muxer.spill_held();
        self.return_held();
        if let Some(a) = self.active.as_mut() {
            a.virtio.raise_owed(&self.metrics, &*a.activation.interrupt);
        }
        Ok(())
    }

    fn restored(&mut self) {
        // The connections the guest had went with the process that saved
        // it: the guest's driver drops them on this event.
        self.transport_reset();
    }

    fn read_config(&self, offset: u64, data: &mut [u8]) {
        read_config_space(&self.config_space, offset, data);
    }

    fn write_config(&mut self, offset: u64, data: &[u8]) {
        // The guest CID is the device's to say.
        events::ignored_config_write(
            &self.metrics.config_writes_ignored,
            "virtio-vsock",
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
        check_queues(&queues, 3, &self.mem)?;
        // An activation without a reset in between starts over too.
        self.deactivate();
        let acked = self.common.ack_features(acked_features);
        let queues: [SplitQueue; 3] = queues
            .try_into()
            .map_err(|_| ActivateError::Backend("three queues expected".into()))?;
        self.muxer.hold = HoldLimits::for_ring(queues[TX_INDEX].size());
        self.active = Some(Active {
            virtio: VsockVirtio::new(queues, self.cfg.guest_cid),
            activation: Activation::new(interrupt),
            tx_yielded: false,
            rx_yielded: false,
            ev_yielded: false,
            broken: false,
        });
        self.metrics
            .features_negotiated
            .store(acked, Ordering::Relaxed);
        self.kick_event_handler();
        Ok(())
    }

    fn device_metrics(&self) -> Arc<dyn DeviceMetrics> {
        self.metrics.clone()
    }

    fn reset(&mut self) {
        self.deactivate();
        self.common.acked_features = 0;
        self.registered.requeued = false;
        events::discard_pending(self.common.queue_evts.iter().chain([&self.requeue_evt]));
        self.kick_event_handler();
    }
}
