// SPDX-License-Identifier: Apache-2.0
//! Ids: the instance's and the devices'.
//!
//! A device's id is its key in the metrics line (every device's counters
//! sit at the line's top level, beside the line's own keys), its name in
//! log lines and in the API's paths. The rule is written here once, for
//! every kind of device: 1 to a kind's own bound of letters, digits, `_`,
//! `-` and `.`; not one of [`RESERVED_KEYS`], the line's own keys; and no
//! two devices with one id, whatever their kinds.

use super::error::ConfigError;
use super::DeviceKind;

/// Firecracker's default instance id.
pub const DEFAULT_ID: &str = "anonymous-instance";

/// The keys of a metrics line's own fields (the timestamp, the instance id,
/// the operator's `properties`, the VMM's counters, the console's `uart`),
/// which no device id may take.
pub const RESERVED_KEYS: [&str; 5] = ["utc_timestamp_ms", "id", "properties", "vmm", "uart"];

/// Checks `id`, the id of a device `what` (its kind in words), against the
/// rule for a device id, with `max_len` the kind's bound in bytes.
pub fn check_device_id(what: &'static str, id: &str, max_len: usize) -> Result<(), ConfigError> {
    id_rule(id, max_len).map_err(|reason| ConfigError::BadId {
        what,
        id: id.to_string(),
        reason,
    })
}

/// Why `id` cannot be a device id of at most `max_len` bytes.
fn id_rule(id: &str, max_len: usize) -> Result<(), String> {
    let allowed = |b: u8| b.is_ascii_alphanumeric() || b"_-.".contains(&b);
    if id.is_empty() || id.len() > max_len || !id.bytes().all(allowed) {
        return Err(format!("1 to {max_len} letters, digits, '_', '-' or '.'"));
    }
    if RESERVED_KEYS.contains(&id) {
        return Err(
            "a key of the metrics line itself (utc_timestamp_ms, id and vmm are)".to_string(),
        );
    }
    Ok(())
}

/// Checks that no two devices share an id: `devices` are each device's
/// kind and id.
pub fn check_unique_ids<'a>(
    devices: impl IntoIterator<Item = (DeviceKind, &'a str)>,
) -> Result<(), ConfigError> {
    let mut seen: Vec<(DeviceKind, &str)> = Vec::new();
    for (kind, id) in devices {
        if let Some((first, _)) = seen.iter().find(|(_, other)| *other == id) {
            return Err(ConfigError::DuplicateId {
                id: id.to_string(),
                first: first.a_name(),
                second: kind.a_name(),
            });
        }
        seen.push((kind, id));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_device_id_is_a_short_word_and_no_key_of_the_line() {
        for good in ["net0", "eth-1", "rootfs.v2", "A_b", &"x".repeat(20)] {
            assert_eq!(id_rule(good, 20), Ok(()), "{good}");
        }
        let chars = "1 to 20 letters, digits, '_', '-' or '.'";
        for bad in ["", "a/b", "a b", "é", "x\n", &"x".repeat(21)] {
            assert_eq!(id_rule(bad, 20), Err(chars.into()), "{bad:?}");
        }
        for key in RESERVED_KEYS {
            let e = id_rule(key, 64).unwrap_err();
            assert!(e.contains("metrics line"), "{key}: {e}");
        }
        // The bound is the kind's: 64 bytes fit a card's id.
        assert_eq!(id_rule(&"x".repeat(64), 64), Ok(()));
        let e = check_device_id("drive", "a/b", 20).unwrap_err();
        assert_eq!(e.to_string(), format!("invalid drive id 'a/b': {chars}"));
    }

    #[test]
    fn two_devices_of_any_kinds_may_not_share_an_id() {
        use DeviceKind::{Block, Net};
        assert!(check_unique_ids([(Net, "a"), (Block, "b")]).is_ok());
        let e = check_unique_ids([(Net, "a"), (Block, "b"), (Block, "a")]).unwrap_err();
        assert_eq!(
            e.to_string(),
            "id 'a' is used twice, by a network interface and by a drive: device ids are metrics keys"
        );
        let e = check_unique_ids([(Block, "x"), (Block, "x")]).unwrap_err();
        assert!(e
            .to_string()
            .starts_with("id 'x' is used twice, by a drive and by a drive"));
    }
}
