//! vLLM's namespace string, so that hosts other than vLLM name objects the same way.
//!
//! `<model with / replaced by _>_<first 12 hex of SHA-256 of the field set>_r<rank>`,
//! where the field set is serialized as Python's
//! `json.dumps(fields, sort_keys=True, separators=(",", ":"))` would (ASCII-only output).

use serde_json::Value;
use sha2::{Digest, Sha256};

use crate::error::{Error, Result};

/// Serializes like Python's `json.dumps(v, sort_keys=True, separators=(",", ":"))`.
pub fn python_compact_json(value: &Value) -> String {
    let mut out = String::new();
    write_value(value, &mut out);
    out
}

fn write_value(value: &Value, out: &mut String) {
    match value {
        Value::Null => out.push_str("null"),
        Value::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        Value::Number(n) => {
            if let Some(f) = n.as_f64().filter(|_| n.is_f64()) {
                out.push_str(&python_float_repr(f));
            } else {
                out.push_str(&n.to_string());
            }
        }
        Value::String(s) => write_string(s, out),
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_value(item, out);
            }
            out.push(']');
        }
        Value::Object(map) => {
            let mut keys: Vec<&String> = map.keys().collect();
            keys.sort();
            out.push('{');
            for (i, key) in keys.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_string(key, out);
                out.push(':');
                write_value(&map[*key], out);
            }
            out.push('}');
        }
    }
}

/// Python's `repr(float)`: the shortest digits that round-trip, positional for exponents
/// from -4 to 15, else `d.ddde+XX` with at least two exponent digits.
fn python_float_repr(f: f64) -> String {
    if f.is_nan() {
        return "NaN".into();
    }
    if f.is_infinite() {
        return if f > 0.0 {
            "Infinity".into()
        } else {
            "-Infinity".into()
        };
    }
    let sci = format!("{f:e}"); // shortest round-trip digits, e.g. "-1.25e-5"
    let (mantissa, exponent) = sci.split_once('e').unwrap_or((&sci, "0"));
    let exponent: i32 = exponent.parse().unwrap_or(0);
    if (-4..16).contains(&exponent) {
        let text = format!("{f}");
        if text.contains('.') {
            text
        } else {
            format!("{text}.0")
        }
    } else {
        let sign = if exponent < 0 { '-' } else { '+' };
        format!("{mantissa}e{sign}{:02}", exponent.abs())
    }
}

fn write_string(s: &str, out: &mut String) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            c if (c as u32) < 0x20 || (c as u32) > 0x7e => {
                let mut units = [0u16; 2];
                for unit in c.encode_utf16(&mut units) {
                    out.push_str(&format!("\\u{unit:04x}"));
                }
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

/// First 12 hex digits of the SHA-256 of the field set.
pub fn digest(fields: &Value) -> String {
    let hash = Sha256::digest(python_compact_json(fields).as_bytes());
    crate::key::to_hex(&hash[..6])
}

/// vLLM's namespace for a field set (which must hold `model_name`) and a worker rank.
/// The caller includes `parallel_agnostic: false` only when the layout is not
/// parallel-agnostic, `replicated_layout: true` only when set, as vLLM does; for
/// parallel-agnostic layouts pass rank 0.
pub fn vllm_namespace(fields: &Value, rank: u32) -> Result<String> {
    let model = fields
        .get("model_name")
        .and_then(Value::as_str)
        .ok_or_else(|| Error::invalid("the field set needs a string \"model_name\""))?;
    if !fields.is_object() {
        return Err(Error::invalid("the field set must be a JSON object"));
    }
    Ok(format!(
        "{}_{}_r{rank}",
        model.replace('/', "_"),
        digest(fields)
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn python_float_repr_matches() {
        // Values and their repr() in CPython 3.11.
        for (f, text) in [
            (1.0, "1.0"),
            (2.5, "2.5"),
            (1e16, "1e+16"),
            (1e-5, "1e-05"),
            (0.0001, "0.0001"),
            (123456789012345.0, "123456789012345.0"),
            (1.5e300, "1.5e+300"),
            (-2.5e-7, "-2.5e-07"),
            (0.1, "0.1"),
        ] {
            assert_eq!(python_float_repr(f), text);
        }
    }

    #[test]
    fn python_json_escapes() {
        let v: Value =
            serde_json::from_str(r#"{"b":[1,2.5,true,null],"a":"x\"y\u00e9\ud83d\ude00\n"}"#)
                .unwrap();
        assert_eq!(
            python_compact_json(&v),
            r#"{"a":"x\"y\u00e9\ud83d\ude00\n","b":[1,2.5,true,null]}"#
        );
    }
}

#[cfg(test)]
mod vector_tests {
    use super::*;

    #[test]
    fn matches_vectors_computed_in_python() {
        let text = include_str!("../../tests/vectors/namespace.json");
        let doc: Value = serde_json::from_str(text).unwrap();
        let vectors = doc["vectors"].as_array().unwrap();
        assert!(vectors.len() >= 3);
        for v in vectors {
            assert_eq!(
                python_compact_json(&v["fields"]),
                v["canonical_json"].as_str().unwrap()
            );
            let ns = vllm_namespace(&v["fields"], v["rank"].as_u64().unwrap() as u32).unwrap();
            assert_eq!(ns, v["namespace"].as_str().unwrap());
        }
    }
}
