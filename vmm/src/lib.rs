// SPDX-License-Identifier: Apache-2.0
//! minivmm's VMM: configuration, KVM set-up, device placement, vCPUs and the
//! event loop. Device logic lives in the `devices` crate and boot tables in
//! `arch`; this crate applies them to KVM and runs the VM.
#![deny(unsafe_code)]

pub mod builder;
pub mod cli;
pub mod config;
pub mod device_manager;
pub mod event_loop;
pub mod host;
pub mod kvm;
pub mod memory;
pub mod seccomp;
pub mod signals;
pub mod vcpu;
pub mod vm_exit;
