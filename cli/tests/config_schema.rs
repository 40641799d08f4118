//! The published configuration schema against everything that states the configuration:
//! the tables of docs/configuration.md (generated from it: `KVTIER_UPDATE_DOCS=1`, or the
//! older `KVTIER_UPDATE_README=1`, rewrites them), the C
//! ABI's `kvt_config_check`, and the command line's `kvtier config check --config`. Every
//! case below is generated from the schema, so a key added to the library is tested here
//! without a line of this file changing.

use std::ffi::{CStr, CString};
use std::process::Command;

use kvtier::{kvt_config_check, kvt_config_schema, kvt_last_error};
use kvtier_core::config::{
    config_keys, markdown_tables, store_types, ConfigKey, CONFIG_TABLE_BEGIN, CONFIG_TABLE_END,
};
use kvtier_core::Status;
use serde_json::{json, Map, Value};

/// The document that holds the configuration tables, from the repository root.
const TABLES_DOC: &str = "docs/configuration.md";

fn tables_doc_path() -> std::path::PathBuf {
    // This crate's directory is cli/; the document is the repository's.
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join(TABLES_DOC)
}

#[test]
fn the_documented_tables_are_the_schema() {
    let doc = std::fs::read_to_string(tables_doc_path()).unwrap();
    let start = doc
        .find(CONFIG_TABLE_BEGIN)
        .expect("docs/configuration.md's table marker")
        + CONFIG_TABLE_BEGIN.len();
    let end = doc
        .find(CONFIG_TABLE_END)
        .expect("docs/configuration.md's end marker");
    let generated = format!("\n{}\n", markdown_tables());
    if ["KVTIER_UPDATE_DOCS", "KVTIER_UPDATE_README"]
        .iter()
        .any(|name| std::env::var_os(name).is_some())
    {
        let updated = format!("{}{generated}{}", &doc[..start], &doc[end..]);
        std::fs::write(tables_doc_path(), updated).unwrap();
        return;
    }
    assert!(
        doc[start..end] == generated,
        "docs/configuration.md's configuration tables differ from the library's schema: run \
         KVTIER_UPDATE_DOCS=1 cargo test --release --test config_schema"
    );
}

#[test]
fn the_c_abi_publishes_the_same_schema() {
    // SAFETY: a static NUL-terminated string.
    let text = unsafe { CStr::from_ptr(kvt_config_schema()) }
        .to_str()
        .unwrap();
    let published: Value = serde_json::from_str(text).unwrap();
    let keys = published["keys"].as_array().unwrap();
    assert_eq!(keys.len(), config_keys().len());
    for (k, p) in config_keys().iter().zip(keys) {
        assert_eq!(p["key"], k.key.as_str());
        assert!(
            !p["doc"].as_str().unwrap().is_empty(),
            "{} has no doc",
            k.key
        );
    }
}

/// A valid value for a key: its default, else its example, else its first allowed value.
fn sample(k: &ConfigKey) -> Value {
    if !k.default.is_null() {
        return k.default.clone();
    }
    if let Some(example) = &k.example {
        return example.clone();
    }
    if let Some(first) = k.allowed.as_ref().and_then(|a| a.first()) {
        return Value::from(first.as_str());
    }
    match k.kind.as_str() {
        "integer" | "number" => json!(1),
        "boolean" => json!(true),
        "string" => json!("x"),
        other => panic!(
            "{}: no sample for type {other}: give it a default or an example",
            k.key
        ),
    }
}

/// A value of the wrong type for a key, or None where any type is accepted.
fn wrong(k: &ConfigKey) -> Option<Value> {
    match k.kind.as_str() {
        "integer" | "number" => Some(json!("not-a-number")),
        "boolean" => Some(json!(2.5)),
        "string" => Some(json!(12)),
        "object" => Some(json!("not-an-object")),
        _ => None,
    }
}

/// The smallest valid configuration of a store type: its required keys at their samples.
fn base(store: &str) -> Value {
    let mut fields = Map::new();
    fields.insert("type".into(), json!(store));
    for k in config_keys()
        .iter()
        .filter(|k| k.store.as_deref() == Some(store) && k.required)
    {
        fields.insert(k.key.trim_start_matches("store.").into(), sample(k));
    }
    // Eviction needs somewhere to evict from.
    json!({"store": fields, "prefix": "kv"})
}

/// `config` with `key` (a dotted path) set to `value`; the objects on the way start from
/// their samples, so that setting one key inside eviction keeps the object valid.
fn with_key(mut config: Value, k: &ConfigKey, value: Value) -> Value {
    let parts: Vec<&str> = k.key.split('.').collect();
    let mut at = &mut config;
    for depth in 0..parts.len() - 1 {
        let parent = parts[..=depth].join(".");
        let seed = config_keys()
            .iter()
            .find(|p| p.key == parent && p.store.is_none())
            .map(sample)
            .unwrap_or_else(|| json!({}));
        // The keyring's sources are alternatives (exactly one): the one being set replaces
        // the one the parent's sample names.
        let seed = match seed {
            Value::Object(fields) if parts[depth + 1].starts_with("keyring_") => Value::Object(
                fields
                    .into_iter()
                    .filter(|(key, _)| !key.starts_with("keyring_"))
                    .collect(),
            ),
            other => other,
        };
        at = at
            .as_object_mut()
            .unwrap()
            .entry(parts[depth])
            .or_insert(seed);
        if at.is_null() {
            *at = json!({});
        }
    }
    at.as_object_mut()
        .unwrap()
        .insert(parts[parts.len() - 1].into(), value);
    config
}

fn check_through_c(config: &Value) -> Result<(), (Status, String)> {
    let text = CString::new(config.to_string()).unwrap();
    // SAFETY: a valid NUL-terminated string, borrowed for the call.
    let status = unsafe { kvt_config_check(text.as_ptr()) };
    if status == Status::Ok {
        return Ok(());
    }
    // SAFETY: the calling thread's last error, valid until its next kvt_ call.
    let message = unsafe { CStr::from_ptr(kvt_last_error()) }
        .to_string_lossy()
        .into_owned();
    Err((status, message))
}

fn check_through_cli(config: &Value) -> Result<(), String> {
    let out = Command::new(env!("CARGO_BIN_EXE_kvtier"))
        .args(["config", "check", "--config"])
        .arg(config.to_string())
        .output()
        .unwrap();
    if out.status.success() {
        assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "ok");
        Ok(())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).into_owned())
    }
}

/// Every (store type, key) pair of the schema: the key's store type (or each store type,
/// for a key of the tier) and the key.
fn cases() -> Vec<(String, &'static ConfigKey)> {
    let stores = store_types();
    let mut cases = Vec::new();
    for k in config_keys()
        .iter()
        .filter(|k| k.key != "store" && k.key != "store.type")
    {
        match &k.store {
            Some(store) => cases.push((store.clone(), k)),
            None => cases.extend(stores.iter().map(|s| (s.clone(), k))),
        }
    }
    cases
}

#[test]
fn every_key_is_accepted_through_the_c_abi_and_the_command_line() {
    assert_eq!(store_types().len(), 5, "{:?}", store_types());
    for store in store_types() {
        let config = base(store);
        check_through_c(&config).unwrap_or_else(|e| panic!("{store}'s base {config}: {e:?}"));
    }
    let cases = cases();
    assert!(cases.len() > 60, "{} cases", cases.len());
    for (store, k) in &cases {
        let config = with_key(base(store), k, sample(k));
        check_through_c(&config)
            .or_else(|(status, message)| past_the_keys(k, &message).ok_or((status, message)))
            .unwrap_or_else(|e| panic!("{} on {store}: {config}: {e:?}", k.key));
        // One process per key is cheap; the command line shares no code path with the C ABI
        // but the check, and that is what is checked.
        if k.store.is_some() || store == "memory" {
            check_through_cli(&config)
                .or_else(|message| {
                    let message = message.trim().trim_start_matches("kvtier config: ");
                    past_the_keys(k, message).ok_or(message.to_string())
                })
                .unwrap_or_else(|e| panic!("{} on {store}: {config}: {e}", k.key));
        }
    }
}

/// `Some` when a check of an `encryption` key's sample was refused only for its keyring:
/// the samples name a keyring file, variable or command this machine lacks, and a check
/// reads the keyring as a tier's start does, once the keys are accepted.
fn past_the_keys(k: &ConfigKey, message: &str) -> Option<()> {
    let keyring = [
        "encryption: cannot read the keyring file ",
        "encryption: the keyring variable ",
        "encryption: cannot run the keyring command ",
        // Where programs run under an emulator (qemu-user), a missing one exits 127.
        "encryption: the keyring command ",
    ];
    // kvt_last_error's text names the status first; the command line's does not.
    let message = message.trim_start_matches("configuration error: ");
    (k.key.starts_with("encryption") && keyring.iter().any(|says| message.starts_with(says)))
        .then_some(())
}

#[test]
fn a_bad_value_is_refused_naming_the_key_path() {
    for (store, k) in cases() {
        let Some(bad) = wrong(k) else { continue };
        let config = with_key(base(&store), k, bad.clone());
        let (status, message) = check_through_c(&config)
            .expect_err(&format!("{} = {bad} on {store} was accepted", k.key));
        assert_eq!(status, Status::Config, "{}: {message}", k.key);
        assert!(
            message.contains(&format!("{}:", k.key)),
            "{} = {bad} on {store}: the message does not name the key's path: {message}",
            k.key
        );
    }
    // Unknown keys, at every level, are named with their path too.
    for (config, path) in [
        (json!({"store": {"type": "memory"}, "colour": 1}), "colour"),
        (
            json!({"store": {"type": "local", "path": "/x", "colour": 1}}),
            "store",
        ),
        (
            json!({"store": {"type": "memory"}, "prefix": "p", "eviction": {"max_bytes": 1, "colour": 1}}),
            "eviction",
        ),
        (json!({"store": {"type": "ftp"}}), "store.type"),
    ] {
        let (status, message) = check_through_c(&config).unwrap_err();
        assert_eq!(status, Status::Config);
        assert!(
            message.contains(path)
                && message.contains(if path == "store.type" {
                    "ftp"
                } else {
                    "colour"
                }),
            "{config}: {message}"
        );
    }
    let e = check_through_cli(
        &json!({"store": {"type": "s3", "bucket": "b", "request_timeout_ms": "2"}}),
    )
    .unwrap_err();
    assert!(
        e.contains("store.request_timeout_ms: invalid type: string \"2\""),
        "{e}"
    );
}
