// SPDX-License-Identifier: Apache-2.0
//! Firecracker's API description, as data, and a checker for it, so tests
//! can say "this answer is what a Firecracker client expects".
//!
//! [`definitions`] holds, written out by hand as JSON Schema in
//! `tests/data/firecracker_definitions.json`, the definitions of
//! Firecracker's `src/firecracker/swagger/firecracker.yaml` that minivmm
//! answers with: `InstanceInfo` (`GET /`),
//! `FirecrackerVersion` (`GET /version`), `MachineConfiguration`
//! (`GET /machine-config`), `FullVmConfiguration` (`GET /vm/config`) with
//! everything it references, `BalloonStats` (`GET /balloon/statistics`),
//! `BalloonHintingStatus` (`GET /balloon/hinting/status`), and `Error`
//! (every failure). They follow the
//! description's version **1.17.0-dev** (`info.version`; the `main` branch
//! at commit 004d935399ba6062240af269638635d54229f5bf, read on 2026-12-03),
//! in which `FullVmConfiguration` has `pmem` and `memory-hotplug` and
//! `NetworkInterface` has `mtu`. Descriptions, `default`, `format` and
//! `example` are left out: they constrain nothing.
//!
//! [`validate`] checks a body against one definition with the keywords
//! those definitions use: `type`, `required`, `properties`,
//! `additionalProperties` (`true`, or a schema every unlisted property
//! meets), `enum`, `items`, `$ref`, `minimum` and `maximum`
//! (`vcpu_count` and `mtu` have one). Two rules follow how Firecracker's own
//! tests read the description (`tests/framework/swagger_validator.py`):
//!
//! - an object admits no property its schema does not list unless the schema
//!   says `additionalProperties: true` (the validator there adds
//!   `additionalProperties: false` to every schema; Firecracker's structs are
//!   `deny_unknown_fields`, so an unknown key is an error there too);
//! - a property whose value is `null` counts as absent (the validator strips
//!   nulls before checking, since Firecracker writes every unset `Option` as
//!   `null`, `"balloon": null` included): a `null` required property is
//!   missing. A `null` item of an array is a type error here, where that
//!   validator would drop it: no Firecracker answer has one.
//!
//! minivmm's config file has keys of its own beside Firecracker's (README,
//! "Config file"). [`validate_minivmm`] admits exactly those listed in
//! [`minivmm_extensions`], each with its own schema, on top of the
//! description, and nothing else; it never relaxes a `required`. So a card
//! on an inherited descriptor without a `host_dev_name`, which
//! `NetworkInterface` requires, is reported by both.
//!
//! A failure is the first violation, with its JSON path:
//! `$.network-interfaces[0].guest_mac: expected string, got number`.

use std::sync::OnceLock;

use serde_json::{json, Map, Value};

/// The version of Firecracker's API description [`definitions`] follows.
pub const FIRECRACKER_API_VERSION: &str = "1.17.0-dev";

/// The text of [`definitions`]: data, so it is kept as a JSON file.
const FIRECRACKER_DEFINITIONS: &str = include_str!("../data/firecracker_definitions.json");

/// Firecracker's definitions by name (see the module doc).
pub fn definitions() -> &'static Value {
    static DEFS: OnceLock<Value> = OnceLock::new();
    DEFS.get_or_init(|| {
        serde_json::from_str(FIRECRACKER_DEFINITIONS)
            .expect("tests/data/firecracker_definitions.json is valid JSON")
    })
}

/// The keys minivmm's config file (and so `GET /vm/config`) has beyond
/// Firecracker's, by definition: `{definition: {property: schema}}`. Each is
/// documented in the README's config-file table.
pub fn minivmm_extensions() -> &'static Value {
    static EXT: OnceLock<Value> = OnceLock::new();
    EXT.get_or_init(|| {
        let count = json!({"type": "integer", "minimum": 0});
        // A power of two up to 32768 (virtio 1.1 §2.6); the power is not
        // expressible in this subset, the bounds are.
        let queue_size = json!({"type": "integer", "minimum": 1, "maximum": 32768});
        json!({
            "BootSource": {
                "cmdline_extra": {"type": "string"}
            },
            "MachineConfiguration": {
                "host_quirks": {"type": "string", "enum": ["auto", "on", "off"]}
            },
            "NetworkInterface": {
                // Descriptors 0 to 2 are stdio: refused by minivmm.
                "host_dev_fd": {"type": "integer", "minimum": 3},
                "queue_size": queue_size,
                "offloads": {
                    "type": "array",
                    "items": {"type": "string", "enum": ["csum", "tso4", "tso6", "tso", "ufo", "all", "none"]}
                },
                "mrg_rxbuf": {"type": "boolean"},
                "tx_weight_bytes": count,
                "tx_weight_packets": count,
                "rx_weight_bytes": count,
                "rx_weight_packets": count,
                "pass_time_budget_us": count,
                "io_engine": {"type": "string", "enum": ["Async", "Sync"]}
            },
            "Drive": {
                "queue_size": queue_size
            },
            "Metrics": {
                "interval_s": count
            }
        })
    })
}

/// Checks `body` against Firecracker's definition `definition` (see the
/// module doc for the rules); `Err` is the first violation with its path.
pub fn validate(definition: &str, body: &Value) -> Result<(), String> {
    Checker {
        defs: definitions(),
        extensions: None,
    }
    .check_definition(definition, body, "$")
}

/// [`validate`], also admitting minivmm's own keys ([`minivmm_extensions`])
/// and checking their values.
pub fn validate_minivmm(definition: &str, body: &Value) -> Result<(), String> {
    Checker {
        defs: definitions(),
        extensions: Some(minivmm_extensions()),
    }
    .check_definition(definition, body, "$")
}

/// One validation: the definitions `$ref` points into and the extra
/// properties admitted per definition.
struct Checker<'a> {
    defs: &'a Value,
    extensions: Option<&'a Value>,
}

fn type_name(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(n) if n.is_i64() || n.is_u64() => "integer",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

impl Checker<'_> {
    fn check_definition(&self, name: &str, v: &Value, at: &str) -> Result<(), String> {
        let schema = self
            .defs
            .get(name)
            .ok_or_else(|| format!("{at}: unknown definition '{name}'"))?;
        self.check(schema, Some(name), v, at)
    }

    /// `definition` names the schema when it is a definition's own, so its
    /// extensions apply to its properties.
    fn check(
        &self,
        schema: &Value,
        definition: Option<&str>,
        v: &Value,
        at: &str,
    ) -> Result<(), String> {
        // As in JSON Schema draft 4, keywords beside `$ref` are ignored
        // (Firecracker writes descriptions there).
        if let Some(r) = schema.get("$ref") {
            let name = r
                .as_str()
                .and_then(|r| r.strip_prefix("#/definitions/"))
                .ok_or_else(|| format!("{at}: unsupported $ref {r}"))?;
            return self.check_definition(name, v, at);
        }
        if let Some(t) = schema.get("type").and_then(Value::as_str) {
            let got = type_name(v);
            // Every integer is a number too.
            let fits = got == t || (t == "number" && got == "integer");
            if !fits {
                return Err(format!("{at}: expected {t}, got {got}"));
            }
        }
        if let Some(options) = schema.get("enum").and_then(Value::as_array) {
            if !options.contains(v) {
                return Err(format!(
                    "{at}: {v} is not one of {}",
                    Value::from(options.clone())
                ));
            }
        }
        if let Value::Number(n) = v {
            let x = n.as_f64().unwrap_or(f64::NAN);
            if let Some(min) = schema.get("minimum").and_then(Value::as_f64) {
                if x < min {
                    return Err(format!("{at}: {n} is below the minimum {min}"));
                }
            }
            if let Some(max) = schema.get("maximum").and_then(Value::as_f64) {
                if x > max {
                    return Err(format!("{at}: {n} is above the maximum {max}"));
                }
            }
        }
        match v {
            Value::Object(map) => self.check_object(schema, definition, map, at),
            Value::Array(items) => match schema.get("items") {
                Some(item) => items
                    .iter()
                    .enumerate()
                    .try_for_each(|(i, x)| self.check(item, None, x, &format!("{at}[{i}]"))),
                None => Ok(()),
            },
            _ => Ok(()),
        }
    }

    fn check_object(
        &self,
        schema: &Value,
        definition: Option<&str>,
        map: &Map<String, Value>,
        at: &str,
    ) -> Result<(), String> {
        let empty = Map::new();
        let props = schema
            .get("properties")
            .and_then(Value::as_object)
            .unwrap_or(&empty);
        let extra = match (self.extensions, definition) {
            (Some(ext), Some(d)) => ext.get(d).and_then(Value::as_object),
            _ => None,
        };
        let present = |k: &str| map.get(k).is_some_and(|v| !v.is_null());
        for req in schema
            .get("required")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            let req = req.as_str().unwrap_or_default();
            if !present(req) {
                return Err(format!("{at}: missing required property '{req}'"));
            }
        }
        let additional = schema.get("additionalProperties");
        let open = additional == Some(&Value::Bool(true));
        // A schema there (`properties` of `Metrics`: strings) checks every
        // property the object does not list.
        let each = additional.filter(|a| a.is_object());
        for (k, value) in map {
            if value.is_null() {
                continue;
            }
            let here = format!("{at}.{k}");
            match props.get(k).or_else(|| extra.and_then(|e| e.get(k))) {
                Some(s) => self.check(s, None, value, &here)?,
                None if open => {}
                None if each.is_some() => {
                    if let Some(schema) = each {
                        self.check(schema, None, value, &here)?;
                    }
                }
                None => {
                    let whose = definition.unwrap_or("this object");
                    return Err(format!("{here}: unknown property (not in {whose})"));
                }
            }
        }
        Ok(())
    }
}

/// Firecracker's `tests/framework/vm_config_network.json` (a root drive and
/// one network interface, every other section null), as that file has it:
/// what users start from, and what the tests that read or boot a
/// Firecracker configuration change the paths of.
pub fn firecracker_network_example() -> Value {
    json!({
        "boot-source": {
            "kernel_image_path": "vmlinux.bin",
            "boot_args": "console=ttyS0 reboot=k panic=1",
            "initrd_path": null
        },
        "drives": [{
            "drive_id": "rootfs",
            "path_on_host": "bionic.rootfs.ext4",
            "is_root_device": true,
            "partuuid": null,
            "is_read_only": false,
            "cache_type": "Unsafe",
            "io_engine": "Sync",
            "rate_limiter": null
        }],
        "machine-config": {
            "vcpu_count": 2,
            "mem_size_mib": 1024,
            "smt": false,
            "track_dirty_pages": false
        },
        "cpu-config": null,
        "balloon": null,
        "network-interfaces": [{
            "iface_id": "eth0",
            "host_dev_name": "tap0",
            "guest_mac": "06:00:c0:a8:00:02",
            "rx_rate_limiter": null,
            "tx_rate_limiter": null
        }],
        "vsock": null,
        "logger": null,
        "metrics": null,
        "mmds-config": null,
        "entropy": null
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Firecracker's network example with what a 1.17 `GET /vm/config`
    /// writes beside it (`socket`, `huge_pages`, `pmem`, `memory-hotplug`).
    fn firecracker_network_config() -> Value {
        let mut v = firecracker_network_example();
        v["drives"][0]["socket"] = Value::Null;
        v["machine-config"]["huge_pages"] = json!("None");
        v["pmem"] = json!([]);
        v["memory-hotplug"] = Value::Null;
        v
    }

    /// Asserts that `check` refuses every body of `cases` under its definition with a
    /// message starting with the violation the case wants.
    fn assert_refused(
        check: fn(&str, &Value) -> Result<(), String>,
        cases: impl IntoIterator<Item = (&'static str, Value, &'static str)>,
    ) {
        for (def, body, want) in cases {
            let got = check(def, &body).unwrap_err();
            assert!(
                got.starts_with(want),
                "{def}: {body}\ngot  '{got}'\nwant '{want}'"
            );
        }
    }

    #[test]
    fn valid_answers_pass() {
        let ok = [
            (
                "InstanceInfo",
                json!({"app_name": "minivmm", "id": "anonymous-instance", "state": "Not started", "vmm_version": "0.1.0"}),
            ),
            (
                "InstanceInfo",
                json!({"app_name": "a", "id": "i", "state": "Running", "vmm_version": "1"}),
            ),
            (
                "FirecrackerVersion",
                json!({"firecracker_version": "1.17.0"}),
            ),
            (
                "MachineConfiguration",
                json!({"vcpu_count": 1, "mem_size_mib": 128}),
            ),
            (
                "MachineConfiguration",
                json!({"vcpu_count": 32, "mem_size_mib": 1024, "smt": false, "track_dirty_pages": false, "huge_pages": "2M", "cpu_template": "None"}),
            ),
            (
                "Error",
                json!({"fault_message": "The requested operation is not supported."}),
            ),
            ("Error", json!({})),
            ("FullVmConfiguration", firecracker_network_config()),
            ("FullVmConfiguration", json!({})),
            (
                "NetworkInterface",
                json!({"iface_id": "eth0", "host_dev_name": "tap0", "mtu": 68,
                       "rx_rate_limiter": {"bandwidth": {"size": 0, "one_time_burst": 0, "refill_time": 0}, "ops": null},
                       "tx_rate_limiter": {"ops": {"size": 2000, "refill_time": 100}}}),
            ),
            (
                "FullVmConfiguration",
                json!({"vsock": {"guest_cid": 3, "uds_path": "v.sock"},
                       "cpu-config": {"cpuid_modifiers": [{"leaf": "0x1", "subleaf": "0", "flags": 0,
                           "modifiers": [{"register": "ecx", "bitmap": "0bxxxxxxxxxxxxxxxxxxxxxxxxxxxx0001"}]}]},
                       "mmds-config": {"network_interfaces": ["eth0"], "version": "V2"},
                       "memory-hotplug": {"total_size_mib": 1024, "slot_size_mib": 128, "block_size_mib": 2},
                       "pmem": [{"id": "p", "path_on_host": "p.img", "read_only": true}],
                       "balloon": {"amount_mib": 0, "deflate_on_oom": true}}),
            ),
        ];
        for (def, body) in ok {
            assert_eq!(validate(def, &body), Ok(()), "{def}: {body}");
            assert_eq!(validate_minivmm(def, &body), Ok(()), "{def}: {body}");
        }
    }

    #[test]
    fn each_kind_of_violation_is_caught_with_its_path() {
        let fc = firecracker_network_config;
        // The body with the value at `pointer` set (added if missing).
        let with = |pointer: &str, v: Value| {
            let mut body = fc();
            let (parent, key) = pointer.rsplit_once('/').unwrap();
            match body.pointer_mut(parent).unwrap() {
                Value::Array(a) => a[key.parse::<usize>().unwrap()] = v,
                other => {
                    other.as_object_mut().unwrap().insert(key.to_string(), v);
                }
            }
            body
        };
        let without = |section: &str, key: &str| {
            let mut body = fc();
            body[section].as_object_mut().unwrap().remove(key);
            body
        };
        let cases = [
            // Missing required, at the top and nested; a null is missing.
            (
                "MachineConfiguration",
                json!({"vcpu_count": 1}),
                "$: missing required property 'mem_size_mib'",
            ),
            (
                "MachineConfiguration",
                json!({"vcpu_count": 1, "mem_size_mib": null}),
                "$: missing required property 'mem_size_mib'",
            ),
            (
                "FullVmConfiguration",
                without("boot-source", "kernel_image_path"),
                "$.boot-source: missing required property 'kernel_image_path'",
            ),
            (
                "FullVmConfiguration",
                with("/network-interfaces/0/host_dev_name", Value::Null),
                "$.network-interfaces[0]: missing required property 'host_dev_name'",
            ),
            (
                "FullVmConfiguration",
                with("/network-interfaces/0/rx_rate_limiter", json!({"bandwidth": {"size": 1}})),
                "$.network-interfaces[0].rx_rate_limiter.bandwidth: missing required property 'refill_time'",
            ),
            // Wrong type: every JSON type once.
            (
                "MachineConfiguration",
                json!({"vcpu_count": "2", "mem_size_mib": 128}),
                "$.vcpu_count: expected integer, got string",
            ),
            (
                "MachineConfiguration",
                json!({"vcpu_count": 1.5, "mem_size_mib": 128}),
                "$.vcpu_count: expected integer, got number",
            ),
            (
                "MachineConfiguration",
                json!({"vcpu_count": 1, "mem_size_mib": 128, "smt": 0}),
                "$.smt: expected boolean, got integer",
            ),
            (
                "FullVmConfiguration",
                with("/network-interfaces/0/guest_mac", json!(6)),
                "$.network-interfaces[0].guest_mac: expected string, got integer",
            ),
            (
                "FullVmConfiguration",
                with("/drives", json!({})),
                "$.drives: expected array, got object",
            ),
            (
                "FullVmConfiguration",
                with("/boot-source", json!([])),
                "$.boot-source: expected object, got array",
            ),
            (
                "FullVmConfiguration",
                with("/drives", json!([null])),
                "$.drives[0]: expected object, got null",
            ),
            ("Error", Value::Null, "$: expected object, got null"),
            (
                "FullVmConfiguration",
                with("/drives/0/is_root_device", json!("true")),
                "$.drives[0].is_root_device: expected boolean, got string",
            ),
            // Bad enum values.
            (
                "InstanceInfo",
                json!({"app_name": "a", "id": "i", "state": "Stopped", "vmm_version": "1"}),
                "$.state: \"Stopped\" is not one of [\"Not started\",\"Running\",\"Paused\"]",
            ),
            (
                "FullVmConfiguration",
                with("/machine-config/huge_pages", json!("1G")),
                "$.machine-config.huge_pages: \"1G\" is not one of",
            ),
            (
                "FullVmConfiguration",
                with("/drives/0/cache_type", json!("unsafe")),
                "$.drives[0].cache_type: \"unsafe\" is not one of [\"Unsafe\",\"Writeback\"]",
            ),
            (
                "MachineConfiguration",
                json!({"vcpu_count": 1, "mem_size_mib": 128, "cpu_template": "T3"}),
                "$.cpu_template: \"T3\" is not one of",
            ),
            // Bounds.
            (
                "MachineConfiguration",
                json!({"vcpu_count": 0, "mem_size_mib": 128}),
                "$.vcpu_count: 0 is below the minimum 1",
            ),
            (
                "MachineConfiguration",
                json!({"vcpu_count": 33, "mem_size_mib": 128}),
                "$.vcpu_count: 33 is above the maximum 32",
            ),
            (
                "FullVmConfiguration",
                with("/network-interfaces/0/mtu", json!(67)),
                "$.network-interfaces[0].mtu: 67 is below the minimum 68",
            ),
            (
                "FullVmConfiguration",
                with("/vsock", json!({"guest_cid": 2, "uds_path": "v"})),
                "$.vsock.guest_cid: 2 is below the minimum 3",
            ),
            // Unknown properties, Firecracker's or minivmm's.
            (
                "MachineConfiguration",
                json!({"vcpu_count": 1, "mem_size_mib": 128, "colour": "red"}),
                "$.colour: unknown property (not in MachineConfiguration)",
            ),
            (
                "FullVmConfiguration",
                with("/serial", json!({})),
                "$.serial: unknown property (not in FullVmConfiguration)",
            ),
            (
                "FullVmConfiguration",
                with("/network-interfaces/0/queue_size", json!(256)),
                "$.network-interfaces[0].queue_size: unknown property (not in NetworkInterface)",
            ),
            // Unknown definition.
            ("Nope", json!({}), "$: unknown definition 'Nope'"),
        ];
        assert_refused(validate, cases);
    }

    #[test]
    fn a_null_property_is_absent_as_firecracker_tests_read_it() {
        let body = json!({"vcpu_count": 2, "mem_size_mib": 128, "smt": null, "bogus": null});
        assert_eq!(validate("MachineConfiguration", &body), Ok(()));
    }

    #[test]
    fn minivmm_keys_pass_only_where_listed_and_with_their_types() {
        let nic = |extra: Value| {
            let mut v = json!({"iface_id": "eth0", "host_dev_name": "tap0"});
            v.as_object_mut()
                .unwrap()
                .extend(extra.as_object().unwrap().clone());
            v
        };
        let all = nic(json!({
            "host_dev_fd": 3, "queue_size": 1024, "offloads": ["csum", "tso4"], "mrg_rxbuf": false,
            "tx_weight_bytes": 0, "tx_weight_packets": 1, "rx_weight_bytes": 2, "rx_weight_packets": 3,
            "pass_time_budget_us": 0, "io_engine": "Sync"
        }));
        assert_eq!(validate_minivmm("NetworkInterface", &all), Ok(()));
        assert!(validate("NetworkInterface", &all)
            .unwrap_err()
            .contains("unknown property (not in NetworkInterface)"));
        let ok = [
            (
                "BootSource",
                json!({"kernel_image_path": "k", "cmdline_extra": "quiet"}),
            ),
            (
                "MachineConfiguration",
                json!({"vcpu_count": 1, "mem_size_mib": 64, "host_quirks": "off"}),
            ),
            (
                "Drive",
                json!({"drive_id": "d", "is_root_device": false, "queue_size": 64}),
            ),
            ("Metrics", json!({"metrics_path": "m", "interval_s": 0})),
        ];
        for (def, body) in ok {
            assert_eq!(validate_minivmm(def, &body), Ok(()), "{def}: {body}");
            assert!(validate(def, &body).is_err(), "{def}: {body}");
        }
        let bad = [
            (
                "NetworkInterface",
                nic(json!({"host_dev_fd": 2})),
                "$.host_dev_fd: 2 is below the minimum 3",
            ),
            (
                "NetworkInterface",
                nic(json!({"queue_size": 65536})),
                "$.queue_size: 65536 is above the maximum 32768",
            ),
            (
                "NetworkInterface",
                nic(json!({"offloads": ["gro"]})),
                "$.offloads[0]: \"gro\" is not one of",
            ),
            (
                "NetworkInterface",
                nic(json!({"mrg_rxbuf": "on"})),
                "$.mrg_rxbuf: expected boolean, got string",
            ),
            (
                "NetworkInterface",
                nic(json!({"io_engine": "Uring"})),
                "$.io_engine: \"Uring\" is not one of",
            ),
            (
                "NetworkInterface",
                nic(json!({"colour": "red"})),
                "$.colour: unknown property",
            ),
            (
                "MachineConfiguration",
                json!({"vcpu_count": 1, "mem_size_mib": 64, "host_quirks": "maybe"}),
                "$.host_quirks: \"maybe\" is not one of",
            ),
            // A key of one definition is not admitted in another.
            (
                "BootSource",
                json!({"kernel_image_path": "k", "host_quirks": "on"}),
                "$.host_quirks: unknown property (not in BootSource)",
            ),
            // Extensions never relax `required`.
            (
                "NetworkInterface",
                json!({"iface_id": "eth0", "host_dev_fd": 3}),
                "$: missing required property 'host_dev_name'",
            ),
        ];
        assert_refused(validate_minivmm, bad);
    }

    #[test]
    fn the_checker_honours_open_objects_and_number_types() {
        // No definition of Firecracker's that minivmm answers with is open or
        // has a `number`; the checker handles both as JSON Schema says.
        let defs = json!({
            "Open": {"type": "object", "additionalProperties": true, "properties": {"a": {"type": "number"}}}
        });
        let c = Checker {
            defs: &defs,
            extensions: None,
        };
        assert_eq!(
            c.check_definition("Open", &json!({"a": 1, "b": "x"}), "$"),
            Ok(())
        );
        assert_eq!(c.check_definition("Open", &json!({"a": 1.5}), "$"), Ok(()));
        assert_eq!(
            c.check_definition("Open", &json!({"a": "1"}), "$"),
            Err("$.a: expected number, got string".into())
        );
        // Metrics' `properties`: any key, each a string.
        let props = &definitions()["Metrics"];
        let c = Checker {
            defs: definitions(),
            extensions: None,
        };
        let m = |p: Value| json!({"metrics_path": "m", "emit_id": true, "properties": p});
        assert!(props.is_object());
        assert_eq!(
            c.check_definition("Metrics", &m(json!({"az": "eu-1", "host": "h7"})), "$"),
            Ok(())
        );
        assert_eq!(
            c.check_definition("Metrics", &m(json!({"az": 1})), "$"),
            Err("$.properties.az: expected string, got integer".into())
        );
    }

    /// Every `$ref` (the definitions' and the extensions') names a definition,
    /// and every extension extends one of Firecracker's without shadowing
    /// a key it has.
    #[test]
    fn every_reference_resolves() {
        fn refs<'a>(v: &'a Value, out: &mut Vec<&'a str>) {
            match v {
                Value::Object(m) => {
                    if let Some(Value::String(r)) = m.get("$ref") {
                        out.push(r);
                    }
                    m.values().for_each(|x| refs(x, out));
                }
                Value::Array(a) => a.iter().for_each(|x| refs(x, out)),
                _ => {}
            }
        }
        let mut found = Vec::new();
        refs(definitions(), &mut found);
        refs(minivmm_extensions(), &mut found);
        assert!(found.len() > 20, "{found:?}");
        for r in found {
            let name = r.strip_prefix("#/definitions/").unwrap();
            assert!(definitions().get(name).is_some(), "{r}");
        }
        for (def, keys) in minivmm_extensions().as_object().unwrap() {
            let props = &definitions()[def]["properties"];
            assert!(props.is_object(), "{def}");
            for key in keys.as_object().unwrap().keys() {
                assert!(props.get(key).is_none(), "{def}.{key} is Firecracker's");
            }
        }
    }
}
