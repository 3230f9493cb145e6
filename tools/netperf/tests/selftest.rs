// SPDX-License-Identifier: Apache-2.0
//! `mvperf selftest` on the host: the same stress the guest image runs under
//! `minivmm.mode=selftest` must pass here, print exactly one PASS line on stdout
//! and exit 0. (Its own process: the stress signals the whole process.)

use std::process::Command;

#[test]
fn selftest_passes_on_the_host() {
    let out = Command::new(env!("CARGO_BIN_EXE_mvperf"))
        .args(["selftest", "--timeout", "120"])
        .output()
        .expect("running mvperf selftest");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    println!("{stdout}{stderr}");
    assert!(out.status.success(), "{stdout}\n{stderr}");
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.len(), 1, "{stdout}");
    assert!(
        lines[0].starts_with("MINIVMM-SELFTEST PASS threads="),
        "{stdout}"
    );
    for phase in ["threads", "switches", "signals", "fork", "exec"] {
        assert!(
            stderr.contains(&format!("selftest: {phase} ok")),
            "{stderr}"
        );
    }
}
