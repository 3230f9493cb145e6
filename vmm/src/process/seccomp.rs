// SPDX-License-Identifier: Apache-2.0
//! Seccomp filters: every minivmm thread runs under an allowlist of the
//! system calls it makes.
//!
//! minivmm has three kinds of thread ([`Thread`]), and each gets its own
//! list, built from what that thread was seen to call on real boots, so a
//! compromised device, vCPU or API path cannot reach the rest of the kernel:
//!
//! - a **vCPU** thread runs `KVM_RUN` and serves the guest's port and MMIO
//!   exits: the UART (console output to stdout, its irqfd), the i8042 reset
//!   line, and the virtio-MMIO transports, which activate (TUNSETOFFLOAD for
//!   a network card) and reset their devices when the guest driver says so;
//! - the **event loop** (the main thread) serves every virtio device's
//!   backend and queue events (the network cards' TAPs, the drives' images
//!   and io_uring, the entropy device's `getrandom`, the balloon's
//!   `madvise`), the rate limiters' and the balloon's statistics timers, console input, the signals, the metrics file and the API's
//!   run-time requests;
//! - the **API** thread (`fc_api`, with `--api-sock`) accepts, reads and
//!   answers the socket's requests, and opens and locks a drive's new
//!   image for `PATCH /drives`.
//!
//! The vCPU and event-loop filters are installed before the guest runs its
//! first instruction: each vCPU thread installs its own as its first act,
//! the main thread installs its own after spawning the vCPU threads (a
//! filter is inherited by threads created later, so the order keeps the
//! lists apart), and no vCPU enters `KVM_RUN` before both are in place
//! ([`Gate`]). The API thread installs its own before it reads a byte. With `--seccomp on`
//! a call outside the list raises SIGSYS, whose handler writes one line naming
//! the call (number and name) and ends the process with
//! [`BAD_SYSCALL_EXIT_STATUS`] (148, as Firecracker does); `--seccomp log`
//! lets the call through and has the kernel log it (the audit log, `dmesg`),
//! and `--seccomp off` installs nothing.
//!
//! The lists are as narrow as Firecracker's where it matters: memory is
//! mapped and protected without `PROT_EXEC` (no new code once running),
//! `futex` takes the three private operations std and glibc use, the event
//! loop signals only threads of minivmm itself, and the vCPU calls that only
//! the PVM host's recoveries make are allowed only where those recoveries are
//! on. Two of these depend on the running process ([`Context`]), so the VM's
//! filters are compiled once the process is what it will stay (after the jail)
//! and the VM is built ([`Filters::for_vm`]). Every thread may
//! `restart_syscall`: the kernel makes that call itself when a stopped thread
//! (SIGSTOP, a cgroup freezer, a debugger) resumes a timed wait.
//!
//! # Adding and regenerating entries
//!
//! Each thread's list is one function below ([`vcpu_rules`],
//! [`event_loop_rules`], [`api_rules`], plus `common_rules` for what every
//! Rust thread needs), one entry per call with a comment where the reason is not obvious.
//! New work that makes new calls (a metrics writer on a timer, a rate
//! limiter's timerfds, a log file) adds its entries to the thread that makes
//! them. To see what a thread calls, trace boots that exercise every path
//! in `log` mode, where each thread's `seccomp(2)` call marks the point from
//! which its list applies, and count the calls after it, per thread:
//!
//! ```text
//! strace -f -qq -o /tmp/mv.trace minivmm --seccomp log --kernel vmlinux \
//!     --initramfs initramfs --tap tap0 --metrics /tmp/m.json --cmdline ip=...
//! # meanwhile (minivmm and the TAP inside a private network namespace):
//! # ping the guest both ways, type on the console, kill -USR1 <pid>, then
//! # kill -TERM <pid>; and a second boot, with --vcpus 2, whose guest
//! # panics and resets through the i8042
//! for t in $(awk '{print $1}' /tmp/mv.trace | sort -u); do echo "thread $t"
//!   awk -v t=$t '$1 == t { sub(/^[0-9]+ +/, ""); if (on) print; if (/^seccomp\(/) on = 1 }' \
//!     /tmp/mv.trace | sed -E 's/^<\.\.\. ([a-z0-9_]+) resumed>.*/\1/; s/\(.*//' | sort | uniq -c
//! done
//! ```
//!
//! The main thread's id is minivmm's pid; the vCPU threads are named
//! `fc_vcpu N` and the API thread `fc_api` (`/proc/<pid>/task/<tid>/comm`),
//! as Firecracker names them. `--seccomp log` also makes the
//! kernel log every call a list misses (`dmesg | grep type=1326`, with the
//! thread's name and the call's number), which is how the last entries of
//! these lists were found.
#![allow(unsafe_code)]

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Barrier;

use kvm_bindings::{
    kvm_clock_data, kvm_cpuid2, kvm_debugregs, kvm_dirty_log, kvm_irqchip, kvm_lapic_state,
    kvm_mp_state, kvm_msrs, kvm_pit_state2, kvm_regs, kvm_sregs, kvm_vcpu_events, kvm_xcrs,
    kvm_xsave, KVMIO,
};
use seccompiler::{
    BpfProgram, SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter,
    SeccompRule, TargetArch,
};
use vmm_sys_util::{ioctl_io_nr, ioctl_ior_nr, ioctl_iow_nr, ioctl_iowr_nr};

/// The exit status of minivmm when a thread makes a forbidden system call
/// (Firecracker's "bad syscall" status). Documented in the README.
pub const BAD_SYSCALL_EXIT_STATUS: i32 = 148;

/// What `--seccomp` asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum SeccompMode {
    /// Forbidden calls end minivmm with status 148.
    #[default]
    On,
    /// Forbidden calls are allowed and logged by the kernel (audit, dmesg).
    Log,
    /// No filter.
    Off,
}

/// The kinds of minivmm thread, each with its own allowlist.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Thread {
    /// A vCPU thread: `KVM_RUN` and the exits it serves.
    Vcpu,
    /// The main thread's event loop: device backends, console, signals.
    EventLoop,
    /// The API socket's thread: accepts, reads and answers requests.
    Api,
    /// The process `--jail` leaves outside its PID namespace: waits for the
    /// jailed minivmm and forwards signals to it.
    Supervisor,
    /// The process that removes the vsock socket when minivmm ends
    /// (`process::remover`): it waits on a pipe and unlinks one path.
    Remover,
}

/// Errors building or installing a filter. None is caused by the guest.
#[derive(Debug, thiserror::Error)]
pub enum SeccompError {
    /// An allowlist could not be turned into a filter (a bug in the lists).
    #[error("cannot build the seccomp filter of the {0:?} thread")]
    Build(Thread, #[source] seccompiler::BackendError),
    /// The kernel refused the filter.
    #[error("cannot install the seccomp filter of the {0:?} thread")]
    Install(Thread, #[source] seccompiler::Error),
    /// The SIGSYS handler could not be installed.
    #[error("cannot install the SIGSYS handler")]
    SigsysHandler(#[source] std::io::Error),
    /// Another thread failed to install its filter, so none may run the guest.
    #[error("a thread failed to install its seccomp filter; the guest was not started")]
    PeerFailed,
}

/// One allowlist entry: a system call and the argument conditions under
/// which it is allowed (no rule: any arguments).
type Entry = (i64, Vec<SeccompRule>);

/// What narrows the lists beyond the thread's kind: facts of the running
/// process and of the VM it runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Context {
    /// minivmm's pid as its own threads see it (`getpid`): the one thread
    /// group the event loop may signal. Read when the filter is compiled,
    /// so compile it in the process (and PID namespace) that runs the VM.
    pub pid: u32,
    /// Whether the vCPUs recover the PVM host's emulation failures, whose
    /// calls (setting registers and events) no other host needs.
    pub pvm_recoveries: bool,
}

impl Context {
    /// This process as it is now, with or without the PVM recoveries.
    pub fn current(pvm_recoveries: bool) -> Context {
        Context {
            pid: std::process::id(),
            pvm_recoveries,
        }
    }
}

fn allow(syscall: libc::c_long) -> Entry {
    (syscall, Vec::new())
}

/// Argument `arg` equals `value`, compared as 32 bits: every argument the
/// filters look at is a kernel `int` or `unsigned int` (flags, modes, file
/// descriptors, request numbers, signals).
fn arg_eq(arg: u8, value: u64) -> SeccompCondition {
    SeccompCondition::new(arg, SeccompCmpArgLen::Dword, SeccompCmpOp::Eq, value)
        .expect("argument indexes 0 to 5 are valid")
}

/// A rule that holds when every one of `conds` does.
fn all_of(conds: Vec<SeccompCondition>) -> SeccompRule {
    SeccompRule::new(conds).expect("a rule with at least one condition is valid")
}

/// `ioctl(fd, request, ...)` for these request numbers only.
fn allow_ioctls(requests: &[u64]) -> Entry {
    ioctls_on(None, requests)
}

/// `ioctl(0, TCSETS | TCGETS, ...)` only: what glibc's `tcsetattr` on stdin
/// makes (it reads the mode back to check it).
fn allow_stdin_tcsetattr() -> Entry {
    ioctls_on(
        Some(libc::STDIN_FILENO as u64),
        &[ioctl_nr(libc::TCSETS), ioctl_nr(libc::TCGETS)],
    )
}

/// `ioctl` for these request numbers, on `fd` only if one is given.
fn ioctls_on(fd: Option<u64>, requests: &[u64]) -> Entry {
    let rules = requests
        .iter()
        .map(|&request| {
            // The request is the kernel's `unsigned int cmd`, the fd an
            // `unsigned int` too.
            let mut conds = vec![arg_eq(1, request)];
            conds.extend(fd.map(|fd| arg_eq(0, fd)));
            all_of(conds)
        })
        .collect();
    (libc::SYS_ioctl, rules)
}

/// `io_uring_enter` with flags `IORING_ENTER_GETEVENTS` (submit and reap:
/// the net device's TX batches, the block device waiting for a completion)
/// or 0 (submit only: the block device's requests, reaped later from the
/// ring's eventfd), nothing else (no registered ring fd, no extended
/// arguments). The rings were built before the filter with restrictions on
/// what they may do (devices' `io_engine` and `block::uring`);
/// `io_uring_setup` and `io_uring_register` stay forbidden, so no thread can
/// make a ring that does more, nor lift those restrictions.
fn allow_io_uring_submit() -> Entry {
    allow_arg_in(libc::SYS_io_uring_enter, 3, &[IORING_ENTER_GETEVENTS, 0])
}

/// `fallocate(fd, mode, offset, len)` in the block device's two modes only,
/// both keeping the image's size: DISCARD punches a hole
/// (`FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE`), WRITE_ZEROES zeroes a
/// range (`FALLOC_FL_ZERO_RANGE | FALLOC_FL_KEEP_SIZE`). Growing the file,
/// collapsing or inserting ranges stay forbidden.
fn allow_block_fallocate() -> Entry {
    allow_arg_in(
        libc::SYS_fallocate,
        1,
        &[
            (libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE) as u64,
            (libc::FALLOC_FL_ZERO_RANGE | libc::FALLOC_FL_KEEP_SIZE) as u64,
        ],
    )
}

/// linux/io_uring.h; libc does not export it.
const IORING_ENTER_GETEVENTS: u64 = 1;

/// `fcntl(fd, F_GETFD)` only: std's debug builds check that a descriptor is
/// still open before `OwnedFd::drop` closes it (the device's fds, the
/// limiters' timerfds, dropped at exit under the filter). Reading the close-on-exec
/// flag reveals nothing and changes nothing; release builds never call it.
fn allow_fcntl_getfd() -> Entry {
    allow_arg_in(libc::SYS_fcntl, 1, &[libc::F_GETFD as u64])
}

/// An ioctl request number as the filter compares it. libc's `Ioctl` is
/// `c_ulong` with glibc and `c_int` with musl; the kernel reads 32 bits.
#[allow(clippy::unnecessary_cast)]
fn ioctl_nr(request: libc::Ioctl) -> u64 {
    request as u64
}

// KVM ioctl numbers from the kernel's uapi/linux/kvm.h, computed from the
// structure sizes as kvm-ioctls computes them.
ioctl_io_nr!(KVM_RUN, KVMIO, 0x80);
ioctl_ior_nr!(KVM_GET_REGS, KVMIO, 0x81, kvm_regs);
ioctl_iow_nr!(KVM_SET_REGS, KVMIO, 0x82, kvm_regs);
ioctl_ior_nr!(KVM_GET_VCPU_EVENTS, KVMIO, 0x9f, kvm_vcpu_events);
ioctl_iow_nr!(KVM_SET_VCPU_EVENTS, KVMIO, 0xa0, kvm_vcpu_events);
ioctl_ior_nr!(KVM_GET_SREGS, KVMIO, 0x83, kvm_sregs);
ioctl_iowr_nr!(KVM_GET_MSRS, KVMIO, 0x88, kvm_msrs);
ioctl_ior_nr!(KVM_GET_LAPIC, KVMIO, 0x8e, kvm_lapic_state);
ioctl_iowr_nr!(KVM_GET_CPUID2, KVMIO, 0x91, kvm_cpuid2);
ioctl_ior_nr!(KVM_GET_MP_STATE, KVMIO, 0x98, kvm_mp_state);
ioctl_ior_nr!(KVM_GET_DEBUGREGS, KVMIO, 0xa1, kvm_debugregs);
ioctl_ior_nr!(KVM_GET_XSAVE, KVMIO, 0xa4, kvm_xsave);
ioctl_ior_nr!(KVM_GET_XCRS, KVMIO, 0xa6, kvm_xcrs);
ioctl_iowr_nr!(KVM_GET_IRQCHIP, KVMIO, 0x62, kvm_irqchip);
ioctl_ior_nr!(KVM_GET_PIT2, KVMIO, 0x9f, kvm_pit_state2);
ioctl_ior_nr!(KVM_GET_CLOCK, KVMIO, 0x7c, kvm_clock_data);
ioctl_iow_nr!(KVM_GET_DIRTY_LOG, KVMIO, 0x42, kvm_dirty_log);

/// What a parked vCPU reads of itself for `PUT /snapshot/create`
/// (`kvm::state::save_vcpu`): reads only, no state changes.
fn vcpu_state_reads() -> [u64; 10] {
    [
        KVM_GET_REGS(),
        KVM_GET_SREGS(),
        KVM_GET_XSAVE(),
        KVM_GET_XCRS(),
        KVM_GET_MSRS(),
        KVM_GET_LAPIC(),
        KVM_GET_MP_STATE(),
        KVM_GET_VCPU_EVENTS(),
        KVM_GET_DEBUGREGS(),
        KVM_GET_CPUID2(),
    ]
}

/// `openat(dirfd, path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, mode)`
/// only, what `File::create` makes: `PUT /snapshot/create` writes its two
/// files from the event loop. Nothing is opened for reading, and no other
/// flags (no O_PATH, no O_DIRECTORY, no O_APPEND) pass.
fn allow_snapshot_file_create() -> Entry {
    let flags = (libc::O_WRONLY | libc::O_CREAT | libc::O_TRUNC | libc::O_CLOEXEC) as u64;
    allow_arg_in(libc::SYS_openat, 2, &[flags])
}

/// `(arg & PROT_EXEC) == 0`: a protection without execute permission.
fn no_exec(arg: u8) -> SeccompCondition {
    SeccompCondition::new(
        arg,
        SeccompCmpArgLen::Dword,
        SeccompCmpOp::MaskedEq(libc::PROT_EXEC as u64),
        0,
    )
    .expect("argument indexes 0 to 5 are valid")
}

/// `mmap(addr, len, prot, flags, fd, off)` of private anonymous memory only
/// (glibc's malloc: `MAP_PRIVATE | MAP_ANONYMOUS` for a large block, with
/// `MAP_NORESERVE` for a thread arena's reservation), never executable. No
/// file is mapped once running, shared memory is not made, and no code.
fn allow_mmap_data() -> Entry {
    let anon = (libc::MAP_PRIVATE | libc::MAP_ANONYMOUS) as u64;
    let rules = [anon, anon | libc::MAP_NORESERVE as u64]
        .into_iter()
        .map(|flags| all_of(vec![arg_eq(3, flags), no_exec(2)]))
        .collect();
    (libc::SYS_mmap, rules)
}

/// `mprotect(addr, len, prot)` without `PROT_EXEC` (an arena growing into
/// its reservation): nothing becomes executable.
fn allow_mprotect_data() -> Entry {
    (libc::SYS_mprotect, vec![all_of(vec![no_exec(2)])])
}

/// `futex` with the private operations std and glibc use: std's Mutex,
/// Condvar, Barrier, channels and thread parking wait with
/// `FUTEX_WAIT_BITSET_PRIVATE` (an absolute deadline, or none) and wake with
/// `FUTEX_WAKE_PRIVATE`; glibc's internal locks (malloc's arenas, a thread's
/// exit) wait with `FUTEX_WAIT_PRIVATE`. No shared futex, no requeue, no
/// priority inheritance, no `FUTEX_CLOCK_REALTIME`.
fn allow_futex_private() -> Entry {
    allow_arg_in(
        libc::SYS_futex,
        1,
        &[
            (libc::FUTEX_WAIT_BITSET | libc::FUTEX_PRIVATE_FLAG) as u64,
            (libc::FUTEX_WAKE | libc::FUTEX_PRIVATE_FLAG) as u64,
            (libc::FUTEX_WAIT | libc::FUTEX_PRIVATE_FLAG) as u64,
        ],
    )
}

/// What every minivmm thread calls, whatever its job.
fn common_rules() -> Vec<Entry> {
    vec![
        // The allocator. glibc malloc gives each thread an arena (mmap) that
        // it grows (mprotect) and trims (madvise, munmap); the main arena
        // grows with brk; blocks above the mmap threshold are mmap'ed and
        // resized with mremap. Which of these a thread needs depends on the
        // guest's traffic, not on the code path, so all are allowed, for
        // data only: nothing is mapped or made executable.
        allow(libc::SYS_brk),
        allow_mmap_data(),
        allow_mprotect_data(),
        allow(libc::SYS_madvise),
        allow(libc::SYS_mremap),
        allow(libc::SYS_munmap),
        // std's Mutex, Condvar, Barrier, channels and thread parking.
        allow_futex_private(),
        // Made by the kernel, not by minivmm: a thread stopped (SIGSTOP, a
        // cgroup freezer, a debugger) inside a timed wait (a futex with a
        // deadline, a sleep) resumes it with this call once continued.
        // Without it an operator's SIGSTOP/SIGCONT ends minivmm with 148.
        allow(libc::SYS_restart_syscall),
        // Log lines (stderr), console output (stdout), eventfd signals
        // (irqfds, queue kicks, the event handler's own wake-ups).
        allow(libc::SYS_write),
        // Eventfd reads (the net device drains its queue events when the
        // driver resets it, on a vCPU), signalfd, stdin, the loop's events.
        allow(libc::SYS_read),
        // Dropping what a thread owns: a vCPU thread that returns closes its
        // vCPU fd; the main thread closes every device fd at exit.
        allow(libc::SYS_close),
        allow_fcntl_getfd(),
        // A vCPU thread that returns removes its signal stack (sigaltstack,
        // munmap), and glibc blocks every signal (rt_sigprocmask) before it
        // ends the thread with exit; exit_group ends the process (main's
        // return, the SIGSYS handler's _exit).
        allow(libc::SYS_rt_sigprocmask),
        allow(libc::SYS_exit),
        allow(libc::SYS_exit_group),
        allow(libc::SYS_sigaltstack),
        // Returning from a signal handler (Rust's SIGSEGV/SIGBUS handler
        // returns for a fault that is not a stack overflow).
        allow(libc::SYS_rt_sigreturn),
        // A thread ending the process abruptly (the SIGSYS handler, the
        // panic hook) gives the console's terminal its mode back first:
        // tcsetattr on stdin, nothing else (`terminal::restore_at_crash`).
        allow_stdin_tcsetattr(),
        // Instant::now where the vDSO has no fast path for the host's clock
        // source and falls back to the system call (some VMs' clocks).
        allow(libc::SYS_clock_gettime),
    ]
}

/// A vCPU thread, after it installed its filter.
pub fn vcpu_rules(ctx: &Context) -> Vec<Entry> {
    let mut ioctls = vec![
        KVM_RUN(),
        // An emulation failure is reported with the guest's RIP, on any
        // host (reading registers changes nothing).
        KVM_GET_REGS(),
        // The guest's DRIVER_OK reaches the net device on this thread,
        // which tells the TAP what offloads the guest accepts.
        ioctl_nr(libc::TUNSETOFFLOAD),
    ];
    // A parked vCPU reads its own state when a snapshot asks.
    ioctls.extend(vcpu_state_reads());
    if ctx.pvm_recoveries {
        // The INT3 recovery on a PVM host (vcpu.rs): skip the byte and
        // inject #BP (it reads the events too, allowed above for the
        // snapshot). Only where the recoveries are on.
        ioctls.extend([KVM_SET_REGS(), KVM_SET_VCPU_EVENTS()]);
    }
    vec![
        allow_ioctls(&ioctls),
        // An AP waiting for its start-up IPI backs off with thread::sleep
        // (KVM_RUN returns EAGAIN between INIT and SIPI on any host, and
        // for the whole wait on a PVM host).
        allow(libc::SYS_clock_nanosleep),
        // A guest resetting its block device reaches the device on this
        // thread, which waits for the requests its io_uring still holds
        // (their buffers are guest memory the driver gets back).
        allow_io_uring_submit(),
    ]
}

/// The main thread's event loop, after it spawned the vCPUs.
pub fn event_loop_rules(ctx: &Context) -> Vec<Entry> {
    let mut rules = vec![
        // The loop itself, and the net device (de)registering its TAP and
        // requeue events when the guest activates or resets it.
        allow(libc::SYS_epoll_wait),
        allow(libc::SYS_epoll_ctl),
        // Zero-copy frames between the TAP and guest memory.
        allow(libc::SYS_readv),
        allow(libc::SYS_writev),
        allow_io_uring_submit(),
        // The block device's Sync engine (and the Async one's fallback for
        // an entry its ring refuses): IN and OUT straight between the image
        // and guest memory (pread64/pwrite64 for one data buffer), FLUSH
        // with the Writeback cache, DISCARD and WRITE_ZEROES.
        allow(libc::SYS_preadv),
        allow(libc::SYS_pwritev),
        allow(libc::SYS_pread64),
        allow(libc::SYS_pwrite64),
        allow(libc::SYS_fdatasync),
        allow_block_fallocate(),
        // The entropy device fills the guest's buffers straight from the
        // kernel's generator, never waiting for it (GRND_NONBLOCK).
        allow_arg_in(libc::SYS_getrandom, 2, &[libc::GRND_NONBLOCK as u64]),
        // The balloon gives inflated, hinted and reported guest pages back
        // to the host: MADV_DONTNEED on guest memory. (The allocator's
        // entry in the common rules allows every madvise today; this one
        // stays the balloon's should that entry ever narrow.)
        allow_arg_in(libc::SYS_madvise, 2, &[libc::MADV_DONTNEED as u64]),
        // A rate limiter that holds a frame back arms its timerfd for when
        // the frame fits (the metrics timer is armed before the filter);
        // the vsock device arms its connection time-out, and the balloon
        // its statistics timer when the guest's driver starts it or the
        // API changes the interval.
        allow(libc::SYS_timerfd_settime),
        // `PATCH /network-interfaces` on a card without a limiter makes
        // one, with its timer: monotonic, non-blocking, close-on-exec only.
        allow_timerfd_create(),
        // `PATCH /vm` `Paused` kicks the vCPU threads out of KVM_RUN
        // (pthread_kill: tgkill to a thread of this process, found by
        // getpid).
        allow(libc::SYS_getpid),
        allow_tgkill_kick(ctx.pid),
        // `PUT /snapshot/create` (snapshot::create): the VM's irqchip, PIT
        // and clock read, and the memory and state files created and
        // written (`write`, in the common rules).
        allow_ioctls(&[KVM_GET_IRQCHIP(), KVM_GET_PIT2(), KVM_GET_CLOCK()]),
        allow_snapshot_file_create(),
        // A Diff snapshot: KVM's log of the pages the guest wrote (read and
        // reset), and the sparse memory file sized whole (its pages go in
        // with pwrite64, allowed above).
        allow_ioctls(&[KVM_GET_DIRTY_LOG()]),
        allow(libc::SYS_ftruncate),
        // Restoring the console's terminal mode at exit is in the common
        // rules (`allow_stdin_tcsetattr`).
    ];
    // The vsock device (`devices::virtio::vsock::backend`): a host agent's
    // connection accepted on the listener at `uds_path`, a guest's
    // connection to the listener at `<uds_path>_<port>` (only Unix stream
    // sockets are made, non-blocking, so `connect` reaches nothing but a
    // Unix socket path and never waits), and the write side shut once the
    // guest sends no more. Data moves with read/write/readv/writev, as for
    // the TAP.
    rules.extend(allow_vsock_sockets());
    rules
}

/// What the vsock device calls on its sockets (see `event_loop_rules`):
/// `accept4(fd, _, _, SOCK_NONBLOCK | SOCK_CLOEXEC)`, `socket(AF_UNIX,
/// SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0)`, `connect` (its address
/// is a pointer, which a filter cannot read) and `shutdown(fd, SHUT_WR)`.
fn allow_vsock_sockets() -> Vec<Entry> {
    let flags = (libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC) as u64;
    let stream = libc::SOCK_STREAM as u64 | flags;
    let unix = all_of(vec![
        arg_eq(0, libc::AF_UNIX as u64),
        arg_eq(1, stream),
        arg_eq(2, 0),
    ]);
    vec![
        allow_arg_in(libc::SYS_accept4, 3, &[flags]),
        (libc::SYS_socket, vec![unix]),
        allow(libc::SYS_connect),
        allow_arg_in(libc::SYS_shutdown, 1, &[libc::SHUT_WR as u64]),
    ]
}

/// The remover process (`process::remover`): it blocks every signal and
/// closes every descriptor but its two pipe ends before its filter, then
/// says it is ready (`write`, common), waits (`read`, common), unlinks its
/// one path and exits (common).
pub fn remover_rules() -> Vec<Entry> {
    vec![allow(libc::SYS_unlink)]
}

/// `timerfd_create(CLOCK_MONOTONIC, TFD_CLOEXEC | TFD_NONBLOCK)` only.
fn allow_timerfd_create() -> Entry {
    let rule = all_of(vec![
        arg_eq(0, libc::CLOCK_MONOTONIC as u64),
        arg_eq(1, (libc::TFD_CLOEXEC | libc::TFD_NONBLOCK) as u64),
    ]);
    (libc::SYS_timerfd_create, vec![rule])
}

/// `tgkill(pid, tid, kick)`: the vCPU kick signal to a thread of minivmm
/// itself and nothing else: the thread group must be `pid` (minivmm's own,
/// [`Context::pid`]), and the kernel refuses a tid that is not in it.
fn allow_tgkill_kick(pid: u32) -> Entry {
    let rule = all_of(vec![
        arg_eq(0, u64::from(pid)),
        arg_eq(2, crate::kvm::pause::kick_signal() as u64),
    ]);
    (libc::SYS_tgkill, vec![rule])
}

/// `syscall` when argument `arg` (32 bits) is one of `values`.
fn allow_arg_in(syscall: libc::c_long, arg: u8, values: &[u64]) -> Entry {
    let rules = values
        .iter()
        .map(|&v| all_of(vec![arg_eq(arg, v)]))
        .collect();
    (syscall, rules)
}

/// `fcntl(fd, F_SETFL, 0)` only: a file opened non-blocking made blocking
/// again (the kernel reads the flags as 32 bits).
fn allow_fcntl_clear_flags() -> Entry {
    let rule = all_of(vec![arg_eq(1, libc::F_SETFL as u64), arg_eq(2, 0)]);
    (libc::SYS_fcntl, vec![rule])
}

/// The `openat` flags of a disk image opened for `PATCH /drives`
/// (`FileBackend::open_unlocked`): read-only or read-write, non-blocking,
/// close-on-exec; never created, truncated or appended to.
fn image_open_flags() -> [u64; 2] {
    [
        (libc::O_RDONLY | libc::O_NONBLOCK | libc::O_CLOEXEC) as u64,
        (libc::O_RDWR | libc::O_NONBLOCK | libc::O_CLOEXEC) as u64,
    ]
}

/// The API socket's thread: epoll over the listener and its connections,
/// accept, read a request, write the answer, hand it to the VMM through a
/// channel (futex, in the common rules) and wait for the answer with a
/// time-out (a clock read, normally from the vDSO). And, for `PATCH
/// /drives`, open the new disk image as the builder does at start (the
/// event loop may not open files): `openat` with the image's flags only,
/// `fstat` of the open file (std's `statx` with `AT_EMPTY_PATH`, or glibc's
/// `fstat`, which is `newfstatat` with `AT_EMPTY_PATH` or `fstat`),
/// `fcntl(F_SETFL, 0)` to clear O_NONBLOCK, and a non-blocking `flock`, shared or
/// exclusive; `close` is in the common rules. Nothing here writes a file,
/// and no path but the one opened is looked at.
pub fn api_rules() -> Vec<Entry> {
    let flags = image_open_flags();
    let empty_path = [libc::AT_EMPTY_PATH as u64];
    vec![
        allow(libc::SYS_epoll_wait),
        allow(libc::SYS_epoll_ctl),
        allow(libc::SYS_accept4),
        // std's UnixStream: read/write (in the common rules), or recv/send
        // (recvfrom/sendto) on some paths; set_nonblocking is FIONBIO.
        allow(libc::SYS_recvfrom),
        allow(libc::SYS_sendto),
        allow_ioctls(&[ioctl_nr(libc::FIONBIO)]),
        // A closing connection shuts its writing side and reads on.
        allow_arg_in(libc::SYS_shutdown, 1, &[libc::SHUT_WR as u64]),
        allow_arg_in(libc::SYS_openat, 2, &flags),
        allow_arg_in(libc::SYS_statx, 2, &empty_path),
        allow_arg_in(libc::SYS_newfstatat, 3, &empty_path),
        allow(libc::SYS_fstat),
        allow_fcntl_clear_flags(),
        allow_arg_in(
            libc::SYS_flock,
            1,
            &[
                (libc::LOCK_SH | libc::LOCK_NB) as u64,
                (libc::LOCK_EX | libc::LOCK_NB) as u64,
            ],
        ),
    ]
}

/// The supervisor `--jail` leaves outside its PID namespace
/// (`jail::pidns`), after it dropped its privileges and closed every
/// descriptor but stdio: it waits for signals and for the jailed minivmm's
/// end, and signals it.
pub fn supervisor_rules() -> Vec<Entry> {
    vec![
        // sigwaitinfo: the forwarded signals and SIGCHLD.
        allow(libc::SYS_rt_sigtimedwait),
        // The supervisor stopped and continued (SIGSTOP, a frozen cgroup)
        // inside sigwaitinfo resumes the call through restart_syscall.
        allow(libc::SYS_restart_syscall),
        // waitpid(child, WNOHANG) on SIGCHLD.
        allow(libc::SYS_wait4),
        // The forwarded stop and metrics signals, and SIGKILL for those
        // whose default action would have ended an unjailed minivmm.
        allow_arg_in(
            libc::SYS_kill,
            1,
            &[libc::SIGTERM, libc::SIGINT, libc::SIGUSR1, libc::SIGKILL].map(|s| s as u64),
        ),
    ]
}

/// Merges entries by system call. An unconditional entry wins over rules
/// for the same call (it allows more).
fn merge(entries: impl IntoIterator<Item = Entry>) -> BTreeMap<i64, Vec<SeccompRule>> {
    let mut map: BTreeMap<i64, Option<Vec<SeccompRule>>> = BTreeMap::new();
    for (nr, rules) in entries {
        let slot = map.entry(nr).or_insert_with(|| Some(Vec::new()));
        match (slot.as_mut(), rules.is_empty()) {
            // Already unconditional.
            (None, _) => {}
            (Some(_), true) => *slot = None,
            (Some(existing), false) => existing.extend(rules),
        }
    }
    map.into_iter()
        .map(|(nr, rules)| (nr, rules.unwrap_or_default()))
        .collect()
}

/// The allowlist of `thread` in `ctx`, common entries included.
pub fn rules(thread: Thread, ctx: &Context) -> BTreeMap<i64, Vec<SeccompRule>> {
    let own = match thread {
        Thread::Vcpu => vcpu_rules(ctx),
        Thread::EventLoop => event_loop_rules(ctx),
        Thread::Api => api_rules(),
        Thread::Supervisor => supervisor_rules(),
        Thread::Remover => remover_rules(),
    };
    merge(common_rules().into_iter().chain(own))
}

/// Compiles the filter of `thread` for `mode` (`None` when off), for this
/// process as it is now with the PVM recoveries' calls allowed: the widest
/// list of each thread, for a thread that needs no narrower one (the API
/// thread) and for checking that every list compiles.
pub fn filter(thread: Thread, mode: SeccompMode) -> Result<Option<BpfProgram>, SeccompError> {
    filter_in(thread, mode, &Context::current(true))
}

/// Compiles the filter of `thread` in `ctx` for `mode` (`None` when off).
pub fn filter_in(
    thread: Thread,
    mode: SeccompMode,
    ctx: &Context,
) -> Result<Option<BpfProgram>, SeccompError> {
    let mismatch = match mode {
        SeccompMode::On => SeccompAction::Trap,
        SeccompMode::Log => SeccompAction::Log,
        SeccompMode::Off => return Ok(None),
    };
    let filter = SeccompFilter::new(
        rules(thread, ctx),
        mismatch,
        SeccompAction::Allow,
        TargetArch::x86_64,
    )
    .map_err(|e| SeccompError::Build(thread, e))?;
    let prog: BpfProgram = filter
        .try_into()
        .map_err(|e| SeccompError::Build(thread, e))?;
    Ok(Some(prog))
}

/// Every thread's filter, compiled before any thread starts so that a
/// mistake in a list is a configuration error (status 1), not a run-time one.
/// The VM's two are compiled again for the process and VM that run them
/// ([`Filters::for_vm`]).
#[derive(Debug, Clone, Default)]
pub struct Filters {
    /// The mode they were built for.
    pub mode: SeccompMode,
    /// The vCPU threads' filter.
    pub vcpu: Option<BpfProgram>,
    /// The event loop's filter.
    pub event_loop: Option<BpfProgram>,
    /// The API thread's filter.
    pub api: Option<BpfProgram>,
    /// They came from `--seccomp-filter`: used as they are, never
    /// recompiled for the VM.
    pub from_file: bool,
}

impl Filters {
    /// Compiles every filter for `mode`, each thread's widest list.
    pub fn new(mode: SeccompMode) -> Result<Self, SeccompError> {
        Ok(Filters {
            mode,
            vcpu: filter(Thread::Vcpu, mode)?,
            event_loop: filter(Thread::EventLoop, mode)?,
            api: filter(Thread::Api, mode)?,
            from_file: false,
        })
    }

    /// The vCPU and event-loop filters compiled for the VM about to run in
    /// this process: its pid now (after the jail, whatever PID namespace
    /// that put it in) and whether its vCPUs make the PVM host's
    /// recoveries. The API thread's filter stays as it was.
    pub fn for_vm(&self, pvm_recoveries: bool) -> Result<Self, SeccompError> {
        if self.from_file {
            return Ok(self.clone());
        }
        let ctx = Context::current(pvm_recoveries);
        Ok(Filters {
            mode: self.mode,
            vcpu: filter_in(Thread::Vcpu, self.mode, &ctx)?,
            event_loop: filter_in(Thread::EventLoop, self.mode, &ctx)?,
            api: self.api.clone(),
            from_file: false,
        })
    }
}

/// Installs `prog` on the calling thread (nothing when it is `None`),
/// after the thread's lazy first calls ([`super::settle::thread`]).
pub fn apply(thread: Thread, prog: Option<&BpfProgram>) -> Result<(), SeccompError> {
    super::settle::thread();
    match prog {
        Some(p) => seccompiler::apply_filter(p).map_err(|e| SeccompError::Install(thread, e)),
        None => Ok(()),
    }
}

/// Where every thread waits, filter installed, before the guest runs: no
/// vCPU enters the guest until the event loop and every vCPU are filtered,
/// and none does if any thread failed.
#[derive(Debug)]
pub struct Gate {
    barrier: Barrier,
    failed: AtomicBool,
}

impl Gate {
    /// A gate for `threads` threads (the vCPUs and the event loop).
    pub fn new(threads: usize) -> Self {
        Gate {
            barrier: Barrier::new(threads),
            failed: AtomicBool::new(false),
        }
    }

    /// Installs `prog` for `thread`, waits for every other thread, and says
    /// whether all of them are filtered. Every thread must call this exactly
    /// once, whatever happened before, or the others wait for ever.
    pub fn install_and_wait(
        &self,
        thread: Thread,
        prog: Option<&BpfProgram>,
    ) -> Result<(), SeccompError> {
        let mine = apply(thread, prog);
        if mine.is_err() {
            self.failed.store(true, Ordering::SeqCst);
        }
        self.barrier.wait();
        mine?;
        if self.failed.load(Ordering::SeqCst) {
            return Err(SeccompError::PeerFailed);
        }
        Ok(())
    }

    /// For a thread that cannot install its filter at all (spawn failed):
    /// releases the others, which will then refuse to run the guest.
    pub fn fail(&self) {
        self.failed.store(true, Ordering::SeqCst);
        self.barrier.wait();
    }
}

/// Byte offset of `si_syscall` in the kernel's `siginfo_t` on x86_64: the
/// SIGSYS member of the union (after signo, errno, code and padding, 16
/// bytes) starts with the 8-byte `_call_addr`, then the 4-byte `_syscall`.
const SI_SYSCALL_OFFSET: usize = 24;

/// The SIGSYS handler: the terminal's mode back, one line naming the call
/// (its number and, from a static table, its name) on stderr, then
/// [`BAD_SYSCALL_EXIT_STATUS`]. Async-signal-safe: no allocation, no lock,
/// only tcsetattr on fd 0 (TCSETS, TCGETS), write(2) and _exit(2), all in
/// every allowlist.
extern "C" fn sigsys_handler(
    _sig: libc::c_int,
    info: *mut libc::siginfo_t,
    _ctx: *mut libc::c_void,
) {
    // SAFETY: the kernel passes a valid siginfo_t for a SA_SIGINFO handler;
    // for SIGSYS raised by seccomp the `_sigsys` member of its union is the
    // live one and `_syscall` lies SI_SYSCALL_OFFSET bytes in, inside the
    // 128-byte structure. read_unaligned needs no alignment.
    let nr = unsafe {
        info.cast::<u8>()
            .add(SI_SYSCALL_OFFSET)
            .cast::<i32>()
            .read_unaligned()
    };
    let mut line = [0u8; LINE_MAX];
    let len = bad_syscall_line(nr, &mut line);
    crate::process::terminal::restore_at_crash();
    // SAFETY: `line[..len]` is initialised memory owned by this frame; fd 2
    // is stderr (a failed write changes nothing); _exit never returns and
    // runs no atexit handler, which is what a signal handler may do.
    unsafe {
        libc::write(2, line.as_ptr().cast(), len);
        libc::_exit(BAD_SYSCALL_EXIT_STATUS);
    }
}

/// The longest SIGSYS line: the text, 11 digits and a sign, and a name
/// (the longest is under 30 bytes).
const LINE_MAX: usize = 160;

/// Formats "minivmm: error: forbidden system call N (NAME) under seccomp,
/// exiting with status 148\n" (without " (NAME)" for a call that has no
/// name) into `buf` without allocating; returns its length.
fn bad_syscall_line(nr: i32, buf: &mut [u8; LINE_MAX]) -> usize {
    let mut len = 0;
    let mut put = |bytes: &[u8]| {
        for &b in bytes {
            if len < buf.len() {
                buf[len] = b;
                len += 1;
            }
        }
    };
    put(b"minivmm: error: forbidden system call ");
    let mut digits = [0u8; 11];
    let mut n = i64::from(nr).unsigned_abs();
    let mut i = digits.len();
    loop {
        i -= 1;
        digits[i] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    if nr < 0 {
        put(b"-");
    }
    put(&digits[i..]);
    if let Some(name) = crate::process::syscall_names::name(libc::c_long::from(nr)) {
        put(b" (");
        put(name.as_bytes());
        put(b")");
    }
    put(b" under seccomp, exiting with status 148\n");
    len
}

/// Installs the SIGSYS handler for the whole process. Call it before any
/// filter is installed.
pub fn install_sigsys_handler() -> Result<(), SeccompError> {
    // SAFETY: an all-zero sigaction is a valid starting point (empty mask,
    // no flags); we then set a handler of the SA_SIGINFO signature.
    let mut act: libc::sigaction = unsafe { std::mem::zeroed() };
    act.sa_sigaction = sigsys_handler as *const () as usize;
    act.sa_flags = libc::SA_SIGINFO;
    // SAFETY: `act` is a valid sigaction that lives across the call, the old
    // action is not wanted (null), and the handler is async-signal-safe.
    let ret = unsafe { libc::sigaction(libc::SIGSYS, &act, std::ptr::null_mut()) };
    if ret != 0 {
        return Err(SeccompError::SigsysHandler(std::io::Error::last_os_error()));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs `f` in a forked child with `thread`'s filter in `mode` and the
    /// SIGSYS handler installed, and returns the child's wait status. The
    /// filter is compiled before the fork: in the child of a multi-threaded
    /// process only async-signal-safe calls are allowed, and `f` makes only
    /// raw system calls.
    fn in_filtered_child(thread: Thread, mode: SeccompMode, f: fn()) -> libc::c_int {
        in_child_under(thread, filter(thread, mode).unwrap(), f)
    }

    /// [`in_filtered_child`] with the filter compiled for `ctx`.
    fn in_child_in(thread: Thread, ctx: Context, f: fn()) -> libc::c_int {
        in_child_under(thread, filter_in(thread, SeccompMode::On, &ctx).unwrap(), f)
    }

    /// Runs `f` in a forked child under `prog` and returns its wait status.
    fn in_child_under(thread: Thread, prog: Option<BpfProgram>, f: fn()) -> libc::c_int {
        wait_child(spawn_child_under(thread, prog, f))
    }

    /// Forks a child that installs the SIGSYS handler and `prog`, runs `f`
    /// and exits 0 (99 if the filter could not be installed); returns its
    /// pid. The filter is compiled before the fork: in the child of a
    /// multi-threaded process only async-signal-safe calls are allowed, and
    /// `f` makes only raw system calls.
    fn spawn_child_under(thread: Thread, prog: Option<BpfProgram>, f: fn()) -> libc::pid_t {
        // SAFETY: fork has no memory-safety preconditions; the child below
        // only makes system calls (sigaction, prctl, seccomp, the call under
        // test, _exit) and touches memory that was set up before the fork.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0, "fork failed");
        if pid == 0 {
            let code = match install_sigsys_handler().and_then(|()| apply(thread, prog.as_ref())) {
                Ok(()) => {
                    f();
                    0
                }
                Err(_) => 99,
            };
            // SAFETY: ends the child without running the parent's atexit
            // handlers or unwinding into the test harness.
            unsafe { libc::_exit(code) };
        }
        pid
    }

    fn wait_child(pid: libc::pid_t) -> libc::c_int {
        let mut status = 0;
        // SAFETY: `pid` is our child and `status` a live int.
        let waited = unsafe { libc::waitpid(pid, &mut status, 0) };
        assert_eq!(waited, pid);
        status
    }

    fn exit_status(status: libc::c_int) -> Option<i32> {
        libc::WIFEXITED(status).then(|| libc::WEXITSTATUS(status))
    }

    fn forbidden_syscall() {
        // uname is in no allowlist.
        // SAFETY: a raw system call with a null buffer fails with EFAULT at
        // worst; it does not touch our memory.
        unsafe { libc::syscall(libc::SYS_uname, 0usize) };
    }

    fn forbidden_ioctl() {
        // ioctl is allowed on the vCPU thread, but not KVM_CREATE_VM (0xae01).
        // SAFETY: the fd is invalid; the kernel would answer EBADF.
        unsafe { libc::syscall(libc::SYS_ioctl, -1, 0xae01usize, 0usize) };
    }

    fn allowed_ioctl() {
        // SAFETY: KVM_RUN on an invalid fd fails with EBADF, harmlessly.
        unsafe { libc::syscall(libc::SYS_ioctl, -1, KVM_RUN() as usize, 0usize) };
    }

    #[test]
    fn a_forbidden_call_ends_the_process_with_148() {
        for thread in [
            Thread::Vcpu,
            Thread::EventLoop,
            Thread::Api,
            Thread::Supervisor,
        ] {
            let status = in_filtered_child(thread, SeccompMode::On, forbidden_syscall);
            assert_eq!(
                exit_status(status),
                Some(BAD_SYSCALL_EXIT_STATUS),
                "{thread:?}"
            );
        }
    }

    #[test]
    fn ioctls_are_filtered_by_request_number() {
        let status = in_filtered_child(Thread::Vcpu, SeccompMode::On, forbidden_ioctl);
        assert_eq!(exit_status(status), Some(BAD_SYSCALL_EXIT_STATUS));
        let status = in_filtered_child(Thread::Vcpu, SeccompMode::On, allowed_ioctl);
        assert_eq!(exit_status(status), Some(0));
        // The event loop may not run the guest.
        let status = in_filtered_child(Thread::EventLoop, SeccompMode::On, allowed_ioctl);
        assert_eq!(exit_status(status), Some(BAD_SYSCALL_EXIT_STATUS));
    }

    /// A raw system call with integer arguments only.
    fn raw(nr: libc::c_long, a: [libc::c_long; 6]) {
        // SAFETY: every caller passes fd -1 and null or zero pointers, so
        // the kernel answers EBADF (or EFAULT) and touches no memory.
        unsafe { libc::syscall(nr, a[0], a[1], a[2], a[3], a[4], a[5]) };
    }

    /// The vsock device's socket calls with the arguments it uses, and
    /// nothing wider: no other socket family or type, no blocking socket,
    /// no other shutdown; none on a vCPU thread. The remover may unlink,
    /// and no other thread may.
    #[test]
    fn the_event_loop_may_serve_vsock_sockets_and_nothing_more() {
        const UNIX: libc::c_long = libc::AF_UNIX as _;
        const NB: libc::c_long = (libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC) as _;
        const STREAM: libc::c_long = libc::SOCK_STREAM as libc::c_long | NB;
        const WR: libc::c_long = libc::SHUT_WR as _;
        let allowed: &[fn()] = &[
            || raw(libc::SYS_accept4, [-1, 0, 0, NB, 0, 0]),
            || raw(libc::SYS_socket, [UNIX, STREAM, 0, 0, 0, 0]),
            || raw(libc::SYS_connect, [-1, 0, 0, 0, 0, 0]),
            || raw(libc::SYS_shutdown, [-1, WR, 0, 0, 0, 0]),
        ];
        for (i, f) in allowed.iter().enumerate() {
            let status = in_filtered_child(Thread::EventLoop, SeccompMode::On, *f);
            assert_eq!(exit_status(status), Some(0), "allowed call {i}");
        }
        let forbidden: &[fn()] = &[
            || raw(libc::SYS_accept4, [-1, 0, 0, 0, 0, 0]),
            || raw(libc::SYS_accept, [-1, 0, 0, 0, 0, 0]),
            || raw(libc::SYS_socket, [libc::AF_INET as _, STREAM, 0, 0, 0, 0]),
            || raw(libc::SYS_socket, [UNIX, libc::SOCK_STREAM as _, 0, 0, 0, 0]),
            || {
                raw(
                    libc::SYS_socket,
                    [UNIX, libc::SOCK_DGRAM as libc::c_long | NB, 0, 0, 0, 0],
                )
            },
            || raw(libc::SYS_shutdown, [-1, libc::SHUT_RDWR as _, 0, 0, 0, 0]),
            || raw(libc::SYS_recvfrom, [-1, 0, 0, 0, 0, 0]),
            || raw(libc::SYS_unlink, [0, 0, 0, 0, 0, 0]),
        ];
        for (i, f) in forbidden.iter().enumerate() {
            let status = in_filtered_child(Thread::EventLoop, SeccompMode::On, *f);
            assert_eq!(exit_status(status), Some(148), "forbidden call {i}");
        }
        let on_vcpu = || raw(libc::SYS_socket, [UNIX, STREAM, 0, 0, 0, 0]);
        let status = in_filtered_child(Thread::Vcpu, SeccompMode::On, on_vcpu);
        assert_eq!(exit_status(status), Some(148));
        let unlink = || raw(libc::SYS_unlink, [0, 0, 0, 0, 0, 0]);
        let status = in_filtered_child(Thread::Remover, SeccompMode::On, unlink);
        assert_eq!(exit_status(status), Some(0));
        let status = in_filtered_child(Thread::Remover, SeccompMode::On, on_vcpu);
        assert_eq!(exit_status(status), Some(148));
    }

    #[test]
    fn the_event_loop_may_serve_a_block_device_and_nothing_more() {
        const HOLE: libc::c_long = (libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE) as _;
        const ZERO: libc::c_long = (libc::FALLOC_FL_ZERO_RANGE | libc::FALLOC_FL_KEEP_SIZE) as _;
        const GETEVENTS: libc::c_long = IORING_ENTER_GETEVENTS as _;
        let allowed: &[fn()] = &[
            || raw(libc::SYS_fallocate, [-1, HOLE, 0, 512, 0, 0]),
            || raw(libc::SYS_fallocate, [-1, ZERO, 0, 512, 0, 0]),
            || raw(libc::SYS_preadv, [-1, 0, 0, 0, 0, 0]),
            || raw(libc::SYS_pwritev, [-1, 0, 0, 0, 0, 0]),
            || raw(libc::SYS_pread64, [-1, 0, 0, 0, 0, 0]),
            || raw(libc::SYS_pwrite64, [-1, 0, 0, 0, 0, 0]),
            || raw(libc::SYS_fdatasync, [-1, 0, 0, 0, 0, 0]),
            || raw(libc::SYS_io_uring_enter, [-1, 0, 0, 0, 0, 0]),
            || raw(libc::SYS_io_uring_enter, [-1, 0, 1, GETEVENTS, 0, 0]),
        ];
        for f in allowed {
            let status = in_filtered_child(Thread::EventLoop, SeccompMode::On, *f);
            assert_eq!(exit_status(status), Some(0));
        }
        let forbidden: &[fn()] = &[
            // Growing the image (mode 0), a hole that changes the size.
            || raw(libc::SYS_fallocate, [-1, 0, 0, 512, 0, 0]),
            || {
                raw(
                    libc::SYS_fallocate,
                    [-1, libc::FALLOC_FL_PUNCH_HOLE as _, 0, 512, 0, 0],
                )
            },
            // io_uring_enter with another flag (IORING_ENTER_SQ_WAKEUP).
            || raw(libc::SYS_io_uring_enter, [-1, 0, 0, 2, 0, 0]),
        ];
        for f in forbidden {
            let status = in_filtered_child(Thread::EventLoop, SeccompMode::On, *f);
            assert_eq!(exit_status(status), Some(BAD_SYSCALL_EXIT_STATUS));
        }
        // A vCPU thread waits for a block reset's requests, and reads or
        // writes no image itself.
        let status = in_filtered_child(Thread::Vcpu, SeccompMode::On, || {
            raw(libc::SYS_io_uring_enter, [-1, 0, 1, GETEVENTS, 0, 0])
        });
        assert_eq!(exit_status(status), Some(0));
        let status = in_filtered_child(Thread::Vcpu, SeccompMode::On, || {
            raw(libc::SYS_preadv, [-1, 0, 0, 0, 0, 0])
        });
        assert_eq!(exit_status(status), Some(BAD_SYSCALL_EXIT_STATUS));
        let status = in_filtered_child(Thread::Vcpu, SeccompMode::On, || {
            raw(libc::SYS_pread64, [-1, 0, 0, 0, 0, 0])
        });
        assert_eq!(exit_status(status), Some(BAD_SYSCALL_EXIT_STATUS));
    }

    #[test]
    fn a_snapshot_reads_kvm_state_and_creates_its_files_and_nothing_more() {
        // On fd -1 every ioctl fails with EBADF after the filter let it by;
        // the open of an empty path fails with ENOENT the same way.
        const CREATE: libc::c_long =
            (libc::O_WRONLY | libc::O_CREAT | libc::O_TRUNC | libc::O_CLOEXEC) as _;
        let on_loop: &[fn()] = &[
            || raw(libc::SYS_ioctl, [-1, KVM_GET_IRQCHIP() as _, 0, 0, 0, 0]),
            || raw(libc::SYS_ioctl, [-1, KVM_GET_PIT2() as _, 0, 0, 0, 0]),
            || raw(libc::SYS_ioctl, [-1, KVM_GET_CLOCK() as _, 0, 0, 0, 0]),
            || raw(libc::SYS_ioctl, [-1, KVM_GET_DIRTY_LOG() as _, 0, 0, 0, 0]),
            || raw(libc::SYS_ftruncate, [-1, 0, 0, 0, 0, 0]),
            || {
                raw(
                    libc::SYS_openat,
                    [libc::AT_FDCWD as _, c"".as_ptr() as _, CREATE, 0o600, 0, 0],
                )
            },
        ];
        for f in on_loop {
            let status = in_child_in(Thread::EventLoop, test_ctx(false), *f);
            assert_eq!(exit_status(status), Some(0));
        }
        // A parked vCPU reads every piece of its state, without the PVM
        // recoveries' entries too.
        let status = in_child_in(Thread::Vcpu, test_ctx(false), || {
            for nr in vcpu_state_reads() {
                raw(libc::SYS_ioctl, [-1, nr as _, 0, 0, 0, 0]);
            }
        });
        assert_eq!(exit_status(status), Some(0));
        let forbidden: &[(Thread, fn())] = &[
            // Opened for reading or appending, or as a path: not a snapshot's.
            (Thread::EventLoop, || {
                raw(
                    libc::SYS_openat,
                    [
                        libc::AT_FDCWD as _,
                        c"".as_ptr() as _,
                        libc::O_RDONLY as _,
                        0,
                        0,
                        0,
                    ],
                )
            }),
            (Thread::EventLoop, || {
                let flags = (libc::O_WRONLY | libc::O_CREAT | libc::O_APPEND | libc::O_CLOEXEC)
                    as libc::c_long;
                raw(
                    libc::SYS_openat,
                    [libc::AT_FDCWD as _, c"".as_ptr() as _, flags, 0, 0, 0],
                )
            }),
            // The loop reads no vCPU's state, a vCPU no VM's, and neither
            // sets any.
            (Thread::EventLoop, || {
                raw(libc::SYS_ioctl, [-1, KVM_GET_SREGS() as _, 0, 0, 0, 0])
            }),
            (Thread::Vcpu, || {
                raw(libc::SYS_ioctl, [-1, KVM_GET_IRQCHIP() as _, 0, 0, 0, 0])
            }),
            (Thread::Vcpu, || {
                raw(libc::SYS_ioctl, [-1, KVM_GET_DIRTY_LOG() as _, 0, 0, 0, 0])
            }),
            (Thread::Vcpu, || {
                raw(libc::SYS_ftruncate, [-1, 0, 0, 0, 0, 0])
            }),
            (Thread::Vcpu, || {
                raw(
                    libc::SYS_openat,
                    [libc::AT_FDCWD as _, c"".as_ptr() as _, CREATE, 0, 0, 0],
                )
            }),
            (Thread::Api, || {
                raw(libc::SYS_ioctl, [-1, KVM_GET_CLOCK() as _, 0, 0, 0, 0])
            }),
        ];
        for (thread, f) in forbidden {
            let status = in_child_in(*thread, test_ctx(false), *f);
            assert_eq!(exit_status(status), Some(BAD_SYSCALL_EXIT_STATUS));
        }
    }

    #[test]
    fn the_event_loop_may_make_a_limiter_timer_and_kick_vcpus_and_nothing_more() {
        const FLAGS: libc::c_long = (libc::TFD_CLOEXEC | libc::TFD_NONBLOCK) as _;
        const MONO: libc::c_long = libc::CLOCK_MONOTONIC as _;
        let allowed: &[fn()] = &[
            || raw(libc::SYS_timerfd_create, [MONO, FLAGS, 0, 0, 0, 0]),
            // tid -1 is refused (EINVAL) before any lookup: no signal sent.
            || raw(libc::SYS_tgkill, [TEST_PID, -1, kick(), 0, 0, 0]),
            || raw(libc::SYS_getpid, [0; 6]),
        ];
        for f in allowed {
            let status = in_child_in(Thread::EventLoop, test_ctx(false), *f);
            assert_eq!(exit_status(status), Some(0));
        }
        let forbidden: &[fn()] = &[
            // A blocking timer, another clock, another signal.
            || {
                raw(
                    libc::SYS_timerfd_create,
                    [MONO, libc::TFD_CLOEXEC as _, 0, 0, 0, 0],
                )
            },
            || {
                raw(
                    libc::SYS_timerfd_create,
                    [libc::CLOCK_REALTIME as _, FLAGS, 0, 0, 0, 0],
                )
            },
            || {
                raw(
                    libc::SYS_tgkill,
                    [TEST_PID, -1, libc::SIGKILL as _, 0, 0, 0],
                )
            },
            // The kick to a thread group that is not minivmm's.
            || raw(libc::SYS_tgkill, [TEST_PID + 1, -1, kick(), 0, 0, 0]),
            || raw(libc::SYS_tgkill, [1, -1, kick(), 0, 0, 0]),
        ];
        for f in forbidden {
            let status = in_child_in(Thread::EventLoop, test_ctx(false), *f);
            assert_eq!(exit_status(status), Some(BAD_SYSCALL_EXIT_STATUS));
        }
        // A vCPU neither makes timers nor kicks.
        let status = in_filtered_child(Thread::Vcpu, SeccompMode::On, || {
            raw(libc::SYS_timerfd_create, [MONO, FLAGS, 0, 0, 0, 0])
        });
        assert_eq!(exit_status(status), Some(BAD_SYSCALL_EXIT_STATUS));
    }

    /// The pid the tests' contexts name: the filter compares the number
    /// only, and `tgkill` with tid -1 fails before it looks the pid up.
    const TEST_PID: libc::c_long = 4242;

    fn test_ctx(pvm_recoveries: bool) -> Context {
        Context {
            pid: TEST_PID as u32,
            pvm_recoveries,
        }
    }

    fn kick() -> libc::c_long {
        crate::kvm::pause::kick_signal() as _
    }

    /// The real kick, as `PATCH /vm` sends it (`pthread_kill`, which asks
    /// `getpid` for the thread group), from a thread under the event loop's
    /// filter compiled for this process: allowed, and delivered.
    #[test]
    fn the_event_loop_kicks_a_thread_of_its_own_process() {
        use std::sync::atomic::AtomicUsize;
        use vmm_sys_util::signal::{register_signal_handler, Killable};
        static KICKED: AtomicUsize = AtomicUsize::new(0);
        extern "C" fn count(_: libc::c_int, _: *mut libc::siginfo_t, _: *mut libc::c_void) {
            KICKED.fetch_add(1, Ordering::SeqCst);
        }
        register_signal_handler(crate::kvm::pause::kick_signal(), count).unwrap();
        let stop = std::sync::Arc::new(AtomicBool::new(false));
        let s = stop.clone();
        let target = std::thread::spawn(move || {
            while !s.load(Ordering::SeqCst) {
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
        });
        install_sigsys_handler().unwrap();
        let prog = Filters::new(SeccompMode::On)
            .unwrap()
            .for_vm(false)
            .unwrap()
            .event_loop;
        let target = std::thread::spawn(move || {
            apply(Thread::EventLoop, prog.as_ref()).unwrap();
            target.kill(crate::kvm::pause::kick_signal()).unwrap();
            target
        })
        .join()
        .unwrap();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while KICKED.load(Ordering::SeqCst) == 0 {
            assert!(std::time::Instant::now() < deadline, "the kick never came");
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        stop.store(true, Ordering::SeqCst);
        target.join().unwrap();
    }

    #[test]
    fn a_vm_filter_names_this_process_and_its_recoveries() {
        let ctx = Context::current(true);
        assert_eq!(ctx.pid, std::process::id());
        assert!(ctx.pvm_recoveries);
        assert!(!Context::current(false).pvm_recoveries);
        let all = Filters::new(SeccompMode::On).unwrap();
        assert!(all.vcpu.is_some() && all.event_loop.is_some() && all.api.is_some());
        let vm = all.for_vm(false).unwrap();
        assert_eq!(vm.mode, SeccompMode::On);
        assert_eq!(vm.api, all.api);
        assert_eq!(
            vm.vcpu,
            filter_in(Thread::Vcpu, SeccompMode::On, &Context::current(false)).unwrap()
        );
        assert_ne!(vm.vcpu, all.vcpu, "the recoveries' ioctls are still in");
        assert_eq!(all.for_vm(true).unwrap().vcpu, all.vcpu);
        let off = Filters::new(SeccompMode::Off)
            .unwrap()
            .for_vm(true)
            .unwrap();
        assert_eq!(off.mode, SeccompMode::Off);
        assert!(off.vcpu.is_none() && off.event_loop.is_none() && off.api.is_none());
        let log = Filters::new(SeccompMode::Log)
            .unwrap()
            .for_vm(false)
            .unwrap();
        assert_eq!(log.mode, SeccompMode::Log);
        assert!(log.event_loop.is_some());
    }

    #[test]
    fn the_pvm_recoveries_calls_are_allowed_only_with_the_recoveries() {
        fn ioctl(request: u64) {
            // SAFETY: an invalid fd: the kernel answers EBADF.
            unsafe { libc::syscall(libc::SYS_ioctl, -1, request, 0usize) };
        }
        // (KVM_GET_VCPU_EVENTS, which the recovery also reads, is allowed
        // everywhere: a snapshot reads it.)
        let recoveries: &[fn()] = &[|| ioctl(KVM_SET_REGS()), || ioctl(KVM_SET_VCPU_EVENTS())];
        for (i, f) in recoveries.iter().enumerate() {
            let with = in_child_in(Thread::Vcpu, test_ctx(true), *f);
            assert_eq!(exit_status(with), Some(0), "ioctl {i} with the recoveries");
            let without = in_child_in(Thread::Vcpu, test_ctx(false), *f);
            assert_eq!(
                exit_status(without),
                Some(BAD_SYSCALL_EXIT_STATUS),
                "ioctl {i} without the recoveries"
            );
        }
        // Every host: running the guest, reporting a failure's RIP, and
        // the net device's offloads.
        let always: &[fn()] = &[
            || ioctl(KVM_RUN()),
            || ioctl(KVM_GET_REGS()),
            || ioctl(KVM_GET_VCPU_EVENTS()),
            || ioctl(ioctl_nr(libc::TUNSETOFFLOAD)),
        ];
        for (i, f) in always.iter().enumerate() {
            let status = in_child_in(Thread::Vcpu, test_ctx(false), *f);
            assert_eq!(exit_status(status), Some(0), "ioctl {i}");
        }
    }

    const RW: libc::c_long = (libc::PROT_READ | libc::PROT_WRITE) as _;
    const RX: libc::c_long = (libc::PROT_READ | libc::PROT_EXEC) as _;
    const ANON: libc::c_long = (libc::MAP_PRIVATE | libc::MAP_ANONYMOUS) as _;
    const NORESERVE: libc::c_long = libc::MAP_NORESERVE as _;

    /// A raw `mmap` of one page (the child leaks it; it ends at once).
    fn map(prot: libc::c_long, flags: libc::c_long, fd: libc::c_long) {
        raw(libc::SYS_mmap, [0, 4096, prot, flags, fd, 0]);
    }

    #[test]
    fn every_thread_maps_data_and_never_code() {
        let allowed: &[fn()] = &[
            || map(RW, ANON, -1),
            || map(libc::PROT_NONE as _, ANON | NORESERVE, -1),
            || map(libc::PROT_READ as _, ANON, -1),
            // An arena growing into its reservation: mprotect on an address
            // that is not mapped fails (ENOMEM) after the filter let it by.
            || raw(libc::SYS_mprotect, [0, 4096, RW, 0, 0, 0]),
            || raw(libc::SYS_mprotect, [0, 4096, libc::PROT_NONE as _, 0, 0, 0]),
        ];
        let forbidden: &[fn()] = &[
            // Code: executable memory mapped or made so.
            || map(RX, ANON, -1),
            || {
                map(
                    (libc::PROT_EXEC | libc::PROT_READ | libc::PROT_WRITE) as _,
                    ANON,
                    -1,
                )
            },
            || map(libc::PROT_EXEC as _, ANON | NORESERVE, -1),
            || raw(libc::SYS_mprotect, [0, 4096, RX, 0, 0, 0]),
            || raw(libc::SYS_mprotect, [0, 4096, libc::PROT_EXEC as _, 0, 0, 0]),
            // A file or shared memory mapped (fd 0 is whatever stdin is).
            || map(libc::PROT_READ as _, libc::MAP_PRIVATE as _, 0),
            || map(RW, (libc::MAP_SHARED | libc::MAP_ANONYMOUS) as _, -1),
            || map(RW, ANON | libc::MAP_FIXED as libc::c_long, -1),
        ];
        for thread in [Thread::Vcpu, Thread::EventLoop, Thread::Api] {
            for (i, f) in allowed.iter().enumerate() {
                let status = in_filtered_child(thread, SeccompMode::On, *f);
                assert_eq!(exit_status(status), Some(0), "{thread:?}: allowed {i}");
            }
            for (i, f) in forbidden.iter().enumerate() {
                let status = in_filtered_child(thread, SeccompMode::On, *f);
                assert_eq!(
                    exit_status(status),
                    Some(BAD_SYSCALL_EXIT_STATUS),
                    "{thread:?}: forbidden {i}"
                );
            }
        }
    }

    /// A raw `futex` on a null address: the kernel answers EFAULT (or
    /// EINVAL, ENOSYS for an operation it does not know) without waiting.
    fn futex(op: libc::c_int) {
        raw(libc::SYS_futex, [0, op as _, 0, 0, 0, 0]);
    }

    #[test]
    fn every_thread_may_use_the_private_futex_operations_only() {
        let allowed: &[fn()] = &[
            || futex(libc::FUTEX_WAIT_BITSET | libc::FUTEX_PRIVATE_FLAG),
            || futex(libc::FUTEX_WAKE | libc::FUTEX_PRIVATE_FLAG),
            || futex(libc::FUTEX_WAIT | libc::FUTEX_PRIVATE_FLAG),
        ];
        let forbidden: &[fn()] = &[
            // Shared futexes, requeues, PI, a realtime-clock deadline.
            || futex(libc::FUTEX_WAIT),
            || futex(libc::FUTEX_WAKE),
            || futex(libc::FUTEX_WAIT_BITSET),
            || futex(libc::FUTEX_CMP_REQUEUE | libc::FUTEX_PRIVATE_FLAG),
            || futex(libc::FUTEX_REQUEUE | libc::FUTEX_PRIVATE_FLAG),
            || futex(libc::FUTEX_WAKE_OP | libc::FUTEX_PRIVATE_FLAG),
            || futex(libc::FUTEX_LOCK_PI | libc::FUTEX_PRIVATE_FLAG),
            || {
                futex(
                    libc::FUTEX_WAIT_BITSET | libc::FUTEX_PRIVATE_FLAG | libc::FUTEX_CLOCK_REALTIME,
                )
            },
        ];
        for thread in [Thread::Vcpu, Thread::EventLoop, Thread::Api] {
            for (i, f) in allowed.iter().enumerate() {
                let status = in_filtered_child(thread, SeccompMode::On, *f);
                assert_eq!(exit_status(status), Some(0), "{thread:?}: allowed {i}");
            }
            for (i, f) in forbidden.iter().enumerate() {
                let status = in_filtered_child(thread, SeccompMode::On, *f);
                assert_eq!(
                    exit_status(status),
                    Some(BAD_SYSCALL_EXIT_STATUS),
                    "{thread:?}: forbidden {i}"
                );
            }
        }
    }

    /// The futex word the stopped children wait on (never woken: each
    /// wait ends at its time-out).
    static WAIT_WORD: u32 = 0;

    /// What std's timed waits do (`recv_timeout`, `Condvar::wait_timeout`):
    /// a private futex wait with a deadline, here 500 ms from now.
    fn timed_futex_wait() {
        let ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: 500_000_000,
        };
        // SAFETY: the word is a static that outlives the call, `ts` a live
        // timespec; the wait ends at its time-out (nobody wakes the word).
        unsafe {
            libc::syscall(
                libc::SYS_futex,
                &WAIT_WORD as *const u32,
                libc::FUTEX_WAIT | libc::FUTEX_PRIVATE_FLAG,
                0u32,
                &ts as *const libc::timespec,
            )
        };
    }

    /// What `thread::sleep` does: 500 ms of `clock_nanosleep`.
    fn nanosleep() {
        let ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: 500_000_000,
        };
        // SAFETY: `ts` is a live timespec; no remainder is asked for.
        unsafe {
            libc::syscall(
                libc::SYS_clock_nanosleep,
                libc::CLOCK_MONOTONIC,
                0,
                &ts as *const libc::timespec,
                std::ptr::null_mut::<libc::timespec>(),
            )
        };
    }

    /// Field `n` (1-based, after the command's parentheses) of
    /// `/proc/<pid>/stat`, or "" once it is gone.
    fn proc_stat_field(pid: libc::pid_t, n: usize) -> String {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        stat.rsplit_once(") ")
            .and_then(|(_, rest)| rest.split_whitespace().nth(n - 3))
            .unwrap_or_default()
            .to_string()
    }

    /// Stops `pid` with SIGSTOP while it sits in the system call `nr`, and
    /// continues it once the kernel shows it stopped.
    fn stop_and_continue_inside(pid: libc::pid_t, nr: libc::c_long) {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        let inside = format!("{nr} ");
        while !std::fs::read_to_string(format!("/proc/{pid}/syscall"))
            .unwrap_or_default()
            .starts_with(&inside)
        {
            assert!(
                std::time::Instant::now() < deadline,
                "the child never waited"
            );
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        // SAFETY: `pid` is our own child, still running (not reaped).
        unsafe { libc::kill(pid, libc::SIGSTOP) };
        while proc_stat_field(pid, 3) != "T" {
            assert!(
                std::time::Instant::now() < deadline,
                "the child never stopped"
            );
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        // SAFETY: as above.
        unsafe { libc::kill(pid, libc::SIGCONT) };
    }

    /// SIGSTOP and SIGCONT (what an operator, a cgroup freezer or a
    /// debugger does) while a thread of every kind sits in a timed wait:
    /// the kernel resumes the wait with `restart_syscall`, which every list
    /// allows. Before it did, each of these children ended with 148.
    #[test]
    fn a_thread_stopped_and_continued_in_a_timed_wait_carries_on() {
        let waits: [(libc::c_long, fn()); 2] = [
            (libc::SYS_futex, timed_futex_wait),
            (libc::SYS_clock_nanosleep, nanosleep),
        ];
        for thread in [Thread::Vcpu, Thread::EventLoop, Thread::Api] {
            for (nr, wait) in waits {
                // Only a vCPU sleeps (an AP's back-off).
                if nr == libc::SYS_clock_nanosleep && thread != Thread::Vcpu {
                    continue;
                }
                let pid = spawn_child_under(thread, filter(thread, SeccompMode::On).unwrap(), wait);
                stop_and_continue_inside(pid, nr);
                let status = wait_child(pid);
                assert_eq!(exit_status(status), Some(0), "{thread:?} in call {nr}");
            }
        }
    }

    #[test]
    fn every_thread_may_restart_a_system_call() {
        for thread in [Thread::Vcpu, Thread::EventLoop, Thread::Api] {
            // With nothing to restart the kernel answers EINTR.
            let status = in_filtered_child(thread, SeccompMode::On, || {
                raw(libc::SYS_restart_syscall, [0; 6])
            });
            assert_eq!(exit_status(status), Some(0), "{thread:?}");
        }
    }

    #[test]
    fn the_jail_supervisor_may_wait_and_signal_and_nothing_more() {
        // The signals go to pid INT_MAX, which no process has: the calls
        // fail with ESRCH, harmlessly, once the filter let them through.
        let allowed: &[fn()] = &[
            || raw(libc::SYS_rt_sigtimedwait, [0, 0, 0, 8, 0, 0]),
            || raw(libc::SYS_wait4, [-1, 0, libc::WNOHANG as _, 0, 0, 0]),
            || {
                raw(
                    libc::SYS_kill,
                    [i32::MAX as _, libc::SIGTERM as _, 0, 0, 0, 0],
                )
            },
            || {
                raw(
                    libc::SYS_kill,
                    [i32::MAX as _, libc::SIGINT as _, 0, 0, 0, 0],
                )
            },
            || {
                raw(
                    libc::SYS_kill,
                    [i32::MAX as _, libc::SIGUSR1 as _, 0, 0, 0, 0],
                )
            },
            || {
                raw(
                    libc::SYS_kill,
                    [i32::MAX as _, libc::SIGKILL as _, 0, 0, 0, 0],
                )
            },
        ];
        for f in allowed {
            let status = in_filtered_child(Thread::Supervisor, SeccompMode::On, *f);
            assert_eq!(exit_status(status), Some(0));
        }
        // No other signal, no file, no process, no KVM.
        let forbidden: &[fn()] = &[
            || {
                raw(
                    libc::SYS_kill,
                    [i32::MAX as _, libc::SIGSTOP as _, 0, 0, 0, 0],
                )
            },
            || {
                raw(
                    libc::SYS_tgkill,
                    [i32::MAX as _, 1, libc::SIGTERM as _, 0, 0, 0],
                )
            },
            || raw(libc::SYS_openat, [-1, 0, 0, 0, 0, 0]),
            || raw(libc::SYS_clone, [0, 0, 0, 0, 0, 0]),
            || raw(libc::SYS_ioctl, [-1, KVM_RUN() as _, 0, 0, 0, 0]),
            || raw(libc::SYS_setuid, [0, 0, 0, 0, 0, 0]),
        ];
        for f in forbidden {
            let status = in_filtered_child(Thread::Supervisor, SeccompMode::On, *f);
            assert_eq!(exit_status(status), Some(BAD_SYSCALL_EXIT_STATUS));
        }
    }

    #[test]
    fn the_api_thread_may_serve_a_socket_and_nothing_more() {
        let allowed: &[fn()] = &[
            || raw(libc::SYS_accept4, [-1, 0, 0, 0, 0, 0]),
            || raw(libc::SYS_recvfrom, [-1, 0, 0, 0, 0, 0]),
            || raw(libc::SYS_sendto, [-1, 0, 0, 0, 0, 0]),
            || raw(libc::SYS_epoll_wait, [-1, 0, 0, 0, 0, 0]),
            || raw(libc::SYS_ioctl, [-1, libc::FIONBIO as _, 0, 0, 0, 0]),
            || raw(libc::SYS_shutdown, [-1, libc::SHUT_WR as _, 0, 0, 0, 0]),
        ];
        for f in allowed {
            let status = in_filtered_child(Thread::Api, SeccompMode::On, *f);
            assert_eq!(exit_status(status), Some(0));
        }
        // Not KVM, not a file opened otherwise than an image, not a new
        // socket, not the block device's calls.
        let forbidden: &[fn()] = &[
            || raw(libc::SYS_ioctl, [-1, KVM_RUN() as _, 0, 0, 0, 0]),
            || raw(libc::SYS_openat, [-1, 0, 0, 0, 0, 0]),
            || raw(libc::SYS_socket, [-1, 0, 0, 0, 0, 0]),
            || raw(libc::SYS_preadv, [-1, 0, 0, 0, 0, 0]),
            || raw(libc::SYS_shutdown, [-1, libc::SHUT_RDWR as _, 0, 0, 0, 0]),
        ];
        for f in forbidden {
            let status = in_filtered_child(Thread::Api, SeccompMode::On, *f);
            assert_eq!(exit_status(status), Some(BAD_SYSCALL_EXIT_STATUS));
        }
    }

    /// `PATCH /drives`: the API thread opens and locks the new image.
    #[test]
    fn the_api_thread_may_open_and_lock_a_disk_image_and_nothing_more() {
        const CWD: libc::c_long = libc::AT_FDCWD as _;
        const EMPTY: libc::c_long = libc::AT_EMPTY_PATH as _;
        const RO: libc::c_long = (libc::O_RDONLY | libc::O_NONBLOCK | libc::O_CLOEXEC) as _;
        const RW: libc::c_long = (libc::O_RDWR | libc::O_NONBLOCK | libc::O_CLOEXEC) as _;
        const SETFL: libc::c_long = libc::F_SETFL as _;
        // A path that does not exist: ENOENT, nothing opened.
        fn missing() -> libc::c_long {
            c"/nonexistent/minivmm-seccomp".as_ptr() as _
        }
        let allowed: &[fn()] = &[
            || raw(libc::SYS_openat, [CWD, missing(), RO, 0, 0, 0]),
            || raw(libc::SYS_openat, [CWD, missing(), RW, 0, 0, 0]),
            || raw(libc::SYS_statx, [-1, 0, EMPTY, 0, 0, 0]),
            || raw(libc::SYS_newfstatat, [-1, 0, 0, EMPTY, 0, 0]),
            || raw(libc::SYS_fstat, [-1, 0, 0, 0, 0, 0]),
            || raw(libc::SYS_fcntl, [-1, SETFL, 0, 0, 0, 0]),
            || {
                raw(
                    libc::SYS_flock,
                    [-1, (libc::LOCK_SH | libc::LOCK_NB) as _, 0, 0, 0, 0],
                )
            },
            || {
                raw(
                    libc::SYS_flock,
                    [-1, (libc::LOCK_EX | libc::LOCK_NB) as _, 0, 0, 0, 0],
                )
            },
            || raw(libc::SYS_close, [-1, 0, 0, 0, 0, 0]),
        ];
        for (i, f) in allowed.iter().enumerate() {
            let status = in_filtered_child(Thread::Api, SeccompMode::On, *f);
            assert_eq!(exit_status(status), Some(0), "allowed call {i}");
        }
        let forbidden: &[fn()] = &[
            // Creating, truncating, a blocking open, a directory opened.
            || {
                raw(
                    libc::SYS_openat,
                    [
                        CWD,
                        missing(),
                        (libc::O_CREAT | libc::O_WRONLY) as _,
                        0o600,
                        0,
                        0,
                    ],
                )
            },
            || {
                raw(
                    libc::SYS_openat,
                    [CWD, missing(), RW | libc::O_TRUNC as libc::c_long, 0, 0, 0],
                )
            },
            || {
                raw(
                    libc::SYS_openat,
                    [CWD, missing(), libc::O_RDWR as _, 0, 0, 0],
                )
            },
            || {
                raw(
                    libc::SYS_openat,
                    [
                        CWD,
                        missing(),
                        RO | libc::O_DIRECTORY as libc::c_long,
                        0,
                        0,
                        0,
                    ],
                )
            },
            // A path looked at without opening it.
            || raw(libc::SYS_statx, [CWD, missing(), 0, 0, 0, 0]),
            || raw(libc::SYS_newfstatat, [CWD, missing(), 0, 0, 0, 0]),
            // Other file flags, record locks, a lock that waits.
            || raw(libc::SYS_fcntl, [-1, SETFL, libc::O_APPEND as _, 0, 0, 0]),
            || raw(libc::SYS_fcntl, [-1, libc::F_SETLK as _, 0, 0, 0, 0]),
            || raw(libc::SYS_flock, [-1, libc::LOCK_EX as _, 0, 0, 0, 0]),
            // Writing to or probing an image is the event loop's.
            || raw(libc::SYS_pwritev, [-1, 0, 0, 0, 0, 0]),
            || {
                raw(
                    libc::SYS_fallocate,
                    [
                        -1,
                        (libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE) as _,
                        0,
                        1,
                        0,
                        0,
                    ],
                )
            },
            || raw(libc::SYS_unlinkat, [CWD, missing(), 0, 0, 0, 0]),
        ];
        for (i, f) in forbidden.iter().enumerate() {
            let status = in_filtered_child(Thread::Api, SeccompMode::On, *f);
            assert_eq!(
                exit_status(status),
                Some(BAD_SYSCALL_EXIT_STATUS),
                "forbidden call {i}"
            );
        }
        // The event loop opens no file, not even an image.
        let status = in_filtered_child(Thread::EventLoop, SeccompMode::On, || {
            raw(libc::SYS_openat, [CWD, missing(), RW, 0, 0, 0])
        });
        assert_eq!(exit_status(status), Some(BAD_SYSCALL_EXIT_STATUS));
    }

    /// The console's output to a file (`PUT /serial`), through its rate
    /// limiter, is written by a vCPU thread: the UART's bytes, a line at a
    /// time, the limiter's clock and the drops, under the vCPU's real
    /// filter (a call its list misses would end this test process with 148).
    #[test]
    fn the_consoles_file_output_and_limiter_run_under_the_vcpu_filter() {
        use std::io::Write;
        let path =
            std::env::temp_dir().join(format!("minivmm-seccomp-serial-{}", std::process::id()));
        let _ = std::fs::remove_file(&path);
        let bucket = devices::rate_limiter::TokenBucketConfig {
            size: 64,
            one_time_burst: 0,
            refill_time: 60_000,
        };
        let mut out = crate::serial_out::SerialOut::open(Some(&path), Some(&bucket)).unwrap();
        install_sigsys_handler().unwrap();
        let prog = filter_in(Thread::Vcpu, SeccompMode::On, &Context::current(false)).unwrap();
        let dropped = std::thread::spawn(move || {
            apply(Thread::Vcpu, prog.as_ref()).unwrap();
            for b in b"console line\n".iter().chain(&[b'x'; 100]) {
                out.write_all(&[*b]).unwrap();
            }
            out.flush().unwrap();
            out.dropped_bytes()
        })
        .join()
        .unwrap();
        let text = std::fs::read(&path).unwrap();
        assert!(text.starts_with(b"console line\n"), "{text:?}");
        assert_eq!(text.len(), 64);
        assert_eq!(dropped, 13 + 100 - 64);
        std::fs::remove_file(&path).unwrap();
    }

    /// The API thread's real open of an image, under its real filter: every
    /// outcome (opened, locked, missing, a directory, read-only), so that no
    /// path of std or glibc makes a call the list misses (which would end
    /// this test process with status 148).
    #[test]
    fn the_api_threads_image_open_runs_under_its_filter() {
        use crate::api::command::{open_image, OpenedImage};
        let dir = std::env::temp_dir().join(format!("minivmm-seccomp-img-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let image = dir.join("a.img");
        let held = dir.join("held.img");
        for p in [&image, &held] {
            std::fs::write(p, vec![0u8; 4096]).unwrap();
        }
        let _lock = devices::virtio::block::FileBackend::open(&held, false).unwrap();
        install_sigsys_handler().unwrap();
        let prog = filter(Thread::Api, SeccompMode::On).unwrap();
        let paths = (image.clone(), held.clone(), dir.clone());
        let outcomes = std::thread::spawn(move || {
            apply(Thread::Api, prog.as_ref()).unwrap();
            let (image, held, dir) = paths;
            let describe = |o: OpenedImage| match o {
                OpenedImage::Image(b) => format!("image {}", b.id().ino),
                OpenedImage::Locked { size, .. } => format!("locked {size}"),
                OpenedImage::Failed(e) => format!("failed {e}"),
            };
            [
                describe(open_image(&image, false)),
                describe(open_image(&image, true)),
                describe(open_image(&held, false)),
                describe(open_image(&dir.join("missing.img"), false)),
                describe(open_image(&dir, false)),
                describe(open_image(&dir, true)),
            ]
        })
        .join()
        .unwrap();
        use std::os::unix::fs::MetadataExt;
        let ino = std::fs::metadata(&image).unwrap().ino();
        assert_eq!(outcomes[0], format!("image {ino}"));
        assert_eq!(outcomes[1], format!("image {ino}"));
        assert_eq!(outcomes[2], "locked 4096");
        assert!(outcomes[3].contains("No such file"), "{}", outcomes[3]);
        assert!(
            outcomes[4].contains("not a regular file"),
            "{}",
            outcomes[4]
        );
        assert!(
            outcomes[5].contains("not a regular file"),
            "{}",
            outcomes[5]
        );
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// The event loop's half of `PATCH /drives` (probing and swapping in the
    /// image the API thread opened, a new limiter) under its real filter.
    #[test]
    fn the_event_loops_half_of_a_drive_patch_runs_under_its_filter() {
        use crate::api::command::open_image;
        use crate::api::runtime::drive_tests::{patch, reply, runtime, Scratch};
        use serde_json::json;
        let dir = Scratch::new("seccomp");
        let (a, b) = (dir.image("a.img", 8), dir.image("b.img", 16));
        let mut rt = runtime(&[("rootfs", &a, false)]);
        let body = json!({"drive_id": "rootfs", "path_on_host": b,
                          "rate_limiter": {"ops": {"size": 5, "refill_time": 100}}});
        let image = open_image(&b, false);
        install_sigsys_handler().unwrap();
        let prog = filter(Thread::EventLoop, SeccompMode::On).unwrap();
        let (rt, status) = std::thread::spawn(move || {
            apply(Thread::EventLoop, prog.as_ref()).unwrap();
            let status = reply(rt.serve(patch("rootfs", body), Some(image))).status;
            (rt, status)
        })
        .join()
        .unwrap();
        assert_eq!(status, 204);
        assert_eq!(rt.config().drives[0].device.path, b);
    }

    /// The exit's last metrics line into a FIFO whose reader stalled, under
    /// the event loop's real filter: nothing may wait there (a sleep ended
    /// minivmm with 148 on SIGTERM), and what the FIFO did not take is
    /// counted.
    #[test]
    fn the_exit_flush_into_a_stalled_fifo_runs_under_the_event_loops_filter() {
        let p = std::env::temp_dir().join(format!("minivmm-seccomp-fifo-{}", std::process::id()));
        let _ = std::fs::remove_file(&p);
        assert!(std::process::Command::new("mkfifo")
            .arg(&p)
            .status()
            .unwrap()
            .success());
        let mut m = crate::metrics::Metrics::open(&p).unwrap();
        let _stalled_reader = std::fs::File::open(&p).unwrap();
        // Far more than the pipe holds: lines wait for the reader.
        for _ in 0..1000 {
            m.flush();
        }
        install_sigsys_handler().unwrap();
        let prog = Filters::new(SeccompMode::On)
            .unwrap()
            .for_vm(false)
            .unwrap()
            .event_loop;
        let lost = std::thread::spawn(move || {
            apply(Thread::EventLoop, prog.as_ref()).unwrap();
            m.finish()
        })
        .join()
        .unwrap();
        assert!(lost >= 2, "{lost}");
        std::fs::remove_file(&p).unwrap();
    }

    /// The entropy device's pass on the event loop (a request filled from
    /// getrandom, its interrupt) under the loop's real filter, and the one
    /// call it adds allowed with GRND_NONBLOCK only.
    #[test]
    fn the_entropy_devices_pass_runs_under_the_event_loops_filter() {
        use devices::virtio::rng::{Rng, RngConfig};
        use devices::virtio::test_utils::{guest_memory, DeviceRig, Segment};
        let mem = guest_memory(16 << 20).unwrap();
        let dev = Rng::new(RngConfig::default(), mem.clone()).unwrap();
        let mut rig = DeviceRig::new(&mem, dev);
        let features = 1 << virtio_bindings::virtio_config::VIRTIO_F_VERSION_1;
        rig.drv.init(features).unwrap();
        let buf = rig.drv.alloc(4096, 8).unwrap();
        install_sigsys_handler().unwrap();
        let prog = filter(Thread::EventLoop, SeccompMode::On).unwrap();
        let (used, data) = std::thread::spawn(move || {
            apply(Thread::EventLoop, prog.as_ref()).unwrap();
            rig.run_until_idle();
            rig.drv.submit(0, &[Segment::writable(buf, 4096)]).unwrap();
            rig.run_until_idle();
            let used = rig.drv.used(0).unwrap();
            (used, rig.drv.read_mem(buf, 4096).unwrap())
        })
        .join()
        .unwrap();
        assert_eq!(used.len(), 1);
        assert_eq!(used[0].len, 4096);
        assert!(data.iter().any(|&b| b != data[0]), "not filled");
        // getrandom with other flags (a read that may block on the pool,
        // GRND_RANDOM) stays forbidden, and no other thread may call it.
        const NONBLOCK: libc::c_long = libc::GRND_NONBLOCK as _;
        const RANDOM: libc::c_long = (libc::GRND_RANDOM | libc::GRND_NONBLOCK) as _;
        let cases: [(Thread, fn(), i32); 4] = [
            (
                Thread::EventLoop,
                || raw(libc::SYS_getrandom, [0, 0, NONBLOCK, 0, 0, 0]),
                0,
            ),
            (
                Thread::EventLoop,
                || raw(libc::SYS_getrandom, [0, 0, 0, 0, 0, 0]),
                148,
            ),
            (
                Thread::EventLoop,
                || raw(libc::SYS_getrandom, [0, 0, RANDOM, 0, 0, 0]),
                148,
            ),
            (
                Thread::Vcpu,
                || raw(libc::SYS_getrandom, [0, 0, NONBLOCK, 0, 0, 0]),
                148,
            ),
        ];
        for (i, (thread, call, want)) in cases.into_iter().enumerate() {
            let status = in_filtered_child(thread, SeccompMode::On, call);
            assert_eq!(exit_status(status), Some(want), "case {i}: {thread:?}");
        }
    }

    /// The balloon on the event loop under the loop's real filter: an
    /// inflation given back with madvise on real guest memory (its pages
    /// read zeros after), a statistics report held and asked for again by
    /// the statistics timer, a hinting run started as the API starts one.
    #[test]
    fn the_balloons_passes_and_timer_run_under_the_event_loops_filter() {
        use devices::virtio::balloon::{Balloon, BalloonConfig};
        use devices::virtio::test_utils::{guest_memory, DeviceRig, Segment};
        use vm_memory::Bytes;
        let mem = guest_memory(16 << 20).unwrap();
        let cfg = BalloonConfig {
            stats_polling_interval_s: 1,
            free_page_hinting: true,
            ..BalloonConfig::default()
        };
        let dev = Balloon::new(cfg, mem.clone()).unwrap();
        let mut rig = DeviceRig::new(&mem, dev);
        let features = devices::virtio::VirtioDevice::avail_features(&*rig.dev());
        rig.drv.init(features).unwrap();
        let page = rig.drv.alloc(8192, 4096).unwrap();
        mem.write_slice(&[0xa5; 8192], page).unwrap();
        let pfns = rig.drv.alloc(8, 4).unwrap();
        let first = (page.0 >> 12) as u32;
        let bytes: Vec<u8> = [first, first + 1]
            .iter()
            .flat_map(|p| p.to_le_bytes())
            .collect();
        rig.drv.write_mem(pfns, &bytes).unwrap();
        let stats = rig.drv.alloc(10, 8).unwrap();
        rig.drv
            .write_mem(stats, &[4, 0, 1, 0, 0, 0, 0, 0, 0, 0])
            .unwrap();
        install_sigsys_handler().unwrap();
        let prog = filter(Thread::EventLoop, SeccompMode::On).unwrap();
        let (inflated, stats_back, hint_cmd) = std::thread::spawn(move || {
            apply(Thread::EventLoop, prog.as_ref()).unwrap();
            rig.run_until_idle();
            rig.drv.submit(0, &[Segment::readable(pfns, 8)]).unwrap();
            rig.drv.submit(2, &[Segment::readable(stats, 10)]).unwrap();
            rig.run_until_idle();
            let inflated = rig.metric("pages_inflated");
            // The timer (1 s) gives the statistics buffer back.
            let start = std::time::Instant::now();
            while rig.drv.used(2).unwrap().is_empty() && start.elapsed().as_secs() < 5 {
                rig.run_once(200);
            }
            rig.dev().start_hinting(true).unwrap();
            rig.dev().set_stats_interval(2).unwrap();
            (
                inflated,
                rig.metric("stats_requests"),
                rig.dev().hinting_status().unwrap(),
            )
        })
        .join()
        .unwrap();
        assert_eq!(inflated, 2);
        assert!(stats_back >= 1, "the statistics timer never fired");
        assert_eq!(hint_cmd.host_cmd, 2);
        let mut back = [0xffu8; 8192];
        mem.read_slice(&mut back, page).unwrap();
        assert!(
            back.iter().all(|&b| b == 0),
            "the pages were not given back"
        );
    }

    /// MMDS on the event loop (a guest's ARP, a connection, a V2 token
    /// from getrandom, a GET answered from the shared store) under the
    /// loop's real filter, and the API thread's PUT, PATCH and GET /mmds
    /// under the API's: neither needs a call its list lacks.
    #[test]
    fn mmds_runs_under_the_event_loops_and_the_apis_filters() {
        use devices::mmds::guest::{read_reply, GuestClient, Reply};
        use devices::mmds::packet::flags::{ACK, PSH, SYN};
        use devices::mmds::{lock, MmdsMetrics, MmdsStack, MmdsVersion, SharedMmds};
        let store: SharedMmds = Default::default();
        lock(&store).configure(MmdsVersion::V2, false);
        install_sigsys_handler().unwrap();
        let api = filter(Thread::Api, SeccompMode::On).unwrap();
        let api_store = store.clone();
        std::thread::spawn(move || {
            apply(Thread::Api, api.as_ref()).unwrap();
            let put = crate::api::mmds::put(&api_store, serde_json::json!({"k": "v"}));
            let patch = crate::api::mmds::patch(&api_store, &serde_json::json!({"n": 1}));
            let get = crate::api::mmds::get(&api_store);
            assert_eq!((put.status, patch.status, get.status), (204, 204, 200));
        })
        .join()
        .unwrap();
        let prog = filter(Thread::EventLoop, SeccompMode::On).unwrap();
        let body = std::thread::spawn(move || {
            apply(Thread::EventLoop, prog.as_ref()).unwrap();
            let mut stack = MmdsStack::new(devices::mmds::DEFAULT_IPV4, store);
            let m = MmdsMetrics::default();
            let mut c = GuestClient::new(devices::mmds::DEFAULT_IPV4, 40000);
            let exchange = |stack: &mut MmdsStack, frame: Vec<u8>, c: &mut GuestClient| {
                stack.receive(&frame, std::time::Instant::now(), &m);
                let mut data = Vec::new();
                while let Some(f) = stack.poll() {
                    if let Some(Reply::Tcp {
                        seq,
                        flags,
                        payload,
                        ..
                    }) = read_reply(f, c.mac, c.ip)
                    {
                        if flags & SYN != 0 {
                            c.ack = seq.wrapping_add(1);
                        } else if !payload.is_empty() {
                            c.ack = seq.wrapping_add(payload.len() as u32);
                            data.extend_from_slice(&payload);
                        }
                    }
                }
                String::from_utf8(data).unwrap()
            };
            exchange(&mut stack, c.arp_request(), &mut c);
            let syn = c.send(SYN, b"");
            exchange(&mut stack, syn, &mut c);
            let ack = c.send(ACK, b"");
            exchange(&mut stack, ack, &mut c);
            let put = c.send(
                ACK | PSH,
                b"PUT /latest/api/token HTTP/1.1\r\nX-metadata-token-ttl-seconds: 5\r\n\r\n",
            );
            let resp = exchange(&mut stack, put, &mut c);
            let token = resp.split("\r\n\r\n").nth(1).unwrap().to_string();
            let get = format!(
                "GET /k HTTP/1.1\r\nAccept: application/json\r\nX-metadata-token: {token}\r\n\r\n"
            );
            let get = c.send(ACK | PSH, get.as_bytes());
            exchange(&mut stack, get, &mut c)
        })
        .join()
        .unwrap();
        assert!(body.starts_with("HTTP/1.1 200 OK"), "{body}");
        assert!(body.ends_with("\r\n\r\n\"v\""), "{body}");
    }

    fn terminal_ioctl(fd: libc::c_int, request: libc::Ioctl) {
        // SAFETY: a null termios makes the kernel fail with EFAULT (or
        // ENOTTY when `fd` is no terminal) before it changes anything.
        unsafe { libc::syscall(libc::SYS_ioctl, fd, ioctl_nr(request), 0usize) };
    }

    #[test]
    fn every_thread_may_set_stdins_terminal_mode_and_nothing_more() {
        for thread in [Thread::Vcpu, Thread::EventLoop, Thread::Api] {
            let status = in_filtered_child(thread, SeccompMode::On, || {
                terminal_ioctl(0, libc::TCSETS);
                terminal_ioctl(0, libc::TCGETS);
            });
            assert_eq!(exit_status(status), Some(0), "{thread:?}");
            // Another fd, or another terminal request on stdin: forbidden.
            let status =
                in_filtered_child(thread, SeccompMode::On, || terminal_ioctl(1, libc::TCSETS));
            assert_eq!(exit_status(status), Some(BAD_SYSCALL_EXIT_STATUS));
        }
        let status = in_filtered_child(Thread::Vcpu, SeccompMode::On, || {
            // SAFETY: TIOCSTI with a null pointer fails with EFAULT if let through.
            unsafe { libc::syscall(libc::SYS_ioctl, 0, ioctl_nr(libc::TIOCSTI), 0usize) };
        });
        assert_eq!(exit_status(status), Some(BAD_SYSCALL_EXIT_STATUS));
    }

    #[test]
    fn log_and_off_let_the_call_through() {
        for mode in [SeccompMode::Log, SeccompMode::Off] {
            let status = in_filtered_child(Thread::Vcpu, mode, forbidden_syscall);
            assert_eq!(exit_status(status), Some(0), "{mode:?}");
        }
        assert!(filter(Thread::Vcpu, SeccompMode::Off).unwrap().is_none());
    }

    #[test]
    fn the_sigsys_line_names_the_call() {
        let mut buf = [0u8; LINE_MAX];
        let n = bad_syscall_line(63, &mut buf);
        assert_eq!(
            std::str::from_utf8(&buf[..n]).unwrap(),
            "minivmm: error: forbidden system call 63 (uname) under seccomp, \
             exiting with status 148\n"
        );
        let n = bad_syscall_line(219, &mut buf);
        assert!(std::str::from_utf8(&buf[..n])
            .unwrap()
            .contains("call 219 (restart_syscall) under seccomp"));
        // No name: the number alone.
        let n = bad_syscall_line(-1, &mut buf);
        assert!(std::str::from_utf8(&buf[..n])
            .unwrap()
            .contains("call -1 under seccomp"));
        let n = bad_syscall_line(i32::MIN, &mut buf);
        assert!(std::str::from_utf8(&buf[..n])
            .unwrap()
            .contains("call -2147483648 under seccomp"));
        // The longest name fits whole, with the end of the line.
        let n = bad_syscall_line(libc::SYS_sched_get_priority_max as i32, &mut buf);
        assert!(std::str::from_utf8(&buf[..n])
            .unwrap()
            .ends_with("(sched_get_priority_max) under seccomp, exiting with status 148\n"));
    }

    #[test]
    fn an_unconditional_entry_wins_a_merge() {
        let cond = || {
            SeccompRule::new(vec![SeccompCondition::new(
                1,
                SeccompCmpArgLen::Dword,
                SeccompCmpOp::Eq,
                1,
            )
            .unwrap()])
            .unwrap()
        };
        let map = merge([
            (libc::SYS_ioctl, vec![cond()]),
            (libc::SYS_ioctl, vec![]),
            (libc::SYS_ioctl, vec![cond()]),
            (libc::SYS_read, vec![cond()]),
            (libc::SYS_read, vec![cond()]),
        ]);
        assert!(map[&libc::SYS_ioctl].is_empty());
        assert_eq!(map[&libc::SYS_read].len(), 2);
    }

    #[test]
    fn the_gate_holds_every_thread_until_all_are_filtered() {
        let gate = std::sync::Arc::new(Gate::new(2));
        let g = gate.clone();
        let peer = std::thread::spawn(move || g.install_and_wait(Thread::Vcpu, None));
        // No filter to install (off): both pass.
        gate.install_and_wait(Thread::EventLoop, None).unwrap();
        peer.join().unwrap().unwrap();

        let gate = std::sync::Arc::new(Gate::new(2));
        let g = gate.clone();
        let peer = std::thread::spawn(move || g.install_and_wait(Thread::Vcpu, None));
        gate.fail();
        assert!(matches!(
            peer.join().unwrap(),
            Err(SeccompError::PeerFailed)
        ));
    }
}
