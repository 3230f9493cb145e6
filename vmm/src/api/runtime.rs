// SPDX-License-Identifier: Apache-2.0
//! The API once the VM runs: requests served on the event loop.
//!
//! The API thread hands each routed request to the event loop through a
//! channel and kicks an eventfd; [`Runtime::handle`] answers it there,
//! between two device passes, so a request never races the devices it
//! changes and no state is shared with the API thread. Each request is
//! bounded work: a pause waits at most [`PAUSE_TIMEOUT`] for the vCPUs to
//! park, a limiter change swaps buckets, a metrics flush writes one line
//! without blocking, a new disk image waits for the requests in flight on
//! the old one (`Block::swap_backend`).
//!
//! A `PATCH` on a device reaches it through its control, looked up by kind
//! and id ([`super::patch`]); one with a new `path_on_host` takes two trips
//! ([`Runtime::serve`], and [`super::command`] for the protocol): the
//! first answer asks the API thread to open the image, the second trip
//! brings it.

use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use devices::legacy::i8042::I8042;
use serde_json::{json, Value};

use super::command::{Answer, OpenedImage};
use devices::mmds::SharedMmds;

use super::http::Response;
use super::mmds;
use super::patch::patch_device;
use super::preboot::{instance_info, version};
use super::routes::{Action, ApiRequest, VmState};
use crate::config::{DeviceKind, VmmConfig};
use crate::control::Controls;
use crate::kvm::pause::{kick_all, PauseGate};
use crate::metrics::{lock_metrics, Metrics};
use crate::snapshot::create::{create, CreateParams, SnapshotSources};

/// How long `PATCH /vm` `Paused` waits for every vCPU to park.
pub const PAUSE_TIMEOUT: Duration = Duration::from_secs(1);

/// What the running VM's API can reach. Built with a struct literal, so
/// every part is named where the VM hands it over.
pub struct Runtime {
    /// The instance id the API reports.
    pub(crate) id: String,
    /// The configuration the VM was built from (limiter and image changes
    /// are written back into it).
    pub(crate) config: VmmConfig,
    /// The gate the vCPU threads honour.
    pub(crate) pause: Arc<PauseGate>,
    /// The vCPU threads.
    pub(crate) vcpus: Vec<JoinHandle<()>>,
    /// The metrics, when they are on.
    pub(crate) metrics: Option<Arc<Mutex<Metrics>>>,
    /// The keyboard controller, for `SendCtrlAltDel`.
    pub(crate) i8042: Arc<Mutex<I8042>>,
    /// The controls of the devices the API may change, by kind and id.
    pub(crate) devices: Controls,
    /// What `PUT /snapshot/create` reads (none in the tests that build a
    /// runtime without a VM).
    pub(crate) snapshot: Option<SnapshotSources>,
    /// The MMDS store (`PUT`, `PATCH`, `GET /mmds`).
    pub(crate) mmds: SharedMmds,
}

impl std::fmt::Debug for Runtime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Runtime")
            .field("id", &self.id)
            .field("vcpus", &self.vcpus.len())
            .finish_non_exhaustive()
    }
}

impl Runtime {
    /// The configuration in force (limiter and image changes included).
    pub fn config(&self) -> &VmmConfig {
        &self.config
    }

    /// Answers one command from the API thread: `image` is what that
    /// thread opened for it, when an earlier answer asked
    /// ([`Answer::Open`]).
    pub fn serve(&mut self, req: ApiRequest, image: Option<OpenedImage>) -> Answer {
        match req {
            ApiRequest::PatchDrive(id, body) => self.patch(DeviceKind::Block, &id, body, image),
            ApiRequest::PatchNetworkInterface(id, body) => {
                self.patch(DeviceKind::Net, &id, body, image)
            }
            req => Answer::Reply(self.handle(req)),
        }
    }

    /// Answers one request that needs no file opened ([`serve`](Self::serve)
    /// answers the rest).
    pub fn handle(&mut self, req: ApiRequest) -> Response {
        match req {
            ApiRequest::GetInstanceInfo => {
                let state = if self.pause.is_paused() {
                    "Paused"
                } else {
                    "Running"
                };
                instance_info(&self.id, state)
            }
            ApiRequest::GetVersion => version(),
            ApiRequest::GetMachineConfig => Response::json(
                json!({
                    "vcpu_count": self.config.vcpus,
                    "mem_size_mib": self.config.mem_mib,
                    "smt": self.config.smt,
                    "track_dirty_pages": self.config.track_dirty_pages,
                    "huge_pages": self.config.huge_pages.name(),
                })
                .to_string(),
            ),
            ApiRequest::GetVmConfig => {
                Response::json(crate::config::render::to_file_json(&self.config).to_string())
            }
            ApiRequest::PatchVm(VmState::Paused) => self.pause(),
            ApiRequest::PatchVm(VmState::Resumed) => {
                self.pause.resume();
                Response::no_content()
            }
            ApiRequest::Action(Action::FlushMetrics) => match &self.metrics {
                Some(m) => {
                    lock_metrics(m).flush();
                    Response::no_content()
                }
                None => Response::fault(
                    "FlushMetrics: no metrics destination is configured (PUT /metrics before \
                     InstanceStart, or --metrics)",
                ),
            },
            ApiRequest::Action(Action::SendCtrlAltDel) => self.ctrl_alt_del(),
            ApiRequest::PatchDrive(..) | ApiRequest::PatchNetworkInterface(..) => {
                match self.serve(req, None) {
                    Answer::Reply(r) => r,
                    Answer::Open { .. } => {
                        Response::fault("a new image is opened by the API thread (Runtime::serve)")
                    }
                }
            }
            ApiRequest::Balloon(b) => super::balloon::runtime(b, &mut self.config, &self.devices),
            ApiRequest::Action(Action::InstanceStart) => {
                Response::fault("InstanceStart: the microVM is already running")
            }
            ApiRequest::CreateSnapshot(body) => self.create_snapshot(body),
            ApiRequest::LoadSnapshot(_) => Response::fault(
                "snapshot/load: not allowed after the microVM started; load a snapshot in a \
                 fresh minivmm",
            ),
            ApiRequest::PutMmds(v) => mmds::put(&self.mmds, v),
            ApiRequest::PatchMmds(v) => mmds::patch(&self.mmds, &v),
            ApiRequest::GetMmds => mmds::get(&self.mmds),
            ApiRequest::PutBootSource(_)
            | ApiRequest::PutMachineConfig(_)
            | ApiRequest::PatchMachineConfig(_)
            | ApiRequest::PutNetworkInterface(..)
            | ApiRequest::PutDrive(..)
            | ApiRequest::PutLogger(_)
            | ApiRequest::PutMetrics(_)
            | ApiRequest::PutEntropy(_)
            | ApiRequest::PutSerial(_)
            | ApiRequest::PutVsock(_)
            | ApiRequest::PutBalloon(_)
            | ApiRequest::PutMmdsConfig(_) => Response::fault(
                "this request configures the microVM and is not allowed after it started",
            ),
        }
    }

    /// The i8042 queues Ctrl-Alt-Del and raises IRQ 1; the guest's kernel
    /// tells init (the project's reboots), and the reset ends minivmm.
    fn ctrl_alt_del(&mut self) -> Response {
        let mut kbd = self.i8042.lock().unwrap_or_else(|p| p.into_inner());
        match kbd.trigger_ctrl_alt_del() {
            Ok(()) => Response::no_content(),
            Err(e) => Response::fault(&format!("SendCtrlAltDel: {}", crate::error_line(&e))),
        }
    }

    /// `PATCH` on a running device (see [`super::patch`]).
    fn patch(
        &mut self,
        kind: DeviceKind,
        id: &str,
        body: Value,
        image: Option<OpenedImage>,
    ) -> Answer {
        patch_device(&mut self.config, &self.devices, kind, id, body, image)
    }

    /// `PUT /snapshot/create` (see [`crate::snapshot::create`]).
    fn create_snapshot(&mut self, body: Value) -> Response {
        let params: CreateParams = match serde_json::from_value(body) {
            Ok(p) => p,
            Err(e) => return Response::fault(&format!("snapshot/create: {e}")),
        };
        let Some(src) = &self.snapshot else {
            return Response::fault("snapshot/create: this microVM has no state to save");
        };
        let live = self.vcpus.iter().filter(|t| !t.is_finished()).count();
        match create(src, &self.pause, live, &self.config, &params) {
            Ok(_) => Response::no_content(),
            Err(msg) => Response::fault(&format!("snapshot/create: {}", crate::one_line(msg))),
        }
    }

    fn pause(&mut self) -> Response {
        if self.pause.is_paused() {
            return Response::no_content();
        }
        let live = self.vcpus.iter().filter(|t| !t.is_finished()).count();
        let threads = &self.vcpus;
        if self.pause.pause(live, PAUSE_TIMEOUT, || kick_all(threads)) {
            log::info!("vCPUs paused ({live})");
            Response::no_content()
        } else {
            Response::fault(&format!(
                "Paused: the vCPUs did not stop within {} ms; the microVM keeps running",
                PAUSE_TIMEOUT.as_millis()
            ))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::patch::bucket;
    use devices::rate_limiter::RateLimiterConfig;
    use devices::virtio::net::Net;

    use std::path::PathBuf;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::time::Instant;

    use clap::Parser;
    use devices::virtio::net::tap::SeqPacket;
    use devices::virtio::net::NetConfig;
    use vm_memory::{GuestAddress, GuestMemoryMmap};

    use crate::config::cli::Cli;
    use crate::kvm::pause::install_kick_handler;

    type TestNet = Arc<Mutex<Net<SeqPacket>>>;

    /// A file path of this test's own.
    fn tmp(name: &str) -> PathBuf {
        std::env::temp_dir().join(format!("minivmm-runtime-{}-{name}", std::process::id()))
    }

    /// Stand-ins for vCPU threads: each passes the pause gate between
    /// "runs" of 1 ms until `stop`.
    fn vcpus(gate: &Arc<PauseGate>, stop: &Arc<AtomicBool>, n: usize) -> Vec<JoinHandle<()>> {
        (0..n)
            .map(|_| {
                let (gate, stop) = (gate.clone(), stop.clone());
                std::thread::spawn(move || {
                    while !stop.load(Ordering::Relaxed) {
                        gate.check();
                        std::thread::sleep(Duration::from_millis(1));
                    }
                })
            })
            .collect()
    }

    /// A running VM with one card `eth0` (the device on a socket pair) and
    /// vCPU threads that honour the gate.
    struct Rig {
        rt: Runtime,
        gate: Arc<PauseGate>,
        stop: Arc<AtomicBool>,
        net: TestNet,
        kbd: Arc<Mutex<I8042>>,
        _peer: SeqPacket,
    }

    impl Rig {
        fn new(threads: usize, metrics: Option<Arc<Mutex<Metrics>>>) -> Rig {
            install_kick_handler().expect("kick handler");
            let cli = Cli::try_parse_from([
                "minivmm",
                "--kernel",
                "k",
                "--vcpus",
                "2",
                "--mem",
                "128",
                "--net",
                "tap=t0,id=eth0",
            ])
            .expect("flags");
            let mut config = cli.into_config().expect("config");
            // What GET /machine-config reports of the machine.
            config.smt = true;
            config.huge_pages = crate::config::HugePages::Transparent;
            let mem = GuestMemoryMmap::<()>::from_ranges(&[(GuestAddress(0), 1 << 20)]).unwrap();
            let (a, peer) = SeqPacket::pair().unwrap();
            let net: TestNet = Arc::new(Mutex::new(
                Net::with_backend(a, NetConfig::default(), mem).unwrap(),
            ));
            let gate = Arc::new(PauseGate::new());
            let stop = Arc::new(AtomicBool::new(false));
            let kbd = Arc::new(Mutex::new(I8042::new().unwrap()));
            let mut devices = Controls::new();
            devices.add(DeviceKind::Net, "eth0", net.clone());
            let rt = Runtime {
                id: "vm-7".into(),
                config,
                pause: gate.clone(),
                vcpus: vcpus(&gate, &stop, threads),
                metrics,
                i8042: kbd.clone(),
                devices,
                snapshot: None,
                mmds: Default::default(),
            };
            Rig {
                rt,
                gate,
                stop,
                net,
                kbd,
                _peer: peer,
            }
        }

        fn state(&mut self) -> Value {
            body(&self.rt.handle(ApiRequest::GetInstanceInfo))["state"].clone()
        }
    }

    impl Drop for Rig {
        fn drop(&mut self) {
            self.gate.resume();
            self.stop.store(true, Ordering::Relaxed);
            for t in self.rt.vcpus.drain(..) {
                let _ = t.join();
            }
        }
    }

    fn body(r: &Response) -> Value {
        serde_json::from_str(r.body.as_deref().unwrap_or("null")).expect("JSON body")
    }

    fn fault(r: &Response) -> String {
        assert_eq!(r.status, 400, "{:?}", r.body);
        body(r)["fault_message"]
            .as_str()
            .expect("fault_message")
            .to_string()
    }

    #[test]
    fn the_store_changes_while_the_vm_runs_but_its_configuration_does_not() {
        let mut rt = super::drive_tests::runtime(&[]);
        let e = fault(&rt.handle(ApiRequest::PutMmdsConfig(
            json!({"network_interfaces": ["eth0"]}),
        )));
        assert!(e.contains("not allowed after it started"), "{e}");
        assert_eq!(
            rt.handle(ApiRequest::PutMmds(json!({"a": {"b": 1}})))
                .status,
            204
        );
        assert_eq!(
            rt.handle(ApiRequest::PatchMmds(json!({"a": {"c": 2}})))
                .status,
            204
        );
        assert_eq!(
            body(&rt.handle(ApiRequest::GetMmds)),
            json!({"a": {"b": 1, "c": 2}})
        );
        assert_eq!(
            devices::mmds::lock(&rt.mmds).data(),
            json!({"a": {"b": 1, "c": 2}})
        );
    }

    #[test]
    fn pause_parks_every_vcpu_and_resume_lets_them_go() {
        let mut rig = Rig::new(2, None);
        assert_eq!(rig.state(), "Running");
        let r = rig.rt.handle(ApiRequest::PatchVm(VmState::Paused));
        assert_eq!((r.status, r.body.clone()), (204, None));
        assert_eq!(
            rig.gate.parked(),
            2,
            "both vCPUs parked when the answer came"
        );
        assert_eq!(rig.state(), "Paused");
        // Paused again: answered at once, still paused.
        let t = Instant::now();
        assert_eq!(
            rig.rt.handle(ApiRequest::PatchVm(VmState::Paused)).status,
            204
        );
        assert!(t.elapsed() < PAUSE_TIMEOUT / 2, "{:?}", t.elapsed());
        assert_eq!(rig.gate.parked(), 2);
        let r = rig.rt.handle(ApiRequest::PatchVm(VmState::Resumed));
        assert_eq!(r.status, 204);
        assert_eq!(rig.state(), "Running");
        let deadline = Instant::now() + Duration::from_secs(5);
        while rig.gate.parked() > 0 {
            assert!(Instant::now() < deadline, "vCPUs still parked after resume");
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    #[test]
    fn a_pause_the_vcpus_do_not_reach_is_withdrawn_with_a_fault() {
        let mut rig = Rig::new(1, None);
        // A vCPU that will not pass the gate for longer than the pause waits.
        let held = std::thread::spawn(|| std::thread::sleep(PAUSE_TIMEOUT * 2));
        rig.rt.vcpus.push(held);
        let t = Instant::now();
        let msg = fault(&rig.rt.handle(ApiRequest::PatchVm(VmState::Paused)));
        assert!(t.elapsed() >= PAUSE_TIMEOUT, "{:?}", t.elapsed());
        assert!(msg.contains("did not stop within 1000 ms"), "{msg}");
        assert_eq!(rig.state(), "Running", "the pause request was withdrawn");
    }

    #[test]
    fn vcpus_that_ended_are_not_waited_for() {
        let mut rig = Rig::new(0, None);
        rig.rt.vcpus.push(std::thread::spawn(|| ()));
        while !rig.rt.vcpus.iter().all(JoinHandle::is_finished) {
            std::thread::sleep(Duration::from_millis(1));
        }
        let t = Instant::now();
        assert_eq!(
            rig.rt.handle(ApiRequest::PatchVm(VmState::Paused)).status,
            204
        );
        assert!(t.elapsed() < PAUSE_TIMEOUT / 2, "{:?}", t.elapsed());
    }

    #[test]
    fn a_limiter_patch_reaches_the_card_and_the_configuration() {
        let mut rig = Rig::new(0, None);
        let patch = json!({"iface_id": "eth0",
                           "rx_rate_limiter": {"bandwidth": {"size": 2500, "refill_time": 100}}});
        let r = rig
            .rt
            .handle(ApiRequest::PatchNetworkInterface("eth0".into(), patch));
        assert_eq!(r.status, 204, "{:?}", r.body);
        let want = RateLimiterConfig {
            bandwidth: bucket(2500, 100),
            ops: None,
        };
        let (rx, tx) = rig.net.lock().unwrap().rate_limits();
        assert_eq!((rx, tx), (want, RateLimiterConfig::default()));
        assert_eq!(rig.rt.config().nets[0].device.rx_rate_limiter, want);
        assert_eq!(
            rig.rt.config().nets[0].device.tx_rate_limiter,
            RateLimiterConfig::default()
        );
        // GET /vm/config shows the limit in force.
        let cfg = body(&rig.rt.handle(ApiRequest::GetVmConfig));
        let nic = &cfg["network-interfaces"][0];
        assert_eq!(nic["rx_rate_limiter"]["bandwidth"]["size"], 2500, "{nic}");
        // Then TX only: RX keeps what it has.
        let patch =
            json!({"iface_id": "eth0", "tx_rate_limiter": {"ops": {"size": 5, "refill_time": 10}}});
        let r = rig
            .rt
            .handle(ApiRequest::PatchNetworkInterface("eth0".into(), patch));
        assert_eq!(r.status, 204, "{:?}", r.body);
        let (rx, tx) = rig.net.lock().unwrap().rate_limits();
        assert_eq!(rx, want);
        assert_eq!(tx.ops, bucket(5, 10));
        assert_eq!(rig.rt.config().nets[0].device.tx_rate_limiter, tx);
    }

    #[test]
    fn a_bad_limiter_patch_is_a_fault_and_changes_nothing() {
        let mut rig = Rig::new(0, None);
        let before = rig.rt.config().nets[0].device.clone();
        for (id, patch, needle) in [
            (
                "eth9",
                json!({"iface_id": "eth9"}),
                "no network interface 'eth9'",
            ),
            (
                "eth0",
                json!({"iface_id": "eth0", "mtu": 1}),
                "unknown field",
            ),
            (
                "eth0",
                json!({"iface_id": "eth0",
                       "rx_rate_limiter": {"ops": {"size": 5, "refill_time": 10}},
                       "tx_rate_limiter": {"ops": {"size": 5}}}),
                "refill_time",
            ),
        ] {
            let msg = fault(
                &rig.rt
                    .handle(ApiRequest::PatchNetworkInterface(id.into(), patch)),
            );
            assert!(msg.contains(needle), "{msg}");
            if id == "eth0" {
                assert!(msg.starts_with("network interface 'eth0': "), "{msg}");
            }
        }
        let (rx, tx) = rig.net.lock().unwrap().rate_limits();
        assert_eq!((rx, tx), (before.rx_rate_limiter, before.tx_rate_limiter));
        assert_eq!(
            rig.rt.config().nets[0].device.rx_rate_limiter,
            before.rx_rate_limiter
        );
    }

    #[test]
    fn a_card_patch_that_changes_nothing_is_done_as_in_firecracker() {
        let mut rig = Rig::new(0, None);
        let before = rig.net.lock().unwrap().rate_limits();
        for patch in [
            json!({"iface_id": "eth0"}),
            json!({"iface_id": "eth0", "rx_rate_limiter": null}),
        ] {
            let r = rig
                .rt
                .handle(ApiRequest::PatchNetworkInterface("eth0".into(), patch));
            assert_eq!((r.status, r.body), (204, None));
        }
        assert_eq!(rig.net.lock().unwrap().rate_limits(), before);
    }

    #[test]
    fn a_card_missing_from_the_device_list_is_no_card() {
        let mut rig = Rig::new(0, None);
        rig.rt.devices.clear();
        let msg = fault(&rig.rt.handle(ApiRequest::PatchNetworkInterface(
            "eth0".into(),
            json!({"iface_id": "eth0"}),
        )));
        assert_eq!(msg, "no network interface 'eth0'");
    }

    #[test]
    fn metrics_are_flushed_on_request_where_there_is_a_destination() {
        let mut rig = Rig::new(0, None);
        let msg = fault(&rig.rt.handle(ApiRequest::Action(Action::FlushMetrics)));
        assert!(msg.contains("no metrics destination"), "{msg}");
        let path = tmp("metrics");
        std::fs::write(&path, "").unwrap();
        let metrics = Arc::new(Mutex::new(Metrics::open(&path).unwrap()));
        let mut rig = Rig::new(0, Some(metrics));
        assert_eq!(
            rig.rt
                .handle(ApiRequest::Action(Action::FlushMetrics))
                .status,
            204
        );
        assert_eq!(
            rig.rt
                .handle(ApiRequest::Action(Action::FlushMetrics))
                .status,
            204
        );
        let text = std::fs::read_to_string(&path).unwrap();
        let _ = std::fs::remove_file(&path);
        assert_eq!(text.lines().count(), 2, "{text}");
        for line in text.lines() {
            serde_json::from_str::<Value>(line).expect("a JSON line");
        }
    }

    #[test]
    fn ctrl_alt_del_queues_the_keys_until_the_keyboard_buffer_is_full() {
        let mut rig = Rig::new(0, None);
        assert_eq!(rig.kbd.lock().unwrap().pending_bytes(), 0);
        let r = rig.rt.handle(ApiRequest::Action(Action::SendCtrlAltDel));
        assert_eq!((r.status, r.body.clone()), (204, None));
        let queued = rig.kbd.lock().unwrap().pending_bytes();
        assert!(queued > 0);
        // A guest that never reads: the buffer fills, and the request that
        // does not fit is refused whole.
        let mut answers = Vec::new();
        for _ in 0..64 {
            answers.push(rig.rt.handle(ApiRequest::Action(Action::SendCtrlAltDel)));
        }
        let refused = answers.iter().find(|r| r.status == 400).expect("a refusal");
        let msg = fault(refused);
        assert!(msg.starts_with("SendCtrlAltDel: "), "{msg}");
        let pending = rig.kbd.lock().unwrap().pending_bytes();
        assert_eq!(pending % queued, 0, "only whole sequences are queued");
    }

    #[test]
    fn the_running_vm_describes_itself_and_refuses_configuration() {
        let mut rig = Rig::new(0, None);
        let info = body(&rig.rt.handle(ApiRequest::GetInstanceInfo));
        assert_eq!(info["id"], "vm-7");
        assert_eq!(info["app_name"], "minivmm");
        let mc = body(&rig.rt.handle(ApiRequest::GetMachineConfig));
        assert_eq!(
            (mc["vcpu_count"].clone(), mc["mem_size_mib"].clone()),
            (json!(2), json!(128))
        );
        assert_eq!(
            (mc["smt"].clone(), mc["huge_pages"].clone()),
            (json!(true), json!("Transparent"))
        );
        let v = body(&rig.rt.handle(ApiRequest::GetVersion));
        assert!(v["firecracker_version"].is_string(), "{v}");
        let cfg = body(&rig.rt.handle(ApiRequest::GetVmConfig));
        assert_eq!(cfg["machine-config"]["vcpu_count"], 2);
        assert_eq!(cfg["network-interfaces"][0]["iface_id"], "eth0");
        let msg = fault(&rig.rt.handle(ApiRequest::Action(Action::InstanceStart)));
        assert!(msg.contains("already running"), "{msg}");
        for req in [
            ApiRequest::PutBootSource(json!({})),
            ApiRequest::PutMachineConfig(json!({})),
            ApiRequest::PatchMachineConfig(json!({})),
            ApiRequest::PutNetworkInterface("eth1".into(), json!({})),
            ApiRequest::PutDrive("d".into(), json!({})),
            ApiRequest::PutLogger(json!({})),
            ApiRequest::PutMetrics(json!({})),
            ApiRequest::PutEntropy(json!({})),
            ApiRequest::PutVsock(json!({})),
        ] {
            let msg = fault(&rig.rt.handle(req));
            assert!(msg.contains("not allowed after it started"), "{msg}");
        }
    }
}

/// `PATCH /drives` over real drives on images in a temporary directory.
#[cfg(test)]
pub(crate) mod drive_tests {
    use super::*;
    use crate::api::command::open_image;
    use crate::api::patch::bucket;
    use crate::config::DriveConfig;
    use crate::registry::lock;
    use devices::rate_limiter::RateLimiterConfig;
    use devices::virtio::block::Block;
    use devices::virtio::block::FileBackend;
    use devices::virtio::block::{BlockConfig, IoEngine};
    use devices::virtio::VirtioDevice;
    use std::path::{Path, PathBuf};

    /// A directory of the test's own, removed when dropped.
    pub(crate) struct Scratch(pub PathBuf);

    impl Scratch {
        pub(crate) fn new(tag: &str) -> Self {
            let d = std::env::temp_dir().join(format!(
                "minivmm-runtime-{tag}-{}-{:?}",
                std::process::id(),
                std::thread::current().id()
            ));
            let _ = std::fs::remove_dir_all(&d);
            std::fs::create_dir_all(&d).unwrap();
            Scratch(d)
        }

        /// A file `name` of `sectors` 512-byte sectors.
        pub(crate) fn image(&self, name: &str, sectors: u64) -> PathBuf {
            let p = self.0.join(name);
            std::fs::write(&p, vec![0u8; sectors as usize * 512]).unwrap();
            p
        }
    }

    impl Drop for Scratch {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    /// The drives of a runtime the tests reach.
    type Blocks = Vec<Arc<Mutex<Block>>>;

    /// A runtime with one drive per `(id, image, read_only)` and no vCPU.
    pub(crate) fn runtime(drives: &[(&str, &Path, bool)]) -> Runtime {
        runtime_with_blocks(drives).0
    }

    /// [`runtime`] and its drives.
    fn runtime_with_blocks(drives: &[(&str, &Path, bool)]) -> (Runtime, Blocks) {
        let mem =
            vm_memory::GuestMemoryMmap::<()>::from_ranges(&[(vm_memory::GuestAddress(0), 1 << 20)])
                .unwrap();
        let configs: Vec<DriveConfig> = drives
            .iter()
            .map(|&(id, path, read_only)| {
                let mut device = BlockConfig::new(id, path);
                device.read_only = read_only;
                device.io_engine = IoEngine::Sync;
                DriveConfig {
                    is_root_device: false,
                    partuuid: None,
                    device,
                }
            })
            .collect();
        let mut devices = Controls::new();
        let blocks: Blocks = configs
            .iter()
            .map(|c| {
                let b = Arc::new(Mutex::new(
                    Block::new(c.device.clone(), mem.clone()).unwrap(),
                ));
                devices.add(DeviceKind::Block, &c.device.id, b.clone());
                b
            })
            .collect();
        let config = VmmConfig {
            kernel: "/vmlinux".into(),
            initramfs: None,
            boot_args: None,
            cmdline_extra: None,
            mem_mib: 1,
            vcpus: 1,
            smt: false,
            huge_pages: Default::default(),
            track_dirty_pages: false,
            serial: Default::default(),
            nets: Vec::new(),
            drives: configs,
            entropy: None,
            balloon: None,
            vsock: None,
            mmds: None,
            metrics: None,
            logger: Default::default(),
            host_quirks: crate::config::HostQuirks::Off,
            seccomp: crate::process::seccomp::SeccompMode::Off,
        };
        let rt = Runtime {
            id: "vm0".into(),
            config,
            pause: Arc::new(PauseGate::new()),
            vcpus: Vec::new(),
            metrics: None,
            i8042: Arc::new(Mutex::new(I8042::new().unwrap())),
            devices,
            snapshot: None,
            mmds: Default::default(),
        };
        (rt, blocks)
    }

    pub(crate) fn patch(id: &str, body: Value) -> ApiRequest {
        ApiRequest::PatchDrive(id.into(), body)
    }

    /// The response of an answer that must be one.
    #[track_caller]
    pub(crate) fn reply(a: Answer) -> Response {
        match a {
            Answer::Reply(r) => r,
            Answer::Open { path, .. } => panic!("asked to open {}", path.display()),
        }
    }

    #[track_caller]
    fn fault_of(a: Answer) -> String {
        let r = reply(a);
        assert_eq!(r.status, 400, "{r:?}");
        let v: Value = serde_json::from_str(r.body.as_deref().unwrap()).unwrap();
        v["fault_message"].as_str().unwrap().to_string()
    }

    /// Both trips of a PATCH that names an image: the request, the
    /// API thread's open, the request again with it.
    pub(crate) fn patch_image(rt: &mut Runtime, id: &str, body: Value) -> Answer {
        match rt.serve(patch(id, body.clone()), None) {
            Answer::Open { path, read_only } => {
                let image = open_image(&path, read_only);
                rt.serve(patch(id, body), Some(image))
            }
            reply => reply,
        }
    }

    fn vm_config(rt: &mut Runtime) -> Value {
        let r = reply(rt.serve(ApiRequest::GetVmConfig, None));
        serde_json::from_str(r.body.as_deref().unwrap()).unwrap()
    }

    fn capacity(blocks: &Blocks, index: usize) -> u64 {
        lock(&blocks[index]).capacity()
    }

    #[test]
    fn a_new_image_is_asked_for_opened_and_put_in_use() {
        let dir = Scratch::new("swap");
        let (a, b) = (dir.image("a.img", 8), dir.image("b.img", 8));
        let (bigger, ro_new) = (dir.image("bigger.img", 40), dir.image("ro-new.img", 24));
        let (mut rt, blocks) = runtime_with_blocks(&[("rootfs", &a, false), ("data", &b, true)]);
        // The first trip opens nothing and says how to open the image.
        let body = json!({"drive_id": "rootfs", "path_on_host": bigger});
        match rt.serve(patch("rootfs", body.clone()), None) {
            Answer::Open { path, read_only } => {
                assert_eq!((path, read_only), (bigger.clone(), false));
            }
            Answer::Reply(r) => panic!("{r:?}"),
        }
        assert_eq!(capacity(&blocks, 0), 8);
        let r = reply(patch_image(&mut rt, "rootfs", body));
        assert_eq!(r.status, 204, "{r:?}");
        assert_eq!(capacity(&blocks, 0), 40);
        assert_eq!(lock(&blocks[0]).config().path, bigger);
        assert_eq!(rt.config().drives[0].device.path, bigger);
        assert_eq!(
            vm_config(&mut rt)["drives"][0]["path_on_host"],
            json!(bigger)
        );
        // The old image is free again; the new one is this drive's.
        assert!(matches!(open_image(&a, false), OpenedImage::Image(_)));
        assert!(matches!(
            open_image(&bigger, false),
            OpenedImage::Locked { .. }
        ));
        // A read-only drive's image is asked for read-only.
        let body = json!({"drive_id": "data", "path_on_host": ro_new});
        match rt.serve(patch("data", body.clone()), None) {
            Answer::Open { read_only, .. } => assert!(read_only),
            Answer::Reply(r) => panic!("{r:?}"),
        }
        assert_eq!(reply(patch_image(&mut rt, "data", body)).status, 204);
        assert_eq!(capacity(&blocks, 1), 24);
        assert_eq!(rt.config().drives[1].device.path, ro_new);
    }

    #[test]
    fn a_bad_patch_is_refused_with_its_reason_and_changes_nothing() {
        let dir = Scratch::new("bad");
        let (a, b) = (dir.image("a.img", 8), dir.image("b.img", 16));
        let elsewhere = dir.image("elsewhere.img", 32);
        let missing = dir.0.join("missing.img");
        let (mut rt, blocks) = runtime_with_blocks(&[("rootfs", &a, false), ("data", &b, false)]);
        // Held by "another process" (another open file of this one).
        let _held = FileBackend::open(&elsewhere, false).unwrap();
        let path = |p: &Path| p.display().to_string();
        let cases: Vec<(&str, Value, String)> = vec![
            (
                "nope",
                json!({"drive_id": "nope", "path_on_host": a}),
                "no drive 'nope'".into(),
            ),
            (
                "rootfs",
                json!({"drive_id": "rootfs", "is_read_only": true}),
                "drive 'rootfs': unknown field `is_read_only`".into(),
            ),
            (
                "rootfs",
                json!({"drive_id": "rootfs", "path_on_host": 7}),
                "drive 'rootfs': path_on_host: invalid type".into(),
            ),
            (
                "rootfs",
                json!({"drive_id": "rootfs"}),
                "drive 'rootfs': nothing to change".into(),
            ),
            (
                "rootfs",
                json!({"drive_id": "rootfs", "path_on_host": missing}),
                format!(
                    "drive 'rootfs': cannot open disk image {}: No such file",
                    path(&missing)
                ),
            ),
            (
                "rootfs",
                json!({"drive_id": "rootfs", "path_on_host": dir.0}),
                format!(
                    "drive 'rootfs': disk image {} is not a regular file",
                    path(&dir.0)
                ),
            ),
            (
                "rootfs",
                json!({"drive_id": "rootfs", "path_on_host": elsewhere}),
                format!(
                    "drive 'rootfs': disk image {} is in use by another process (locked)",
                    path(&elsewhere)
                ),
            ),
            (
                "rootfs",
                json!({"drive_id": "rootfs", "path_on_host": b}),
                format!(
                    "drive 'rootfs': disk image {} is already drive 'data'",
                    path(&b)
                ),
            ),
            (
                "rootfs",
                json!({"drive_id": "rootfs", "path_on_host": format!("{}/./b.img", path(&dir.0))}),
                "is already drive 'data'".into(),
            ),
            (
                "rootfs",
                json!({"drive_id": "rootfs", "rate_limiter": {"ops": {"size": 5}}}),
                "drive 'rootfs': in 'rate_limiter': missing field `refill_time`".into(),
            ),
        ];
        for (id, body, want) in cases {
            let e = fault_of(patch_image(&mut rt, id, body.clone()));
            assert!(e.contains(&want), "{body}: '{e}' lacks '{want}'");
            assert!(!e.contains('\n'), "{e}");
            assert_eq!(capacity(&blocks, 0), 8, "{body}");
            assert_eq!(rt.config().drives[0].device.path, a, "{body}");
            assert_eq!(vm_config(&mut rt)["drives"][0]["path_on_host"], json!(a));
            assert_eq!(lock(&blocks[0]).config_generation(), 0, "{body}");
        }
        // A bad limiter is refused before any image is opened.
        let both = json!({"drive_id": "rootfs", "path_on_host": elsewhere,
                          "rate_limiter": {"bandwidth": {"size": 1}}});
        let e = fault_of(rt.serve(patch("rootfs", both), None));
        assert!(e.contains("refill_time"), "{e}");
        // The drive still works as it was: the same image takes a limiter.
        let ok =
            json!({"drive_id": "rootfs", "rate_limiter": {"ops": {"size": 5, "refill_time": 100}}});
        assert_eq!(reply(rt.serve(patch("rootfs", ok), None)).status, 204);
    }

    #[test]
    fn the_drives_own_image_named_again_shows_its_new_size() {
        let dir = Scratch::new("resize");
        let a = dir.image("a.img", 8);
        let (mut rt, blocks) = runtime_with_blocks(&[("rootfs", &a, false)]);
        // The host grows the file and says so.
        std::fs::OpenOptions::new()
            .write(true)
            .open(&a)
            .unwrap()
            .set_len(64 * 512)
            .unwrap();
        let body = json!({"drive_id": "rootfs", "path_on_host": a});
        assert_eq!(reply(patch_image(&mut rt, "rootfs", body)).status, 204);
        assert_eq!(capacity(&blocks, 0), 64);
        assert_eq!(lock(&blocks[0]).config_generation(), 1);
        assert_eq!(rt.config().drives[0].device.path, a);
    }

    #[test]
    fn a_drives_rate_limiter_changes_alone() {
        let dir = Scratch::new("limiter");
        let a = dir.image("a.img", 8);
        let (mut rt, blocks) = runtime_with_blocks(&[("rootfs", &a, false)]);
        let body = json!({"drive_id": "rootfs",
                          "rate_limiter": {"bandwidth": {"size": 5000, "refill_time": 100}}});
        // No image is asked for.
        assert_eq!(reply(rt.serve(patch("rootfs", body), None)).status, 204);
        let want = RateLimiterConfig {
            bandwidth: bucket(5000, 100),
            ops: None,
        };
        assert_eq!(rt.config().drives[0].device.rate_limiter, want);
        assert_eq!(lock(&blocks[0]).config().rate_limiter, want);
        let cfg = vm_config(&mut rt);
        assert_eq!(cfg["drives"][0]["rate_limiter"]["bandwidth"]["size"], 5000);
        // Partial: the ops bucket added, the bandwidth kept; then removed.
        let body = json!({"drive_id": "rootfs",
                          "rate_limiter": {"ops": {"size": 10, "refill_time": 1000}}});
        assert_eq!(reply(rt.serve(patch("rootfs", body), None)).status, 204);
        let l = rt.config().drives[0].device.rate_limiter;
        assert_eq!((l.bandwidth, l.ops), (bucket(5000, 100), bucket(10, 1000)));
        let body = json!({"drive_id": "rootfs",
                          "rate_limiter": {"bandwidth": {"size": 0, "refill_time": 0}}});
        assert_eq!(reply(rt.serve(patch("rootfs", body), None)).status, 204);
        let l = lock(&blocks[0]).config().rate_limiter;
        assert_eq!((l.bandwidth, l.ops), (None, bucket(10, 1000)));
        assert_eq!(rt.config().drives[0].device.rate_limiter, l);
        // Image and limiter in one request.
        let b = dir.image("b.img", 16);
        let body = json!({"drive_id": "rootfs", "path_on_host": b,
                          "rate_limiter": {"ops": {"size": 0, "refill_time": 0}}});
        assert_eq!(reply(patch_image(&mut rt, "rootfs", body)).status, 204);
        assert_eq!(capacity(&blocks, 0), 16);
        assert!(rt.config().drives[0].device.rate_limiter.is_unlimited());
    }
}
