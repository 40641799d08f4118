//! Where the operator subcommands find objects (a local directory, or a bucket of a real
//! s3s-fs), blocks written there as a store job writes them, aged and corrupted through
//! the files that hold them, and what the tests read from the JSON reports.

use std::path::PathBuf;
use std::time::{Duration, SystemTime};

use kvtier_core::key::KeyLayout;
use kvtier_core::store::object_path;
use serde_json::{json, Value};

use crate::support::*;

pub const NS_A: &str = "m_0123456789ab_r0";
pub const NS_B: &str = "m_ba9876543210_r1";
pub const BLOCK: usize = 4096;

/// Where the objects live: a local directory, or a bucket of a real s3s-fs.
pub enum Backend {
    Local(tempfile::TempDir),
    S3 { server: Server, bucket: String },
}

impl Backend {
    pub fn local() -> Backend {
        Backend::Local(tempfile::tempdir().unwrap())
    }

    pub fn s3s_fs() -> Backend {
        let server = Server::s3s_fs();
        let bucket = server.new_bucket();
        Backend::S3 { server, bucket }
    }

    /// The `store` section of a configuration.
    pub fn store(&self) -> Value {
        match self {
            Backend::Local(dir) => json!({"type": "local", "path": dir.path()}),
            Backend::S3 { server, bucket } => server.store_json(bucket),
        }
    }

    /// A tier configuration with the `kv` prefix and `namespace`.
    pub fn config(&self, namespace: &str) -> String {
        config_of(self.store(), namespace)
    }

    /// The file holding object `name`: the local store's own, or the one s3s-fs keeps.
    pub fn file(&self, name: &str) -> PathBuf {
        match self {
            Backend::Local(dir) => dir.path().join(name),
            Backend::S3 { server, bucket } => server.root().unwrap().join(bucket).join(name),
        }
    }

    /// Whether object `name` exists, asked through the store.
    pub fn exists(&self, name: &str) -> bool {
        oob_get(&self.store(), name).is_some()
    }

    /// Writes blocks `ids` of `namespace` (under `kv`) as a store job would, each
    /// `bytes` long, and returns their object names in the order of `ids`.
    pub fn put_blocks(&self, namespace: &str, ids: &[u64], bytes: usize) -> Vec<String> {
        put_blocks_in(&self.store(), namespace, ids, bytes)
    }

    /// Makes object `name` look `age` old: its file's modification time.
    pub fn set_age(&self, name: &str, age: Duration) {
        let file = std::fs::File::options()
            .write(true)
            .open(self.file(name))
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        file.set_modified(SystemTime::now() - age).unwrap();
    }
}

/// Writes blocks `ids` of `namespace` (under `kv`) into `store` as a store job would,
/// each `bytes` long, and returns their object names in the order of `ids`.
pub fn put_blocks_in(store: &Value, namespace: &str, ids: &[u64], bytes: usize) -> Vec<String> {
    let layout = KeyLayout::new("kv", namespace).unwrap();
    let names: Vec<String> = ids
        .iter()
        .map(|&i| layout.object_name(&key(i)).unwrap())
        .collect();
    block_on(async {
        let s = oob_store(store);
        for (name, &i) in names.iter().zip(ids) {
            s.put_block(&object_path(name), random_bytes(bytes, i).into())
                .await
                .unwrap();
        }
    });
    names
}

/// A tier configuration of `store` with the `kv` prefix and `namespace`.
pub fn config_of(store: Value, namespace: &str) -> String {
    json!({"store": store, "prefix": "kv", "namespace": namespace}).to_string()
}

/// The string field `field` of each object in a JSON array, in order.
pub fn each_str<'a>(list: &'a Value, field: &str) -> Vec<&'a str> {
    list.as_array()
        .unwrap()
        .iter()
        .map(|o| o[field].as_str().unwrap())
        .collect()
}

/// Names in a JSON array of objects with a `name` field, sorted.
pub fn names_in(list: &Value) -> Vec<String> {
    let mut names: Vec<String> = each_str(list, "name")
        .into_iter()
        .map(String::from)
        .collect();
    names.sort();
    names
}

pub fn sorted(names: &[String]) -> Vec<String> {
    let mut v = names.to_vec();
    v.sort();
    v
}

/// The check of a `probe --json` report with this id.
pub fn check<'a>(report: &'a Value, id: &str) -> &'a Value {
    report
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["check"] == id)
        .unwrap_or_else(|| panic!("no check {id} in {report}"))
}

/// Asserts that check `id` of a `probe --json` report failed, fatally, its detail saying
/// `says` (the fix).
pub fn assert_fatal(report: &Value, id: &str, says: &str) {
    let failed = check(report, id);
    assert_eq!(
        (&failed["ok"], &failed["fatal"]),
        (&json!(false), &json!(true)),
        "{id}: {report}"
    );
    assert!(
        failed["detail"].as_str().unwrap().contains(says),
        "{id}: {report}"
    );
}

/// Flips one byte in the middle of the file that holds `name`; its length and recorded
/// checksum stay as they were.
pub fn corrupt(b: &Backend, name: &str) {
    use std::os::unix::fs::FileExt;
    let file = std::fs::File::options()
        .read(true)
        .write(true)
        .open(b.file(name))
        .unwrap();
    let mut byte = [0u8; 1];
    file.read_exact_at(&mut byte, 1000).unwrap();
    byte[0] ^= 0x40;
    file.write_all_at(&byte, 1000).unwrap();
}
