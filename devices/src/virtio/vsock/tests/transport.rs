// SPDX-License-Identifier: Apache-2.0
//! The device behind the real MMIO transport, reached only through a
//! [`MockDriver`]'s register accesses, as the VMM attaches it: identity,
//! queues, configuration space, and a connection through the rings the
//! driver laid out.

use std::io::Write;
use std::sync::{Arc, Mutex};

use event_manager::{EventManager, SubscriberOps};
use vm_memory::{Bytes, GuestAddress};

use super::fixture::{guest_hdr, TempDir, CID, FEATURES};
use crate::virtio::mmio::MmioTransport;
use crate::virtio::test_utils::{guest_memory, MockDriver, Segment};
use crate::virtio::vsock::packet::{Header, Op, HDR_LEN};
use crate::virtio::vsock::{Vsock, VsockConfig};
use crate::virtio::GuestMemory;
use crate::virtio::VirtioDevice;

/// A vsock device behind the real transport, on an event manager, and a
/// driver whose buffers take guest memory from 1 MiB, all but 4 MiB of it.
struct Rig {
    /// Holds the socket's directory.
    dir: TempDir,
    uds: std::path::PathBuf,
    mem: GuestMemory,
    dev: Arc<Mutex<Vsock>>,
    em: EventManager<Arc<Mutex<Vsock>>>,
    drv: MockDriver,
}

fn rig(mem_size: usize) -> Rig {
    let dir = TempDir::new();
    let uds = dir.0.join("v.sock");
    let mem = guest_memory(mem_size).unwrap();
    let cfg = VsockConfig {
        id: "vsock0".into(),
        guest_cid: CID,
        uds_path: uds.clone(),
    };
    let dev = Arc::new(Mutex::new(Vsock::new(cfg, mem.clone()).unwrap()));
    let mut em = EventManager::new().unwrap();
    em.add_subscriber(dev.clone());
    let d: Arc<Mutex<dyn VirtioDevice>> = dev.clone();
    let t = MmioTransport::new(mem.clone(), d).unwrap();
    let room = mem_size as u64 - (4 << 20);
    let drv = MockDriver::with_alloc_range(mem.clone(), t, GuestAddress(0x10_0000), room);
    Rig {
        dir,
        uds,
        mem,
        dev,
        em,
        drv,
    }
}

#[test]
fn a_driver_sees_a_vsock_device_and_connects_through_it() {
    let Rig {
        dir: _dir,
        uds,
        mem,
        dev,
        mut em,
        mut drv,
    } = rig(8 << 20);
    assert_eq!(drv.read_reg(0x008), 19, "DeviceID");
    assert_eq!(drv.device_features(), FEATURES);
    assert_eq!(drv.read_reg(0x100), CID as u32, "guest_cid, low half");
    assert_eq!(drv.read_reg(0x104), 0, "guest_cid, high half");
    drv.init(FEATURES).unwrap();
    assert_eq!(drv.queue_num_max(3), 0, "three queues");
    while em.run_with_timeout(0).unwrap() > 0 {}
    assert!(dev.lock().unwrap().is_activated());

    // A host agent connects; the REQUEST arrives in a buffer the driver
    // posted, and the driver's RESPONSE gets the agent its OK line.
    let rx = drv.alloc(HDR_LEN as u64 + 256, 8).unwrap();
    drv.submit(0, &[Segment::writable(rx, HDR_LEN as u32 + 256)])
        .unwrap();
    let mut host = std::os::unix::net::UnixStream::connect(&uds).unwrap();
    host.write_all(b"CONNECT 52\n").unwrap();
    while em.run_with_timeout(50).unwrap() > 0 {}
    let used = drv.used(0).unwrap();
    assert_eq!(used.len(), 1);
    let mut b = [0u8; HDR_LEN];
    mem.read_slice(&mut b, rx).unwrap();
    let req = Header::parse(&b);
    assert_eq!(
        (req.op, req.dst_port, req.dst_cid),
        (Op::Request as u16, 52, CID)
    );
    let resp = guest_hdr(52, req.src_port, Op::Response).to_bytes();
    let tx = drv.alloc(HDR_LEN as u64, 8).unwrap();
    mem.write_slice(&resp, tx).unwrap();
    drv.submit(1, &[Segment::readable(tx, HDR_LEN as u32)])
        .unwrap();
    while em.run_with_timeout(0).unwrap() > 0 {}
    let mut ok = [0u8; 32];
    host.set_read_timeout(Some(std::time::Duration::from_secs(2)))
        .unwrap();
    let n = std::io::Read::read(&mut host, &mut ok).unwrap();
    assert_eq!(&ok[..n], format!("OK {}\n", req.src_port).as_bytes());
    assert!(drv.take_irq_count() > 0, "the driver was interrupted");
    drop(dev);
}

/// A snapshot taken through the transport while the device holds TX
/// chains for a host that does not read: `save` returns them first (the
/// device's `quiesce`), so `used.idx` counts every chain the driver made
/// available, as a restore resumes by; the host still gets every byte, in
/// order, once it reads.
#[test]
fn a_snapshot_through_the_transport_returns_the_held_chains_first() {
    let Rig {
        dir: _dir,
        uds,
        mem,
        dev,
        mut em,
        mut drv,
    } = rig(16 << 20);
    drv.init(FEATURES).unwrap();
    let listener = std::os::unix::net::UnixListener::bind(format!("{}_9", uds.display())).unwrap();
    for _ in 0..4 {
        let rx = drv.alloc(HDR_LEN as u64 + 4096, 8).unwrap();
        drv.submit(0, &[Segment::writable(rx, HDR_LEN as u32 + 4096)])
            .unwrap();
    }
    let post = |drv: &mut MockDriver, op: Op, data: &[u8]| {
        let hdr = Header {
            len: data.len() as u32,
            ..guest_hdr(1, 9, op)
        };
        let mut bytes = hdr.to_bytes().to_vec();
        bytes.extend_from_slice(data);
        let at = drv.alloc(bytes.len() as u64, 8).unwrap();
        mem.write_slice(&bytes, at).unwrap();
        drv.submit(1, &[Segment::readable(at, bytes.len() as u32)])
            .unwrap();
    };
    post(&mut drv, Op::Request, &[]);
    while em.run_with_timeout(0).unwrap() > 0 {}
    let (mut host, _) = listener.accept().unwrap();
    // 60 packets of 4 KiB, within the device's 256 KiB of credit: more
    // than the host socket takes while nobody reads it.
    let mut sent = Vec::new();
    for i in 0..60u8 {
        let data = vec![i; 4096];
        post(&mut drv, Op::Rw, &data);
        sent.extend_from_slice(&data);
    }
    while em.run_with_timeout(0).unwrap() > 0 {}
    assert!(dev.lock().unwrap().held_chains() > 0, "nothing held");
    drv.transport().save().unwrap();
    assert_eq!(dev.lock().unwrap().held_chains(), 0);
    let q = drv.queue(1).unwrap();
    assert_eq!(q.used_idx(&mem).unwrap(), q.avail_idx(&mem).unwrap());
    host.set_nonblocking(true).unwrap();
    let mut got = Vec::new();
    let mut buf = vec![0u8; 65536];
    let end = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while got.len() < sent.len() {
        assert!(
            std::time::Instant::now() < end,
            "{} of {}",
            got.len(),
            sent.len()
        );
        match std::io::Read::read(&mut host, &mut buf) {
            Ok(n) => got.extend_from_slice(&buf[..n]),
            Err(_) => while em.run_with_timeout(0).unwrap() > 0 {},
        }
    }
    assert!(got == sent, "bytes out of order after the snapshot");
}
