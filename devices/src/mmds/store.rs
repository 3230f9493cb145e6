// SPDX-License-Identifier: Apache-2.0
//! The MMDS data store: one JSON value with a size bound, its version and
//! output rules, and the session tokens (see [`token`](super::token)).
//!
//! Every change is checked before it is made: a `PUT` or a `PATCH` whose
//! result serializes to more than the bound is refused and the store keeps
//! what it had. A `PATCH` is an RFC 7396 merge patch, applied to a copy.

use std::time::Instant;

use serde_json::{Map, Value};

use super::token::{TokenAuthority, TokenError};

/// The MMDS version: how the guest must ask.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum MmdsVersion {
    /// Requests with or without a session token (Firecracker's default,
    /// deprecated there).
    #[default]
    V1,
    /// Every `GET` needs a session token from `PUT /latest/api/token`.
    V2,
}

/// How a value is written in a guest response.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OutputFormat {
    /// The value as compact JSON.
    Json,
    /// EC2 IMDS text: an object's keys one per line (objects with a
    /// trailing `/`), a string as it is.
    Imds,
}

/// Why the store refused a change or a lookup (Firecracker's messages).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MmdsError {
    /// The result would serialize to more than the bound.
    #[error("The MMDS patch request doesn't fit.")]
    SizeLimit,
    /// A `PATCH` before any `PUT`.
    #[error("The MMDS data store is not initialized.")]
    NotInitialized,
    /// No value at the path.
    #[error("The MMDS resource does not exist.")]
    NotFound,
    /// IMDS text of a value that is neither an object nor a string.
    #[error("Cannot retrieve value. The value has an unsupported type.")]
    UnsupportedValueType,
    /// A token request the authority refused.
    #[error(transparent)]
    Token(#[from] TokenError),
}

/// The store of one VM.
#[derive(Debug)]
pub struct Mmds {
    data: Value,
    initialized: bool,
    limit: usize,
    version: MmdsVersion,
    imds_compat: bool,
    tokens: TokenAuthority,
}

impl Default for Mmds {
    /// An empty store at Firecracker's default bound.
    fn default() -> Self {
        Mmds::new(super::DEFAULT_SIZE_LIMIT)
    }
}

impl Mmds {
    /// An empty store bounded at `limit` bytes of compact JSON.
    pub fn new(limit: usize) -> Self {
        Mmds {
            data: Value::Null,
            initialized: false,
            limit,
            version: MmdsVersion::V1,
            imds_compat: false,
            tokens: TokenAuthority::default(),
        }
    }

    /// The bound, in bytes of compact JSON.
    pub fn limit(&self) -> usize {
        self.limit
    }

    /// The version guest requests are answered under.
    pub fn version(&self) -> MmdsVersion {
        self.version
    }

    /// Whether responses are IMDS text whatever the `Accept` header says.
    pub fn imds_compat(&self) -> bool {
        self.imds_compat
    }

    /// Sets the version and `imds_compat` (`PUT /mmds/config`).
    pub fn configure(&mut self, version: MmdsVersion, imds_compat: bool) {
        self.version = version;
        self.imds_compat = imds_compat;
    }

    /// Replaces the whole store (`PUT /mmds`, `--metadata`).
    pub fn put(&mut self, data: Value) -> Result<(), MmdsError> {
        self.check_size(&data)?;
        self.data = data;
        self.initialized = true;
        Ok(())
    }

    /// Merges `patch` into the store (RFC 7396, `PATCH /mmds`).
    pub fn patch(&mut self, patch: &Value) -> Result<(), MmdsError> {
        if !self.initialized {
            return Err(MmdsError::NotInitialized);
        }
        let mut merged = self.data.clone();
        merge_patch(&mut merged, patch);
        self.check_size(&merged)?;
        self.data = merged;
        Ok(())
    }

    /// The whole store (`GET /mmds`): `{}` before the first `PUT`, as
    /// Firecracker answers.
    pub fn data(&self) -> Value {
        if self.initialized {
            self.data.clone()
        } else {
            Value::Object(Map::new())
        }
    }

    fn check_size(&self, v: &Value) -> Result<(), MmdsError> {
        // Serializing a Value into a Vec cannot fail (string keys only).
        let len = serde_json::to_vec(v).map_or(usize::MAX, |b| b.len());
        if len > self.limit {
            return Err(MmdsError::SizeLimit);
        }
        Ok(())
    }

    /// The value at `path` (a URI path: `/` separated, `//` taken as `/`,
    /// a trailing `/` ignored) written as `format` asks, `imds_compat`
    /// forcing IMDS.
    pub fn get(&self, path: &str, format: OutputFormat) -> Result<String, MmdsError> {
        let pointer = json_pointer(path);
        let data = if self.initialized {
            &self.data
        } else {
            &Value::Null
        };
        let value = if pointer.is_empty() && !self.initialized {
            return Err(MmdsError::NotFound);
        } else {
            data.pointer(&pointer).ok_or(MmdsError::NotFound)?
        };
        let format = if self.imds_compat {
            OutputFormat::Imds
        } else {
            format
        };
        match format {
            OutputFormat::Json => Ok(value.to_string()),
            OutputFormat::Imds => imds_text(value),
        }
    }

    /// A new session token living `ttl_seconds` from `now`.
    pub fn new_token(&mut self, ttl_seconds: u32, now: Instant) -> Result<String, MmdsError> {
        Ok(self.tokens.issue(ttl_seconds, now)?)
    }

    /// Whether `token` was issued here and has not expired at `now`.
    pub fn token_valid(&self, token: &str, now: Instant) -> bool {
        self.tokens.is_valid(token, now)
    }
}

/// A URI path as a JSON pointer (RFC 6901): runs of `/` collapsed, a
/// trailing `/` removed, so `/` and `` both mean the whole store.
fn json_pointer(path: &str) -> String {
    let mut out = String::with_capacity(path.len());
    for part in path.split('/').filter(|p| !p.is_empty()) {
        out.push('/');
        out.push_str(part);
    }
    out
}

fn imds_text(v: &Value) -> Result<String, MmdsError> {
    match v {
        Value::Object(map) => {
            let mut out = String::new();
            for (i, (k, v)) in map.iter().enumerate() {
                if i > 0 {
                    out.push('\n');
                }
                out.push_str(k);
                if v.is_object() {
                    out.push('/');
                }
            }
            Ok(out)
        }
        Value::String(s) => Ok(s.clone()),
        _ => Err(MmdsError::UnsupportedValueType),
    }
}

/// RFC 7396 JSON merge patch of `target` by `patch`: an object patch merges
/// key by key (`null` removes the key), anything else replaces. Recursion
/// depth is that of `patch`, which serde_json bounds at 128 when parsing.
pub fn merge_patch(target: &mut Value, patch: &Value) {
    let Value::Object(p) = patch else {
        *target = patch.clone();
        return;
    };
    if !target.is_object() {
        *target = Value::Object(Map::new());
    }
    if let Value::Object(t) = target {
        for (k, v) in p {
            if v.is_null() {
                t.remove(k);
            } else {
                merge_patch(t.entry(k.clone()).or_insert(Value::Null), v);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn store(v: Value) -> Mmds {
        let mut m = Mmds::new(1000);
        m.put(v).expect("fits");
        m
    }

    /// The examples of RFC 7396's appendix A.
    #[test]
    fn test_merge_patch_rfc7396_examples() {
        let cases = [
            (json!({"a":"b"}), json!({"a":"c"}), json!({"a":"c"})),
            (json!({"a":"b"}), json!({"b":"c"}), json!({"a":"b","b":"c"})),
            (json!({"a":"b"}), json!({"a":null}), json!({})),
            (
                json!({"a":"b","b":"c"}),
                json!({"a":null}),
                json!({"b":"c"}),
            ),
            (json!({"a":["b"]}), json!({"a":"c"}), json!({"a":"c"})),
            (json!({"a":"c"}), json!({"a":["b"]}), json!({"a":["b"]})),
            (
                json!({"a":{"b":"c"}}),
                json!({"a":{"b":"d","c":null}}),
                json!({"a":{"b":"d"}}),
            ),
            (json!({"a":[{"b":"c"}]}), json!({"a":[1]}), json!({"a":[1]})),
            (json!(["a", "b"]), json!(["c", "d"]), json!(["c", "d"])),
            (json!({"a":"b"}), json!(["c"]), json!(["c"])),
            (json!({"a":"foo"}), json!(null), json!(null)),
            (json!({"a":"foo"}), json!("bar"), json!("bar")),
            (json!({"e":null}), json!({"a":1}), json!({"e":null,"a":1})),
            (json!([1, 2]), json!({"a":"b","c":null}), json!({"a":"b"})),
            (
                json!({}),
                json!({"a":{"bb":{"ccc":null}}}),
                json!({"a":{"bb":{}}}),
            ),
        ];
        for (target, patch, want) in cases {
            let mut t = target.clone();
            merge_patch(&mut t, &patch);
            assert_eq!(t, want, "{target} patched by {patch}");
        }
    }

    #[test]
    fn test_over_limit_changes_nothing() {
        let mut m = Mmds::new(20);
        assert_eq!(m.patch(&json!({"a":1})), Err(MmdsError::NotInitialized));
        m.put(json!({"a":"0123456789"}))
            .expect("18 bytes fit in 20");
        assert_eq!(
            m.put(json!({"a":"0123456789xyz"})),
            Err(MmdsError::SizeLimit)
        );
        assert_eq!(m.patch(&json!({"b":1})), Err(MmdsError::SizeLimit));
        assert_eq!(m.data(), json!({"a":"0123456789"}));
        // Exactly at the bound fits.
        m.put(json!({"a":"0123456789AB"}))
            .expect("20 bytes fit in 20");
        assert_eq!(m.limit(), 20);
    }

    #[test]
    fn test_get_json_and_imds() {
        let m = store(json!({"latest":{"meta-data":{"ami-id":"ami-1","n":3,"r":"r-1"}}}));
        let j = OutputFormat::Json;
        let i = OutputFormat::Imds;
        assert_eq!(
            m.get("/latest/meta-data/ami-id", j).as_deref(),
            Ok("\"ami-1\"")
        );
        assert_eq!(m.get("/latest/meta-data/ami-id", i).as_deref(), Ok("ami-1"));
        assert_eq!(m.get("/latest", i).as_deref(), Ok("meta-data/"));
        assert_eq!(
            m.get("//latest//meta-data/", i).as_deref(),
            Ok("ami-id\nn\nr")
        );
        assert_eq!(m.get("/latest/meta-data/n", j).as_deref(), Ok("3"));
        assert_eq!(
            m.get("/latest/meta-data/n", i),
            Err(MmdsError::UnsupportedValueType)
        );
        assert_eq!(m.get("/latest/nothing", j), Err(MmdsError::NotFound));
        assert_eq!(
            m.get("/", j).as_deref(),
            Ok(r#"{"latest":{"meta-data":{"ami-id":"ami-1","n":3,"r":"r-1"}}}"#)
        );
    }

    #[test]
    fn test_imds_compat_forces_text_and_empty_store_is_not_found() {
        let mut m = store(json!({"k":"v"}));
        m.configure(MmdsVersion::V2, true);
        assert_eq!(m.get("/k", OutputFormat::Json).as_deref(), Ok("v"));
        assert_eq!(m.version(), MmdsVersion::V2);
        assert!(m.imds_compat());
        let empty = Mmds::new(100);
        assert_eq!(empty.get("/", OutputFormat::Json), Err(MmdsError::NotFound));
        assert_eq!(
            empty.get("/a", OutputFormat::Json),
            Err(MmdsError::NotFound)
        );
        assert_eq!(empty.data(), json!({}));
    }
}
