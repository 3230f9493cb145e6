// SPDX-License-Identifier: Apache-2.0
//! The VSOCK tests without a guest: `mvperf server --uds BASE` takes them on the Unix sockets
//! `BASE_<port>` (the host's side of a guest's vsock connections through a Firecracker-style
//! VMM), and the client reaches it with `--uds PATH` through a stand-in for that VMM here,
//! which answers `CONNECT <port>` with `OK <n>` and relays bytes to `BASE_<port>`, as the VMM
//! relays them to the guest. Every test completes with traffic, and a port nothing listens on
//! fails with one line.

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::Shutdown;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::thread;

use common::{num, run, BIN};

struct Dir(PathBuf);

impl Dir {
    fn new(tag: &str) -> Dir {
        let d = std::env::temp_dir().join(format!("mvperf-vsock-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).expect("scratch directory");
        Dir(d)
    }
}

impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Copies `from` to `to` until EOF, then shuts `to`'s write side.
fn relay(mut from: UnixStream, mut to: UnixStream) {
    let mut buf = [0u8; 65536];
    while let Ok(n) = from.read(&mut buf) {
        if n == 0 || to.write_all(&buf[..n]).is_err() {
            break;
        }
    }
    let _ = to.shutdown(Shutdown::Write);
}

/// The VMM's host side: a listener at `uds` whose connections name a port with
/// `CONNECT <port>\n`, are answered `OK 1073741824\n` when `<base>_<port>` takes them (and
/// closed otherwise), then relayed both ways.
fn fake_vmm(uds: &Path, base: PathBuf) {
    let l = UnixListener::bind(uds).expect("the VMM's socket");
    thread::spawn(move || {
        for s in l.incoming().map_while(Result::ok) {
            let base = base.clone();
            thread::spawn(move || {
                let mut r = BufReader::new(s.try_clone().expect("dup"));
                let mut line = String::new();
                if r.read_line(&mut line).is_err() {
                    return;
                }
                let Some(port) = line.strip_prefix("CONNECT ").map(str::trim) else {
                    return;
                };
                let Ok(guest) = UnixStream::connect(format!("{}_{port}", base.display())) else {
                    return;
                };
                let mut host = s;
                host.write_all(b"OK 1073741824\n").expect("OK");
                let (h2, g2) = (
                    host.try_clone().expect("dup"),
                    guest.try_clone().expect("dup"),
                );
                thread::spawn(move || relay(h2, guest));
                relay(g2, host);
            });
        }
    });
}

/// `mvperf server --uds BASE`, waited for until both listening lines are out.
struct UdsServer(Child);

impl UdsServer {
    fn start(base: &Path) -> UdsServer {
        let mut child = Command::new(BIN)
            .args(["server", "--port", "0", "--bind", "127.0.0.1", "--uds"])
            .arg(base)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn mvperf server");
        let mut out = BufReader::new(child.stdout.take().expect("stdout"));
        let mut line = String::new();
        out.read_line(&mut line).expect("TCP line");
        line.clear();
        out.read_line(&mut line).expect("vsock line");
        assert_eq!(line.trim(), "mvperf server listening on vsock port 12865");
        UdsServer(child)
    }
}

impl Drop for UdsServer {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn vsock_json(uds: &Path, test: &str, extra: &[&str]) -> serde_json::Value {
    let uds = uds.to_str().expect("UTF-8 path");
    let mut args = vec!["-t", test, "--uds", uds, "-l", "1", "--json"];
    args.extend_from_slice(extra);
    let (out, _) = run(&args);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{test}: {}\n{stdout}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_str(stdout.trim()).expect("one JSON object")
}

#[test]
fn vsock_tests_through_a_vmms_unix_sockets() {
    let d = Dir::new("uds");
    let base = d.0.join("v.sock");
    let uds = d.0.join("vmm.sock");
    let _server = UdsServer::start(&base);
    assert!(d.0.join("v.sock_12865").exists());
    fake_vmm(&uds, base.clone());
    for test in ["VSOCK_STREAM", "VSOCK_MAERTS"] {
        let v = vsock_json(&uds, test, &[]);
        assert_eq!(v["test"], test);
        assert!(num(&v, &["bytes"]) > 0.0, "{v}");
        assert!(num(&v, &["throughput_mbps"]) > 0.0, "{v}");
        assert_eq!(
            v["server"],
            format!("vsock through {} port 12865", uds.display())
        );
    }
    let v = vsock_json(&uds, "VSOCK_RR", &["-r", "64,1024"]);
    assert!(num(&v, &["transactions"]) > 0.0, "{v}");
    assert_eq!(num(&v, &["request_size"]), 64.0);
    assert_eq!(num(&v, &["response_size"]), 1024.0);
    let p50 = num(&v, &["latency_us", "p50"]);
    assert!(p50 > 0.0 && p50 <= num(&v, &["latency_us", "p99"]), "{v}");
    // Text output names the transport.
    let uds_s = uds.to_str().expect("UTF-8 path");
    let (out, _) = run(&["-t", "VSOCK_RR", "--uds", uds_s, "-l", "1"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.starts_with("MIGRATED VSOCK REQUEST/RESPONSE TEST"),
        "{text}"
    );
    assert!(text.contains("AF_VSOCK"), "{text}");
}

#[test]
fn a_vsock_port_nothing_listens_on_or_a_wrong_pairing_is_one_line() {
    let d = Dir::new("refused");
    let base = d.0.join("v.sock");
    let uds = d.0.join("vmm.sock");
    fake_vmm(&uds, base.clone());
    let uds_s = uds.to_str().expect("UTF-8 path");
    let (out, _) = run(&["-t", "VSOCK_STREAM", "--uds", uds_s, "-l", "1"]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("port 12865: server is not listening"), "{err}");
    // A TCP test cannot go through a vsock peer, nor a VSOCK test to -H.
    let (out, _) = run(&["-t", "TCP_RR", "--uds", uds_s, "-l", "1"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("not vsock"));
    let (out, _) = run(&["-t", "VSOCK_RR", "-H", "127.0.0.1", "-l", "1"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("needs a vsock server"));
    // -H with --uds is a usage error.
    let (out, _) = run(&["-t", "VSOCK_RR", "-H", "127.0.0.1", "--uds", uds_s]);
    assert_eq!(out.status.code(), Some(2));
}
