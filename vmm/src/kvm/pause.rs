// SPDX-License-Identifier: Apache-2.0
//! Pausing and resuming the vCPUs (`PATCH /vm` with `Paused`/`Resumed`).
//!
//! A pause is a request every vCPU thread honours between two `KVM_RUN`s:
//! it parks on a condition variable until the request is withdrawn. A vCPU
//! inside `KVM_RUN` (a guest that computes, or one halted in the kernel's
//! HLT loop) only returns when something interrupts it, so the pauser
//! kicks the threads with a signal whose handler does nothing: the
//! `KVM_RUN` returns `EINTR`, the loop sees the request and parks. A kick
//! that lands just before a thread enters `KVM_RUN` is lost, so the pauser
//! kicks again until every vCPU is parked or its deadline passes, which
//! bounds how long a pause request can hold the event loop.
//!
//! While paused, nothing of the guest runs; devices, their timers and rate
//! limiters keep running on the event loop (a frame from the TAP still
//! reaches the RX ring the guest posted), and guest time goes on, as in
//! Firecracker.
#![allow(unsafe_code)]

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use vmm_sys_util::signal::{register_signal_handler, Killable, SIGRTMIN};

/// How often a pause request kicks the vCPUs that have not parked yet.
const KICK_EVERY: Duration = Duration::from_millis(2);

/// The signal that kicks a vCPU out of `KVM_RUN`.
pub fn kick_signal() -> i32 {
    SIGRTMIN() + 5
}

extern "C" fn on_kick(_: libc::c_int, _: *mut libc::siginfo_t, _: *mut libc::c_void) {
    // Only interrupts KVM_RUN; the run loop reads the pause request itself.
}

/// Installs the kick signal's handler (process-wide, once, before the
/// vCPU threads exist): without a handler the signal would end the process.
pub fn install_kick_handler() -> std::io::Result<()> {
    register_signal_handler(kick_signal(), on_kick).map_err(std::io::Error::from)
}

/// The pause request the vCPU threads share.
#[derive(Debug, Default)]
pub struct PauseGate {
    requested: AtomicBool,
    parked: Mutex<Parked>,
    changed: Condvar,
}

/// What the parked vCPUs and the pauser share under the gate's lock.
#[derive(Debug, Default)]
struct Parked {
    /// vCPUs parked now.
    count: usize,
    /// The number of the last errand asked of the parked vCPUs (a
    /// snapshot's state read: [`PauseGate::run_errand`]).
    errand: u64,
    /// How many vCPUs ran it.
    done: usize,
}

impl PauseGate {
    /// A gate with no pause requested.
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> MutexGuard<'_, Parked> {
        self.parked.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// vCPU side, before every `KVM_RUN`: parks while a pause is requested.
    /// Costs one atomic load when none is.
    pub fn check(&self) {
        self.check_with(|| {});
    }

    /// As [`check`](Self::check); while parked, runs `errand` once for
    /// each errand the pauser asks ([`run_errand`](Self::run_errand)),
    /// outside the lock.
    pub fn check_with(&self, mut errand: impl FnMut()) {
        if !self.requested.load(Ordering::Acquire) {
            return;
        }
        let mut parked = self.lock();
        parked.count += 1;
        let mut seen = parked.errand;
        self.changed.notify_all();
        while self.requested.load(Ordering::Acquire) {
            if parked.errand != seen {
                seen = parked.errand;
                drop(parked);
                errand();
                parked = self.lock();
                parked.done += 1;
                self.changed.notify_all();
                continue;
            }
            parked = self.changed.wait(parked).unwrap_or_else(|p| p.into_inner());
        }
        parked.count -= 1;
        self.changed.notify_all();
    }

    /// Pauser side, with every vCPU parked: has each of the `count` parked
    /// vCPUs run its errand once and waits for them, at most `timeout`;
    /// `false` if they had not all run it by then (or the VM is not
    /// paused).
    pub fn run_errand(&self, count: usize, timeout: Duration) -> bool {
        if !self.is_paused() {
            return false;
        }
        let deadline = Instant::now() + timeout;
        let mut parked = self.lock();
        parked.errand = parked.errand.wrapping_add(1);
        parked.done = 0;
        self.changed.notify_all();
        while parked.done < count {
            let now = Instant::now();
            if now >= deadline {
                return false;
            }
            parked = self
                .changed
                .wait_timeout(parked, deadline - now)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
        true
    }

    /// How many vCPUs are parked now.
    pub fn parked(&self) -> usize {
        self.lock().count
    }

    /// Requests a pause without waiting for anyone to park: for vCPUs
    /// not started yet, which park before their first `KVM_RUN`.
    pub fn hold(&self) {
        self.requested.store(true, Ordering::Release);
    }

    /// Whether a pause is requested.
    pub fn is_paused(&self) -> bool {
        self.requested.load(Ordering::Acquire)
    }

    /// Requests a pause and waits until `count` vCPUs are parked, calling
    /// `kick` for the ones still running every few milliseconds. On `false`
    /// (the deadline passed first) the request is withdrawn again: the VM
    /// is either paused whole or not at all.
    pub fn pause(&self, count: usize, timeout: Duration, mut kick: impl FnMut()) -> bool {
        self.requested.store(true, Ordering::Release);
        let deadline = Instant::now() + timeout;
        let mut parked = self.lock();
        while parked.count < count {
            let now = Instant::now();
            if now >= deadline {
                drop(parked);
                self.resume();
                return false;
            }
            drop(parked);
            kick();
            parked = self.lock();
            let wait = KICK_EVERY.min(deadline - now);
            parked = self
                .changed
                .wait_timeout_while(parked, wait, |p| p.count < count)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
        true
    }

    /// Withdraws the pause request and wakes the parked vCPUs.
    pub fn resume(&self) {
        let _parked = self.lock();
        self.requested.store(false, Ordering::Release);
        self.changed.notify_all();
    }
}

/// Kicks every thread in `threads` out of whatever system call it is in.
pub fn kick_all(threads: &[JoinHandle<()>]) {
    for t in threads {
        if !t.is_finished() {
            // A thread that just ended cannot be kicked, and needs no kick.
            let _ = t.kill(kick_signal());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    /// Threads that stand in for vCPUs: each counts its "runs" and calls
    /// `check` between them, as the run loop does.
    fn runners(gate: &Arc<PauseGate>, n: usize) -> (Vec<Arc<AtomicUsizeBox>>, Arc<AtomicBool>) {
        let stop = Arc::new(AtomicBool::new(false));
        let mut counts = Vec::new();
        for _ in 0..n {
            let c = Arc::new(AtomicUsizeBox::default());
            counts.push(c.clone());
            let (gate, stop) = (gate.clone(), stop.clone());
            std::thread::spawn(move || {
                while !stop.load(Ordering::SeqCst) {
                    gate.check();
                    c.0.fetch_add(1, Ordering::SeqCst);
                    std::thread::sleep(Duration::from_micros(200));
                }
            });
        }
        (counts, stop)
    }

    #[derive(Default)]
    struct AtomicUsizeBox(std::sync::atomic::AtomicUsize);

    #[test]
    fn a_pause_parks_every_runner_until_resume() {
        let gate = Arc::new(PauseGate::new());
        let (counts, stop) = runners(&gate, 3);
        std::thread::sleep(Duration::from_millis(20));
        assert!(gate.pause(3, Duration::from_secs(5), || {}));
        assert!(gate.is_paused());
        assert_eq!(gate.parked(), 3);
        let frozen: Vec<usize> = counts.iter().map(|c| c.0.load(Ordering::SeqCst)).collect();
        std::thread::sleep(Duration::from_millis(30));
        let later: Vec<usize> = counts.iter().map(|c| c.0.load(Ordering::SeqCst)).collect();
        assert_eq!(frozen, later, "a parked runner ran");
        gate.resume();
        assert!(!gate.is_paused());
        std::thread::sleep(Duration::from_millis(30));
        for (c, f) in counts.iter().zip(&frozen) {
            assert!(c.0.load(Ordering::SeqCst) > *f, "a runner did not resume");
        }
        assert_eq!(gate.parked(), 0);
        stop.store(true, Ordering::SeqCst);
    }

    #[test]
    fn a_pause_that_cannot_complete_is_withdrawn_by_its_deadline() {
        let gate = Arc::new(PauseGate::new());
        let (counts, stop) = runners(&gate, 1);
        let mut kicks = 0;
        let t = Instant::now();
        // Two vCPUs expected, one exists: the pause cannot complete.
        assert!(!gate.pause(2, Duration::from_millis(100), || kicks += 1));
        let took = t.elapsed();
        assert!(took >= Duration::from_millis(100), "{took:?}");
        assert!(took < Duration::from_secs(2), "{took:?}");
        assert!(kicks >= 5, "kicked {kicks} times");
        assert!(!gate.is_paused());
        let before = counts[0].0.load(Ordering::SeqCst);
        std::thread::sleep(Duration::from_millis(30));
        assert!(counts[0].0.load(Ordering::SeqCst) > before, "left parked");
        stop.store(true, Ordering::SeqCst);
    }

    #[test]
    fn an_errand_runs_once_on_every_parked_runner_and_only_while_paused() {
        let gate = Arc::new(PauseGate::new());
        assert!(!gate.run_errand(2, Duration::from_millis(10)), "not paused");
        let ran = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        for _ in 0..2 {
            let (gate, ran, stop) = (gate.clone(), ran.clone(), stop.clone());
            std::thread::spawn(move || {
                while !stop.load(Ordering::SeqCst) {
                    gate.check_with(|| {
                        ran.fetch_add(1, Ordering::SeqCst);
                    });
                    std::thread::sleep(Duration::from_micros(200));
                }
            });
        }
        assert!(gate.pause(2, Duration::from_secs(5), || {}));
        assert_eq!(
            ran.load(Ordering::SeqCst),
            0,
            "no errand before one is asked"
        );
        assert!(gate.run_errand(2, Duration::from_secs(5)));
        assert_eq!(ran.load(Ordering::SeqCst), 2);
        assert!(gate.run_errand(2, Duration::from_secs(5)));
        assert_eq!(ran.load(Ordering::SeqCst), 4);
        // Three runners asked for, two exist: the deadline ends the wait.
        assert!(!gate.run_errand(3, Duration::from_millis(50)));
        gate.resume();
        stop.store(true, Ordering::SeqCst);
    }

    #[test]
    fn check_without_a_request_returns_at_once() {
        let gate = PauseGate::new();
        gate.check();
        assert_eq!(gate.parked(), 0);
    }

    #[test]
    fn a_kick_interrupts_a_blocking_system_call() {
        install_kick_handler().expect("handler");
        let (tx, rx) = std::sync::mpsc::channel();
        let t = std::thread::spawn(move || {
            // A pipe nobody writes: read blocks until a signal interrupts it.
            let mut fds = [0i32; 2];
            // SAFETY: `fds` is a writable array of two ints, as pipe(2) needs.
            assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
            let mut b = [0u8; 1];
            // SAFETY: reads at most one byte into `b`, a valid local buffer.
            let n = unsafe { libc::read(fds[0], b.as_mut_ptr().cast(), 1) };
            let errno = std::io::Error::last_os_error().raw_os_error();
            tx.send((n, errno)).unwrap();
        });
        std::thread::sleep(Duration::from_millis(50));
        let threads = vec![t];
        kick_all(&threads);
        let (n, errno) = rx.recv_timeout(Duration::from_secs(5)).expect("woken");
        assert_eq!((n, errno), (-1, Some(libc::EINTR)));
    }
}
