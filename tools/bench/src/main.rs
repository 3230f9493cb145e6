// SPDX-License-Identifier: Apache-2.0
//! `netbench`: minivmm's virtio-net datapath measured without a guest.
//!
//! A guest kernel only runs emulated on the development hosts, so the device
//! is driven from the driver side instead: the real `Net` on its event loop,
//! rings in guest memory, a real TAP whose other side is the host stack.
//! Every figure is compared in the same run with a raw loop on the same TAP.
//!
//! The parent process creates a private network namespace with the TAP in
//! it, re-executes itself inside (`ip netns exec NS /proc/self/exe --child`)
//! and deletes the namespace when the child ends, also on error or Ctrl-C.
//! No packet leaves that namespace.
//!
//! All unsafe code (system calls std does not wrap) is confined to `sys`.
#![deny(unsafe_code)]

mod block;
mod frames;
mod host;
mod netns;
mod plot;
mod ratelimit;
mod report;
mod rig;
mod scenarios;
mod startup;
mod stats;
#[allow(unsafe_code)]
mod sys;
mod vsock;

use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use clap::Parser;

/// Command line of netbench.
#[derive(Debug, Clone, Parser)]
#[command(about = "Driver-side benchmark of minivmm's virtio-net device against the raw TAP limit")]
pub struct Cli {
    /// Short windows and fewer rounds: every scenario in under 3 minutes.
    #[arg(long)]
    quick: bool,
    /// Write the results as JSON to this path.
    #[arg(long)]
    json: Option<PathBuf>,
    /// Write PNG charts into this directory.
    #[arg(long)]
    plot: Option<PathBuf>,
    /// Run only these scenarios (limit, seed000, seed001, seed002, ratelimit,
    /// startup, block, vsock, smoke); repeatable; default: all but smoke (startup only
    /// with --minivmm and --kernel).
    #[arg(long)]
    scenario: Vec<String>,
    /// Frame sizes of the limit scenario (64, 1514, 65536).
    #[arg(long, value_delimiter = ',', default_values_t = [64usize, 1514, 65536])]
    limit_sizes: Vec<usize>,
    /// Directions of the limit scenario (rx, tx).
    #[arg(long, value_delimiter = ',', default_values_t = [String::from("rx"), String::from("tx")])]
    limit_dirs: Vec<String>,
    /// seed001 TX packet weights to sweep instead of the default table
    /// (0 = unweighted), e.g. `--weights 0,16,32,64,256`; crossed with
    /// --time-budgets.
    #[arg(long, value_delimiter = ',')]
    weights: Vec<u64>,
    /// seed001 pass time budgets in µs (0 = off) crossed with --weights,
    /// e.g. `--weights 64,256 --time-budgets 0,50,100`.
    #[arg(long, value_delimiter = ',')]
    time_budgets: Vec<u64>,
    /// startup: the minivmm binary to time (a release build).
    #[arg(long)]
    minivmm: Option<PathBuf>,
    /// startup: an older minivmm to time in the same run, interleaved.
    #[arg(long)]
    minivmm_baseline: Option<PathBuf>,
    /// startup: the guest kernel (`bash resources/build.sh` prints it).
    #[arg(long)]
    kernel: Option<PathBuf>,
    /// startup: the guest initramfs.
    #[arg(long)]
    initramfs: Option<PathBuf>,
    /// startup: runs per binary (the goal is on the median of 5).
    #[arg(long, default_value_t = 5)]
    startup_runs: usize,
    /// Print the summary of a results directory (latest.json, and where
    /// present baseline.json, callgrind.txt, callgrind-baseline.txt) and
    /// exit; runs nothing, needs no root.
    #[arg(long, conflicts_with = "replot")]
    report: Option<PathBuf>,
    /// Redraw the charts of an earlier `--json` file into `--plot DIR` and
    /// exit; runs nothing, needs no root.
    #[arg(long, requires = "plot")]
    replot: Option<PathBuf>,
    /// Negotiate VIRTIO_RING_F_EVENT_IDX in every rig, as Linux guests do:
    /// the driver then asks for a TX interrupt once 3/4 of its buffers are
    /// used and kicks by `avail_event`. Off (the default, as in every figure
    /// in BENCHMARKS.md and in the baseline): an interrupt per pass, kicks
    /// unless the device sets VRING_USED_F_NO_NOTIFY.
    #[arg(long, value_enum, default_value_t = OnOff::Off)]
    event_idx: OnOff,
    /// On: every rig's card serves MMDS (an empty store at its default
    /// address); the frames are not for it, so the cells show what such a
    /// card pays for other traffic. Off (the default): no MMDS, as in
    /// every figure but BENCHMARKS.md's MMDS section.
    #[arg(long, value_enum, default_value_t = OnOff::Off)]
    mmds: OnOff,
    /// Run N requests of one block cell and nothing else, for callgrind
    /// (`tools/bench/callgrind-block.sh`): MODE is sync, async or raw,
    /// WORKLOAD one of randread_4k, randwrite_4k, seqread_128k,
    /// seqwrite_128k. Needs no root.
    #[arg(long, num_args = 3, value_names = ["MODE", "WORKLOAD", "N"])]
    block_cost: Option<Vec<String>>,
    /// Run N units of one vsock cell on one side and nothing else, for strace, perf or
    /// callgrind: CELL is tx_4k, tx_64k, rx_4k or rr_1, SIDE device, raw or raw-batched. Needs no root.
    #[arg(long, num_args = 3, value_names = ["CELL", "SIDE", "N"])]
    vsock_cost: Option<Vec<String>>,
    /// Time N of each system call a device thread makes besides its I/O
    /// (an eventfd write: a kick or an interrupt; an `epoll_wait` that
    /// finds an event ready; and `getppid`, the cheapest) and print the
    /// nanoseconds a call; no root.
    #[arg(long, value_name = "N")]
    syscall_cost: Option<u32>,
    /// Cells of the vsock scenario (tx_4k, tx_64k, rx_4k, rr_1) [default: all]
    #[arg(long, value_delimiter = ',')]
    vsock_cells: Vec<String>,
    /// Internal: we are the re-executed child inside namespace NAME.
    #[arg(long, hide = true)]
    child: Option<String>,
}

/// A switch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum OnOff {
    On,
    Off,
}

const ALL: &[&str] = &[
    "limit",
    "seed000",
    "seed001",
    "seed002",
    "ratelimit",
    "startup",
    "block",
    "vsock",
];
/// Scenarios run only when named.
const OPT_IN: &[&str] = &["smoke"];

fn main() {
    let cli = Cli::parse();
    let code = match run(cli) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("netbench: {e:#}");
            1
        }
    };
    std::process::exit(code);
}

fn run(cli: Cli) -> Result<i32> {
    for s in &cli.scenario {
        if !ALL.contains(&s.as_str()) && !OPT_IN.contains(&s.as_str()) {
            bail!(
                "unknown scenario {s:?}; known: {}, {}",
                ALL.join(", "),
                OPT_IN.join(", ")
            );
        }
    }
    if let Some(dir) = &cli.report {
        print!("{}", report::summary(dir)?);
        return Ok(0);
    }
    if let (Some(json), Some(dir)) = (&cli.replot, &cli.plot) {
        let text =
            std::fs::read_to_string(json).with_context(|| format!("read {}", json.display()))?;
        let out: serde_json::Value = serde_json::from_str(&text).context("parse the JSON")?;
        plot::charts(&out, dir)?;
        return Ok(0);
    }
    if let Some(a) = &cli.block_cost {
        let n = a[2]
            .parse()
            .with_context(|| format!("{:?} is not a number", a[2]))?;
        block::cost(&a[0], &a[1], n)?;
        return Ok(0);
    }
    if let Some(n) = cli.syscall_cost {
        sys::syscall_cost(n)?;
        return Ok(0);
    }
    if let Some(a) = &cli.vsock_cost {
        let n = a[2]
            .parse()
            .with_context(|| format!("{:?} is not a number", a[2]))?;
        vsock::cost(&a[0], &a[1], n)?;
        return Ok(0);
    }
    if let Some(ns) = cli.child.clone() {
        sys::die_with_parent();
        return child(cli, &ns).map(|()| 0);
    }
    if !sys::is_root() {
        eprintln!("netbench: needs root (CAP_NET_ADMIN) to create a network namespace and a TAP; not running");
        return Ok(2);
    }
    if !std::path::Path::new("/dev/net/tun").exists() {
        eprintln!("netbench: /dev/net/tun is missing; not running");
        return Ok(2);
    }
    sys::catch_interrupts();
    let ns = netns::Namespace::create().context("namespace setup")?;
    let exe = std::env::current_exe().context("own executable")?;
    let mut args: Vec<String> = std::env::args().skip(1).collect();
    args.push("--child".into());
    args.push(ns.name().to_string());
    let mut child = std::process::Command::new("ip")
        .args(["netns", "exec", ns.name()])
        .arg(&exe)
        .args(&args)
        .spawn()
        .context("run the benchmark inside the namespace")?;
    // `ip netns exec` execs the benchmark, so the child's pid is the
    // benchmark's. A Ctrl-C reaches it directly from the terminal; a signal
    // sent only to this parent (kill, timeout) is forwarded once.
    let mut forwarded = false;
    let status = loop {
        if let Some(st) = child.try_wait().context("wait for the benchmark")? {
            break st;
        }
        if sys::interrupted() && !forwarded {
            sys::terminate(child.id());
            forwarded = true;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    };
    drop(ns);
    if sys::interrupted() {
        eprintln!("netbench: interrupted; namespace removed");
        return Ok(130);
    }
    Ok(status.code().unwrap_or(1))
}

fn child(cli: Cli, ns: &str) -> Result<()> {
    use scenarios::Timing;
    use serde_json::{json, Map, Value};

    netns::tune_inside().context("namespace sysctls")?;
    let startup_args = match (&cli.minivmm, &cli.kernel) {
        (Some(m), Some(k)) => Some(startup::StartupArgs {
            minivmm: m.clone(),
            baseline: cli.minivmm_baseline.clone(),
            kernel: k.clone(),
            initramfs: cli.initramfs.clone(),
            runs: cli.startup_runs,
        }),
        _ => None,
    };
    let wanted: Vec<&str> = if cli.scenario.is_empty() {
        ALL.iter()
            .copied()
            .filter(|s| *s != "startup" || startup_args.is_some())
            .collect()
    } else {
        cli.scenario.iter().map(String::as_str).collect()
    };
    let smoke = wanted.contains(&"smoke");
    let t = Timing {
        event_idx: cli.event_idx == OnOff::On,
        mmds: cli.mmds == OnOff::On,
        ..if smoke {
            Timing::smoke()
        } else if cli.quick {
            Timing::quick()
        } else {
            Timing::full()
        }
    };
    let mut out = Map::new();
    out.insert("machine".into(), report::machine());
    out.insert("quick".into(), json!(cli.quick));
    out.insert("namespace".into(), json!(ns));
    let started = std::time::Instant::now();
    if smoke {
        out.insert(
            "limit".into(),
            scenarios::limit(&t, &[1514], &["rx".into(), "tx".into()])?,
        );
        out.insert("seed000".into(), scenarios::seed000(&t, &[1526])?);
        out.insert(
            "seed001".into(),
            scenarios::seed001(&t, &[scenarios::Weight::default_config()], 2000)?,
        );
    }
    for s in wanted.iter().filter(|s| **s != "smoke") {
        eprintln!("netbench: running {s}");
        let v = match *s {
            "limit" => scenarios::limit(&t, &cli.limit_sizes, &cli.limit_dirs)?,
            "seed000" => scenarios::seed000(&t, &[1500, 1526, 4096])?,
            "seed001" if !cli.weights.is_empty() || !cli.time_budgets.is_empty() => {
                let or_off = |v: &[u64]| if v.is_empty() { vec![0] } else { v.to_vec() };
                let mut custom = vec![scenarios::Weight::default_config()];
                for p in or_off(&cli.weights) {
                    for t in or_off(&cli.time_budgets) {
                        custom.push(scenarios::Weight::grid(p, t));
                    }
                }
                scenarios::seed001(&t, &custom, 1000)?
            }
            "seed001" => scenarios::seed001(&t, &scenarios::seed001_configs(), 1000)?,
            "startup" => match &startup_args {
                Some(a) => startup::startup(a)?,
                None => bail!("the startup scenario needs --minivmm and --kernel"),
            },
            "seed002" => scenarios::seed002(&t, &[1526, 4096, scenarios::BIG_BUF])?,
            "ratelimit" => ratelimit::ratelimit(&t)?,
            "block" => block::block(&t)?,
            "vsock" => vsock::vsock(&t, &cli.vsock_cells)?,
            _ => continue,
        };
        out.insert((*s).to_string(), v);
    }
    out.insert("elapsed_s".into(), json!(started.elapsed().as_secs_f64()));
    if let Some(m) = out.get_mut("machine") {
        m["loadavg_at_end"] = json!(report::loadavg());
    }
    let out = Value::Object(out);
    print!("{}", report::table(&out));
    if let Some(p) = &cli.json {
        std::fs::write(p, serde_json::to_string_pretty(&out)?)
            .with_context(|| format!("write {}", p.display()))?;
    }
    if let Some(d) = &cli.plot {
        plot::charts(&out, d).context("plots")?;
    }
    Ok(())
}
