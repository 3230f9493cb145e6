// SPDX-License-Identifier: Apache-2.0
//! Recoveries for a PVM-backed KVM host.
//!
//! On a pagetable-based hypervisor (the `kvm_pvm` module) guest kernel code
//! is instruction-emulated, and some instructions fail emulation
//! (../shared/HOST-KVM.md in the project notes). minivmm detects such a host
//! and (a) adds guest command-line words that keep the kernel off those
//! instructions and off paravirtual paths and that switch on the guest
//! kernel's system-call fix-up (resources/kernel/pvm-syscall-fixup.patch),
//! and (b) recovers the INT3 that Linux executes in an early self-test. On an
//! ordinary VMX/SVM host none of this is applied unless forced with
//! `--host-quirks on`.

use std::path::Path;

use crate::config::HostQuirks;

/// Where the PVM module shows itself.
pub const PVM_MODULE: &str = "/sys/module/kvm_pvm";

/// [`GUEST_NO_AVX_ENV`]'s text, once, for both constants (`concat!` takes literals only).
macro_rules! guest_no_avx_env {
    () => {
        "GLIBC_TUNABLES=glibc.cpu.hwcaps=-AVX,-AVX2,-AVX512F,-AVX512CD,-AVX512BW,-AVX512DQ,\
-AVX512VL,-AVX512ER,-AVX512PF,-AVX_VNNI,-FMA,-FMA4,-AVX_Fast_Unaligned_Load"
    };
}

/// Guest command-line words for a PVM host: no XSAVE (XRSTOR fails emulation),
/// no paravirtual hypercalls (a `vmcall` never completes), CPUID features
/// hidden whose instructions (clac/stac, popcnt, rdrand...) fail emulation
/// (masking them through KVM_SET_CPUID2 was measured not to take effect
/// there, so the kernel is asked to ignore them), [`PVM_SYSCALL_FIXUP`],
/// `no_timer_check` (the emulated kernel counts timer ticks in a busy loop
/// at boot, and on a loaded host too few came: "IO-APIC + timer doesn't
/// work!", a panic, in a clean-clone CI run; Kata Containers' guests boot
/// with it too) and [`GUEST_NO_AVX_ENV`].
pub const PVM_CMDLINE: &str = concat!(
    "noxsave nopv clearcpuid=smap,smep,umip,pku,popcnt,rdrand,rdseed,\
fsgsbase,movbe,bmi1,bmi2,avx,avx2,erms,fsrm,rdpid,clwb,clflushopt pvm_syscall_fixup \
no_timer_check ",
    guest_no_avx_env!()
);

/// The environment word in [`PVM_CMDLINE`] that keeps the guest's C library
/// off AVX and AVX-512. On an AMD PVM host a guest user-mode CPUID is not
/// trapped (the host has no CPUID faulting there), so guest programs see the
/// host CPU's AVX-512 and an XCR0 that enables it, while the guest kernel,
/// which cannot use XSAVE on this host, saves only the x87/SSE state on a
/// context switch. A program interrupted inside an AVX string function
/// then resumes with another process's vector and mask registers: a TLS
/// image copied as zeros, a strchrnul that misses its byte (measured:
/// `__strchrnul_evex` chosen in the guest, 23 of 200 forked children wrong
/// while other processes ran). The kernel hands `KEY=VALUE` words it does not
/// know to init as its environment, and every process inherits it, so glibc
/// (the image's busybox, mvperf and iperf3) picks its SSE2 functions. The
/// last name matters as much as the features: glibc derives the preference
/// `AVX_Fast_Unaligned_Load` (AVX `memcpy`/`memmove`) from AVX2 before the
/// tunable is read, and switching AVX2 off does not clear it (measured with
/// `ld.so --list-diagnostics`; the self-test's `memcpy` check failed without it). A guest
/// program that detects AVX by itself is not covered; ROBUSTNESS.md says so.
pub const GUEST_NO_AVX_ENV: &str = guest_no_avx_env!();

/// The word that turns on the guest kernel's system-call fix-up: a guest
/// user-mode SYSCALL here never reaches CPL0, and the patched kernel then
/// dispatches it from its page-fault handler. A kernel without the patch
/// hands the unknown word to init as an argument, as it does with any word
/// it does not know; a patched kernel on an ordinary host never takes the
/// fix-up path.
pub const PVM_SYSCALL_FIXUP: &str = "pvm_syscall_fixup";

/// Whether this host's KVM is PVM-backed. Looked up once and remembered:
/// a jailed minivmm has no `/sys`, so `main` asks before it enters the jail.
pub fn is_pvm_host() -> bool {
    static PVM: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *PVM.get_or_init(|| Path::new(PVM_MODULE).exists())
}

/// Resolves the `--host-quirks` switch against the host.
pub fn quirks_enabled(mode: HostQuirks, pvm_host: bool) -> bool {
    match mode {
        HostQuirks::Auto => pvm_host,
        HostQuirks::On => true,
        HostQuirks::Off => false,
    }
}

/// KVM_INTERNAL_ERROR_EMULATION: the in-kernel emulator gave up.
pub const KVM_INTERNAL_ERROR_EMULATION: u32 = 1;
/// The INT3 opcode.
const INT3: u8 = 0xcc;

/// Decodes the instruction bytes KVM reports with an emulation failure:
/// `data[0]` holds flags, the low byte of `data[1]` the instruction length and
/// the bytes after it the instruction itself.
pub fn emulation_failure_insn(suberror: u32, ndata: u32, data: &[u64]) -> Option<Vec<u8>> {
    if suberror != KVM_INTERNAL_ERROR_EMULATION || ndata < 2 {
        return None;
    }
    let ndata = (ndata as usize).min(data.len());
    let bytes: Vec<u8> = data[..ndata].iter().flat_map(|w| w.to_le_bytes()).collect();
    let len = usize::from(*bytes.get(8)?);
    let insn = bytes.get(9..9 + len)?;
    Some(insn.to_vec())
}

/// Whether a failed instruction is the INT3 we know how to recover: the
/// caller skips the byte and injects #BP, which is what the CPU would have done.
pub fn is_recoverable_int3(insn: &[u8]) -> bool {
    insn.first() == Some(&INT3)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn internal_data(len: u8, insn: &[u8]) -> Vec<u64> {
        let mut bytes = vec![0u8; 8];
        bytes.push(len);
        bytes.extend_from_slice(insn);
        bytes.resize(bytes.len().div_ceil(8) * 8, 0);
        bytes
            .chunks(8)
            .map(|c| u64::from_le_bytes(c.try_into().unwrap()))
            .collect()
    }

    #[test]
    fn decodes_int3_and_other_instructions() {
        let data = internal_data(1, &[0xcc]);
        let insn = emulation_failure_insn(1, data.len() as u32, &data).unwrap();
        assert_eq!(insn, vec![0xcc]);
        assert!(is_recoverable_int3(&insn));

        // xrstor (0f ae /5) is not recoverable.
        let data = internal_data(3, &[0x0f, 0xae, 0x2f]);
        let insn = emulation_failure_insn(1, data.len() as u32, &data).unwrap();
        assert_eq!(insn, vec![0x0f, 0xae, 0x2f]);
        assert!(!is_recoverable_int3(&insn));
    }

    #[test]
    fn rejects_other_suberrors_and_short_data() {
        let data = internal_data(1, &[0xcc]);
        assert_eq!(emulation_failure_insn(2, data.len() as u32, &data), None);
        assert_eq!(emulation_failure_insn(1, 1, &data), None);
        // A length that runs past the reported data is not trusted.
        let data = internal_data(15, &[0xcc]);
        assert_eq!(emulation_failure_insn(1, 2, &data[..2]), None);
        assert!(!is_recoverable_int3(&[]));
    }

    #[test]
    fn pvm_words_switch_on_the_guest_syscall_fixup() {
        let words: Vec<&str> = PVM_CMDLINE.split_whitespace().collect();
        assert!(words.contains(&PVM_SYSCALL_FIXUP), "{PVM_CMDLINE}");
        assert!(words.contains(&"noxsave") && words.contains(&"nopv"));
        assert!(words.contains(&"no_timer_check"), "{PVM_CMDLINE}");
        // One environment word for init: no '.' before its '=' (the kernel
        // treats such words as module parameters and keeps them from init),
        // and every AVX family glibc dispatches on is switched off.
        assert!(words.contains(&GUEST_NO_AVX_ENV), "{PVM_CMDLINE}");
        let (name, value) = GUEST_NO_AVX_ENV.split_once('=').unwrap();
        assert!(!name.contains('.'), "{name}");
        let caps: Vec<&str> = value
            .strip_prefix("glibc.cpu.hwcaps=")
            .unwrap()
            .split(',')
            .collect();
        for cap in [
            "-AVX",
            "-AVX2",
            "-AVX512F",
            "-AVX512BW",
            "-AVX512VL",
            "-AVX512DQ",
            "-AVX_Fast_Unaligned_Load",
        ] {
            assert!(caps.contains(&cap), "{cap} missing from {value}");
        }
        // The kernel patch must register and announce the very word we add.
        let patch = include_str!("../../../resources/kernel/pvm-syscall-fixup.patch");
        let setup = format!("__setup(\"{PVM_SYSCALL_FIXUP}\",");
        assert!(patch.contains(&setup), "the kernel patch has no {setup}");
        assert!(patch.contains(&format!("pr_info(\"{PVM_SYSCALL_FIXUP}: active:")));
    }

    #[test]
    fn quirk_switch() {
        assert!(quirks_enabled(HostQuirks::Auto, true));
        assert!(!quirks_enabled(HostQuirks::Auto, false));
        assert!(quirks_enabled(HostQuirks::On, false));
        assert!(!quirks_enabled(HostQuirks::Off, true));
    }
}
