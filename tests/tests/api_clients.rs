// SPDX-License-Identifier: Apache-2.0
//! API clients that misbehave, as an attacker or a buggy program would, all
//! against minivmm under its default `--seccomp on`. None of them may end
//! minivmm, hang it, or lock the other clients out:
//!
//! - a client that pipelines requests and never reads the answers loses its
//!   connection once its answer has waited the documented time; minivmm
//!   goes on serving (before boot, and jailed with a VM running on a kernel
//!   that halts at once, whose log also shows refused connections counted
//!   at most once a second);
//! - sixteen connections that never send a byte do not keep a seventeenth
//!   client out, and each is closed after the idle time, as is a client
//!   that sends one byte a second and never finishes its request;
//! - a kernel or initramfs path that names a FIFO is refused at once (on
//!   the API and on the command line): the API keeps answering, a stop
//!   signal still stops minivmm, and a request answered `400` is not
//!   applied afterwards;
//! - a JSON body or config file with a key given twice is refused.

use std::io::{ErrorKind, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use minivmm_tests::{cli_args, minivmm_bin, require, write_halting_kernel, Need, Vm, JAIL_ID};

/// The README's idle time: a connection has this long for a whole request,
/// and an answer this long to be read.
const IDLE: Duration = Duration::from_secs(5);
/// The README's bound on open connections.
const MAX_CONNECTIONS: usize = 16;
/// Slack for a loaded 2-core host on top of the documented times.
const SLACK: Duration = Duration::from_secs(4);

fn tmp(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!("minivmm-clients-{}-{name}", std::process::id()))
}

fn wait_for_socket(vm: &mut Vm, sock: &Path) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !sock.exists() {
        if let Some(status) = vm.exited() {
            panic!(
                "minivmm exited with {status} before serving\n{}",
                vm.report()
            );
        }
        assert!(
            Instant::now() < deadline,
            "{} never appeared",
            sock.display()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// minivmm serving the API on a fresh socket, under `--seccomp on`.
fn serve(tag: &str, extra: &[String]) -> (Vm, PathBuf) {
    let sock = tmp(&format!("{tag}.sock"));
    let _ = std::fs::remove_file(&sock);
    let mut args = cli_args(&["--api-sock", sock.to_str().unwrap(), "--seccomp", "on"]);
    args.extend_from_slice(extra);
    let mut vm = Vm::spawn(&args, None).unwrap();
    wait_for_socket(&mut vm, &sock);
    (vm, sock)
}

/// One request on a connection of its own, read up to the end of its
/// answer: the answer, or why there was none within `within`.
fn request(sock: &Path, req: &str, within: Duration) -> Result<String, String> {
    let mut s = UnixStream::connect(sock).map_err(|e| format!("connect: {e}"))?;
    s.set_read_timeout(Some(within)).unwrap();
    s.write_all(req.as_bytes())
        .map_err(|e| format!("write: {e}"))?;
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        let n = s.read(&mut buf).map_err(|e| format!("read: {e}"))?;
        if n == 0 {
            return Err(format!(
                "the connection was closed after {} bytes of answer",
                got.len()
            ));
        }
        got.extend_from_slice(&buf[..n]);
        let text = String::from_utf8_lossy(&got).into_owned();
        if let Some(head) = text.find("\r\n\r\n") {
            let len = text[..head]
                .lines()
                .find_map(|l| l.strip_prefix("Content-Length: "))
                .map_or(0, |v| v.trim().parse::<usize>().unwrap());
            if got.len() >= head + 4 + len {
                return Ok(text);
            }
        }
    }
}

/// `method path` with a JSON body: (status, body, how long the answer took).
fn timed(sock: &Path, method: &str, path: &str, body: &str) -> (u16, String, Duration) {
    let t = Instant::now();
    let req = format!(
        "{method} {path} HTTP/1.1\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    let answer = request(sock, &req, Duration::from_secs(30))
        .unwrap_or_else(|e| panic!("{method} {path}: no answer: {e}"));
    let status = answer[9..12].parse().expect("a status code");
    let body = answer
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    (status, body, t.elapsed())
}

/// A client that pipelines `GET /vm/config` as fast as the socket takes it
/// and never reads an answer. Returns how long until minivmm dropped the
/// connection (a write fails); panics if minivmm exits meanwhile.
fn pipeline_without_reading(vm: &mut Vm, sock: &Path) -> Duration {
    let mut s = UnixStream::connect(sock).unwrap();
    s.set_nonblocking(true).unwrap();
    let one = b"GET /vm/config HTTP/1.1\r\n\r\n";
    let mut pending: Vec<u8> = Vec::new();
    let mut sent = 0usize;
    let t0 = Instant::now();
    loop {
        if let Some(status) = vm.exited() {
            panic!(
                "minivmm exited with {status} while a client sent {sent} bytes of requests \
                 and read no answer\n{}",
                vm.report()
            );
        }
        if t0.elapsed() > IDLE * 6 {
            panic!(
                "minivmm kept a client that reads no answer for {:?}",
                t0.elapsed()
            );
        }
        if pending.is_empty() {
            pending.extend_from_slice(one);
        }
        match s.write(&pending) {
            Ok(n) => {
                sent += n;
                pending.drain(..n);
            }
            Err(e) if e.kind() == ErrorKind::WouldBlock => {
                std::thread::sleep(Duration::from_millis(20))
            }
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            // EPIPE or ECONNRESET: minivmm closed it.
            Err(_) => return t0.elapsed(),
        }
    }
}

#[test]
fn a_client_that_never_reads_its_answers_is_dropped_and_minivmm_serves_on() {
    let (mut vm, sock) = serve("noread", &[]);
    let took = pipeline_without_reading(&mut vm, &sock);
    eprintln!("the client that does not read was dropped after {took:?}");
    let (status, body, _) = timed(&sock, "GET", "/", "");
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("Not started"), "{body}");
    vm.terminate(Duration::from_secs(10));
}

/// The running-VM case: jailed, on a kernel that halts at once (no guest
/// boot), the log at warn level on stderr.
#[test]
fn a_running_jailed_vm_survives_clients_that_never_read_and_counts_refusals() {
    if !require(&[Need::Kvm, Need::Root]) {
        return;
    }
    let jail = tmp("jail");
    let _ = std::fs::remove_dir_all(&jail);
    std::fs::create_dir_all(&jail).unwrap();
    write_halting_kernel(&jail.join("halt.elf")).unwrap();
    std::os::unix::fs::chown(&jail, Some(JAIL_ID), Some(JAIL_ID)).unwrap();
    let id = JAIL_ID.to_string();
    let sock = jail.join("api.sock");
    let args = cli_args(&[
        "--api-sock",
        "/api.sock",
        "--seccomp",
        "on",
        "--jail",
        jail.to_str().unwrap(),
        "--uid",
        &id,
        "--gid",
        &id,
        "--kernel",
        "/halt.elf",
        "--mem",
        "64",
    ]);
    let mut vm = Vm::spawn(&args, None).unwrap();
    wait_for_socket(&mut vm, &sock);
    let (status, body, _) = timed(&sock, "GET", "/", "");
    assert!(status == 200 && body.contains("Running"), "{status} {body}");

    pipeline_without_reading(&mut vm, &sock);

    // Sixteen clients that pipeline and do not read hold every connection
    // while their answers wait; meanwhile every new connection is refused
    // (closed at once), and the log counts them at most once a second.
    let hogs: Vec<_> = (0..MAX_CONNECTIONS)
        .map(|_| {
            let mut s = UnixStream::connect(&sock).unwrap();
            s.set_nonblocking(true).unwrap();
            // Whole requests until the socket takes no more.
            let mut pending = b"GET /vm/config HTTP/1.1\r\n\r\n".repeat(64);
            while let Ok(n) = s.write(&pending) {
                pending.rotate_left(n);
            }
            s
        })
        .collect();
    let before = vm.stderr();
    let t0 = Instant::now();
    let mut refused = 0;
    while t0.elapsed() < Duration::from_secs(2) {
        if request(&sock, "GET / HTTP/1.1\r\n\r\n", Duration::from_secs(2)).is_err() {
            refused += 1;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(
        refused >= 10,
        "only {refused} connections were refused\n{}",
        vm.report()
    );
    // The tally of the last second is written a second after the one before.
    std::thread::sleep(Duration::from_millis(1500));
    let log = vm.stderr()[before.len()..].to_string();
    let lines: Vec<&str> = log.lines().filter(|l| l.contains("refused")).collect();
    let counted: usize = lines
        .iter()
        .filter_map(|l| {
            let (n, _) = l.split_once(" connection(s) refused")?;
            n.rsplit(' ').next()?.parse::<usize>().ok()
        })
        .sum();
    assert_eq!(counted, refused, "the log counts otherwise:\n{log}");
    assert!(
        lines.len() <= 4,
        "{} log lines for {refused} refusals in 3.5 s:\n{log}",
        lines.len()
    );
    drop(hogs);
    let (status, body, _) = timed(&sock, "GET", "/", "");
    assert!(status == 200 && body.contains("Running"), "{status} {body}");
    vm.terminate(Duration::from_secs(10));
    let _ = std::fs::remove_dir_all(&jail);
}

/// Waits until the server closes `s` (a read returns 0 or fails other than
/// by timing out), for at most `limit`; how long that took, or `None`.
fn closed_within(s: &mut UnixStream, limit: Duration) -> Option<Duration> {
    let t0 = Instant::now();
    s.set_read_timeout(Some(Duration::from_millis(100)))
        .unwrap();
    let mut b = [0u8; 256];
    while t0.elapsed() < limit {
        match s.read(&mut b) {
            Ok(0) => return Some(t0.elapsed()),
            Ok(_) => {}
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
            Err(_) => return Some(t0.elapsed()),
        }
    }
    None
}

#[test]
fn idle_and_trickling_connections_are_closed_and_cannot_lock_others_out() {
    let (mut vm, sock) = serve("idle", &[]);
    let t0 = Instant::now();
    let mut silent: Vec<UnixStream> = (0..MAX_CONNECTIONS)
        .map(|_| UnixStream::connect(&sock).unwrap())
        .collect();
    // A client that sends a byte a second of a head that never ends.
    let trickle_sock = sock.clone();
    let trickler = std::thread::spawn(move || {
        let mut s = UnixStream::connect(&trickle_sock).unwrap();
        let start = Instant::now();
        s.write_all(b"GET / HTTP/1.1\r\nX-Slow: ").unwrap();
        while start.elapsed() < IDLE * 4 {
            if s.write_all(b"a").is_err() {
                return Some(start.elapsed());
            }
            if closed_within(&mut s, Duration::from_secs(1)).is_some() {
                return Some(start.elapsed());
            }
        }
        None
    });
    std::thread::sleep(Duration::from_millis(300));
    // Another client is served at once, idle connections or not.
    let answer = request(&sock, "GET / HTTP/1.1\r\n\r\n", Duration::from_secs(3));
    let answer = answer.unwrap_or_else(|e| {
        panic!("with {MAX_CONNECTIONS} idle connections open, a client got no answer: {e}")
    });
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    // Each silent connection is closed after the idle time (those that gave
    // way to the newer ones, at once).
    let mut early = 0;
    for s in &mut silent {
        let left = (IDLE + SLACK).saturating_sub(t0.elapsed());
        if closed_within(s, left).is_none() {
            panic!(
                "a connection that never sent a byte is still open after {:?}",
                t0.elapsed()
            );
        }
        if t0.elapsed() < IDLE - Duration::from_millis(500) {
            early += 1;
        }
    }
    assert!(
        early <= 2,
        "{early} idle connections closed before the idle time"
    );
    let trickled = trickler.join().unwrap();
    let trickled = trickled.unwrap_or_else(|| {
        panic!(
            "a client sending a byte a second was never closed ({:?})",
            IDLE * 4
        )
    });
    assert!(
        trickled >= IDLE - Duration::from_millis(500) && trickled <= IDLE + SLACK,
        "the trickling client was closed after {trickled:?}"
    );
    assert!(vm.exited().is_none(), "{}", vm.report());
    vm.terminate(Duration::from_secs(10));
}

fn mkfifo(path: &Path) {
    let _ = std::fs::remove_file(path);
    assert!(Command::new("mkfifo").arg(path).status().unwrap().success());
}

/// Opens the FIFO's write end without waiting, which lets a reader blocked
/// in `open` go on (none, if minivmm never opened it).
fn unblock_fifo(path: &Path) {
    use std::os::unix::fs::OpenOptionsExt;
    let _ = std::fs::OpenOptions::new()
        .write(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path);
}

#[test]
fn a_kernel_or_initramfs_fifo_is_refused_at_once_and_nothing_hangs() {
    let fifo = tmp("kernel.fifo");
    mkfifo(&fifo);
    let regular = tmp("kernel.file");
    std::fs::write(&regular, b"\x7fELF not really").unwrap();
    let (mut vm, sock) = serve("fifo", &[]);
    let kernel = format!(r#"{{"kernel_image_path": "{}"}}"#, fifo.display());
    let (k_status, k_body, k_took) = timed(&sock, "PUT", "/boot-source", &kernel);
    let machine = r#"{"vcpu_count": 2, "mem_size_mib": 128}"#;
    let (m_status, m_body, m_took) = timed(&sock, "PUT", "/machine-config", machine);
    // A reader stuck on the FIFO goes on now: whatever it held is applied
    // if it ever will be.
    unblock_fifo(&fifo);
    std::thread::sleep(Duration::from_millis(500));
    let (_, config, _) = timed(&sock, "GET", "/machine-config", "");
    let vcpus = if config.contains(r#""vcpu_count":2"#) {
        2
    } else {
        1
    };
    // A request answered 400 left nothing; one answered 204 is in force.
    assert_eq!(
        (m_status, vcpus),
        if m_status == 204 { (204, 2) } else { (m_status, 1) },
        "PUT /machine-config answered {m_status} {m_body}, then GET /machine-config showed {config}"
    );
    let initrd = format!(
        r#"{{"kernel_image_path": "{}", "initrd_path": "{}"}}"#,
        regular.display(),
        fifo.display()
    );
    let (i_status, i_body, i_took) = timed(&sock, "PUT", "/boot-source", &initrd);
    for (what, status, body, took) in [
        ("kernel", k_status, &k_body, k_took),
        ("initramfs", i_status, &i_body, i_took),
    ] {
        assert_eq!(status, 400, "a FIFO {what}: {body}");
        assert!(body.contains("not a regular file"), "a FIFO {what}: {body}");
        assert!(
            took < Duration::from_secs(3),
            "a FIFO {what}: answered after {took:?}"
        );
    }
    assert_eq!(m_status, 204, "{m_body}");
    assert!(m_took < Duration::from_secs(3), "answered after {m_took:?}");
    let t = Instant::now();
    vm.terminate(Duration::from_secs(10));
    assert!(
        t.elapsed() < Duration::from_secs(3),
        "SIGTERM took {:?}",
        t.elapsed()
    );

    // The command line: one line and status 1, at once.
    for flag in ["--kernel", "--initramfs"] {
        mkfifo(&fifo);
        let kernel = if flag == "--kernel" { &fifo } else { &regular };
        let mut args = cli_args(&["--kernel", kernel.to_str().unwrap(), "--seccomp", "on"]);
        if flag == "--initramfs" {
            args.extend(cli_args(&["--initramfs", fifo.to_str().unwrap()]));
        }
        let mut vm = Vm::spawn(&args, None).unwrap();
        let status = vm.wait_exit(Duration::from_secs(5));
        unblock_fifo(&fifo);
        let status = status.unwrap_or_else(|| panic!("{flag} FIFO: minivmm hangs"));
        let err = vm.stderr();
        assert_eq!(status.code(), Some(1), "{flag} FIFO: {err}");
        assert_eq!(err.lines().count(), 1, "{flag} FIFO: {err}");
        assert!(err.contains("not a regular file"), "{flag} FIFO: {err}");
    }
    let _ = std::fs::remove_file(&fifo);
    let _ = std::fs::remove_file(&regular);
}

#[test]
fn a_key_given_twice_is_refused_in_a_body_and_in_a_config_file() {
    let (mut vm, sock) = serve("dupkeys", &[]);
    for (path, body, key) in [
        (
            "/machine-config",
            r#"{"vcpu_count": 1, "mem_size_mib": 128, "vcpu_count": 2}"#,
            "vcpu_count",
        ),
        (
            "/network-interfaces/eth0",
            r#"{"iface_id": "eth0", "host_dev_name": "tap0",
                "rx_rate_limiter": {"bandwidth": {"size": 1, "refill_time": 100, "size": 9}}}"#,
            "size",
        ),
        (
            "/actions",
            r#"{"action_type": "FlushMetrics", "action_type": "InstanceStart"}"#,
            "action_type",
        ),
    ] {
        let (status, answer, _) = timed(&sock, "PUT", path, body);
        assert_eq!(status, 400, "PUT {path}: {answer}");
        assert!(
            answer.contains(&format!("duplicate field `{key}`")),
            "PUT {path}: {answer}"
        );
    }
    let (_, config, _) = timed(&sock, "GET", "/vm/config", "");
    assert!(config.contains(r#""network-interfaces":[]"#), "{config}");
    vm.terminate(Duration::from_secs(10));

    let file = tmp("dup.json");
    std::fs::write(
        &file,
        r#"{"boot-source": {"kernel_image_path": "/k"}, "machine-config":
             {"vcpu_count": 1, "mem_size_mib": 128}, "machine-config": {"vcpu_count": 2}}"#,
    )
    .unwrap();
    let out = Command::new(minivmm_bin())
        .args(["--config-file", file.to_str().unwrap()])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("duplicate field `machine-config`"), "{err}");
    let _ = std::fs::remove_file(&file);
}
