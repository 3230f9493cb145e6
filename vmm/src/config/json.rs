// SPDX-License-Identifier: Apache-2.0
//! JSON as minivmm reads it from its users (config files, API bodies):
//! serde_json's parser, except that an object with a key given twice is
//! refused.
//!
//! serde_json keeps the last of two equal keys, and so would every section
//! read through a [`Value`]; a user who wrote two `vcpu_count`s, or two
//! `machine-config` sections, would get one of them silently. Firecracker
//! refuses such a body (its typed bodies reject a field given twice), and
//! so does minivmm, at any depth, with serde's own words for it
//! ("duplicate field `vcpu_count`") and serde_json's position.

use std::fmt;

use serde::de::{self, Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Number, Value};

/// Parses `bytes` as one JSON value, refusing a key given twice in any
/// object (and, as serde_json does, anything after the value but space).
pub fn parse(bytes: &[u8]) -> Result<Value, serde_json::Error> {
    let mut de = serde_json::Deserializer::from_slice(bytes);
    let Strict(v) = Strict::deserialize(&mut de)?;
    de.end()?;
    Ok(v)
}

/// A [`Value`] whose objects had no key twice.
struct Strict(Value);

impl<'de> Deserialize<'de> for Strict {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(StrictVisitor).map(Strict)
    }
}

struct StrictVisitor;

impl<'de> Visitor<'de> for StrictVisitor {
    type Value = Value;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_bool<E>(self, v: bool) -> Result<Value, E> {
        Ok(Value::Bool(v))
    }

    fn visit_i64<E>(self, v: i64) -> Result<Value, E> {
        Ok(Value::Number(v.into()))
    }

    fn visit_u64<E>(self, v: u64) -> Result<Value, E> {
        Ok(Value::Number(v.into()))
    }

    fn visit_f64<E>(self, v: f64) -> Result<Value, E> {
        // JSON has no NaN or infinity, so the parser never gives one.
        Ok(Number::from_f64(v).map_or(Value::Null, Value::Number))
    }

    fn visit_str<E>(self, v: &str) -> Result<Value, E> {
        Ok(Value::String(v.to_owned()))
    }

    fn visit_unit<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let mut items = Vec::new();
        while let Some(Strict(v)) = seq.next_element()? {
            items.push(v);
        }
        Ok(Value::Array(items))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let mut out = Map::new();
        while let Some(key) = map.next_key::<String>()? {
            if out.contains_key(&key) {
                return Err(de::Error::custom(format_args!("duplicate field `{key}`")));
            }
            let Strict(v) = map.next_value()?;
            out.insert(key, v);
        }
        Ok(Value::Object(out))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_come_out_as_serde_json_reads_them() {
        let text = r#" {"a": [1, -2, 3.5, "x", true, false, null, {}, []],
                       "b": {"c": {"d": 18446744073709551615}}, "e": "\u00e9\n"} "#;
        let want: Value = serde_json::from_str(text).unwrap();
        assert_eq!(parse(text.as_bytes()).unwrap(), want);
        for bad in ["", "{", "[1,]", "{} {}", "nul", "{\"a\" 1}", "\"\\x\""] {
            assert!(parse(bad.as_bytes()).is_err(), "{bad:?}");
            assert!(serde_json::from_str::<Value>(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn a_key_given_twice_is_refused_at_any_depth() {
        for (text, key) in [
            (r#"{"a": 1, "a": 1}"#, "a"),
            (r#"{"a": 1, "b": {"c": 2, "d": 3, "c": 4}}"#, "c"),
            (r#"[{"x": 1}, {"y": [{"z": 1, "z": null}]}]"#, "z"),
            (
                r#"{"machine-config": {}, "drives": [], "machine-config": {}}"#,
                "machine-config",
            ),
        ] {
            let e = parse(text.as_bytes()).unwrap_err().to_string();
            assert!(
                e.starts_with(&format!("duplicate field `{key}` at line 1 column")),
                "{e}"
            );
        }
        // The same key in two objects is no duplicate.
        let v = parse(br#"[{"a": 1}, {"a": 2}, {"b": {"a": 3}}]"#).unwrap();
        assert_eq!(v[1]["a"], 2);
        // Nesting is bounded as serde_json bounds it.
        let deep = "[".repeat(10_000);
        assert!(parse(deep.as_bytes()).is_err());
    }

    #[test]
    fn what_is_not_json_says_what_was_expected() {
        // serde_json never hands over bytes; another deserializer could.
        let bytes = serde::de::value::BytesDeserializer::<serde::de::value::Error>::new(b"x");
        let e = Strict::deserialize(bytes)
            .err()
            .expect("bytes are no JSON value");
        assert!(e.to_string().contains("expected any JSON value"), "{e}");
    }
}
