// SPDX-License-Identifier: Apache-2.0
//! `PUT`, `PATCH` and `GET /mmds`: the store's content from the host, the
//! same before and after `InstanceStart` (the store is the process's, made
//! at start with `--mmds-size-limit` and `--metadata`).
//!
//! A `PUT` replaces the store, a `PATCH` merges into it (RFC 7396); either
//! is refused with `400` and changes nothing when the result would exceed
//! the bound, and a `PATCH` before any content is refused as Firecracker
//! refuses it. `GET` answers the whole store as JSON (`{}` before any).

use devices::mmds::{lock, SharedMmds};
use serde_json::Value;

use super::http::Response;

/// `PUT /mmds`.
pub fn put(mmds: &SharedMmds, data: Value) -> Response {
    match lock(mmds).put(data) {
        Ok(()) => Response::no_content(),
        Err(e) => Response::fault(&e.to_string()),
    }
}

/// `PATCH /mmds`.
pub fn patch(mmds: &SharedMmds, patch: &Value) -> Response {
    match lock(mmds).patch(patch) {
        Ok(()) => Response::no_content(),
        Err(e) => Response::fault(&e.to_string()),
    }
}

/// `GET /mmds`.
pub fn get(mmds: &SharedMmds) -> Response {
    Response::json(lock(mmds).data().to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use devices::mmds::Mmds;
    use serde_json::json;
    use std::sync::{Arc, Mutex};

    fn body(r: &Response) -> Value {
        serde_json::from_str(r.body.as_deref().expect("a body")).expect("JSON body")
    }

    #[test]
    fn put_patch_get_and_the_bound() {
        let mmds: SharedMmds = Arc::new(Mutex::new(Mmds::new(40)));
        assert_eq!(body(&get(&mmds)), json!({}));
        let r = patch(&mmds, &json!({"a": 1}));
        assert_eq!(r.status, 400);
        assert!(body(&r)["fault_message"]
            .as_str()
            .is_some_and(|m| m.contains("not initialized")));
        assert_eq!(put(&mmds, json!({"a": {"b": "c"}})).status, 204);
        assert_eq!(patch(&mmds, &json!({"a": {"d": 1}})).status, 204);
        assert_eq!(body(&get(&mmds)), json!({"a": {"b": "c", "d": 1}}));
        // Over the 40-byte bound: refused, nothing changed.
        let r = patch(&mmds, &json!({"big": "0123456789012345678901234567890"}));
        assert_eq!(r.status, 400);
        assert!(body(&r)["fault_message"]
            .as_str()
            .is_some_and(|m| m.contains("doesn't fit")));
        assert_eq!(
            put(&mmds, json!("0123456789012345678901234567890123456789")).status,
            400
        );
        assert_eq!(body(&get(&mmds)), json!({"a": {"b": "c", "d": 1}}));
    }
}
