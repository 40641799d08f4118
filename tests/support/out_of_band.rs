//! Out-of-band store access: a separate client, as another writer of the bucket would be,
//! for writing and reading objects behind the tier's back.

use serde_json::Value;

/// Runs a future on a throwaway runtime (for out-of-band store access in tests).
pub fn block_on<F: std::future::Future>(f: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(f)
}

/// A store built from a `store` JSON section, for writing and reading objects behind the
/// tier's back. Build it inside the runtime that uses it.
pub fn oob_store(store: &Value) -> kvtier_core::store::Store {
    let config: kvtier_core::config::StoreConfig = serde_json::from_value(store.clone()).unwrap();
    kvtier_core::store::Store::open(&config).unwrap()
}

pub fn oob_put(store: &Value, name: &str, bytes: Vec<u8>) {
    use object_store::ObjectStoreExt;
    block_on(async {
        let s = oob_store(store);
        s.client()
            .put(&kvtier_core::store::object_path(name), bytes.into())
            .await
            .unwrap();
    })
}

/// The object's bytes, or `None` if it does not exist.
pub fn oob_get(store: &Value, name: &str) -> Option<Vec<u8>> {
    use object_store::ObjectStoreExt;
    block_on(async {
        let s = oob_store(store);
        match s.client().get(&kvtier_core::store::object_path(name)).await {
            Ok(r) => Some(r.bytes().await.unwrap().to_vec()),
            Err(object_store::Error::NotFound { .. }) => None,
            Err(e) => panic!("out-of-band get {name}: {e}"),
        }
    })
}
