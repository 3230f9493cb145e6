// SPDX-License-Identifier: Apache-2.0
//! `--metrics`: one JSON object per line, for operators to collect.
//!
//! A line is written every `--metrics-interval` seconds (default 60, as
//! Firecracker flushes; 0 = none on a timer), on SIGUSR1 and at exit:
//!
//! ```json
//! {"utc_timestamp_ms":1764669600123,"id":"vm0","vmm":{"uptime_ms":61002,
//!  "vcpu_exits":{"io_in":812,...},"metrics_lines_dropped":0},"net0":{"rx_frames":...},
//!  "net1":{...}}
//! ```
//!
//! `utc_timestamp_ms` is milliseconds since the Unix epoch (Firecracker's
//! key); `id` is the instance id (`--id`, `anonymous-instance` without it),
//! which Firecracker's lines lack: several VMs writing into one FIFO are told
//! apart by it; `vmm` holds the VMM's own counters; every network card and
//! drive follows under its id, so none may be named as one of those three
//! (`config::ids::RESERVED_KEYS`, where the rule for device ids is). Unlike Firecracker's, whose counters restart at every flush, every
//! counter here is cumulative since minivmm started: a reader takes deltas
//! between lines and a lost line loses nothing. The objects are serde
//! serializations of the counter structs, so the keys are their field names.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use devices::virtio::DeviceMetrics;
use serde::ser::SerializeMap;
use serde::Serialize;

use crate::config::ids::DEFAULT_ID;
#[cfg(test)]
use crate::config::ids::RESERVED_KEYS;
use crate::line_writer::NonBlockingLineWriter;

/// vCPU exits to userspace, by kind (every vCPU together).
#[derive(Debug, Default, Serialize)]
pub struct VcpuExits {
    /// Port reads (`in`).
    pub io_in: AtomicU64,
    /// Port writes (`out`).
    pub io_out: AtomicU64,
    /// Loads from device (unbacked) addresses.
    pub mmio_read: AtomicU64,
    /// Stores to device (unbacked) addresses.
    pub mmio_write: AtomicU64,
}

/// The `vmm` object of a line.
#[derive(Debug, Serialize)]
struct VmmLine<'a> {
    uptime_ms: u64,
    vcpu_exits: &'a VcpuExits,
    /// Metrics lines a FIFO reader did not take in time.
    metrics_lines_dropped: u64,
}

/// One device's counters under its id.
pub type DeviceCounters = (String, Arc<dyn DeviceMetrics>);

/// One line: its own keys first, then every device's counters under its id
/// in attach order (device ids never equal each other nor the line's own
/// keys: the configuration checks).
struct Line<'a> {
    utc_timestamp_ms: u64,
    id: &'a str,
    properties: &'a BTreeMap<String, String>,
    uart: Option<UartLine>,
    vmm: VmmLine<'a>,
    devices: &'a [DeviceCounters],
}

impl Serialize for Line<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        // No length hint: JSON writes none, and a wrong one could not be seen.
        let mut map = s.serialize_map(None)?;
        map.serialize_entry("utc_timestamp_ms", &self.utc_timestamp_ms)?;
        map.serialize_entry("id", self.id)?;
        if !self.properties.is_empty() {
            map.serialize_entry("properties", self.properties)?;
        }
        map.serialize_entry("vmm", &self.vmm)?;
        if let Some(uart) = &self.uart {
            map.serialize_entry("uart", uart)?;
        }
        for (id, counters) in self.devices {
            map.serialize_entry(id, &counters.to_json())?;
        }
        map.end()
    }
}

/// Locks a shared metrics writer; a poisoned lock still holds usable counters.
pub fn lock_metrics(m: &Mutex<Metrics>) -> MutexGuard<'_, Metrics> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// The metrics writer: where lines go and what they report.
pub struct Metrics {
    out: NonBlockingLineWriter,
    id: String,
    start: Instant,
    exits: Arc<VcpuExits>,
    devices: Vec<DeviceCounters>,
    properties: BTreeMap<String, String>,
    uart_dropped: Option<Arc<AtomicU64>>,
}

/// Firecracker's `uart` object: the console bytes its rate limiter dropped.
#[derive(Serialize)]
struct UartLine {
    rate_limiter_dropped_bytes: u64,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics")
            .field("id", &self.id)
            .field("devices", &self.devices.len())
            .finish_non_exhaustive()
    }
}

impl Metrics {
    /// Opens the file or FIFO (once, for the life of the process).
    pub fn open(path: &Path) -> std::io::Result<Metrics> {
        Ok(Metrics {
            out: NonBlockingLineWriter::open(path)?,
            id: DEFAULT_ID.to_string(),
            start: Instant::now(),
            exits: Arc::default(),
            devices: Vec::new(),
            properties: BTreeMap::new(),
            uart_dropped: None,
        })
    }

    /// Reports `exits` and every device's counters under its id, and the
    /// uptime from `start` (when the process started).
    pub fn attach(&mut self, exits: Arc<VcpuExits>, devices: Vec<DeviceCounters>, start: Instant) {
        self.exits = exits;
        self.devices = devices;
        self.start = start;
    }

    /// Writes `properties` (Firecracker's operator key-value pairs) under
    /// `properties` in every line; none, no key.
    pub fn set_properties(&mut self, properties: BTreeMap<String, String>) {
        self.properties = properties;
    }

    /// Reports the console's dropped bytes under `uart` in every line.
    pub fn set_uart_dropped(&mut self, dropped: Arc<AtomicU64>) {
        self.uart_dropped = Some(dropped);
    }

    /// Names the instance in every line (`--id`).
    pub fn set_id(&mut self, id: &str) {
        self.id = id.to_string();
    }

    /// The line as it would be written now.
    pub fn line(&self) -> String {
        let utc_timestamp_ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
        let line = Line {
            utc_timestamp_ms,
            id: &self.id,
            properties: &self.properties,
            uart: self.uart_dropped.as_ref().map(|d| UartLine {
                rate_limiter_dropped_bytes: d.load(std::sync::atomic::Ordering::Relaxed),
            }),
            vmm: VmmLine {
                uptime_ms: u64::try_from(self.start.elapsed().as_millis()).unwrap_or(u64::MAX),
                vcpu_exits: &self.exits,
                metrics_lines_dropped: self.out.dropped_lines(),
            },
            devices: &self.devices,
        };
        // Serializing plain structs and counters into a String cannot fail.
        let mut text = serde_json::to_string(&line).expect("metrics serialize");
        text.push('\n');
        text
    }

    /// Writes one line.
    pub fn flush(&mut self) {
        let line = self.line();
        self.out.write_line(line.as_bytes());
    }

    /// Writes the final line without waiting for a slow FIFO reader (the
    /// exit runs under the event loop's seccomp filter, which has no sleep,
    /// and a stop request must not hang on a stalled reader): what the FIFO
    /// takes now goes, the lines it does not take, the final one among
    /// them if it finds no room, are dropped, counted and named in one
    /// warning. Returns how many were dropped at exit.
    pub fn finish(&mut self) -> u64 {
        let line = self.line();
        let lost = self.out.finish(line.as_bytes());
        if let Some(warning) = exit_warning(lost, self.out.dropped_lines()) {
            log::warn!("{warning}");
        }
        lost
    }
}

/// What the exit says when `lost` lines never reached the reader (`None`
/// when all did), with the `dropped` of the whole run.
fn exit_warning(lost: u64, dropped: u64) -> Option<String> {
    (lost > 0).then(|| {
        format!(
            "the metrics reader did not take the last {lost} line(s), the exit line among \
             them; dropped ({dropped} dropped in all)"
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use devices::virtio::block::BlockMetrics;
    use devices::virtio::net::NetMetrics;
    use std::sync::atomic::Ordering;
    use std::time::Duration;

    /// A metrics writer on a fresh file named after the test.
    fn metrics_file(name: &str) -> (std::path::PathBuf, Metrics) {
        let p = std::env::temp_dir().join(format!("minivmm-metrics-{name}-{}", std::process::id()));
        let _ = std::fs::remove_file(&p);
        let m = Metrics::open(&p).unwrap();
        (p, m)
    }

    /// `m` under `id`, as the registry hands a device's counters over.
    fn counters<M: DeviceMetrics + 'static>(id: &str, m: &Arc<M>) -> DeviceCounters {
        (id.to_string(), m.clone())
    }

    /// Every line of the file, parsed.
    fn lines_of(p: &Path) -> Vec<serde_json::Value> {
        std::fs::read_to_string(p)
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    }

    #[test]
    fn lines_carry_time_vmm_and_every_card_by_id() {
        let (p, mut m) = metrics_file("cards");
        let exits = Arc::new(VcpuExits::default());
        let (a, b) = (
            Arc::new(NetMetrics::default()),
            Arc::new(NetMetrics::default()),
        );
        m.attach(
            exits.clone(),
            vec![counters("net0", &a), counters("wan", &b)],
            Instant::now(),
        );
        m.flush();
        exits.io_out.fetch_add(3, Ordering::Relaxed);
        a.tx_frames.fetch_add(7, Ordering::Relaxed);
        std::thread::sleep(Duration::from_millis(5));
        m.flush();
        let lines = lines_of(&p);
        assert_eq!(lines.len(), 2);
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_millis() as u64;
        for l in &lines {
            let ts = l["utc_timestamp_ms"].as_u64().unwrap();
            assert!(now - ts < 60_000, "{ts} vs {now}");
            assert!(l["net0"]["features_negotiated"].is_u64());
            assert!(l["wan"]["rx_frames"].is_u64());
            assert!(l["vmm"]["uptime_ms"].is_u64());
        }
        // Cumulative: the second line holds the counts since start.
        assert_eq!(lines[0]["vmm"]["vcpu_exits"]["io_out"], 0);
        assert_eq!(lines[1]["vmm"]["vcpu_exits"]["io_out"], 3);
        assert_eq!(lines[1]["net0"]["tx_frames"], 7);
        assert!(lines[1]["vmm"]["uptime_ms"].as_u64() >= lines[0]["vmm"]["uptime_ms"].as_u64());
        for key in ["io_in", "io_out", "mmio_read", "mmio_write"] {
            assert!(lines[1]["vmm"]["vcpu_exits"][key].is_u64(), "{key}");
        }
        std::fs::remove_file(&p).unwrap();
    }

    #[test]
    fn lines_name_the_instance_and_hold_only_reserved_keys_and_device_ids() {
        let (p, mut m) = metrics_file("id");
        let devices = vec![
            counters("net0", &Arc::<NetMetrics>::default()),
            counters("rootfs", &Arc::<BlockMetrics>::default()),
            counters("lan", &Arc::<NetMetrics>::default()),
        ];
        m.attach(Arc::default(), devices, Instant::now());
        m.flush();
        m.set_id("vm-7");
        m.flush();
        let lines = lines_of(&p);
        assert_eq!(lines[0]["id"], DEFAULT_ID);
        assert_eq!(lines[1]["id"], "vm-7");
        // Firecracker's layout otherwise: the timestamp first, the VMM's
        // object, the devices by id; nothing else at the top.
        let text = std::fs::read_to_string(&p).unwrap();
        assert!(text.starts_with(r#"{"utc_timestamp_ms":"#), "{text}");
        let mut keys: Vec<&str> = lines[1]
            .as_object()
            .unwrap()
            .keys()
            .map(String::as_str)
            .collect();
        keys.sort_unstable();
        // `properties` only when the operator gave some.
        let mut want: Vec<&str> = RESERVED_KEYS
            .iter()
            .copied()
            .filter(|k| !matches!(*k, "properties" | "uart"))
            .chain(["net0", "rootfs", "lan"])
            .collect();
        want.sort_unstable();
        assert_eq!(keys, want);
        // In that order: the line's own keys, then the devices as attached.
        let last = text.lines().last().unwrap();
        let at = |key: &str| last.find(&format!("\"{key}\":")).unwrap();
        let order = ["utc_timestamp_ms", "id", "vmm", "net0", "rootfs", "lan"].map(at);
        assert!(order.windows(2).all(|w| w[0] < w[1]), "{last}");
        // Firecracker's `properties`: the operator's pairs, after the id.
        m.set_properties(BTreeMap::from([
            ("az".to_string(), "eu-1".to_string()),
            ("host".to_string(), "h7".to_string()),
        ]));
        m.flush();
        let lines = lines_of(&p);
        assert_eq!(
            lines[2]["properties"],
            serde_json::json!({"az": "eu-1", "host": "h7"})
        );
        let text = std::fs::read_to_string(&p).unwrap();
        let last = text.lines().last().unwrap();
        let at = |key: &str| last.find(&format!("\"{key}\":")).unwrap();
        let order = ["utc_timestamp_ms", "id", "properties", "vmm", "net0"].map(at);
        assert!(order.windows(2).all(|w| w[0] < w[1]), "{last}");
        // Firecracker's `uart`: the console bytes the serial limiter dropped.
        let dropped = Arc::new(AtomicU64::new(0));
        m.set_uart_dropped(dropped.clone());
        dropped.store(41, Ordering::Relaxed);
        m.flush();
        let lines = lines_of(&p);
        assert_eq!(
            lines[3]["uart"],
            serde_json::json!({"rate_limiter_dropped_bytes": 41})
        );
        let text = std::fs::read_to_string(&p).unwrap();
        let last = text.lines().last().unwrap();
        let at = |key: &str| last.find(&format!("\"{key}\":")).unwrap();
        let order = ["vmm", "uart", "net0"].map(at);
        assert!(order.windows(2).all(|w| w[0] < w[1]), "{last}");
        std::fs::remove_file(&p).unwrap();
    }

    #[test]
    fn lines_carry_every_drive_by_id() {
        let (p, mut m) = metrics_file("drives");
        let disk = Arc::new(BlockMetrics::default());
        let devices = vec![
            counters("net0", &Arc::<NetMetrics>::default()),
            counters("rootfs", &disk),
        ];
        m.attach(Arc::default(), devices, Instant::now());
        disk.write_bytes.fetch_add(4096, Ordering::Relaxed);
        disk.read_count.fetch_add(2, Ordering::Relaxed);
        m.flush();
        let lines = lines_of(&p);
        assert_eq!(lines[0]["rootfs"]["write_bytes"], 4096);
        assert_eq!(lines[0]["rootfs"]["read_count"], 2);
        assert!(lines[0]["net0"]["rx_frames"].is_u64());
        std::fs::remove_file(&p).unwrap();
    }

    #[test]
    fn a_line_reports_the_uptime_and_the_lines_a_reader_missed() {
        let p = std::env::temp_dir().join(format!("minivmm-metrics-fifo-{}", std::process::id()));
        let _ = std::fs::remove_file(&p);
        let st = std::process::Command::new("mkfifo")
            .arg(&p)
            .status()
            .unwrap();
        assert!(st.success());
        let mut m = Metrics::open(&p).unwrap();
        // Started 2 s ago, as far as the line is concerned.
        let start = Instant::now() - Duration::from_secs(2);
        m.attach(Arc::default(), Vec::new(), start);
        let first: serde_json::Value = serde_json::from_str(&m.line()).unwrap();
        let up = first["vmm"]["uptime_ms"].as_u64().unwrap();
        assert!((2000..60_000).contains(&up), "uptime {up} ms");
        assert_eq!(first["vmm"]["metrics_lines_dropped"], 0);
        // No reader: the pipe and the pending buffer fill, then lines drop.
        let line_len = m.line().len() as u64;
        let flushes = (2 << 20) / line_len;
        for _ in 0..flushes {
            m.flush();
        }
        let dropped = m.out.dropped_lines();
        assert!(dropped > 0 && dropped < flushes, "{dropped} of {flushes}");
        let last: serde_json::Value = serde_json::from_str(&m.line()).unwrap();
        assert_eq!(last["vmm"]["metrics_lines_dropped"], dropped);
        assert!(last["vmm"]["uptime_ms"].as_u64().unwrap() >= up);
        std::fs::remove_file(&p).unwrap();
    }

    #[test]
    fn the_exit_writes_a_last_line() {
        let (p, mut m) = metrics_file("exit");
        let exits = Arc::new(VcpuExits::default());
        m.attach(exits.clone(), Vec::new(), Instant::now());
        m.flush();
        exits.io_in.fetch_add(4, Ordering::Relaxed);
        assert_eq!(m.finish(), 0);
        let lines = lines_of(&p);
        assert_eq!(lines.len(), 2, "{lines:?}");
        assert_eq!(lines[1]["vmm"]["vcpu_exits"]["io_in"], 4);
        std::fs::remove_file(&p).unwrap();
    }

    #[test]
    fn the_exit_on_a_stalled_fifo_drops_and_counts_without_waiting() {
        let p = std::env::temp_dir().join(format!("minivmm-metrics-stall-{}", std::process::id()));
        let _ = std::fs::remove_file(&p);
        assert!(std::process::Command::new("mkfifo")
            .arg(&p)
            .status()
            .unwrap()
            .success());
        let mut m = Metrics::open(&p).unwrap();
        m.attach(Arc::default(), Vec::new(), Instant::now());
        // A reader that opened the FIFO and reads nothing: the pipe fills
        // and lines wait.
        let _stalled = std::fs::File::open(&p).unwrap();
        while m.out.pending_bytes() == 0 {
            m.flush();
        }
        let waiting = m.out.pending_bytes();
        let lost = m.finish();
        // The waiting lines (one of them perhaps begun) and the exit line.
        assert!(lost >= 2, "{lost} lost, {waiting} bytes were waiting");
        assert_eq!(m.out.dropped_lines(), lost);
        assert_eq!(m.out.pending_bytes(), 0);
        // The next line (were there one) reports them.
        let next: serde_json::Value = serde_json::from_str(&m.line()).unwrap();
        assert_eq!(next["vmm"]["metrics_lines_dropped"], lost);
        std::fs::remove_file(&p).unwrap();
    }

    #[test]
    fn the_exit_warns_only_when_lines_were_lost() {
        assert_eq!(exit_warning(0, 0), None);
        assert_eq!(exit_warning(0, 7), None);
        assert_eq!(
            exit_warning(3, 10).as_deref(),
            Some(
                "the metrics reader did not take the last 3 line(s), the exit line among \
                 them; dropped (10 dropped in all)"
            )
        );
        assert!(exit_warning(1, 1).is_some());
    }
}
