//! Keeping credentials out of messages built from dependency errors.
//!
//! kvtier's own secrets are [`Secret`]s, whose `Debug` never shows them. What remains are
//! messages written by dependencies, and those carry a credential in one place only: a
//! request URL, whose query holds an Azure SAS signature or a presigned request's
//! signature and token. [`in_text`] removes the values of those query parameters by name,
//! so whatever their encoding they never reach an error, a job result or a log record.
//! [`secrets`] also removes a store's own configured secrets from messages about opening
//! it, where a dependency may echo a malformed value back.

use std::fmt;

use schemars::JsonSchema;
use serde::de::{self, Deserializer};
use serde::{Deserialize, Serialize};

/// A string whose value is never printed.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    pub fn new(value: impl Into<String>) -> Self {
        Secret(value.into())
    }
    pub fn expose(&self) -> &str {
        &self.0
    }
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0.is_empty() {
            f.write_str("\"\"")
        } else {
            f.write_str("\"***\"")
        }
    }
}

/// Serialised as it prints: empty, or `***` (a schema's default is the empty one).
impl Serialize for Secret {
    fn serialize<S: serde::Serializer>(
        &self,
        serializer: S,
    ) -> std::result::Result<S::Ok, S::Error> {
        serializer.serialize_str(if self.0.is_empty() { "" } else { "***" })
    }
}

impl JsonSchema for Secret {
    fn inline_schema() -> bool {
        true
    }
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "Secret".into()
    }
    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({ "type": "string" })
    }
}

impl<'de> Deserialize<'de> for Secret {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> std::result::Result<Self, D::Error> {
        struct SecretVisitor;
        impl de::Visitor<'_> for SecretVisitor {
            type Value = Secret;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a string")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> std::result::Result<Secret, E> {
                Ok(Secret(v.to_string()))
            }
            fn visit_unit<E: de::Error>(self) -> std::result::Result<Secret, E> {
                Ok(Secret::default())
            }
            // Every other JSON type lands here; the message must not quote the value.
            fn visit_i64<E: de::Error>(self, _: i64) -> std::result::Result<Secret, E> {
                Err(E::custom("a credential must be a string"))
            }
            fn visit_u64<E: de::Error>(self, _: u64) -> std::result::Result<Secret, E> {
                Err(E::custom("a credential must be a string"))
            }
            fn visit_f64<E: de::Error>(self, _: f64) -> std::result::Result<Secret, E> {
                Err(E::custom("a credential must be a string"))
            }
            fn visit_bool<E: de::Error>(self, _: bool) -> std::result::Result<Secret, E> {
                Err(E::custom("a credential must be a string"))
            }
        }
        deserializer.deserialize_any(SecretVisitor)
    }
}

/// Query parameters whose value is a credential (compared without case).
const CREDENTIAL_PARAMETERS: &[&str] = &[
    "sig",
    "signature",
    "x-amz-signature",
    "x-amz-credential",
    "x-amz-security-token",
    "x-goog-signature",
    "x-goog-credential",
    "access_token",
    "token",
];

/// Shortest configured value [`secrets`] removes: replacing one- to three-character
/// strings everywhere would mangle messages without protecting anything.
const MIN_REDACTED_LEN: usize = 4;

/// `text` with the value of every credential-bearing query parameter replaced by `***`.
pub fn in_text(text: &str) -> String {
    // ASCII lower-casing keeps byte offsets, so matches in `lower` index `text`.
    let lower = text.to_ascii_lowercase();
    let bytes = text.as_bytes();
    let mut out = String::with_capacity(text.len());
    let mut copied = 0;
    let mut i = 0;
    while i < bytes.len() {
        let at_boundary = i == 0
            || matches!(
                bytes[i - 1],
                b'?' | b'&' | b';' | b' ' | b'\t' | b'"' | b'\''
            );
        let name = at_boundary
            .then(|| {
                CREDENTIAL_PARAMETERS
                    .iter()
                    .find(|p| lower[i..].starts_with(*p) && bytes.get(i + p.len()) == Some(&b'='))
            })
            .flatten();
        let Some(name) = name else {
            i += 1;
            continue;
        };
        let value_start = i + name.len() + 1;
        let value_end = bytes[value_start..]
            .iter()
            .position(|b| {
                matches!(
                    b,
                    b'&' | b' ' | b'\t' | b'\n' | b'"' | b'\'' | b'<' | b'>' | b')' | b','
                )
            })
            .map_or(bytes.len(), |n| value_start + n);
        out.push_str(&text[copied..value_start]);
        if value_end > value_start {
            out.push_str("***");
        }
        copied = value_end;
        i = value_end;
    }
    out.push_str(&text[copied..]);
    out
}

/// `text` with each of `configured` (a store's own secrets) replaced by `***`, then
/// [`in_text`].
pub(crate) fn secrets(text: &str, configured: &[&Secret]) -> String {
    let mut out = text.to_string();
    let mut values: Vec<&str> = configured
        .iter()
        .map(|s| s.expose())
        .filter(|v| v.len() >= MIN_REDACTED_LEN)
        .collect();
    // Longest first, so a secret that contains another is removed whole.
    values.sort_by_key(|v| std::cmp::Reverse(v.len()));
    for value in values {
        out = out.replace(value, "***");
    }
    in_text(&out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn credential_parameters_go_in_any_encoding() {
        for sig in [
            "Zk9v%2BYmFy%2FQmF6%3D",
            "Zk9v+YmFy/QmF6=",
            "Zk9v%2bYmFy%2fQmF6%3d",
        ] {
            let text = format!("GET http://h/c/b?sv=2024-01-01&sp=rl&SIG={sig}&se=2030 failed");
            let out = in_text(&text);
            assert!(!out.contains(sig), "{out}");
            assert_eq!(
                out,
                "GET http://h/c/b?sv=2024-01-01&sp=rl&SIG=***&se=2030 failed"
            );
        }
        let presigned = "url (https://b.s3.amazonaws.com/k?X-Amz-Credential=AKID%2F20260101&X-Amz-Security-Token=tok123&X-Amz-Signature=abcdef)";
        assert_eq!(
            in_text(presigned),
            "url (https://b.s3.amazonaws.com/k?X-Amz-Credential=***&X-Amz-Security-Token=***&X-Amz-Signature=***)"
        );
        // A SAS given as configured, outside a URL.
        assert_eq!(in_text("sv=2024&sig=abcd"), "sv=2024&sig=***");
        assert_eq!(in_text("sig=abcd trailing"), "sig=*** trailing");
        // Names inside other words, and other parameters, stay.
        for kept in [
            "design=1&assignment=2",
            "GET /b/k?list-type=2&prefix=kv",
            "sig",
            "sig=",
            "",
        ] {
            assert_eq!(in_text(kept), kept);
        }
        assert_eq!(
            in_text("GET https://a.blob.core.windows.net/c/k?sv=2023&sig=abc%2Fdef&se=1 failed"),
            "GET https://a.blob.core.windows.net/c/k?sv=2023&sig=***&se=1 failed"
        );
        assert_eq!(in_text("design=1 modèle"), "design=1 modèle");
        assert_eq!(in_text("\"token=t0k\""), "\"token=***\"");
        // Multi-byte text around a match.
        assert_eq!(in_text("é?sig=ü&x"), "é?sig=***&x");
    }

    #[test]
    fn configured_secrets_go_longest_first() {
        let key = Secret::new("c2VjcmV0LWtleQ==");
        let part = Secret::new("c2VjcmV0");
        let short = Secret::new("abc");
        let out = secrets(
            "bad key c2VjcmV0LWtleQ== then c2VjcmV0 and abc",
            &[&part, &key, &short],
        );
        assert_eq!(out, "bad key *** then *** and abc");
    }
}
