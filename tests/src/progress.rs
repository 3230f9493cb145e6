// SPDX-License-Identifier: Apache-2.0
//! Deadlines that follow progress, so that a test tells a slow guest from a broken one.
//!
//! A guest on a host loaded by other work (other guests booting, compilers, a CPU hog) is slow,
//! not broken: a fixed wall-clock deadline fails it anyway. A [`Watch`] instead fails a wait
//! after a stall window without any sign of progress (console bytes, frames, a command's
//! output: counters the caller hands it), and after a generous cap whatever happens. Both are
//! measured in the watched processes' own time: wall-clock time minus the time their threads
//! spent runnable but waiting for a CPU (the scheduler's `run_delay`,
//! `/proc/PID/task/TID/schedstat`), which is exactly the time the host's other work took from
//! them. A guest that stops (a VMM stopped by SIGSTOP, a device that never answers, a halted
//! vCPU) waits for no CPU, so it fails after the stall window, as a fixed deadline of that
//! length did; a guest that computes without a sign of progress fails after the stall window of
//! the CPU time it was given; a guest that keeps progressing without reaching what is waited
//! for (a reboot loop, endless warnings) ends at the cap. On a host where the VMM gets a tenth
//! of a CPU (a load of 20 on 2 cores was seen) all of them stretch tenfold on the clock.

use std::collections::BTreeMap;
use std::fmt;
use std::time::{Duration, Instant};

/// How long a wait may last, in the watched processes' own time: `stall` without progress, and
/// `cap` in all.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Patience {
    /// The longest span without progress.
    pub stall: Duration,
    /// The longest wait in all, progress or not.
    pub cap: Duration,
}

impl Patience {
    /// How many times its stall window a wait that keeps progressing may last ([`Patience::of`]).
    pub const CAP_FACTOR: u32 = 3;

    /// `stall` without progress, `cap` in all.
    pub const fn new(stall: Duration, cap: Duration) -> Patience {
        Patience { stall, cap }
    }

    /// What a former fixed `timeout` becomes: a stalled guest fails after `timeout` as it did,
    /// one that keeps progressing may take [`Patience::CAP_FACTOR`] times as long.
    pub fn of(timeout: Duration) -> Patience {
        Patience::new(timeout, timeout * Self::CAP_FACTOR)
    }
}

/// Why a watched wait ended without what it waited for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Expired {
    /// No progress for `idle` of the watched processes' own time (`wall` on the clock).
    Stalled {
        /// Own time since the last progress.
        idle: Duration,
        /// Wall-clock time since the last progress.
        wall: Duration,
        /// Wall-clock time since the wait began.
        waited: Duration,
    },
    /// Progress went on, but the cap passed.
    Capped {
        /// Own time since the wait began (at least the cap).
        own: Duration,
        /// Wall-clock time since the wait began.
        waited: Duration,
    },
}

impl fmt::Display for Expired {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Expired::Stalled { idle, wall, waited } => write!(
                f,
                "no progress for {:.1} s of the watched processes' own time ({:.1} s on the \
                 clock, {:.1} s waited in all)",
                idle.as_secs_f64(),
                wall.as_secs_f64(),
                waited.as_secs_f64()
            ),
            Expired::Capped { own, waited } => write!(
                f,
                "still progressing, but the cap passed ({:.1} s of the watched processes' own \
                 time, {:.1} s on the clock)",
                own.as_secs_f64(),
                waited.as_secs_f64()
            ),
        }
    }
}

impl std::error::Error for Expired {}

/// Run delays (time runnable but not running) of a set of threads, by thread id.
pub type RunDelays = BTreeMap<u32, Duration>;

/// The scheduler's run delay of every thread of every process in `pids` (threads that are gone
/// or unreadable are left out).
pub fn run_delays(pids: &[u32]) -> RunDelays {
    let mut delays = RunDelays::new();
    for pid in pids {
        let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
            continue;
        };
        for task in tasks.flatten() {
            let Some(tid) = task.file_name().to_str().and_then(|t| t.parse().ok()) else {
                continue;
            };
            // "<on-cpu ns> <run-delay ns> <timeslices>"
            let delay = std::fs::read_to_string(task.path().join("schedstat"))
                .ok()
                .and_then(|s| s.split_whitespace().nth(1)?.parse::<u64>().ok());
            if let Some(ns) = delay {
                delays.insert(tid, Duration::from_nanos(ns));
            }
        }
    }
    delays
}

/// The longest a thread waited for a CPU between the run delays `before` and `now`: the host's
/// other work held the watched processes back that long (threads run side by side, so the
/// largest single delay, not the sum). A thread born since counts from zero.
fn cpu_wait_since(before: &RunDelays, now: &RunDelays) -> Duration {
    now.iter()
        .map(|(tid, d)| d.saturating_sub(before.get(tid).copied().unwrap_or(Duration::ZERO)))
        .max()
        .unwrap_or(Duration::ZERO)
}

/// A progress-watching deadline for one wait (see the module documentation).
#[derive(Debug, Clone)]
pub struct Watch {
    patience: Patience,
    pids: Vec<u32>,
    started: Instant,
    last_progress: Instant,
    /// Each thread's run delay when the wait began, and at the last progress.
    delays_at_start: RunDelays,
    delays_at_progress: RunDelays,
    marks: Vec<u64>,
    longest_idle: Duration,
}

impl Watch {
    /// Starts watching now, the threads of `pids` giving the own time (none: wall-clock time).
    pub fn new(patience: Patience, pids: &[u32]) -> Watch {
        Watch::new_at(Instant::now(), patience, pids, run_delays(pids))
    }

    /// [`Watch::new`] at `now`, with the run delays read then.
    pub fn new_at(now: Instant, patience: Patience, pids: &[u32], delays: RunDelays) -> Watch {
        Watch {
            patience,
            pids: pids.to_vec(),
            started: now,
            last_progress: now,
            delays_at_start: delays.clone(),
            delays_at_progress: delays,
            marks: Vec::new(),
            longest_idle: Duration::ZERO,
        }
    }

    /// Takes this moment's signs of life, `marks` (counters such as console bytes or frames:
    /// any change is progress), and says whether the wait may go on.
    pub fn check(&mut self, marks: &[u64]) -> Result<(), Expired> {
        let delays = run_delays(&self.pids);
        self.check_at(Instant::now(), &delays, marks)
    }

    /// [`Watch::check`] at `now`, with the run delays read then.
    pub fn check_at(
        &mut self,
        now: Instant,
        delays: &RunDelays,
        marks: &[u64],
    ) -> Result<(), Expired> {
        let waited = now.saturating_duration_since(self.started);
        if marks != self.marks.as_slice() {
            self.marks = marks.to_vec();
            self.last_progress = now;
            self.delays_at_progress = delays.clone();
        }
        let wall = now.saturating_duration_since(self.last_progress);
        let idle = wall.saturating_sub(cpu_wait_since(&self.delays_at_progress, delays));
        self.longest_idle = self.longest_idle.max(idle);
        if idle >= self.patience.stall {
            return Err(Expired::Stalled { idle, wall, waited });
        }
        let own = waited.saturating_sub(cpu_wait_since(&self.delays_at_start, delays));
        if own >= self.patience.cap {
            return Err(Expired::Capped { own, waited });
        }
        Ok(())
    }

    /// The longest span without progress seen so far, in own time (a figure for the log: how
    /// close a passing wait came to its stall window).
    pub fn longest_idle(&self) -> Duration {
        self.longest_idle
    }

    /// Wall-clock time since the wait began.
    pub fn waited(&self) -> Duration {
        self.started.elapsed()
    }

    /// The patience this wait runs with.
    pub fn patience(&self) -> Patience {
        self.patience
    }
}

/// What a watched command ([`run_watched`]) did.
#[derive(Debug)]
pub struct Watched {
    /// Its exit status (after the signals that ended it, if the watch expired).
    pub status: std::process::ExitStatus,
    /// Everything it wrote on stdout.
    pub stdout: Vec<u8>,
    /// Everything it wrote on stderr.
    pub stderr: Vec<u8>,
    /// Why it was ended, if the watch expired; `None` when it ended by itself.
    pub expired: Option<Expired>,
}

impl Watched {
    /// Whether it ended by itself with status 0.
    pub fn success(&self) -> bool {
        self.expired.is_none() && self.status.success()
    }

    /// Its stdout as text.
    pub fn stdout_text(&self) -> String {
        String::from_utf8_lossy(&self.stdout).into_owned()
    }

    /// Its stderr as text, with a line saying why it was ended if it was.
    pub fn stderr_text(&self) -> String {
        let mut text = String::from_utf8_lossy(&self.stderr).into_owned();
        if let Some(why) = self.expired {
            text.push_str(&format!("(ended by the test's watch: {why})\n"));
        }
        text
    }
}

/// Reads `r` to its end into a shared buffer, on a thread of its own.
fn drain<R: std::io::Read + Send + 'static>(
    mut r: R,
) -> (
    std::sync::Arc<std::sync::Mutex<Vec<u8>>>,
    std::thread::JoinHandle<()>,
) {
    let buf = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let sink = buf.clone();
    let h = std::thread::spawn(move || {
        let mut chunk = [0u8; 4096];
        loop {
            match r.read(&mut chunk) {
                Ok(0) | Err(_) => break,
                Ok(n) => sink
                    .lock()
                    .expect("no reader panics")
                    .extend_from_slice(&chunk[..n]),
            }
        }
    });
    (buf, h)
}

/// Sends `sig` to every process of process group `pgid`.
#[allow(unsafe_code)]
fn signal_group(pgid: u32, sig: libc::c_int) {
    let Ok(pgid) = libc::pid_t::try_from(pgid) else {
        return;
    };
    // SAFETY: kill(2) with a negative pid only sends a signal to that process group; it touches
    // no memory of ours. A group that is already gone gives ESRCH, which is ignored.
    unsafe {
        libc::kill(-pgid, sig);
    }
}

/// How often a watched command is looked at.
const POLL: Duration = Duration::from_millis(100);
/// How often a watched command's probe runs (it may start a process of its own).
const PROBE_EVERY: Duration = Duration::from_secs(1);
/// How long a command ended by SIGINT gets to print its summary before SIGKILL. A command
/// answers SIGINT in a moment on a quiet host; beside two busy loops a shell's trap had not
/// run 5 s after it, so the summary was lost. Only a command that ignores SIGINT waits it all.
const INT_GRACE: Duration = Duration::from_secs(30);

/// Runs `cmd` to its end, stdin empty and its output captured, in a process group of its own,
/// under a [`Watch`] of `patience` over the threads of `pids`: its progress is any output byte
/// or any change in the counters `probe` returns (frames on a TAP, say; asked once a second).
/// When the watch expires
/// the group gets SIGINT (ping and iperf3 print their summary on it; the command starts with
/// SIGINT at its default, whatever this process inherited), then SIGKILL. When the
/// command has ended, by itself or not, its group gets SIGKILL too, so no process it started
/// outlives it or holds its output open.
pub fn run_watched(
    cmd: &mut std::process::Command,
    patience: Patience,
    pids: &[u32],
    mut probe: impl FnMut() -> Vec<u64>,
) -> std::io::Result<Watched> {
    use std::os::unix::process::CommandExt;
    use std::process::Stdio;
    // SAFETY: the closure runs in the child between fork and exec and calls
    // only async-signal-safe functions (sigemptyset, sigaddset,
    // sigprocmask, signal) on its own stack's set.
    unsafe {
        cmd.pre_exec(|| {
            // The watch's SIGINT must reach the command: a test run started
            // in the background of a non-interactive shell (`.ci/run ... &`)
            // inherits SIGINT ignored, and a shell cannot trap a signal that
            // was ignored when it started, so its trap never ran and the
            // SIGKILL 30 s later ended it instead.
            let mut set: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut set);
            libc::sigaddset(&mut set, libc::SIGINT);
            libc::sigprocmask(libc::SIG_UNBLOCK, &set, std::ptr::null_mut());
            libc::signal(libc::SIGINT, libc::SIG_DFL);
            Ok(())
        });
    }
    let mut child = cmd
        .process_group(0)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()?;
    let pgid = child.id();
    let (stdout, out_thread) = drain(child.stdout.take().expect("piped stdout"));
    let (stderr, err_thread) = drain(child.stderr.take().expect("piped stderr"));
    let mut watch = Watch::new(patience, pids);
    let mut probed: (Option<Instant>, Vec<u64>) = (None, Vec::new());
    let mut expired = None;
    let mut interrupted_at: Option<Instant> = None;
    let status = loop {
        if let Some(status) = child.try_wait()? {
            break status;
        }
        match interrupted_at {
            None => {
                let mut marks = vec![
                    stdout.lock().expect("no reader panics").len() as u64,
                    stderr.lock().expect("no reader panics").len() as u64,
                ];
                if probed.0.is_none_or(|t| t.elapsed() >= PROBE_EVERY) {
                    probed = (Some(Instant::now()), probe());
                }
                marks.extend_from_slice(&probed.1);
                if let Err(why) = watch.check(&marks) {
                    expired = Some(why);
                    interrupted_at = Some(Instant::now());
                    signal_group(pgid, libc::SIGINT);
                }
            }
            Some(t) if t.elapsed() >= INT_GRACE => signal_group(pgid, libc::SIGKILL),
            Some(_) => {}
        }
        std::thread::sleep(POLL);
    };
    signal_group(pgid, libc::SIGKILL);
    let _ = out_thread.join();
    let _ = err_thread.join();
    let take = |b: std::sync::Arc<std::sync::Mutex<Vec<u8>>>| {
        std::mem::take(&mut *b.lock().expect("no reader panics"))
    };
    Ok(Watched {
        status,
        stdout: take(stdout),
        stderr: take(stderr),
        expired,
    })
}
