// SPDX-License-Identifier: Apache-2.0
//! Firecracker's balloon paths once the VM runs: [`runtime`] answers the
//! [`BalloonRequest`]s `routes` made of them (`preboot` answers them
//! before boot).
//!
//! | path | method | before boot | after |
//! |---|---|---|---|
//! | `/balloon` | PUT | the config file's `balloon` section, replaced | refused |
//! | `/balloon` | GET | what was put (`400` without a balloon) | the device's configuration, its target as last set |
//! | `/balloon` | PATCH | refused | the target (`amount_mib`) |
//! | `/balloon/statistics` | GET | refused | the latest statistics with the target and actual sizes |
//! | `/balloon/statistics` | PATCH | refused | the polling interval |
//! | `/balloon/hinting/start` | PATCH | refused | a hinting run (`acknowledge_on_stop`, true by default) |
//! | `/balloon/hinting/status` | GET | refused | the host's and the guest's last commands |
//! | `/balloon/hinting/stop` | PATCH | refused | DONE |
//!
//! After boot a request reaches the device through its control in the
//! registry ([`DeviceControl::balloon`](crate::control::DeviceControl::balloon)),
//! on the event loop's thread between two passes; the target and interval
//! it sets are written back into the configuration `GET /vm/config` shows.
//! The bodies and refusals are Firecracker's (`BalloonUpdate`,
//! `BalloonStatsUpdate`, `BalloonStartCmd`, unknown fields refused).

use devices::virtio::balloon::BalloonError;
use serde::Serialize;

use super::http::Response;
use super::routes::{BalloonRequest, NO_BALLOON};
use crate::config::balloon::{render, BALLOON_ID};
use crate::config::{DeviceKind, VmmConfig};
use crate::control::Controls;
use crate::registry::lock;

/// The fault of a balloon request on a VM without a balloon.
fn no_balloon() -> Response {
    Response::fault(NO_BALLOON)
}

/// What the running VM answers, through the balloon's control; a target
/// or interval it sets is written back into `config`.
pub fn runtime(req: BalloonRequest, config: &mut VmmConfig, devices: &Controls) -> Response {
    let Some(control) = devices.get(DeviceKind::Balloon, BALLOON_ID) else {
        return no_balloon();
    };
    let mut control = lock(control);
    let Some(b) = control.balloon() else {
        return no_balloon();
    };
    let r = match req {
        BalloonRequest::Get => Response::json(render(&b.config()).to_string()),
        BalloonRequest::Patch(mib) => answer(b.set_target(mib).map(|()| None::<()>)),
        BalloonRequest::GetStats => answer(b.latest_stats().map(Some)),
        BalloonRequest::PatchStats(s) => answer(b.set_stats_interval(s).map(|()| None::<()>)),
        BalloonRequest::StartHinting(ack) => answer(b.start_hinting(ack).map(|()| None::<()>)),
        BalloonRequest::HintingStatus => answer(b.hinting_status().map(Some)),
        BalloonRequest::StopHinting => answer(b.stop_hinting().map(|()| None::<()>)),
    };
    if r.status == 204 {
        config.balloon = Some(b.config());
    }
    r
}

/// A device call's answer: `200` with the body it returned, `204` for
/// none, `400` with the reason it gave.
fn answer<T: Serialize>(r: Result<Option<T>, BalloonError>) -> Response {
    match r {
        // Plain structs of integers: serializing cannot fail.
        Ok(Some(v)) => Response::json(serde_json::to_string(&v).unwrap_or_default()),
        Ok(None) => Response::no_content(),
        Err(e) => Response::fault(&crate::error_line(&e)),
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use devices::virtio::balloon::{Balloon, BalloonConfig};
    use devices::virtio::test_utils::{guest_memory, DeviceRig};
    use devices::virtio::VirtioDevice;
    use serde_json::json;

    use super::*;
    use crate::api::http::{Method, Request};
    use crate::api::preboot::{Preboot, Step};
    use crate::api::routes::ApiRequest;
    use crate::config::file;
    use serde_json::Value;

    fn req(method: Method, path: &str, body: &str) -> Request {
        Request {
            method,
            path: path.into(),
            body: body.as_bytes().to_vec(),
            close: false,
        }
    }

    fn route_of(method: Method, path: &str, body: &str) -> Result<ApiRequest, String> {
        super::super::routes::route(&req(method, path, body))
    }

    fn body(r: &Response) -> Value {
        serde_json::from_str(r.body.as_deref().expect("a body")).expect("JSON")
    }

    #[track_caller]
    fn fault_of(r: &Response) -> String {
        assert_eq!(r.status, 400, "{r:?}");
        body(r)["fault_message"].as_str().unwrap().to_string()
    }

    #[test]
    fn every_balloon_path_routes_with_firecrackers_bodies() {
        use BalloonRequest as B;
        use Method::*;
        let ok = [
            (Get, "/balloon", "", ApiRequest::Balloon(B::Get)),
            (
                Put,
                "/balloon",
                r#"{"amount_mib":1,"deflate_on_oom":false}"#,
                ApiRequest::PutBalloon(json!({"amount_mib": 1, "deflate_on_oom": false})),
            ),
            (
                Patch,
                "/balloon",
                r#"{"amount_mib":64}"#,
                ApiRequest::Balloon(B::Patch(64)),
            ),
            (
                Get,
                "/balloon/statistics",
                "",
                ApiRequest::Balloon(B::GetStats),
            ),
            (
                Patch,
                "/balloon/statistics",
                r#"{"stats_polling_interval_s":5}"#,
                ApiRequest::Balloon(B::PatchStats(5)),
            ),
            (
                Patch,
                "/balloon/hinting/start",
                "",
                ApiRequest::Balloon(B::StartHinting(true)),
            ),
            (
                Patch,
                "/balloon/hinting/start",
                "{}",
                ApiRequest::Balloon(B::StartHinting(true)),
            ),
            (
                Patch,
                "/balloon/hinting/start",
                r#"{"acknowledge_on_stop":false}"#,
                ApiRequest::Balloon(B::StartHinting(false)),
            ),
            (
                Get,
                "/balloon/hinting/status",
                "",
                ApiRequest::Balloon(B::HintingStatus),
            ),
            (
                Patch,
                "/balloon/hinting/stop",
                "{}",
                ApiRequest::Balloon(B::StopHinting),
            ),
            (
                Patch,
                "/balloon/hinting/stop/",
                "",
                ApiRequest::Balloon(B::StopHinting),
            ),
        ];
        for (m, path, b, want) in ok {
            assert_eq!(route_of(m, path, b), Ok(want), "{path} {b}");
        }
        let refused = [
            (
                Put,
                "/balloon/statistics",
                "{}",
                "invalid request method PUT for /balloon/statistics",
            ),
            (
                Get,
                "/balloon/hinting/start",
                "",
                "invalid request method GET",
            ),
            (
                Patch,
                "/balloon/hinting/status",
                "",
                "invalid request method PATCH",
            ),
            (Get, "/balloon/nope", "", "unknown path /balloon/nope"),
            (Get, "/balloon/hinting", "", "unknown path /balloon/hinting"),
            (Get, "/balloon/hinting/start/x", "", "unknown path"),
            (Get, "/balloon", "{}", "GET /balloon takes no body"),
            (Patch, "/balloon", r#"{"amount_mib":-1}"#, "invalid body"),
            (
                Patch,
                "/balloon",
                r#"{"amount_mib":1,"deflate_on_oom":true}"#,
                "unknown field",
            ),
            (Patch, "/balloon", "", "needs a JSON body"),
            (Patch, "/balloon/statistics", r#"{}"#, "missing field"),
            (
                Patch,
                "/balloon/hinting/start",
                r#"{"ack":true}"#,
                "unknown field",
            ),
            (Put, "/balloon", "", "needs a JSON body"),
        ];
        for (m, path, b, want) in refused {
            let e = route_of(m, path, b).unwrap_err();
            assert!(e.contains(want), "{path} {b}: {e}");
        }
    }

    fn reply(p: &mut Preboot, r: ApiRequest) -> Response {
        match p.handle(r, "vm0") {
            Step::Reply(r) => r,
            Step::Start(_) => panic!("started"),
            Step::Load(_) => panic!("loaded a snapshot"),
        }
    }

    #[test]
    fn before_boot_the_balloon_is_put_shown_and_checked_and_nothing_else_runs() {
        let mut p = Preboot::new();
        let get = || ApiRequest::Balloon(BalloonRequest::Get);
        assert!(fault_of(&reply(&mut p, get())).contains("no balloon device is configured"));
        let put = |v: Value| ApiRequest::PutBalloon(v);
        let r = reply(
            &mut p,
            put(json!({"amount_mib": 300, "deflate_on_oom": true})),
        );
        assert_eq!(
            fault_of(&r),
            "balloon: amount_mib 300 is more than the guest's 128 MiB of memory"
        );
        let r = reply(
            &mut p,
            put(json!({"amount_mib": 64, "deflate_on_oom": true, "x": 1})),
        );
        assert!(fault_of(&r).contains("unknown field `x`"), "{r:?}");
        let r = reply(
            &mut p,
            put(json!({"amount_mib": 64, "deflate_on_oom": true, "stats_polling_interval_s": 2})),
        );
        assert_eq!(r.status, 204);
        let want = json!({"amount_mib": 64, "deflate_on_oom": true,
            "stats_polling_interval_s": 2, "free_page_hinting": false,
            "free_page_reporting": false});
        assert_eq!(body(&reply(&mut p, get())), want);
        let cfg = body(&reply(&mut p, ApiRequest::GetVmConfig));
        assert_eq!(cfg["balloon"], want, "with Firecracker's defaults");
        // The document boots what it shows.
        let s = file::parse(&cfg.to_string()).unwrap();
        assert_eq!(s.balloon.map(|b| b.config().amount_mib), Some(64));
        for (r, what) in [
            (BalloonRequest::Patch(1), "PATCH /balloon"),
            (BalloonRequest::GetStats, "GET /balloon/statistics"),
            (BalloonRequest::PatchStats(1), "PATCH /balloon/statistics"),
            (
                BalloonRequest::StartHinting(true),
                "PATCH /balloon/hinting/start",
            ),
            (BalloonRequest::HintingStatus, "GET /balloon/hinting/status"),
            (BalloonRequest::StopHinting, "PATCH /balloon/hinting/stop"),
        ] {
            let e = fault_of(&reply(&mut p, ApiRequest::Balloon(r)));
            assert!(
                e.starts_with(what) && e.contains("not allowed before"),
                "{e}"
            );
        }
    }

    #[test]
    fn a_balloon_and_hugetlbfs_pages_are_refused_in_either_order() {
        let huge = |pages: &str| {
            ApiRequest::PatchMachineConfig(json!({"vcpu_count": 1, "mem_size_mib": 128,
                                                  "huge_pages": pages}))
        };
        let balloon = || ApiRequest::PutBalloon(json!({"amount_mib": 0, "deflate_on_oom": false}));
        let incompatible = "huge pages support is incompatible with memory ballooning";
        let mut p = Preboot::new();
        assert_eq!(reply(&mut p, huge("2M")).status, 204);
        assert!(fault_of(&reply(&mut p, balloon())).contains(incompatible));
        assert_eq!(reply(&mut p, huge("None")).status, 204);
        assert_eq!(reply(&mut p, balloon()).status, 204);
        assert!(fault_of(&reply(&mut p, huge("2M"))).contains(incompatible));
        // The refused request changed nothing.
        let cfg = body(&reply(&mut p, ApiRequest::GetVmConfig));
        assert_eq!(cfg["machine-config"]["huge_pages"], "None", "{cfg}");
    }

    /// A configuration with a balloon and the device behind its control.
    fn running(cfg: BalloonConfig) -> (VmmConfig, Controls, DeviceRig<Balloon>) {
        let doc = json!({
            "boot-source": {"kernel_image_path": "k"},
            "machine-config": {"vcpu_count": 1, "mem_size_mib": 32},
            "balloon": render(&cfg),
        });
        let config = file::parse(&doc.to_string()).unwrap().finish().unwrap();
        let mem = guest_memory(32 << 20).unwrap();
        let rig = DeviceRig::new(&mem, Balloon::new(cfg, mem.clone()).unwrap());
        let mut controls = Controls::new();
        let control: Arc<Mutex<dyn crate::control::DeviceControl>> = rig.dev.clone();
        controls.add(DeviceKind::Balloon, BALLOON_ID, control);
        (config, controls, rig)
    }

    #[test]
    fn after_boot_requests_reach_the_device_and_the_configuration_follows() {
        let cfg = BalloonConfig {
            amount_mib: 4,
            stats_polling_interval_s: 10,
            free_page_hinting: true,
            ..BalloonConfig::default()
        };
        let (mut config, controls, mut rig) = running(cfg);
        let mut call = |r: BalloonRequest| runtime(r, &mut config, &controls);
        // The driver has not started the device yet: Firecracker refuses.
        let e = fault_of(&call(BalloonRequest::Patch(8)));
        assert!(e.contains("not activated"), "{e}");
        let offered = rig.dev().avail_features();
        rig.drv.init(offered).unwrap();
        rig.run_until_idle();
        let r = call(BalloonRequest::Patch(8));
        assert_eq!(r.status, 204, "{r:?}");
        let got = body(&call(BalloonRequest::Get));
        assert_eq!(got["amount_mib"], 8);
        assert_eq!(got["stats_polling_interval_s"], 10);
        let e = fault_of(&call(BalloonRequest::Patch(33)));
        assert!(e.contains("more than the guest's 32 MiB"), "{e}");
        let schema = minivmm_tests::fc_schema::validate;
        assert_eq!(schema("Balloon", &got), Ok(()));
        let stats = body(&call(BalloonRequest::GetStats));
        assert_eq!(schema("BalloonStats", &stats), Ok(()));
        assert_eq!(
            stats,
            json!({"target_pages": 2048, "actual_pages": 0, "target_mib": 8, "actual_mib": 0})
        );
        assert_eq!(call(BalloonRequest::PatchStats(3)).status, 204);
        let e = fault_of(&call(BalloonRequest::PatchStats(0)));
        assert!(e.contains("cannot be turned on or off"), "{e}");
        assert_eq!(call(BalloonRequest::StartHinting(true)).status, 204);
        let status = body(&call(BalloonRequest::HintingStatus));
        assert_eq!(status, json!({"host_cmd": 2}));
        assert_eq!(schema("BalloonHintingStatus", &status), Ok(()));
        assert_eq!(call(BalloonRequest::StopHinting).status, 204);
        assert_eq!(
            body(&call(BalloonRequest::HintingStatus)),
            json!({"host_cmd": 1})
        );
        let b = config.balloon.unwrap();
        assert_eq!((b.amount_mib, b.stats_polling_interval_s), (8, 3));
        let shown = crate::config::render::to_file_json(&config);
        assert_eq!(shown["balloon"]["amount_mib"], 8);
    }

    #[test]
    fn after_boot_without_a_balloon_or_its_features_each_request_says_why() {
        let (mut config, _, _rig) = running(BalloonConfig::default());
        let none = Controls::new();
        let e = fault_of(&runtime(BalloonRequest::Get, &mut config, &none));
        assert!(e.contains("no balloon device is configured"), "{e}");
        let (mut config, controls, mut rig) = running(BalloonConfig::default());
        let offered = rig.dev().avail_features();
        rig.drv.init(offered).unwrap();
        rig.run_until_idle();
        let mut call = |r: BalloonRequest| fault_of(&runtime(r, &mut config, &controls));
        assert!(call(BalloonRequest::GetStats).contains("statistics are not enabled"));
        assert!(call(BalloonRequest::StartHinting(true)).contains("hinting is not enabled"));
        assert!(call(BalloonRequest::HintingStatus).contains("hinting is not enabled"));
        assert!(call(BalloonRequest::StopHinting).contains("hinting is not enabled"));
        assert!(call(BalloonRequest::PatchStats(2)).contains("cannot be turned on or off"));
    }
}
