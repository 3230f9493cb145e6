// SPDX-License-Identifier: Apache-2.0
//! Target `cli`: minivmm's command line, from argument strings through clap
//! to a validated `VmmConfig`.
//!
//! Arguments are drawn from the real flag names, values of the right shape
//! (numbers at and around every bound, MAC-like strings, the keywords) and
//! arbitrary strings, control characters included. Oracles:
//!
//! - nothing panics, whatever the arguments;
//! - an error from `into_config` reaches the user as one non-empty line
//!   (`vmm::error_line`, what `main` prints);
//! - an accepted configuration is within every documented bound: memory
//!   32 MiB to 64 GiB, 1 to 254 vCPUs, a power-of-two queue size from 1 to
//!   32768, a unicast MAC, valid offloads, one card per `--net` and
//!   `--tap` with distinct ids (the `--tap` card last), and the paths and
//!   words exactly as given.
//!
//! The config file has a target of its own (`config_file`).

use arbitrary::Arbitrary;
use clap::Parser;
use vmm::config::cli::Cli;
use vmm::config::TapBackend;

use crate::config_oracles::{assert_one_line, assert_within_bounds};

/// The flags minivmm knows, and a few it does not.
#[derive(Debug, Clone, Copy, Arbitrary)]
#[allow(missing_docs)]
pub enum Flag {
    Kernel,
    Initramfs,
    Cmdline,
    Mem,
    Vcpus,
    Tap,
    Net,
    Mac,
    Metrics,
    MetricsInterval,
    LogPath,
    Mtu,
    QueueSize,
    PassTimeBudgetUs,
    TxWeightBytes,
    TxWeightPackets,
    RxWeightBytes,
    RxWeightPackets,
    NoOffloads,
    NoMrgRxbuf,
    HostQuirks,
    Seccomp,
    LogLevel,
    Help,
    Version,
    Unknown,
}

impl Flag {
    fn name(self) -> &'static str {
        match self {
            Flag::Kernel => "--kernel",
            Flag::Initramfs => "--initramfs",
            Flag::Cmdline => "--cmdline",
            Flag::Mem => "--mem",
            Flag::Vcpus => "--vcpus",
            Flag::Tap => "--tap",
            Flag::Net => "--net",
            Flag::Mac => "--mac",
            Flag::Metrics => "--metrics",
            Flag::MetricsInterval => "--metrics-interval",
            Flag::LogPath => "--log-path",
            Flag::Mtu => "--mtu",
            Flag::QueueSize => "--queue-size",
            Flag::PassTimeBudgetUs => "--pass-time-budget-us",
            Flag::TxWeightBytes => "--tx-weight-bytes",
            Flag::TxWeightPackets => "--tx-weight-packets",
            Flag::RxWeightBytes => "--rx-weight-bytes",
            Flag::RxWeightPackets => "--rx-weight-packets",
            Flag::NoOffloads => "--no-offloads",
            Flag::NoMrgRxbuf => "--no-mrg-rxbuf",
            Flag::HostQuirks => "--host-quirks",
            Flag::Seccomp => "--seccomp",
            Flag::LogLevel => "--log-level",
            Flag::Help => "--help",
            Flag::Version => "--version",
            Flag::Unknown => "--bogus",
        }
    }
}

/// A value for a flag.
#[derive(Debug, Clone, Arbitrary)]
pub enum Value {
    /// A number near a bound: 0, 1, 2, 31, 32, 254, 255, 32768, 65536,
    /// 2^63, u64::MAX, offset by a small delta.
    Bound(u8, i8),
    /// Any number.
    Number(u64),
    /// Six octets joined by a separator, with a chosen first octet.
    Mac([u8; 6], u8),
    /// A keyword of one of the enumerated flags.
    Keyword(u8),
    /// A `--net` value: `key=value` items from the real keys.
    NetItems(Vec<(u8, u64, bool)>),
    /// Any string.
    Text(String),
}

const NET_KEYS: [&str; 17] = [
    "tap",
    "id",
    "mac",
    "fd",
    "queue_size",
    "mtu",
    "offloads",
    "mrg_rxbuf",
    "tx_weight_packets",
    "pass_time_budget_us",
    "bw_size",
    "bw_refill_time",
    "tx_ops_size",
    "tx_ops_refill_time",
    "rx_bw_one_time_burst",
    "bogus",
    "io_engine",
];

const BOUNDS: [u64; 11] = [0, 1, 2, 31, 32, 254, 255, 32768, 65536, 1 << 63, u64::MAX];
const KEYWORDS: [&str; 12] = [
    "auto", "on", "off", "log", "warn", "info", "debug", "trace", "error", "", "ON", "-1",
];

impl Value {
    fn render(&self) -> String {
        match self {
            Value::Bound(i, delta) => BOUNDS[usize::from(*i) % BOUNDS.len()]
                .wrapping_add_signed(i64::from(*delta % 4))
                .to_string(),
            Value::Number(n) => n.to_string(),
            Value::Mac(octets, sep) => {
                let sep = [":", "-", "", "::", ":\n"][usize::from(*sep) % 5];
                octets
                    .iter()
                    .map(|o| format!("{o:02x}"))
                    .collect::<Vec<_>>()
                    .join(sep)
            }
            Value::Keyword(i) => KEYWORDS[usize::from(*i) % KEYWORDS.len()].to_string(),
            Value::NetItems(items) => items
                .iter()
                .map(|(k, v, hex)| {
                    let key = NET_KEYS[usize::from(*k) % NET_KEYS.len()];
                    match key {
                        "tap" | "id" => format!("{key}=t{}", v % 4),
                        "mac" => format!("{key}=02:00:00:00:00:{:02x}", v % 256),
                        "offloads" => format!(
                            "{key}={}",
                            ["all", "none", "csum+tso4", "tso4"][(v % 4) as usize]
                        ),
                        "io_engine" => format!(
                            "{key}={}",
                            ["async", "sync", "Async", "SYNC", "uring", ""][(v % 6) as usize]
                        ),
                        _ if *hex => format!("{key}={v:#x}"),
                        _ => format!("{key}={v}"),
                    }
                })
                .collect::<Vec<_>>()
                .join(","),
            Value::Text(s) => s.clone(),
        }
    }
}

/// One command-line word.
#[derive(Debug, Clone, Arbitrary)]
pub enum Word {
    /// A flag name on its own.
    Flag(Flag),
    /// `--flag value` as two words.
    Pair(Flag, Value),
    /// `--flag=value` as one word.
    Joined(Flag, Value),
    /// A bare word.
    Bare(Value),
}

/// One input: whether the required `--kernel` is given first, then words.
#[derive(Debug, Arbitrary)]
pub struct Input {
    /// Start with `--kernel vmlinux`, so most inputs get past clap.
    pub with_kernel: bool,
    /// The rest of the command line.
    pub words: Vec<Word>,
}

/// Runs one input (the libFuzzer entry point).
pub fn run(data: &[u8]) {
    crate::with_input(data, |i: &Input| run_input(i));
}

/// Parses the command line of `input` as `main` does and checks the oracles.
pub fn run_input(input: &Input) {
    let mut args = vec!["minivmm".to_string()];
    if input.with_kernel {
        args.extend(["--kernel".to_string(), "vmlinux".to_string()]);
    }
    for w in &input.words {
        match w {
            Word::Flag(f) => args.push(f.name().to_string()),
            Word::Pair(f, v) => args.extend([f.name().to_string(), v.render()]),
            Word::Joined(f, v) => args.push(format!("{}={}", f.name(), v.render())),
            Word::Bare(v) => args.push(v.render()),
        }
    }
    let cli = match Cli::try_parse_from(&args) {
        Ok(cli) => cli,
        // clap's own usage errors (and --help/--version) are clap's to
        // render; rendering them must not panic either.
        Err(e) => {
            let _ = e.to_string();
            return;
        }
    };
    let kernel = cli.kernel.clone();
    let initramfs = cli.initramfs.clone();
    let cmdline = cli.cmdline.clone();
    let tap = cli.tap.clone();
    let cards = cli.net.len() + usize::from(tap.is_some());
    match cli.into_config() {
        Err(e) => assert_one_line(&e, &args),
        Ok(cfg) => {
            assert_within_bounds(&cfg, &args);
            assert_eq!(Some(&cfg.kernel), kernel.as_ref());
            assert_eq!(cfg.initramfs, initramfs);
            assert_eq!(cfg.cmdline_extra, cmdline);
            assert_eq!(cfg.nets.len(), cards, "{args:?}");
            if let (Some(tap), Some(last)) = (&tap, cfg.nets.last()) {
                // `--tap` is the last card (after every `--net`).
                assert_eq!(last.tap, TapBackend::Named(tap.clone()), "{args:?}");
            }
        }
    }
}
