// SPDX-License-Identifier: Apache-2.0
//! Where the guest console's output goes, as Firecracker's `PUT /serial`
//! sets it: stdout, or a file (appended to) or FIFO at `serial_out_path`,
//! through a token bucket of bytes when `rate_limiter` is given.
//!
//! The UART hands over one byte per write. To a file or FIFO they go a line
//! at a time (or every [`MAX_LINE`] bytes of a line that does not end), through
//! the non-blocking line writer the log and the metrics use: a slow or
//! absent FIFO reader never stalls the vCPU that wrote the byte, and what it
//! does not take in time is dropped and counted there. The bucket is
//! charged per write, before anything is queued: a write it cannot pay for
//! is dropped whole, as Firecracker drops it, and counted (in the metrics as
//! Firecracker's `uart.rate_limiter_dropped_bytes`); the first drop is
//! logged once (a guest flooding its console is the guest's doing, so one
//! line, not one per byte). The bucket is shared ([`SerialLimiter`]) with
//! the snapshot code, which saves it and takes it back.

use std::io::{Stdout, Write};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use devices::rate_limiter::persist::{restore_bucket, BucketStateError, TokenBucketState};
use devices::rate_limiter::{TokenBucket, TokenBucketConfig};

use crate::line_writer::NonBlockingLineWriter;

/// Most bytes held back waiting for the end of a line.
pub const MAX_LINE: usize = 1024;

/// Errors opening the console's output.
#[derive(Debug, thiserror::Error)]
pub enum SerialOutError {
    /// `serial_out_path` cannot be opened.
    #[error("serial_out_path '{0}': cannot open it")]
    Open(PathBuf, #[source] std::io::Error),
    /// The bucket is invalid (the configuration checks it first).
    #[error("serial rate_limiter: {0}")]
    Limiter(String),
}

enum Dest {
    Stdout(Stdout),
    File {
        out: NonBlockingLineWriter,
        line: Vec<u8>,
    },
}

/// The console's bucket (none without a `rate_limiter`), shared by the
/// output, which charges it on the vCPU thread, and the snapshot code,
/// which reads and replaces it with the vCPUs paused (so the lock is never
/// contended while the guest writes).
#[derive(Clone)]
pub struct SerialLimiter {
    bucket: Arc<Mutex<Option<TokenBucket>>>,
    clock: fn() -> u64,
}

impl SerialLimiter {
    fn lock(&self) -> std::sync::MutexGuard<'_, Option<TokenBucket>> {
        // A bucket is changed by whole assignments: a panic elsewhere
        // cannot leave it half written.
        self.bucket.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The bucket's state now, for a snapshot.
    pub fn save(&self) -> Option<TokenBucketState> {
        self.lock().as_ref().map(|b| b.save((self.clock)()))
    }

    /// Takes back a saved bucket, configured as `cfg`; a forged one, or one
    /// only one side has, is refused and nothing changes.
    pub fn restore(
        &self,
        cfg: Option<&TokenBucketConfig>,
        state: Option<&TokenBucketState>,
    ) -> Result<(), BucketStateError> {
        let bucket = restore_bucket("serial", cfg.copied(), state, (self.clock)())?;
        *self.lock() = bucket;
        Ok(())
    }
}

/// The console's output: see the module doc.
pub struct SerialOut {
    dest: Dest,
    limiter: SerialLimiter,
    dropped_bytes: Arc<AtomicU64>,
}

impl std::fmt::Debug for SerialOut {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SerialOut")
            .field("dropped_bytes", &self.dropped_bytes())
            .finish_non_exhaustive()
    }
}

fn monotonic_ns() -> u64 {
    crate::monotonic_us().saturating_mul(1000)
}

impl SerialOut {
    /// Opens the output `path` names (stdout without one), limited by
    /// `limiter` if given.
    pub fn open(
        path: Option<&std::path::Path>,
        limiter: Option<&TokenBucketConfig>,
    ) -> Result<Self, SerialOutError> {
        let dest = match path {
            None => Dest::Stdout(std::io::stdout()),
            Some(p) => Dest::File {
                out: NonBlockingLineWriter::open(p)
                    .map_err(|e| SerialOutError::Open(p.to_path_buf(), e))?,
                line: Vec::with_capacity(MAX_LINE),
            },
        };
        Self::with_clock(dest, limiter, monotonic_ns)
    }

    fn with_clock(
        dest: Dest,
        limiter: Option<&TokenBucketConfig>,
        clock: fn() -> u64,
    ) -> Result<Self, SerialOutError> {
        let limiter = limiter
            .map(|b| TokenBucket::new("serial", b, clock()))
            .transpose()
            .map_err(|e| SerialOutError::Limiter(e.to_string()))?;
        Ok(SerialOut {
            dest,
            limiter: SerialLimiter {
                bucket: Arc::new(Mutex::new(limiter)),
                clock,
            },
            dropped_bytes: Arc::default(),
        })
    }

    /// The bucket, for the snapshot code.
    pub fn limiter(&self) -> SerialLimiter {
        self.limiter.clone()
    }

    /// Bytes the rate limiter dropped so far.
    pub fn dropped_bytes(&self) -> u64 {
        self.dropped_bytes.load(Ordering::Relaxed)
    }

    /// The count of dropped bytes, for the metrics.
    pub fn dropped_counter(&self) -> Arc<AtomicU64> {
        self.dropped_bytes.clone()
    }

    /// Whether the bucket lets `n` bytes through now (and charges them).
    fn admit(&mut self, n: usize) -> bool {
        let clock = self.limiter.clock;
        let mut bucket = self.limiter.lock();
        let Some(b) = bucket.as_mut() else {
            return true;
        };
        if b.reduce(n as u64, clock()).is_ok() {
            return true;
        }
        drop(bucket);
        if self.dropped_bytes() == 0 {
            log::warn!(
                "the guest's console output exceeds the serial rate limiter; what exceeds it \
                 is dropped"
            );
        }
        self.dropped_bytes.fetch_add(n as u64, Ordering::Relaxed);
        false
    }
}

impl Write for SerialOut {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if !self.admit(buf.len()) {
            return Ok(buf.len());
        }
        match &mut self.dest {
            Dest::Stdout(out) => out.write(buf),
            Dest::File { out, line } => {
                for chunk in buf.split_inclusive(|&b| b == b'\n') {
                    line.extend_from_slice(chunk);
                    if line.ends_with(b"\n") || line.len() >= MAX_LINE {
                        out.write_line(line);
                        line.clear();
                    }
                }
                Ok(buf.len())
            }
        }
    }

    fn flush(&mut self) -> std::io::Result<()> {
        match &mut self.dest {
            Dest::Stdout(out) => out.flush(),
            Dest::File { out, line } => {
                if !line.is_empty() {
                    out.write_line(line);
                    line.clear();
                }
                Ok(())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU64, Ordering};

    static NOW: AtomicU64 = AtomicU64::new(0);

    fn test_clock() -> u64 {
        NOW.load(Ordering::SeqCst)
    }

    fn file_out(name: &str, limiter: Option<&TokenBucketConfig>) -> (PathBuf, SerialOut) {
        let p = std::env::temp_dir().join(format!("minivmm-serial-{name}-{}", std::process::id()));
        let _ = std::fs::remove_file(&p);
        let dest = Dest::File {
            out: NonBlockingLineWriter::open(&p).unwrap(),
            line: Vec::new(),
        };
        (
            p.clone(),
            SerialOut::with_clock(dest, limiter, test_clock).unwrap(),
        )
    }

    #[test]
    fn bytes_reach_the_file_a_line_at_a_time() {
        let (p, mut out) = file_out("lines", None);
        for b in b"hello\nwor" {
            assert_eq!(out.write(&[*b]).unwrap(), 1);
        }
        assert_eq!(std::fs::read(&p).unwrap(), b"hello\n");
        out.write_all(b"ld\n").unwrap();
        assert_eq!(std::fs::read(&p).unwrap(), b"hello\nworld\n");
        // One write holding the end of a line and the start of the next:
        // the line goes out at its newline, the rest waits.
        out.write_all(b"one\ntwo").unwrap();
        assert_eq!(std::fs::read(&p).unwrap(), b"hello\nworld\none\n");
        out.write_all(b"\n").unwrap();
        assert_eq!(std::fs::read(&p).unwrap(), b"hello\nworld\none\ntwo\n");
        // A line that never ends goes out at the bound, and on flush.
        out.write_all(&[b'x'; MAX_LINE]).unwrap();
        assert_eq!(std::fs::read(&p).unwrap().len(), 20 + MAX_LINE);
        out.write_all(b"tail").unwrap();
        out.flush().unwrap();
        assert!(std::fs::read(&p).unwrap().ends_with(b"xtail"));
        assert_eq!(out.dropped_bytes(), 0);
        std::fs::remove_file(&p).unwrap();
    }

    #[test]
    fn the_bucket_drops_what_exceeds_it_and_refills() {
        NOW.store(1_000_000_000, Ordering::SeqCst);
        // 10 bytes per 100 ms.
        let bucket = TokenBucketConfig {
            size: 10,
            one_time_burst: 0,
            refill_time: 100,
        };
        let (p, mut out) = file_out("limited", Some(&bucket));
        for b in b"0123456789abcdef\n" {
            out.write_all(&[*b]).unwrap();
        }
        out.flush().unwrap();
        // Ten bytes went through; the other seven were dropped and counted.
        assert_eq!(std::fs::read(&p).unwrap(), b"0123456789");
        assert_eq!(out.dropped_bytes(), 7);
        let counter = out.dropped_counter();
        assert_eq!(counter.load(Ordering::Relaxed), 7);
        // A refill later, the next bytes pass again.
        NOW.fetch_add(100_000_000, Ordering::SeqCst);
        out.write_all(b"ok\n").unwrap();
        assert!(std::fs::read(&p).unwrap().ends_with(b"ok\n"));
        assert_eq!(out.dropped_bytes(), 7);
        std::fs::remove_file(&p).unwrap();
    }

    #[test]
    fn a_restored_bucket_has_what_the_saved_one_had() {
        // 10 bytes an hour: whatever other tests do to the clock, no byte
        // is earned here.
        let bucket = TokenBucketConfig {
            size: 10,
            one_time_burst: 0,
            refill_time: 3_600_000,
        };
        let (p, mut out) = file_out("saved", Some(&bucket));
        out.write_all(b"123456").unwrap();
        let state = out.limiter().save();
        assert_eq!(state.as_ref().map(|s| s.budget), Some(4));
        let (q, mut back) = file_out("restored", Some(&bucket));
        back.limiter()
            .restore(Some(&bucket), state.as_ref())
            .unwrap();
        for b in b"abcdef\n" {
            back.write_all(&[*b]).unwrap();
        }
        back.flush().unwrap();
        assert_eq!(std::fs::read(&q).unwrap(), b"abcd");
        assert_eq!(back.dropped_bytes(), 3);
        // A bucket the configuration lacks, or more bytes than its size,
        // is refused and the bucket kept.
        let err = back.limiter().restore(None, state.as_ref()).unwrap_err();
        assert_eq!(
            err.to_string(),
            "the saved state has a serial bucket, the configuration has none"
        );
        let mut forged = state.clone().unwrap();
        forged.budget = 11;
        assert!(back
            .limiter()
            .restore(Some(&bucket), Some(&forged))
            .is_err());
        assert_eq!(back.limiter().save().map(|s| s.budget), Some(0));
        // No bucket on either side: nothing to save or restore.
        let (r, none) = file_out("none", None);
        assert_eq!(none.limiter().save(), None);
        assert!(none.limiter().restore(None, None).is_ok());
        for f in [p, q, r] {
            std::fs::remove_file(f).unwrap();
        }
    }

    /// The bucket refills on the monotonic clock: what was dropped a
    /// moment ago passes once the refill time has gone by.
    #[test]
    fn the_real_clock_refills_the_bucket() {
        let bucket = TokenBucketConfig {
            size: 4,
            one_time_burst: 0,
            refill_time: 1,
        };
        let p = std::env::temp_dir().join(format!("minivmm-serial-clock-{}", std::process::id()));
        let _ = std::fs::remove_file(&p);
        let mut out = SerialOut::open(Some(&p), Some(&bucket)).unwrap();
        out.write_all(b"abcd").unwrap();
        out.write_all(b"e").unwrap();
        assert_eq!(out.dropped_bytes(), 1);
        std::thread::sleep(std::time::Duration::from_millis(20));
        out.write_all(b"f\n").unwrap();
        assert_eq!(out.dropped_bytes(), 1);
        assert_eq!(std::fs::read(&p).unwrap(), b"abcdf\n");
        std::fs::remove_file(&p).unwrap();
    }

    #[test]
    fn an_unopenable_path_is_one_line() {
        let err =
            SerialOut::open(Some(std::path::Path::new("/nonexistent/dir/out")), None).unwrap_err();
        assert!(crate::error_line(&err).starts_with("serial_out_path '/nonexistent/dir/out'"));
        let zero = TokenBucketConfig {
            size: 0,
            one_time_burst: 0,
            refill_time: 100,
        };
        let err = SerialOut::open(None, Some(&zero)).unwrap_err();
        assert!(crate::error_line(&err).starts_with("serial rate_limiter: "));
    }
}
