// SPDX-License-Identifier: Apache-2.0
//! Every path and method of Firecracker's API description, read from the
//! copy kept in `tests/data/firecracker.yaml`, with the answers it lists.
//!
//! The description is Swagger 2.0 in YAML. Its `paths` section has one
//! fixed shape, which [`operations`] reads line by line rather than with a
//! YAML library: a path at two spaces of indentation (`  /drives/{drive_id}:`),
//! its methods at four (`    put:`), their `responses` at six and each
//! status at eight (`        204:`), a `$ref` under a status naming the
//! definition of its body. `default` (Firecracker's "internal server error")
//! is not a status. A test of every path sends each operation and checks the
//! answer against what is listed here, and [`fc_schema`](super::fc_schema)
//! checks the body against the definition.

use std::sync::OnceLock;

/// The API description, as kept in the repository (with its licence header).
pub const FIRECRACKER_YAML: &str = include_str!("../data/firecracker.yaml");

/// One path and method of the description and what it answers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Operation {
    /// As the description writes it, `{...}` placeholders included.
    pub path: String,
    /// Upper case: GET, PUT, PATCH.
    pub method: String,
    /// The statuses listed (200, 204, 400, ...), `default` left out.
    pub statuses: Vec<u16>,
    /// The definition named by the `$ref` of the 200 answer, if any.
    pub ok_body: Option<String>,
}

impl Operation {
    /// The success status the description gives (the first 2xx listed).
    pub fn success(&self) -> Option<u16> {
        self.statuses
            .iter()
            .copied()
            .find(|s| (200..300).contains(s))
    }

    /// The path with each `{placeholder}` replaced by `id`.
    pub fn concrete(&self, id: &str) -> String {
        let mut out = String::new();
        let mut rest = self.path.as_str();
        while let Some(open) = rest.find('{') {
            out.push_str(&rest[..open]);
            match rest[open..].find('}') {
                Some(close) => {
                    out.push_str(id);
                    rest = &rest[open + close + 1..];
                }
                None => {
                    rest = &rest[open..];
                    break;
                }
            }
        }
        out.push_str(rest);
        out
    }
}

fn indent(line: &str) -> usize {
    line.len() - line.trim_start_matches(' ').len()
}

/// Reads the `paths` section of `yaml` (see the module doc).
pub fn parse_operations(yaml: &str) -> Vec<Operation> {
    let mut ops: Vec<Operation> = Vec::new();
    let mut in_paths = false;
    let mut path: Option<String> = None;
    let mut in_responses = false;
    let mut status: Option<u16> = None;
    for line in yaml.lines() {
        let text = line.trim();
        if text.is_empty() || text.starts_with('#') {
            continue;
        }
        match indent(line) {
            0 => {
                in_paths = text == "paths:";
                path = None;
            }
            2 if in_paths => {
                path = text
                    .strip_suffix(':')
                    .filter(|p| p.starts_with('/'))
                    .map(str::to_string);
            }
            4 if in_paths => {
                in_responses = false;
                let method = text.strip_suffix(':').unwrap_or_default();
                if let (Some(p), "get" | "put" | "patch" | "delete") = (&path, method) {
                    ops.push(Operation {
                        path: p.clone(),
                        method: method.to_ascii_uppercase(),
                        statuses: Vec::new(),
                        ok_body: None,
                    });
                }
            }
            6 if in_paths => in_responses = text == "responses:",
            8 if in_paths && in_responses => {
                status = text.strip_suffix(':').and_then(|s| s.parse().ok());
                if let (Some(s), Some(op)) = (status, ops.last_mut()) {
                    op.statuses.push(s);
                }
            }
            n if in_paths && in_responses && n > 8 => {
                if let (Some(200), Some(def), Some(op)) = (
                    status,
                    text.strip_prefix("$ref: \"#/definitions/")
                        .and_then(|r| r.strip_suffix('"')),
                    ops.last_mut(),
                ) {
                    op.ok_body = Some(def.to_string());
                }
            }
            _ => {}
        }
    }
    ops
}

/// Every operation of the kept description, in its order.
pub fn operations() -> &'static [Operation] {
    static OPS: OnceLock<Vec<Operation>> = OnceLock::new();
    OPS.get_or_init(|| parse_operations(FIRECRACKER_YAML))
}

/// `info.version` of the kept description.
pub fn description_version() -> Option<&'static str> {
    FIRECRACKER_YAML
        .lines()
        .skip_while(|l| *l != "info:")
        .find_map(|l| l.trim().strip_prefix("version: "))
}

/// Sends one request to the API socket at `sock` (HTTP/1.1, `Connection:
/// close`, a JSON body if given) and returns the status and the body; `None`
/// when the socket does not answer with a status line (refused, closed).
pub fn request(
    sock: &std::path::Path,
    method: &str,
    path: &str,
    body: Option<&str>,
) -> Option<(u16, String)> {
    use std::io::{Read, Write};
    let mut s = std::os::unix::net::UnixStream::connect(sock).ok()?;
    s.set_read_timeout(Some(std::time::Duration::from_secs(30)))
        .ok()?;
    let body = body.unwrap_or("");
    let head = format!(
        "{method} {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    s.write_all(head.as_bytes()).ok()?;
    s.write_all(body.as_bytes()).ok()?;
    let mut answer = Vec::new();
    let _ = s.read_to_end(&mut answer);
    let text = String::from_utf8_lossy(&answer);
    let status = text.get(9..12)?.parse().ok()?;
    let body = text
        .split_once("\r\n\r\n")
        .map_or("", |(_, b)| b)
        .to_string();
    Some((status, body))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_kept_description_has_firecrackers_38_operations() {
        let ops = operations();
        assert_eq!(description_version(), Some("1.17.0-dev"));
        assert_eq!(ops.len(), 38, "{ops:#?}");
        let find = |path: &str, method: &str| {
            ops.iter()
                .find(|o| o.path == path && o.method == method)
                .unwrap_or_else(|| panic!("{method} {path} missing"))
        };
        let root = find("/", "GET");
        assert_eq!(root.statuses, [200]);
        assert_eq!(root.ok_body.as_deref(), Some("InstanceInfo"));
        assert_eq!(root.success(), Some(200));
        let logger = find("/logger", "PUT");
        assert_eq!(logger.statuses, [204, 400]);
        assert_eq!(logger.ok_body, None);
        assert_eq!(logger.success(), Some(204));
        assert_eq!(
            find("/balloon/statistics", "GET").ok_body.as_deref(),
            Some("BalloonStats")
        );
        assert_eq!(
            find("/drives/{drive_id}", "PATCH").concrete("rootfs"),
            "/drives/rootfs"
        );
        assert_eq!(
            find("/vm/config", "GET").ok_body.as_deref(),
            Some("FullVmConfiguration")
        );
        // Every operation has a success status.
        for op in ops {
            assert!(op.success().is_some(), "{op:?}");
        }
    }

    #[test]
    fn the_reader_keeps_to_the_paths_section() {
        let yaml = "swagger: \"2.0\"\npaths:\n  /a/{id}:\n    put:\n      parameters:\n        - name: id\n      responses:\n        204:\n          description: ok\n        default:\n          description: no\n    get:\n      responses:\n        200:\n          schema:\n            $ref: \"#/definitions/A\"\n\ndefinitions:\n  /b:\n    get:\n      responses:\n        200:\n";
        let ops = parse_operations(yaml);
        assert_eq!(
            ops,
            [
                Operation {
                    path: "/a/{id}".into(),
                    method: "PUT".into(),
                    statuses: vec![204],
                    ok_body: None
                },
                Operation {
                    path: "/a/{id}".into(),
                    method: "GET".into(),
                    statuses: vec![200],
                    ok_body: Some("A".into())
                },
            ]
        );
        assert_eq!(ops[0].concrete("x"), "/a/x");
        let unclosed = Operation {
            path: "/a/{id".into(),
            ..ops[0].clone()
        };
        assert_eq!(unclosed.concrete("x"), "/a/{id");
    }
}
