// SPDX-License-Identifier: Apache-2.0
//! `mvperf`: a netperf-style network load tool, one static binary for host and guest.
//!
//! `mvperf server` plays netperf's `netserver`; `mvperf -t TEST -H HOST -l SECONDS` runs one
//! client test (TCP_STREAM, TCP_MAERTS, TCP_RR, UDP_STREAM, UDP_RR; VSOCK_STREAM, VSOCK_MAERTS,
//! VSOCK_RR with `--uds PATH` or `--cid CID` instead of `-H`) and prints netperf-like text
//! or, with `--json`, one JSON object; `mvperf http URL` is a small HTTP/1.1 client (the guest
//! image's metadata-service reads). Only std networking is used (no NSS, no async runtime) so
//! the binary links statically and runs in a busybox initramfs.
//!
//! Exit status: 0 when the test completed with traffic, 1 when it did not (server unreachable,
//! refused, vanished, silent for a grace period, or nothing got through), 2 for a bad command
//! line (for `http`: 0 for a 2xx answer, 1 for any other or none). Every failure is one line
//! on stderr.
#![deny(unsafe_code)]

mod client;
mod http;
mod proto;
mod report;
mod selftest;
mod server;
mod sockopt;
mod stats;
mod vsock;

use std::io::Write;
use std::net::IpAddr;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context, Result};
use clap::{error::ErrorKind, Parser, Subcommand};

use crate::proto::{TestKind, TestParams, DEFAULT_PORT};

const AFTER_HELP: &str = "\
Tests (-t, netperf names, case-insensitive):
  TCP_STREAM   client sends a TCP stream to the server; throughput = bytes the server received
  TCP_MAERTS   server sends a TCP stream to the client (STREAM reversed)
  TCP_RR       TCP request/response, one transaction in flight; latency per transaction
  UDP_STREAM   client sends UDP datagrams; throughput = bytes the server received (loss shown)
  UDP_RR       UDP request/response; a request unanswered within --udp-timeout-ms counts as lost
  VSOCK_STREAM, VSOCK_MAERTS, VSOCK_RR
               TCP_STREAM, TCP_MAERTS, TCP_RR over vsock connections, to a server reached with
               --uds PATH (a Firecracker-style VMM's Unix socket: 'CONNECT PORT' and 'OK N'
               lines) or --cid CID (AF_VSOCK, e.g. 2 from a guest to its host)

Server:
  mvperf server [--port 12865] [--bind 0.0.0.0] [--vsock | --uds BASE]
      Serves clients forever (one thread per test). Prints
      'mvperf server listening on ADDR:PORT' on stdout once bound; --port 0 picks a free port.
      --vsock also takes VSOCK tests on AF_VSOCK port --port (12865 with 0), then prints
      'mvperf server listening on vsock port PORT'; --uds BASE takes them on the Unix socket
      BASE_PORT instead (the host's side of a guest's connections through the VMM).

vsock hello (the guest image's minivmm.vsock_hello=PORT):
  mvperf vsock-hello PORT
      Connects to the host (CID 2) on vsock port PORT, writes 'MINIVMM-VSOCK-HELLO <own CID>'
      and closes; prints the line it wrote.

HTTP client (the guest image's MMDS reads, minivmm.mmds=):
  mvperf http [-X METHOD] [-H 'Name: value']... [-d BODY] [--timeout 60] URL
      One HTTP/1.1 request to an http:// URL; prints the answer's body on stdout. A non-2xx
      answer prints 'mvperf http: METHOD URL: STATUS REASON: <body>' on stderr and exits 1,
      as does a failed connection, a timeout or a malformed answer.

Self-test (the guest image's minivmm.mode=selftest):
  mvperf selftest [--timeout 600]
      Threads with thread-local storage, clone with a new TLS, fork, exec, signals and context
      switches, each checked; prints 'MINIVMM-SELFTEST PASS ...' or 'MINIVMM-SELFTEST FAIL ...'.

Examples:
  mvperf server
  mvperf -t TCP_STREAM -H 10.0.0.2 -l 10
  mvperf -t TCP_RR -H 10.0.0.2 -l 5 -r 64,1024 --json
  mvperf -H 10.0.0.2 -t UDP_STREAM -- -m 1024     (netperf-style test-specific options)
  mvperf -t VSOCK_RR --uds /run/v.sock -l 5       (the guest's vsock port 12865, through the VMM)
  mvperf http -X PUT -H 'X-metadata-token-ttl-seconds: 21600' http://169.254.169.254/latest/api/token

--json prints one object: throughput_mbps for STREAM tests; transactions_per_s and
latency_us {mean,p50,p99,min,max} for RR tests; plus test, bytes, elapsed_s, transactions, ...
Exit status: 0 test completed with traffic, 1 test failed, 2 bad arguments.";

/// A netperf-style network load tool (client tests and `server` mode).
#[derive(Debug, Parser)]
#[command(
    name = "mvperf",
    version,
    after_help = AFTER_HELP,
    args_conflicts_with_subcommands = true,
    subcommand_negates_reqs = true
)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,

    /// Test to run: TCP_STREAM, TCP_MAERTS, TCP_RR, UDP_STREAM, UDP_RR, VSOCK_STREAM,
    /// VSOCK_MAERTS or VSOCK_RR.
    #[arg(
        short = 't',
        long = "test",
        value_name = "TEST",
        default_value = "TCP_STREAM"
    )]
    test: TestKind,

    /// Server host: a numeric IPv4/IPv6 address (names are resolved through libc).
    #[arg(short = 'H', long = "host", value_name = "HOST",
          required_unless_present_any = ["uds", "cid"], conflicts_with_all = ["uds", "cid"])]
    host: Option<String>,

    /// VSOCK tests: the server's vsock port is reached through this Unix socket of a
    /// Firecracker-style VMM (its `uds_path`), with its CONNECT protocol.
    #[arg(long, value_name = "PATH", conflicts_with = "cid")]
    uds: Option<std::path::PathBuf>,

    /// VSOCK tests: the server's vsock CID, reached with AF_VSOCK (2: the host).
    #[arg(long, value_name = "CID")]
    cid: Option<u32>,

    /// Test length in seconds.
    #[arg(short = 'l', long = "length", value_name = "SECONDS", default_value = "10",
          value_parser = parse_secs)]
    length: f64,

    /// Server control port.
    #[arg(short = 'p', long = "port", value_name = "PORT", default_value_t = DEFAULT_PORT)]
    port: u16,

    #[command(flatten)]
    sizes: SizeArgs,

    /// Print one JSON object on stdout instead of netperf-like text.
    #[arg(long)]
    json: bool,

    /// Seconds any wait may go without progress (a connection, a control message, bytes or a
    /// transaction moved) before a silent server is an error; the whole run is capped at -l
    /// plus ten times this.
    #[arg(long, value_name = "SECONDS", default_value = "5", value_parser = parse_secs)]
    grace: f64,

    /// UDP_RR: milliseconds to wait for a response before counting the transaction as lost.
    #[arg(long = "udp-timeout-ms", value_name = "MS", default_value_t = 250,
          value_parser = clap::value_parser!(u64).range(1..=60_000))]
    udp_timeout_ms: u64,

    /// netperf-style test-specific options after `--`: -m SIZE, -r REQ,RESP.
    #[arg(last = true, value_name = "TEST-OPTIONS", allow_hyphen_values = true)]
    test_options: Vec<String>,
}

/// Message and request/response sizes, accepted before or after `--`.
#[derive(Debug, Clone, Default, clap::Args)]
struct SizeArgs {
    /// STREAM tests: bytes per send (default 16384 for TCP, 1472 for UDP: one frame at MTU 1500).
    #[arg(short = 'm', long = "message-size", value_name = "BYTES", value_parser = parse_size)]
    msg_size: Option<usize>,

    /// RR tests: request and response sizes in bytes, "REQ,RESP" or "N" for both (default 1,1).
    #[arg(short = 'r', long = "request-response", value_name = "REQ,RESP",
          value_parser = parse_rr)]
    rr: Option<(usize, usize)>,
}

/// Parser for the options after `--`.
#[derive(Debug, Parser)]
#[command(name = "mvperf -- ", no_binary_name = true, disable_help_flag = true)]
struct TestOptions {
    #[command(flatten)]
    sizes: SizeArgs,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the server (netserver): accept tests from clients forever.
    Server {
        /// Control port to listen on (0 = any free port, printed on stdout).
        #[arg(short = 'p', long, value_name = "PORT", default_value_t = DEFAULT_PORT)]
        port: u16,
        /// Address to listen on.
        #[arg(short = 'b', long, value_name = "ADDR", default_value = "0.0.0.0")]
        bind: IpAddr,
        /// Also take VSOCK tests on AF_VSOCK port PORT (a machine without vsock says so on
        /// stderr and serves TCP and UDP).
        #[arg(long, conflicts_with = "uds")]
        vsock: bool,
        /// Also take VSOCK tests on the Unix socket BASE_PORT (the host's side of a guest's
        /// connections through a Firecracker-style VMM whose uds_path is BASE).
        #[arg(long, value_name = "BASE")]
        uds: Option<std::path::PathBuf>,
    },
    /// Connect to the host's vsock port PORT, write `MINIVMM-VSOCK-HELLO <own CID>`, close.
    VsockHello {
        /// The host's vsock port.
        port: u32,
    },
    /// One HTTP/1.1 request; the answer's body on stdout, exit 1 unless its status is 2xx.
    Http {
        /// The method.
        #[arg(short = 'X', long, value_name = "METHOD", default_value = "GET")]
        method: String,
        /// An extra header, `Name: value` (repeatable).
        #[arg(short = 'H', long = "header", value_name = "NAME: VALUE")]
        headers: Vec<String>,
        /// A body, sent with its Content-Length.
        #[arg(short = 'd', long, value_name = "BODY")]
        data: Option<String>,
        /// Seconds for the whole exchange (connection, request and answer).
        #[arg(long, value_name = "SECONDS", default_value = "60", value_parser = parse_secs)]
        timeout: f64,
        /// An http:// URL.
        url: String,
    },
    /// Stress what userspace relies on (threads and their TLS, clone, fork, exec, signals,
    /// context switches), print one `MINIVMM-SELFTEST PASS|FAIL` line, exit 0 or 1.
    Selftest {
        /// Fail (and exit) after this many seconds without progress (three times this in all).
        #[arg(long, value_name = "SECONDS", default_value = "600", value_parser = parse_secs)]
        timeout: f64,
        /// Program to exec that exits 0.
        #[arg(long = "true", value_name = "PATH", default_value = "/bin/true")]
        true_bin: String,
        /// Shell to exec as `SH -c 'exit 7'`.
        #[arg(long = "sh", value_name = "PATH", default_value = "/bin/sh")]
        sh_bin: String,
    },
}

fn parse_secs(s: &str) -> Result<f64, String> {
    let v: f64 = s
        .trim()
        .parse()
        .map_err(|_| format!("'{s}' is not a number of seconds"))?;
    if v > 0.0 && v <= 86_400.0 {
        Ok(v)
    } else {
        Err(format!("{s} seconds is out of range (0 < s <= 86400)"))
    }
}

fn parse_size(s: &str) -> Result<usize, String> {
    let v: usize = s
        .trim()
        .parse()
        .map_err(|_| format!("'{s}' is not a size in bytes"))?;
    if v == 0 {
        return Err("size must be at least 1 byte".into());
    }
    Ok(v)
}

fn parse_rr(s: &str) -> Result<(usize, usize), String> {
    match s.split_once(',') {
        Some((a, b)) => Ok((parse_size(a)?, parse_size(b)?)),
        None => {
            let v = parse_size(s)?;
            Ok((v, v))
        }
    }
}

/// Prints a clap error as one line (exit 2), or help/version as clap would (exit 0).
fn arg_error(e: clap::Error) -> ExitCode {
    if matches!(e.kind(), ErrorKind::DisplayHelp | ErrorKind::DisplayVersion) {
        let _ = e.print();
        return ExitCode::SUCCESS;
    }
    // clap's message is "error: ...", possibly with indented continuation lines, then a blank
    // line and usage: keep the part before the blank line, joined into one line.
    let text = e.to_string();
    let msg: Vec<&str> = text
        .lines()
        .take_while(|l| !l.trim().is_empty())
        .map(str::trim)
        .collect();
    let msg = msg.join(" ");
    let msg = msg.strip_prefix("error: ").unwrap_or(&msg);
    eprintln!("mvperf: {msg} (see mvperf --help)");
    ExitCode::from(2)
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(c) => c,
        Err(e) => return arg_error(e),
    };
    match cli.command {
        Some(Command::Server {
            port,
            bind,
            vsock,
            uds,
        }) => {
            let vsock = match (vsock, uds) {
                (_, Some(base)) => Some(server::VsockSide::Path(base)),
                (true, None) => Some(server::VsockSide::Socket),
                (false, None) => None,
            };
            let cfg = server::ServerConfig { bind, port, vsock };
            if let Err(e) = server::run(&cfg) {
                eprintln!("mvperf server: {e:#}");
            }
            // `run` returns only when it could not start.
            ExitCode::FAILURE
        }
        Some(Command::VsockHello { port }) => match vsock::hello(port) {
            Ok(line) => match emit(&line) {
                Ok(()) => ExitCode::SUCCESS,
                Err(_) => ExitCode::FAILURE,
            },
            Err(e) => {
                eprintln!("mvperf vsock-hello: host port {port}: {e}");
                ExitCode::FAILURE
            }
        },
        Some(Command::Http {
            method,
            headers,
            data,
            timeout,
            url,
        }) => {
            let body = data.map(String::into_bytes);
            let req = match http::Request::new(&method, &url, &headers, body) {
                Ok(r) => r,
                Err(e) => {
                    eprintln!("mvperf http: {e:#} (see mvperf --help)");
                    return ExitCode::from(2);
                }
            };
            http_main(&req, Duration::from_secs_f64(timeout), &url)
        }
        Some(Command::Selftest {
            timeout,
            true_bin,
            sh_bin,
        }) => {
            let cfg = selftest::SelftestConfig {
                timeout: Duration::from_secs_f64(timeout),
                true_bin,
                sh_bin,
            };
            if selftest::run(&cfg) {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            }
        }
        None => {
            let extra = if cli.test_options.is_empty() {
                SizeArgs::default()
            } else {
                match TestOptions::try_parse_from(&cli.test_options) {
                    Ok(t) => t.sizes,
                    Err(e) => return arg_error(e),
                }
            };
            // Invalid sizes for the chosen test are argument errors too (exit 2).
            let params = match test_params(&cli, &extra) {
                Ok(p) => p,
                Err(e) => {
                    eprintln!("mvperf: {e:#} (see mvperf --help)");
                    return ExitCode::from(2);
                }
            };
            match client_main(&cli, params) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("mvperf: {e:#}");
                    ExitCode::FAILURE
                }
            }
        }
    }
}

/// The test parameters from the command line, validated against the test's transport.
fn test_params(cli: &Cli, extra: &SizeArgs) -> Result<TestParams> {
    let test = cli.test;
    let default_msg = if test.is_udp() { 1472 } else { 16384 };
    let (req_size, resp_size) = extra.rr.or(cli.sizes.rr).unwrap_or((1, 1));
    let params = TestParams {
        test,
        duration: Duration::from_secs_f64(cli.length),
        msg_size: extra.msg_size.or(cli.sizes.msg_size).unwrap_or(default_msg),
        req_size,
        resp_size,
    };
    params.validate()?;
    Ok(params)
}

fn client_main(cli: &Cli, params: TestParams) -> Result<()> {
    let test = params.test;
    let (host, server) = match (&cli.host, &cli.uds, cli.cid) {
        (Some(host), _, _) => (
            host.clone(),
            client::Target::Ip(client::resolve(host, cli.port)?),
        ),
        (None, Some(uds), _) => (
            uds.display().to_string(),
            client::Target::Vsock(vsock::VsockPeer::Uds(uds.clone()), u32::from(cli.port)),
        ),
        (None, None, Some(cid)) => (
            format!("CID {cid}"),
            client::Target::Vsock(vsock::VsockPeer::Cid(cid), u32::from(cli.port)),
        ),
        (None, None, None) => anyhow::bail!("-H HOST (or --uds PATH, --cid CID) is required"),
    };
    let host = host.as_str();
    if !cli.json {
        emit(&format!("{}\n", report::banner(test, host, &server)))?;
    }
    let cfg = client::ClientConfig {
        server,
        params,
        grace: Duration::from_secs_f64(cli.grace),
        udp_timeout: Duration::from_millis(cli.udp_timeout_ms),
    };
    let outcome = client::run(&cfg)?;
    if cli.json {
        emit(&format!("{}\n", report::json(&outcome, host)))
    } else {
        emit(&report::text(&outcome))
    }
}

/// Runs one request: the body on stdout for a 2xx answer, one line on stderr otherwise.
fn http_main(req: &http::Request, timeout: Duration, url: &str) -> ExitCode {
    let what = format!("{} {url}", req.method);
    match http::fetch(req, timeout) {
        Ok(resp) if resp.is_success() => {
            let mut out = std::io::stdout().lock();
            match out.write_all(&resp.body).and_then(|()| out.flush()) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("mvperf http: {what}: writing the body to stdout: {e}");
                    ExitCode::FAILURE
                }
            }
        }
        Ok(resp) => {
            eprintln!("mvperf http: {what}: {}", resp.error_line());
            ExitCode::FAILURE
        }
        Err(e) => {
            eprintln!("mvperf http: {what}: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// Writes to stdout; unlike `print!` a closed pipe is an error, not a panic.
fn emit(text: &str) -> Result<()> {
    let mut out = std::io::stdout().lock();
    out.write_all(text.as_bytes())
        .and_then(|()| out.flush())
        .context("writing results to stdout")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cli_is_consistent() {
        use clap::CommandFactory;
        Cli::command().debug_assert();
    }

    #[test]
    fn size_parsers() {
        assert_eq!(parse_rr("64,1024"), Ok((64, 1024)));
        assert_eq!(parse_rr("32"), Ok((32, 32)));
        assert!(parse_rr("1,x").is_err());
        assert!(parse_size("0").is_err());
        assert!(parse_size("-5").is_err());
        assert!(parse_secs("0").is_err());
        assert!(parse_secs("abc").is_err());
        assert_eq!(parse_secs("1.5"), Ok(1.5));
    }

    #[test]
    fn test_specific_options_after_double_dash() {
        let cli = Cli::try_parse_from(["mvperf", "-H", "::1", "-t", "udp_rr", "--", "-r", "8,16"])
            .expect("parses");
        assert_eq!(cli.test, TestKind::UdpRr);
        let t = TestOptions::try_parse_from(&cli.test_options).expect("test options");
        assert_eq!(t.sizes.rr, Some((8, 16)));
    }

    #[test]
    fn http_subcommand_takes_curl_style_options() {
        let cli = Cli::try_parse_from([
            "mvperf",
            "http",
            "-X",
            "PUT",
            "-H",
            "A: 1",
            "--header",
            "B: 2",
            "-d",
            "x",
            "--timeout",
            "5",
            "http://h/",
        ])
        .expect("parses");
        let Some(Command::Http {
            method,
            headers,
            data,
            timeout,
            url,
        }) = cli.command
        else {
            panic!("not the http subcommand");
        };
        assert_eq!(
            (method.as_str(), headers, data, timeout, url.as_str()),
            (
                "PUT",
                vec!["A: 1".into(), "B: 2".into()],
                Some("x".into()),
                5.0,
                "http://h/"
            )
        );
        let cli = Cli::try_parse_from(["mvperf", "http", "http://h/"]).expect("parses");
        assert!(matches!(
            cli.command,
            Some(Command::Http { ref method, timeout, .. }) if method == "GET" && timeout == 60.0
        ));
        assert!(Cli::try_parse_from(["mvperf", "http"]).is_err());
    }

    #[test]
    fn server_subcommand_needs_no_host() {
        let cli = Cli::try_parse_from(["mvperf", "server", "--port", "0"]).expect("parses");
        assert!(matches!(cli.command, Some(Command::Server { port: 0, .. })));
        assert!(Cli::try_parse_from(["mvperf", "-t", "TCP_RR"]).is_err());
    }
}
