// SPDX-License-Identifier: Apache-2.0
//! Which of Firecracker's API paths a request names, and what it asks.
//!
//! [`route`] turns a parsed [`Request`] into an [`ApiRequest`] or a fault
//! message for a `400`. It checks what can be checked without the VMM's
//! state: the path and method, a body that is JSON where one is needed and
//! absent where none is, the id in the path against the id in the body
//! (Firecracker refuses `PUT /drives/a` with `"drive_id": "b"`), and the
//! two small bodies whose whole shape is fixed here (`/actions`, `/vm`).
//! The configuration bodies (`/boot-source`, `/machine-config`, `/drives`,
//! `/network-interfaces`, `/logger`, `/metrics`, `/entropy`, `/vsock`) are passed on as JSON and
//! decoded by the same code that reads them from a config file, so the
//! file and the API cannot disagree on a field. A body with a key given
//! twice is refused, at any depth, as Firecracker refuses it.
//!
//! The balloon's paths are routed here too ([`BalloonRequest`]), and answered
//! by `preboot` before boot and `balloon` after.
//!
//! `PUT /vsock` is taken with or without an id after it (`/vsock/vsock0`,
//! as clients that still send the deprecated `vsock_id` write it); a
//! `vsock_id` in the body must then be that id.
//!
//! `/mmds` (`PUT`, `PATCH`, `GET`) takes any JSON value as the store, as
//! Firecracker does; `/mmds/config` an object.
//!
//! Paths of features minivmm does not have (CPU templates, pmem, memory
//! hotplug) are refused with a message that names the feature, not as
//! unknown paths; every path of Firecracker's API description is known here,
//! whatever its depth (`/balloon/hinting/start`). The balloon's paths go to
//! [`route_balloon`], where the balloon device's requests are decoded.

use serde::Deserialize;
use serde_json::Value;

use super::http::{Method, Request};

/// An action of `PUT /actions`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
pub enum Action {
    /// Boots the configured VM.
    InstanceStart,
    /// Writes a metrics line now.
    FlushMetrics,
    /// Sends Ctrl-Alt-Del through the i8042.
    SendCtrlAltDel,
}

/// The state `PATCH /vm` asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
pub enum VmState {
    /// Stop the vCPUs.
    Paused,
    /// Run them again.
    Resumed,
}

/// What a request asks of the VMM.
#[derive(Debug, Clone, PartialEq)]
pub enum ApiRequest {
    /// `GET /`.
    GetInstanceInfo,
    /// `GET /version`.
    GetVersion,
    /// `GET /machine-config`.
    GetMachineConfig,
    /// `GET /vm/config`.
    GetVmConfig,
    /// `PUT /boot-source`.
    PutBootSource(Value),
    /// `PUT /machine-config`.
    PutMachineConfig(Value),
    /// `PATCH /machine-config`.
    PatchMachineConfig(Value),
    /// `PUT /drives/{id}`.
    PutDrive(String, Value),
    /// `PATCH /drives/{id}`.
    PatchDrive(String, Value),
    /// `PUT /network-interfaces/{id}`.
    PutNetworkInterface(String, Value),
    /// `PATCH /network-interfaces/{id}`.
    PatchNetworkInterface(String, Value),
    /// `PUT /logger`.
    PutLogger(Value),
    /// `PUT /metrics`.
    PutMetrics(Value),
    /// `PUT /entropy`.
    PutEntropy(Value),
    /// `PUT /serial`.
    PutSerial(Value),
    /// `PUT /vsock` or `PUT /vsock/{id}`.
    PutVsock(Value),
    /// `PUT /mmds`: the whole store.
    PutMmds(Value),
    /// `PATCH /mmds`: a merge patch of the store.
    PatchMmds(Value),
    /// `GET /mmds`.
    GetMmds,
    /// `PUT /mmds/config`.
    PutMmdsConfig(Value),
    /// `PUT /actions`.
    Action(Action),
    /// `PATCH /vm`.
    PatchVm(VmState),
    /// `PUT /snapshot/create`.
    CreateSnapshot(Value),
    /// `PUT /snapshot/load`.
    LoadSnapshot(Value),
    /// `PUT /balloon`.
    PutBalloon(Value),
    /// One of the balloon's other paths.
    Balloon(BalloonRequest),
}

/// Paths of Firecracker features minivmm does not have, with their names.
const UNSUPPORTED: &[(&str, &str)] = &[
    ("cpu-config", "CPU templates"),
    (
        "hotplug",
        "memory hotplug (it needs a virtio-mem device, which minivmm does not have)",
    ),
    (
        "pmem",
        "pmem (it needs a virtio-pmem device, which minivmm does not have)",
    ),
];

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ActionBody {
    action_type: Action,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct VmBody {
    state: VmState,
}

/// Routes one request; `Err` is the fault message of a `400`.
pub fn route(req: &Request) -> Result<ApiRequest, String> {
    let path = req.path.trim_end_matches('/');
    let mut parts = path.split('/').skip(1);
    let first = parts.next().unwrap_or("");
    if first == "balloon" {
        let rest: Vec<&str> = parts.collect();
        return route_balloon(req, &rest);
    }
    let second = parts.next();
    if parts.next().is_some() {
        return Err(unknown(req));
    }
    if let Some((_, name)) = UNSUPPORTED.iter().find(|(p, _)| *p == first) {
        return Err(format!("{name} is not supported by minivmm"));
    }
    let m = &req.method;
    let r = match (first, second, m) {
        ("", None, Method::Get) => ApiRequest::GetInstanceInfo,
        ("version", None, Method::Get) => ApiRequest::GetVersion,
        ("machine-config", None, Method::Get) => ApiRequest::GetMachineConfig,
        ("machine-config", None, Method::Put) => ApiRequest::PutMachineConfig(json(req)?),
        ("machine-config", None, Method::Patch) => ApiRequest::PatchMachineConfig(json(req)?),
        ("vm", Some("config"), Method::Get) => ApiRequest::GetVmConfig,
        ("boot-source", None, Method::Put) => ApiRequest::PutBootSource(json(req)?),
        ("drives", Some(id), Method::Put) => {
            ApiRequest::PutDrive(id.into(), with_id(req, id, "drive_id")?)
        }
        ("drives", Some(id), Method::Patch) => {
            ApiRequest::PatchDrive(id.into(), with_id(req, id, "drive_id")?)
        }
        ("network-interfaces", Some(id), Method::Put) => {
            ApiRequest::PutNetworkInterface(id.into(), with_id(req, id, "iface_id")?)
        }
        ("network-interfaces", Some(id), Method::Patch) => {
            ApiRequest::PatchNetworkInterface(id.into(), with_id(req, id, "iface_id")?)
        }
        ("logger", None, Method::Put) => ApiRequest::PutLogger(json(req)?),
        ("metrics", None, Method::Put) => ApiRequest::PutMetrics(json(req)?),
        ("entropy", None, Method::Put) => ApiRequest::PutEntropy(json(req)?),
        ("serial", None, Method::Put) => ApiRequest::PutSerial(json(req)?),
        ("vsock", None, Method::Put) => ApiRequest::PutVsock(json(req)?),
        ("vsock", Some(id), Method::Put) => ApiRequest::PutVsock(vsock_body(req, id)?),
        ("mmds", None, Method::Put) => ApiRequest::PutMmds(any_json(req)?),
        ("mmds", None, Method::Patch) => ApiRequest::PatchMmds(any_json(req)?),
        ("mmds", None, Method::Get) => ApiRequest::GetMmds,
        ("mmds", Some("config"), Method::Put) => ApiRequest::PutMmdsConfig(json(req)?),
        ("actions", None, Method::Put) => {
            let b: ActionBody = typed(req)?;
            ApiRequest::Action(b.action_type)
        }
        ("vm", None, Method::Patch) => {
            let b: VmBody = typed(req)?;
            ApiRequest::PatchVm(b.state)
        }
        ("snapshot", Some("create"), Method::Put) => ApiRequest::CreateSnapshot(json(req)?),
        ("snapshot", Some("load"), Method::Put) => ApiRequest::LoadSnapshot(json(req)?),
        (
            "" | "version" | "machine-config" | "boot-source" | "drives" | "network-interfaces"
            | "logger" | "metrics" | "entropy" | "serial" | "vsock" | "actions" | "vm" | "snapshot"
            | "mmds",
            _,
            _,
        ) if known_path(first, second) => {
            return Err(format!(
                "invalid request method {} for {}",
                method_name(m),
                req.path
            ))
        }
        _ => return Err(unknown(req)),
    };
    if matches!(m, Method::Get) && !req.body.is_empty() {
        return Err(format!("GET {} takes no body", req.path));
    }
    Ok(r)
}

/// The fault of a balloon request on a VM without a balloon.
pub const NO_BALLOON: &str = "no balloon device is configured (PUT /balloon before \
                              InstanceStart, or the config file's balloon section)";

/// A request on one of the balloon's paths but `PUT /balloon`.
#[derive(Debug, Clone, PartialEq)]
pub enum BalloonRequest {
    /// `GET /balloon`.
    Get,
    /// `PATCH /balloon`: the new target in MiB.
    Patch(u32),
    /// `GET /balloon/statistics`.
    GetStats,
    /// `PATCH /balloon/statistics`: the new interval in seconds.
    PatchStats(u16),
    /// `PATCH /balloon/hinting/start`: whether to acknowledge the guest's
    /// STOP at once.
    StartHinting(bool),
    /// `GET /balloon/hinting/status`.
    HintingStatus,
    /// `PATCH /balloon/hinting/stop`.
    StopHinting,
}

/// Firecracker's `BalloonUpdate`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Update {
    amount_mib: u32,
}

/// Firecracker's `BalloonStatsUpdate`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct StatsUpdate {
    stats_polling_interval_s: u16,
}

/// Firecracker's `BalloonStartCmd`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct StartCmd {
    #[serde(default = "acknowledge_by_default")]
    acknowledge_on_stop: bool,
}

fn acknowledge_by_default() -> bool {
    true
}

/// Routes `/balloon` and its sub-paths (`rest`, the segments after
/// `balloon`); `Err` is the fault message of a `400`. `PUT /balloon`, a
/// configuration body as the others, is `ApiRequest::PutBalloon`; the
/// others are answered by `preboot` and `balloon`.
fn route_balloon(req: &Request, rest: &[&str]) -> Result<ApiRequest, String> {
    use BalloonRequest as B;
    let m = &req.method;
    let r = match (rest, m) {
        ([], Method::Put) => return Ok(ApiRequest::PutBalloon(json(req)?)),
        ([], Method::Get) => B::Get,
        ([], Method::Patch) => B::Patch(typed::<Update>(req)?.amount_mib),
        (["statistics"], Method::Get) => B::GetStats,
        (["statistics"], Method::Patch) => {
            B::PatchStats(typed::<StatsUpdate>(req)?.stats_polling_interval_s)
        }
        (["hinting", "start"], Method::Patch) if req.body.is_empty() => B::StartHinting(true),
        (["hinting", "start"], Method::Patch) => {
            B::StartHinting(typed::<StartCmd>(req)?.acknowledge_on_stop)
        }
        (["hinting", "status"], Method::Get) => B::HintingStatus,
        // Firecracker reads no body here; its examples send `{}`.
        (["hinting", "stop"], Method::Patch) => B::StopHinting,
        ([] | ["statistics"] | ["hinting", "start" | "status" | "stop"], _) => {
            return Err(format!(
                "invalid request method {} for {}",
                method_name(m),
                req.path
            ))
        }
        _ => return Err(format!("invalid request: unknown path {}", req.path)),
    };
    if matches!(m, Method::Get) && !req.body.is_empty() {
        return Err(format!("GET {} takes no body", req.path));
    }
    Ok(ApiRequest::Balloon(r))
}

/// Whether `first`/`second` is one of the paths above with some method.
fn known_path(first: &str, second: Option<&str>) -> bool {
    match first {
        "" | "version" | "machine-config" | "boot-source" | "logger" | "metrics" | "entropy"
        | "serial" | "actions" => second.is_none(),
        "drives" | "network-interfaces" => second.is_some(),
        "vsock" => true,
        "vm" | "mmds" => matches!(second, None | Some("config")),
        "snapshot" => matches!(second, Some("create" | "load")),
        _ => false,
    }
}

pub(super) fn method_name(m: &Method) -> &str {
    match m {
        Method::Get => "GET",
        Method::Put => "PUT",
        Method::Patch => "PATCH",
        Method::Other(s) => s,
    }
}

fn unknown(req: &Request) -> String {
    format!("invalid request: unknown path {}", req.path)
}

/// A JSON object body.
pub(super) fn json(req: &Request) -> Result<Value, String> {
    let v = any_json(req)?;
    if !v.is_object() {
        return Err("the JSON body must be an object".into());
    }
    Ok(v)
}

/// A JSON body of any kind (the MMDS store may be any JSON value), keys
/// given twice refused as everywhere.
fn any_json(req: &Request) -> Result<Value, String> {
    if req.body.is_empty() {
        return Err(format!(
            "{} {} needs a JSON body",
            method_name(&req.method),
            req.path
        ));
    }
    crate::config::json::parse(&req.body).map_err(|e| format!("malformed JSON body: {e}"))
}

pub(super) fn typed<T: for<'de> Deserialize<'de>>(req: &Request) -> Result<T, String> {
    let v = json(req)?;
    serde_json::from_value(v).map_err(|e| format!("invalid body: {e}"))
}

/// The body of `PUT /vsock/{id}`: its `vsock_id`, deprecated and optional
/// (Firecracker reads the body alone), must be `id` when it is given.
fn vsock_body(req: &Request, id: &str) -> Result<Value, String> {
    let v = json(req)?;
    if v.get("vsock_id").is_none_or(Value::is_null) {
        return Ok(v);
    }
    with_id(req, id, "vsock_id")
}

/// The body, whose `field`, when present, must equal the id in the path.
fn with_id(req: &Request, id: &str, field: &str) -> Result<Value, String> {
    let v = json(req)?;
    match v.get(field) {
        None => Err(format!("the body needs {field}")),
        Some(Value::String(s)) if s == id => Ok(v),
        Some(Value::String(s)) => Err(format!(
            "the {field} in the body ({s}) differs from the one in the path ({id})"
        )),
        Some(_) => Err(format!("{field} must be a string")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(method: Method, path: &str, body: &str) -> Request {
        Request {
            method,
            path: path.into(),
            body: body.as_bytes().to_vec(),
            close: false,
        }
    }

    #[test]
    fn firectl_boot_sequence_routes() {
        use Method::*;
        let cases = [
            (
                req(
                    Put,
                    "/machine-config",
                    r#"{"vcpu_count":1,"mem_size_mib":128}"#,
                ),
                "PutMachineConfig",
            ),
            (
                req(Put, "/boot-source", r#"{"kernel_image_path":"k"}"#),
                "PutBootSource",
            ),
            (
                req(Put, "/drives/rootfs", r#"{"drive_id":"rootfs"}"#),
                "PutDrive",
            ),
            (
                req(Put, "/network-interfaces/eth0", r#"{"iface_id":"eth0"}"#),
                "PutNetworkInterface",
            ),
            (req(Put, "/logger", r#"{"log_path":"l"}"#), "PutLogger"),
            (
                req(Put, "/metrics", r#"{"metrics_path":"m"}"#),
                "PutMetrics",
            ),
            (
                req(Put, "/entropy", r#"{"rate_limiter":null}"#),
                "PutEntropy",
            ),
            (
                req(Put, "/vsock", r#"{"guest_cid":3,"uds_path":"v.sock"}"#),
                "PutVsock",
            ),
            (
                req(
                    Put,
                    "/vsock/vsock0",
                    r#"{"vsock_id":"vsock0","guest_cid":3,"uds_path":"v.sock"}"#,
                ),
                "PutVsock",
            ),
            (
                req(
                    Put,
                    "/vsock/vsock0",
                    r#"{"guest_cid":3,"uds_path":"v.sock"}"#,
                ),
                "PutVsock",
            ),
            (req(Get, "/machine-config", ""), "GetMachineConfig"),
            (req(Get, "/", ""), "GetInstanceInfo"),
            (req(Get, "/version", ""), "GetVersion"),
            (req(Get, "/vm/config", ""), "GetVmConfig"),
            (
                req(
                    Patch,
                    "/drives/rootfs",
                    r#"{"drive_id":"rootfs","path_on_host":"p"}"#,
                ),
                "PatchDrive",
            ),
            (
                req(Patch, "/network-interfaces/eth0", r#"{"iface_id":"eth0"}"#),
                "PatchNetworkInterface",
            ),
            (
                req(Patch, "/machine-config", r#"{"vcpu_count":2}"#),
                "PatchMachineConfig",
            ),
            (req(Get, "/mmds", ""), "GetMmds"),
            (
                req(Put, "/mmds/config", r#"{"network_interfaces":["eth0"]}"#),
                "PutMmdsConfig",
            ),
        ];
        for (r, want) in cases {
            let got =
                route(&r).unwrap_or_else(|e| panic!("{} {}: {e}", method_name(&r.method), r.path));
            assert!(
                format!("{got:?}").starts_with(want),
                "{got:?} is not {want}"
            );
        }
        assert_eq!(
            route(&req(Put, "/actions", r#"{"action_type":"InstanceStart"}"#)),
            Ok(ApiRequest::Action(Action::InstanceStart))
        );
        assert_eq!(
            route(&req(Put, "/actions", r#"{"action_type":"SendCtrlAltDel"}"#)),
            Ok(ApiRequest::Action(Action::SendCtrlAltDel))
        );
        assert_eq!(
            route(&req(Patch, "/vm", r#"{"state":"Paused"}"#)),
            Ok(ApiRequest::PatchVm(VmState::Paused))
        );
        // The store may be any JSON value, not only an object.
        assert_eq!(
            route(&req(Put, "/mmds", r#""text""#)),
            Ok(ApiRequest::PutMmds(serde_json::json!("text")))
        );
        assert_eq!(
            route(&req(Patch, "/mmds", r#"{"a":null}"#)),
            Ok(ApiRequest::PatchMmds(serde_json::json!({"a":null})))
        );
    }

    #[test]
    fn every_refusal_says_why() {
        use Method::*;
        let cases = [
            (req(Get, "/nope", ""), "invalid request: unknown path /nope"),
            (
                req(Get, "/drives/a/b", ""),
                "invalid request: unknown path /drives/a/b",
            ),
            (
                req(Get, "/drives/rootfs", ""),
                "invalid request method GET for /drives/rootfs",
            ),
            (
                req(Other("DELETE".into()), "/machine-config", ""),
                "invalid request method DELETE for /machine-config",
            ),
            (req(Put, "/", "{}"), "invalid request method PUT for /"),
            (
                req(Put, "/boot-source", ""),
                "PUT /boot-source needs a JSON body",
            ),
            (
                req(Put, "/boot-source", "[1]"),
                "the JSON body must be an object",
            ),
            (
                req(Put, "/drives/a", r#"{"drive_id":"b"}"#),
                "the drive_id in the body (b) differs from the one in the path (a)",
            ),
            (
                req(Put, "/drives/a", r#"{"path_on_host":"x"}"#),
                "the body needs drive_id",
            ),
            (
                req(Put, "/network-interfaces/a", r#"{"iface_id":1}"#),
                "iface_id must be a string",
            ),
            (req(Get, "/", "x"), "GET / takes no body"),
            (
                req(Put, "/vsock/a", r#"{"vsock_id":"b","guest_cid":3}"#),
                "the vsock_id in the body (b) differs from the one in the path (a)",
            ),
            (
                req(Get, "/vsock", ""),
                "invalid request method GET for /vsock",
            ),
            (req(Put, "/vsock", ""), "PUT /vsock needs a JSON body"),
            (req(Put, "/mmds", ""), "PUT /mmds needs a JSON body"),
            (
                req(Patch, "/mmds", "{"),
                "malformed JSON body: EOF while parsing an object at line 1 column 1",
            ),
            (
                req(Put, "/mmds/config", "[]"),
                "the JSON body must be an object",
            ),
            (
                req(Get, "/mmds/config", ""),
                "invalid request method GET for /mmds/config",
            ),
            (
                req(Get, "/mmds/x", ""),
                "invalid request: unknown path /mmds/x",
            ),
        ];
        for (r, want) in cases {
            assert_eq!(
                route(&r),
                Err(want.to_string()),
                "{} {}",
                method_name(&r.method),
                r.path
            );
        }
        for (path, feature) in [
            (
                "/pmem/pmem0",
                "pmem (it needs a virtio-pmem device, which minivmm does not have)",
            ),
            (
                "/hotplug/memory",
                "memory hotplug (it needs a virtio-mem device, which minivmm does not have)",
            ),
        ] {
            assert_eq!(
                route(&req(Put, path, "{}")),
                Err(format!("{feature} is not supported by minivmm")),
                "PUT {path}"
            );
        }
        assert_eq!(
            route(&req(Put, "/serial", r#"{"serial_out_path":"s"}"#)),
            Ok(ApiRequest::PutSerial(
                serde_json::json!({"serial_out_path": "s"})
            ))
        );
        assert_eq!(
            route(&req(Get, "/serial", "")),
            Err("invalid request method GET for /serial".to_string())
        );
        // The snapshot paths carry their body; anything else under
        // /snapshot is unknown, and only PUT is a method for them.
        assert_eq!(
            route(&req(Put, "/snapshot/create", r#"{"snapshot_path":"s"}"#)),
            Ok(ApiRequest::CreateSnapshot(
                serde_json::json!({"snapshot_path": "s"})
            ))
        );
        assert!(matches!(
            route(&req(Put, "/snapshot/load", "{}")),
            Ok(ApiRequest::LoadSnapshot(_))
        ));
        assert_eq!(
            route(&req(Get, "/snapshot/load", "")),
            Err("invalid request method GET for /snapshot/load".to_string())
        );
        assert_eq!(
            route(&req(Put, "/snapshot/other", "{}")),
            Err("invalid request: unknown path /snapshot/other".to_string())
        );
        for (body, starts) in [
            ("{", "malformed JSON body"),
            (
                r#"{"action_type":"FlushMetrics","action_type":"InstanceStart"}"#,
                "malformed JSON body: duplicate field `action_type` at line 1 column",
            ),
            (
                r#"{"action_type":"Reboot"}"#,
                "invalid body: unknown variant `Reboot`",
            ),
            (
                r#"{"action_type":"FlushMetrics","x":1}"#,
                "invalid body: unknown field `x`",
            ),
        ] {
            let e = route(&req(Put, "/actions", body)).unwrap_err();
            assert!(e.starts_with(starts), "{e}");
        }
        let e = route(&req(Patch, "/vm", r#"{"state":"Running"}"#)).unwrap_err();
        assert!(
            e.starts_with("invalid body: unknown variant `Running`"),
            "{e}"
        );
    }
}
