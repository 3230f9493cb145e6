// SPDX-License-Identifier: Apache-2.0
//! The VM's virtio devices: one registry, filled by one attach step.
//!
//! Every virtio device, whatever its kind, goes through [`Registry::attach`]:
//! it gets the next virtio-MMIO window and the next GSI, its interrupt
//! eventfd becomes an irqfd and each queue's notification eventfd an
//! ioeventfd on the window's QueueNotify register (so that neither needs a
//! vCPU exit), its backend is registered with the event manager, and the
//! registry records it as a [`VirtioSlot`]: its kind and id, its window and
//! GSI, its transport, its counters and, for a device the API may change
//! while it runs, its [`DeviceControl`]. From then on the VMM reaches every
//! device through the registry: the vCPUs' MMIO exits find the window, the
//! metrics writer iterates over the counters, the API looks up a control by
//! kind and id, and the kernel command line announces each window.
//!
//! So a new virtio device costs the VMM one line in the builder: its
//! constructor handed to `attach` (or `attach_controlled`), under its kind.

use std::sync::{Arc, Mutex};

use arch::x86_64::layout;
use devices::virtio::mmio::{MmioTransport, MMIO_WINDOW_SIZE, QUEUE_NOTIFY_OFFSET};
use devices::virtio::{DeviceMetrics, GuestMemory, VirtioDevice};
use event_manager::{MutEventSubscriber, SubscriberOps};
use kvm_ioctls::{IoEventAddress, VmFd};

use crate::config::DeviceKind;
use crate::control::{Controls, DeviceControl};
use crate::metrics::DeviceCounters;

/// The event manager every device's backend work runs on.
pub type Subscriber = Arc<Mutex<dyn MutEventSubscriber + Send>>;
/// The VMM's event manager.
pub type Events = event_manager::EventManager<Subscriber>;

/// Errors attaching a virtio device.
#[derive(Debug, thiserror::Error)]
pub enum AttachError {
    /// The device could not be created (a TAP, an image, a limiter's
    /// timer): its error says what.
    #[error("{what} '{id}'")]
    Create {
        /// The kind of device, in words.
        what: &'static str,
        /// Its id.
        id: String,
        /// Why.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// The MMIO transport could not be created.
    #[error("cannot create the virtio-MMIO transport")]
    Mmio(#[source] devices::virtio::mmio::MmioError),
    /// KVM refused an irqfd.
    #[error("cannot register irqfd for IRQ {0}")]
    Irqfd(u32, #[source] kvm_ioctls::Error),
    /// KVM refused an ioeventfd.
    #[error("cannot register ioeventfd at {0:#x}")]
    Ioeventfd(u64, #[source] kvm_ioctls::Error),
    /// No IRQ lines left for virtio devices.
    #[error("no free IRQ line for another virtio device")]
    NoIrq,
}

/// What attaching a device needs of the VM being built.
pub struct AttachEnv<'a> {
    /// The VM, for irqfds and ioeventfds.
    pub vm: &'a VmFd,
    /// Guest memory, for the transport and the device.
    pub mem: &'a GuestMemory,
    /// The event manager the device's backend joins.
    pub events: &'a mut Events,
}

/// One virtio device of the VM.
pub struct VirtioSlot {
    /// What kind of device it is.
    pub kind: DeviceKind,
    /// Its id: the metrics key, the API's name for it.
    pub id: String,
    /// The base of its MMIO window.
    pub base: u64,
    /// Its interrupt line.
    pub gsi: u32,
    /// The register window the vCPUs' MMIO exits reach.
    pub transport: Mutex<MmioTransport>,
    /// Its counters.
    pub metrics: Arc<dyn DeviceMetrics>,
    /// What the API may change on it while it runs, if anything.
    pub control: Option<Arc<Mutex<dyn DeviceControl>>>,
}

impl std::fmt::Debug for VirtioSlot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VirtioSlot")
            .field("kind", &self.kind)
            .field("id", &self.id)
            .field("base", &self.base)
            .field("gsi", &self.gsi)
            .finish_non_exhaustive()
    }
}

/// A device the registry can hold: a virtio device whose backend runs on
/// the event manager (its counters come through `VirtioDevice`).
pub trait Attachable: VirtioDevice + MutEventSubscriber + Send + 'static {}

impl<T: VirtioDevice + MutEventSubscriber + Send + 'static> Attachable for T {}

/// Locks a device; a poisoned lock means a thread panicked while it held
/// the device, whose state is still the best there is.
pub fn lock<T: ?Sized>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// The VM's virtio devices, in attach order (which is MMIO window order).
#[derive(Debug, Default)]
pub struct Registry {
    slots: Vec<VirtioSlot>,
}

impl Registry {
    /// An empty registry.
    pub fn new() -> Self {
        Self::default()
    }

    /// Attaches the device `made` (the result of its constructor) as
    /// `kind` `id` (see the module doc) and returns it.
    pub fn attach<D, E>(
        &mut self,
        env: &mut AttachEnv<'_>,
        kind: DeviceKind,
        id: &str,
        made: Result<D, E>,
    ) -> Result<Arc<Mutex<D>>, AttachError>
    where
        D: Attachable,
        E: std::error::Error + Send + Sync + 'static,
    {
        let device = made.map_err(|e| AttachError::Create {
            what: kind.name(),
            id: id.to_string(),
            source: Box::new(e),
        })?;
        let metrics = device.device_metrics();
        let device = Arc::new(Mutex::new(device));
        let index = self.slots.len() as u64;
        let gsi = layout::IRQ_BASE + index as u32;
        if gsi > layout::IRQ_MAX {
            return Err(AttachError::NoIrq);
        }
        let base = layout::VIRTIO_MMIO_BASE + index * MMIO_WINDOW_SIZE;
        let transport =
            MmioTransport::new(env.mem.clone(), device.clone()).map_err(AttachError::Mmio)?;
        wire(env.vm, &transport, &*lock(&device), base, gsi)?;
        env.events.add_subscriber(device.clone());
        self.slots.push(VirtioSlot {
            kind,
            id: id.to_string(),
            base,
            gsi,
            transport: Mutex::new(transport),
            metrics,
            control: None,
        });
        Ok(device)
    }

    /// Attaches `made` as [`attach`](Self::attach) does, with its
    /// [`DeviceControl`] for the API.
    pub fn attach_controlled<D, E>(
        &mut self,
        env: &mut AttachEnv<'_>,
        kind: DeviceKind,
        id: &str,
        made: Result<D, E>,
    ) -> Result<Arc<Mutex<D>>, AttachError>
    where
        D: Attachable + DeviceControl,
        E: std::error::Error + Send + Sync + 'static,
    {
        let device = self.attach(env, kind, id, made)?;
        let slot = self.slots.last_mut().expect("attach added a slot");
        slot.control = Some(device.clone());
        Ok(device)
    }

    /// Every device, in attach order.
    pub fn slots(&self) -> &[VirtioSlot] {
        &self.slots
    }

    /// The device `kind` `id`.
    pub fn get(&self, kind: DeviceKind, id: &str) -> Option<&VirtioSlot> {
        self.slots.iter().find(|s| s.kind == kind && s.id == id)
    }

    /// The device whose window holds `addr`, and `addr`'s offset in it.
    pub fn at(&self, addr: u64) -> Option<(&VirtioSlot, u64)> {
        let index = addr.checked_sub(layout::VIRTIO_MMIO_BASE)? / MMIO_WINDOW_SIZE;
        let slot = self.slots.get(usize::try_from(index).ok()?)?;
        Some((slot, addr - slot.base))
    }

    /// Every device's counters under its id, for the metrics writer.
    pub fn counters(&self) -> Vec<DeviceCounters> {
        self.slots
            .iter()
            .map(|s| (s.id.clone(), s.metrics.clone()))
            .collect()
    }

    /// The controls of the devices that have one, for the API.
    pub fn controls(&self) -> Controls {
        let mut out = Controls::new();
        for s in &self.slots {
            if let Some(c) = &s.control {
                out.add(s.kind, &s.id, c.clone());
            }
        }
        out
    }

    /// The kernel command-line word of each device, telling the guest
    /// where its window and interrupt are.
    pub fn cmdline_words(&self) -> impl Iterator<Item = String> + '_ {
        self.slots.iter().map(|s| {
            format!(
                "virtio_mmio.device={}K@{:#x}:{}",
                MMIO_WINDOW_SIZE / 1024,
                s.base,
                s.gsi
            )
        })
    }
}

/// Wires a device into KVM: its interrupt eventfd as an irqfd on `gsi`,
/// each queue's eventfd as an ioeventfd on the window's QueueNotify.
fn wire(
    vm: &VmFd,
    transport: &MmioTransport,
    device: &dyn VirtioDevice,
    base: u64,
    gsi: u32,
) -> Result<(), AttachError> {
    vm.register_irqfd(transport.interrupt_evt(), gsi)
        .map_err(|e| AttachError::Irqfd(gsi, e))?;
    let notify = base + QUEUE_NOTIFY_OFFSET;
    for (queue, evt) in device.queue_events().iter().enumerate() {
        // Datamatch on the queue index: the driver writes the index of the
        // queue it kicks (virtio 1.1 §4.2.2, QueueNotify).
        vm.register_ioevent(evt, &IoEventAddress::Mmio(notify), queue as u32)
            .map_err(|e| AttachError::Ioeventfd(notify, e))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::runtime::drive_tests::Scratch;
    use crate::device_manager::DeviceManager;
    use crate::kvm::vcpu::ExitBus;
    use devices::virtio::block::{Block, BlockConfig};
    use devices::virtio::mmio::MMIO_MAGIC_VALUE;
    use devices::virtio::net::{Net, NetConfig, SeqPacket};

    /// A network device on one end of a socket pair (the other end is
    /// dropped: nothing is sent).
    fn net(mem: &GuestMemory) -> Result<Net<SeqPacket>, devices::virtio::net::NetError> {
        let (a, _) = SeqPacket::pair().unwrap();
        Net::with_backend(a, NetConfig::default(), mem.clone())
    }

    /// Runs `test` with what attaching needs on a real KVM VM (after a
    /// SKIP line where this host has no KVM).
    fn with_env(test: impl FnOnce(&mut AttachEnv<'_>, &GuestMemory)) {
        let Some((_kvm, vm, mem)) = crate::builder::test_vm(32) else {
            return;
        };
        let mut events = Events::new().unwrap();
        let mut env = AttachEnv {
            vm: &vm,
            mem: &mem,
            events: &mut events,
        };
        test(&mut env, &mem);
    }

    #[test]
    fn every_device_gets_the_next_window_and_gsi_and_is_found_by_kind_and_id() {
        with_env(windows_gsis_and_lookups);
    }

    fn windows_gsis_and_lookups(env: &mut AttachEnv<'_>, mem: &GuestMemory) {
        let dir = Scratch::new("registry");
        let image = dir.image("data.img", 16);
        let mut dm = DeviceManager::new();
        let virtio = dm.virtio_mut();
        virtio
            .attach_controlled(env, DeviceKind::Net, "eth0", net(mem))
            .unwrap();
        let drive = Block::new(BlockConfig::new("data", &image), mem.clone());
        let block = virtio
            .attach_controlled(env, DeviceKind::Block, "data", drive)
            .unwrap();
        assert_eq!(lock(&block).capacity(), 16);
        let slots = virtio.slots();
        let base = layout::VIRTIO_MMIO_BASE;
        assert_eq!(
            slots
                .iter()
                .map(|s| (s.kind, s.id.as_str(), s.base, s.gsi))
                .collect::<Vec<_>>(),
            [
                (DeviceKind::Net, "eth0", base, layout::IRQ_BASE),
                (
                    DeviceKind::Block,
                    "data",
                    base + MMIO_WINDOW_SIZE,
                    layout::IRQ_BASE + 1
                ),
            ]
        );
        assert_eq!(
            dm.cmdline_words(),
            [
                format!("virtio_mmio.device=4K@{base:#x}:{}", layout::IRQ_BASE),
                format!(
                    "virtio_mmio.device=4K@{:#x}:{}",
                    base + MMIO_WINDOW_SIZE,
                    layout::IRQ_BASE + 1
                ),
            ]
        );
        // The windows answer the vCPUs' MMIO exits; past the last one
        // nothing does.
        let virtio = dm.virtio();
        let (slot, offset) = virtio.at(base + MMIO_WINDOW_SIZE + 8).unwrap();
        assert_eq!((slot.id.as_str(), offset), ("data", 8));
        assert!(virtio.at(base - 1).is_none());
        assert!(virtio.at(base + 2 * MMIO_WINDOW_SIZE).is_none());
        let mut magic = [0u8; 4];
        dm.mmio_read(base + MMIO_WINDOW_SIZE, &mut magic);
        assert_eq!(u32::from_le_bytes(magic), MMIO_MAGIC_VALUE);
        // Counters and controls by id, for the metrics writer and the API.
        let ids: Vec<String> = virtio.counters().into_iter().map(|(id, _)| id).collect();
        assert_eq!(ids, ["eth0", "data"]);
        let controls = virtio.controls();
        assert!(controls.get(DeviceKind::Block, "data").is_some());
        assert!(controls.get(DeviceKind::Net, "eth0").is_some());
        assert!(controls.get(DeviceKind::Net, "data").is_none());
        assert_eq!(
            virtio.get(DeviceKind::Block, "data").map(|s| s.gsi),
            Some(layout::IRQ_BASE + 1)
        );
        assert!(virtio.get(DeviceKind::Block, "eth0").is_none());
    }

    #[test]
    fn a_device_that_cannot_be_made_is_named_and_takes_no_window() {
        with_env(a_refused_device);
    }

    fn a_refused_device(env: &mut AttachEnv<'_>, mem: &GuestMemory) {
        let dir = Scratch::new("registry-refused");
        let image = dir.image("data.img", 16);
        let mut virtio = Registry::new();
        let cfg = BlockConfig::new("data", &image);
        virtio
            .attach_controlled(
                env,
                DeviceKind::Block,
                "data",
                Block::new(cfg.clone(), mem.clone()),
            )
            .unwrap();
        // The image is this VM's now: a second drive on it is refused.
        let again = Block::new(cfg, mem.clone());
        let err = virtio
            .attach_controlled(env, DeviceKind::Block, "again", again)
            .unwrap_err();
        let line = crate::error_line(&err);
        assert!(line.starts_with("drive 'again': "), "{line}");
        assert!(line.contains("locked"), "{line}");
        assert_eq!(virtio.slots().len(), 1);
    }

    #[test]
    fn the_irq_lines_bound_the_devices() {
        with_env(irq_lines_bound);
    }

    fn irq_lines_bound(env: &mut AttachEnv<'_>, mem: &GuestMemory) {
        let mut virtio = Registry::new();
        let lines = (layout::IRQ_MAX - layout::IRQ_BASE + 1) as usize;
        for i in 0..lines {
            let id = format!("net{i}");
            virtio.attach(env, DeviceKind::Net, &id, net(mem)).unwrap();
        }
        assert_eq!(virtio.slots().last().map(|s| s.gsi), Some(layout::IRQ_MAX));
        let err = virtio.attach(env, DeviceKind::Net, "one-more", net(mem));
        assert!(matches!(err, Err(AttachError::NoIrq)));
        assert_eq!(virtio.slots().len(), lines);
        // A device attached without a control has none to offer.
        assert!(virtio.controls().get(DeviceKind::Net, "net0").is_none());
    }
}
