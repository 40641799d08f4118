//! Tier configurations as the tests write them: JSON, with the vLLM-style prefix and
//! namespace, and small edits of a `store` section.

use serde_json::{json, Value};

/// A tier configuration: `store`, the vLLM-style prefix and namespace, plus `extra` keys.
pub fn tier_json(store: Value, extra: Value) -> String {
    let config = json!({"store": store, "prefix": "kv", "namespace": "m_0123456789ab_r0"});
    with_all(config, extra).to_string()
}

/// Sets `key = value` in an object (for tweaking a `store` section).
pub fn with(mut value: Value, key: &str, v: Value) -> Value {
    value[key] = v;
    value
}

/// Sets every key of the object `extra` in `value` (nothing if `extra` is not an object).
pub fn with_all(mut value: Value, extra: Value) -> Value {
    if let Value::Object(extra) = extra {
        for (k, v) in extra {
            value[k] = v;
        }
    }
    value
}
