// SPDX-License-Identifier: Apache-2.0
//! What the C library and Rust's std ask the system once, lazily, answered
//! before any seccomp filter.
//!
//! A library that makes a system call the first time something is needed
//! makes it at a moment the traffic chooses, perhaps long after the thread
//! went under its filter, where the call ends minivmm with status 148. Two
//! kinds are known and answered here:
//!
//! - per process, in `main` ([`process`]): glibc's `malloc` asks two
//!   questions of its own, each once per process and only when a thread
//!   first needs the answer, each by opening a file, which no thread's
//!   filter allows:
//!
//!   - the first time a thread's heap (an arena other than the main one)
//!     gives memory back, it reads `/proc/sys/vm/overcommit_memory` to
//!     choose how;
//!   - the first time a thread needs a new arena while more than eight
//!     exist, it counts the CPUs (`/sys/devices/system/cpu/online`) to
//!     bound how many arenas there may be.
//!
//!   The API thread freeing the buffers of sixteen clients that pipelined
//!   requests and never read made the first open under its filter. So
//!   [`process`] gives the arena bound itself (the one glibc would compute)
//!   and makes one thread's heap shrink, so the first answer is cached for
//!   the process and every process forked from it;
//! - per thread, by [`super::seccomp::apply`] just before the filter
//!   ([`thread`]): std seeds the hash maps of a thread from `getrandom` the
//!   first time the thread makes one, which only the event loop's list
//!   allows (and with other flags).
#![allow(unsafe_code)]

/// Arenas per CPU, glibc's own bound on 64-bit hosts.
const ARENAS_PER_CPU: libc::c_int = 8;

/// Answers glibc's two lazy questions (see the module); call it first in
/// `main`, while the process has one thread and no filter. Does nothing
/// with a C library other than glibc.
pub fn process() {
    #[cfg(target_env = "gnu")]
    {
        bound_arenas();
        shrink_a_thread_heap();
    }
}

/// Sets the arena bound to what glibc would compute (eight per online
/// CPU), so it never counts the CPUs itself.
#[cfg(target_env = "gnu")]
fn bound_arenas() {
    // SAFETY: sysconf has no preconditions; it reads the count of online
    // CPUs (or fails with -1).
    let cpus = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_ONLN) };
    let cpus = libc::c_int::try_from(cpus).unwrap_or(1).max(1);
    // SAFETY: mallopt has no memory-safety preconditions; M_ARENA_MAX takes
    // a positive count.
    unsafe { libc::mallopt(libc::M_ARENA_MAX, cpus.saturating_mul(ARENAS_PER_CPU)) };
}

/// Gives memory back from a new thread's heap once: glibc asks whether it
/// may shrink a heap the first time it does, and keeps the answer.
#[cfg(target_env = "gnu")]
fn shrink_a_thread_heap() {
    // The same shape as the API thread's: a burst of buffers under the
    // mmap threshold (128 KiB), then all freed, leaving a top chunk larger
    // than the trim threshold (128 KiB).
    let burst = || {
        let blocks: Vec<Vec<u8>> = (0..16)
            .map(|_| std::hint::black_box(Vec::with_capacity(32 << 10)))
            .collect();
        drop(std::hint::black_box(blocks));
    };
    // A failed spawn leaves the question open, as it was before; the
    // thread itself cannot fail.
    if let Ok(t) = std::thread::Builder::new()
        .name("settle".into())
        .spawn(burst)
    {
        let _ = t.join();
    }
}

/// Answers the calling thread's own lazy questions (see the module):
/// call it on the thread, before its filter.
pub fn thread() {
    // The thread's hash-map keys, drawn now: every map the thread makes
    // after this takes the next keys without a system call.
    std::hint::black_box(std::hash::RandomState::new());
}

// Plain `cfg(test)`, which cargo-mutants knows to leave alone: a mutant
// of `in_child` made each child start another, without end.
#[cfg(test)]
#[cfg(target_env = "gnu")]
mod tests {
    use std::process::Command;
    use std::sync::{Arc, Barrier};

    use super::*;
    use crate::process::seccomp::{self, SeccompMode, Thread, BAD_SYSCALL_EXIT_STATUS};

    /// Set in a re-executed test binary: `<test> settled|unsettled`.
    const CHILD_ENV: &str = "MINIVMM_SETTLE_TEST_CHILD";
    const THREADS: [Thread; 3] = [Thread::Vcpu, Thread::EventLoop, Thread::Api];

    /// Runs this test binary again as `test`, settled or not; returns its
    /// exit status and stderr. The child is a fresh process: its allocator
    /// has answered nothing yet.
    fn child(test: &str, settled: bool) -> (Option<i32>, String) {
        let mode = if settled { "settled" } else { "unsettled" };
        let out = Command::new(std::env::current_exe().unwrap())
            .args(["--exact", test, "--nocapture", "--test-threads=1"])
            .env(CHILD_ENV, format!("{test} {mode}"))
            .output()
            .unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }

    /// In the child for `test`: whether to settle first; `None` in the
    /// parent.
    fn in_child(test: &str) -> Option<bool> {
        let v = std::env::var(CHILD_ENV).ok()?;
        let (name, mode) = v.split_once(' ')?;
        (name == test).then_some(mode == "settled")
    }

    /// The SIGSYS handler, and [`process`] if asked.
    fn prepare(settled: bool) {
        seccomp::install_sigsys_handler().unwrap();
        if settled {
            process();
        }
    }

    /// Allocates a burst of buffers and frees them all: the heap of the
    /// thread's arena shrinks.
    fn burst() {
        let blocks: Vec<Vec<u8>> = (0..32)
            .map(|_| std::hint::black_box(vec![1u8; 60 << 10]))
            .collect();
        drop(std::hint::black_box(blocks));
    }

    /// Both cases: unsettled, the child dies on the open (so the pattern
    /// does reach glibc's question); settled, it exits 0.
    fn check(test: &str, file: &str) {
        let (code, stderr) = child(test, false);
        assert_eq!(code, Some(BAD_SYSCALL_EXIT_STATUS), "stderr: {stderr}");
        assert!(stderr.contains("(openat)"), "stderr: {stderr}");
        let (code, stderr) = child(test, true);
        assert_eq!(code, Some(0), "settled, {file} still opened: {stderr}");
    }

    #[test]
    fn a_filtered_thread_can_give_heap_memory_back() {
        const NAME: &str = "process::settle::tests::a_filtered_thread_can_give_heap_memory_back";
        if let Some(settled) = in_child(NAME) {
            prepare(settled);
            // Each thread kind in turn, each on a new thread (a new arena,
            // or one a finished thread left).
            for thread in THREADS {
                let prog = seccomp::filter(thread, SeccompMode::On).unwrap();
                std::thread::spawn(move || {
                    seccomp::apply(thread, prog.as_ref()).unwrap();
                    burst();
                })
                .join()
                .unwrap();
            }
            std::process::exit(0);
        }
        check(NAME, "overcommit_memory");
    }

    #[test]
    fn a_filtered_thread_can_make_its_first_hash_map() {
        const NAME: &str = "process::settle::tests::a_filtered_thread_can_make_its_first_hash_map";
        if let Some(settled) = in_child(NAME) {
            seccomp::install_sigsys_handler().unwrap();
            // Each thread kind on a new thread, whose first map comes
            // after its filter: through `apply` (settled), or installed
            // without it (unsettled), as before `apply` settled the thread.
            for thread in THREADS {
                let prog = seccomp::filter(thread, SeccompMode::On).unwrap().unwrap();
                std::thread::spawn(move || {
                    if settled {
                        seccomp::apply(thread, Some(&prog)).unwrap();
                    } else {
                        seccompiler::apply_filter(&prog).unwrap();
                    }
                    let mut m = std::collections::HashMap::new();
                    m.insert(1u32, 2u32);
                    std::hint::black_box(m);
                })
                .join()
                .unwrap();
            }
            std::process::exit(0);
        }
        let (code, stderr) = child(NAME, false);
        assert_eq!(code, Some(BAD_SYSCALL_EXIT_STATUS), "stderr: {stderr}");
        assert!(stderr.contains("(getrandom)"), "stderr: {stderr}");
        let (code, stderr) = child(NAME, true);
        assert_eq!(code, Some(0), "settled, still drew keys: {stderr}");
    }

    /// Installs, on the calling thread and every thread it starts after,
    /// a filter that refuses `openat` alone (SIGSYS, then 148).
    fn refuse_openat() {
        let filter = seccompiler::SeccompFilter::new(
            [(libc::SYS_openat, vec![])].into_iter().collect(),
            seccompiler::SeccompAction::Allow,
            seccompiler::SeccompAction::Trap,
            seccompiler::TargetArch::x86_64,
        )
        .unwrap();
        let prog: seccompiler::BpfProgram = filter.try_into().unwrap();
        seccompiler::apply_filter(&prog).unwrap();
    }

    #[test]
    fn threads_past_eight_arenas_open_nothing() {
        const NAME: &str = "process::settle::tests::threads_past_eight_arenas_open_nothing";
        if let Some(settled) = in_child(NAME) {
            prepare(settled);
            // A thread takes its arena at its first allocation, which the
            // thread library makes before the thread's own code runs (and
            // its filter): so the filter here is one every new thread is
            // born with. More threads than glibc's first eight arenas,
            // alive at once so that none is free for reuse.
            refuse_openat();
            let n = 24;
            let all = Arc::new(Barrier::new(n));
            let handles: Vec<_> = (0..n)
                .map(|_| {
                    let all = Arc::clone(&all);
                    std::thread::spawn(move || {
                        let b = std::hint::black_box(vec![1u8; 100]);
                        all.wait();
                        drop(b);
                    })
                })
                .collect();
            for h in handles {
                h.join().unwrap();
            }
            std::process::exit(0);
        }
        check(NAME, "cpu/online");
    }
}
