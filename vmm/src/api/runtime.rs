// SPDX-License-Identifier: Apache-2.0
//! The API once the VM runs: requests served on the event loop.
//!
//! The API thread hands each routed request to the event loop through a
//! channel and kicks an eventfd; [`Runtime::handle`] answers it there,
//! between two device passes, so a request never races the devices it
//! changes and no state is shared with the API thread. Each request is
//! bounded work: a pause waits at most [`PAUSE_TIMEOUT`] for the vCPUs to
//! park, a limiter change swaps buckets, a metrics flush writes one line
//! without blocking.

use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use devices::legacy::i8042::I8042;
use devices::rate_limiter::{RateLimiterConfig, TokenBucketConfig};
use devices::virtio::net::Net;
use serde::Deserialize;
use serde_json::{json, Value};

use super::http::Response;
use super::preboot::{instance_info, version};
use super::routes::{Action, ApiRequest, VmState};
use crate::config::{file, VmmConfig};
use crate::metrics::{lock_metrics, Metrics};
use crate::pause::{kick_all, PauseGate};

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

/// What the running VM's API can reach.
pub struct Runtime {
    id: String,
    config: VmmConfig,
    pause: Arc<PauseGate>,
    vcpus: Vec<JoinHandle<()>>,
    metrics: Option<Arc<Mutex<Metrics>>>,
    i8042: Arc<Mutex<I8042>>,
    nets: Vec<(String, Arc<Mutex<Net>>)>,
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
    /// The running VM `id` built from `config`: its vCPU threads (which
    /// honour `pause`), metrics, keyboard controller and network cards.
    pub fn new(
        id: String,
        config: VmmConfig,
        pause: Arc<PauseGate>,
        vcpus: Vec<JoinHandle<()>>,
        metrics: Option<Arc<Mutex<Metrics>>>,
        i8042: Arc<Mutex<I8042>>,
        nets: Vec<(String, Arc<Mutex<Net>>)>,
    ) -> Self {
        Runtime {
            id,
            config,
            pause,
            vcpus,
            metrics,
            i8042,
            nets,
        }
    }

    /// The configuration in force (limiter changes included).
    pub fn config(&self) -> &VmmConfig {
        &self.config
    }

    /// Answers one request.
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
            ApiRequest::PatchDrive(..) => Response::fault(
                "PATCH /drives is not supported by minivmm: a drive's image and limiter are \
                 fixed at start",
            ),
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
        let Some(index) = self.config.nets.iter().position(|n| n.id == id) else {
            return Response::fault(&format!("no network interface '{id}'"));
        };
        let Some(dev) = self
            .nets
            .iter()
            .find(|(n, _)| n == id)
            .map(|(_, d)| d.clone())
        else {
            return Response::fault(&format!("no network interface '{id}'"));
        };
        let current = &self.config.nets[index].device;
        let new = |what: &str, cur: &RateLimiterConfig, v: Option<Value>| {
            v.map(|v| updated_limiter(what, cur, v)).transpose()
        };
        let rx = match new(
            "rx_rate_limiter",
            &current.rx_rate_limiter,
            patch.rx_rate_limiter,
        ) {
            Ok(l) => l,
            Err(e) => return Response::fault(&format!("network interface '{id}': {e}")),
        };
        let tx = match new(
            "tx_rate_limiter",
            &current.tx_rate_limiter,
            patch.tx_rate_limiter,
        ) {
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
