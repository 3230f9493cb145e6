// SPDX-License-Identifier: Apache-2.0
//! The state file's format: a header line, then the state as JSON.
//!
//! ```text
//! {"format":"minivmm-snapshot","version":"2.0.0","length":123456,"crc32":305419896}\n
//! {...the state, `length` bytes of JSON whose CRC-32 is `crc32`...}
//! ```
//!
//! The header is one JSON line that says what the file is, which version
//! of the state layout it holds, how long the body is and its checksum
//! (CRC-32, IEEE, as `crc32fast` computes it). The body is serde JSON:
//! self-describing (field names, not offsets), so a reader sees what a
//! file holds and a newer layout can be told apart from a damaged one.
//! A reader refuses, with one line each and before it parses the body: a
//! file that does not start with the header (not a snapshot), another
//! layout version (minivmm reads only its own, [`SNAPSHOT_VERSION`]; a
//! file from another version is refused rather than half understood), a
//! body of another length (truncated or appended to) or checksum
//! (corrupted). The whole file is bounded ([`MAX_STATE_BYTES`]) so a
//! hostile one cannot make minivmm allocate without limit.

use std::io::Read;
use std::path::Path;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

/// The state layout this minivmm writes and reads (`--snapshot-version`).
/// The major number changes with any change a reader of the previous one
/// could not read: 2.0.0 added the rate limiters' buckets (the network,
/// block and entropy devices' own state, and the console's), which a 1.0.0
/// reader refuses and a 1.0.0 file lacks.
pub const SNAPSHOT_VERSION: &str = "2.0.0";

/// What the header's `format` says.
const FORMAT_NAME: &str = "minivmm-snapshot";

/// The largest state file read: a VM's state is tens of kilobytes per
/// vCPU and per device, so this is far above any real one.
pub const MAX_STATE_BYTES: u64 = 16 << 20;

/// The longest header line read.
const MAX_HEADER_BYTES: usize = 512;

/// Why a state file cannot be read; each is one line.
#[derive(Debug, thiserror::Error)]
pub enum FormatError {
    /// The file cannot be opened or read.
    #[error("cannot read the snapshot state file '{0}'")]
    Read(String, #[source] std::io::Error),
    /// The file is larger than any state file.
    #[error("the snapshot state file is larger than {MAX_STATE_BYTES} bytes")]
    TooLarge,
    /// The file does not start with a snapshot header.
    #[error("not a minivmm snapshot state file (no snapshot header)")]
    NotASnapshot,
    /// The file holds another layout version.
    #[error("the snapshot state file is version {file}; this minivmm reads only version {SNAPSHOT_VERSION}")]
    Version {
        /// The file's version.
        file: String,
    },
    /// The body is not as long as the header says.
    #[error("the snapshot state file is truncated or extended: its header says {expected} bytes of state, it holds {actual}")]
    Length {
        /// What the header says.
        expected: u64,
        /// What follows the header.
        actual: u64,
    },
    /// The body's checksum differs from the header's.
    #[error("the snapshot state file is corrupted: CRC-32 {actual:#010x}, its header says {expected:#010x}")]
    Checksum {
        /// What the header says.
        expected: u32,
        /// What the body has.
        actual: u32,
    },
    /// The body is not the state this version writes.
    #[error("the snapshot state does not have the layout of version {SNAPSHOT_VERSION}: {0}")]
    Body(String),
}

/// The header line.
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Header {
    format: String,
    version: String,
    length: u64,
    crc32: u32,
}

/// `state` as a state file's bytes.
pub fn encode<T: Serialize>(state: &T) -> Vec<u8> {
    // The state types are plain structs, vectors and kvm-bindings values,
    // all of which serialize; a failure would be a bug in their Serialize.
    let body = serde_json::to_vec(state).expect("the snapshot state serializes");
    let header = Header {
        format: FORMAT_NAME.into(),
        version: SNAPSHOT_VERSION.into(),
        length: body.len() as u64,
        crc32: crc32fast::hash(&body),
    };
    let mut out = serde_json::to_vec(&header).expect("the header serializes");
    out.push(b'\n');
    out.extend_from_slice(&body);
    out
}

/// Splits `bytes` into its header and body, checking only that the
/// header is one.
fn split(bytes: &[u8]) -> Result<(Header, &[u8]), FormatError> {
    let end = bytes
        .iter()
        .take(MAX_HEADER_BYTES)
        .position(|&b| b == b'\n')
        .ok_or(FormatError::NotASnapshot)?;
    let header: Header =
        serde_json::from_slice(&bytes[..end]).map_err(|_| FormatError::NotASnapshot)?;
    if header.format != FORMAT_NAME {
        return Err(FormatError::NotASnapshot);
    }
    Ok((header, &bytes[end + 1..]))
}

/// The layout version a state file says it holds (`--describe-snapshot`).
pub fn describe(bytes: &[u8]) -> Result<String, FormatError> {
    Ok(split(bytes)?.0.version)
}

/// The state in `bytes`, after every check of the module doc.
pub fn decode<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, FormatError> {
    let (header, body) = split(bytes)?;
    if header.version != SNAPSHOT_VERSION {
        return Err(FormatError::Version {
            file: header.version,
        });
    }
    if header.length != body.len() as u64 {
        return Err(FormatError::Length {
            expected: header.length,
            actual: body.len() as u64,
        });
    }
    let actual = crc32fast::hash(body);
    if actual != header.crc32 {
        return Err(FormatError::Checksum {
            expected: header.crc32,
            actual,
        });
    }
    serde_json::from_slice(body).map_err(|e| FormatError::Body(e.to_string()))
}

/// Reads a state file whole, up to [`MAX_STATE_BYTES`].
pub fn read_file(path: &Path) -> Result<Vec<u8>, FormatError> {
    let err = |e| FormatError::Read(path.display().to_string(), e);
    let file = std::fs::File::open(path).map_err(err)?;
    let mut bytes = Vec::new();
    file.take(MAX_STATE_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(err)?;
    if bytes.len() as u64 > MAX_STATE_BYTES {
        return Err(FormatError::TooLarge);
    }
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, PartialEq, Serialize, Deserialize)]
    struct Sample {
        name: String,
        values: Vec<u64>,
    }

    fn sample() -> Sample {
        Sample {
            name: "vm".into(),
            values: vec![1, 2, 3],
        }
    }

    #[test]
    fn a_state_round_trips_and_describes_its_version() {
        let bytes = encode(&sample());
        assert_eq!(decode::<Sample>(&bytes).unwrap(), sample());
        assert_eq!(describe(&bytes).unwrap(), SNAPSHOT_VERSION);
        let text = String::from_utf8(bytes).unwrap();
        assert!(text.starts_with(r#"{"format":"minivmm-snapshot","version":"2.0.0","#));
    }

    #[test]
    fn every_damaged_file_is_refused_with_its_own_line() {
        let good = encode(&sample());
        // A flipped byte in the body: the checksum.
        let mut flipped = good.clone();
        let last = flipped.len() - 2;
        flipped[last] ^= 0x01;
        assert!(matches!(
            decode::<Sample>(&flipped),
            Err(FormatError::Checksum { .. })
        ));
        // Truncated and extended: the length.
        assert!(matches!(
            decode::<Sample>(&good[..good.len() - 1]),
            Err(FormatError::Length { .. })
        ));
        let mut longer = good.clone();
        longer.push(b' ');
        assert!(matches!(
            decode::<Sample>(&longer),
            Err(FormatError::Length { .. })
        ));
        // Another version: refused before the body is looked at.
        let text = String::from_utf8(good.clone()).unwrap();
        // The previous layout, without the rate limiters' buckets.
        let other = text.replacen("\"2.0.0\"", "\"1.0.0\"", 1);
        let err = decode::<Sample>(other.as_bytes()).unwrap_err();
        assert!(matches!(&err, FormatError::Version { file } if file == "1.0.0"));
        assert_eq!(
            err.to_string(),
            "the snapshot state file is version 1.0.0; this minivmm reads only version 2.0.0"
        );
        assert_eq!(describe(other.as_bytes()).unwrap(), "1.0.0");
        // Not a snapshot at all.
        for junk in [
            &b""[..],
            b"\n",
            b"{}\n{}",
            b"ELF\x7f....",
            &[b'x'; 2000][..],
        ] {
            assert!(
                matches!(decode::<Sample>(junk), Err(FormatError::NotASnapshot)),
                "{junk:?}"
            );
        }
        // A header of another format name.
        let renamed = text.replacen("minivmm-snapshot", "firecracker", 1);
        assert!(matches!(
            decode::<Sample>(renamed.as_bytes()),
            Err(FormatError::NotASnapshot)
        ));
    }

    #[test]
    fn a_well_formed_file_of_another_layout_is_a_body_error() {
        #[derive(Serialize)]
        struct Other {
            name: u8,
        }
        let bytes = encode(&Other { name: 1 });
        let err = decode::<Sample>(&bytes).unwrap_err();
        assert!(matches!(err, FormatError::Body(_)), "{err}");
    }

    #[test]
    fn an_oversized_file_is_refused_before_it_is_read_whole() {
        let path = std::env::temp_dir().join(format!("minivmm-big-state-{}", std::process::id()));
        let f = std::fs::File::create(&path).unwrap();
        f.set_len(MAX_STATE_BYTES + 10).unwrap();
        assert!(matches!(read_file(&path), Err(FormatError::TooLarge)));
        std::fs::remove_file(&path).unwrap();
        assert!(matches!(read_file(&path), Err(FormatError::Read(..))));
    }
}
