// SPDX-License-Identifier: Apache-2.0
//! Output: netperf-like text and the JSON object of the `--json` contract.
//!
//! The text follows netperf's layout (a "MIGRATED ... TEST" banner, then a column block) so
//! people who read netperf output can read ours; it adds lines netperf lacks (latency
//! percentiles, UDP loss). The JSON always has `test`, `elapsed_s`, and `throughput_mbps` for
//! STREAM tests or `transactions_per_s` and `latency_us` {`mean`,`p50`,`p99`} for RR tests.

use std::fmt::Write as _;
use std::net::SocketAddr;

use serde_json::{json, Value};

use crate::client::{Measured, Outcome, Target};
use crate::proto::TestKind;

fn family(addr: &SocketAddr) -> &'static str {
    if addr.is_ipv6() {
        "AF_INET6"
    } else {
        "AF_INET"
    }
}

/// The banner netperf prints before a test starts.
pub fn banner(test: TestKind, host: &str, server: &Target) -> String {
    let what = match test {
        TestKind::TcpStream => "TCP STREAM",
        TestKind::TcpMaerts => "TCP MAERTS",
        TestKind::TcpRr => "TCP REQUEST/RESPONSE",
        TestKind::UdpStream => "UDP STREAM",
        TestKind::UdpRr => "UDP REQUEST/RESPONSE",
        TestKind::VsockStream => "VSOCK STREAM",
        TestKind::VsockMaerts => "VSOCK MAERTS",
        TestKind::VsockRr => "VSOCK REQUEST/RESPONSE",
    };
    let server = match server {
        Target::Ip(a) => a,
        Target::Vsock(peer, port) => {
            return format!(
                "MIGRATED {what} TEST from port 0 AF_VSOCK to {host} ({}) port {port} AF_VSOCK",
                peer.describe()
            )
        }
    };
    let (any, af) = if server.is_ipv6() {
        ("::", family(server))
    } else {
        ("0.0.0.0", family(server))
    };
    format!(
        "MIGRATED {what} TEST from {any} ({any}) port 0 {af} to {host} ({}) port {} {af}",
        server.ip(),
        server.port()
    )
}

/// 10^6 bits per second.
fn mbps(bytes: u64, secs: f64) -> f64 {
    if secs > 0.0 {
        bytes as f64 * 8.0 / secs / 1e6
    } else {
        0.0
    }
}

/// Rounds to 3 decimals so the JSON carries no false precision.
fn r3(v: f64) -> f64 {
    (v * 1000.0).round() / 1000.0
}

/// The column headings netperf prints above a TCP stream result.
const STREAM_HEADER: &str = "\
Recv   Send    Send
Socket Socket  Message  Elapsed
Size   Size    Size     Time     Throughput
bytes  bytes   bytes    secs.    10^6bits/sec

";
/// The column headings above a UDP stream result.
const UDP_STREAM_HEADER: &str = "\
Socket  Message  Elapsed      Messages
Size    Size     Time         Okay Errors   Throughput
bytes   bytes    secs            #      #   10^6bits/sec

";
/// The column headings above a request/response result.
const RR_HEADER: &str = "\
Local /Remote
Socket Size   Request  Resp.   Elapsed  Trans.
Send   Recv   Size     Size    Time     Rate
bytes  Bytes  bytes    bytes   secs.    per sec

";

/// The column block netperf prints after a test.
pub fn text(o: &Outcome) -> String {
    let secs = o.elapsed.as_secs_f64();
    let z = &o.sizes;
    let mut s = String::new();
    // `write!` into a String cannot fail.
    match (&o.measured, o.params.test.stream_kind()) {
        (Measured::Stream(m), TestKind::TcpStream | TestKind::TcpMaerts) => {
            let (recv, send) = if o.params.test.stream_kind() == TestKind::TcpStream {
                (z.remote_recv, z.local_send)
            } else {
                (z.local_recv, z.remote_send)
            };
            s.push_str(STREAM_HEADER);
            let _ = writeln!(
                s,
                "{recv:<6} {send:<7} {:<8} {secs:<8.2} {:>10.2}",
                o.params.msg_size,
                mbps(m.bytes_received, secs)
            );
        }
        (Measured::Stream(m), _) => {
            let lost = m.messages_sent.saturating_sub(m.messages_received);
            let rsecs = secs.max(m.receive_span.as_secs_f64());
            s.push_str(UDP_STREAM_HEADER);
            let _ = writeln!(
                s,
                "{:<7} {:<8} {secs:<8.2} {:>10} {:>6} {:>10.2}",
                z.local_send,
                o.params.msg_size,
                m.messages_sent,
                m.send_errors,
                mbps(m.bytes_sent, secs)
            );
            let _ = writeln!(
                s,
                "{:<7} {:<8} {rsecs:<8.2} {:>10} {:>6} {:>10.2}",
                z.remote_recv,
                "",
                m.messages_received,
                "",
                mbps(m.bytes_received, rsecs)
            );
            if rsecs > secs {
                let _ = writeln!(
                    s,
                    "\nThe receiver took in datagrams for {rsecs:.2} s (its backlog drained for \
                     {:.2} s after sending stopped); received throughput is over that time",
                    m.drain.as_secs_f64()
                );
            }
            let _ = writeln!(
                s,
                "\nLost: {lost} of {} datagrams ({:.2} %); throughput counts received data only",
                m.messages_sent,
                loss_percent(m.messages_sent, m.messages_received)
            );
        }
        (Measured::Rr(r), _) => {
            let tps = r.transactions as f64 / secs.max(f64::MIN_POSITIVE);
            s.push_str(RR_HEADER);
            let _ = writeln!(
                s,
                "{:<6} {:<6} {:<8} {:<7} {secs:<8.2} {tps:.2}",
                z.local_send, z.local_recv, o.params.req_size, o.params.resp_size
            );
            let _ = writeln!(s, "{:<6} {:<6}", z.remote_send, z.remote_recv);
            let _ = writeln!(s);
            let l = &r.latency;
            let _ = writeln!(
                s,
                "Latency usec: mean {:.2}  p50 {:.2}  p99 {:.2}  (min {:.2} max {:.2}, {} transactions)",
                l.mean_us().unwrap_or(0.0),
                l.percentile_us(0.5).unwrap_or(0.0),
                l.percentile_us(0.99).unwrap_or(0.0),
                l.min_us().unwrap_or(0.0),
                l.max_us().unwrap_or(0.0),
                r.transactions
            );
            if o.params.test == TestKind::UdpRr {
                let _ = writeln!(
                    s,
                    "Lost: {} requests without a response within {} ms; {} late or stray responses",
                    r.lost,
                    o.udp_timeout.as_millis(),
                    r.late
                );
            }
        }
    }
    s
}

fn loss_percent(sent: u64, received: u64) -> f64 {
    if sent == 0 {
        0.0
    } else {
        sent.saturating_sub(received) as f64 * 100.0 / sent as f64
    }
}

/// The `--json` object.
pub fn json(o: &Outcome, host: &str) -> Value {
    let secs = o.elapsed.as_secs_f64();
    let z = &o.sizes;
    let mut v = json!({
        "test": o.params.test.name(),
        "host": host,
        "server": o.server.to_string(),
        "duration_s": o.params.duration.as_secs_f64(),
        "elapsed_s": r3(secs),
        "local_send_socket_size": z.local_send,
        "local_recv_socket_size": z.local_recv,
        "remote_send_socket_size": z.remote_send,
        "remote_recv_socket_size": z.remote_recv,
    });
    let extra = match &o.measured {
        Measured::Stream(m) => {
            let rsecs = secs.max(m.receive_span.as_secs_f64());
            let mut e = json!({
                "message_size": o.params.msg_size,
                "bytes": m.bytes_received,
                "bytes_sent": m.bytes_sent,
                "bytes_received": m.bytes_received,
                "throughput_mbps": r3(mbps(m.bytes_received, rsecs)),
            });
            if o.params.test == TestKind::UdpStream {
                e["drain_s"] = r3(m.drain.as_secs_f64()).into();
                e["receive_span_s"] = r3(m.receive_span.as_secs_f64()).into();
                e["messages_sent"] = m.messages_sent.into();
                e["messages_received"] = m.messages_received.into();
                e["messages_lost"] = m.messages_sent.saturating_sub(m.messages_received).into();
                e["loss_percent"] = r3(loss_percent(m.messages_sent, m.messages_received)).into();
                e["send_errors"] = m.send_errors.into();
                e["send_throughput_mbps"] = r3(mbps(m.bytes_sent, secs)).into();
            }
            e
        }
        Measured::Rr(r) => {
            let l = &r.latency;
            // `run` refuses RR outcomes without transactions, so these are all numbers.
            let us = |x: Option<f64>| x.map_or(Value::Null, |x| r3(x).into());
            let mut e = json!({
                "request_size": o.params.req_size,
                "response_size": o.params.resp_size,
                "transactions": r.transactions,
                "transactions_per_s": r3(r.transactions as f64 / secs.max(f64::MIN_POSITIVE)),
                "latency_us": {
                    "mean": us(l.mean_us()),
                    "p50": us(l.percentile_us(0.5)),
                    "p99": us(l.percentile_us(0.99)),
                    "min": us(l.min_us()),
                    "max": us(l.max_us()),
                },
            });
            if o.params.test == TestKind::UdpRr {
                e["lost"] = r.lost.into();
                e["late"] = r.late.into();
                e["timeout_ms"] = (o.udp_timeout.as_millis() as u64).into();
            }
            e
        }
    };
    if let (Value::Object(base), Value::Object(more)) = (&mut v, extra) {
        base.extend(more);
    }
    v
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::client::{RrResult, SockSizes, StreamResult};
    use crate::proto::TestParams;

    fn outcome(test: TestKind, measured: Measured) -> Outcome {
        Outcome {
            params: TestParams {
                test,
                duration: Duration::from_secs(2),
                msg_size: 1000,
                req_size: 1,
                resp_size: 1,
            },
            server: Target::Ip("127.0.0.1:12865".parse().expect("addr")),
            elapsed: Duration::from_secs(2),
            sizes: SockSizes::default(),
            udp_timeout: Duration::from_millis(250),
            measured,
        }
    }

    /// A UDP_STREAM that sent 2,000 messages (2 MB) and got half of them
    /// through, draining for `drain`, received over `receive_span`.
    fn half_lost_udp_stream(drain: Duration, receive_span: Duration) -> Outcome {
        outcome(
            TestKind::UdpStream,
            Measured::Stream(StreamResult {
                bytes_sent: 2_000_000,
                bytes_received: 1_000_000,
                messages_sent: 2000,
                messages_received: 1000,
                send_errors: 0,
                drain,
                receive_span,
            }),
        )
    }

    #[test]
    fn stream_json_uses_received_bytes() {
        let o = half_lost_udp_stream(Duration::ZERO, Duration::from_secs(2));
        let v = json(&o, "127.0.0.1");
        assert_eq!(v["throughput_mbps"], 4.0);
        assert_eq!(v["send_throughput_mbps"], 8.0);
        assert_eq!(v["loss_percent"], 50.0);
        assert_eq!(v["test"], "UDP_STREAM");
        assert!(text(&o).contains("Lost: 1000 of 2000"));
    }

    #[test]
    fn udp_stream_received_throughput_is_over_the_receive_span() {
        let o = half_lost_udp_stream(Duration::from_secs(2), Duration::from_secs(4));
        let v = json(&o, "127.0.0.1");
        // 1 MB received over 2 s of sending plus 2 s of draining.
        assert_eq!(v["throughput_mbps"], 2.0);
        assert_eq!(v["send_throughput_mbps"], 8.0);
        assert_eq!(v["drain_s"], 2.0);
        assert!(text(&o).contains("for 4.00 s"), "{}", text(&o));
    }

    #[test]
    fn rr_json_has_latency_object() {
        let mut r = RrResult::default();
        for us in [10, 20, 30] {
            r.latency.record(Duration::from_micros(us));
        }
        r.transactions = 3;
        let o = outcome(TestKind::TcpRr, Measured::Rr(r));
        let v = json(&o, "h");
        assert_eq!(v["transactions_per_s"], 1.5);
        assert_eq!(v["latency_us"]["mean"], 20.0);
        // Percentiles come from histogram buckets: within 1/64 of the sample.
        let p50 = v["latency_us"]["p50"].as_f64().expect("p50");
        let p99 = v["latency_us"]["p99"].as_f64().expect("p99");
        assert!((p50 - 20.0).abs() <= 20.0 / 64.0, "{p50}");
        assert!((p99 - 30.0).abs() <= 30.0 / 64.0, "{p99}");
        assert!(v.get("throughput_mbps").is_none());
    }

    #[test]
    fn banner_reads_like_netperf() {
        let a: SocketAddr = "127.0.0.1:12865".parse().expect("addr");
        assert_eq!(
            banner(TestKind::TcpStream, "127.0.0.1", &Target::Ip(a)),
            "MIGRATED TCP STREAM TEST from 0.0.0.0 (0.0.0.0) port 0 AF_INET to 127.0.0.1 \
             (127.0.0.1) port 12865 AF_INET"
        );
        let v = Target::Vsock(crate::vsock::VsockPeer::Uds("/run/v.sock".into()), 12865);
        assert_eq!(
            banner(TestKind::VsockRr, "guest", &v),
            "MIGRATED VSOCK REQUEST/RESPONSE TEST from port 0 AF_VSOCK to guest (vsock through \
             /run/v.sock) port 12865 AF_VSOCK"
        );
    }
}
