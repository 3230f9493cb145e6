// SPDX-License-Identifier: Apache-2.0
//! Whatever a hostile driver puts in a request: each malformed shape is
//! answered as the spec says (IOERR with the status byte, or used length 0
//! where there is no status byte), counted, and leaves the image as it was
//! and the device working.

use vm_memory::{Bytes, GuestAddress};

use super::fixture::*;
use crate::virtio::block::device::features::*;
use crate::virtio::block::SEG_MAX;
use crate::virtio::VirtioDevice;

const SECTOR: usize = 512;
/// Sectors of the test image.
const CAPACITY: u64 = 64;

/// What the guest must see for a case.
#[derive(Debug, Clone, Copy)]
enum Want {
    /// The status byte and used length 1.
    Status(u8),
    /// Used length 0, status byte untouched.
    NoStatus,
}

fn out_header(kind: u32, sector: u64) -> Part {
    Part::Out(header(kind, sector))
}

/// The matrix: a name, the parts, their layout, what the guest sees.
fn cases() -> Vec<(&'static str, Vec<Part>, Layout, Want)> {
    use Part::{In, Out};
    use Want::*;
    let ioerr = Status(VIRTIO_BLK_S_IOERR);
    let t_in = VIRTIO_BLK_T_IN;
    let t_out = VIRTIO_BLK_T_OUT;
    let d = Layout::Direct;
    vec![
        (
            "short header",
            vec![Out(header(t_in, 0)[..8].to_vec()), In(512), In(1)],
            d,
            ioerr,
        ),
        (
            "header device-writable",
            vec![In(16), In(512), In(1)],
            d,
            ioerr,
        ),
        (
            "no writable byte for the status",
            vec![out_header(t_out, 0), Out(vec![1; 512])],
            d,
            NoStatus,
        ),
        (
            "IN with readable data",
            vec![out_header(t_in, 0), Out(vec![1; 512]), In(512), In(1)],
            d,
            ioerr,
        ),
        (
            "OUT with writable data",
            vec![out_header(t_out, 0), In(512), In(1)],
            d,
            ioerr,
        ),
        (
            "readable after writable",
            vec![out_header(t_in, 0), In(512), Out(vec![1; 16]), In(1)],
            d,
            NoStatus,
        ),
        (
            "IN at the capacity",
            vec![out_header(t_in, CAPACITY), In(512), In(1)],
            d,
            ioerr,
        ),
        (
            "OUT running past the capacity",
            vec![out_header(t_out, CAPACITY - 1), Out(vec![1; 1024]), In(1)],
            d,
            ioerr,
        ),
        (
            "sector * 512 overflows",
            vec![out_header(t_in, u64::MAX / 512 + 1), In(512), In(1)],
            d,
            ioerr,
        ),
        (
            "sector * 512 + len overflows",
            vec![out_header(t_out, u64::MAX / 512), Out(vec![1; 1024]), In(1)],
            d,
            ioerr,
        ),
        (
            "IN not a whole number of sectors",
            vec![out_header(t_in, 0), In(513), In(1)],
            d,
            ioerr,
        ),
        (
            "OUT not a whole number of sectors",
            vec![out_header(t_out, 0), Out(vec![1; 100]), In(1)],
            d,
            ioerr,
        ),
        (
            "IN without data",
            vec![out_header(t_in, 0), In(1)],
            d,
            ioerr,
        ),
        (
            // One sector in all (well inside the disk), so only the
            // buffer count is wrong: seg_max + 1 data buffers, all but one
            // empty.
            "more than seg_max data buffers",
            std::iter::once(out_header(t_out, 0))
                .chain(std::iter::once(Out(vec![1; 512])))
                .chain((0..SEG_MAX).map(|_| Out(Vec::new())))
                .chain(std::iter::once(In(1)))
                .collect(),
            Layout::Indirect(1),
            ioerr,
        ),
        (
            "FLUSH with data",
            vec![out_header(VIRTIO_BLK_T_FLUSH, 0), Out(vec![0; 512]), In(1)],
            d,
            ioerr,
        ),
        (
            "GET_ID with readable data",
            vec![
                out_header(VIRTIO_BLK_T_GET_ID, 0),
                Out(vec![0; 20]),
                In(20),
                In(1),
            ],
            d,
            ioerr,
        ),
        (
            "GET_ID without room",
            vec![out_header(VIRTIO_BLK_T_GET_ID, 0), In(1)],
            d,
            ioerr,
        ),
        (
            "DISCARD segment cut short",
            vec![
                out_header(VIRTIO_BLK_T_DISCARD, 0),
                Out(dwz(0, 1, 0)[..8].to_vec()),
                In(1),
            ],
            d,
            ioerr,
        ),
        (
            "DISCARD with two segments",
            vec![
                out_header(VIRTIO_BLK_T_DISCARD, 0),
                Out([dwz(0, 1, 0), dwz(4, 1, 0)].concat()),
                In(1),
            ],
            d,
            ioerr,
        ),
        (
            "DISCARD past the capacity",
            vec![
                out_header(VIRTIO_BLK_T_DISCARD, 0),
                Out(dwz(CAPACITY - 1, 2, 0)),
                In(1),
            ],
            d,
            ioerr,
        ),
        (
            "WRITE_ZEROES of more sectors than offered",
            vec![
                out_header(VIRTIO_BLK_T_WRITE_ZEROES, 0),
                Out(dwz(0, (1 << 21) + 1, 0)),
                In(1),
            ],
            d,
            ioerr,
        ),
        (
            "DISCARD with writable data",
            vec![
                out_header(VIRTIO_BLK_T_DISCARD, 0),
                Out(dwz(0, 1, 0)),
                In(16),
                In(1),
            ],
            d,
            ioerr,
        ),
    ]
}

fn image() -> Vec<u8> {
    let mut rng = Rng(77);
    random_bytes(&mut rng, CAPACITY as usize * SECTOR)
}

#[test]
fn test_malformed_requests_are_answered_and_counted_and_change_nothing() {
    let data = image();
    for engine in [
        crate::virtio::block::IoEngine::Sync,
        crate::virtio::block::IoEngine::Async,
    ] {
        let mut h = BlockFixture::new(&data, |c| c.io_engine = engine, BASE_FEATURES);
        let dwz_offered = h.dev().avail_features() & bit(VIRTIO_BLK_F_WRITE_ZEROES) != 0;
        let mut malformed = 0;
        for (name, parts, layout, want) in cases() {
            if !dwz_offered && (name.contains("DISCARD") || name.contains("WRITE_ZEROES")) {
                continue;
            }
            let p = h.post(&parts, layout);
            let last = *p.parts.last().unwrap();
            let before = h.read(last.0 + u64::from(last.1) - 1, 1)[0];
            h.go();
            malformed += 1;
            match want {
                Want::Status(s) => {
                    assert_eq!(h.used(), vec![(u32::from(p.head), 1)], "{name}: used");
                    assert_eq!(h.status(&p), s, "{name}: status");
                }
                Want::NoStatus => {
                    assert_eq!(h.used(), vec![(u32::from(p.head), 0)], "{name}: used");
                    assert_eq!(h.status(&p), before, "{name}: wrote a byte");
                }
            }
            assert_eq!(h.metric(|m| &m.malformed_requests), malformed, "{name}");
            assert_eq!(h.image(), data, "{name}: the image changed");
        }
        // Nothing else was counted, nothing broke, and the device works.
        assert_eq!(h.metric(|m| &m.io_errors), 0);
        assert_eq!(
            h.metric(|m| &m.read_count) + h.metric(|m| &m.write_count),
            0
        );
        assert_eq!(
            h.irq
                .device_errors
                .load(std::sync::atomic::Ordering::SeqCst),
            0
        );
        assert_eq!(h.read_ok(1, 512), data[512..1024]);
    }
}

#[test]
fn test_seg_max_data_buffers_are_accepted() {
    let data = random_bytes(&mut Rng(78), 256 * SECTOR);
    let mut h = BlockFixture::new(&data, |_| {}, BASE_FEATURES);
    let mut parts = vec![out_header(VIRTIO_BLK_T_IN, 0)];
    parts.extend((0..SEG_MAX).map(|_| Part::In(512)));
    parts.push(Part::In(1));
    let p = h.post(&parts, Layout::Indirect(1));
    h.go();
    assert_answer(&mut h, &p, VIRTIO_BLK_S_OK, SEG_MAX * 512 + 1);
    for i in 0..SEG_MAX as usize {
        assert_eq!(
            h.read(p.parts[1 + i].0, 512),
            data[i * SECTOR..(i + 1) * SECTOR]
        );
    }
}

#[test]
fn test_chains_the_walk_refuses_get_no_status() {
    let data = image();
    // Indirect not negotiated.
    let mut h = BlockFixture::new(
        &data,
        |_| {},
        BASE_FEATURES & !bit(VIRTIO_RING_F_INDIRECT_DESC),
    );
    let p = h.post(
        &[out_header(VIRTIO_BLK_T_IN, 0), Part::In(512), Part::In(1)],
        Layout::Indirect(1),
    );
    let before = h.status(&p);
    h.go();
    assert_eq!(h.used(), vec![(u32::from(p.head), 0)]);
    assert_eq!(h.status(&p), before);

    // A head outside the table names no chain: nothing comes back.
    let mem = h.mem.clone();
    h.q.push_avail(&mem, 999).unwrap();
    h.q.publish(&mem).unwrap();
    h.go();
    assert!(h.used().is_empty());

    // A buffer outside guest memory, and a chain whose last descriptor
    // links back to its head (a loop).
    let hdr = h.alloc(16);
    h.mem
        .write_slice(&header(VIRTIO_BLK_T_IN, 0), GuestAddress(hdr))
        .unwrap();
    let st = h.alloc(1);
    for (descs, looped) in [
        (
            vec![(hdr, 16u32, 0u16), (MEM_SIZE + 4096, 512, 2), (st, 1, 2)],
            false,
        ),
        (vec![(hdr, 16, 0), (hdr, 16, 0)], true),
    ] {
        let mut q = h.q.clone();
        let head = if looped {
            q.post_chain_linked(&mem, &descs, |head| head)
        } else {
            q.post_chain(&mem, &descs)
        }
        .unwrap();
        h.go();
        let used = q.used(&mem).unwrap();
        assert_eq!(used.len(), 1);
        assert_eq!((used[0].id, used[0].len), (u32::from(head), 0));
        h.q = q;
    }
    assert_eq!(h.metric(|m| &m.malformed_requests), 4);
    assert_eq!(h.image(), data);
    assert_eq!(
        h.irq
            .device_errors
            .load(std::sync::atomic::Ordering::SeqCst),
        0
    );
}
