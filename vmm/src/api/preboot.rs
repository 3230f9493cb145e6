// SPDX-License-Identifier: Apache-2.0
//! The API before `InstanceStart`: requests build up a configuration in
//! the config-file layout, and `InstanceStart` hands it to the builder.
//!
//! Each accepted `PUT` replaces one section (`/boot-source`,
//! `/machine-config`, `/logger`, `/metrics`, `/entropy`, `/balloon`) or one entry of a list
//! (`/network-interfaces/{id}`, `/drives/{id}`, by id, in the order first
//! put) of a document that is exactly what `--config-file` reads. So the
//! API and the file share one parser and cannot disagree on a field, and
//! `GET /vm/config` before boot returns a file that boots the same VM.
//!
//! A request is checked against the whole document as it would be after
//! it: its shape by the file parser, and the values by the same
//! validation the command line gets (MACs, limiters, a drive's image that
//! does not exist, two root drives, two cards on one TAP). A refused
//! request leaves the document as it was. Only the kernel is left for
//! `InstanceStart` to check, since it may be put last.
//!
//! `PUT /vsock` (`/vsock/{id}`) does more than check: it binds the
//! device's socket at `uds_path` at once, as Firecracker does, since its
//! clients wait for the file before they go on ([`crate::host_socket`]).
//! Put again at another path, the new socket is bound first and the old
//! one then removed; at the same path the socket stays. The deprecated
//! `vsock_id` is not kept (Firecracker's `GET /vm/config` leaves it out).

use std::path::{Path, PathBuf};

use serde::Deserialize;
use serde_json::{json, Map, Value};

use devices::mmds::SharedMmds;

use super::http::Response;
use super::mmds;
use super::routes::{Action, ApiRequest, BalloonRequest, NO_BALLOON};
use crate::config::balloon::{render, BalloonSpec};
use crate::config::file;
use crate::config::settings::Settings;
use crate::config::{VmmConfig, DEFAULT_MEM_MIB};
use crate::host_socket::VsockSocket;
use crate::images::check_images;
use crate::process::seccomp::SeccompMode;
use crate::snapshot::load::{LoadParams, OWN_SECTIONS};
use std::sync::Arc;

/// `app_name` in `GET /`.
pub const APP_NAME: &str = "minivmm";
/// minivmm's own version: `vmm_version` in `GET /`, and the build
/// metadata of `firecracker_version` in `GET /version`.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");
/// The Firecracker release whose API description minivmm implements.
pub const FIRECRACKER_API: &str = "1.17.0";

/// `firecracker_version` in `GET /version`: the Firecracker API version
/// minivmm implements, with minivmm's own version as SemVer build metadata
/// (`1.17.0+minivmm.0.1.0`). A client comparing versions sees 1.17.0
/// (build metadata has no precedence), a person sees both, and the body
/// keeps Firecracker's one-field shape.
pub fn firecracker_version() -> String {
    format!("{FIRECRACKER_API}+minivmm.{VERSION}")
}

/// Sections of Firecracker's full configuration that are `null` unless
/// put (`entropy`) or that minivmm has not (the rest): `GET /vm/config`
/// shows them as `null`, as Firecracker shows an unset one.
const ABSENT_SECTIONS: &[&str] = &["balloon", "vsock", "mmds-config", "entropy", "cpu-config"];

/// `GET /`: Firecracker's `InstanceInfo`.
pub fn instance_info(id: &str, state: &str) -> Response {
    Response::json(
        json!({
            "app_name": APP_NAME,
            "id": id,
            "state": state,
            "vmm_version": VERSION,
        })
        .to_string(),
    )
}

/// `GET /version`: Firecracker's `FirecrackerVersion`.
pub fn version() -> Response {
    Response::json(json!({ "firecracker_version": firecracker_version() }).to_string())
}

/// A fault for a request that only makes sense once the VM runs.
pub fn only_after_start(what: &str) -> Response {
    Response::fault(&format!(
        "{what} is not allowed before the microVM is started (PUT /actions InstanceStart)"
    ))
}

/// What the pre-boot API does with one request.
#[derive(Debug)]
pub enum Step {
    /// Answer it; nothing else happens.
    Reply(Response),
    /// Boot with these settings, then answer (`204`, or `400` if the build
    /// fails, after which the document is still here to be corrected).
    Start(Box<Settings>),
    /// Load this snapshot, then answer as for `Start`.
    Load(Box<SnapshotLoad>),
}

/// A `PUT /snapshot/load` the pre-boot API accepted.
#[derive(Debug)]
pub struct SnapshotLoad {
    /// The checked body.
    pub params: LoadParams,
    /// The sections put before it that stay this process's (`logger`,
    /// `metrics`, `serial`: [`crate::snapshot::load::OWN_SECTIONS`]).
    pub own: Map<String, Value>,
    /// The process's MMDS store (`--metadata`, and what `PUT` and `PATCH
    /// /mmds` put before the load): the one the restored VM serves, as
    /// Firecracker's does (a snapshot holds no store).
    pub mmds: SharedMmds,
}

/// The configuration the pre-boot requests have built so far.
#[derive(Debug, Default)]
pub struct Preboot {
    doc: Map<String, Value>,
    /// `--metrics-path` (or `--metrics`) set the metrics up already.
    metrics_by_flag: bool,
    /// The vsock socket `PUT /vsock` bound.
    vsock: Option<Arc<VsockSocket>>,
    /// The filter of the process that removes that socket.
    seccomp: SeccompMode,
    /// The MMDS store (`PUT`, `PATCH`, `GET /mmds`), the process's.
    mmds: SharedMmds,
}

/// An error line of the file parser as an API fault: the API has no file,
/// so the "config file: " every file error starts with goes.
fn fault(e: &dyn std::error::Error) -> Response {
    let line = crate::error_line(e);
    Response::fault(line.strip_prefix("config file: ").unwrap_or(&line))
}

/// Why the boot file `path` (`what`: kernel or initrd) will not do, if it
/// will not: it cannot be opened, or it is not a regular file (it is
/// opened without waiting, so a FIFO holds nothing up).
fn boot_file_fault(what: &str, path: &Path) -> Option<Response> {
    let shown = crate::one_line(path.display().to_string());
    let msg = match crate::kernel::open_regular(path) {
        Ok(Some(_)) => return None,
        Ok(None) => format!("boot-source: {what} '{shown}' is not a regular file"),
        Err(e) => format!("boot-source: cannot open {what} '{shown}': {e}"),
    };
    Some(Response::fault(&msg))
}

/// The pre-boot document's `balloon` section (`configured`) in
/// Firecracker's layout, its defaults filled in; none without a balloon.
fn balloon_config(configured: Option<&Value>) -> Option<Value> {
    let spec = BalloonSpec::deserialize(configured?).ok()?;
    Some(render(&spec.config()))
}

/// What the pre-boot API answers; `configured` is the `balloon` section
/// of its document.
fn balloon(req: BalloonRequest, configured: Option<&Value>) -> Response {
    match req {
        BalloonRequest::Get => match balloon_config(configured) {
            Some(b) => Response::json(b.to_string()),
            None => Response::fault(NO_BALLOON),
        },
        BalloonRequest::Patch(_) => only_after_start("PATCH /balloon"),
        BalloonRequest::GetStats => only_after_start("GET /balloon/statistics"),
        BalloonRequest::PatchStats(_) => only_after_start("PATCH /balloon/statistics"),
        BalloonRequest::StartHinting(_) => only_after_start("PATCH /balloon/hinting/start"),
        BalloonRequest::HintingStatus => only_after_start("GET /balloon/hinting/status"),
        BalloonRequest::StopHinting => only_after_start("PATCH /balloon/hinting/stop"),
    }
}

impl Preboot {
    /// An empty configuration.
    pub fn new() -> Self {
        Self::default()
    }

    /// This configuration beside what the command line says, `flags`
    /// (which win over the API's): metrics a flag set up cannot be put again.
    pub fn with_flags(mut self, flags: &Settings) -> Self {
        self.metrics_by_flag = flags.metrics_path.is_some();
        self
    }

    /// An empty configuration whose vsock socket's remover runs under a
    /// filter for `mode` (`--seccomp`).
    pub fn with_seccomp(mode: SeccompMode) -> Self {
        Preboot {
            seccomp: mode,
            ..Self::default()
        }
    }

    /// The same configuration serving `PUT`, `PATCH` and `GET /mmds` on
    /// `mmds` (the process's store).
    pub fn with_mmds(self, mmds: SharedMmds) -> Self {
        Preboot { mmds, ..self }
    }

    /// `PUT /metrics`: once, as Firecracker initializes its metrics once
    /// (by `--metrics-path` or by this request).
    fn put_metrics(&mut self, v: Value) -> Response {
        if self.metrics_by_flag {
            return Response::fault(
                "the metrics were set up by --metrics-path already; they are set up once",
            );
        }
        if self.doc.get("metrics").is_some_and(|m| !m.is_null()) {
            return Response::fault(
                "the metrics were set up by an earlier PUT /metrics; they are set up once",
            );
        }
        self.put("metrics", v)
    }

    /// The socket `PUT /vsock` bound, for the builder.
    pub fn vsock_socket(&self) -> Option<Arc<VsockSocket>> {
        self.vsock.clone()
    }

    /// Handles one request; `id` is the instance id for `GET /`.
    pub fn handle(&mut self, req: ApiRequest, id: &str) -> Step {
        let r = match req {
            ApiRequest::GetInstanceInfo => instance_info(id, "Not started"),
            ApiRequest::GetVersion => version(),
            ApiRequest::GetMachineConfig => Response::json(self.machine_config().to_string()),
            ApiRequest::GetVmConfig => Response::json(self.vm_config().to_string()),
            ApiRequest::PutBootSource(v) => self.put("boot-source", v),
            ApiRequest::PutMachineConfig(v) => self.put("machine-config", v),
            ApiRequest::PatchMachineConfig(v) => self.patch_machine_config(v),
            ApiRequest::PutNetworkInterface(id, v) => {
                self.put_entry("network-interfaces", "iface_id", &id, v)
            }
            ApiRequest::PutDrive(id, v) => self.put_entry("drives", "drive_id", &id, v),
            ApiRequest::PutLogger(v) => self.put("logger", v),
            ApiRequest::PutMetrics(v) => self.put_metrics(v),
            ApiRequest::PutEntropy(v) => self.put("entropy", v),
            ApiRequest::PutSerial(v) => self.put("serial", v),
            ApiRequest::PutVsock(v) => self.put_vsock(v),
            ApiRequest::PutMmdsConfig(v) => self.put("mmds-config", v),
            ApiRequest::PutMmds(v) => mmds::put(&self.mmds, v),
            ApiRequest::PatchMmds(v) => mmds::patch(&self.mmds, &v),
            ApiRequest::GetMmds => mmds::get(&self.mmds),
            ApiRequest::Action(Action::InstanceStart) => match self.settings() {
                Ok(s) => return Step::Start(Box::new(s)),
                Err(r) => r,
            },
            ApiRequest::Action(a) => only_after_start(&format!("{a:?}")),
            ApiRequest::PatchVm(_) => only_after_start("PATCH /vm"),
            ApiRequest::PatchNetworkInterface(..) => only_after_start("PATCH /network-interfaces"),
            ApiRequest::PatchDrive(..) => only_after_start("PATCH /drives"),
            ApiRequest::CreateSnapshot(_) => only_after_start("PUT /snapshot/create"),
            ApiRequest::LoadSnapshot(v) => return self.load(v),
            ApiRequest::PutBalloon(v) => self.put("balloon", v),
            ApiRequest::Balloon(b) => balloon(b, self.doc.get("balloon")),
        };
        Step::Reply(r)
    }

    /// `PUT /snapshot/load`: only in a process nothing but its logger,
    /// metrics and console were configured in (as Firecracker: the snapshot
    /// brings the rest of the VM's configuration).
    fn load(&self, body: Value) -> Step {
        if let Some(section) = self
            .doc
            .keys()
            .find(|k| !OWN_SECTIONS.contains(&k.as_str()))
        {
            return Step::Reply(Response::fault(&format!(
                "snapshot/load: not allowed after the microVM was configured ({section} was \
                 put); a snapshot brings its whole configuration"
            )));
        }
        match LoadParams::from_body(body) {
            Ok(params) => Step::Load(Box::new(SnapshotLoad {
                params,
                own: self.doc.clone(),
                mmds: self.mmds.clone(),
            })),
            Err(msg) => Step::Reply(Response::fault(&msg)),
        }
    }

    /// The settings the document says, for `InstanceStart`.
    pub fn settings(&self) -> Result<Settings, Response> {
        file::parse(&Value::Object(self.doc.clone()).to_string()).map_err(|e| fault(&e))
    }

    /// `GET /machine-config`: Firecracker's defaults (minivmm's memory
    /// default) under what was put.
    fn machine_config(&self) -> Value {
        let mut m = json!({
            "vcpu_count": 1,
            "mem_size_mib": DEFAULT_MEM_MIB,
            "smt": false,
            "track_dirty_pages": false,
            "huge_pages": "None",
        });
        if let (Some(Value::Object(put)), Value::Object(out)) =
            (self.doc.get("machine-config"), &mut m)
        {
            for (k, v) in put {
                out.insert(k.clone(), v.clone());
            }
        }
        m
    }

    /// `GET /vm/config` before boot: the document, with the sections not
    /// put in their empty form.
    fn vm_config(&self) -> Value {
        let mut doc = self.doc.clone();
        // Firecracker's full configuration has no place for the console
        // output (its `PUT /serial` is not part of it either).
        doc.remove("serial");
        doc.insert("machine-config".into(), self.machine_config());
        for list in ["drives", "network-interfaces"] {
            doc.entry(list).or_insert_with(|| json!([]));
        }
        for absent in ABSENT_SECTIONS {
            doc.entry(*absent).or_insert(Value::Null);
        }
        // The balloon with Firecracker's defaults filled in, as its GET
        // /balloon shows it.
        if let Some(b) = balloon_config(doc.get("balloon")) {
            doc.insert("balloon".into(), b);
        }
        Value::Object(doc)
    }

    /// Accepts `candidate` as the new document if it checks out.
    fn commit(&mut self, candidate: Map<String, Value>) -> Response {
        match check(&candidate) {
            Ok(_) => {
                self.doc = candidate;
                Response::no_content()
            }
            Err(r) => r,
        }
    }

    /// `PUT /vsock`: the section checked, then its socket bound (see the
    /// module doc).
    fn put_vsock(&mut self, mut v: Value) -> Response {
        if let Value::Object(m) = &mut v {
            m.remove("vsock_id");
        }
        let mut candidate = self.doc.clone();
        candidate.insert("vsock".into(), v);
        let cfg = match check(&candidate) {
            Ok(cfg) => cfg,
            Err(r) => return r,
        };
        let Some(path) = cfg.vsock.map(|v| v.uds_path) else {
            // `null`: no device, and no socket.
            if let Some(old) = self.vsock.take().and_then(|s| Arc::try_unwrap(s).ok()) {
                old.remove_now();
            }
            self.doc = candidate;
            return Response::no_content();
        };
        if self.vsock.as_ref().is_none_or(|s| s.path() != path) {
            let new = match VsockSocket::bind(&path, self.seccomp) {
                Ok(s) => Arc::new(s),
                Err(e) => return fault(&e),
            };
            if let Some(old) = self
                .vsock
                .replace(new)
                .and_then(|s| Arc::try_unwrap(s).ok())
            {
                old.remove_now();
            }
        }
        self.doc = candidate;
        Response::no_content()
    }
}

/// What `candidate` would make, checked as the command line's values are;
/// the kernel alone may still be missing (a placeholder stands in, checked
/// at start). The boot files must exist now, as Firecracker checks them
/// at PUT.
fn check(candidate: &Map<String, Value>) -> Result<VmmConfig, Response> {
    let mut settings =
        file::parse(&Value::Object(candidate.clone()).to_string()).map_err(|e| fault(&e))?;
    let boot_files = [
        ("kernel", &settings.kernel),
        ("initrd", &settings.initramfs),
    ];
    for (what, path) in boot_files {
        if let Some(fault) = path.as_deref().and_then(|p| boot_file_fault(what, p)) {
            return Err(fault);
        }
    }
    if settings.kernel.is_none() {
        settings.kernel = Some(PathBuf::from("/"));
    }
    let cfg = settings.finish().map_err(|e| fault(&e))?;
    check_images(&cfg.drives).map_err(|e| fault(&e))?;
    Ok(cfg)
}

impl Preboot {
    fn put(&mut self, section: &str, v: Value) -> Response {
        let mut candidate = self.doc.clone();
        candidate.insert(section.into(), v);
        self.commit(candidate)
    }

    fn patch_machine_config(&mut self, patch: Value) -> Response {
        let Value::Object(patch) = patch else {
            return Response::fault("the machine-config body must be a JSON object");
        };
        let mut m = self.machine_config();
        if let Value::Object(out) = &mut m {
            out.extend(patch);
        }
        self.put("machine-config", m)
    }

    /// Replaces the entry of `list` whose `key` is `id`, or appends one.
    fn put_entry(&mut self, list: &str, key: &str, id: &str, v: Value) -> Response {
        let mut candidate = self.doc.clone();
        let entries = candidate.entry(list).or_insert_with(|| json!([]));
        if let Value::Array(items) = entries {
            match items
                .iter_mut()
                .find(|e| e.get(key).and_then(Value::as_str) == Some(id))
            {
                Some(existing) => *existing = v,
                None => items.push(v),
            }
        }
        self.commit(candidate)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    fn reply(p: &mut Preboot, req: ApiRequest) -> Response {
        match p.handle(req, "vm0") {
            Step::Reply(r) => r,
            Step::Start(_) => panic!("started"),
            Step::Load(_) => panic!("loading"),
        }
    }

    #[test]
    fn a_snapshot_loads_only_into_a_process_with_nothing_but_its_log_configured() {
        let load = || {
            ApiRequest::LoadSnapshot(json!({"snapshot_path": "/s",
                "mem_backend": {"backend_type": "File", "backend_path": "/m"}, "resume_vm": true}))
        };
        let store: devices::mmds::SharedMmds = Default::default();
        let mut p = Preboot::new().with_mmds(store.clone());
        assert_eq!(
            reply(&mut p, ApiRequest::PutLogger(json!({"level": "Info"}))).status,
            204
        );
        // The store is the process's, not the configuration's: filled
        // before the load, it is the one the restored VM serves.
        let data = json!({"clone": 2});
        assert_eq!(reply(&mut p, ApiRequest::PutMmds(data.clone())).status, 204);
        // So is the console, as in Firecracker.
        let serial = json!({"rate_limiter": {"size": 100, "refill_time": 1000}});
        assert_eq!(
            reply(&mut p, ApiRequest::PutSerial(serial.clone())).status,
            204
        );
        match p.handle(load(), "vm0") {
            Step::Load(l) => {
                assert_eq!(l.params.snapshot_path, PathBuf::from("/s"));
                assert!(l.params.resume_vm);
                assert_eq!(l.own.get("logger"), Some(&json!({"level": "Info"})));
                assert_eq!(l.own.get("metrics"), None);
                assert_eq!(l.own.get("serial"), Some(&serial));
                assert!(Arc::ptr_eq(&l.mmds, &store));
                assert_eq!(devices::mmds::lock(&l.mmds).data(), data);
            }
            other => panic!("{other:?}"),
        }
        let e = fault_of(&reply(
            &mut p,
            ApiRequest::CreateSnapshot(json!({"snapshot_path": "/s", "mem_file_path": "/m"})),
        ));
        assert!(
            e.contains("not allowed before the microVM is started"),
            "{e}"
        );
        assert_eq!(
            reply(
                &mut p,
                ApiRequest::PutMachineConfig(json!({"vcpu_count": 1, "mem_size_mib": 64}))
            )
            .status,
            204
        );
        match p.handle(load(), "vm0") {
            Step::Reply(r) => {
                let e = fault_of(&r);
                assert!(e.contains("(machine-config was put)"), "{e}");
            }
            other => panic!("{other:?}"),
        }
    }

    fn body(r: &Response) -> Value {
        serde_json::from_str(r.body.as_deref().expect("a body")).expect("JSON")
    }

    fn fault_of(r: &Response) -> String {
        assert_eq!(r.status, 400, "{r:?}");
        body(r)["fault_message"]
            .as_str()
            .expect("message")
            .to_string()
    }

    #[test]
    fn instance_info_and_version_before_boot() {
        let mut p = Preboot::new();
        let r = reply(&mut p, ApiRequest::GetInstanceInfo);
        assert_eq!(r.status, 200);
        assert_eq!(
            body(&r),
            json!({"app_name": "minivmm", "id": "vm0", "state": "Not started",
                   "vmm_version": VERSION})
        );
        let r = reply(&mut p, ApiRequest::GetVersion);
        assert_eq!(
            body(&r),
            json!({"firecracker_version": format!("1.17.0+minivmm.{}", env!("CARGO_PKG_VERSION"))})
        );
    }

    #[test]
    fn put_entropy_adds_the_device_and_a_bad_one_changes_nothing() {
        let mut p = Preboot::new();
        let before = body(&reply(&mut p, ApiRequest::GetVmConfig));
        assert_eq!(before["entropy"], Value::Null);
        let limited = json!({"rate_limiter": {"bandwidth": {"size": 1000, "refill_time": 100}}});
        for bad in [
            json!({"rate_limiter": {"bandwidth": {"size": 1000}}}),
            json!({"rate_limiter": {"ops": {"size": 0, "refill_time": 100}}}),
            json!({"source": "/dev/random"}),
            json!([]),
        ] {
            let e = fault_of(&reply(&mut p, ApiRequest::PutEntropy(bad.clone())));
            assert!(e.contains("entropy"), "{bad}: {e}");
            assert_eq!(body(&reply(&mut p, ApiRequest::GetVmConfig)), before);
        }
        assert_eq!(
            reply(&mut p, ApiRequest::PutEntropy(limited.clone())).status,
            204
        );
        assert_eq!(
            body(&reply(&mut p, ApiRequest::GetVmConfig))["entropy"],
            limited
        );
        // InstanceStart builds it: the settings carry the device.
        let mut settings = p.settings().unwrap();
        settings.kernel = Some("/vmlinux".into());
        let cfg = settings.finish().unwrap();
        let rl = cfg.entropy.map(|e| e.rate_limiter.bandwidth);
        assert_eq!(
            rl.flatten().map(|b| (b.size, b.refill_time)),
            Some((1000, 100))
        );
        // Put again, it replaces the section: no limiter now.
        let plain = json!({});
        assert_eq!(reply(&mut p, ApiRequest::PutEntropy(plain)).status, 204);
        let mut settings = p.settings().unwrap();
        settings.kernel = Some("/vmlinux".into());
        let cfg = settings.finish().unwrap();
        assert!(cfg.entropy.is_some_and(|e| e.rate_limiter.is_unlimited()));
    }

    #[test]
    fn metrics_are_put_once_and_not_over_a_flag() {
        let m =
            json!({"metrics_path": "/tmp/m.json", "emit_id": true, "properties": {"az": "eu-1"}});
        let mut p = Preboot::new();
        assert_eq!(reply(&mut p, ApiRequest::PutMetrics(m.clone())).status, 204);
        let e = fault_of(&reply(&mut p, ApiRequest::PutMetrics(m.clone())));
        assert!(e.contains("an earlier PUT /metrics"), "{e}");
        let mut settings = p.settings().unwrap();
        settings.kernel = Some("/vmlinux".into());
        let cfg = settings.finish().unwrap().metrics.unwrap();
        assert!(cfg.emit_id);
        assert_eq!(cfg.properties["az"], "eu-1");
        let flags = Settings {
            metrics_path: Some("/tmp/flag.json".into()),
            ..Settings::default()
        };
        let mut p = Preboot::new().with_flags(&flags);
        let e = fault_of(&reply(&mut p, ApiRequest::PutMetrics(m)));
        assert!(e.contains("--metrics-path"), "{e}");
        // The logger may be put again (Firecracker updates it).
        let l = json!({"level": "Info", "show_level": false});
        assert_eq!(reply(&mut p, ApiRequest::PutLogger(l.clone())).status, 204);
        assert_eq!(reply(&mut p, ApiRequest::PutLogger(l)).status, 204);
    }

    #[test]
    fn serial_smt_and_huge_pages_reach_the_configuration() {
        let mut p = Preboot::new();
        let serial = json!({"serial_out_path": "/tmp/console.out",
                            "rate_limiter": {"size": 4096, "refill_time": 100}});
        assert_eq!(reply(&mut p, ApiRequest::PutSerial(serial)).status, 204);
        let e = fault_of(&reply(
            &mut p,
            ApiRequest::PutSerial(json!({"serial_out_path": 1})),
        ));
        assert!(e.contains("serial"), "{e}");
        let e = fault_of(&reply(
            &mut p,
            ApiRequest::PutSerial(json!({"rate_limiter": {"size": 0, "refill_time": 100}})),
        ));
        assert!(e.starts_with("serial rate_limiter"), "{e}");
        let mc = json!({"vcpu_count": 2, "mem_size_mib": 256, "smt": true, "huge_pages": "2M"});
        assert_eq!(reply(&mut p, ApiRequest::PutMachineConfig(mc)).status, 204);
        for (bad, why) in [
            (
                json!({"vcpu_count": 3, "mem_size_mib": 256, "smt": true}),
                "1 or even",
            ),
            (
                json!({"vcpu_count": 1, "mem_size_mib": 255, "huge_pages": "2M"}),
                "multiple of 2 MiB",
            ),
            (
                json!({"vcpu_count": 1, "mem_size_mib": 256, "huge_pages": "1G"}),
                "'1G' is none of",
            ),
        ] {
            let e = fault_of(&reply(&mut p, ApiRequest::PutMachineConfig(bad)));
            assert!(e.contains(why), "{e}");
        }
        let m = body(&reply(&mut p, ApiRequest::GetMachineConfig));
        assert_eq!(
            (m["smt"].as_bool(), m["huge_pages"].as_str()),
            (Some(true), Some("2M"))
        );
        let mut settings = p.settings().unwrap();
        settings.kernel = Some("/vmlinux".into());
        let cfg = settings.finish().unwrap();
        assert!(cfg.smt);
        assert_eq!(cfg.huge_pages, crate::config::HugePages::Hugetlbfs2M);
        assert_eq!(
            cfg.serial.out_path.as_deref(),
            Some(std::path::Path::new("/tmp/console.out"))
        );
        assert_eq!(cfg.serial.rate_limiter.map(|b| b.size), Some(4096));
    }

    #[test]
    fn put_vsock_binds_the_socket_at_once_and_a_bad_one_changes_nothing() {
        let dir =
            std::env::temp_dir().join(format!("minivmm-preboot-vsock-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let (a, b) = (dir.join("a.sock"), dir.join("b.sock"));
        let taken = dir.join("taken");
        std::fs::write(&taken, b"").unwrap();
        let mut p = Preboot::new();
        let vsock = |cid: u64, path: &Path| json!({"guest_cid": cid, "uds_path": path});
        let before = body(&reply(&mut p, ApiRequest::GetVmConfig));
        for (bad, want) in [
            (vsock(2, &a), "vsock: guest_cid 2 is reserved"),
            (vsock(3, &taken), "exists"),
            (json!({"guest_cid": 3}), "missing field `uds_path`"),
            (
                json!({"guest_cid": 3, "uds_path": a, "x": 1}),
                "unknown field `x`",
            ),
        ] {
            let e = fault_of(&reply(&mut p, ApiRequest::PutVsock(bad.clone())));
            assert!(e.contains(want), "{bad}: {e}");
            assert!(!a.exists(), "{bad}: bound anyway");
            assert_eq!(body(&reply(&mut p, ApiRequest::GetVmConfig)), before);
        }
        // Firecracker's clients wait for the socket after the PUT.
        let put = json!({"vsock_id": "vsock0", "guest_cid": 3, "uds_path": a});
        assert_eq!(reply(&mut p, ApiRequest::PutVsock(put)).status, 204);
        assert!(std::os::unix::net::UnixStream::connect(&a).is_ok());
        assert_eq!(
            body(&reply(&mut p, ApiRequest::GetVmConfig))["vsock"],
            vsock(3, &a),
            "vsock_id is not kept"
        );
        // Again at the same path: the same socket stays.
        let first = p.vsock_socket().unwrap();
        assert_eq!(
            reply(&mut p, ApiRequest::PutVsock(vsock(4, &a))).status,
            204
        );
        assert!(Arc::ptr_eq(&first, &p.vsock_socket().unwrap()));
        drop(first);
        // At another path: the new one is bound, the old one removed.
        assert_eq!(
            reply(&mut p, ApiRequest::PutVsock(vsock(5, &b))).status,
            204
        );
        assert!(b.exists() && !a.exists());
        // InstanceStart hands the socket and the section to the builder.
        let mut settings = p.settings().unwrap();
        settings.kernel = Some("/vmlinux".into());
        let cfg = settings.finish().unwrap();
        let v = cfg.vsock.unwrap();
        assert_eq!((v.guest_cid, v.uds_path.as_path()), (5, b.as_path()));
        assert_eq!(p.vsock_socket().unwrap().path(), b);
        // null: no device and no socket.
        assert_eq!(reply(&mut p, ApiRequest::PutVsock(Value::Null)).status, 204);
        assert!(!b.exists());
        assert!(p.vsock_socket().is_none());
        assert_eq!(
            body(&reply(&mut p, ApiRequest::GetVmConfig))["vsock"],
            Value::Null
        );
        // Dropped (minivmm ends before InstanceStart): the socket goes.
        assert_eq!(
            reply(&mut p, ApiRequest::PutVsock(vsock(3, &a))).status,
            204
        );
        drop(p);
        assert!(!a.exists());
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn machine_config_defaults_put_and_patch() {
        let mut p = Preboot::new();
        let m = body(&reply(&mut p, ApiRequest::GetMachineConfig));
        assert_eq!(
            (m["vcpu_count"].as_u64(), m["mem_size_mib"].as_u64()),
            (Some(1), Some(128))
        );
        let put = json!({"vcpu_count": 2, "mem_size_mib": 512});
        assert_eq!(reply(&mut p, ApiRequest::PutMachineConfig(put)).status, 204);
        let r = reply(
            &mut p,
            ApiRequest::PatchMachineConfig(json!({"mem_size_mib": 1024})),
        );
        assert_eq!(r.status, 204);
        let m = body(&reply(&mut p, ApiRequest::GetMachineConfig));
        assert_eq!(
            (m["vcpu_count"].as_u64(), m["mem_size_mib"].as_u64()),
            (Some(2), Some(1024))
        );
        assert_eq!(m["smt"], json!(false));
        // Refused: the configuration stays as it was.
        let e = fault_of(&reply(
            &mut p,
            ApiRequest::PatchMachineConfig(json!({"vcpu_count": 0})),
        ));
        assert!(e.contains("vCPU") || e.contains("vcpu"), "{e}");
        let e = fault_of(&reply(
            &mut p,
            ApiRequest::PatchMachineConfig(json!({"smt": true, "vcpu_count": 3})),
        ));
        assert!(e.contains("smt"), "{e}");
        let e = fault_of(&reply(
            &mut p,
            ApiRequest::PutMachineConfig(json!({"vcpu_count": 1})),
        ));
        assert!(e.contains("mem_size_mib"), "{e}");
        let m = body(&reply(&mut p, ApiRequest::GetMachineConfig));
        assert_eq!(
            (m["vcpu_count"].as_u64(), m["mem_size_mib"].as_u64()),
            (Some(2), Some(1024))
        );
    }

    #[test]
    fn entries_are_replaced_by_id_and_bad_ones_refused() {
        let mut p = Preboot::new();
        let nic = |tap: &str| json!({"iface_id": "eth0", "host_dev_name": tap});
        let put = |p: &mut Preboot, id: &str, v: Value| {
            reply(p, ApiRequest::PutNetworkInterface(id.into(), v))
        };
        assert_eq!(put(&mut p, "eth0", nic("tap0")).status, 204);
        assert_eq!(put(&mut p, "eth0", nic("tap9")).status, 204);
        let second = json!({"iface_id": "eth1", "host_dev_name": "tap1"});
        assert_eq!(put(&mut p, "eth1", second).status, 204);
        let cfg = body(&reply(&mut p, ApiRequest::GetVmConfig));
        let nics = cfg["network-interfaces"].as_array().expect("list");
        assert_eq!(nics.len(), 2);
        assert_eq!(nics[0]["host_dev_name"], "tap9");
        assert_eq!(nics[1]["iface_id"], "eth1");
        // A second card on the same TAP, an unknown key, a bad MAC.
        let same = json!({"iface_id": "eth2", "host_dev_name": "tap1"});
        let e = fault_of(&put(&mut p, "eth2", same));
        assert!(e.contains("tap1"), "{e}");
        let typo = json!({"iface_id": "eth2", "host_dev_name": "tap2", "guest_mca": "x"});
        let e = fault_of(&put(&mut p, "eth2", typo));
        assert!(e.contains("guest_mca"), "{e}");
        let mac = json!({"iface_id": "eth2", "host_dev_name": "tap2", "guest_mac": "zz"});
        assert!(fault_of(&put(&mut p, "eth2", mac)).contains("zz"));
        let cfg = body(&reply(&mut p, ApiRequest::GetVmConfig));
        assert_eq!(cfg["network-interfaces"].as_array().expect("list").len(), 2);
        assert_eq!(cfg["vsock"], Value::Null);
        assert_eq!(cfg["drives"], json!([]));
    }

    #[test]
    fn mmds_config_needs_its_cards_and_the_store_is_the_one_handed_in() {
        let store: devices::mmds::SharedMmds = Default::default();
        let mut p = Preboot::new().with_mmds(store.clone());
        let cfg = json!({"network_interfaces": ["eth0"], "version": "V2"});
        let e = fault_of(&reply(&mut p, ApiRequest::PutMmdsConfig(cfg.clone())));
        assert!(
            e.starts_with("mmds-config: The list of network interface IDs"),
            "{e}"
        );
        let nic = json!({"iface_id": "eth0", "host_dev_name": "tap0"});
        let r = reply(&mut p, ApiRequest::PutNetworkInterface("eth0".into(), nic));
        assert_eq!(r.status, 204);
        let bad_ip = json!({"network_interfaces": ["eth0"], "ipv4_address": "10.0.0.1"});
        let e = fault_of(&reply(&mut p, ApiRequest::PutMmdsConfig(bad_ip)));
        assert!(e.contains("not link local"), "{e}");
        let e = fault_of(&reply(
            &mut p,
            ApiRequest::PutMmdsConfig(json!({"version": "V3", "network_interfaces": ["eth0"]})),
        ));
        assert!(e.contains("V3"), "{e}");
        assert_eq!(
            reply(&mut p, ApiRequest::PutMmdsConfig(cfg.clone())).status,
            204
        );
        assert_eq!(
            body(&reply(&mut p, ApiRequest::GetVmConfig))["mmds-config"],
            cfg
        );
        let settings = p.settings().expect("settings");
        let mmds = settings.mmds.expect("mmds-config");
        assert_eq!(mmds.version, devices::mmds::MmdsVersion::V2);
        // The store requests reach the store handed in.
        let data = json!({"latest": {"meta-data": {"ami-id": "ami-1"}}});
        assert_eq!(reply(&mut p, ApiRequest::PutMmds(data.clone())).status, 204);
        assert_eq!(devices::mmds::lock(&store).data(), data);
        let r = reply(&mut p, ApiRequest::PatchMmds(json!({"latest": null})));
        assert_eq!(r.status, 204);
        assert_eq!(body(&reply(&mut p, ApiRequest::GetMmds)), json!({}));
    }

    #[test]
    fn a_drive_whose_image_does_not_exist_is_refused_at_put() {
        let mut p = Preboot::new();
        let d = json!({"drive_id": "rootfs", "path_on_host": "/nonexistent/rootfs.ext4",
                       "is_root_device": true, "is_read_only": false});
        let e = fault_of(&reply(&mut p, ApiRequest::PutDrive("rootfs".into(), d)));
        assert!(e.contains("/nonexistent/rootfs.ext4"), "{e}");
        assert_eq!(
            body(&reply(&mut p, ApiRequest::GetVmConfig))["drives"],
            json!([])
        );
    }

    #[test]
    fn instance_start_needs_a_boot_source_and_starts_with_what_was_put() {
        let mut p = Preboot::new();
        let step = p.handle(ApiRequest::Action(Action::InstanceStart), "vm0");
        // No boot source yet: the settings parse, the kernel is missing;
        // the builder's check says so (Settings::finish).
        let Step::Start(s) = step else {
            panic!("a start with what there is");
        };
        assert!(s.finish().is_err());
        let missing = json!({"kernel_image_path": "/nonexistent/vmlinux"});
        let e = fault_of(&reply(&mut p, ApiRequest::PutBootSource(missing)));
        assert!(
            e.contains("cannot open kernel '/nonexistent/vmlinux'"),
            "{e}"
        );
        // A directory, and an initrd that is no file either.
        let dir = json!({"kernel_image_path": "/"});
        let e = fault_of(&reply(&mut p, ApiRequest::PutBootSource(dir)));
        assert_eq!(e, "boot-source: kernel '/' is not a regular file");
        let exe = std::env::current_exe().expect("test binary");
        let initrd = json!({"kernel_image_path": exe, "initrd_path": "/"});
        let e = fault_of(&reply(&mut p, ApiRequest::PutBootSource(initrd)));
        assert_eq!(e, "boot-source: initrd '/' is not a regular file");
        // Any readable file will do as a kernel until the builder reads it.
        let kernel = std::env::current_exe().expect("test binary");
        let boot = json!({"kernel_image_path": kernel, "boot_args": "console=ttyS0"});
        assert_eq!(reply(&mut p, ApiRequest::PutBootSource(boot)).status, 204);
        let Step::Start(s) = p.handle(ApiRequest::Action(Action::InstanceStart), "vm0") else {
            panic!("not started");
        };
        let cfg = s.finish().expect("config");
        assert_eq!(cfg.kernel, kernel);
        assert_eq!(cfg.boot_args.as_deref(), Some("console=ttyS0"));
    }

    #[test]
    fn run_time_requests_are_refused_before_start() {
        let mut p = Preboot::new();
        for req in [
            ApiRequest::Action(Action::FlushMetrics),
            ApiRequest::Action(Action::SendCtrlAltDel),
            ApiRequest::PatchVm(super::super::routes::VmState::Paused),
            ApiRequest::PatchNetworkInterface("eth0".into(), json!({"iface_id": "eth0"})),
            ApiRequest::PatchDrive("d".into(), json!({"drive_id": "d"})),
        ] {
            let e = fault_of(&reply(&mut p, req));
            assert!(e.contains("before the microVM is started"), "{e}");
        }
    }
}
