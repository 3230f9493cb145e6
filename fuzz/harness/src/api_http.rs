// SPDX-License-Identifier: Apache-2.0
//! Target `api_http`: the API socket's HTTP parser over bytes a client
//! controls completely, as they might arrive in pieces.
//!
//! The input is a structured request (method, path, headers, body, each
//! part valid or not) rendered to bytes, or raw bytes, plus extra bytes
//! after it and the points where the connection splits it. Oracles:
//! - the parser never panics, and takes at most the bytes it was given;
//! - arrival does not matter: every prefix of a whole request is
//!   `Incomplete` (the parser never decides before it has the bytes), and
//!   more bytes after a whole request do not change it;
//! - a request it accepts is within the bounds: a path starting with `/`,
//!   a body of at most `MAX_BODY_BYTES`, a head of at most `MAX_HEAD_BYTES`;
//! - a structured request with valid parts comes back as it was sent.

use arbitrary::Arbitrary;
use vmm::api::http::{parse, Method, Parsed, MAX_BODY_BYTES, MAX_HEAD_BYTES};

/// A request as a client might write it.
#[derive(Debug, Clone, Arbitrary)]
pub struct Structured {
    method: u8,
    path: Vec<u8>,
    headers: Vec<(Vec<u8>, Vec<u8>)>,
    body: Vec<u8>,
    /// Send a Content-Length that differs from the body by this much.
    length_skew: Option<i8>,
    http10: bool,
}

/// What the client sends.
#[derive(Debug, Clone, Arbitrary)]
pub enum Bytes {
    /// A request built from parts.
    Structured(Structured),
    /// Anything.
    Raw(Vec<u8>),
}

/// A whole input.
#[derive(Debug, Clone, Arbitrary)]
pub struct Input {
    bytes: Bytes,
    after: Vec<u8>,
    cuts: Vec<u16>,
}

/// Runs one input.
pub fn run(data: &[u8]) {
    crate::with_input(data, |input: &Input| check(input));
}

fn is_token(s: &[u8]) -> bool {
    !s.is_empty()
        && s.iter()
            .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(b))
}

fn render(s: &Structured) -> (Vec<u8>, bool) {
    let method: &[u8] = match s.method % 5 {
        0 => b"GET",
        1 => b"PUT",
        2 => b"PATCH",
        3 => b"DELETE",
        _ => b"G T",
    };
    let mut out = method.to_vec();
    out.push(b' ');
    out.extend_from_slice(&s.path);
    out.extend_from_slice(if s.http10 {
        b" HTTP/1.0\r\n"
    } else {
        b" HTTP/1.1\r\n"
    });
    let mut valid = s.method % 5 != 4
        && s.path.first() == Some(&b'/')
        && !s.path.contains(&b'?')
        && s.path.iter().all(|b| b.is_ascii_graphic());
    for (name, value) in s.headers.iter().take(8) {
        out.extend_from_slice(name);
        out.extend_from_slice(b": ");
        out.extend_from_slice(value);
        out.extend_from_slice(b"\r\n");
        let special = [
            &b"content-length"[..],
            b"transfer-encoding",
            b"connection",
            b"expect",
        ]
        .iter()
        .any(|n| name.eq_ignore_ascii_case(n));
        valid &= is_token(name)
            && !special
            && value
                .iter()
                .all(|b| b.is_ascii_graphic() && *b != b':' || *b == b' ')
            && value.first() != Some(&b' ')
            && value.last() != Some(&b' ');
    }
    let len = s.body.len() as i64 + i64::from(s.length_skew.unwrap_or(0));
    out.extend_from_slice(format!("Content-Length: {}\r\n\r\n", len.max(0)).as_bytes());
    out.extend_from_slice(&s.body);
    valid &= s.length_skew.unwrap_or(0) == 0 && s.body.len() <= MAX_BODY_BYTES;
    let head_ok = out.len() - s.body.len() <= MAX_HEAD_BYTES;
    (out, valid && head_ok)
}

fn check(input: &Input) {
    let (bytes, valid) = match &input.bytes {
        Bytes::Structured(s) => render(s),
        Bytes::Raw(b) => (b.clone(), false),
    };
    let whole = parse(&bytes);
    if let Ok(Parsed::Request(r, n)) = &whole {
        assert!(*n <= bytes.len(), "took {n} of {} bytes", bytes.len());
        assert!(r.path.starts_with('/'), "path {:?}", r.path);
        assert!(r.body.len() <= MAX_BODY_BYTES);
        assert!(*n - r.body.len() <= MAX_HEAD_BYTES + 4);
        for &cut in &input.cuts {
            let cut = usize::from(cut) % n.max(&1);
            assert!(
                matches!(parse(&bytes[..cut]), Ok(Parsed::Incomplete { .. })),
                "a prefix of {cut} of the {n} bytes of a whole request was decided: {:?}",
                parse(&bytes[..cut])
            );
        }
        let mut more = bytes[..*n].to_vec();
        more.extend_from_slice(&input.after);
        assert_eq!(parse(&more), whole, "bytes after a request changed it");
    }
    if let (true, Bytes::Structured(s)) = (valid, &input.bytes) {
        let Ok(Parsed::Request(r, n)) = &whole else {
            panic!("a valid request was not accepted: {whole:?}");
        };
        assert_eq!(*n, bytes.len());
        assert_eq!(r.body, s.body);
        assert_eq!(r.path.as_bytes(), s.path.as_slice());
        let want = match s.method % 5 {
            0 => Method::Get,
            1 => Method::Put,
            2 => Method::Patch,
            _ => Method::Other("DELETE".into()),
        };
        assert_eq!(r.method, want);
        assert_eq!(r.close, s.http10);
    }
}
