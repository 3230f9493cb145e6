// SPDX-License-Identifier: Apache-2.0
//! The guest's HTTP/1.1 requests to MMDS and their answers, as Firecracker's
//! MMDS gives them (its user guide's "Errors" list):
//!
//! - `GET <path>`: the value at the path; JSON with `Accept:
//!   application/json`, IMDS text otherwise or with `imds_compat`; 404 when
//!   there is none, 501 for IMDS text of a number, a boolean, an array or
//!   null. Under V2 a valid `X-metadata-token` (or `X-aws-ec2-metadata-token`)
//!   is needed, else 401; under V1 the token is only counted.
//! - `PUT /latest/api/token` with `X-metadata-token-ttl-seconds` (or
//!   `X-aws-ec2-metadata-token-ttl-seconds`) between 1 and 21600: a new
//!   session token, the TTL header echoed; 400 with `X-Forwarded-For`, with
//!   no TTL or a bad one; 404 for a `PUT` elsewhere.
//! - any other method: 405 with `Allow: GET, PUT`; a request that does not
//!   parse: 400.
//!
//! A request is read from a connection's bounded buffer: the request line,
//! the headers and a `Content-Length` body must fit in it together.

use std::time::Instant;

use super::metrics::MmdsMetrics;
use super::store::{Mmds, MmdsError, MmdsVersion, OutputFormat};

/// The largest request (line, headers and body) a connection takes.
pub const MAX_REQUEST_LEN: usize = 4096;
/// Where V2 session tokens are asked for.
pub const TOKEN_PATH: &str = "/latest/api/token";

const TOKEN_HEADERS: [&str; 2] = ["x-metadata-token", "x-aws-ec2-metadata-token"];
const TTL_HEADERS: [&str; 2] = [
    "x-metadata-token-ttl-seconds",
    "x-aws-ec2-metadata-token-ttl-seconds",
];

/// One parsed request, borrowing the connection's buffer.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Request<'a> {
    /// The method as sent.
    pub method: &'a str,
    /// The path, query removed.
    pub path: &'a str,
    /// `HTTP/1.0` rather than `HTTP/1.1`.
    pub http10: bool,
    /// `Accept` names `application/json`.
    pub accept_json: bool,
    /// The session token header's value, if any.
    pub token: Option<&'a str>,
    /// The TTL header's name (as sent) and value, if any.
    pub ttl: Option<(&'a str, &'a str)>,
    /// An `X-Forwarded-For` header was sent.
    pub forwarded: bool,
}

/// What the front of a connection's buffer holds.
#[derive(Debug, PartialEq, Eq)]
pub enum Parsed<'a> {
    /// Not a whole request yet.
    Incomplete,
    /// A request and the bytes it took.
    Request(Request<'a>, usize),
    /// A request that does not parse, and the bytes it took: answered 400.
    Bad(usize),
    /// A request that cannot fit the buffer: the connection is reset.
    TooLarge,
}

fn header_end(buf: &[u8]) -> Option<usize> {
    buf.windows(4).position(|w| w == b"\r\n\r\n").map(|i| i + 4)
}

/// Parses the request at the front of `buf`.
pub fn parse(buf: &[u8]) -> Parsed<'_> {
    let Some(end) = header_end(buf) else {
        return if buf.len() >= MAX_REQUEST_LEN {
            Parsed::TooLarge
        } else {
            Parsed::Incomplete
        };
    };
    let Ok(head) = std::str::from_utf8(&buf[..end - 4]) else {
        return Parsed::Bad(end);
    };
    match parse_head(head) {
        Ok((req, 0)) => Parsed::Request(req, end),
        Ok((req, body)) => match end.checked_add(body) {
            Some(total) if total <= buf.len() => Parsed::Request(req, total),
            Some(total) if total <= MAX_REQUEST_LEN => Parsed::Incomplete,
            _ => Parsed::TooLarge,
        },
        Err(()) => Parsed::Bad(end),
    }
}

/// The request line and headers; the request and its body length.
fn parse_head(head: &str) -> Result<(Request<'_>, usize), ()> {
    let mut lines = head.split("\r\n");
    let mut parts = lines.next().ok_or(())?.split(' ');
    let (Some(method), Some(uri), Some(version), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(());
    };
    if method.is_empty() || !method.bytes().all(|b| b.is_ascii_uppercase()) {
        return Err(());
    }
    let http10 = match version {
        "HTTP/1.1" => false,
        "HTTP/1.0" => true,
        _ => return Err(()),
    };
    let path = uri.split('?').next().unwrap_or_default();
    if !path.starts_with('/') {
        return Err(());
    }
    let mut req = Request {
        method,
        path,
        http10,
        ..Request::default()
    };
    let mut body = 0usize;
    for line in lines {
        let (name, value) = line.split_once(':').ok_or(())?;
        if name.is_empty() || name.bytes().any(|b| b.is_ascii_whitespace()) {
            return Err(());
        }
        let value = value.trim();
        let lower = name.to_ascii_lowercase();
        match lower.as_str() {
            "accept" => {
                req.accept_json = value
                    .split(',')
                    .any(|m| m.split(';').next().unwrap_or_default().trim() == "application/json")
            }
            "content-length" => body = value.parse().map_err(|_| ())?,
            "transfer-encoding" => return Err(()),
            "x-forwarded-for" => req.forwarded = true,
            n if TOKEN_HEADERS.contains(&n) => req.token = Some(value),
            n if TTL_HEADERS.contains(&n) => req.ttl = Some((name, value)),
            _ => {}
        }
    }
    Ok((req, body))
}

/// An answer, before it is written out.
#[derive(Debug, PartialEq, Eq)]
pub struct Response {
    /// The status code.
    pub status: u16,
    /// `application/json` rather than `text/plain`.
    pub json: bool,
    /// The body.
    pub body: String,
    /// One more header line (name, value), if any.
    pub header: Option<(String, String)>,
}

impl Response {
    fn text(status: u16, body: impl Into<String>) -> Self {
        Response {
            status,
            json: false,
            body: body.into(),
            header: None,
        }
    }

    /// The answer to a request that does not parse.
    pub fn bad_request() -> Self {
        Response::text(400, "The request could not be parsed.")
    }

    /// Writes the response as HTTP/1.x bytes into `out` (cleared first).
    pub fn write(&self, http10: bool, out: &mut Vec<u8>) {
        use std::io::Write;
        out.clear();
        let reason = match self.status {
            200 => "OK",
            400 => "Bad Request",
            401 => "Unauthorized",
            404 => "Not Found",
            405 => "Method Not Allowed",
            _ => "Not Implemented",
        };
        let version = if http10 { "HTTP/1.0" } else { "HTTP/1.1" };
        let ctype = if self.json {
            "application/json"
        } else {
            "text/plain"
        };
        // Writing into a Vec cannot fail.
        let _ = write!(
            out,
            "{version} {} {reason}\r\nServer: Firecracker API\r\nConnection: keep-alive\r\n\
             Content-Type: {ctype}\r\nContent-Length: {}\r\n",
            self.status,
            self.body.len()
        );
        if let Some((name, value)) = &self.header {
            let _ = write!(out, "{name}: {value}\r\n");
        }
        out.extend_from_slice(b"\r\n");
        out.extend_from_slice(self.body.as_bytes());
    }
}

/// Answers one request against the store at time `now`, counting it.
pub fn respond(mmds: &mut Mmds, req: &Request<'_>, now: Instant, m: &MmdsMetrics) -> Response {
    let r = match req.method {
        "GET" => get(mmds, req, now, m),
        "PUT" => put(mmds, req, now, m),
        _ => Response {
            header: Some(("Allow".into(), "GET, PUT".into())),
            ..Response::text(405, "Not allowed HTTP method.")
        },
    };
    MmdsMetrics::inc(if r.status == 200 {
        &m.mmds_requests_accepted
    } else {
        &m.mmds_requests_refused
    });
    r
}

fn get(mmds: &Mmds, req: &Request<'_>, now: Instant, m: &MmdsMetrics) -> Response {
    let valid = match req.token {
        None => {
            MmdsMetrics::inc(&m.mmds_rx_no_token);
            false
        }
        Some(t) => {
            let ok = mmds.token_valid(t, now);
            if !ok {
                MmdsMetrics::inc(&m.mmds_rx_invalid_token);
            }
            ok
        }
    };
    if mmds.version() == MmdsVersion::V2 && !valid {
        return Response::text(
            401,
            if req.token.is_none() {
                "No MMDS token provided. Use `X-metadata-token` or `X-aws-ec2-metadata-token` \
                 header to specify the session token."
            } else {
                "MMDS token not valid."
            },
        );
    }
    let format = if req.accept_json {
        OutputFormat::Json
    } else {
        OutputFormat::Imds
    };
    match mmds.get(req.path, format) {
        Ok(body) => Response {
            json: req.accept_json && !mmds.imds_compat(),
            ..Response::text(200, body)
        },
        Err(MmdsError::NotFound) => {
            Response::text(404, format!("Resource not found: {}.", req.path))
        }
        Err(e) => Response::text(501, e.to_string()),
    }
}

fn put(mmds: &mut Mmds, req: &Request<'_>, now: Instant, m: &MmdsMetrics) -> Response {
    if req.forwarded {
        return Response::text(
            400,
            "Invalid header. Reason: Unsupported header name. Key: X-Forwarded-For",
        );
    }
    let collapsed: String = {
        let mut s = String::new();
        for part in req.path.split('/').filter(|p| !p.is_empty()) {
            s.push('/');
            s.push_str(part);
        }
        s
    };
    if collapsed != TOKEN_PATH {
        return Response::text(404, format!("Resource not found: {}.", req.path));
    }
    let Some((name, value)) = req.ttl else {
        return Response::text(
            400,
            "Token time to live value not found. Use `X-metadata-token-ttl-seconds` or \
             `X-aws-ec2-metadata-token-ttl-seconds` header to specify the token's lifetime.",
        );
    };
    let Ok(ttl) = value.parse::<u32>() else {
        return Response::text(
            400,
            format!("Invalid header. Reason: Invalid value. Key:{name}; Value:{value}"),
        );
    };
    match mmds.new_token(ttl, now) {
        Ok(token) => {
            MmdsMetrics::inc(&m.mmds_tokens_issued);
            Response {
                header: Some((name.to_string(), ttl.to_string())),
                ..Response::text(200, token)
            }
        }
        Err(e) => Response::text(400, e.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use std::sync::atomic::Ordering;
    use std::time::Duration;

    fn ask(mmds: &mut Mmds, raw: &str, now: Instant, m: &MmdsMetrics) -> Response {
        match parse(raw.as_bytes()) {
            Parsed::Request(req, n) => {
                assert_eq!(n, raw.len(), "the whole request is taken");
                respond(mmds, &req, now, m)
            }
            other => panic!("{raw:?} parsed as {other:?}"),
        }
    }

    fn store(version: MmdsVersion) -> Mmds {
        let mut s = Mmds::new(10_000);
        s.put(json!({"latest":{"meta-data":{"ami-id":"ami-1"}},"n":1}))
            .expect("fits");
        s.configure(version, false);
        s
    }

    #[test]
    fn test_parse_boundaries() {
        assert_eq!(parse(b"GET / HTTP/1.1\r\n"), Parsed::Incomplete);
        assert_eq!(parse(&[b'a'; MAX_REQUEST_LEN]), Parsed::TooLarge);
        assert_eq!(parse(b"GET / HTTP/2\r\n\r\n"), Parsed::Bad(16));
        assert_eq!(parse(b"get / HTTP/1.1\r\n\r\n"), Parsed::Bad(18));
        assert_eq!(parse(b"GET x HTTP/1.1\r\n\r\n"), Parsed::Bad(18));
        assert_eq!(parse(b"GET /  HTTP/1.1\r\n\r\n"), Parsed::Bad(19));
        assert_eq!(parse(b"GET / HTTP/1.1\r\nnocolon\r\n\r\n"), Parsed::Bad(27));
        assert_eq!(parse(b"GET / HTTP/1.1\r\nA B: c\r\n\r\n"), Parsed::Bad(26));
        assert_eq!(
            parse(b"GET / HTTP/1.1\r\nContent-Length: x\r\n\r\n"),
            Parsed::Bad(37)
        );
        assert_eq!(
            parse(b"GET / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n"),
            Parsed::Bad(46)
        );
        assert_eq!(parse(b"\xff / HTTP/1.1\r\n\r\n"), Parsed::Bad(16));
        // A body is waited for, and one that cannot fit is too large.
        assert_eq!(
            parse(b"PUT / HTTP/1.1\r\nContent-Length: 3\r\n\r\nab"),
            Parsed::Incomplete
        );
        let whole = b"PUT / HTTP/1.1\r\nContent-Length: 3\r\n\r\nabcGET";
        assert!(matches!(parse(whole), Parsed::Request(_, n) if n == whole.len() - 3));
        assert_eq!(
            parse(b"PUT / HTTP/1.1\r\nContent-Length: 5000\r\n\r\n"),
            Parsed::TooLarge
        );
        assert_eq!(
            parse(b"PUT / HTTP/1.1\r\nContent-Length: 18446744073709551615\r\n\r\n"),
            Parsed::TooLarge
        );
        let Parsed::Request(r, _) =
            parse(b"GET /a?b=c HTTP/1.0\r\nAccept: text/plain, application/json;q=1\r\nX-Aws-Ec2-Metadata-Token: t\r\nX-Forwarded-For: 1\r\n\r\n")
        else {
            panic!("parses");
        };
        assert_eq!(
            r,
            Request {
                method: "GET",
                path: "/a",
                http10: true,
                accept_json: true,
                token: Some("t"),
                ttl: None,
                forwarded: true,
            }
        );
    }

    #[test]
    fn test_v1_get_with_and_without_token_counts_both() {
        let mut s = store(MmdsVersion::V1);
        let m = MmdsMetrics::default();
        let now = Instant::now();
        let r = ask(
            &mut s,
            "GET /latest/meta-data/ami-id HTTP/1.1\r\n\r\n",
            now,
            &m,
        );
        assert_eq!((r.status, r.body.as_str(), r.json), (200, "ami-1", false));
        let r = ask(
            &mut s,
            "GET /latest HTTP/1.1\r\nAccept: application/json\r\nX-metadata-token: nope\r\n\r\n",
            now,
            &m,
        );
        assert_eq!((r.status, r.json), (200, true));
        assert_eq!(r.body, r#"{"meta-data":{"ami-id":"ami-1"}}"#);
        assert_eq!(m.mmds_rx_no_token.load(Ordering::Relaxed), 1);
        assert_eq!(m.mmds_rx_invalid_token.load(Ordering::Relaxed), 1);
        assert_eq!(m.mmds_requests_accepted.load(Ordering::Relaxed), 2);
    }

    #[test]
    fn test_v2_token_flow_and_expiry() {
        let mut s = store(MmdsVersion::V2);
        let m = MmdsMetrics::default();
        let t0 = Instant::now();
        let r = ask(&mut s, "GET /n HTTP/1.1\r\n\r\n", t0, &m);
        assert_eq!(r.status, 401);
        assert!(r.body.starts_with("No MMDS token provided"));
        let r = ask(
            &mut s,
            "PUT /latest/api/token HTTP/1.1\r\nX-metadata-token-ttl-seconds: 2\r\n\r\n",
            t0,
            &m,
        );
        assert_eq!(r.status, 200);
        assert_eq!(
            r.header,
            Some(("X-metadata-token-ttl-seconds".into(), "2".into()))
        );
        let get = format!(
            "GET /n HTTP/1.1\r\nAccept: application/json\r\nX-aws-ec2-metadata-token: {}\r\n\r\n",
            r.body
        );
        let ok = ask(&mut s, &get, t0 + Duration::from_secs(1), &m);
        assert_eq!((ok.status, ok.body.as_str()), (200, "1"));
        let late = ask(&mut s, &get, t0 + Duration::from_secs(2), &m);
        assert_eq!(
            (late.status, late.body.as_str()),
            (401, "MMDS token not valid.")
        );
        assert_eq!(m.mmds_tokens_issued.load(Ordering::Relaxed), 1);
        assert_eq!(m.mmds_rx_invalid_token.load(Ordering::Relaxed), 1);
        assert_eq!(m.mmds_requests_refused.load(Ordering::Relaxed), 2);
    }

    #[test]
    fn test_token_request_refusals() {
        let mut s = store(MmdsVersion::V2);
        let m = MmdsMetrics::default();
        let now = Instant::now();
        let cases = [
            ("PUT /latest/api/token HTTP/1.1\r\n\r\n", 400, "Token time to live value not found"),
            (
                "PUT /latest/api/token HTTP/1.1\r\nX-metadata-token-ttl-seconds: 0\r\n\r\n",
                400,
                "Invalid time to live value provided for token: 0.",
            ),
            (
                "PUT /latest/api/token HTTP/1.1\r\nX-aws-ec2-metadata-token-ttl-seconds: 21601\r\n\r\n",
                400,
                "Invalid time to live value provided for token: 21601.",
            ),
            (
                "PUT /latest/api/token HTTP/1.1\r\nX-metadata-token-ttl-seconds: -1\r\n\r\n",
                400,
                "Invalid header",
            ),
            (
                "PUT /latest/api/token HTTP/1.1\r\nX-Forwarded-For: 10.0.0.1\r\nX-metadata-token-ttl-seconds: 5\r\n\r\n",
                400,
                "Invalid header. Reason: Unsupported header name",
            ),
            ("PUT /latest/other HTTP/1.1\r\n\r\n", 404, "Resource not found: /latest/other."),
            ("PATCH / HTTP/1.1\r\n\r\n", 405, "Not allowed HTTP method."),
            ("GET /latest HTTP/1.1\r\nX-metadata-token: x\r\n\r\n", 401, "MMDS token not valid."),
        ];
        for (raw, status, body) in cases {
            let r = ask(&mut s, raw, now, &m);
            assert_eq!(r.status, status, "{raw:?}: {r:?}");
            assert!(r.body.starts_with(body), "{raw:?}: {r:?}");
        }
        // `//` in the token path is the token path.
        let r = ask(
            &mut s,
            "PUT //latest//api/token/ HTTP/1.1\r\nX-metadata-token-ttl-seconds: 5\r\n\r\n",
            now,
            &m,
        );
        assert_eq!(r.status, 200);
    }

    #[test]
    fn test_not_found_and_unsupported_value() {
        let mut s = store(MmdsVersion::V1);
        let m = MmdsMetrics::default();
        let now = Instant::now();
        let r = ask(&mut s, "GET /x/y HTTP/1.1\r\n\r\n", now, &m);
        assert_eq!(
            (r.status, r.body.as_str()),
            (404, "Resource not found: /x/y.")
        );
        let r = ask(&mut s, "GET /n HTTP/1.1\r\n\r\n", now, &m);
        assert_eq!(r.status, 501);
    }

    #[test]
    fn test_response_bytes() {
        let mut out = vec![1, 2, 3];
        Response {
            header: Some(("Allow".into(), "GET, PUT".into())),
            ..Response::text(405, "no")
        }
        .write(false, &mut out);
        assert_eq!(
            String::from_utf8(out.clone()).expect("ascii"),
            "HTTP/1.1 405 Method Not Allowed\r\nServer: Firecracker API\r\nConnection: keep-alive\r\n\
             Content-Type: text/plain\r\nContent-Length: 2\r\nAllow: GET, PUT\r\n\r\nno"
        );
        Response {
            json: true,
            ..Response::text(200, "{}")
        }
        .write(true, &mut out);
        assert!(out.starts_with(b"HTTP/1.0 200 OK\r\n"));
        assert!(out.ends_with(b"Content-Type: application/json\r\nContent-Length: 2\r\n\r\n{}"));
    }
}
