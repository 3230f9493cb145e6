// SPDX-License-Identifier: Apache-2.0
//! Start-up time: minivmm's own figure, "boot: N ms from start to first
//! vCPU entry", logged at `--log-level info`, over several runs.
//!
//! Each run starts minivmm with the guest kernel (and initramfs) given, no
//! network card, reads its log until the boot line and stops it with
//! SIGTERM: nothing of the guest runs long enough to matter. Runs alternate
//! between info level (the figure of the goal, median of `runs`) and debug
//! level, whose "build steps (ms): name ms, ..." line says what the time is
//! made of. With a baseline binary, its runs are interleaved with the new
//! ones, so both see the same machine.

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use serde_json::{json, Map, Value};

use crate::stats::median;
use crate::sys;

/// What the start-up scenario runs.
#[derive(Debug, Clone)]
pub struct StartupArgs {
    /// The minivmm binary under test.
    pub minivmm: PathBuf,
    /// An older minivmm to compare with, if any.
    pub baseline: Option<PathBuf>,
    /// Guest kernel.
    pub kernel: PathBuf,
    /// Guest initramfs, if any.
    pub initramfs: Option<PathBuf>,
    /// Runs per binary and log level.
    pub runs: usize,
}

/// How long a run may take to log its boot line.
const RUN_TIMEOUT: Duration = Duration::from_secs(20);

/// One run's figures.
#[derive(Debug, Default, Clone)]
struct Run {
    /// minivmm's own figure (main() to first vCPU entry), ms.
    boot_ms: f64,
    /// From spawning the process to reading the boot line, ms (adds exec,
    /// dynamic linking and the log pipe).
    spawn_to_line_ms: f64,
    /// The debug line's steps, in order.
    steps: Vec<(String, f64)>,
}

/// Parses "boot: N ms from start to first vCPU entry".
fn parse_boot(line: &str) -> Option<f64> {
    let rest = line.split("boot: ").nth(1)?;
    if !rest.contains("from start to first vCPU entry") {
        return None;
    }
    rest.split_whitespace().next()?.parse().ok()
}

/// Parses "build steps (ms): files 0.025, kvm 0.391, ...; build 44.975".
fn parse_steps(line: &str) -> Option<Vec<(String, f64)>> {
    let rest = line.split("build steps (ms): ").nth(1)?;
    let list = rest.split(';').next()?;
    list.split(',')
        .map(|item| {
            let item = item.trim();
            let (name, ms) = item.rsplit_once(' ')?;
            Some((name.to_string(), ms.parse().ok()?))
        })
        .collect()
}

fn one_run(a: &StartupArgs, bin: &PathBuf, level: &str) -> Result<Run> {
    let mut cmd = Command::new(bin);
    cmd.arg("--kernel").arg(&a.kernel);
    if let Some(i) = &a.initramfs {
        cmd.arg("--initramfs").arg(i);
    }
    cmd.args(["--log-level", level])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    let t0 = Instant::now();
    let mut child = cmd
        .spawn()
        .with_context(|| format!("start {}", bin.display()))?;
    let stderr = child.stderr.take().context("minivmm's stderr")?;
    let (tx, rx) = mpsc::channel();
    let reader = std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(|l| l.ok()) {
            let stamp = t0.elapsed();
            if tx.send((line, stamp)).is_err() {
                break;
            }
        }
    });
    let mut run = Run::default();
    let deadline = Instant::now() + RUN_TIMEOUT;
    let mut log = Vec::new();
    let result = loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok((line, stamp)) => {
                if let Some(steps) = parse_steps(&line) {
                    run.steps = steps;
                }
                if let Some(ms) = parse_boot(&line) {
                    run.boot_ms = ms;
                    run.spawn_to_line_ms = stamp.as_secs_f64() * 1e3;
                    break Ok(());
                }
                log.push(line);
            }
            Err(_) => {
                break Err(anyhow::anyhow!(
                    "{} logged no boot line within {RUN_TIMEOUT:?}; its log: {}",
                    bin.display(),
                    log.join(" | ")
                ))
            }
        }
    };
    // SIGTERM stops minivmm cleanly once its event loop runs (it logs the
    // boot line after that); a run that did not get there is killed.
    sys::terminate(child.id());
    let stop_by = Instant::now() + Duration::from_secs(5);
    while child.try_wait().ok().flatten().is_none() {
        if Instant::now() >= stop_by {
            let _ = child.kill();
            let _ = child.wait();
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let _ = reader.join();
    result.map(|()| run)
}

/// Median of each step over runs that logged them, as `[name, ms]` pairs
/// in build order.
fn median_steps(runs: &[Run]) -> Value {
    let Some(first) = runs.iter().find(|r| !r.steps.is_empty()) else {
        return json!([]);
    };
    first
        .steps
        .iter()
        .enumerate()
        .map(|(i, (name, _))| {
            let v: Vec<f64> = runs
                .iter()
                .filter_map(|r| r.steps.get(i).map(|s| s.1))
                .collect();
            json!([name, median(&v)])
        })
        .collect()
}

fn summary(info: &[Run], debug: &[Run]) -> Value {
    let boot: Vec<f64> = info.iter().map(|r| r.boot_ms).collect();
    let spawn: Vec<f64> = info.iter().map(|r| r.spawn_to_line_ms).collect();
    json!({
        "boot_ms_median": median(&boot),
        "boot_ms_runs": boot,
        "spawn_to_boot_line_ms_median": median(&spawn),
        "debug_boot_ms_runs": debug.iter().map(|r| r.boot_ms).collect::<Vec<_>>(),
        "steps_ms_median": median_steps(debug),
    })
}

/// Runs the start-up scenario.
pub fn startup(a: &StartupArgs) -> Result<Value> {
    if a.runs == 0 {
        bail!("--startup-runs must be at least 1");
    }
    let mut bins = vec![("after", &a.minivmm)];
    if let Some(b) = &a.baseline {
        bins.push(("before", b));
    }
    let mut runs: Vec<(Vec<Run>, Vec<Run>)> = vec![Default::default(); bins.len()];
    // A first run of each warms the page cache; it is not counted.
    for (_, bin) in &bins {
        one_run(a, bin, "info")?;
    }
    for _ in 0..a.runs {
        for (i, (_, bin)) in bins.iter().enumerate() {
            runs[i].0.push(one_run(a, bin, "info")?);
            runs[i].1.push(one_run(a, bin, "debug")?);
        }
    }
    let mut out = Map::new();
    for (i, (name, bin)) in bins.iter().enumerate() {
        let mut s = summary(&runs[i].0, &runs[i].1);
        s["binary"] = json!(bin.display().to_string());
        out.insert((*name).to_string(), s);
    }
    out.insert("kernel".into(), json!(a.kernel.display().to_string()));
    out.insert(
        "initramfs".into(),
        json!(a.initramfs.as_ref().map(|p| p.display().to_string())),
    );
    out.insert("runs".into(), json!(a.runs));
    let after = out["after"]["boot_ms_median"].as_f64().unwrap_or(f64::NAN);
    out.insert("boot_ms_median".into(), json!(after));
    out.insert(
        "goal_boot_ms_median_at_most_10".into(),
        json!(after <= 10.0),
    );
    Ok(Value::Object(out))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn boot_and_step_lines_parse() {
        assert_eq!(
            parse_boot("minivmm: info: boot: 13 ms from start to first vCPU entry"),
            Some(13.0)
        );
        assert_eq!(parse_boot("minivmm: info: boot: soon"), None);
        let s = parse_steps(
            "minivmm: debug: build steps (ms): files 0.025, boot tables 0.094, vcpus 0.6; build 1.0",
        )
        .unwrap();
        assert_eq!(
            s,
            vec![
                ("files".to_string(), 0.025),
                ("boot tables".to_string(), 0.094),
                ("vcpus".to_string(), 0.6)
            ]
        );
        assert_eq!(parse_steps("minivmm: info: kernel command line: x"), None);
    }

    #[test]
    fn steps_take_the_median_per_step() {
        let r = |a, b| Run {
            steps: vec![("kvm".into(), a), ("kernel".into(), b)],
            ..Run::default()
        };
        let m = median_steps(&[r(1.0, 10.0), r(3.0, 30.0), r(2.0, 20.0)]);
        assert_eq!(m, json!([["kvm", 2.0], ["kernel", 20.0]]));
    }
}
