// SPDX-License-Identifier: Apache-2.0
//! Network interfaces as the user writes them, and their validation.
//!
//! A [`NetSpec`] is one interface from a `--net`, a `--tap` or a config
//! file's `network-interfaces` entry, every field optional. `finish_net`
//! applies the defaults and checks each value into a [`NicConfig`];
//! `check_unique` then checks the interfaces against each other.

use std::collections::HashSet;
use std::fmt;
use std::str::FromStr;

use devices::rate_limiter::RateLimiterConfig;
use devices::virtio::net::{
    IoEngine, Offloads, DEFAULT_MAC, DEFAULT_PASS_TIME_BUDGET_US, DEFAULT_QUEUE_SIZE,
    DEFAULT_WEIGHT_BYTES, DEFAULT_WEIGHT_PACKETS,
};

use super::error::ConfigError;
use super::ids::check_device_id;
use super::{NicConfig, TapBackend};

/// A guest NIC MAC address.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct MacAddr(pub [u8; 6]);

/// The virtio-net device's default: a stable, locally administered unicast
/// address, so that guests get the same address on every boot and host-side
/// neighbour entries stay valid.
impl Default for MacAddr {
    fn default() -> Self {
        MacAddr(DEFAULT_MAC)
    }
}

impl MacAddr {
    /// The default MAC of the NIC at `index`: [`MacAddr::default`] with the
    /// index added to the last octet, so NICs never share one by default.
    pub fn default_for(index: usize) -> MacAddr {
        let mut m = Self::default().0;
        m[5] = m[5].wrapping_add(index as u8);
        MacAddr(m)
    }
}

impl FromStr for MacAddr {
    type Err = ConfigError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let parts: Vec<&str> = s.split(':').collect();
        if parts.len() != 6 {
            return Err(ConfigError::Mac(s.to_string()));
        }
        let mut mac = [0u8; 6];
        for (byte, part) in mac.iter_mut().zip(parts) {
            if part.len() != 2 {
                return Err(ConfigError::Mac(s.to_string()));
            }
            *byte = u8::from_str_radix(part, 16).map_err(|_| ConfigError::Mac(s.to_string()))?;
        }
        if mac[0] & 1 != 0 {
            return Err(ConfigError::MulticastMac(s.to_string()));
        }
        Ok(MacAddr(mac))
    }
}

impl fmt::Display for MacAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let m = self.0;
        write!(
            f,
            "{:02x}:{:02x}:{:02x}:{:02x}:{:02x}:{:02x}",
            m[0], m[1], m[2], m[3], m[4], m[5]
        )
    }
}

/// One NIC as the user wrote it (a `--net`, a `--tap` or a config-file
/// interface): every field optional until `finish_net`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NetSpec {
    /// `id=` / `iface_id`.
    pub id: Option<String>,
    /// `tap=` / `host_dev_name`.
    pub tap: Option<String>,
    /// `fd=` / `host_dev_fd`.
    pub fd: Option<i64>,
    /// `mac=` / `guest_mac`.
    pub mac: Option<MacAddr>,
    /// `queue_size=`.
    pub queue_size: Option<u64>,
    /// `mtu=`.
    pub mtu: Option<u64>,
    /// `offloads=` and the `offload_*` switches.
    pub offloads: Option<Offloads>,
    /// `mrg_rxbuf=`.
    pub mrg_rxbuf: Option<bool>,
    /// `tx_weight_bytes=`.
    pub tx_weight_bytes: Option<u64>,
    /// `tx_weight_packets=`.
    pub tx_weight_packets: Option<u64>,
    /// `rx_weight_bytes=`.
    pub rx_weight_bytes: Option<u64>,
    /// `rx_weight_packets=`.
    pub rx_weight_packets: Option<u64>,
    /// `pass_time_budget_us=`.
    pub pass_time_budget_us: Option<u64>,
    /// The receive limiter.
    pub rx_rate_limiter: Option<RateLimiterConfig>,
    /// The transmit limiter.
    pub tx_rate_limiter: Option<RateLimiterConfig>,
    /// `io_engine=` / `io_engine`.
    pub io_engine: Option<IoEngine>,
}

impl NetSpec {
    /// `self` with every field it leaves open taken from `defaults`.
    pub(super) fn or(self, d: &NetSpec) -> NetSpec {
        NetSpec {
            id: self.id.or_else(|| d.id.clone()),
            tap: self.tap.or_else(|| d.tap.clone()),
            fd: self.fd.or(d.fd),
            mac: self.mac.or(d.mac),
            queue_size: self.queue_size.or(d.queue_size),
            mtu: self.mtu.or(d.mtu),
            offloads: self.offloads.or(d.offloads),
            mrg_rxbuf: self.mrg_rxbuf.or(d.mrg_rxbuf),
            tx_weight_bytes: self.tx_weight_bytes.or(d.tx_weight_bytes),
            tx_weight_packets: self.tx_weight_packets.or(d.tx_weight_packets),
            rx_weight_bytes: self.rx_weight_bytes.or(d.rx_weight_bytes),
            rx_weight_packets: self.rx_weight_packets.or(d.rx_weight_packets),
            pass_time_budget_us: self.pass_time_budget_us.or(d.pass_time_budget_us),
            rx_rate_limiter: self.rx_rate_limiter.or(d.rx_rate_limiter),
            io_engine: self.io_engine.or(d.io_engine),
            tx_rate_limiter: self.tx_rate_limiter.or(d.tx_rate_limiter),
        }
    }
}

/// The longest network interface id.
const MAX_ID_LEN: usize = 64;

/// Checks a TAP name as the kernel would (IFNAMSIZ, no '/', no NUL), so a
/// typo is a configuration error before anything is opened.
fn valid_tap_name(name: &str) -> bool {
    (1..16).contains(&name.len())
        && !name.contains(['/', '\0'])
        && !name.contains(char::is_whitespace)
}

/// Applies the defaults to the NIC at `index` and checks every value of it:
/// id, TAP name or descriptor, MTU, offloads, rate limiters and queue size.
pub(super) fn finish_net(index: usize, s: NetSpec) -> Result<NicConfig, ConfigError> {
    let id = s.id.unwrap_or_else(|| format!("net{index}"));
    check_device_id("network interface", &id, MAX_ID_LEN)?;
    if let Some(name) = &s.tap {
        if !valid_tap_name(name) {
            return Err(ConfigError::TapName {
                id,
                name: name.clone(),
            });
        }
    }
    let tap = match (s.fd, s.tap) {
        (Some(fd), name) => {
            if !(3..=i64::from(i32::MAX)).contains(&fd) {
                return Err(ConfigError::StdioFd(fd));
            }
            TapBackend::Fd {
                fd: fd as i32,
                name,
            }
        }
        (None, Some(name)) => TapBackend::Named(name),
        (None, None) => return Err(ConfigError::NoTap(id)),
    };
    let narrow = |what, value: u64| {
        u16::try_from(value).map_err(|_| ConfigError::TooLarge {
            id: id.clone(),
            what,
            value,
        })
    };
    let mtu = s.mtu.map(|m| narrow("MTU", m)).transpose()?;
    let queue_size = narrow(
        "queue size",
        s.queue_size.unwrap_or(DEFAULT_QUEUE_SIZE.into()),
    )?;
    let offloads = s.offloads.unwrap_or(Offloads::ALL);
    let rx_rate_limiter = s.rx_rate_limiter.unwrap_or_default();
    let tx_rate_limiter = s.tx_rate_limiter.unwrap_or_default();
    for (dir, rl) in [("rx", &rx_rate_limiter), ("tx", &tx_rate_limiter)] {
        rl.validate().map_err(|source| ConfigError::RateLimiter {
            id: id.clone(),
            dir,
            source,
        })?;
    }
    let device = devices::virtio::net::NetConfig {
        mac: s.mac.unwrap_or_else(|| MacAddr::default_for(index)).0,
        queue_size,
        tx_weight_bytes: s.tx_weight_bytes.unwrap_or(DEFAULT_WEIGHT_BYTES),
        tx_weight_packets: s.tx_weight_packets.unwrap_or(DEFAULT_WEIGHT_PACKETS),
        rx_weight_bytes: s.rx_weight_bytes.unwrap_or(DEFAULT_WEIGHT_BYTES),
        rx_weight_packets: s.rx_weight_packets.unwrap_or(DEFAULT_WEIGHT_PACKETS),
        pass_time_budget_us: s.pass_time_budget_us.unwrap_or(DEFAULT_PASS_TIME_BUDGET_US),
        offloads,
        mrg_rxbuf: s.mrg_rxbuf.unwrap_or(true),
        mtu,
        rx_rate_limiter,
        tx_rate_limiter,
        bounce_buffer: false,
        io_engine: s.io_engine.unwrap_or_default(),
    };
    // The device owns the bounds of its settings (queue size, MTU,
    // offloads): the same check `Net::new` makes, here before anything
    // is opened.
    if let Err(source) = device.validate() {
        return Err(ConfigError::Device { id, source });
    }
    Ok(NicConfig { id, tap, device })
}

/// Two NICs may share neither a TAP, a descriptor nor a MAC (nor an id,
/// which [`super::ids`] checks across every device).
pub(super) fn check_unique(nets: &[NicConfig]) -> Result<(), ConfigError> {
    let (mut taps, mut fds, mut macs) = (HashSet::new(), HashSet::new(), HashSet::new());
    for n in nets {
        let name = match &n.tap {
            TapBackend::Named(name) => Some(name),
            TapBackend::Fd { fd, name } => {
                if !fds.insert(*fd) {
                    return Err(ConfigError::DuplicateFd(*fd));
                }
                name.as_ref()
            }
        };
        if let Some(name) = name {
            if !taps.insert(name.as_str()) {
                return Err(ConfigError::DuplicateTap(name.clone()));
            }
        }
        if !macs.insert(n.device.mac) {
            return Err(ConfigError::DuplicateMac(MacAddr(n.device.mac).to_string()));
        }
    }
    Ok(())
}

/// Parses a list of offload names: `csum`, `tso4`, `tso6`, `tso` (both),
/// `ufo`, or one of `all` and `none`. The result is not yet validated
/// (TSO without csum is caught by `finish_net`).
pub fn parse_offloads<'a>(names: impl IntoIterator<Item = &'a str>) -> Result<Offloads, String> {
    let mut o = Offloads::NONE;
    for name in names {
        match name.trim() {
            "csum" => o.csum = true,
            "tso4" => o.tso4 = true,
            "tso6" => o.tso6 = true,
            "tso" => (o.tso4, o.tso6) = (true, true),
            "ufo" => o.ufo = true,
            "all" => o = Offloads::ALL,
            "none" | "" => {}
            other => {
                return Err(format!(
                    "unknown offload '{other}': expected csum, tso4, tso6, tso, ufo, all or none"
                ))
            }
        }
    }
    Ok(o)
}

#[cfg(test)]
mod tests {
    use super::*;
    use devices::virtio::net::NetConfigError;

    #[test]
    fn mac_parses_and_prints() {
        let good = [
            ("06:00:ac:10:00:02", [6, 0, 0xac, 0x10, 0, 2]),
            ("02:AB:cd:EF:01:23", [2, 0xab, 0xcd, 0xef, 1, 0x23]),
        ];
        for (s, bytes) in good {
            let mac: MacAddr = s.parse().unwrap();
            assert_eq!(mac.0, bytes);
            assert_eq!(mac.to_string(), s.to_lowercase());
        }
        let bad = [
            "",
            "06:00:ac:10:00",
            "06:00:ac:10:00:02:03",
            "6:0:ac:10:0:2",
            "zz:00:00:00:00:00",
            "06-00-ac-10-00-02",
            "06:00:ac:10:00:0g",
        ];
        for s in bad {
            assert!(
                matches!(s.parse::<MacAddr>(), Err(ConfigError::Mac(m)) if m == s),
                "{s}"
            );
        }
        assert!(matches!(
            "01:00:5e:00:00:01".parse::<MacAddr>(),
            Err(ConfigError::MulticastMac(_))
        ));
    }

    #[test]
    fn the_device_owns_the_queue_size_and_mtu_bounds() {
        let nic = |queue_size, mtu| {
            finish_net(
                0,
                NetSpec {
                    tap: Some("t0".into()),
                    queue_size,
                    mtu,
                    ..NetSpec::default()
                },
            )
        };
        // virtio 1.1 §2.6: a power of two, at most 32768 (2^0 included).
        for ok in [1, 2, 64, 256, 1024, 32768] {
            assert_eq!(nic(Some(ok), None).unwrap().device.queue_size, ok as u16);
        }
        for bad in [0u64, 3, 100, 32767, 65535] {
            let err = nic(Some(bad), None).unwrap_err();
            assert!(
                matches!(
                    &err,
                    ConfigError::Device { source: NetConfigError::QueueSize(q), .. } if u64::from(*q) == bad
                ),
                "{bad}: {err:?}"
            );
        }
        for (what, q, m) in [
            ("queue size", Some(65536), None),
            ("MTU", None, Some(70000)),
        ] {
            let err = crate::error_line(&nic(q, m).unwrap_err());
            assert!(
                err.contains(&format!("{what} ")) && err.contains("too large"),
                "{err}"
            );
        }
        assert_eq!(nic(None, Some(68)).unwrap().device.mtu, Some(68));
        assert!(matches!(
            nic(None, Some(67)),
            Err(ConfigError::Device {
                source: NetConfigError::Mtu(67),
                ..
            })
        ));
    }
}
