// SPDX-License-Identifier: Apache-2.0
//! `mvperf selftest`: a bounded stress of what guest userspace relies on.
//!
//! The guest image runs it with `minivmm.mode=selftest` (resources/initramfs/init). On the
//! PVM-backed development hosts every system call of the guest goes through the guest kernel's
//! fix-up path, and the kernel's segment, MSR and context-switch code runs instruction-emulated,
//! so thread-local storage (`%fs`-relative loads), `clone(CLONE_SETTLS)`, fork, exec and signal
//! delivery are exactly what can break there without the kernel noticing. Each phase checks its
//! own results rather than only surviving:
//!
//! - **threads**: rounds of short-lived threads (each one a `clone` with a new TLS) find their
//!   thread-locals at their initial values, set their own, and re-check value, address and the
//!   `%fs` base (`arch_prctl(ARCH_GET_FS)`) after every yield;
//! - **switches**: two threads ping-pong through a mutex and condition variable, re-checking
//!   their thread-locals after every wake-up;
//! - **signals**: `tgkill` to each of two background threads and `kill` to the process, one at a
//!   time (standard signals coalesce); the handler checks that the thread-local it reads belongs
//!   to the thread it runs on;
//! - **fork**: raw `fork` children check the thread-local they inherited and exit; some `execve`
//!   `/bin/true` right after the fork;
//! - **exec**: `std::process::Command` (posix_spawn) of `/bin/true` and `/bin/sh -c 'exit 7'`,
//!   from the main thread and from two threads at once;
//! - **libc**: threads call the C library's `memchr`, `strlen` and `memcpy` on page-sized
//!   buffers and check every result while the main thread runs other programs: the C library
//!   picks its vector implementation from CPUID, and a guest kernel that does not save the
//!   vector state it picked (AMD PVM hosts: user CPUID is not trapped there, so AVX-512 is seen,
//!   while the guest kernel saves only x87/SSE) gives wrong answers here; it did, before minivmm
//!   kept the guest's glibc off AVX (vmm/src/kvm/pvm.rs).
//!
//! Background threads keep checking their thread-locals (with short sleeps, so timer wake-ups
//! and context switches happen) through all phases. Counts are fixed, not time-based, so a run
//! does the same work on any host; on the emulated guest kernel (~2,000 system calls/s) it
//! took 34 s with 2 vCPUs on a loaded host before the counts were cut to about two thirds;
//! aim: 10 to 20 s. On an AMD PVM host running three VMs on 2 cores the phases before `libc`
//! took 196 s with 1 vCPU. So the watchdog follows progress: the run fails after `--timeout`
//! (600 s by default) without a step of the main flow done (a thread joined, a turn, a signal
//! handled, a fork, an exec, a round of C-library checks), or after three times that in all;
//! a slow host makes the run slower, a hang makes it fail.
//!
//! One line on stdout ends the run: `MINIVMM-SELFTEST PASS ...` with the counts, or
//! `MINIVMM-SELFTEST FAIL <what>`; the exit status is 0 or 1 to match.

use std::cell::Cell;
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};

/// Rounds of short-lived threads, and threads per round.
const ROUNDS: usize = 4;
const THREADS_PER_ROUND: usize = 4;
/// Yield-and-check iterations of each short-lived thread.
const THREAD_ITERATIONS: u64 = 40;
/// Ping-pong round trips between the two switching threads.
const PING_PONGS: u64 = 200;
/// A ping-pong thread that sees no turn taken for this long reports the pair stuck.
const PING_PONG_STALL: Duration = Duration::from_secs(60);
/// Signals sent to each background thread, and to the process.
const THREAD_SIGNALS: u64 = 40;
const PROCESS_SIGNALS: u64 = 20;
/// Raw forks, of which this many exec `/bin/true` in the child.
const FORKS: usize = 5;
const FORK_EXECS: usize = 2;
/// posix_spawn runs from the main thread, and from each of two threads at once.
const SPAWNS: usize = 4;
const THREAD_SPAWNS: usize = 2;
/// libc phase: threads checking C-library string functions, and the programs the main thread
/// runs meanwhile (each a fork and exec: other processes' vector code between the checks).
const LIBC_THREADS: usize = 3;
const LIBC_SPAWNS: usize = 3;
/// How long one signal may take to be handled before it counts as lost: like
/// [`PING_PONG_STALL`], a step that long without its one event is stuck, not slow.
const SIGNAL_TIMEOUT: Duration = Duration::from_secs(60);

/// What the first read of [`TAG`] must give in a new thread: a new TLS block starts from the
/// binary's TLS initialisation image, whatever the parent's value is.
const TAG_INIT: u64 = 0x5e1f_7e57_0000_0000;

thread_local! {
    /// Each thread's own value (its tid and a per-thread salt); const-initialised, so the
    /// signal handler may read it without running lazy initialisation.
    static TAG: Cell<u64> = const { Cell::new(TAG_INIT) };
    /// The thread's tid as it recorded it, for the signal handler's check.
    static MY_TID: Cell<i32> = const { Cell::new(0) };
}

/// Signals handled, and handlers that found a thread-local not belonging to their thread.
static HANDLED: AtomicU64 = AtomicU64::new(0);
/// Steps of the main flow done (with [`HANDLED`], what the watchdog sees as progress).
static STEPS: AtomicU64 = AtomicU64::new(0);
/// The watchdog's cap: this many times `--timeout` in all, progress or not.
const WATCHDOG_CAP_FACTOR: u32 = 3;
/// How often the watchdog looks at the progress counters.
const WATCHDOG_POLL: Duration = Duration::from_secs(1);

/// Counts one step of the main flow done.
fn step_done() {
    STEPS.fetch_add(1, Ordering::Relaxed);
}
static HANDLER_MISMATCHES: AtomicU64 = AtomicU64::new(0);

/// The self-test's configuration.
#[derive(Debug, Clone)]
pub struct SelftestConfig {
    /// Watchdog: the run fails after this long without progress (and after
    /// [`WATCHDOG_CAP_FACTOR`] times this in all).
    pub timeout: Duration,
    /// Program to exec (must exit 0 with no arguments).
    pub true_bin: String,
    /// Shell to exec for `-c 'exit 7'`.
    pub sh_bin: String,
}

/// Counts of what ran, for the PASS line.
#[derive(Debug, Default)]
struct Counts {
    threads: u64,
    tls_checks: Arc<AtomicU64>,
    switches: u64,
    signals: u64,
    forks: u64,
    execs: u64,
    libc_calls: u64,
}

/// Runs the self-test, prints the PASS or FAIL line on stdout and returns whether it passed.
pub fn run(cfg: &SelftestConfig) -> bool {
    let started = Instant::now();
    let timeout = cfg.timeout;
    // The watchdog makes a hang a failure with a line, not a silent guest.
    let _ = thread::Builder::new()
        .name("watchdog".into())
        .spawn(move || {
            let why = watch_progress(timeout, || {
                STEPS.load(Ordering::Relaxed) + HANDLED.load(Ordering::Relaxed)
            });
            println!("MINIVMM-SELFTEST FAIL {why}");
            std::process::exit(1);
        });
    match stress(cfg) {
        Ok(c) => {
            let ctxt = context_switches().unwrap_or_else(|| "unknown".into());
            println!(
                "MINIVMM-SELFTEST PASS threads={} tls_checks={} switches={} signals={} forks={} \
                 execs={} libc_calls={} context_switches={ctxt} cpus={} secs={:.1}",
                c.threads,
                c.tls_checks.load(Ordering::SeqCst),
                c.switches,
                c.signals,
                c.forks,
                c.execs,
                c.libc_calls,
                thread::available_parallelism().map_or(0, |n| n.get()),
                started.elapsed().as_secs_f64()
            );
            true
        }
        Err(e) => {
            println!("MINIVMM-SELFTEST FAIL {e:#}");
            false
        }
    }
}

/// Returns (why) once `progress()` has not changed for `stall`, or after
/// [`WATCHDOG_CAP_FACTOR`] times `stall` in all.
fn watch_progress(stall: Duration, progress: impl Fn() -> u64) -> String {
    let started = Instant::now();
    let (mut last, mut progressed) = (progress(), Instant::now());
    loop {
        thread::sleep(WATCHDOG_POLL.min(stall));
        let now = progress();
        if now != last {
            (last, progressed) = (now, Instant::now());
        }
        if progressed.elapsed() >= stall {
            return format!(
                "no progress for {:.1} s (hung after {last} steps)",
                stall.as_secs_f64()
            );
        }
        if started.elapsed() >= stall * WATCHDOG_CAP_FACTOR {
            return format!(
                "still running after {:.0} s ({last} steps), {WATCHDOG_CAP_FACTOR} times the \
                 stall window",
                started.elapsed().as_secs_f64()
            );
        }
    }
}

fn phase_done(name: &str, started: Instant) {
    eprintln!(
        "mvperf selftest: {name} ok ({:.1} s)",
        started.elapsed().as_secs_f64()
    );
}

fn stress(cfg: &SelftestConfig) -> Result<Counts> {
    sys::install_handler().context("installing the SIGUSR1 handler")?;
    let mut counts = Counts::default();
    set_own_tag(0)?;
    let fs_offset = tls_offset()?;

    // Background checkers: signal targets, and TLS checks across every other phase.
    let stop = Arc::new(AtomicBool::new(false));
    let mut background = Vec::new();
    let mut targets = Vec::new();
    for i in 0..2u64 {
        let (stop, checks) = (Arc::clone(&stop), Arc::clone(&counts.tls_checks));
        let tid = Arc::new(AtomicI32::new(0));
        let tid_out = Arc::clone(&tid);
        let h = thread::Builder::new()
            .name(format!("checker{i}"))
            .spawn(move || -> Result<()> {
                check_fresh_tls()?;
                tid_out.store(set_own_tag(100 + i)?, Ordering::SeqCst);
                while !stop.load(Ordering::SeqCst) {
                    check_tls(fs_offset, 100 + i)?;
                    checks.fetch_add(1, Ordering::Relaxed);
                    thread::sleep(Duration::from_millis(5));
                }
                check_tls(fs_offset, 100 + i)
            })
            .context("spawning a background thread")?;
        background.push(h);
        targets.push(tid);
    }
    counts.threads += 2;
    let result = phases(cfg, &mut counts, fs_offset, &targets);
    stop.store(true, Ordering::SeqCst);
    for (i, h) in background.into_iter().enumerate() {
        h.join()
            .map_err(|_| anyhow!("background thread {i} panicked"))?
            .with_context(|| format!("background thread {i}"))?;
    }
    result?;
    check_tls(fs_offset, 0).context("main thread at the end")?;
    let mismatches = HANDLER_MISMATCHES.load(Ordering::SeqCst);
    if mismatches > 0 {
        bail!("signals: {mismatches} handler(s) read another thread's thread-local");
    }
    Ok(counts)
}

fn phases(
    cfg: &SelftestConfig,
    counts: &mut Counts,
    fs_offset: u64,
    targets: &[Arc<AtomicI32>],
) -> Result<()> {
    let t = Instant::now();
    for round in 0..ROUNDS {
        let handles: Vec<_> = (0..THREADS_PER_ROUND)
            .map(|i| {
                let salt = 1000 + (round * THREADS_PER_ROUND + i) as u64;
                let checks = Arc::clone(&counts.tls_checks);
                thread::Builder::new()
                    .name(format!("round{round}-{i}"))
                    .spawn(move || -> Result<u64> {
                        check_fresh_tls()?;
                        set_own_tag(salt)?;
                        for _ in 0..THREAD_ITERATIONS {
                            thread::yield_now();
                            check_tls(fs_offset, salt)?;
                            checks.fetch_add(1, Ordering::Relaxed);
                        }
                        Ok(salt)
                    })
                    .context("spawning a thread")
            })
            .collect::<Result<_>>()?;
        for (i, h) in handles.into_iter().enumerate() {
            let salt = h
                .join()
                .map_err(|_| anyhow!("threads: round {round} thread {i} panicked"))?
                .with_context(|| format!("threads: round {round} thread {i}"))?;
            if salt != 1000 + (round * THREADS_PER_ROUND + i) as u64 {
                bail!("threads: round {round} thread {i} returned another thread's result");
            }
            counts.threads += 1;
            step_done();
        }
        check_tls(fs_offset, 0).context("threads: main thread")?;
    }
    phase_done("threads", t);

    let t = Instant::now();
    counts.switches = ping_pong(fs_offset, &counts.tls_checks)?;
    counts.threads += 2;
    phase_done("switches", t);

    let t = Instant::now();
    counts.signals = signals(targets)?;
    check_tls(fs_offset, 0).context("signals: main thread")?;
    phase_done("signals", t);

    let t = Instant::now();
    let true_c = std::ffi::CString::new(cfg.true_bin.as_str()).context("program path")?;
    for i in 0..FORKS {
        let code = sys::fork_check(TAG.with(Cell::get), (i < FORK_EXECS).then_some(&true_c))
            .context("fork")?;
        if code != 0 {
            bail!("fork: child {i} exited with {code} (1: wrong inherited thread-local, 127: exec failed)");
        }
        counts.forks += 1;
        counts.execs += u64::from(i < FORK_EXECS);
        step_done();
    }
    check_tls(fs_offset, 0).context("fork: main thread")?;
    phase_done("fork", t);

    let t = Instant::now();
    for _ in 0..SPAWNS {
        spawn_true(&cfg.true_bin)?;
        counts.execs += 1;
    }
    let status = Command::new(&cfg.sh_bin)
        .args(["-c", "exit 7"])
        .status()
        .with_context(|| format!("exec: running {}", cfg.sh_bin))?;
    if status.code() != Some(7) {
        bail!("exec: {} -c 'exit 7' ended with {status}", cfg.sh_bin);
    }
    counts.execs += 1;
    let spawners: Vec<_> = (0..THREAD_SPAWNS)
        .map(|i| {
            let bin = cfg.true_bin.clone();
            thread::Builder::new()
                .name(format!("spawner{i}"))
                .spawn(move || -> Result<()> {
                    set_own_tag(2000 + i as u64)?;
                    spawn_true(&bin)?;
                    check_tls(fs_offset, 2000 + i as u64)
                })
                .context("spawning a thread")
        })
        .collect::<Result<_>>()?;
    for (i, h) in spawners.into_iter().enumerate() {
        h.join()
            .map_err(|_| anyhow!("exec: spawner {i} panicked"))?
            .with_context(|| format!("exec: spawner {i}"))?;
        counts.execs += 1;
        counts.threads += 1;
    }
    check_tls(fs_offset, 0).context("exec: main thread")?;
    phase_done("exec", t);

    let t = Instant::now();
    counts.libc_calls = libc_under_switches(&cfg.true_bin)?;
    counts.execs += LIBC_SPAWNS as u64;
    counts.threads += LIBC_THREADS as u64;
    phase_done("libc", t);
    Ok(())
}

/// The libc phase: [`LIBC_THREADS`] threads check C-library string functions until the main
/// thread has run [`LIBC_SPAWNS`] programs. Returns the number of checked calls.
fn libc_under_switches(true_bin: &str) -> Result<u64> {
    let stop = Arc::new(AtomicBool::new(false));
    let checkers: Vec<_> = (0..LIBC_THREADS)
        .map(|i| {
            let stop = Arc::clone(&stop);
            thread::Builder::new()
                .name(format!("libc{i}"))
                .spawn(move || -> Result<u64> {
                    let mut calls = 0u64;
                    let mut round = 0usize;
                    // At least a few rounds, so a host that runs the spawns at once still checks.
                    while round < 16 || !stop.load(Ordering::SeqCst) {
                        calls += check_libc_round(i, round)?;
                        step_done();
                        round += 1;
                    }
                    Ok(calls)
                })
                .context("spawning a thread")
        })
        .collect::<Result<_>>()?;
    let spawned = (0..LIBC_SPAWNS).try_for_each(|_| spawn_true(true_bin));
    stop.store(true, Ordering::SeqCst);
    let mut calls = 0;
    for (i, h) in checkers.into_iter().enumerate() {
        calls += h
            .join()
            .map_err(|_| anyhow!("libc: thread {i} panicked"))?
            .with_context(|| format!("libc: thread {i}"))?;
    }
    spawned?;
    Ok(calls)
}

/// One round of checked C-library calls on buffers of a page and more (the sizes at which the
/// C library takes its vector paths). Returns the number of calls checked.
fn check_libc_round(thread: usize, round: usize) -> Result<u64> {
    const LEN: usize = 8192;
    let fill = |k: usize| b'a' + ((k * 7 + thread) % 26) as u8;
    let mut hay: Vec<u8> = (0..LEN).map(fill).collect();
    let at = (round * 613 + thread * 97) % (LEN - 1);
    hay[at] = b'%';
    hay[LEN - 1] = 0;
    let found = sys::c_memchr(&hay, b'%');
    if found != Some(at) {
        bail!("memchr found '%' at {found:?}, it is at {at} (round {round})");
    }
    let len = sys::c_strlen(&hay);
    if len != LEN - 1 {
        bail!("strlen gave {len}, want {} (round {round})", LEN - 1);
    }
    let mut copy = vec![0u8; LEN];
    let n = LEN - (round % 61);
    sys::c_memcpy(&mut copy[..n], &hay[..n]);
    // Checked byte by byte in Rust, not with the C library under test.
    if let Some(k) = (0..n).find(|&k| copy[k] != hay[k]) {
        bail!(
            "memcpy of {n} bytes: byte {k} is {:#x}, want {:#x} (round {round})",
            copy[k],
            hay[k]
        );
    }
    if copy[n..].iter().any(|&b| b != 0) {
        bail!("memcpy of {n} bytes wrote past its end (round {round})");
    }
    Ok(3)
}

fn spawn_true(bin: &str) -> Result<()> {
    let status = Command::new(bin)
        .status()
        .with_context(|| format!("exec: running {bin}"))?;
    if !status.success() {
        bail!("exec: {bin} ended with {status}");
    }
    step_done();
    Ok(())
}

/// The value a thread stores in [`TAG`]: its tid in the high half, its salt in the low half.
fn tag_for(tid: i32, salt: u64) -> u64 {
    (u64::from(tid.unsigned_abs()) << 32) | (salt & 0xffff_ffff)
}

/// Records the calling thread's tid and tag; returns the tid.
fn set_own_tag(salt: u64) -> Result<i32> {
    let tid = sys::gettid();
    MY_TID.with(|t| t.set(tid));
    TAG.with(|t| t.set(tag_for(tid, salt)));
    Ok(tid)
}

/// A new thread's thread-locals start from the initialisation image.
fn check_fresh_tls() -> Result<()> {
    let (tag, tid) = (TAG.with(Cell::get), MY_TID.with(Cell::get));
    if tag != TAG_INIT || tid != 0 {
        bail!("new thread's thread-locals are not fresh (tag {tag:#x}, tid {tid}): its TLS block is another thread's");
    }
    Ok(())
}

/// Where [`TAG`] lives relative to the `%fs` base. In a static binary TLS sits at a fixed
/// offset from the thread pointer, the same in every thread.
fn tls_offset() -> Result<u64> {
    let fs = sys::fs_base()?;
    Ok(fs.wrapping_sub(TAG.with(|t| t.as_ptr() as u64)))
}

/// The calling thread's thread-locals are its own: the tag holds its tid and salt, the tid is
/// the kernel's, and the `%fs` base the kernel holds for it points at its own TLS block.
fn check_tls(fs_offset: u64, salt: u64) -> Result<()> {
    let tid = sys::gettid();
    let tag = TAG.with(Cell::get);
    if tag != tag_for(tid, salt) {
        bail!(
            "thread {tid}: thread-local tag {tag:#x}, expected {:#x}",
            tag_for(tid, salt)
        );
    }
    let mine = MY_TID.with(Cell::get);
    if mine != tid {
        bail!("thread {tid}: thread-local tid {mine}");
    }
    let fs = sys::fs_base()?;
    let addr = TAG.with(|t| t.as_ptr() as u64);
    if fs.wrapping_sub(addr) != fs_offset {
        bail!("thread {tid}: %fs base {fs:#x} does not match its TLS block at {addr:#x}");
    }
    Ok(())
}

/// Two threads hand a token back and forth `PING_PONGS` times, each waking the other.
fn ping_pong(fs_offset: u64, checks: &Arc<AtomicU64>) -> Result<u64> {
    let state = Arc::new((Mutex::new(0u64), Condvar::new()));
    let player = |parity: u64| {
        let state = Arc::clone(&state);
        let checks = Arc::clone(checks);
        thread::Builder::new()
            .name(format!("pingpong{parity}"))
            .spawn(move || -> Result<()> {
                set_own_tag(3000 + parity)?;
                let (lock, cv) = &*state;
                // Stuck means no turn taken for a minute; how long all turns take depends on
                // the host's load (347 of 400 took 120 s beside two other VMs on 2 cores).
                let mut last = (0u64, Instant::now());
                let mut turn = lock.lock().map_err(|_| anyhow!("poisoned"))?;
                while *turn < 2 * PING_PONGS {
                    if *turn % 2 == parity {
                        *turn += 1;
                        step_done();
                        cv.notify_all();
                    } else {
                        let (t, _) = cv
                            .wait_timeout(turn, Duration::from_secs(5))
                            .map_err(|_| anyhow!("poisoned"))?;
                        turn = t;
                        check_tls(fs_offset, 3000 + parity)?;
                        checks.fetch_add(1, Ordering::Relaxed);
                    }
                    if *turn != last.0 {
                        last = (*turn, Instant::now());
                    } else if last.1.elapsed() > PING_PONG_STALL {
                        bail!("switches: stuck at turn {} for {PING_PONG_STALL:?}", *turn);
                    }
                }
                Ok(())
            })
            .context("spawning a thread")
    };
    let (a, b) = (player(0)?, player(1)?);
    for (i, h) in [a, b].into_iter().enumerate() {
        h.join()
            .map_err(|_| anyhow!("switches: thread {i} panicked"))?
            .with_context(|| format!("switches: thread {i}"))?;
    }
    Ok(2 * PING_PONGS)
}

/// Sends SIGUSR1 to each background thread and to the process, one at a time, waiting for each
/// to be handled. Returns how many were.
fn signals(targets: &[Arc<AtomicI32>]) -> Result<u64> {
    let pid = std::process::id() as i32;
    let mut sent = 0u64;
    let mut send = |what: &str, f: &dyn Fn() -> std::io::Result<()>| -> Result<()> {
        let before = HANDLED.load(Ordering::SeqCst);
        f().with_context(|| format!("signals: sending to {what}"))?;
        let deadline = Instant::now() + SIGNAL_TIMEOUT;
        while HANDLED.load(Ordering::SeqCst) == before {
            if Instant::now() > deadline {
                bail!("signals: SIGUSR1 to {what} not handled within {SIGNAL_TIMEOUT:?}");
            }
            thread::sleep(Duration::from_millis(1));
        }
        sent += 1;
        Ok(())
    };
    for (i, t) in targets.iter().enumerate() {
        let deadline = Instant::now() + SIGNAL_TIMEOUT;
        while t.load(Ordering::SeqCst) == 0 {
            if Instant::now() > deadline {
                bail!("signals: background thread {i} never started");
            }
            thread::sleep(Duration::from_millis(5));
        }
    }
    for _ in 0..THREAD_SIGNALS {
        for t in targets {
            let tid = t.load(Ordering::SeqCst);
            send(&format!("thread {tid}"), &|| sys::tgkill(pid, tid))?;
        }
    }
    for _ in 0..PROCESS_SIGNALS {
        send("the process", &|| sys::kill(pid))?;
    }
    Ok(sent)
}

/// The signal handler: counts, and checks that the thread-local it reads is its thread's.
extern "C" fn on_usr1(_sig: libc::c_int) {
    let mine = MY_TID.with(Cell::get);
    if mine != 0 && mine != sys::gettid() {
        HANDLER_MISMATCHES.fetch_add(1, Ordering::SeqCst);
    }
    HANDLED.fetch_add(1, Ordering::SeqCst);
}

/// Context switches of the whole process so far, voluntary and not, all threads (finished ones
/// included), as `getrusage(RUSAGE_SELF)` counts them.
fn context_switches() -> Option<String> {
    sys::context_switches().map(|n| n.to_string())
}

/// The system calls std does not wrap. This module is the self-test's only unsafe code.
#[allow(unsafe_code)]
mod sys {
    use std::ffi::CString;
    use std::io;

    use anyhow::{bail, Result};

    /// The C library's `memchr` (not Rust's): where `byte` first is in `hay`.
    pub fn c_memchr(hay: &[u8], byte: u8) -> Option<usize> {
        // SAFETY: memchr reads at most hay.len() bytes from the start of the live slice.
        let p = unsafe { libc::memchr(hay.as_ptr().cast(), i32::from(byte), hay.len()) };
        (!p.is_null()).then(|| p as usize - hay.as_ptr() as usize)
    }

    /// The C library's `strlen` of `s`, which must hold a NUL.
    pub fn c_strlen(s: &[u8]) -> usize {
        assert!(s.contains(&0), "c_strlen needs a NUL inside the slice");
        // SAFETY: the slice is live and holds a NUL, so strlen stops inside it.
        unsafe { libc::strlen(s.as_ptr().cast()) }
    }

    /// The C library's `memcpy` of `src` into `dst` (of the same length).
    pub fn c_memcpy(dst: &mut [u8], src: &[u8]) {
        assert_eq!(dst.len(), src.len());
        // SAFETY: both slices are live for len bytes, and a &mut cannot overlap a &.
        unsafe { libc::memcpy(dst.as_mut_ptr().cast(), src.as_ptr().cast(), src.len()) };
    }

    /// The calling thread's kernel tid.
    pub fn gettid() -> i32 {
        // SAFETY: gettid takes no arguments and cannot fail.
        unsafe { libc::gettid() }
    }

    /// arch_prctl's "get the %fs base" code (asm/prctl.h; the libc crate lacks it).
    const ARCH_GET_FS: libc::c_int = 0x1003;

    /// The `%fs` base the kernel holds for the calling thread.
    pub fn fs_base() -> Result<u64> {
        let mut base: u64 = 0;
        // SAFETY: ARCH_GET_FS writes one u64 to the address given, which is a live, writable
        // local of that type.
        let rc = unsafe { libc::syscall(libc::SYS_arch_prctl, ARCH_GET_FS, &mut base as *mut u64) };
        if rc != 0 {
            bail!("arch_prctl(ARCH_GET_FS): {}", io::Error::last_os_error());
        }
        Ok(base)
    }

    /// Sends SIGUSR1 to thread `tid` of process `pid`.
    pub fn tgkill(pid: i32, tid: i32) -> io::Result<()> {
        // SAFETY: tgkill only reads its integer arguments; the target is a thread of this
        // process whose SIGUSR1 handler is installed.
        let rc = unsafe { libc::syscall(libc::SYS_tgkill, pid, tid, libc::SIGUSR1) };
        if rc != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    /// Sends SIGUSR1 to process `pid` (any of its threads may take it).
    pub fn kill(pid: i32) -> io::Result<()> {
        // SAFETY: kill only reads its integer arguments; `pid` is this process, whose SIGUSR1
        // handler is installed.
        let rc = unsafe { libc::kill(pid, libc::SIGUSR1) };
        if rc != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    /// Voluntary plus involuntary context switches of the process (RUSAGE_SELF).
    pub fn context_switches() -> Option<u64> {
        // SAFETY: an all-zero rusage is a valid value for getrusage to overwrite.
        let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
        // SAFETY: `ru` is a live, writable rusage.
        let rc = unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) };
        (rc == 0).then(|| (ru.ru_nvcsw + ru.ru_nivcsw) as u64)
    }

    /// Installs [`super::on_usr1`] for SIGUSR1, with SA_RESTART so interrupted calls resume.
    pub fn install_handler() -> io::Result<()> {
        // SAFETY: an all-zero sigaction is a valid value (empty mask, no flags) to fill in.
        let mut sa: libc::sigaction = unsafe { std::mem::zeroed() };
        sa.sa_sigaction = super::on_usr1 as extern "C" fn(libc::c_int) as libc::sighandler_t;
        sa.sa_flags = libc::SA_RESTART;
        // SAFETY: `sa` is a fully initialised sigaction whose handler only reads a
        // const-initialised thread-local, calls gettid and updates atomics (all
        // async-signal-safe); no old action is asked for.
        let rc = unsafe { libc::sigaction(libc::SIGUSR1, &sa, std::ptr::null_mut()) };
        if rc != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    /// Forks; the child checks that its thread-local tag is `tag` (the forking thread's) and
    /// exits 0 (1 if not), or first execs `exec` (exit 127 if that fails). Returns the child's
    /// exit code, or 128 + signal if a signal ended it.
    pub fn fork_check(tag: u64, exec: Option<&CString>) -> Result<i32> {
        let argv: [*const libc::c_char; 2] = [
            exec.map_or(std::ptr::null(), |c| c.as_ptr()),
            std::ptr::null(),
        ];
        // SAFETY: the child runs only async-signal-safe code before it exits or execs: a read
        // of a const-initialised, already-set thread-local, execv with a NUL-terminated path
        // and argv prepared before the fork, and _exit.
        let pid = unsafe { libc::fork() };
        if pid < 0 {
            bail!("fork: {}", io::Error::last_os_error());
        }
        if pid == 0 {
            let ok = super::TAG.with(std::cell::Cell::get) == tag;
            if ok {
                if let Some(path) = exec {
                    // SAFETY: see above; argv[0] is the path and argv ends with NULL.
                    unsafe { libc::execv(path.as_ptr(), argv.as_ptr()) };
                    // SAFETY: _exit ends the child at once, running nothing of the parent's.
                    unsafe { libc::_exit(127) };
                }
            }
            // SAFETY: as above.
            unsafe { libc::_exit(if ok { 0 } else { 1 }) };
        }
        let mut status = 0;
        loop {
            // SAFETY: `status` is a live, writable c_int; pid is our child.
            let rc = unsafe { libc::waitpid(pid, &mut status, 0) };
            if rc == pid {
                break;
            }
            let e = io::Error::last_os_error();
            if e.kind() != io::ErrorKind::Interrupted {
                bail!("waitpid: {e}");
            }
        }
        if libc::WIFEXITED(status) {
            Ok(libc::WEXITSTATUS(status))
        } else if libc::WIFSIGNALED(status) {
            Ok(128 + libc::WTERMSIG(status))
        } else {
            bail!("child {pid} ended with status {status:#x}")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_watchdog_fails_a_stall_and_caps_a_run_that_keeps_going() {
        let stall = Duration::from_millis(300);
        let t = Instant::now();
        let why = watch_progress(stall, || 7);
        assert_eq!(why, "no progress for 0.3 s (hung after 7 steps)");
        assert!(
            t.elapsed() >= stall && t.elapsed() < stall * 3,
            "{:?}",
            t.elapsed()
        );

        let ticks = Arc::new(AtomicU64::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let ticker = {
            let (ticks, stop) = (Arc::clone(&ticks), Arc::clone(&stop));
            thread::spawn(move || {
                while !stop.load(Ordering::SeqCst) {
                    ticks.fetch_add(1, Ordering::SeqCst);
                    thread::sleep(Duration::from_millis(20));
                }
            })
        };
        let t = Instant::now();
        let why = watch_progress(stall, || ticks.load(Ordering::SeqCst));
        stop.store(true, Ordering::SeqCst);
        ticker.join().expect("ticker");
        assert!(why.starts_with("still running after"), "{why}");
        assert!(
            t.elapsed() >= stall * WATCHDOG_CAP_FACTOR,
            "{:?}",
            t.elapsed()
        );
    }

    #[test]
    fn tls_checks_catch_a_wrong_value() {
        // On a thread of its own: the test harness's threads keep their tags untouched.
        thread::spawn(|| {
            check_fresh_tls().expect("fresh thread");
            set_own_tag(5).expect("tag");
            let off = tls_offset().expect("offset");
            check_tls(off, 5).expect("own value");
            assert!(check_tls(off, 6).is_err(), "another salt must fail");
            assert!(
                check_tls(off.wrapping_add(8), 5).is_err(),
                "another %fs offset must fail"
            );
            assert!(check_fresh_tls().is_err(), "a used TLS block is not fresh");
        })
        .join()
        .expect("checker thread");
    }

    #[test]
    fn libc_round_checks_pass_on_a_sound_host() {
        for round in 0..40 {
            assert_eq!(check_libc_round(1, round).expect("libc round"), 3);
        }
        assert_eq!(sys::c_memchr(b"ab%c", b'%'), Some(2));
        assert_eq!(sys::c_memchr(b"abc", b'%'), None);
        assert_eq!(sys::c_strlen(b"abc\0def"), 3);
    }

    #[test]
    fn tags_differ_by_thread_and_salt() {
        assert_ne!(tag_for(10, 1), tag_for(11, 1));
        assert_ne!(tag_for(10, 1), tag_for(10, 2));
        assert_ne!(tag_for(10, 1), TAG_INIT);
    }
}
