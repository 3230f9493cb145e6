// SPDX-License-Identifier: Apache-2.0
//! Data integrity: random requests through random chain shapes (header
//! split or sharing a descriptor with data, data in many pieces of any
//! length, status sharing the last data descriptor, direct and indirect
//! tables), byte-exact against a model of the image, with both engines and
//! both cache types.
//!
//! Requests of one batch are in flight together (with `Async` they
//! complete in any order), so a batch never has two requests over the same
//! sectors of which one writes: the spec orders nothing between requests in
//! flight, and neither does the model.

use super::fixture::*;
use crate::virtio::block::device::features::*;
use crate::virtio::block::{CacheType, IoEngine};
use crate::virtio::VirtioDevice;

const SECTOR: usize = 512;
const SECTORS: usize = 2048;

/// The data parts of an IN (address, length) and the bytes they must hold.
type ReadBack = (Vec<(u64, u32)>, Vec<u8>);

/// What one posted request should bring back.
struct Expect {
    posted: Posted,
    /// For IN: the parts holding data and the bytes they must hold.
    read: Option<ReadBack>,
    used_len: u32,
}

/// `total` bytes cut into at most `n` pieces of random lengths, none empty.
fn cut(rng: &mut Rng, total: usize, n: usize) -> Vec<usize> {
    let n = n.clamp(1, total.max(1));
    let mut points: Vec<usize> = (0..n - 1).map(|_| rng.range(1, total.max(2) - 1)).collect();
    points.sort_unstable();
    points.dedup();
    let mut out = Vec::new();
    let mut last = 0;
    for p in points {
        out.push(p - last);
        last = p;
    }
    out.push(total - last);
    out
}

/// `bytes` cut into consecutive pieces of `lens` (which sum to its length).
fn split_into(bytes: &[u8], lens: &[usize]) -> Vec<Vec<u8>> {
    let mut at = 0;
    lens.iter()
        .map(|&l| {
            at += l;
            bytes[at - l..at].to_vec()
        })
        .collect()
}

/// The parts of a request: the header cut up, the data (readable or
/// writable) cut up, the status last, with random merging.
fn shape(
    rng: &mut Rng,
    kind: u32,
    sector: u64,
    data: Option<&[u8]>,
    read_len: usize,
) -> (Vec<Part>, usize, usize) {
    let hdr = header(kind, sector);
    let mut parts = Vec::new();
    // Header pieces (1 to 3), possibly the last merged with OUT data.
    let n = rng.range(1, 3);
    let mut hbytes = split_into(&hdr, &cut(rng, 16, n));
    let first_data;
    let data_parts;
    match data {
        Some(d) => {
            let n = rng.range(1, 8);
            let mut dp = split_into(d, &cut(rng, d.len(), n));
            let merge = rng.chance(3);
            if merge {
                let first = dp.remove(0);
                hbytes.last_mut().unwrap().extend_from_slice(&first);
            }
            for h in hbytes {
                parts.push(Part::Out(h));
            }
            first_data = parts.len();
            data_parts = dp.len();
            parts.extend(dp.into_iter().map(Part::Out));
            parts.push(Part::In(1));
        }
        None => {
            for h in hbytes {
                parts.push(Part::Out(h));
            }
            first_data = parts.len();
            if read_len == 0 {
                data_parts = 0;
                parts.push(Part::In(1));
            } else {
                let n = rng.range(1, 8);
                let mut pieces = cut(rng, read_len, n);
                if rng.chance(3) {
                    // The status shares the last data descriptor.
                    *pieces.last_mut().unwrap() += 1;
                    data_parts = pieces.len();
                    parts.extend(pieces.iter().map(|&l| Part::In(l as u32)));
                } else {
                    data_parts = pieces.len();
                    parts.extend(pieces.iter().map(|&l| Part::In(l as u32)));
                    parts.push(Part::In(1));
                }
            }
        }
    }
    (parts, first_data, data_parts)
}

fn overlaps(a: (usize, usize), b: (usize, usize)) -> bool {
    a.0 < b.1 && b.0 < a.1
}

fn run(engine: IoEngine, cache: CacheType, seed: u64) {
    let mut rng = Rng(seed);
    let mut model = random_bytes(&mut rng, SECTORS * SECTOR);
    let mut h = BlockFixture::with_engine(engine, &model, |c| c.cache_type = cache);
    assert_eq!(h.dev().uses_io_uring(), engine == IoEngine::Async);
    let dwz_offered = h.dev().avail_features() & bit(VIRTIO_BLK_F_WRITE_ZEROES) != 0;
    let (mut reads, mut writes, mut zeroes) = (0u64, 0u64, 0u64);
    for _batch in 0..40 {
        let mut expects = Vec::new();
        // Byte ranges of the batch: (range, writes).
        let mut taken: Vec<((usize, usize), bool)> = Vec::new();
        let mut pending_writes: Vec<(usize, Vec<u8>)> = Vec::new();
        for _ in 0..rng.range(1, 12) {
            if h.q.free_descriptors() < 24 {
                break;
            }
            let sectors = rng.range(1, 64);
            let sector = rng.range(0, SECTORS - sectors);
            let range = (sector * SECTOR, (sector + sectors) * SECTOR);
            let what = rng.range(0, 9);
            let writes_range = what >= 4;
            if taken
                .iter()
                .any(|&(r, w)| overlaps(r, range) && (w || writes_range))
            {
                continue;
            }
            let layout = match rng.range(0, 2) {
                0 => Layout::Direct,
                1 => Layout::Indirect(0),
                _ => Layout::Indirect(rng.range(1, 3)),
            };
            let len = sectors * SECTOR;
            let e = if what < 4 {
                let (parts, first, n) = shape(&mut rng, VIRTIO_BLK_T_IN, sector as u64, None, len);
                let posted = h.post(&parts, layout);
                let data_parts = posted.parts[first..first + n].to_vec();
                reads += 1;
                Expect {
                    posted,
                    read: Some((data_parts, model[range.0..range.1].to_vec())),
                    used_len: len as u32 + 1,
                }
            } else if what < 8 || !dwz_offered {
                let data = random_bytes(&mut rng, len);
                let (parts, _, _) =
                    shape(&mut rng, VIRTIO_BLK_T_OUT, sector as u64, Some(&data), 0);
                let posted = h.post(&parts, layout);
                pending_writes.push((range.0, data));
                writes += 1;
                Expect {
                    posted,
                    read: None,
                    used_len: 1,
                }
            } else {
                let (kind, flags) = if rng.chance(2) {
                    (VIRTIO_BLK_T_DISCARD, 0)
                } else {
                    (VIRTIO_BLK_T_WRITE_ZEROES, rng.range(0, 1) as u32)
                };
                let posted = h.post(
                    &[
                        Part::Out(header(kind, 0)),
                        Part::Out(dwz(sector as u64, sectors as u32, flags)),
                        Part::In(1),
                    ],
                    layout,
                );
                pending_writes.push((range.0, vec![0; len]));
                zeroes += 1;
                Expect {
                    posted,
                    read: None,
                    used_len: 1,
                }
            };
            taken.push((range, writes_range));
            expects.push(e);
        }
        if rng.chance(4) {
            let p = h.post_bare(VIRTIO_BLK_T_FLUSH, 0);
            expects.push(Expect {
                posted: p,
                read: None,
                used_len: 1,
            });
        }
        h.go();
        let mut used = h.used();
        assert_eq!(used.len(), expects.len(), "every request answered once");
        used.sort_unstable();
        let mut heads: Vec<(u32, u32)> = expects
            .iter()
            .map(|e| (u32::from(e.posted.head), e.used_len))
            .collect();
        heads.sort_unstable();
        assert_eq!(used, heads, "used ids and lengths");
        for e in &expects {
            assert_eq!(h.status(&e.posted), VIRTIO_BLK_S_OK);
            if let Some((parts, want)) = &e.read {
                let mut got = Vec::new();
                for &(a, l) in parts {
                    got.extend(h.read(a, l as usize));
                }
                got.truncate(want.len());
                assert!(got == *want, "read data differs ({engine:?}, {cache:?})");
            }
        }
        for (at, data) in pending_writes {
            model[at..at + data.len()].copy_from_slice(&data);
        }
    }
    assert!(h.image() == model, "image differs from the model");
    assert_eq!(h.metric(|m| &m.read_count), reads);
    assert_eq!(h.metric(|m| &m.write_count), writes);
    assert_eq!(
        h.metric(|m| &m.discard_count) + h.metric(|m| &m.write_zeroes_count),
        zeroes
    );
    assert_eq!(
        h.metric(|m| &m.io_errors) + h.metric(|m| &m.malformed_requests),
        0
    );
    if engine == IoEngine::Async {
        assert!(h.metric(|m| &m.ring_submissions) > 0);
        assert!(
            h.metric(|m| &m.max_in_flight) > 1,
            "requests went in flight together"
        );
    }
}

#[test]
fn test_random_requests_are_byte_exact_sync_unsafe() {
    run(IoEngine::Sync, CacheType::Unsafe, 0x5eed_0001);
}

#[test]
fn test_random_requests_are_byte_exact_sync_writeback() {
    run(IoEngine::Sync, CacheType::Writeback, 0x5eed_0002);
}

#[test]
fn test_random_requests_are_byte_exact_async_unsafe() {
    run(IoEngine::Async, CacheType::Unsafe, 0x5eed_0003);
}

#[test]
fn test_random_requests_are_byte_exact_async_writeback() {
    run(IoEngine::Async, CacheType::Writeback, 0x5eed_0004);
}
