// SPDX-License-Identifier: Apache-2.0
//! A VM rebuilt from a snapshot, in a fresh process, by the builder's own
//! steps.
//!
//! The order: the files (metrics, the drives' images checked and the
//! cards' TAPs looked for: a missing one is refused here, before anything
//! else; the console's output, its bucket resumed if it is the saved
//! one), the VM, guest memory mapped privately from the memory file, the
//! irqchip and PIT, every device attached as at boot (TAPs opened, images
//! locked), then the saved state: the VM's (irqchip, PIT, clock), each
//! vCPU's into a fresh vCPU, and last the devices' (the UART, the i8042,
//! then every virtio device, whose rings are validated as at DRIVER_OK and
//! which raise an interrupt once restored, so the irqchip and the LAPICs
//! that receive it are already in place). No kernel is loaded and no boot
//! table written: the memory already holds the running guest. The cards
//! MMDS serves read the process's store (what `--metadata` and the API put
//! in it), as Firecracker's restored VM does: a snapshot holds no store.

use std::fs::File;

use std::sync::Arc;

use devices::mmds::SharedMmds;
use devices::rate_limiter::persist::TokenBucketState;
use devices::rate_limiter::TokenBucketConfig;
use devices::virtio::net::Tap;

use super::load::LoadParams;
use super::SnapshotState;
use crate::builder::{
    attach_devices, create_irqchip, create_vm, log_device_writes, open_metrics, BuildError, Steps,
    TapFds,
};
use crate::config::{TapBackend, VmmConfig};
use crate::host_socket::VsockSocket;
use crate::images::check_images;
use crate::kvm::memory::register_guest_memory;
use crate::kvm::pvm;
use crate::kvm::state::{restore_vcpu, restore_vm};
use crate::kvm::vcpu::{Vcpu, VcpuError};
use crate::kvm::vm_exit::ExitLatch;
use crate::registry::lock;
use crate::serial_out::SerialOut;
use crate::vmm::{Devices, KvmVm, Vmm};

fn fail(what: impl std::fmt::Display) -> BuildError {
    BuildError::Restore(what.to_string())
}

/// Checks that the state fits the configuration it carries and every
/// card's TAP exists (a restore never creates one, unlike a boot).
fn check(cfg: &VmmConfig, state: &SnapshotState) -> Result<(), BuildError> {
    if state.vcpus.len() != usize::from(cfg.vcpus) || state.mem_mib != cfg.mem_mib {
        return Err(fail(format!(
            "the state holds {} vCPU(s) and {} MiB, its configuration says {} and {}",
            state.vcpus.len(),
            state.mem_mib,
            cfg.vcpus,
            cfg.mem_mib
        )));
    }
    let ids: Vec<(String, &str)> = cfg
        .device_ids()
        .map(|(k, id)| (k.name().to_string(), id))
        .collect();
    let saved: Vec<(String, &str)> = state
        .virtio
        .iter()
        .map(|d| (d.kind.clone(), d.id.as_str()))
        .collect();
    if ids != saved {
        return Err(fail(format!(
            "the state's devices {saved:?} are not its configuration's {ids:?}"
        )));
    }
    for nic in &cfg.nets {
        if let TapBackend::Named(name) = &nic.tap {
            if !Tap::exists(name).unwrap_or(false) {
                return Err(fail(format!(
                    "network interface '{}': TAP '{name}' does not exist (create it, or name \
                     another in network_overrides)",
                    nic.id
                )));
            }
        }
    }
    Ok(())
}

/// The console is this process's (`PUT /serial` before the load, as
/// Firecracker's): its bucket resumes the saved one when it is the same
/// bucket (size and refill time), checked as any saved bucket is; another
/// bucket, or none, starts as configured, as a limit changed on a running
/// device does.
fn resume_console_bucket(
    serial: &SerialOut,
    configured: Option<&TokenBucketConfig>,
    saved: Option<&TokenBucketState>,
) -> Result<(), BuildError> {
    let (Some(c), Some(s)) = (configured, saved) else {
        return Ok(());
    };
    if (c.size, c.refill_time) != (s.size, s.refill_time) {
        return Ok(());
    }
    serial
        .limiter()
        .restore(Some(c), Some(s))
        .map_err(|e| fail(format!("serial rate_limiter: {}", crate::error_line(&e))))
}

/// Puts the saved device state into the attached devices.
fn restore_devices(devices: &Devices, state: &SnapshotState) -> Result<(), BuildError> {
    lock(&devices.serial)
        .restore(&state.serial)
        .map_err(|e| fail(crate::error_line(&e)))?;
    lock(&devices.i8042)
        .restore(&state.i8042)
        .map_err(|e| fail(crate::error_line(&e)))?;
    for (slot, saved) in devices.manager.virtio().slots().iter().zip(&state.virtio) {
        lock(&slot.transport)
            .restore(&saved.state)
            .map_err(|e| fail(format!("{} '{}': {e}", slot.kind.name(), slot.id)))?;
    }
    Ok(())
}

/// Creates each vCPU of `state` and puts its saved state into it.
fn restore_vcpus(
    vm: &kvm_ioctls::VmFd,
    devices: &Devices,
    state: &SnapshotState,
    quirks: bool,
) -> Result<Vec<Vcpu>, BuildError> {
    let mut vcpus = Vec::with_capacity(state.vcpus.len());
    for (id, saved) in (0u8..).zip(&state.vcpus) {
        let fd = vm
            .create_vcpu(u64::from(id))
            .map_err(|e| VcpuError::Create(id, e))?;
        restore_vcpu(&fd, saved)
            .map_err(|e| fail(format!("vCPU {id}: {}", crate::error_line(&e))))?;
        vcpus.push(Vcpu::new(fd, id, devices.manager.clone(), quirks));
    }
    Ok(vcpus)
}

/// Rebuilds the VM of `state` (configured as `cfg`) with its memory from
/// `mem_file`, its cards over `tap_fds` where inherited and serving `mmds`
/// (the process's store, configured as the snapshot's `mmds-config`); see
/// the module doc.
pub fn restore(
    cfg: &VmmConfig,
    state: &SnapshotState,
    mem_file: &File,
    params: &LoadParams,
    (mut tap_fds, mmds): (TapFds, SharedMmds),
) -> Result<Vmm, BuildError> {
    let mut steps = Steps::new();
    check(cfg, state)?;
    let mut metrics = open_metrics(cfg)?;
    check_images(&cfg.drives)?;
    // The console's output as at boot (stdout unless `PUT /serial` said).
    let serial = SerialOut::open(
        cfg.serial.out_path.as_deref(),
        cfg.serial.rate_limiter.as_ref(),
    )?;
    if let Some(m) = metrics.as_mut() {
        m.set_uart_dropped(serial.dropped_counter());
    }
    resume_console_bucket(
        &serial,
        cfg.serial.rate_limiter.as_ref(),
        state.serial_rate_limiter.as_ref(),
    )?;
    steps.done("files");
    let (kvm, vm) = create_vm(cfg.vcpus)?;
    steps.done("kvm");
    let mem = super::memory::map_from_file(mem_file, state.mem_mib)
        .map_err(|e| fail(crate::error_line(&e)))?;
    register_guest_memory(&vm, &mem, params.track_dirty_pages, false)?;
    steps.done("memory");
    create_irqchip(&vm)?;
    steps.done("irqchip");
    // The recoveries of a PVM host apply to the running guest; the words
    // they add to a command line were added when it booted.
    let quirks = pvm::quirks_enabled(cfg.host_quirks, pvm::is_pvm_host());
    let exit = ExitLatch::new().map_err(BuildError::EventLoop)?;
    // The vsock device's listener at its `uds_path` (the snapshot's, or
    // `vsock_override`'s), bound as at boot.
    let vsock = match &cfg.vsock {
        Some(v) => Some(Arc::new(VsockSocket::bind(&v.uds_path, cfg.seccomp)?)),
        None => None,
    };
    let devices = attach_devices(cfg, &vm, &mem, &mut tap_fds, None, (serial, vsock), mmds)?;
    // Before any device is activated: their queues take the log then.
    let dirty = params
        .track_dirty_pages
        .then(|| log_device_writes(&devices, &mem));
    steps.done("devices");
    restore_vm(&vm, &state.vm).map_err(|e| fail(crate::error_line(&e)))?;
    let vcpus = restore_vcpus(&vm, &devices, state, quirks)?;
    steps.done("kvm state");
    restore_devices(&devices, state)?;
    steps.done("device state");
    steps.log();
    let mut vmm = Vmm::new(
        KvmVm::new(kvm, vm, mem),
        devices,
        vcpus,
        exit,
        metrics,
        cfg.metrics.as_ref().map_or(0, |m| m.interval_s),
    );
    if !params.resume_vm {
        vmm.start_paused();
    }
    if let Some(log) = dirty {
        vmm.track_dirty_pages(log);
    }
    Ok(vmm)
}

/// `PUT /snapshot/load` in a fresh process: the state file read and
/// checked, the configuration rebuilt from it (`flags`, the command line's
/// settings, over it), the memory file opened, and the VM restored. The
/// logger is installed by `init_logger` once the configuration is known,
/// as for a boot. Returns the VM and its configuration, or one line.
pub fn load(
    req: &crate::api::preboot::SnapshotLoad,
    flags: crate::config::settings::Settings,
    init_logger: impl FnOnce(&VmmConfig) -> Result<(), String>,
) -> Result<(Vmm, VmmConfig), String> {
    let params = &req.params;
    let state = super::load::read_state(params)?;
    let settings = super::load::settings(&state.config, params, &req.own)?;
    let cfg = settings
        .overlay(flags)
        .finish()
        .map_err(|e| format!("the snapshot's configuration: {}", crate::error_line(&e)))?;
    let tap_fds = crate::builder::claim_tap_fds(&cfg).map_err(|e| crate::error_line(&e))?;
    init_logger(&cfg)?;
    let mem_file = File::open(&params.mem_path).map_err(|e| {
        format!(
            "cannot open the memory file '{}': {e}",
            params.mem_path.display()
        )
    })?;
    let vmm = restore(&cfg, &state, &mem_file, params, (tap_fds, req.mmds.clone()))
        .map_err(|e| crate::error_line(&e))?;
    Ok((vmm, cfg))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bucket(size: u64, refill_time: u64) -> TokenBucketConfig {
        TokenBucketConfig {
            size,
            one_time_burst: 0,
            refill_time,
        }
    }

    /// The state of a console with `b`'s bucket, `spent` bytes of it spent
    /// (an hour's refill: none earned meanwhile).
    fn saved(b: &TokenBucketConfig, spent: i128) -> TokenBucketState {
        let out = SerialOut::open(None, Some(b)).unwrap();
        let mut s = out.limiter().save().unwrap();
        s.budget -= spent;
        s
    }

    #[test]
    fn the_console_resumes_its_bucket_only_when_it_is_the_saved_one() {
        let hour = bucket(100, 3_600_000);
        let state = saved(&hour, 60);
        let budget = |out: &SerialOut| out.limiter().save().map(|s| s.budget);
        // The same bucket: it resumes with 40 bytes left.
        let same = SerialOut::open(None, Some(&hour)).unwrap();
        resume_console_bucket(&same, Some(&hour), Some(&state)).unwrap();
        assert_eq!(budget(&same), Some(40));
        // Another size or refill time, or no bucket: as configured.
        for other in [bucket(200, 3_600_000), bucket(100, 1000)] {
            let out = SerialOut::open(None, Some(&other)).unwrap();
            resume_console_bucket(&out, Some(&other), Some(&state)).unwrap();
            assert_eq!(budget(&out), Some(other.size as i128));
        }
        let none = SerialOut::open(None, None).unwrap();
        resume_console_bucket(&none, None, Some(&state)).unwrap();
        assert_eq!(budget(&none), None);
        // No saved bucket: the configured one, full.
        let fresh = SerialOut::open(None, Some(&hour)).unwrap();
        resume_console_bucket(&fresh, Some(&hour), None).unwrap();
        assert_eq!(budget(&fresh), Some(100));
        // The same bucket forged: refused with one line.
        let mut forged = state.clone();
        forged.budget = 101;
        let err = resume_console_bucket(&same, Some(&hour), Some(&forged)).unwrap_err();
        let line = crate::error_line(&err);
        assert!(
            line.contains("serial rate_limiter: the saved serial bucket holds 101 tokens"),
            "{line}"
        );
        assert_eq!(budget(&same), Some(40));
    }
}
