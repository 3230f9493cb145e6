// SPDX-License-Identifier: Apache-2.0
//! `mvperf http`: a small HTTP/1.1 client, enough for a guest to read its metadata service
//! (MMDS) as Firecracker's user guide shows with curl: `PUT /latest/api/token` with
//! `X-metadata-token-ttl-seconds`, then `GET`s with `X-metadata-token` and `Accept:
//! application/json`. It lets the guest image go without curl and the shared libraries curl
//! needs, which doubled the initramfs every guest boot unpacks.
//!
//! One request per connection (`Connection: close`), `http://` URLs with a numeric address or
//! a name libc resolves, any method, extra headers and a `Content-Length` body; the answer's
//! body is read by `Content-Length`, `Transfer-Encoding: chunked` or until the server closes,
//! interim `1xx` answers skipped. One deadline bounds the whole exchange, and every part of an
//! answer is bounded ([`MAX_HEAD`], [`MAX_BODY`]), so a wrong or hostile server ends the call
//! with an error, never a hang. `https://` is not served.

use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};

/// The longest status line plus headers taken from one answer.
pub const MAX_HEAD: usize = 64 * 1024;
/// The largest body taken (Firecracker's largest `--mmds-size-limit`, 64 MiB).
pub const MAX_BODY: usize = 64 << 20;
/// How much of an error answer's body an error message shows.
const ERROR_BODY_SHOWN: usize = 200;

/// Where a request goes: an `http://` URL taken apart.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Url {
    /// The host as written (brackets kept off an IPv6 address).
    pub host: String,
    /// The port (80 unless given).
    pub port: u16,
    /// The request target: the path and query, `/` when the URL has none.
    pub target: String,
}

impl Url {
    /// Parses `http://HOST[:PORT][/PATH][?QUERY][#FRAGMENT]` (the fragment is dropped, as
    /// it is never sent).
    pub fn parse(url: &str) -> Result<Url> {
        let Some(rest) = strip_scheme(url) else {
            bail!("'{url}' is not an http:// URL");
        };
        let (authority, target) = match rest.find(['/', '?', '#']) {
            Some(i) => (&rest[..i], &rest[i..]),
            None => (rest, ""),
        };
        let target = target.split('#').next().unwrap_or_default();
        let target = if target.starts_with('/') {
            target.to_string()
        } else {
            format!("/{target}")
        };
        if target.bytes().any(|b| b <= b' ' || b == 0x7f) {
            bail!("the path of '{url}' has a space or a control character");
        }
        if authority.contains('@') {
            bail!("'{url}': user names in URLs are not supported");
        }
        let (host, port) = split_authority(authority)
            .ok_or_else(|| anyhow!("'{url}' has no valid host[:port]"))?;
        Ok(Url {
            host: host.to_string(),
            port,
            target,
        })
    }

    /// The `Host` header's value.
    fn host_header(&self) -> String {
        let host = if self.host.contains(':') {
            format!("[{}]", self.host)
        } else {
            self.host.clone()
        };
        if self.port == 80 {
            host
        } else {
            format!("{host}:{}", self.port)
        }
    }
}

fn strip_scheme(url: &str) -> Option<&str> {
    let (scheme, rest) = url.split_once("://")?;
    scheme.eq_ignore_ascii_case("http").then_some(rest)
}

/// `HOST`, `HOST:PORT`, `[V6]` or `[V6]:PORT`.
fn split_authority(authority: &str) -> Option<(&str, u16)> {
    let (host, port) = if let Some(v6) = authority.strip_prefix('[') {
        let (host, after) = v6.split_once(']')?;
        match after {
            "" => (host, None),
            _ => (host, Some(after.strip_prefix(':')?)),
        }
    } else {
        match authority.split_once(':') {
            Some((host, port)) => (host, Some(port)),
            None => (authority, None),
        }
    };
    let port = match port {
        None => 80,
        Some(p) if !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()) => p.parse().ok()?,
        Some(_) => return None,
    };
    let host_ok = !host.is_empty()
        && host
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b".-_:%".contains(&b));
    (host_ok && port != 0).then_some((host, port))
}

/// One request, as the command line gives it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    /// The method (`GET`, `PUT`, ...).
    pub method: String,
    /// Where it goes.
    pub url: Url,
    /// Extra headers, name and value, in order.
    pub headers: Vec<(String, String)>,
    /// The body, sent with `Content-Length`.
    pub body: Option<Vec<u8>>,
}

/// Whether `s` is an HTTP token (RFC 9110 §5.6.2): a method or a header name.
fn is_token(s: &str) -> bool {
    !s.is_empty()
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b))
}

/// Headers this client writes itself, which a caller may not set.
const OWN_HEADERS: [&str; 3] = ["content-length", "transfer-encoding", "connection"];

impl Request {
    /// A request checked for what would make it malformed on the wire.
    pub fn new(
        method: &str,
        url: &str,
        headers: &[String],
        body: Option<Vec<u8>>,
    ) -> Result<Request> {
        if !is_token(method) {
            bail!("'{method}' is not an HTTP method");
        }
        let url = Url::parse(url)?;
        let headers = headers
            .iter()
            .map(|h| parse_header_arg(h))
            .collect::<Result<Vec<_>>>()?;
        Ok(Request {
            method: method.to_string(),
            url,
            headers,
            body,
        })
    }

    /// The request's bytes: the request line, `Host` (unless given), `Connection: close`,
    /// the caller's headers, `Content-Length` when there is a body or the method is one
    /// that carries one, and the body.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = format!("{} {} HTTP/1.1\r\n", self.method, self.url.target);
        let given = |name: &str| {
            self.headers
                .iter()
                .any(|(n, _)| n.eq_ignore_ascii_case(name))
        };
        if !given("host") {
            out.push_str(&format!("Host: {}\r\n", self.url.host_header()));
        }
        if !given("user-agent") {
            out.push_str(concat!(
                "User-Agent: mvperf/",
                env!("CARGO_PKG_VERSION"),
                "\r\n"
            ));
        }
        out.push_str("Connection: close\r\n");
        for (name, value) in &self.headers {
            out.push_str(&format!("{name}: {value}\r\n"));
        }
        let body = self.body.as_deref().unwrap_or_default();
        // RFC 9110 §8.6: a request whose method defines content says how long it is.
        if self.body.is_some() || matches!(self.method.as_str(), "PUT" | "POST" | "PATCH") {
            out.push_str(&format!("Content-Length: {}\r\n", body.len()));
        }
        out.push_str("\r\n");
        let mut bytes = out.into_bytes();
        bytes.extend_from_slice(body);
        bytes
    }
}

/// `Name: value` from the command line.
fn parse_header_arg(arg: &str) -> Result<(String, String)> {
    let Some((name, value)) = arg.split_once(':') else {
        bail!("header '{arg}' is not 'Name: value'");
    };
    if !is_token(name) {
        bail!("header '{arg}': '{name}' is not a header name");
    }
    if OWN_HEADERS.contains(&name.to_ascii_lowercase().as_str()) {
        bail!("header '{arg}': mvperf http writes {name} itself");
    }
    let value = value.trim();
    if value.bytes().any(|b| (b < b' ' && b != b'\t') || b == 0x7f) {
        bail!("header '{name}' has a control character in its value");
    }
    Ok((name.to_string(), value.to_string()))
}

/// An answer: its status, reason, headers (names lower-cased) and body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Response {
    /// The status code.
    pub status: u16,
    /// The reason phrase, as sent.
    pub reason: String,
    /// The headers, names lower-cased, values trimmed, in order.
    pub headers: Vec<(String, String)>,
    /// The body, de-chunked.
    pub body: Vec<u8>,
}

impl Response {
    /// The first value of header `name` (lower case).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }

    /// A 2xx status.
    pub fn is_success(&self) -> bool {
        (200..300).contains(&self.status)
    }

    /// One line for an answer that is not a success: status, reason and the start of the
    /// body with its line breaks and control characters shown as spaces.
    pub fn error_line(&self) -> String {
        let shown = &self.body[..self.body.len().min(ERROR_BODY_SHOWN)];
        let text: String = String::from_utf8_lossy(shown)
            .chars()
            .map(|c| if c.is_control() { ' ' } else { c })
            .collect();
        let more = if self.body.len() > ERROR_BODY_SHOWN {
            "..."
        } else {
            ""
        };
        format!("{} {}: {}{more}", self.status, self.reason, text.trim())
    }
}

/// A socket whose every read and write gets the time left before one deadline.
struct Timed<'a> {
    stream: &'a TcpStream,
    deadline: Instant,
}

impl Timed<'_> {
    fn left(&self) -> io::Result<Duration> {
        let left = self.deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "the deadline passed",
            ))
        } else {
            Ok(left)
        }
    }
}

/// EAGAIN from a socket timeout reads as "Resource temporarily unavailable"; say what it is.
fn timeout_named(e: io::Error) -> io::Error {
    match e.kind() {
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => {
            io::Error::new(io::ErrorKind::TimedOut, "timed out")
        }
        _ => e,
    }
}

impl Read for Timed<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.stream.set_read_timeout(Some(self.left()?))?;
        (&*self.stream).read(buf).map_err(timeout_named)
    }
}

impl Write for Timed<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.stream.set_write_timeout(Some(self.left()?))?;
        (&*self.stream).write(buf).map_err(timeout_named)
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// Sends `req` and reads its answer, all within `timeout`.
pub fn fetch(req: &Request, timeout: Duration) -> Result<Response> {
    let deadline = Instant::now() + timeout;
    let addr = crate::client::resolve(&req.url.host, req.url.port)?;
    let stream = TcpStream::connect_timeout(&addr, timeout)
        .map_err(timeout_named)
        .with_context(|| format!("connecting to {addr}"))?;
    let mut conn = Timed {
        stream: &stream,
        deadline,
    };
    conn.write_all(&req.to_bytes())
        .context("sending the request")?;
    let head_only = req.method == "HEAD";
    read_response(&mut BufReader::new(conn), head_only).context("reading the answer")
}

/// Reads one answer from `r`, skipping interim `1xx` ones; `head_only` for a `HEAD`
/// request, whose answer has no body whatever its headers say.
pub fn read_response<R: BufRead>(r: &mut R, head_only: bool) -> Result<Response> {
    let mut budget = MAX_HEAD;
    loop {
        let (status, reason) = parse_status_line(&read_line(r, &mut budget)?)?;
        let headers = read_headers(r, &mut budget)?;
        // 101 switches protocols: nothing this client asks for.
        if (100..200).contains(&status) && status != 101 {
            continue;
        }
        let no_body = head_only || status < 200 || status == 204 || status == 304;
        let mut resp = Response {
            status,
            reason,
            headers,
            body: Vec::new(),
        };
        if !no_body {
            resp.body = read_body(r, &resp)?;
        }
        return Ok(resp);
    }
}

/// One line ending in LF (a CR before it dropped), charged to `budget`.
fn read_line<R: BufRead>(r: &mut R, budget: &mut usize) -> Result<String> {
    let mut line = Vec::new();
    let limit = u64::try_from(*budget).unwrap_or(u64::MAX) + 1;
    let n = r.take(limit).read_until(b'\n', &mut line)?;
    if n > *budget {
        bail!("the answer's head is longer than {MAX_HEAD} bytes");
    }
    *budget -= n;
    if line.pop() != Some(b'\n') {
        bail!("the connection closed in the middle of the answer's head");
    }
    if line.last() == Some(&b'\r') {
        line.pop();
    }
    String::from_utf8(line).map_err(|_| anyhow!("the answer's head is not UTF-8"))
}

/// `HTTP/1.x CODE REASON`.
fn parse_status_line(line: &str) -> Result<(u16, String)> {
    let bad = || anyhow!("'{line}' is not an HTTP status line");
    let mut parts = line.splitn(3, ' ');
    let version = parts.next().ok_or_else(bad)?;
    if !matches!(version, "HTTP/1.1" | "HTTP/1.0") {
        return Err(bad());
    }
    let code = parts.next().ok_or_else(bad)?;
    if code.len() != 3 || !code.bytes().all(|b| b.is_ascii_digit()) {
        return Err(bad());
    }
    let status: u16 = code.parse().map_err(|_| bad())?;
    if !(100..600).contains(&status) {
        return Err(bad());
    }
    Ok((status, parts.next().unwrap_or_default().to_string()))
}

fn read_headers<R: BufRead>(r: &mut R, budget: &mut usize) -> Result<Vec<(String, String)>> {
    let mut headers = Vec::new();
    loop {
        let line = read_line(r, budget)?;
        if line.is_empty() {
            return Ok(headers);
        }
        let Some((name, value)) = line.split_once(':') else {
            bail!("'{line}' is not a header line");
        };
        if !is_token(name) {
            bail!("'{line}' is not a header line");
        }
        headers.push((name.to_ascii_lowercase(), value.trim().to_string()));
    }
}

/// The body, framed as RFC 9112 §6.3 says: chunked, then `Content-Length`, else up to EOF.
fn read_body<R: BufRead>(r: &mut R, resp: &Response) -> Result<Vec<u8>> {
    if let Some(te) = resp.header("transfer-encoding") {
        let last = te.rsplit(',').next().unwrap_or_default().trim();
        if !last.eq_ignore_ascii_case("chunked") {
            bail!("the answer's transfer coding '{te}' is not supported");
        }
        return read_chunked(r);
    }
    let lengths: Vec<&str> = resp
        .headers
        .iter()
        .filter(|(n, _)| n == "content-length")
        .map(|(_, v)| v.as_str())
        .collect();
    match lengths.first() {
        Some(first) => {
            if lengths.iter().any(|l| l != first) {
                bail!("the answer has conflicting Content-Length headers");
            }
            let len = parse_length(first, 10)?;
            read_exact_body(r, len)
        }
        None => read_to_close(r),
    }
}

/// A length in base `radix`, digits only, at most [`MAX_BODY`].
fn parse_length(s: &str, radix: u32) -> Result<usize> {
    if s.is_empty() || !s.chars().all(|c| c.is_digit(radix)) {
        bail!("'{s}' is not a body length");
    }
    match usize::from_str_radix(s, radix) {
        Ok(n) if n <= MAX_BODY => Ok(n),
        _ => bail!("the answer's body is longer than {MAX_BODY} bytes"),
    }
}

fn read_exact_body<R: Read>(r: &mut R, len: usize) -> Result<Vec<u8>> {
    let mut body = Vec::new();
    let got = r.take(len as u64).read_to_end(&mut body)?;
    if got < len {
        bail!("the connection closed after {got} of {len} body bytes");
    }
    Ok(body)
}

fn read_to_close<R: Read>(r: &mut R) -> Result<Vec<u8>> {
    let mut body = Vec::new();
    r.take(MAX_BODY as u64 + 1).read_to_end(&mut body)?;
    if body.len() > MAX_BODY {
        bail!("the answer's body is longer than {MAX_BODY} bytes");
    }
    Ok(body)
}

/// A chunked body (RFC 9112 §7.1): chunk extensions ignored, trailers read and dropped.
fn read_chunked<R: BufRead>(r: &mut R) -> Result<Vec<u8>> {
    let mut body = Vec::new();
    let mut budget = MAX_HEAD;
    loop {
        let line = read_line(r, &mut budget)?;
        let size = line.split(';').next().unwrap_or_default().trim();
        let size = parse_length(size, 16)?;
        if size == 0 {
            read_headers(r, &mut budget)?;
            return Ok(body);
        }
        if body.len() + size > MAX_BODY {
            bail!("the answer's body is longer than {MAX_BODY} bytes");
        }
        body.extend(read_exact_body(r, size)?);
        let mut crlf = [0u8; 2];
        r.read_exact(&mut crlf)
            .context("the connection closed inside a chunk")?;
        if &crlf != b"\r\n" {
            bail!("a chunk does not end with CRLF");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;
    use std::thread;

    fn parse(bytes: &[u8]) -> Result<Response> {
        read_response(&mut &bytes[..], false)
    }

    #[test]
    fn urls() {
        let u = Url::parse("http://169.254.169.254/latest/api/token").expect("url");
        assert_eq!(
            u,
            Url {
                host: "169.254.169.254".into(),
                port: 80,
                target: "/latest/api/token".into()
            }
        );
        assert_eq!(u.host_header(), "169.254.169.254");
        let u = Url::parse("HTTP://[::1]:8080?x=1#frag").expect("url");
        assert_eq!((u.host.as_str(), u.port), ("::1", 8080));
        assert_eq!(u.target, "/?x=1");
        assert_eq!(u.host_header(), "[::1]:8080");
        let u = Url::parse("http://localhost:81").expect("url");
        assert_eq!((u.port, u.target.as_str()), (81, "/"));
        assert_eq!(u.host_header(), "localhost:81");
        let u = Url::parse("http://[fe80::1]/a").expect("url");
        assert_eq!((u.host.as_str(), u.port), ("fe80::1", 80));
        for bad in [
            "https://h/",
            "h/x",
            "http://",
            "http://h:/",
            "http://h:0/",
            "http://h:65536/",
            "http://h:-1/",
            "http://u@h/",
            "http://h/a b",
            "http://h/a\r\nX: y",
            "http://[::1/",
            "http://[::1]x/",
            "http://h h/",
        ] {
            assert!(Url::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn request_bytes() {
        let req = Request::new(
            "PUT",
            "http://169.254.169.254/latest/api/token",
            &["X-metadata-token-ttl-seconds: 21600".into()],
            None,
        )
        .expect("request");
        let ua = concat!("User-Agent: mvperf/", env!("CARGO_PKG_VERSION"));
        assert_eq!(
            String::from_utf8(req.to_bytes()).expect("UTF-8"),
            format!(
                "PUT /latest/api/token HTTP/1.1\r\nHost: 169.254.169.254\r\n{ua}\r\n\
                 Connection: close\r\nX-metadata-token-ttl-seconds: 21600\r\n\
                 Content-Length: 0\r\n\r\n"
            )
        );
        let req = Request::new(
            "GET",
            "http://h:8/",
            &["Host: other".into(), "User-Agent: x".into()],
            None,
        )
        .expect("request");
        assert_eq!(
            String::from_utf8(req.to_bytes()).expect("UTF-8"),
            "GET / HTTP/1.1\r\nConnection: close\r\nHost: other\r\nUser-Agent: x\r\n\r\n"
        );
        let req =
            Request::new("POST", "http://h/p", &[], Some(b"{\"a\":1}".to_vec())).expect("request");
        let text = String::from_utf8(req.to_bytes()).expect("UTF-8");
        assert!(
            text.ends_with("Content-Length: 7\r\n\r\n{\"a\":1}"),
            "{text}"
        );
        for method in ["PATCH", "POST"] {
            let req = Request::new(method, "http://h/", &[], None).expect("request");
            assert!(String::from_utf8(req.to_bytes())
                .expect("UTF-8")
                .contains("Content-Length: 0\r\n"));
        }
        // GET with a body says how long it is too.
        let req = Request::new("GET", "http://h/", &[], Some(b"xy".to_vec())).expect("request");
        assert!(req.to_bytes().ends_with(b"Content-Length: 2\r\n\r\nxy"));
    }

    #[test]
    fn bad_requests_are_refused_before_sending() {
        assert!(Request::new("G T", "http://h/", &[], None).is_err());
        assert!(Request::new("", "http://h/", &[], None).is_err());
        assert!(Request::new("GET", "ftp://h/", &[], None).is_err());
        for h in [
            "NoColon",
            ": v",
            "Bad Name: v",
            "X: a\rb",
            "X: a\nInjected: b",
            "X: a\0b",
            "Content-Length: 5",
            "transfer-encoding: chunked",
            "Connection: keep-alive",
        ] {
            assert!(
                Request::new("GET", "http://h/", &[h.into()], None).is_err(),
                "{h}"
            );
        }
        let ok = Request::new("GET", "http://h/", &["X-A:\tv ".into()], None).expect("ok");
        assert_eq!(ok.headers, vec![("X-A".to_string(), "v".to_string())]);
    }

    #[test]
    fn content_length_answers() {
        let r = parse(
            b"HTTP/1.1 200 OK\r\nServer: Firecracker API\r\nContent-Type: application/json\r\n\
              Content-Length: 11\r\n\r\n{\"a\":\"b\"}\nXtrailing",
        )
        .expect("answer");
        assert_eq!((r.status, r.reason.as_str()), (200, "OK"));
        assert_eq!(r.body, b"{\"a\":\"b\"}\nX");
        assert_eq!(r.header("content-type"), Some("application/json"));
        assert_eq!(r.header("x-none"), None);
        assert!(r.is_success());
        // Bare LF line ends are taken too.
        let r = parse(b"HTTP/1.0 404 Not Found\nContent-Length: 3\n\nabc").expect("answer");
        assert_eq!((r.status, r.body.as_slice()), (404, &b"abc"[..]));
        assert!(!r.is_success());
        let r = parse(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\ncontent-length: 2\r\n\r\nhi")
            .expect("answer");
        assert_eq!(r.body, b"hi");
    }

    #[test]
    fn chunked_answers() {
        let r = parse(
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, Chunked\r\n\r\n\
              4;ext=1\r\nWiki\r\nA\r\npedia in c\r\n0\r\nX-Trailer: t\r\n\r\nnext",
        );
        // Only the last transfer coding frames the body (gzip before it is not undone).
        assert_eq!(r.expect("answer").body, b"Wikipedia in c");
        let r = parse(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n")
            .expect("answer");
        assert!(r.body.is_empty());
        for bad in [
            &b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n4\r\nWikiXX0\r\n\r\n"[..],
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n-4\r\nWiki\r\n",
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n4\r\nWi",
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n4\r\nWiki\r\n",
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nffffffffffffffffff\r\n",
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n4000001\r\n",
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\nabc",
        ] {
            assert!(parse(bad).is_err(), "{}", String::from_utf8_lossy(bad));
        }
    }

    #[test]
    fn chunks_adding_up_past_the_bound_are_refused() {
        let mut a = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n".to_vec();
        let half = MAX_BODY / 2 + 1;
        for _ in 0..2 {
            a.extend(format!("{half:x}\r\n").bytes());
            a.extend(std::iter::repeat_n(b'x', half));
            a.extend(b"\r\n");
        }
        a.extend(b"0\r\n\r\n");
        let e = parse(&a).expect_err("over the bound");
        assert!(e.to_string().contains("longer than"), "{e}");
    }

    #[test]
    fn answers_without_a_length_end_at_close() {
        let r = parse(b"HTTP/1.1 200 OK\r\n\r\nuntil close").expect("answer");
        assert_eq!(r.body, b"until close");
        // Interim answers are skipped; 204 and HEAD have no body whatever they say.
        let r = parse(b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 204 No Content\r\nContent-Length: 5\r\n\r\nnope")
            .expect("answer");
        assert_eq!((r.status, r.body.len()), (204, 0));
        let r = parse(b"HTTP/1.1 304 Not Modified\r\n\r\nnope").expect("answer");
        assert_eq!((r.status, r.body.len()), (304, 0));
        let r = read_response(
            &mut &b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n"[..],
            true,
        )
        .expect("answer");
        assert!(r.body.is_empty());
        let r = parse(b"HTTP/1.1 101 Switching\r\n\r\nrest").expect("answer");
        assert_eq!((r.status, r.body.len()), (101, 0));
    }

    #[test]
    fn malformed_answers_are_errors() {
        let long_header = format!("HTTP/1.1 200 OK\r\nX: {}\r\n\r\n", "a".repeat(MAX_HEAD));
        for bad in [
            &b""[..],
            b"HTTP/1.1 200 OK\r\n",
            b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nabc",
            b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\nabc",
            b"HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n",
            b"HTTP/1.1 200 OK\r\nContent-Length: 1x\r\n\r\n",
            b"HTTP/1.1 200 OK\r\nContent-Length: 67108865\r\n\r\n",
            b"HTTP/1.1 200 OK\r\nContent-Length: 99999999999999999999999\r\n\r\n",
            b"HTTP/2 200 OK\r\n\r\n",
            b"HTTP/1.1 20 OK\r\n\r\n",
            b"HTTP/1.1 2000 OK\r\n\r\n",
            b"HTTP/1.1 099 OK\r\n\r\n",
            b"HTTP/1.1 600 OK\r\n\r\n",
            b"HTTP/1.1 +20 OK\r\n\r\n",
            b"HTTP/1.1\r\n\r\n",
            b"SSH-2.0-OpenSSH\r\n\r\n",
            b"HTTP/1.1 200 OK\r\nNoColon\r\n\r\n",
            b"HTTP/1.1 200 OK\r\n Folded: x\r\n\r\n",
            b"HTTP/1.1 200 OK\r\nX: \xff\r\n\r\n",
            long_header.as_bytes(),
        ] {
            assert!(parse(bad).is_err(), "{}", String::from_utf8_lossy(bad));
        }
        // A status line with no reason is still one.
        assert_eq!(parse(b"HTTP/1.1 200\r\n\r\n").expect("answer").reason, "");
    }

    #[test]
    fn the_head_bound_is_exact() {
        // The status line and the blank line take 19 bytes, `X: ` and its CRLF 5.
        let fill = MAX_HEAD - 19 - 5;
        let at = format!("HTTP/1.1 200 OK\r\nX: {}\r\n\r\n", "a".repeat(fill));
        assert_eq!(at.len(), MAX_HEAD);
        assert!(parse(at.as_bytes()).is_ok());
        let over = format!("HTTP/1.1 200 OK\r\nX: {}\r\n\r\n", "a".repeat(fill + 1));
        assert!(parse(over.as_bytes()).is_err());
    }

    #[test]
    fn the_error_line_is_one_short_line() {
        let mut r =
            parse(b"HTTP/1.1 401 Unauthorized\r\nContent-Length: 19\r\n\r\nNo token\r\nprovided.")
                .expect("answer");
        assert_eq!(r.error_line(), "401 Unauthorized: No token  provided.");
        r.body = vec![b'x'; ERROR_BODY_SHOWN + 1];
        let line = r.error_line();
        assert_eq!(
            line.len(),
            "401 Unauthorized: ".len() + ERROR_BODY_SHOWN + 3
        );
        assert!(line.ends_with("x..."));
        r.body = vec![b'x'; ERROR_BODY_SHOWN];
        assert!(!r.error_line().ends_with("..."));
    }

    /// A one-connection server on loopback answering `answer`; the request it read comes
    /// back through the handle (up to the end of its head plus `body` bytes).
    fn serve_once(answer: &'static [u8], body: usize) -> (u16, thread::JoinHandle<Vec<u8>>) {
        let l = TcpListener::bind("127.0.0.1:0").expect("bind loopback");
        let port = l.local_addr().expect("address").port();
        let h = thread::spawn(move || {
            let (mut s, _) = l.accept().expect("accept");
            let mut got = Vec::new();
            let mut buf = [0u8; 4096];
            while !got.windows(4).any(|w| w == b"\r\n\r\n") {
                let n = s.read(&mut buf).expect("read");
                if n == 0 {
                    break;
                }
                got.extend_from_slice(&buf[..n]);
            }
            let head = got
                .windows(4)
                .position(|w| w == b"\r\n\r\n")
                .map_or(0, |i| i + 4);
            while got.len() < head + body {
                let n = s.read(&mut buf).expect("read");
                if n == 0 {
                    break;
                }
                got.extend_from_slice(&buf[..n]);
            }
            s.write_all(answer).expect("answer");
            got
        });
        (port, h)
    }

    #[test]
    fn a_token_then_a_get_over_loopback() {
        let (port, h) = serve_once(
            b"HTTP/1.1 200 OK\r\nConnection: keep-alive\r\nContent-Length: 5\r\n\r\ntoken",
            0,
        );
        let url = format!("http://127.0.0.1:{port}/latest/api/token");
        let req = Request::new(
            "PUT",
            &url,
            &["X-metadata-token-ttl-seconds: 60".into()],
            None,
        )
        .expect("request");
        // A keep-alive server leaves the connection open: the length ends the answer.
        let r = fetch(&req, Duration::from_secs(10)).expect("answer");
        assert_eq!((r.status, r.body.as_slice()), (200, &b"token"[..]));
        assert_eq!(h.join().expect("server"), req.to_bytes());

        let (port, h) = serve_once(
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n",
            3,
        );
        let url = format!("http://localhost:{port}/");
        let req = Request::new(
            "POST",
            &url,
            &[
                "Accept: application/json".into(),
                "X-metadata-token: token".into(),
            ],
            Some(b"abc".to_vec()),
        )
        .expect("request");
        let r = fetch(&req, Duration::from_secs(10)).expect("answer");
        assert_eq!(r.body, b"{}");
        assert_eq!(h.join().expect("server"), req.to_bytes());
    }

    #[test]
    fn a_silent_server_times_out() {
        let l = TcpListener::bind("127.0.0.1:0").expect("bind loopback");
        let port = l.local_addr().expect("address").port();
        let req =
            Request::new("GET", &format!("http://127.0.0.1:{port}/"), &[], None).expect("request");
        let start = Instant::now();
        // The kernel completes the handshake from the backlog; nobody ever answers.
        let e = fetch(&req, Duration::from_millis(300)).expect_err("no answer");
        let waited = start.elapsed();
        assert!(format!("{e:#}").contains("timed out"), "{e:#}");
        assert!(waited >= Duration::from_millis(300), "{waited:?}");
        assert!(waited < Duration::from_secs(5), "{waited:?}");
        drop(l);
    }

    #[test]
    fn a_refused_connection_is_an_error() {
        let port = {
            let l = TcpListener::bind("127.0.0.1:0").expect("bind loopback");
            l.local_addr().expect("address").port()
        };
        let req =
            Request::new("GET", &format!("http://127.0.0.1:{port}/"), &[], None).expect("request");
        let e = fetch(&req, Duration::from_secs(5)).expect_err("refused");
        assert!(
            format!("{e:#}").contains("connecting to 127.0.0.1"),
            "{e:#}"
        );
    }
}
