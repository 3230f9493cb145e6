// SPDX-License-Identifier: Apache-2.0
//! `mvperf http` against minivmm's MMDS, served on loopback by the device's own HTTP layer
//! and store (`devices::mmds::http`, `devices::mmds::Mmds`) behind a plain TCP listener: the
//! requests the guest image's init makes (a V2 session token, then the whole store as JSON
//! with it; V1 without one) print exactly what MMDS answers, a refused one exits 1 with the
//! status on one line and nothing on stdout, and a bad command line exits 2.

mod common;

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::process::Output;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::Instant;

use common::run;
use devices::mmds::http::{parse, respond, Parsed, Response};
use devices::mmds::{Mmds, MmdsMetrics, MmdsVersion};
use serde_json::{json, Value};

struct MmdsServer {
    port: u16,
    metrics: Arc<MmdsMetrics>,
}

/// Answers every request of one keep-alive connection as MMDS does, until the client
/// closes it.
fn serve_connection(mut s: TcpStream, store: &Mutex<Mmds>, m: &MmdsMetrics) {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    let mut out = Vec::new();
    loop {
        let (resp, used, http10) = match parse(&buf) {
            Parsed::Incomplete => match s.read(&mut chunk) {
                Ok(0) | Err(_) => return,
                Ok(n) => {
                    buf.extend_from_slice(&chunk[..n]);
                    continue;
                }
            },
            Parsed::Request(req, n) => {
                let mut st = store.lock().expect("store");
                (respond(&mut st, &req, Instant::now(), m), n, req.http10)
            }
            Parsed::Bad(n) => (Response::bad_request(), n, false),
            Parsed::TooLarge => {
                let _ = s.shutdown(Shutdown::Both);
                return;
            }
        };
        buf.drain(..used);
        resp.write(http10, &mut out);
        if s.write_all(&out).is_err() {
            return;
        }
    }
}

/// MMDS with `store` under `version` on a free loopback port.
fn mmds(version: MmdsVersion, store: Value) -> MmdsServer {
    let mut mmds = Mmds::default();
    mmds.put(store).expect("the store fits");
    mmds.configure(version, false);
    let store = Arc::new(Mutex::new(mmds));
    let metrics = Arc::new(MmdsMetrics::default());
    let l = TcpListener::bind("127.0.0.1:0").expect("bind loopback");
    let port = l.local_addr().expect("address").port();
    let m = Arc::clone(&metrics);
    thread::spawn(move || {
        for s in l.incoming().map_while(Result::ok) {
            let (store, m) = (Arc::clone(&store), Arc::clone(&m));
            thread::spawn(move || serve_connection(s, &store, &m));
        }
    });
    MmdsServer { port, metrics }
}

fn count(c: &AtomicU64) -> u64 {
    c.load(Ordering::Relaxed)
}

fn http(args: &[&str]) -> Output {
    let mut all = vec!["http", "--timeout", "20"];
    all.extend_from_slice(args);
    run(&all).0
}

fn stdout(out: &Output) -> String {
    assert!(
        out.status.success(),
        "{:?}: {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.stderr.is_empty(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout.clone()).expect("UTF-8 body")
}

/// A failure: exit status `code`, nothing on stdout, one line on stderr, returned.
fn failure(out: &Output, code: i32) -> String {
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(code), "stderr: {err}");
    assert!(
        out.stdout.is_empty(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    assert_eq!(err.lines().count(), 1, "{err}");
    err
}

fn store() -> Value {
    json!({"latest": {"meta-data": {"ami-id": "ami-12345678", "reservation-id": "r-fea54097"}},
           "user-data": "#cloud-config"})
}

#[test]
fn v2_a_token_then_the_whole_store_as_json() {
    let s = mmds(MmdsVersion::V2, store());
    let base = format!("http://127.0.0.1:{}", s.port);
    let token = stdout(&http(&[
        "-X",
        "PUT",
        "-H",
        "X-metadata-token-ttl-seconds: 21600",
        &format!("{base}/latest/api/token"),
    ]));
    assert!(
        !token.is_empty() && token.bytes().all(|b| b.is_ascii_hexdigit()),
        "{token:?}"
    );
    let auth = format!("X-metadata-token: {token}");
    let got = stdout(&http(&[
        "--header",
        "Accept: application/json",
        "--header",
        &auth,
        &format!("{base}/"),
    ]));
    assert_eq!(got, serde_json::to_string(&store()).expect("JSON"));
    // IMDS text, a path into the store.
    let got = stdout(&http(&["-H", &auth, &format!("{base}/latest/meta-data")]));
    assert_eq!(got, "ami-id\nreservation-id");
    assert_eq!(count(&s.metrics.mmds_tokens_issued), 1);
    assert_eq!(count(&s.metrics.mmds_requests_accepted), 3);

    // Without a token, or with a wrong one: 401, said on one line.
    let err = failure(&http(&[&format!("{base}/")]), 1);
    assert!(
        err.starts_with(&format!(
            "mvperf http: GET {base}/: 401 Unauthorized: No MMDS token"
        )),
        "{err}"
    );
    let err = failure(
        &http(&["-H", "X-metadata-token: 00", &format!("{base}/")]),
        1,
    );
    assert!(
        err.contains("401 Unauthorized: MMDS token not valid."),
        "{err}"
    );
    // A token request without a TTL, and a path that is not there.
    let err = failure(
        &http(&["-X", "PUT", &format!("{base}/latest/api/token")]),
        1,
    );
    assert!(
        err.contains(": 400 Bad Request: Token time to live"),
        "{err}"
    );
    let err = failure(&http(&["-H", &auth, &format!("{base}/nothing/here")]), 1);
    assert!(
        err.contains(": 404 Not Found: Resource not found: /nothing/here."),
        "{err}"
    );
    assert_eq!(count(&s.metrics.mmds_requests_refused), 4);
}

#[test]
fn v1_answers_without_a_token() {
    let s = mmds(MmdsVersion::V1, json!({"instance-id": "i-0123"}));
    let url = format!("http://localhost:{}/", s.port);
    let got = stdout(&http(&["-H", "Accept: application/json", &url]));
    assert_eq!(got, r#"{"instance-id":"i-0123"}"#);
    assert_eq!(count(&s.metrics.mmds_rx_no_token), 1);
    // A method MMDS does not take.
    let err = failure(&http(&["-X", "DELETE", &url]), 1);
    assert!(err.contains(": 405 Method Not Allowed: "), "{err}");
}

#[test]
fn transport_failures_and_bad_command_lines() {
    let port = {
        let l = TcpListener::bind("127.0.0.1:0").expect("bind loopback");
        l.local_addr().expect("address").port()
    };
    let url = format!("http://127.0.0.1:{port}/");
    let err = failure(&http(&[&url]), 1);
    assert!(err.contains("connecting to 127.0.0.1"), "{err}");
    for bad in [
        &["https://127.0.0.1/"][..],
        &["-H", "no colon", "http://127.0.0.1/"],
        &["-X", "G T", "http://127.0.0.1/"],
        &["--timeout", "0", "http://127.0.0.1/"],
        &[],
    ] {
        let out = run(&[&["http"][..], bad].concat()).0;
        failure(&out, 2);
    }
}
