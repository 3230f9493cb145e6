// SPDX-License-Identifier: Apache-2.0
//! MMDS through the whole device, from the driver side: the guest's frames
//! to the MMDS address leave the TX ring and never reach the backend, the
//! answers arrive in RX buffers ahead of the backend's frames, and a card
//! without MMDS passes the same frames to the backend untouched.

use std::sync::{Arc, Mutex};

use serde_json::json;

use super::fixture::*;
use crate::mmds::guest::{read_reply, GuestClient, Reply};
use crate::mmds::packet::flags::{ACK, FIN, PSH, SYN};
use crate::mmds::{lock, Mmds, MmdsStack, MmdsVersion, SharedMmds, DEFAULT_IPV4, MMDS_MAC};
use crate::virtio::net::NetConfig;

const IP: [u8; 4] = DEFAULT_IPV4;

fn rig(version: MmdsVersion) -> (NetFixture, SharedMmds) {
    rig_with(version, MRG_FEATURES)
}

fn rig_with(version: MmdsVersion, features: u64) -> (NetFixture, SharedMmds) {
    let h = NetFixture::new(NetConfig::default(), features);
    let mmds = Arc::new(Mutex::new(Mmds::new(crate::mmds::DEFAULT_SIZE_LIMIT)));
    lock(&mmds)
        .put(json!({"latest":{"meta-data":{"ami-id":"ami-1"}},"user-data":"hello"}))
        .expect("fits");
    lock(&mmds).configure(version, false);
    h.dev().set_mmds(Some(MmdsStack::new(IP, mmds.clone())));
    (h, mmds)
}

/// Keeps `n` one-buffer RX chains posted.
fn keep_rx(h: &mut NetFixture, n: usize) {
    while h.rx_chains.len() < n {
        h.post_rx_shaped(&[1526], Layout::Direct);
    }
}

/// The guest sends `frame`; what it receives, read as its kernel would.
fn guest_sends(h: &mut NetFixture, c: &GuestClient, frame: &[u8]) -> Vec<Reply> {
    keep_rx(h, 8);
    h.post_tx(frame, &[]);
    h.kick_tx();
    h.run_until_idle();
    h.take_rx_frames()
        .iter()
        .map(|f| read_reply(&f.data, c.mac, c.ip).expect("a well-formed MMDS frame"))
        .collect()
}

#[test]
fn test_arp_answered_and_never_reaches_the_backend() {
    let (mut h, _) = rig(MmdsVersion::V1);
    let c = GuestClient::new(IP, 40000);
    assert_eq!(
        guest_sends(&mut h, &c, &c.arp_request()),
        vec![Reply::Arp {
            mac: MMDS_MAC,
            ip: IP
        }]
    );
    assert!(h.peer_frames().is_empty());
    // The TX chain went back to the guest with length 0, as any sent frame.
    assert_eq!(h.txq.take_used(&h.mem).len(), 1);
    assert_eq!(h.metric(|m| &m.mmds.mmds_rx_frames), 1);
    assert_eq!(h.metric(|m| &m.mmds.mmds_tx_frames), 1);
    // Delivered as any frame: counted, and the pass drained, not starved.
    assert_eq!(h.metric(|m| &m.rx_frames), 1);
    assert_eq!(h.metric(|m| &m.rx_no_avail_buffer), 0);
    assert_eq!(h.metric(|m| &m.tx_frames), 0);
    // Any other frame goes to the backend untouched.
    let f = frame(12 + 100, 7);
    assert_eq!(guest_sends(&mut h, &c, &f), vec![]);
    assert_eq!(h.peer_frames(), vec![f]);
}

#[test]
fn test_a_frame_split_anywhere_is_claimed_all_the_same() {
    let (mut h, _) = rig(MmdsVersion::V1);
    let c = GuestClient::new(IP, 40000);
    let arp = c.arp_request();
    // Cuts inside the EtherType and inside the target address.
    for split in [&[25usize][..], &[12, 13, 26], &[51], &[12, 40, 1]] {
        keep_rx(&mut h, 8);
        h.post_tx(&arp, split);
        h.kick_tx();
        h.run_until_idle();
        let got = h.take_rx_frames();
        assert_eq!(got.len(), 1, "split {split:?}");
        assert_eq!(
            read_reply(&got[0].data, c.mac, c.ip),
            Some(Reply::Arp {
                mac: MMDS_MAC,
                ip: IP
            })
        );
    }
    assert!(h.peer_frames().is_empty());
    // An IPv4 frame to another address, split the same ways, goes out.
    let mut other = c.clone();
    other.mmds_ip = [169, 254, 169, 253];
    let syn = other.segment(SYN, b"", None);
    h.post_tx(&syn, &[25, 17]);
    h.kick_tx();
    h.run_until_idle();
    assert_eq!(h.peer_frames(), vec![syn]);
}

/// Whatever the layout of the guest's buffers (the headers in the first,
/// one short of them, an empty buffer first, cut anywhere), every frame to
/// MMDS is answered and none reaches the backend; frames to others,
/// frames of other kinds and frames too short for any header all go out.
#[test]
fn test_every_layout_of_a_frame_for_mmds_is_claimed() {
    let (mut h, _) = rig(MmdsVersion::V1);
    // (first buffers; the rest of the frame is one more)
    let splits: [&[usize]; 8] = [&[], &[46], &[45], &[0], &[0, 0], &[12], &[26, 20], &[50]];
    for (i, split) in splits.into_iter().enumerate() {
        let c = GuestClient::new(IP, 41000 + i as u16);
        for f in [c.segment(SYN, b"", None), c.arp_request()] {
            keep_rx(&mut h, 8);
            h.post_tx(&f, split);
            h.kick_tx();
            h.run_until_idle();
            let got = h.take_rx_frames();
            assert_eq!(got.len(), 1, "split {split:?}");
            assert!(
                read_reply(&got[0].data, c.mac, c.ip).is_some(),
                "split {split:?}"
            );
        }
        assert!(h.peer_frames().is_empty(), "split {split:?}");
        let mut other = c.clone();
        other.mmds_ip = [10, 0, 0, 9];
        let mut ipv6 = c.segment(SYN, b"", None);
        ipv6[12 + 12..12 + 14].copy_from_slice(&[0x86, 0xdd]);
        let tiny = frame(12 + 20, i as u8);
        for f in [
            other.segment(SYN, b"", None),
            other.arp_request(),
            ipv6,
            tiny,
        ] {
            let fits = split.iter().sum::<usize>() <= f.len();
            h.post_tx(&f, if fits { split } else { &[0] });
            h.kick_tx();
            h.run_until_idle();
            assert_eq!(h.peer_frames(), vec![f], "split {split:?}");
        }
    }
    assert_eq!(h.metric(|m| &m.mmds.mmds_rx_frames), 16);
}

#[test]
fn test_http_get_through_the_rings() {
    let (mut h, mmds) = rig(MmdsVersion::V2);
    let mut c = GuestClient::new(IP, 40000);
    let r = guest_sends(&mut h, &c.clone(), &c.send(SYN, b""));
    let [Reply::Tcp { seq, flags, .. }] = r[..] else {
        panic!("a SYN-ACK, got {r:?}");
    };
    assert_eq!(flags, SYN | ACK);
    c.ack = seq.wrapping_add(1);
    let exchange = |h: &mut NetFixture, c: &mut GuestClient, req: &str| -> String {
        let mut replies = guest_sends(h, &c.clone(), &c.send(ACK | PSH, req.as_bytes()));
        let mut got = Vec::new();
        loop {
            for r in std::mem::take(&mut replies) {
                if let Reply::Tcp { payload, seq, .. } = r {
                    if !payload.is_empty() {
                        assert_eq!(seq, c.ack);
                        c.ack = c.ack.wrapping_add(payload.len() as u32);
                        got.extend_from_slice(&payload);
                    }
                }
            }
            let text = String::from_utf8(got.clone()).expect("ASCII");
            if let Some((head, body)) = text.split_once("\r\n\r\n") {
                let len: usize = head
                    .lines()
                    .find_map(|l| l.strip_prefix("Content-Length: "))
                    .and_then(|v| v.parse().ok())
                    .expect("Content-Length");
                if body.len() == len {
                    return text;
                }
            }
            replies = guest_sends(h, &c.clone(), &c.send(ACK, b""));
            assert!(!replies.is_empty(), "MMDS stopped");
        }
    };
    let resp = exchange(
        &mut h,
        &mut c,
        "PUT /latest/api/token HTTP/1.1\r\nX-metadata-token-ttl-seconds: 60\r\n\r\n",
    );
    let token = resp.split_once("\r\n\r\n").expect("body").1.to_string();
    let resp = exchange(
        &mut h,
        &mut c,
        &format!("GET / HTTP/1.1\r\nAccept: application/json\r\nX-metadata-token: {token}\r\n\r\n"),
    );
    let body = resp.split_once("\r\n\r\n").expect("body").1;
    assert_eq!(
        serde_json::from_str::<serde_json::Value>(body).expect("JSON"),
        lock(&mmds).data()
    );
    let r = guest_sends(&mut h, &c.clone(), &c.send(FIN | ACK, b""));
    assert!(
        matches!(r[..], [Reply::Tcp { flags, .. }] if flags == FIN | ACK),
        "{r:?}"
    );
    assert!(
        h.peer_frames().is_empty(),
        "nothing of MMDS reached the backend"
    );
    assert_eq!(h.metric(|m| &m.mmds.mmds_tokens_issued), 1);
    assert_eq!(h.metric(|m| &m.mmds.mmds_requests_accepted), 2);
    assert_eq!(h.metric(|m| &m.mmds.mmds_connections_opened), 1);
}

#[test]
fn test_mmds_answers_go_ahead_of_backend_frames() {
    let (mut h, _) = rig(MmdsVersion::V1);
    let c = GuestClient::new(IP, 40000);
    // A backend frame waits while the guest has no RX buffer.
    let from_tap = frame(12 + 60, 3);
    h.deliver(&from_tap);
    // The guest asks MMDS; the answer cannot go out yet either.
    h.post_tx(&c.arp_request(), &[]);
    h.kick_tx();
    h.run_until_idle();
    assert!(h.take_rx_frames().is_empty());
    // Buffers arrive: MMDS's answer first, then the backend's frame.
    keep_rx(&mut h, 4);
    h.kick_rx();
    h.run_until_idle();
    let got = h.take_rx_frames();
    assert_eq!(got.len(), 2);
    assert_eq!(
        read_reply(&got[0].data, c.mac, c.ip),
        Some(Reply::Arp {
            mac: MMDS_MAC,
            ip: IP
        })
    );
    got[1].assert_is(&from_tap);
}

#[test]
fn test_card_without_mmds_passes_mmds_frames_to_the_backend() {
    let mut h = NetFixture::new(NetConfig::default(), MRG_FEATURES);
    let c = GuestClient::new(IP, 40000);
    let arp = c.arp_request();
    assert_eq!(guest_sends(&mut h, &c, &arp), vec![]);
    assert_eq!(h.peer_frames(), vec![arp]);
    assert_eq!(h.metric(|m| &m.mmds.mmds_rx_frames), 0);
    assert!(h.dev().mmds().is_none());
}

#[test]
fn test_mmds_frame_too_large_for_the_buffers_is_dropped_and_counted() {
    // Without MRG_RXBUF a frame must fit the one chain it is read into.
    let (mut h, _) = rig_with(MmdsVersion::V1, BASE_FEATURES);
    let c = GuestClient::new(IP, 40000);
    // One 50-byte buffer: the 54-byte ARP reply (12 + 42) does not fit.
    h.post_rx_shaped(&[50], Layout::Direct);
    h.post_tx(&c.arp_request(), &[]);
    h.kick_tx();
    h.run_until_idle();
    assert!(h.take_rx_frames().is_empty());
    assert_eq!(h.metric(|m| &m.mmds.mmds_tx_dropped), 1);
    // The buffer stays for the next frame, which fits.
    let from_tap = frame(12 + 30, 1);
    h.deliver(&from_tap);
    let got = h.take_rx_frames();
    assert_eq!(got.len(), 1);
    got[0].assert_is(&from_tap);
}

#[test]
fn test_reset_forgets_mmds_connections() {
    let (mut h, _) = rig(MmdsVersion::V1);
    let mut c = GuestClient::new(IP, 40000);
    // No RX buffers: the SYN-ACK waits.
    h.post_tx(&c.send(SYN, b""), &[]);
    h.kick_tx();
    h.run_until_idle();
    assert_eq!(h.dev().mmds().map(MmdsStack::connections), Some(1));
    crate::virtio::VirtioDevice::reset(&mut *h.dev());
    assert_eq!(h.dev().mmds().map(MmdsStack::connections), Some(0));
    assert!(!h.dev().mmds().is_some_and(MmdsStack::has_output));
}
