// SPDX-License-Identifier: Apache-2.0
//! `PATCH` on a running virtio device, whatever its kind
//! (`/network-interfaces/{id}`, `/drives/{id}`): the body read against what
//! the device's [`DeviceControl`] offers, the change put in force through
//! it, and the configuration in force updated, so that `GET /vm/config`
//! shows it.
//!
//! A body holds the device's id field (checked against the path by the
//! router), any of the device's rate limiters by name, and, for a device
//! with an image, `path_on_host`; anything else is refused. A limiter
//! update follows Firecracker's: a bucket given replaces the one in force,
//! a bucket of size 0 turns it off, a bucket absent or `null` stays. A new
//! image takes two trips (see [`super::command`]): every check that needs
//! no file comes first, so a bad request opens nothing. A request is
//! refused as a whole, with nothing changed, but where the image changed
//! and the limiter then could not be made (the host refused a timer),
//! which the message says.

use std::path::PathBuf;
use std::sync::Mutex;

use devices::rate_limiter::{RateLimiterConfig, TokenBucketConfig};
use serde_json::{json, Value};

use super::command::{Answer, OpenedImage};
use super::http::Response;
use crate::config::{file, DeviceKind, VmmConfig};
use crate::control::{Controls, DeviceControl, NamedLimiter};
use crate::registry::lock;

/// What one `PATCH` asks of a device.
#[derive(Debug, Default)]
struct Change {
    /// The new limiters, each whole.
    limiters: Vec<NamedLimiter>,
    /// A new image.
    path: Option<PathBuf>,
}

/// Answers `PATCH` on the device `kind` `id` of `devices` (see the module
/// doc); `image` is what the API thread opened, on the second trip.
pub fn patch_device(
    config: &mut VmmConfig,
    devices: &Controls,
    kind: DeviceKind,
    id: &str,
    body: Value,
    image: Option<OpenedImage>,
) -> Answer {
    let Some(dev) = devices.get(kind, id) else {
        return Response::fault(&format!("no {} '{id}'", kind.name())).into();
    };
    let fault = |msg: String| Response::fault(&format!("{} '{id}': {msg}", kind.name())).into();
    let change = match read_change(kind, &*lock(dev), body) {
        Ok(c) => c,
        Err(msg) => return fault(msg),
    };
    let mut done = Vec::new();
    if let Some(path) = change.path {
        let Some(image) = image else {
            let read_only = lock(dev).image().is_some_and(|i| i.read_only);
            return Answer::Open { path, read_only };
        };
        if let Err(msg) = take_image(devices, (kind, id), dev, image, &path) {
            return fault(msg);
        }
        done.push(format!(
            "image {}",
            crate::one_line(path.display().to_string())
        ));
        if let Some(p) = config.image_mut(kind, id) {
            *p = path;
        }
    }
    if !change.limiters.is_empty() {
        if let Err(why) = lock(dev).set_rate_limiters(&change.limiters) {
            return fault(match done.first() {
                None => why,
                Some(image) => format!("the {image} is in use, but the rate limiter is not: {why}"),
            });
        }
        for (name, limiter) in &change.limiters {
            if let Some(l) = config.limiter_mut(kind, id, name) {
                *l = *limiter;
            }
        }
        done.push("rate limits".into());
    }
    if done.is_empty() && kind.patch_needs_a_change() {
        let fields = fields(&*lock(dev));
        let give = match fields.split_last() {
            Some((last, rest)) if !rest.is_empty() => {
                format!("{}, {last} or both", rest.join(", "))
            }
            _ => fields.join(""),
        };
        return fault(format!("nothing to change: give {give}"));
    }
    if !done.is_empty() {
        log::info!("{} '{id}': {} changed", kind.name(), done.join(" and "));
    }
    Response::no_content().into()
}

/// The fields a `PATCH` of `dev` may change.
fn fields(dev: &dyn DeviceControl) -> Vec<&'static str> {
    let mut names: Vec<&str> = dev.rate_limiters().iter().map(|(n, _)| *n).collect();
    if dev.image().is_some() {
        names.insert(0, "path_on_host");
    }
    names
}

/// Reads a `PATCH` body against what `dev` offers.
fn read_change(kind: DeviceKind, dev: &dyn DeviceControl, body: Value) -> Result<Change, String> {
    let Value::Object(body) = body else {
        return Err("the body must be a JSON object".into());
    };
    let current = dev.rate_limiters();
    let has_image = dev.image().is_some();
    let mut change = Change::default();
    for (key, value) in body {
        if Some(key.as_str()) == kind.id_key() {
            continue;
        }
        if let Some((name, cur)) = current.iter().find(|(n, _)| *n == key) {
            if !value.is_null() {
                change
                    .limiters
                    .push((name, updated_limiter(name, cur, value)?));
            }
        } else if key == "path_on_host" && has_image {
            let path = serde_json::from_value(value).map_err(|e| format!("path_on_host: {e}"))?;
            change.path = Some(path);
        } else {
            let known: Vec<&str> = kind.id_key().into_iter().chain(fields(dev)).collect();
            return Err(format!(
                "unknown field `{key}`, expected one of {}",
                known.join(", ")
            ));
        }
    }
    Ok(change)
}

/// Puts the image the API thread opened under `dev`, unless another device
/// has that file (two writers, or a reader whose data changes under it);
/// `Err` is a one-line reason, and then nothing changed.
fn take_image(
    devices: &Controls,
    this: (DeviceKind, &str),
    dev: &Mutex<dyn DeviceControl>,
    image: OpenedImage,
    path: &std::path::Path,
) -> Result<(), String> {
    if let Some(file) = image.file() {
        // Each lock is taken alone.
        let other = devices
            .iter()
            .filter(|(k, i, _)| (*k, i.as_str()) != this)
            .find(|(_, _, c)| lock(c).image().is_some_and(|i| i.file == file));
        if let Some((kind, other, _)) = other {
            let path = crate::one_line(path.display().to_string());
            return Err(format!(
                "disk image {path} is already {} '{other}'",
                kind.name()
            ));
        }
    }
    lock(dev).take_image(image, path)
}

/// Applies a Firecracker limiter update to `current` (see the module doc).
pub(crate) fn updated_limiter(
    what: &str,
    current: &RateLimiterConfig,
    update: Value,
) -> Result<RateLimiterConfig, String> {
    let Value::Object(update) = update else {
        return Err(format!("{what}: must be a JSON object"));
    };
    let mut out = *current;
    for (key, bucket) in update {
        let slot: &mut Option<TokenBucketConfig> = match key.as_str() {
            "bandwidth" => &mut out.bandwidth,
            "ops" => &mut out.ops,
            other => return Err(format!("{what}: unknown field '{other}'")),
        };
        if bucket.is_null() {
            continue;
        }
        if bucket.get("size").and_then(Value::as_u64) == Some(0) {
            *slot = None;
            continue;
        }
        let parsed = file::rate_limiter(what, json!({ key.as_str(): bucket }))
            .map_err(|e| crate::error_line(&e).replacen("config file: ", "", 1))?;
        *slot = if key == "bandwidth" {
            parsed.bandwidth
        } else {
            parsed.ops
        };
    }
    out.validate()
        .map_err(|e| format!("{what}: {}", crate::error_line(&e)))?;
    Ok(out)
}

/// A bucket of `size` tokens per `refill` ms, for the tests of a limiter
/// change.
#[cfg(test)]
pub(crate) fn bucket(size: u64, refill: u64) -> Option<TokenBucketConfig> {
    Some(TokenBucketConfig {
        size,
        one_time_burst: 0,
        refill_time: refill,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_limiter_update_replaces_what_it_names_and_keeps_the_rest() {
        let cur = RateLimiterConfig {
            bandwidth: bucket(1000, 100),
            ops: bucket(10, 100),
        };
        let up = json!({"bandwidth": {"size": 5000, "refill_time": 50}});
        let out = updated_limiter("rx", &cur, up).expect("ok");
        assert_eq!(out.bandwidth, bucket(5000, 50));
        assert_eq!(out.ops, cur.ops);
        // null keeps, size 0 turns off.
        let out = updated_limiter(
            "rx",
            &cur,
            json!({"bandwidth": null, "ops": {"size": 0, "refill_time": 0}}),
        )
        .expect("ok");
        assert_eq!(out.bandwidth, cur.bandwidth);
        assert_eq!(out.ops, None);
        let burst = json!({"ops": {"size": 7, "one_time_burst": 3, "refill_time": 9}});
        let out = updated_limiter("rx", &cur, burst).expect("ok");
        assert_eq!(
            out.ops.map(|b| (b.size, b.one_time_burst, b.refill_time)),
            Some((7, 3, 9))
        );
    }

    #[test]
    fn a_bad_limiter_update_is_refused_with_its_reason() {
        let cur = RateLimiterConfig::default();
        let e =
            updated_limiter("tx_rate_limiter", &cur, json!({"bandwith": {}})).expect_err("typo");
        assert!(e.contains("bandwith"), "{e}");
        let e = updated_limiter("tx_rate_limiter", &cur, json!([1])).expect_err("not an object");
        assert!(e.contains("object"), "{e}");
        let e = updated_limiter(
            "tx_rate_limiter",
            &cur,
            json!({"ops": {"size": 5, "refill_time": 0}}),
        )
        .expect_err("refill 0");
        assert!(e.contains("tx_rate_limiter"), "{e}");
        let e = updated_limiter("tx_rate_limiter", &cur, json!({"ops": {"size": 5}}))
            .expect_err("no refill_time");
        assert!(e.contains("refill_time"), "{e}");
    }
}
