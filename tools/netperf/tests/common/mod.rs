// SPDX-License-Identifier: Apache-2.0
//! Helpers shared by the integration tests: a server child process on a free loopback port and
//! a client runner. All traffic stays on 127.0.0.1.
#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

/// Path of the binary under test.
pub const BIN: &str = env!("CARGO_BIN_EXE_mvperf");

/// An `mvperf server` on 127.0.0.1 with an ephemeral port; killed on drop.
pub struct Server {
    /// The child process.
    pub child: Child,
    /// Its control port.
    pub port: u16,
}

impl Server {
    /// Starts a server on 127.0.0.1 and waits for its "listening" line.
    pub fn start() -> Server {
        Server::start_on("127.0.0.1")
    }

    /// Starts a server bound to `bind` and waits for its "listening" line.
    pub fn start_on(bind: &str) -> Server {
        let mut child = Command::new(BIN)
            .args(["server", "--port", "0", "--bind", bind])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn mvperf server");
        let stdout = child.stdout.take().expect("server stdout");
        let mut line = String::new();
        BufReader::new(stdout)
            .read_line(&mut line)
            .expect("read server banner");
        let port = line
            .trim()
            .strip_prefix("mvperf server listening on ")
            .and_then(|a| a.rsplit_once(':'))
            .unwrap_or_else(|| panic!("unexpected server banner {line:?}"))
            .1
            .parse()
            .expect("port number");
        Server { child, port }
    }

    /// Sends a signal to the server (`kill -SIG pid`).
    pub fn signal(&self, sig: &str) {
        signal(self.child.id(), sig);
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        // A stopped process must be continued for the kill to be reaped promptly.
        let _ = Command::new("kill")
            .args(["-CONT", &self.child.id().to_string()])
            .status();
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `kill -SIG pid`.
pub fn signal(pid: u32, sig: &str) {
    let st = Command::new("kill")
        .args([&format!("-{sig}"), &pid.to_string()])
        .status()
        .expect("run kill");
    assert!(st.success(), "kill -{sig} {pid} failed");
}

/// Runs the client with `args` and returns its output and wall time.
pub fn run(args: &[&str]) -> (Output, Duration) {
    let t = Instant::now();
    let out = Command::new(BIN).args(args).output().expect("run mvperf");
    (out, t.elapsed())
}

/// Runs a client test with `--json` against `port` and returns the parsed object, asserting
/// success and a single JSON object on stdout.
pub fn run_json(port: u16, test: &str, secs: &str, extra: &[&str]) -> Value {
    run_json_to("127.0.0.1", port, test, secs, extra)
}

/// [`run_json`] against `host`.
pub fn run_json_to(host: &str, port: u16, test: &str, secs: &str, extra: &[&str]) -> Value {
    let port = port.to_string();
    let mut args = vec!["-t", test, "-H", host, "-p", &port, "-l", secs, "--json"];
    args.extend_from_slice(extra);
    let (out, _) = run(&args);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{test} failed: {:?}\nstdout: {stdout}\nstderr: {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        stdout.lines().count(),
        1,
        "one JSON line expected: {stdout}"
    );
    serde_json::from_str(stdout.trim()).expect("stdout is JSON")
}

/// A numeric field, panicking with the object if it is absent or not a number.
pub fn num(v: &Value, path: &[&str]) -> f64 {
    let mut cur = v;
    for k in path {
        cur = cur
            .get(k)
            .unwrap_or_else(|| panic!("field {path:?} missing in {v}"));
    }
    cur.as_f64()
        .unwrap_or_else(|| panic!("field {path:?} not numeric in {v}"))
}
