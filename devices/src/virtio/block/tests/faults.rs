// SPDX-License-Identifier: Apache-2.0
//! Fault injection: the image fails (EIO, ENOSPC, EAGAIN, EOPNOTSUPP),
//! is interrupted (EINTR) or moves fewer bytes than asked, with either
//! engine. Every request is answered exactly once, with the status the
//! spec calls for (IOERR for a request that cannot complete, OK for one
//! that completed after retries or continuations), a used length that is
//! the bytes written into guest memory, and nothing else is lost: the
//! request in flight beside the failing one completes as usual.

use super::fixture::*;
use crate::virtio::block::backend::{BlockBackend, OpKind};
use crate::virtio::block::{CacheType, IoEngine};

const SECTOR: usize = 512;
/// Attempts of one request (`io::MAX_ATTEMPTS`).
const MAX_ATTEMPTS: usize = 64;

/// One case: the faults for the next operation(s) of `kind`, the request
/// they hit (a 4 KiB IN or OUT at sector 8, or a bare request), and what
/// the guest sees: status and data bytes written.
struct Case {
    name: &'static str,
    kind: OpKind,
    faults: Vec<Fault>,
    status: u8,
    written: u32,
}

fn cases() -> Vec<Case> {
    use Fault::*;
    use OpKind::*;
    let ok = VIRTIO_BLK_S_OK;
    let ioerr = VIRTIO_BLK_S_IOERR;
    let case = |name, kind, faults: Vec<Fault>, status, written| Case {
        name,
        kind,
        faults,
        status,
        written,
    };
    vec![
        case("read EIO", Read, vec![Errno(libc::EIO)], ioerr, 0),
        case("write EIO", Write, vec![Errno(libc::EIO)], ioerr, 0),
        case("write ENOSPC", Write, vec![Errno(libc::ENOSPC)], ioerr, 0),
        case("read EAGAIN", Read, vec![Errno(libc::EAGAIN)], ioerr, 0),
        case("write EAGAIN", Write, vec![Errno(libc::EAGAIN)], ioerr, 0),
        case(
            "read EINTR retried",
            Read,
            vec![Errno(libc::EINTR); 3],
            ok,
            4096,
        ),
        case(
            "write EINTR retried",
            Write,
            vec![Errno(libc::EINTR); 3],
            ok,
            0,
        ),
        case(
            "short read continued",
            Read,
            vec![Short(1000), Short(7)],
            ok,
            4096,
        ),
        case(
            "short write continued",
            Write,
            vec![Short(512), Short(1)],
            ok,
            0,
        ),
        case("read of nothing (EOF)", Read, vec![Short(0)], ioerr, 0),
        case(
            "short read, then EIO",
            Read,
            vec![Short(1024), Errno(libc::EIO)],
            ioerr,
            1024,
        ),
        case(
            "EINTR for ever",
            Read,
            vec![Errno(libc::EINTR); MAX_ATTEMPTS],
            ioerr,
            0,
        ),
        case(
            "one byte at a time",
            Write,
            vec![Short(1); MAX_ATTEMPTS],
            ioerr,
            0,
        ),
        case("flush EIO", Flush, vec![Errno(libc::EIO)], ioerr, 0),
        case(
            "flush EINTR retried",
            Flush,
            vec![Errno(libc::EINTR)],
            ok,
            0,
        ),
        case(
            "discard EOPNOTSUPP",
            Fallocate,
            vec![Errno(libc::EOPNOTSUPP)],
            ioerr,
            0,
        ),
    ]
}

fn run(engine: IoEngine) {
    let mut rng = Rng(0xfa17);
    let mut model = random_bytes(&mut rng, 256 * SECTOR);
    let mut h = BlockFixture::faulty(
        &model,
        |c| {
            c.io_engine = engine;
            c.cache_type = CacheType::Writeback;
        },
        BASE_FEATURES,
    );
    assert_eq!(h.dev().uses_io_uring(), engine == IoEngine::Async);
    let mut io_errors = 0;
    for c in cases() {
        if c.kind == OpKind::Fallocate && !h.dev().backend().inner.info().punch_hole {
            continue;
        }
        h.dev().backend_mut().inject(c.kind, &c.faults);
        let data = random_bytes(&mut rng, 4096);
        let target = match c.kind {
            OpKind::Read => h.post_read(8, 4096),
            OpKind::Write => h.post_write(8, &data),
            OpKind::Flush => h.post_bare(VIRTIO_BLK_T_FLUSH, 0),
            OpKind::Fallocate => h.post_dwz(VIRTIO_BLK_T_DISCARD, 8, 8, 0),
        };
        // A neighbour of another kind in flight with it, which the fault
        // must not touch.
        let neighbour_data = random_bytes(&mut rng, 2048);
        let neighbour = if c.kind == OpKind::Read {
            h.post_write(100, &neighbour_data)
        } else {
            h.post_read(200, 2048)
        };
        h.go();
        let mut used = h.used();
        used.sort_unstable();
        let mut want = vec![
            (u32::from(target.head), c.written + 1),
            (
                u32::from(neighbour.head),
                if c.kind == OpKind::Read { 1 } else { 2049 },
            ),
        ];
        want.sort_unstable();
        assert_eq!(used, want, "{}: used entries ({engine:?})", c.name);
        assert_eq!(h.status(&target), c.status, "{}: status", c.name);
        assert_eq!(
            h.status(&neighbour),
            VIRTIO_BLK_S_OK,
            "{}: neighbour",
            c.name
        );
        assert_eq!(h.dev().backend().pending(), 0, "{}: faults left", c.name);
        if c.status != VIRTIO_BLK_S_OK {
            io_errors += 1;
        }
        assert_eq!(h.metric(|m| &m.io_errors), io_errors, "{}", c.name);
        // The model: what completed OK is there; what failed is undefined
        // (a failed write may have landed), so take the file's word for
        // those sectors.
        if c.kind == OpKind::Read {
            model[100 * SECTOR..100 * SECTOR + 2048].copy_from_slice(&neighbour_data);
        } else {
            assert_eq!(
                h.read(neighbour.parts[1].0, 2048),
                model[200 * SECTOR..200 * SECTOR + 2048],
                "{}: neighbour data",
                c.name
            );
        }
        match (c.kind, c.status) {
            (OpKind::Read, VIRTIO_BLK_S_OK) => assert_eq!(
                h.read(target.parts[1].0, 4096),
                model[8 * SECTOR..8 * SECTOR + 4096],
                "{}: read data",
                c.name
            ),
            (OpKind::Write, VIRTIO_BLK_S_OK) => {
                model[8 * SECTOR..8 * SECTOR + 4096].copy_from_slice(&data)
            }
            (OpKind::Write | OpKind::Fallocate, _) => {
                let img = h.image();
                model[8 * SECTOR..8 * SECTOR + 4096]
                    .copy_from_slice(&img[8 * SECTOR..8 * SECTOR + 4096]);
            }
            _ => {}
        }
        assert!(h.image() == model, "{}: the image differs", c.name);
    }
    assert_eq!(h.metric(|m| &m.malformed_requests), 0);
}

#[test]
fn test_faults_sync() {
    run(IoEngine::Sync);
}

#[test]
fn test_faults_async() {
    run(IoEngine::Async);
}
