//! The configuration's parsing and checks.

use super::*;
use crate::error::Status;

#[test]
fn malformed_endpoints_are_config_errors_naming_the_key() {
    for bad in [
        "http://[::1",
        "http://127.0.0.1:99999",
        "ht!tp://x",
        "ftp://host",
        "host:port",
        "http://a b:9000",
        "http://:9000",
        "http://[nope]:9000",
        "http://[::1]x",
        "http://h:0",
        "http://u:p@h:9000",
        "http://h/a b",
        "http://h:+80",
    ] {
        let json =
            format!(r#"{{"store":{{"type":"s3","bucket":"b","endpoint_override":{bad:?}}}}}"#);
        let e = TierConfig::from_json(&json)
            .and_then(|c| c.validate())
            .unwrap_err();
        assert_eq!(e.status, Status::Config, "{bad}: {}", e.message);
        assert!(
            e.message.contains("endpoint_override"),
            "{bad}: {}",
            e.message
        );
    }
    for good in [
        "minio.internal:9000",
        "http://127.0.0.1:9000",
        "https://s3.example.com/",
        "http://[::1]:9000",
        "[::1]",
        "HTTPS://S3.example.com:443/base",
        "s3_gw.local",
    ] {
        let json =
            format!(r#"{{"store":{{"type":"s3","bucket":"b","endpoint_override":{good:?}}}}}"#);
        TierConfig::from_json(&json)
            .and_then(|c| c.validate())
            .unwrap_or_else(|e| panic!("{good}: {e}"));
    }
}

#[test]
fn minimal_local_config_takes_defaults() {
    let c = TierConfig::from_json(r#"{"store":{"type":"local","path":"/tmp/x"}}"#).unwrap();
    assert_eq!(c.key_bytes, 36);
    assert_eq!(c.runtime_threads, 2);
    assert!(!c.enable_kv_events);
    assert!(matches!(c.store, StoreConfig::Local(_)));
}

#[test]
fn unknown_key_is_named() {
    let e = TierConfig::from_json(r#"{"store":{"type":"memory"},"prefx":"a"}"#).unwrap_err();
    assert_eq!(e.status, Status::Config);
    assert!(e.message.contains("prefx"), "{}", e.message);
    let e =
        TierConfig::from_json(r#"{"store":{"type":"local","path":"/x","colour":1}}"#).unwrap_err();
    assert!(e.message.contains("colour"), "{}", e.message);
}

#[test]
fn malformed_json_and_bad_values() {
    assert_eq!(
        TierConfig::from_json("{").unwrap_err().status,
        Status::Config
    );
    assert_eq!(
        TierConfig::from_json("").unwrap_err().status,
        Status::Config
    );
    let e = TierConfig::from_json(r#"{"store":{"type":"ftp"}}"#).unwrap_err();
    assert!(e.message.contains("ftp"), "{}", e.message);
    let e = TierConfig::from_json(r#"{"store":{"type":"memory"},"locality":"local"}"#).unwrap_err();
    assert!(e.message.contains("local"), "{}", e.message);
    assert!(TierConfig::from_json(r#"{"store":{"type":"memory"},"locality":"REMOTE"}"#).is_ok());
    let e =
        TierConfig::from_json(r#"{"store":{"type":"memory"},"runtime_threads":0}"#).unwrap_err();
    assert!(e.message.contains("runtime_threads"));
    let e = TierConfig::from_json(r#"{"store":{"type":"memory"},"key_bytes":3}"#).unwrap_err();
    assert!(e.message.contains("key_bytes"));
    for nice in ["-1", "20"] {
        let json = format!(r#"{{"store":{{"type":"memory"}},"transfer_thread_nice":{nice}}}"#);
        let e = TierConfig::from_json(&json).unwrap_err();
        assert!(e.message.contains("transfer_thread_nice"), "{}", e.message);
    }
}

#[test]
fn secrets_never_echoed() {
    let json = r#"{"store":{"type":"s3","bucket":"b","access_key":"AKIAEXAMPLE","secret_key":"hunter2-very-secret","bogus":1}}"#;
    let e = TierConfig::from_json(json).unwrap_err();
    assert!(!e.message.contains("hunter2"), "{}", e.message);
    assert!(!e.message.contains("AKIAEXAMPLE"), "{}", e.message);
    let json =
        r#"{"store":{"type":"s3","bucket":"b","access_key":"AKIAEXAMPLE","secret_key":12345678}}"#;
    let e = TierConfig::from_json(json).unwrap_err();
    assert!(!e.message.contains("12345678"), "{}", e.message);
    let ok = TierConfig::from_json(
        r#"{"store":{"type":"s3","bucket":"b","access_key":"AKIAEXAMPLE","secret_key":"hunter2-very-secret","session_token":"tok-secret"}}"#,
    )
    .unwrap();
    let debug = format!("{ok:?}");
    assert!(
        !debug.contains("hunter2") && !debug.contains("tok-secret"),
        "{debug}"
    );
}

#[test]
fn s3_words_and_validation() {
    let c = TierConfig::from_json(
        r#"{"store":{"type":"s3","bucket":"b","use_virtual_addressing":"true","req_checksum":"required","num_threads":"8"}}"#,
    )
    .unwrap();
    match c.store {
        StoreConfig::S3(s3) => {
            assert!(s3.use_virtual_addressing);
            assert_eq!(s3.req_checksum, Some(ChecksumPolicy::Required));
        }
        _ => panic!("expected s3"),
    }
    let e = TierConfig::from_json(r#"{"store":{"type":"s3","bucket":"b","scheme":"ftp"}}"#)
        .unwrap_err();
    assert!(e.message.contains("scheme"));
    let e = TierConfig::from_json(r#"{"store":{"type":"s3","bucket":""}}"#).unwrap_err();
    assert!(e.message.contains("bucket"));
    let e = TierConfig::from_json(r#"{"store":{"type":"s3","bucket":"b","access_key":"x"}}"#)
        .unwrap_err();
    assert!(e.message.contains("together"));
}

#[test]
fn s3_defaults_and_vllm_store_config_keys() {
    // A vLLM obj-tier store_config pasted as is (all strings, NIXL's num_threads).
    let c = TierConfig::from_json(
        r#"{"store":{"type":"s3","bucket":"kv","endpoint_override":"minio.local:9000","scheme":"http",
            "access_key":"AKIDEXAMPLE","secret_key":"s3cret-value","session_token":"","region":"",
            "ca_bundle":"","use_virtual_addressing":"false","req_checksum":"required","resp_checksum":"supported",
            "num_threads":"4"}}"#,
    )
    .unwrap();
    let StoreConfig::S3(s3) = c.store else {
        panic!("expected s3")
    };
    assert_eq!(s3.scheme.as_deref(), Some("http"));
    assert!(!s3.use_virtual_addressing);
    assert_eq!(s3.resp_checksum, Some(ChecksumPolicy::Supported));
    // Defaults of kvtier's own keys.
    let c = TierConfig::from_json(r#"{"store":{"type":"s3","bucket":"kv"}}"#).unwrap();
    let StoreConfig::S3(s3) = c.store else {
        panic!("expected s3")
    };
    assert_eq!(
        (
            s3.connect_timeout_ms,
            s3.request_timeout_ms,
            s3.retry_budget_ms,
            s3.max_retries
        ),
        (5_000, 30_000, 20_000, None)
    );
    assert!(!s3.payload_signing && s3.allow_http && !s3.use_virtual_addressing);
    assert_eq!(
        s3.scheme, None,
        "no scheme: https unless endpoint_override carries one"
    );
}

#[test]
fn azure_and_gcs_configs() {
    let c = TierConfig::from_json(
        r#"{"store":{"type":"azure","account":"devstoreaccount1","container":"kv","access_key":"a2V5LXNlY3JldC12YWx1ZQ==","endpoint":"http://127.0.0.1:10000/devstoreaccount1","max_retries":1}}"#,
    )
    .unwrap();
    let StoreConfig::Azure(azure) = &c.store else {
        panic!("expected azure")
    };
    assert_eq!(
        (
            azure.container.as_str(),
            azure.max_retries,
            azure.connect_timeout_ms
        ),
        ("kv", Some(1), 5_000)
    );
    assert!(
        !format!("{c:?}").contains("a2V5LXNlY3JldC12YWx1ZQ=="),
        "the key in Debug"
    );
    let c = TierConfig::from_json(
        r#"{"store":{"type":"gcs","bucket":"kv","service_account":"/x/sa.json"}}"#,
    )
    .unwrap();
    let StoreConfig::Gcs(gcs) = &c.store else {
        panic!("expected gcs")
    };
    assert_eq!(
        (
            gcs.bucket.as_str(),
            gcs.endpoint.as_str(),
            gcs.request_timeout_ms
        ),
        ("kv", "", 30_000)
    );

    let bad = |store: &str| TierConfig::from_json(&format!(r#"{{"store":{store}}}"#)).unwrap_err();
    for (store, names) in [
        (
            r#"{"type":"azure","account":"a","container":"c","bucket":"b"}"#,
            "bucket",
        ),
        (
            r#"{"type":"azure","account":"a","container":""}"#,
            "store.container",
        ),
        (
            r#"{"type":"azure","account":"","container":"c"}"#,
            "store.account",
        ),
        (r#"{"type":"azure","container":"c"}"#, "account"),
        (
            r#"{"type":"azure","account":"a","container":"c","endpoint":"127.0.0.1:10000"}"#,
            "store.endpoint",
        ),
        (
            r#"{"type":"azure","account":"a","container":"c","max_retries":101}"#,
            "store.max_retries",
        ),
        (
            r#"{"type":"gcs","bucket":"b","container":"c"}"#,
            "container",
        ),
        (r#"{"type":"gcs","bucket":""}"#, "store.bucket"),
        (
            r#"{"type":"gcs","bucket":"b","endpoint":"ftp://h"}"#,
            "store.endpoint",
        ),
        (
            r#"{"type":"gcs","bucket":"b","request_timeout_ms":0}"#,
            "store.request_timeout_ms",
        ),
    ] {
        let e = bad(store);
        assert_eq!(e.status, Status::Config, "{store}: {}", e.message);
        assert!(e.message.contains(names), "{store}: {}", e.message);
    }
    let e = bad(
        r#"{"type":"azure","account":"a","container":"c","access_key":"key-secret-1","sas":"sig=sas-secret-2"}"#,
    );
    assert!(
        e.message.contains("store.access_key and store.sas"),
        "{}",
        e.message
    );
    assert!(
        !e.message.contains("key-secret-1") && !e.message.contains("sas-secret-2"),
        "{}",
        e.message
    );
    let e = bad(
        r#"{"type":"azure","account":"a","container":"c","sas":"sig=sas-secret-3","colour":1}"#,
    );
    assert!(
        e.message.contains("colour") && !e.message.contains("sas-secret-3"),
        "{}",
        e.message
    );
}

#[test]
fn s3_value_checks() {
    let bad = |store: &str| {
        TierConfig::from_json(&format!(
            r#"{{"store":{{"type":"s3","bucket":"b",{store}}}}}"#
        ))
        .unwrap_err()
    };
    let e = bad(r#""request_timeout_ms":0"#);
    assert!(e.message.contains("request_timeout_ms"), "{}", e.message);
    let e = bad(r#""connect_timeout_ms":0"#);
    assert!(e.message.contains("connect_timeout_ms"), "{}", e.message);
    let e = bad(r#""max_retries":1000"#);
    assert!(e.message.contains("max_retries"), "{}", e.message);
    let e = bad(r#""retry_budget_ms":300001"#);
    assert!(
        e.message
            .starts_with("store.retry_budget_ms is 300001; it must be 0..=300000"),
        "{}",
        e.message
    );
    let e = bad(r#""retry_budget_ms":-1"#);
    assert!(e.message.contains("store.retry_budget_ms"), "{}", e.message);
    let e = bad(r#""retry_budget_ms":"soon""#);
    assert!(e.message.contains("store.retry_budget_ms"), "{}", e.message);
    let e = bad(r#""session_token":"tok-secret-123""#);
    assert!(
        e.message.contains("session_token") && !e.message.contains("tok-secret-123"),
        "{}",
        e.message
    );
    let e = bad(r#""use_virtual_addressing":true,"endpoint_override":"127.0.0.1:9000""#);
    assert!(e.message.contains("DNS name"), "{}", e.message);
    let e = bad(r#""use_virtual_addressing":"yes","endpoint_override":"http://10.0.0.1""#);
    assert!(e.message.contains("DNS name"), "{}", e.message);
    assert!(TierConfig::from_json(
        r#"{"store":{"type":"s3","bucket":"b","use_virtual_addressing":true,"endpoint_override":"https://s3.example.com:9000"}}"#
    )
    .is_ok());
    let e = bad(r#""payload_signing":"maybe""#);
    assert!(e.message.contains("boolean"), "{}", e.message);
}
