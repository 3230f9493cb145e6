// SPDX-License-Identifier: Apache-2.0
//! `PUT /snapshot/create`: a paused VM written to a state file and a
//! memory file.
//!
//! Runs on the event loop, so no device pass runs meanwhile, and only on a
//! paused VM (Firecracker's rule): each vCPU thread, parked, reads its own
//! state (an errand of the pause gate; KVM's vCPU ioctls belong on the
//! vCPU's thread), the event loop reads the VM's, the legacy devices' and
//! every virtio device's (after the device is quiescent: a drive's
//! requests in flight complete first), writes the memory file whole and
//! then the state file. The state file is written last, so a state file
//! never names memory that was not written. The VM stays paused. A Full
//! snapshot writes all of guest memory; a Diff one (a VM started or loaded
//! with `track_dirty_pages`) only the pages written since the last
//! snapshot, the start or the load, as a sparse file (see [`memory`]).

use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use devices::legacy::i8042::I8042;
use devices::legacy::serial::SerialDevice;
use kvm_ioctls::VmFd;
use serde::Deserialize;
use vm_memory::GuestMemoryMmap;

use super::{format, memory, DeviceSnapshot, SnapshotState};
use crate::config::VmmConfig;
use crate::kvm::pause::PauseGate;
use crate::kvm::state::{save_vm, VcpuStateSlots};
use crate::registry::lock;
use crate::registry::VirtioSlot;
use crate::serial_out::SerialLimiter;
use devices::virtio::queue::dirty::{DirtyPages, PAGE_SIZE};

/// How long the vCPU threads have to read their state.
const ERRAND_TIMEOUT: Duration = Duration::from_secs(2);

/// Firecracker's `snapshot_type`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
pub enum SnapshotType {
    /// All of guest memory.
    #[default]
    Full,
    /// Only the pages written since the last snapshot.
    Diff,
}

/// The body of `PUT /snapshot/create` (Firecracker's `SnapshotCreateParams`).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CreateParams {
    /// Full (the default) or Diff.
    #[serde(default)]
    pub snapshot_type: SnapshotType,
    /// Where the state goes.
    pub snapshot_path: PathBuf,
    /// Where guest memory goes.
    pub mem_file_path: PathBuf,
}

/// Where the snapshot finds the VM's virtio devices (the device manager's
/// registry), in MMIO window order.
pub trait VirtioSlots: Send + Sync {
    /// Every virtio device.
    fn virtio_slots(&self) -> &[VirtioSlot];
}

/// What the running VM hands the snapshot code.
pub struct SnapshotSources {
    /// The VM, for its irqchip, PIT and clock.
    pub vm: Arc<VmFd>,
    /// Guest memory.
    pub mem: GuestMemoryMmap<()>,
    /// The virtio devices, through the registry.
    pub devices: Arc<dyn VirtioSlots>,
    /// The console UART.
    pub serial: Arc<Mutex<SerialDevice>>,
    /// The console output's bucket.
    pub serial_limiter: SerialLimiter,
    /// The keyboard controller.
    pub i8042: Arc<Mutex<I8042>>,
    /// Where the vCPU threads put their state.
    pub vcpu_states: Arc<VcpuStateSlots>,
    /// The pages the devices may have written, when the VM tracks dirty
    /// pages (started or loaded with `track_dirty_pages`); KVM logs the
    /// guest's.
    pub dirty: Option<Arc<DirtyPages>>,
}

impl std::fmt::Debug for SnapshotSources {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SnapshotSources").finish_non_exhaustive()
    }
}

/// What a snapshot took, for the log and the benchmarks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Created {
    /// Bytes of the state file.
    pub state_bytes: u64,
    /// Bytes written to the memory file.
    pub mem_bytes: u64,
}

/// Reads the whole state of the paused VM (see the module doc). `vcpus`
/// is how many vCPU threads are parked.
pub fn collect(
    src: &SnapshotSources,
    pause: &PauseGate,
    vcpus: usize,
    config: &VmmConfig,
) -> Result<SnapshotState, String> {
    if !pause.is_paused() {
        return Err(
            "the microVM must be paused (PATCH /vm {\"state\": \"Paused\"}) before a snapshot"
                .into(),
        );
    }
    src.vcpu_states.clear();
    if !pause.run_errand(vcpus, ERRAND_TIMEOUT) {
        return Err(format!(
            "the vCPUs did not save their state within {} ms",
            ERRAND_TIMEOUT.as_millis()
        ));
    }
    let vcpus = src.vcpu_states.take()?;
    let vm = save_vm(&src.vm).map_err(|e| crate::error_line(&e))?;
    let mut virtio = Vec::new();
    for slot in src.devices.virtio_slots() {
        let state = lock(&slot.transport)
            .save()
            .map_err(|e| format!("{} '{}': {}", slot.kind.name(), slot.id, e))?;
        virtio.push(DeviceSnapshot {
            kind: slot.kind.name().to_string(),
            id: slot.id.clone(),
            state,
        });
    }
    Ok(SnapshotState {
        config: crate::config::render::to_file_json(config),
        mem_mib: config.mem_mib,
        vm,
        vcpus,
        serial: lock(&src.serial).save(),
        serial_rate_limiter: src.serial_limiter.save(),
        i8042: lock(&src.i8042).save(),
        virtio,
    })
}

/// Every page written since the last call (or the load), one bit per page
/// from guest-physical 0: KVM's dirty log of each memory slot (the
/// guest's writes), the devices' log (their buffers) and every activated
/// queue's used ring (the device's ring writes); both logs are emptied.
fn dirty_pages(
    src: &SnapshotSources,
    log: &DirtyPages,
    state: &SnapshotState,
) -> Result<Vec<u64>, String> {
    use vm_memory::{GuestMemoryBackend, GuestMemoryRegion};
    let mut pages = log.take();
    let mut set = |page: u64| {
        if let Some(w) = usize::try_from(page / 64)
            .ok()
            .and_then(|w| pages.get_mut(w))
        {
            *w |= 1 << (page % 64);
        }
    };
    for (slot, region) in src.mem.iter().enumerate() {
        let first = region.start_addr().0 / PAGE_SIZE;
        let bitmap = src
            .vm
            .get_dirty_log(slot as u32, region.len() as usize)
            .map_err(|e| format!("KVM refused to read the dirty log of slot {slot}: {e}"))?;
        for (i, word) in bitmap.iter().enumerate() {
            for bit in (0..64).filter(|b| word & (1 << b) != 0) {
                set(first + i as u64 * 64 + bit);
            }
        }
    }
    for device in state.virtio.iter().filter(|d| d.state.transport.activated) {
        for q in device.state.transport.queues.iter().filter(|q| q.ready) {
            let len = 6 + 8 * u64::from(q.size);
            let last = q.used_ring.saturating_add(len - 1) / PAGE_SIZE;
            (q.used_ring / PAGE_SIZE..=last).for_each(&mut set);
        }
    }
    Ok(pages)
}

/// Creates (or truncates) `path` for writing.
fn create_file(path: &Path, what: &str) -> Result<File, String> {
    File::create(path).map_err(|e| format!("cannot create the {what} '{}': {e}", path.display()))
}

/// `PUT /snapshot/create` on a paused VM: the state read, the memory file
/// written, then the state file.
pub fn create(
    src: &SnapshotSources,
    pause: &PauseGate,
    vcpus: usize,
    config: &VmmConfig,
    params: &CreateParams,
) -> Result<Created, String> {
    if params.snapshot_type == SnapshotType::Diff && src.dirty.is_none() {
        return Err(
            "Diff snapshots need track_dirty_pages, which this microVM was neither \
             started nor loaded with (PUT /machine-config with track_dirty_pages: true \
             before InstanceStart, or PUT /snapshot/load with track_dirty_pages: true)"
                .into(),
        );
    }
    let started = Instant::now();
    let state = collect(src, pause, vcpus, config)?;
    let bytes = format::encode(&state);
    let mut mem_file = create_file(&params.mem_file_path, "memory file")?;
    let mem_err = |e: memory::SnapshotMemoryError| {
        format!(
            "'{}': {}",
            params.mem_file_path.display(),
            crate::error_line(&e)
        )
    };
    let mem_bytes = match (params.snapshot_type, &src.dirty) {
        (SnapshotType::Diff, Some(log)) => {
            let pages = dirty_pages(src, log, &state)?;
            memory::write_pages(&src.mem, &pages, &mem_file).map_err(mem_err)?
        }
        (_, log) => {
            let n = memory::write_full(&src.mem, &mut mem_file).map_err(mem_err)?;
            // The next Diff is relative to this snapshot.
            if let Some(log) = log {
                dirty_pages(src, log, &state)?;
            }
            n
        }
    };
    let mut state_file = create_file(&params.snapshot_path, "snapshot state file")?;
    state_file.write_all(&bytes).map_err(|e| {
        format!(
            "cannot write the snapshot state file '{}': {e}",
            params.snapshot_path.display()
        )
    })?;
    log::info!(
        "snapshot created in {:.1} ms: state {} bytes, memory {} bytes",
        started.elapsed().as_secs_f64() * 1e3,
        bytes.len(),
        mem_bytes
    );
    Ok(Created {
        state_bytes: bytes.len() as u64,
        mem_bytes,
    })
}
