// SPDX-License-Identifier: Apache-2.0
//! What the devices' suites check besides rings and registers, whatever the
//! device: the log lines a thread wrote ([`test_log`]), a counter's change
//! across a block of code ([`check_metric_after_block!`]), and a temporary
//! directory for files a device works on ([`TempDir`]). Tests only.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};

/// A directory removed with everything in it when dropped.
pub struct TempDir(pub PathBuf);

impl TempDir {
    /// A fresh, empty directory.
    pub fn new() -> Self {
        static N: AtomicU64 = AtomicU64::new(0);
        let p = std::env::temp_dir().join(format!(
            "minivmm-dev-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&p).unwrap();
        TempDir(p)
    }

    /// A file `name` in it holding `data`.
    pub fn file(&self, name: &str, data: &[u8]) -> PathBuf {
        let p = self.0.join(name);
        std::fs::write(&p, data).unwrap();
        p
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Captures log records per thread (tests run in parallel in one process,
/// each driving its device from its own thread).
pub mod test_log {
    use std::cell::RefCell;
    use std::sync::Once;

    struct Capture;

    thread_local! {
        static LINES: RefCell<Vec<String>> = const { RefCell::new(Vec::new()) };
    }

    impl log::Log for Capture {
        fn enabled(&self, _: &log::Metadata<'_>) -> bool {
            true
        }
        fn log(&self, r: &log::Record<'_>) {
            LINES.with(|l| l.borrow_mut().push(r.args().to_string()));
        }
        fn flush(&self) {}
    }

    static CAPTURE: Capture = Capture;
    static INSTALL: Once = Once::new();

    /// Installs the logger (once per process) and returns the lines this
    /// thread logged so far.
    pub fn lines() -> Vec<String> {
        INSTALL.call_once(|| {
            if log::set_logger(&CAPTURE).is_ok() {
                log::set_max_level(log::LevelFilter::Trace);
            }
        });
        LINES.with(|l| l.borrow().clone())
    }

    /// How many lines this thread logged so far.
    pub fn records() -> u64 {
        lines().len() as u64
    }
}

/// Asserts that a metric changed by `delta` across `block`.
macro_rules! check_metric_after_block {
    ($metric:expr, $delta:expr, $block:expr) => {{
        let before = $metric.load(std::sync::atomic::Ordering::Relaxed);
        let r = $block;
        let after = $metric.load(std::sync::atomic::Ordering::Relaxed);
        assert_eq!(
            after - before,
            $delta,
            "{} changed by {}",
            stringify!($metric),
            after - before
        );
        r
    }};
}
pub(crate) use check_metric_after_block;
