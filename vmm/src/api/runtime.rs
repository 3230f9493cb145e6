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
//! `PATCH /drives/{id}` with a `path_on_host` takes two trips
//! ([`Runtime::serve`], and [`super::command`] for the protocol): the
//! first answer asks the API thread to open the image, the second trip
//! brings it. Every check that needs no file comes first, so a bad request
//! opens nothing.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::Duration;

use devices::legacy::i8042::I8042;
use devices::rate_limiter::{RateLimiterConfig, TokenBucketConfig};
use devices::virtio::block::{Block, BlockError, FileId};
use devices::virtio::net::{Net, NetBackend, NetError};
use serde::Deserialize;
use serde_json::{json, Value};

use super::command::{Answer, OpenedImage};
use super::http::Response;
use super::preboot::{instance_info, version};
use super::routes::{Action, ApiRequest, VmState};
use crate::config::{file, VmmConfig};
use crate::kvm::pause::{kick_all, PauseGate};
use crate::metrics::{lock_metrics, Metrics};

/// How long `PATCH /vm` `Paused` waits for every vCPU to park.
pub const PAUSE_TIMEOUT: Duration = Duration::from_secs(1);

/// The body of `PATCH /network-interfaces/{id}` (Firecracker's
/// `PartialNetworkInterface`).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct NetPatch {
    #[allow(dead_code)] // checked against the path by the router
    iface_id: String,
    rx_rate_limiter: Option<Value>,
    tx_rate_limiter: Option<Value>,
}

/// What the API changes on a running network card: the device itself
/// (locked on the event loop, between its passes), or a stand-in in tests.
pub trait NetControl: Send {
    /// Replaces the RX and TX limits named (`None` keeps one).
    fn set_rate_limits(
        &mut self,
        rx: Option<&RateLimiterConfig>,
        tx: Option<&RateLimiterConfig>,
    ) -> Result<(), NetError>;
}

impl<B: NetBackend + Send> NetControl for Net<B> {
    fn set_rate_limits(
        &mut self,
        rx: Option<&RateLimiterConfig>,
        tx: Option<&RateLimiterConfig>,
    ) -> Result<(), NetError> {
        Net::set_rate_limits(self, rx, tx)
    }
}

/// A running card under its id, as the API reaches it.
pub type NetHandle = (String, Arc<Mutex<dyn NetControl>>);

/// The body of `PATCH /drives/{id}` (Firecracker's `PartialDrive`).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct DrivePatch {
    #[allow(dead_code)] // checked against the path by the router
    drive_id: String,
    path_on_host: Option<PathBuf>,
    rate_limiter: Option<Value>,
}

fn lock<T: ?Sized>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

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
    /// The network cards by id.
    pub(crate) nets: Vec<NetHandle>,
    /// The drives by id.
    pub(crate) drives: Vec<(String, Arc<Mutex<Block>>)>,
}

impl std::fmt::Debug for Runtime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Runtime")
            .field("id", &self.id)
            .field("vcpus", &self.vcpus.len())
            .finish_non_exhaustive()
    }
}

/// Applies a Firecracker limiter update to `current`: a bucket given
/// replaces the one in force, a bucket of size 0 turns it off (as
/// Firecracker's update does), a bucket absent or `null` stays.
fn updated_limiter(
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
            ApiRequest::PatchDrive(id, body) => self.patch_drive(&id, body, image),
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
                    "smt": false,
                    "track_dirty_pages": false,
                    "huge_pages": "None",
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
            ApiRequest::PatchNetworkInterface(id, body) => self.patch_net(&id, body),
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
            ApiRequest::PatchDrive(id, body) => match self.patch_drive(&id, body, None) {
                Answer::Reply(r) => r,
                Answer::Open { .. } => Response::fault(&format!(
                    "drive '{id}': a new image is opened by the API thread (Runtime::serve)"
                )),
            },
            ApiRequest::Action(Action::InstanceStart) => {
                Response::fault("InstanceStart: the microVM is already running")
            }
            ApiRequest::PutBootSource(_)
            | ApiRequest::PutMachineConfig(_)
            | ApiRequest::PatchMachineConfig(_)
            | ApiRequest::PutNetworkInterface(..)
            | ApiRequest::PutDrive(..)
            | ApiRequest::PutLogger(_)
            | ApiRequest::PutMetrics(_) => Response::fault(
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

    fn patch_net(&mut self, id: &str, body: Value) -> Response {
        let patch: NetPatch = match serde_json::from_value(body) {
            Ok(p) => p,
            Err(e) => return Response::fault(&format!("network interface '{id}': {e}")),
        };
        let index = self.config.nets.iter().position(|n| n.id == id);
        let dev = self
            .nets
            .iter()
            .find(|(n, _)| n == id)
            .map(|(_, d)| d.clone());
        let (Some(index), Some(dev)) = (index, dev) else {
            return Response::fault(&format!("no network interface '{id}'"));
        };
        let current = &self.config.nets[index].device;
        let new = |what: &str, cur: &RateLimiterConfig, v: Option<Value>| {
            v.map(|v| updated_limiter(what, cur, v)).transpose()
        };
        let limits = new(
            "rx_rate_limiter",
            &current.rx_rate_limiter,
            patch.rx_rate_limiter,
        )
        .and_then(|rx| {
            let tx = new(
                "tx_rate_limiter",
                &current.tx_rate_limiter,
                patch.tx_rate_limiter,
            )?;
            Ok((rx, tx))
        });
        let (rx, tx) = match limits {
            Ok(l) => l,
            Err(e) => return Response::fault(&format!("network interface '{id}': {e}")),
        };
        let mut net = dev.lock().unwrap_or_else(|p| p.into_inner());
        if let Err(e) = net.set_rate_limits(rx.as_ref(), tx.as_ref()) {
            return Response::fault(&format!(
                "network interface '{id}': {}",
                crate::error_line(&e)
            ));
        }
        let nic = &mut self.config.nets[index].device;
        if let Some(rx) = rx {
            nic.rx_rate_limiter = rx;
        }
        if let Some(tx) = tx {
            nic.tx_rate_limiter = tx;
        }
        log::info!("network interface '{id}': rate limits changed");
        Response::no_content()
    }

    /// `PATCH /drives/{id}`: a new image (see the module doc), new limits,
    /// or both. Refused as a whole, with nothing changed, but where the
    /// image changed and the limiter then could not be made (the host
    /// refused a timer), which the message says.
    fn patch_drive(&mut self, id: &str, body: Value, image: Option<OpenedImage>) -> Answer {
        let fault = |msg: &str| Answer::Reply(Response::fault(&format!("drive '{id}': {msg}")));
        let patch: DrivePatch = match serde_json::from_value(body) {
            Ok(p) => p,
            Err(e) => return fault(&e.to_string()),
        };
        let Some(index) = self.config.drives.iter().position(|d| d.device.id == id) else {
            return Response::fault(&format!("no drive '{id}'")).into();
        };
        let Some(dev) = self
            .drives
            .iter()
            .find(|(n, _)| n == id)
            .map(|(_, d)| d.clone())
        else {
            return Response::fault(&format!("no drive '{id}'")).into();
        };
        if patch.path_on_host.is_none() && patch.rate_limiter.is_none() {
            return fault("nothing to change: give path_on_host, rate_limiter or both");
        }
        let drive = &self.config.drives[index].device;
        let limiter = match patch
            .rate_limiter
            .map(|v| updated_limiter("rate_limiter", &drive.rate_limiter, v))
            .transpose()
        {
            Ok(l) => l,
            Err(e) => return fault(&e),
        };
        let mut changed = Vec::new();
        if let Some(path) = patch.path_on_host {
            let Some(image) = image else {
                return Answer::Open {
                    path,
                    read_only: drive.read_only,
                };
            };
            if let Err(msg) = self.change_image(id, &dev, &path, image) {
                return fault(&msg);
            }
            changed.push(format!(
                "image {}",
                crate::one_line(path.display().to_string())
            ));
            self.config.drives[index].device.path = path;
        }
        if let Some(l) = limiter {
            if let Err(e) = lock(&dev).set_rate_limiter(&l) {
                let why = crate::one_line(e.to_string());
                return fault(&if changed.is_empty() {
                    why
                } else {
                    format!(
                        "the {} is in use, but the rate limiter is not: {why}",
                        changed[0]
                    )
                });
            }
            self.config.drives[index].device.rate_limiter = l;
            changed.push("rate limits".into());
        }
        log::info!("drive '{id}': {} changed", changed.join(" and "));
        Response::no_content().into()
    }

    /// Puts the image the API thread opened under the drive `dev` (see
    /// [`OpenedImage`]); `Err` is a one-line reason, and then nothing
    /// changed.
    fn change_image(
        &self,
        id: &str,
        dev: &Mutex<Block>,
        path: &Path,
        image: OpenedImage,
    ) -> Result<(), String> {
        // Another drive on the same file: two writers, or a reader whose
        // data changes under it. Each lock is taken alone.
        let other = |file: FileId| {
            self.drives
                .iter()
                .filter(|(n, _)| n != id)
                .find(|(_, d)| lock(d).backend().id() == file)
                .map(|(n, _)| n.clone())
        };
        let taken = |o: String| {
            let path = crate::one_line(path.display().to_string());
            Err(format!("disk image {path} is already drive '{o}'"))
        };
        match image {
            OpenedImage::Failed(msg) => Err(msg),
            OpenedImage::Locked { id: file, size, .. } if file == lock(dev).backend().id() => {
                // This drive's own image, which it holds locked: the host
                // resized it, and the guest is to see the new size.
                lock(dev).resize(size);
                Ok(())
            }
            OpenedImage::Locked {
                id: file, error, ..
            } => match other(file) {
                Some(o) => taken(o),
                None => Err(error),
            },
            OpenedImage::Image(mut backend) => {
                if let Some(o) = other(backend.id()) {
                    return taken(o);
                }
                backend.probe();
                lock(dev)
                    .swap_backend(backend, path.to_path_buf())
                    .map_err(|e| match e {
                        BlockError::Config { msg, .. } => msg,
                        e => crate::one_line(e.to_string()),
                    })
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bucket(size: u64, refill: u64) -> Option<TokenBucketConfig> {
        Some(TokenBucketConfig {
            size,
            one_time_burst: 0,
            refill_time: refill,
        })
    }

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
            let config = cli.into_config().expect("config");
            let mem = GuestMemoryMmap::<()>::from_ranges(&[(GuestAddress(0), 1 << 20)]).unwrap();
            let (a, peer) = SeqPacket::pair().unwrap();
            let net: TestNet = Arc::new(Mutex::new(
                Net::with_backend(a, NetConfig::default(), mem).unwrap(),
            ));
            let gate = Arc::new(PauseGate::new());
            let stop = Arc::new(AtomicBool::new(false));
            let kbd = Arc::new(Mutex::new(I8042::new().unwrap()));
            let handle: Arc<Mutex<dyn NetControl>> = net.clone();
            let rt = Runtime {
                id: "vm-7".into(),
                config,
                pause: gate.clone(),
                vcpus: vcpus(&gate, &stop, threads),
                metrics,
                i8042: kbd.clone(),
                nets: vec![("eth0".into(), handle)],
                drives: Vec::new(),
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
    fn a_card_missing_from_the_device_list_is_no_card() {
        let mut rig = Rig::new(0, None);
        rig.rt.nets.clear();
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
        ] {
            let msg = fault(&rig.rt.handle(req));
            assert!(msg.contains("not allowed after it started"), "{msg}");
        }
    }

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

/// `PATCH /drives` over real drives on images in a temporary directory.
#[cfg(test)]
pub(crate) mod drive_tests {
    use super::*;
    use crate::api::command::open_image;
    use crate::config::DriveConfig;
    use devices::virtio::block::FileBackend;
    use devices::virtio::block::{BlockConfig, IoEngine};
    use devices::virtio::VirtioDevice;

    fn bucket(size: u64, refill: u64) -> Option<TokenBucketConfig> {
        Some(TokenBucketConfig {
            size,
            one_time_burst: 0,
            refill_time: refill,
        })
    }

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

    /// A runtime with one drive per `(id, image, read_only)` and no vCPU.
    pub(crate) fn runtime(drives: &[(&str, &Path, bool)]) -> Runtime {
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
        let blocks = configs
            .iter()
            .map(|c| {
                let b = Block::new(c.device.clone(), mem.clone()).unwrap();
                (c.device.id.clone(), Arc::new(Mutex::new(b)))
            })
            .collect();
        let config = VmmConfig {
            kernel: "/vmlinux".into(),
            initramfs: None,
            boot_args: None,
            cmdline_extra: None,
            mem_mib: 1,
            vcpus: 1,
            nets: Vec::new(),
            drives: configs,
            metrics: None,
            logger: Default::default(),
            host_quirks: crate::config::HostQuirks::Off,
            seccomp: crate::process::seccomp::SeccompMode::Off,
        };
        Runtime {
            id: "vm0".into(),
            config,
            pause: Arc::new(PauseGate::new()),
            vcpus: Vec::new(),
            metrics: None,
            i8042: Arc::new(Mutex::new(I8042::new().unwrap())),
            nets: Vec::new(),
            drives: blocks,
        }
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

    fn capacity(rt: &Runtime, index: usize) -> u64 {
        lock(&rt.drives[index].1).capacity()
    }

    #[test]
    fn a_new_image_is_asked_for_opened_and_put_in_use() {
        let dir = Scratch::new("swap");
        let (a, b) = (dir.image("a.img", 8), dir.image("b.img", 8));
        let (bigger, ro_new) = (dir.image("bigger.img", 40), dir.image("ro-new.img", 24));
        let mut rt = runtime(&[("rootfs", &a, false), ("data", &b, true)]);
        // The first trip opens nothing and says how to open the image.
        let body = json!({"drive_id": "rootfs", "path_on_host": bigger});
        match rt.serve(patch("rootfs", body.clone()), None) {
            Answer::Open { path, read_only } => {
                assert_eq!((path, read_only), (bigger.clone(), false));
            }
            Answer::Reply(r) => panic!("{r:?}"),
        }
        assert_eq!(capacity(&rt, 0), 8);
        let r = reply(patch_image(&mut rt, "rootfs", body));
        assert_eq!(r.status, 204, "{r:?}");
        assert_eq!(capacity(&rt, 0), 40);
        assert_eq!(lock(&rt.drives[0].1).config().path, bigger);
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
        assert_eq!(capacity(&rt, 1), 24);
        assert_eq!(rt.config().drives[1].device.path, ro_new);
    }

    #[test]
    fn a_bad_patch_is_refused_with_its_reason_and_changes_nothing() {
        let dir = Scratch::new("bad");
        let (a, b) = (dir.image("a.img", 8), dir.image("b.img", 16));
        let elsewhere = dir.image("elsewhere.img", 32);
        let missing = dir.0.join("missing.img");
        let mut rt = runtime(&[("rootfs", &a, false), ("data", &b, false)]);
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
                "drive 'rootfs': invalid type".into(),
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
            assert_eq!(capacity(&rt, 0), 8, "{body}");
            assert_eq!(rt.config().drives[0].device.path, a, "{body}");
            assert_eq!(vm_config(&mut rt)["drives"][0]["path_on_host"], json!(a));
            assert_eq!(lock(&rt.drives[0].1).config_generation(), 0, "{body}");
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
        let mut rt = runtime(&[("rootfs", &a, false)]);
        // The host grows the file and says so.
        std::fs::OpenOptions::new()
            .write(true)
            .open(&a)
            .unwrap()
            .set_len(64 * 512)
            .unwrap();
        let body = json!({"drive_id": "rootfs", "path_on_host": a});
        assert_eq!(reply(patch_image(&mut rt, "rootfs", body)).status, 204);
        assert_eq!(capacity(&rt, 0), 64);
        assert_eq!(lock(&rt.drives[0].1).config_generation(), 1);
        assert_eq!(rt.config().drives[0].device.path, a);
    }

    #[test]
    fn a_drives_rate_limiter_changes_alone() {
        let dir = Scratch::new("limiter");
        let a = dir.image("a.img", 8);
        let mut rt = runtime(&[("rootfs", &a, false)]);
        let body = json!({"drive_id": "rootfs",
                          "rate_limiter": {"bandwidth": {"size": 5000, "refill_time": 100}}});
        // No image is asked for.
        assert_eq!(reply(rt.serve(patch("rootfs", body), None)).status, 204);
        let want = RateLimiterConfig {
            bandwidth: bucket(5000, 100),
            ops: None,
        };
        assert_eq!(rt.config().drives[0].device.rate_limiter, want);
        assert_eq!(lock(&rt.drives[0].1).config().rate_limiter, want);
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
        let l = lock(&rt.drives[0].1).config().rate_limiter;
        assert_eq!((l.bandwidth, l.ops), (None, bucket(10, 1000)));
        assert_eq!(rt.config().drives[0].device.rate_limiter, l);
        // Image and limiter in one request.
        let b = dir.image("b.img", 16);
        let body = json!({"drive_id": "rootfs", "path_on_host": b,
                          "rate_limiter": {"ops": {"size": 0, "refill_time": 0}}});
        assert_eq!(reply(patch_image(&mut rt, "rootfs", body)).status, 204);
        assert_eq!(capacity(&rt, 0), 16);
        assert!(rt.config().drives[0].device.rate_limiter.is_unlimited());
    }
}
