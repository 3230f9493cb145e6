// SPDX-License-Identifier: Apache-2.0
//! The benchmark's private network namespace and the TAP inside it.
//!
//! Only `ip` is used, so what is set up can be read back with the same
//! commands. The namespace is deleted on drop, which covers errors and the
//! parent's Ctrl-C handling; a stale one of the same name (same pid, earlier
//! crash) is removed first.

use std::process::Command;

use anyhow::{bail, Context, Result};

use crate::frames::{GUEST_IP, GUEST_MAC, HOST_IP, HOST_MAC};
use crate::host::TAP_NAME;

/// A network namespace that exists until dropped.
#[derive(Debug)]
pub struct Namespace {
    name: String,
}

fn ip(args: &[&str]) -> Result<()> {
    let out = Command::new("ip")
        .args(args)
        .output()
        .with_context(|| format!("run ip {}", args.join(" ")))?;
    if !out.status.success() {
        bail!(
            "ip {} failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}

fn mac(m: [u8; 6]) -> String {
    m.iter()
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(":")
}

fn dotted(a: [u8; 4]) -> String {
    format!("{}.{}.{}.{}", a[0], a[1], a[2], a[3])
}

impl Namespace {
    /// Creates `netbench-<pid>` with lo up and the TAP `mvb0` at
    /// 10.201.0.1/24, its MAC fixed, and a permanent neighbour entry for
    /// the fake guest 10.201.0.2 so nothing ever waits for ARP.
    pub fn create() -> Result<Namespace> {
        let name = format!("netbench-{}", std::process::id());
        let _ = ip(&["netns", "del", &name]);
        ip(&["netns", "add", &name])?;
        let ns = Namespace { name };
        let n = ns.name.as_str();
        let host = format!("{}/24", dotted(HOST_IP));
        ip(&["-n", n, "link", "set", "lo", "up"])?;
        ip(&["-n", n, "tuntap", "add", "dev", TAP_NAME, "mode", "tap"])?;
        ip(&["-n", n, "link", "set", TAP_NAME, "address", &mac(HOST_MAC)])?;
        ip(&["-n", n, "addr", "add", &host, "dev", TAP_NAME])?;
        ip(&["-n", n, "link", "set", TAP_NAME, "up"])?;
        ip(&[
            "-n",
            n,
            "neigh",
            "replace",
            &dotted(GUEST_IP),
            "lladdr",
            &mac(GUEST_MAC),
            "dev",
            TAP_NAME,
            "nud",
            "permanent",
        ])?;
        Ok(ns)
    }

    /// The namespace's name.
    pub fn name(&self) -> &str {
        &self.name
    }
}

impl Drop for Namespace {
    fn drop(&mut self) {
        if let Err(e) = ip(&["netns", "del", &self.name]) {
            eprintln!("netbench: could not delete namespace {}: {e:#}", self.name);
        }
    }
}

/// Inside the namespace: no IPv6 on the TAP (no router solicitations or
/// neighbour discovery sneaking into the RX ring). Best effort.
pub fn tune_inside() -> Result<()> {
    let p = format!("/proc/sys/net/ipv6/conf/{TAP_NAME}/disable_ipv6");
    if std::path::Path::new(&p).exists() {
        std::fs::write(&p, "1").with_context(|| format!("write {p}"))?;
    }
    Ok(())
}
