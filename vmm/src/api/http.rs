// SPDX-License-Identifier: Apache-2.0
//! The HTTP/1.1 subset Firecracker's API clients speak, parsed from bytes a
//! client controls completely.
//!
//! A request is a request line (`METHOD PATH HTTP/1.1` or `HTTP/1.0`),
//! headers, and a body of `Content-Length` bytes. That is all firectl,
//! firecracker-go-sdk, the Python SDKs and `curl --unix-socket` send; the
//! parser refuses everything else with an [`HttpError`] the connection
//! answers with `400` and a fault message:
//! - a request line and headers longer than [`MAX_HEAD_BYTES`] together, a
//!   body longer than the payload limit ([`MAX_BODY_BYTES`], Firecracker's
//!   default, or `--http-api-max-payload-size`), so a client cannot make
//!   minivmm hold more than one bounded request per connection;
//! - `Transfer-Encoding` (chunked bodies: no client of the API sends one),
//!   two `Content-Length`s, a length that is not a decimal number;
//! - bytes that are not ASCII in the request line or header names, a
//!   header line without a colon, a version other than 1.0 or 1.1.
//!
//! [`parse`] takes whatever bytes have arrived and says whether they hold a
//! whole request (and how many bytes it took), not yet, or never: the
//! connection code feeds it as data comes in, so a slow client costs one
//! bounded buffer, not a thread.

use std::fmt::Write as _;

/// Most bytes of a request line and its headers, the blank line included.
pub const MAX_HEAD_BYTES: usize = 8 * 1024;
/// Most bytes of a body: Firecracker's default `--http-api-max-payload-size`.
pub const MAX_BODY_BYTES: usize = 51_200;
/// The largest `--http-api-max-payload-size` minivmm takes: every open
/// connection may buffer a request this large, so the limit bounds memory.
pub const MAX_PAYLOAD_LIMIT: usize = 64 << 20;

/// The methods of Firecracker's API; any other is kept by name so the
/// router can say which it refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Method {
    /// GET
    Get,
    /// PUT
    Put,
    /// PATCH
    Patch,
    /// Anything else, as sent.
    Other(String),
}

/// One parsed request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    /// The method.
    pub method: Method,
    /// The path, without a query string (the API has none).
    pub path: String,
    /// The body, exactly `Content-Length` bytes.
    pub body: Vec<u8>,
    /// The client asked to close the connection after the answer
    /// (`Connection: close`, or HTTP/1.0 without `keep-alive`).
    pub close: bool,
}

/// What the bytes so far hold.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Parsed {
    /// A whole request, and the bytes it took from the front of the buffer.
    Request(Request, usize),
    /// Not a whole request yet. `continue_expected` is set once the head is
    /// complete and carries `Expect: 100-continue`: curl sends that before
    /// a body over 1 KiB and waits a second for `100 Continue`.
    Incomplete {
        /// The client waits for `HTTP/1.1 100 Continue` before the body.
        continue_expected: bool,
    },
}

/// Why the bytes can never be a request.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HttpError {
    /// The request line and headers exceed [`MAX_HEAD_BYTES`].
    #[error("the request line and headers exceed {MAX_HEAD_BYTES} bytes")]
    HeadTooLarge,
    /// The body exceeds the payload limit (the second number).
    #[error("the request body of {0} bytes exceeds the limit of {1} bytes")]
    BodyTooLarge(u64, usize),
    /// The request line is not `METHOD PATH VERSION`.
    #[error("malformed request line")]
    RequestLine,
    /// A version other than HTTP/1.0 or HTTP/1.1.
    #[error("unsupported HTTP version {0:?}")]
    Version(String),
    /// A header line without a name and a colon, or not ASCII.
    #[error("malformed header line")]
    Header,
    /// `Content-Length` is not a decimal number, or given twice.
    #[error("invalid Content-Length")]
    ContentLength,
    /// `Transfer-Encoding` is not supported.
    #[error("Transfer-Encoding is not supported; send a Content-Length")]
    TransferEncoding,
}

/// Looks for a whole request at the front of `buf`, with Firecracker's
/// default payload limit.
pub fn parse(buf: &[u8]) -> Result<Parsed, HttpError> {
    parse_limited(buf, MAX_BODY_BYTES)
}

/// Looks for a whole request at the front of `buf`, whose body may hold
/// at most `max_body` bytes.
pub fn parse_limited(buf: &[u8], max_body: usize) -> Result<Parsed, HttpError> {
    let Some(head_len) = find_head_end(buf) else {
        if buf.len() >= MAX_HEAD_BYTES {
            return Err(HttpError::HeadTooLarge);
        }
        return Ok(Parsed::Incomplete {
            continue_expected: false,
        });
    };
    if head_len > MAX_HEAD_BYTES {
        return Err(HttpError::HeadTooLarge);
    }
    // The head ends with CRLF CRLF; the lines before it are what counts.
    let head = &buf[..head_len - 4];
    let head = std::str::from_utf8(head).map_err(|_| HttpError::Header)?;
    let mut lines = head.split("\r\n");
    let (method, path, http10) = request_line(lines.next().unwrap_or(""))?;
    let mut content_length = None;
    let mut connection = None;
    let mut continue_expected = false;
    for line in lines {
        let (name, value) = line.split_once(':').ok_or(HttpError::Header)?;
        if name.is_empty() || !name.bytes().all(is_token_byte) {
            return Err(HttpError::Header);
        }
        let value = value.trim_matches([' ', '\t']);
        if name.eq_ignore_ascii_case("content-length") {
            if content_length.is_some()
                || value.is_empty()
                || !value.bytes().all(|b| b.is_ascii_digit())
            {
                return Err(HttpError::ContentLength);
            }
            // Digits only: a value too long for u64 is too large anyway.
            let n = value.parse::<u64>().unwrap_or(u64::MAX);
            content_length = Some(n);
        } else if name.eq_ignore_ascii_case("transfer-encoding") {
            return Err(HttpError::TransferEncoding);
        } else if name.eq_ignore_ascii_case("connection") {
            connection = Some(value.to_ascii_lowercase());
        } else if name.eq_ignore_ascii_case("expect") {
            continue_expected = value.eq_ignore_ascii_case("100-continue");
        }
    }
    let body_len = content_length.unwrap_or(0);
    if body_len > max_body as u64 {
        return Err(HttpError::BodyTooLarge(body_len, max_body));
    }
    let body_len = body_len as usize;
    let Some(body) = buf.get(head_len..head_len + body_len) else {
        return Ok(Parsed::Incomplete { continue_expected });
    };
    let close = match connection.as_deref() {
        Some("close") => true,
        Some("keep-alive") => false,
        _ => http10,
    };
    Ok(Parsed::Request(
        Request {
            method,
            path,
            body: body.to_vec(),
            close,
        },
        head_len + body_len,
    ))
}

/// The length of the head, CRLF CRLF included, if it has arrived.
fn find_head_end(buf: &[u8]) -> Option<usize> {
    // Only the first MAX_HEAD_BYTES + 4 bytes can hold a head we accept.
    let window = &buf[..buf.len().min(MAX_HEAD_BYTES + 4)];
    window
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .map(|p| p + 4)
}

/// RFC 9110 token characters: what a method or header name may hold.
fn is_token_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

fn request_line(line: &str) -> Result<(Method, String, bool), HttpError> {
    let mut parts = line.split(' ');
    let (Some(method), Some(target), Some(version), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(HttpError::RequestLine);
    };
    if method.is_empty() || !method.bytes().all(is_token_byte) {
        return Err(HttpError::RequestLine);
    }
    if !target.starts_with('/') || !target.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(HttpError::RequestLine);
    }
    let http10 = match version {
        "HTTP/1.1" => false,
        "HTTP/1.0" => true,
        v => return Err(HttpError::Version(v.chars().take(16).collect())),
    };
    let method = match method {
        "GET" => Method::Get,
        "PUT" => Method::Put,
        "PATCH" => Method::Patch,
        m => Method::Other(m.to_string()),
    };
    let path = target.split_once('?').map_or(target, |(p, _)| p);
    Ok((method, path.to_string(), http10))
}

/// An answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Response {
    /// The status code.
    pub status: u16,
    /// A JSON body, if any.
    pub body: Option<String>,
}

impl Response {
    /// `204 No Content`: what a successful PUT or PATCH gets.
    pub fn no_content() -> Self {
        Response {
            status: 204,
            body: None,
        }
    }

    /// `200 OK` with a JSON body.
    pub fn json(body: String) -> Self {
        Response {
            status: 200,
            body: Some(body),
        }
    }

    /// `400 Bad Request` with `{"fault_message": msg}`, Firecracker's shape
    /// for every error.
    pub fn fault(msg: &str) -> Self {
        Response {
            status: 400,
            body: Some(serde_json::json!({ "fault_message": msg }).to_string()),
        }
    }

    /// The bytes on the wire.
    pub fn to_bytes(&self, close: bool) -> Vec<u8> {
        let reason = match self.status {
            200 => "OK",
            204 => "No Content",
            400 => "Bad Request",
            404 => "Not Found",
            500 => "Internal Server Error",
            _ => "",
        };
        let mut s = format!("HTTP/1.1 {} {reason}\r\nServer: minivmm\r\n", self.status);
        if close {
            s.push_str("Connection: close\r\n");
        }
        match &self.body {
            Some(b) => {
                let _ = write!(
                    s,
                    "Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{b}",
                    b.len()
                );
            }
            None => s.push_str("\r\n"),
        }
        s.into_bytes()
    }
}

/// What curl waits for after `Expect: 100-continue`.
pub const CONTINUE: &[u8] = b"HTTP/1.1 100 Continue\r\n\r\n";

#[cfg(test)]
mod tests {
    use super::*;

    fn whole(bytes: &[u8]) -> (Request, usize) {
        match parse(bytes) {
            Ok(Parsed::Request(r, n)) => (r, n),
            other => panic!("not a whole request: {other:?}"),
        }
    }

    #[test]
    fn a_put_with_a_body_as_curl_sends_it() {
        let body = br#"{"vcpu_count": 2, "mem_size_mib": 256}"#;
        let mut req = format!(
            "PUT /machine-config HTTP/1.1\r\nHost: localhost\r\nUser-Agent: curl/7.88.1\r\nAccept: application/json\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
            body.len()
        )
        .into_bytes();
        req.extend_from_slice(body);
        let (r, n) = whole(&req);
        assert_eq!(n, req.len());
        assert_eq!(r.method, Method::Put);
        assert_eq!(r.path, "/machine-config");
        assert_eq!(r.body, body);
        assert!(!r.close);
    }

    #[test]
    fn every_prefix_is_incomplete_and_pipelined_requests_split() {
        let one = b"GET / HTTP/1.1\r\nHost: x\r\n\r\n";
        let two = b"PATCH /vm HTTP/1.1\r\nContent-Length: 5\r\n\r\nhello";
        let mut both = one.to_vec();
        both.extend_from_slice(two);
        for cut in 0..one.len() {
            assert_eq!(
                parse(&one[..cut]),
                Ok(Parsed::Incomplete {
                    continue_expected: false
                }),
                "prefix of {cut} bytes"
            );
        }
        let (r, n) = whole(&both);
        assert_eq!(
            (r.method, r.path.as_str(), n),
            (Method::Get, "/", one.len())
        );
        let (r, n) = whole(&both[n..]);
        assert_eq!(
            (r.method, r.body.as_slice(), n),
            (Method::Patch, &b"hello"[..], two.len())
        );
    }

    #[test]
    fn expect_continue_is_reported_once_the_head_is_in() {
        let head =
            b"PUT /drives/rootfs HTTP/1.1\r\nExpect: 100-continue\r\nContent-Length: 2000\r\n\r\n";
        assert_eq!(
            parse(&head[..head.len() - 1]),
            Ok(Parsed::Incomplete {
                continue_expected: false
            })
        );
        assert_eq!(
            parse(head),
            Ok(Parsed::Incomplete {
                continue_expected: true
            })
        );
    }

    #[test]
    fn bounds_are_enforced_before_the_bytes_arrive() {
        let big = format!(
            "PUT /boot-source HTTP/1.1\r\nContent-Length: {}\r\n\r\n",
            MAX_BODY_BYTES + 1
        );
        assert_eq!(
            parse(big.as_bytes()),
            Err(HttpError::BodyTooLarge(
                MAX_BODY_BYTES as u64 + 1,
                MAX_BODY_BYTES
            ))
        );
        // A larger limit (--http-api-max-payload-size) takes that body, and
        // refuses one byte more.
        assert!(matches!(
            parse_limited(big.as_bytes(), MAX_BODY_BYTES + 1),
            Ok(Parsed::Incomplete { .. })
        ));
        assert_eq!(
            parse_limited(big.as_bytes(), 100),
            Err(HttpError::BodyTooLarge(MAX_BODY_BYTES as u64 + 1, 100))
        );
        let at_limit =
            format!("PUT /boot-source HTTP/1.1\r\nContent-Length: {MAX_BODY_BYTES}\r\n\r\n");
        assert!(matches!(
            parse(at_limit.as_bytes()),
            Ok(Parsed::Incomplete { .. })
        ));
        // Headers that never end: refused at the bound, not buffered on.
        let mut endless = b"GET / HTTP/1.1\r\n".to_vec();
        while endless.len() < MAX_HEAD_BYTES {
            endless.extend_from_slice(b"X-Pad: aaaaaaaaaaaaaaaaaaaaaaaa\r\n");
        }
        assert_eq!(parse(&endless), Err(HttpError::HeadTooLarge));
        assert!(matches!(
            parse(&endless[..MAX_HEAD_BYTES - 1]),
            Ok(Parsed::Incomplete { .. })
        ));
        let huge = b"PUT / HTTP/1.1\r\nContent-Length: 99999999999999999999999\r\n\r\n";
        assert!(matches!(parse(huge), Err(HttpError::BodyTooLarge(..))));
    }

    #[test]
    fn malformed_requests_are_refused_with_their_reason() {
        let cases: &[(&[u8], HttpError)] = &[
            (b"GET /\r\n\r\n", HttpError::RequestLine),
            (b"GET  / HTTP/1.1\r\n\r\n", HttpError::RequestLine),
            (b"GET / HTTP/1.1 x\r\n\r\n", HttpError::RequestLine),
            (b"GET noslash HTTP/1.1\r\n\r\n", HttpError::RequestLine),
            (b"G(T / HTTP/1.1\r\n\r\n", HttpError::RequestLine),
            (b"GET / HTTP/2\r\n\r\n", HttpError::Version("HTTP/2".into())),
            (b"GET / HTTP/1.1\r\nNoColon\r\n\r\n", HttpError::Header),
            (b"GET / HTTP/1.1\r\n: empty\r\n\r\n", HttpError::Header),
            (b"GET / HTTP/1.1\r\nBad Name: x\r\n\r\n", HttpError::Header),
            (b"GET / HTTP/1.1\r\nX: \xff\r\n\r\n", HttpError::Header),
            (
                b"PUT / HTTP/1.1\r\nContent-Length: -1\r\n\r\n",
                HttpError::ContentLength,
            ),
            (
                b"PUT / HTTP/1.1\r\nContent-Length: \r\n\r\n",
                HttpError::ContentLength,
            ),
            (
                b"PUT / HTTP/1.1\r\nContent-Length: 1\r\ncontent-length: 1\r\n\r\nx",
                HttpError::ContentLength,
            ),
            (
                b"PUT / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n",
                HttpError::TransferEncoding,
            ),
        ];
        for (bytes, want) in cases {
            assert_eq!(
                parse(bytes).as_ref(),
                Err(want),
                "{:?}",
                String::from_utf8_lossy(bytes)
            );
        }
    }

    #[test]
    fn methods_queries_and_connection_handling() {
        let (r, _) = whole(b"DELETE /drives/x?force=1 HTTP/1.1\r\n\r\n");
        assert_eq!(r.method, Method::Other("DELETE".into()));
        assert_eq!(r.path, "/drives/x");
        let (r, _) = whole(b"GET / HTTP/1.0\r\n\r\n");
        assert!(r.close, "HTTP/1.0 closes unless asked not to");
        let (r, _) = whole(b"GET / HTTP/1.0\r\nConnection: Keep-Alive\r\n\r\n");
        assert!(!r.close);
        let (r, _) = whole(b"GET / HTTP/1.1\r\nConnection: close\r\n\r\n");
        assert!(r.close);
    }

    #[test]
    fn responses_on_the_wire() {
        assert_eq!(
            Response::no_content().to_bytes(false),
            b"HTTP/1.1 204 No Content\r\nServer: minivmm\r\n\r\n"
        );
        let f = Response::fault("bad \"quote\"");
        let wire = String::from_utf8(f.to_bytes(true)).unwrap();
        let body = r#"{"fault_message":"bad \"quote\""}"#;
        assert_eq!(
            wire,
            format!(
                "HTTP/1.1 400 Bad Request\r\nServer: minivmm\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
                body.len()
            )
        );
    }
}
