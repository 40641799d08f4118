//! Encryption at rest on the local store and on real S3 servers (s3s-fs, moto, Ceph RGW):
//! blocks round-trip under one key and across a rotation of three; what the bucket holds
//! is not the block; an object tampered with, cut short, copied under another key's name
//! or sealed under a key the reader lacks fails alone (counted, MISS, never wrong bytes,
//! never deleted); plain and encrypted tiers refuse each other's objects; no key material
//! in any message, log record or metrics text. Its own binary: the log callback is
//! process-wide.

#[macro_use]
mod support;

use std::ffi::{c_char, c_void, CStr};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use base64::Engine;
use kvtier_core::{JobKind, LookupResult, Status, Tier};
use serde_json::{json, Value};
use support::*;

/// Blocks of three 64 KiB segments and a short fourth.
const BLOCK: usize = 3 * 65536 + 1234;
/// The format's fixed overhead for such a block: its header and four tags.
const OVERHEAD: usize = 64 + 4 * 16;

/// The keys of the tests' keyrings, by id.
const KEYS: [(&str, [u8; 32]); 4] = [
    ("k1", [0x11; 32]),
    ("k2", *b"0123456789abcdefghijklmnopqrstuv"),
    ("k3", [0xa7; 32]),
    ("stranger", [0x5c; 32]),
];

fn key_material(id: &str) -> [u8; 32] {
    KEYS.iter().find(|(k, _)| *k == id).unwrap().1
}

fn ring_text(write: &str, ids: &[&str]) -> String {
    let keys: serde_json::Map<String, Value> = ids
        .iter()
        .map(|id| {
            let encoded = base64::engine::general_purpose::STANDARD.encode(key_material(id));
            (id.to_string(), json!(encoded))
        })
        .collect();
    json!({"write": write, "keys": keys}).to_string()
}

/// A keyring file in a directory of its own.
struct Ring {
    _dir: tempfile::TempDir,
    path: PathBuf,
}

impl Ring {
    fn new(write: &str, ids: &[&str]) -> Ring {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("keyring.json");
        std::fs::write(&path, ring_text(write, ids)).unwrap();
        Ring { _dir: dir, path }
    }

    /// Replaces the keyring atomically (a reader never sees half a file).
    fn rewrite(&self, write: &str, ids: &[&str]) {
        let next = self.path.with_extension("next");
        std::fs::write(&next, ring_text(write, ids)).unwrap();
        std::fs::rename(&next, &self.path).unwrap();
    }
}

fn config(store: &Value, encryption: Value) -> String {
    tier_json(
        store.clone(),
        json!({"checksums": true, "on_corrupt": "fail_and_delete", "encryption": encryption}),
    )
}

fn encrypted(store: &Value, ring: &Path) -> Tier {
    let encryption = json!({"keyring_file": ring, "refresh_s": 0});
    Tier::from_json(&config(store, encryption)).unwrap_or_else(|e| panic!("tier start: {e}"))
}

fn plain(store: &Value) -> Tier {
    Tier::from_json(&tier_json(store.clone(), json!({"checksums": true}))).unwrap()
}

fn pool(tier: &Tier, seed: u64) -> Pool {
    let mut pool = Pool::new(8, BLOCK);
    pool.fill_random(seed);
    pool.register(tier);
    pool
}

fn run(
    tier: &Tier,
    kind: JobKind,
    job: u64,
    blocks: &[u64],
    ids: &[u64],
) -> kvtier_core::JobResult {
    tier.submit(kind, job, blocks, keys(ids)).unwrap();
    wait_all(tier, 1).remove(&job).unwrap()
}

fn name(tier: &Tier, id: u64) -> String {
    tier.layout().object_name(&key(id)).unwrap()
}

/// The key id an object's header names.
fn key_id_of(object: &[u8]) -> String {
    assert_eq!(&object[..8], b"KVTENC01", "not an encrypted object");
    String::from_utf8(
        object[8..32]
            .iter()
            .copied()
            .take_while(|&b| b != 0)
            .collect(),
    )
    .unwrap()
}

/// Key material of any of the tests' keys, raw, in hex or in base64, in `text`.
fn assert_no_key_material(text: &str) {
    for (id, key) in KEYS {
        let hex: String = key.iter().map(|b| format!("{b:02x}")).collect();
        let b64 = base64::engine::general_purpose::STANDARD.encode(key);
        let raw = String::from_utf8_lossy(&key).into_owned();
        for form in [&hex[..16], &b64[..12], &raw[..]] {
            assert!(!text.contains(form), "key {id}'s material in: {text}");
        }
    }
}

// -- the cases, on any store ----------------------------------------------------------

/// Stored by one tier, loaded byte-exact by another; the bucket holds the format, not the
/// block.
fn round_trip_under_one_key(store: &Value) {
    let ring = Ring::new("k1", &["k1"]);
    let writer = encrypted(store, &ring.path);
    let source = pool(&writer, 1);
    let stored = run(&writer, JobKind::Store, 1, &[0, 1, 2, 3], &[10, 11, 12, 13]);
    assert!(stored.succeeded(), "{}", stored.message);

    let object = oob_get(store, &name(&writer, 10)).expect("the object exists");
    assert_eq!(object.len(), BLOCK + OVERHEAD);
    assert_eq!(key_id_of(&object), "k1");
    let block = source.block(0);
    assert!(
        !object.windows(32).any(|w| w == &block[1000..1032]),
        "the block's bytes are in the object"
    );

    let reader = encrypted(store, &ring.path);
    let mut into = Pool::new(8, BLOCK);
    into.register(&reader);
    let loaded = run(&reader, JobKind::Load, 2, &[7, 6, 5, 4], &[10, 11, 12, 13]);
    assert!(loaded.succeeded(), "{}", loaded.message);
    for i in 0..4 {
        assert!(into.block(7 - i) == source.block(i), "block {i} differs");
    }
    let stats = reader.stats();
    assert_eq!((stats.undecryptable_blocks, stats.corrupt_blocks), (0, 0));
}

/// Three keys in turn: each block is sealed with the write key of its time and all load
/// with the ring of three.
fn rotation_across_three_keys(store: &Value) {
    let ring = Ring::new("k1", &["k1"]);
    let mut sources = Vec::new();
    for (i, (write, ids)) in [
        ("k1", &["k1"][..]),
        ("k2", &["k1", "k2"]),
        ("k3", &["k1", "k2", "k3"]),
    ]
    .into_iter()
    .enumerate()
    {
        ring.rewrite(write, ids);
        let tier = encrypted(store, &ring.path);
        let source = pool(&tier, 20 + i as u64);
        let stored = run(&tier, JobKind::Store, 1, &[0], &[20 + i as u64]);
        assert!(stored.succeeded(), "{}", stored.message);
        let object = oob_get(store, &name(&tier, 20 + i as u64)).unwrap();
        assert_eq!(key_id_of(&object), write);
        sources.push(source.block(0).to_vec());
    }
    let reader = encrypted(store, &ring.path);
    let mut into = Pool::new(8, BLOCK);
    into.register(&reader);
    let loaded = run(&reader, JobKind::Load, 2, &[0, 1, 2], &[20, 21, 22]);
    assert!(loaded.succeeded(), "{}", loaded.message);
    for (i, source) in sources.iter().enumerate() {
        assert!(
            into.block(i as u64) == &source[..],
            "block of key k{} differs",
            i + 1
        );
    }
}

/// One job over a good object, one with a flipped byte, one cut short by a byte, one
/// holding another key's object, and one sealed under a key the reader lacks: every bad
/// one fails alone, none is deleted (even with fail_and_delete), each answers MISS, and a
/// store rewrites it.
fn each_bad_object_fails_alone(store: &Value) {
    let ring = Ring::new("k2", &["k1", "k2"]);
    let writer = encrypted(store, &ring.path);
    let source = pool(&writer, 3);
    let stored = run(&writer, JobKind::Store, 1, &[0, 1, 2, 3], &[30, 31, 32, 33]);
    assert!(stored.succeeded(), "{}", stored.message);
    let stranger_ring = Ring::new("stranger", &["stranger"]);
    let stranger = encrypted(store, &stranger_ring.path);
    let _stranger_pool = pool(&stranger, 4);
    let stored = run(&stranger, JobKind::Store, 1, &[0], &[34]);
    assert!(stored.succeeded(), "{}", stored.message);

    // Behind the tiers' backs, as a writer of the bucket: 31 tampered, 32 cut short, 33
    // overwritten with 30's object. Out-of-band writes record no checksum, so the loads
    // below meet these objects' tags, not their CRC32C (a recorded checksum would send
    // 31 down the corrupt path).
    let mut tampered = oob_get(store, &name(&writer, 31)).unwrap();
    tampered[BLOCK / 2] ^= 0x01;
    oob_put(store, &name(&writer, 31), tampered);
    let mut cut = oob_get(store, &name(&writer, 32)).unwrap();
    cut.pop();
    oob_put(store, &name(&writer, 32), cut);
    let copied = oob_get(store, &name(&writer, 30)).unwrap();
    oob_put(store, &name(&writer, 33), copied);

    let reader = encrypted(store, &ring.path);
    let mut into = Pool::new(8, BLOCK);
    into.fill_random(99);
    into.register(&reader);
    let loaded = run(
        &reader,
        JobKind::Load,
        2,
        &[0, 1, 2, 3, 4],
        &[30, 31, 32, 33, 34],
    );
    assert_eq!(
        loaded.key_status,
        [
            Status::Ok,
            Status::Undecryptable,
            Status::LengthMismatch,
            Status::Undecryptable,
            Status::Undecryptable
        ],
        "{}",
        loaded.message
    );
    assert!(into.block(0) == source.block(0));
    // A failed key's block never holds another block's bytes.
    assert!(into.block(3) != source.block(0));
    assert_no_key_material(&loaded.message);
    let stats = reader.stats();
    assert_eq!((stats.undecryptable_blocks, stats.corrupt_blocks), (3, 0));
    for id in [31, 32, 33, 34] {
        assert!(
            oob_get(store, &name(&reader, id)).is_some(),
            "key {id} was deleted"
        );
    }
    for (request, id) in [(1, 31), (2, 33), (3, 34)] {
        assert_eq!(
            resolve_lookup(&reader, request, &key(id)),
            LookupResult::Miss,
            "key {id}"
        );
    }
    reader.schedule_end().unwrap();

    // The reader's next store of 33 rewrites the object, which then loads.
    into.block_mut(5).copy_from_slice(source.block(3));
    let rewritten = run(&reader, JobKind::Store, 3, &[5], &[33]);
    assert!(rewritten.succeeded(), "{}", rewritten.message);
    let again = encrypted(store, &ring.path);
    let mut check = Pool::new(2, BLOCK);
    check.register(&again);
    let loaded = run(&again, JobKind::Load, 4, &[1], &[33]);
    assert!(loaded.succeeded(), "{}", loaded.message);
    assert!(check.block(1) == source.block(3));
}

/// A plain tier's object is refused by an encrypted tier, and the reverse, by length.
fn plain_and_encrypted_refuse_each_other(store: &Value) {
    let ring = Ring::new("k1", &["k1"]);
    let plain_tier = plain(store);
    let _plain_pool = pool(&plain_tier, 5);
    assert!(run(&plain_tier, JobKind::Store, 1, &[0], &[40]).succeeded());
    let sealed_tier = encrypted(store, &ring.path);
    let _sealed_pool = pool(&sealed_tier, 6);
    assert!(run(&sealed_tier, JobKind::Store, 1, &[0], &[41]).succeeded());

    let refused = run(&sealed_tier, JobKind::Load, 2, &[1], &[40]);
    assert_eq!(
        refused.status,
        Status::LengthMismatch,
        "{}",
        refused.message
    );
    assert!(
        refused.message.contains("without encryption is refused"),
        "{}",
        refused.message
    );
    // The plain object answers MISS from then on, and the encrypted tier's next store
    // rewrites it (a conditional PUT would otherwise leave it in place), which then loads.
    assert_eq!(
        resolve_lookup(&sealed_tier, 1, &key(40)),
        LookupResult::Miss
    );
    sealed_tier.schedule_end().unwrap();
    assert!(run(&sealed_tier, JobKind::Store, 3, &[0], &[40]).succeeded());
    let reloaded = run(&sealed_tier, JobKind::Load, 4, &[2], &[40]);
    assert!(reloaded.succeeded(), "{}", reloaded.message);
    let refused = run(&plain_tier, JobKind::Load, 2, &[1], &[41]);
    assert_eq!(
        refused.status,
        Status::LengthMismatch,
        "{}",
        refused.message
    );
}

// -- on every store -----------------------------------------------------------------------

fn on_bucket(srv: &Server, case: fn(&Value)) {
    case(&srv.store_json(&srv.new_bucket()));
}

fn s3_round_trip_under_one_key(srv: &Server) {
    on_bucket(srv, round_trip_under_one_key);
}

fn s3_rotation_across_three_keys(srv: &Server) {
    on_bucket(srv, rotation_across_three_keys);
}

fn s3_each_bad_object_fails_alone(srv: &Server) {
    on_bucket(srv, each_bad_object_fails_alone);
}

fn s3_plain_and_encrypted_refuse_each_other(srv: &Server) {
    on_bucket(srv, plain_and_encrypted_refuse_each_other);
}

on_both_servers!(
    s3_round_trip_under_one_key,
    s3_rotation_across_three_keys,
    s3_each_bad_object_fails_alone,
    s3_plain_and_encrypted_refuse_each_other,
);

mod local {
    use super::*;

    fn local_store() -> (tempfile::TempDir, Value) {
        let dir = tempfile::tempdir().unwrap();
        let store = json!({"type": "local", "path": dir.path()});
        (dir, store)
    }

    #[test]
    fn round_trip_under_one_key() {
        let (_dir, store) = local_store();
        super::round_trip_under_one_key(&store);
    }

    #[test]
    fn rotation_across_three_keys() {
        let (_dir, store) = local_store();
        super::rotation_across_three_keys(&store);
    }

    #[test]
    fn each_bad_object_fails_alone() {
        let (_dir, store) = local_store();
        super::each_bad_object_fails_alone(&store);
    }

    #[test]
    fn plain_and_encrypted_refuse_each_other() {
        let (_dir, store) = local_store();
        super::plain_and_encrypted_refuse_each_other(&store);
    }
}

// -- key sources, rotation without a restart, and secrecy ----------------------------------

fn memory_store() -> Value {
    json!({"type": "memory"})
}

#[test]
fn keyrings_come_from_a_variable_or_a_command_never_the_configuration() {
    let ring = Ring::new("k2", &["k1", "k2"]);
    let text = std::fs::read_to_string(&ring.path).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let store = json!({"type": "local", "path": dir.path()});
    let tier = Tier::from_json(&config(
        &store,
        json!({"keyring_command": ["cat", ring.path]}),
    ))
    .unwrap();
    let _pool = pool(&tier, 7);
    assert!(run(&tier, JobKind::Store, 1, &[0], &[50]).succeeded());
    assert!(run(&tier, JobKind::Load, 2, &[1], &[50]).succeeded());
    drop(tier);

    // The variable, in a process of its own (setting one in this multi-threaded test
    // process would race every thread that reads the environment): `kvtier verify` opens
    // the block with the keyring the variable holds, and says so when it is not set.
    let by_variable = config(&store, json!({"keyring_env": "KVTIER_TEST_KEYRING"}));
    let verify = |keyring: Option<&str>| {
        let mut command = std::process::Command::new(support::kvtier_cli());
        command.args(["verify", "--json", "--config", &by_variable]);
        command.env_remove("KVTIER_TEST_KEYRING");
        if let Some(keyring) = keyring {
            command.env("KVTIER_TEST_KEYRING", keyring);
        }
        command.output().unwrap()
    };
    let opened = verify(Some(&text));
    let stdout = String::from_utf8_lossy(&opened.stdout);
    assert!(
        opened.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&opened.stderr)
    );
    let report: Value = serde_json::from_str(stdout.trim()).unwrap();
    assert_eq!(
        (report["good"].as_u64(), report["undecryptable"].clone()),
        (Some(1), json!([]))
    );
    let unset = verify(None);
    assert!(!unset.status.success());
    assert!(String::from_utf8_lossy(&unset.stderr).contains("not set"));

    // A keyring is never part of the configuration, and a bad source names itself.
    let cases = [
        (json!({"keyring": text}), "keyring"),
        (json!({}), "exactly one of"),
        (
            json!({"keyring_env": "X", "keyring_file": "/y"}),
            "exactly one of",
        ),
        (json!({"keyring_command": ["false"]}), "failed"),
        (json!({"keyring_command": []}), "program"),
        (
            json!({"keyring_file": "/nonexistent/keyring.json"}),
            "cannot read",
        ),
    ];
    for (encryption, says) in cases {
        let error = Tier::from_json(&config(&memory_store(), encryption.clone()))
            .err()
            .expect("the tier must not start");
        assert_eq!(
            error.status,
            Status::Config,
            "{encryption}: {}",
            error.message
        );
        assert!(
            error.message.contains(says),
            "{encryption}: {}",
            error.message
        );
    }
    // A keyring with a bad key names the key, not its bytes; one with a key where an id
    // belongs does not echo it.
    let bad_dir = tempfile::tempdir().unwrap();
    let bad = bad_dir.path().join("bad.json");
    let b64 = base64::engine::general_purpose::STANDARD.encode(key_material("k1"));
    for (text, says) in [
        (
            ring_text("k1", &["k1"]).replace("ERER", "ER!R"),
            "\"k1\" is not 32 bytes",
        ),
        (
            json!({"write": b64, "keys": {"k1": b64}}).to_string(),
            "write key's id",
        ),
        (
            json!({"write": "k1", "keys": {b64.clone(): b64}}).to_string(),
            "key id number 1",
        ),
    ] {
        std::fs::write(&bad, text).unwrap();
        let error = Tier::from_json(&config(&memory_store(), json!({"keyring_file": bad})))
            .err()
            .expect("the tier must not start");
        assert!(error.message.contains(says), "{}", error.message);
        assert_no_key_material(&error.message);
    }
}

#[test]
fn a_rotated_keyring_file_takes_effect_without_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let store = json!({"type": "local", "path": dir.path()});
    let ring = Ring::new("k1", &["k1"]);
    let encryption = json!({"keyring_file": ring.path, "refresh_s": 1});
    let tier = Tier::from_json(&config(&store, encryption)).unwrap();
    let _pool = pool(&tier, 8);
    assert!(run(&tier, JobKind::Store, 1, &[0], &[60]).succeeded());
    assert_eq!(key_id_of(&oob_get(&store, &name(&tier, 60)).unwrap()), "k1");
    ring.rewrite("k2", &["k1", "k2"]);
    // Stores go on until one is sealed with k2 (the refresh is due within a second).
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    let mut id = 61;
    loop {
        assert!(run(&tier, JobKind::Store, id, &[0], &[id]).succeeded());
        if key_id_of(&oob_get(&store, &name(&tier, id)).unwrap()) == "k2" {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the keyring was never read again"
        );
        id += 1;
    }
    // The block sealed with k1 still loads.
    assert!(run(&tier, JobKind::Load, 1000, &[1], &[60]).succeeded());
}

/// (level, message) of every record the log callback received.
static RECORDS: Mutex<Vec<String>> = Mutex::new(Vec::new());

unsafe extern "C" fn collect(
    _userdata: *mut c_void,
    _level: kvtier::logs::LogLevel,
    _target: *const c_char,
    message: *const c_char,
) {
    // SAFETY: the library passes a NUL-terminated string valid for the call.
    let message = unsafe { CStr::from_ptr(message) };
    RECORDS
        .lock()
        .unwrap()
        .push(message.to_string_lossy().into_owned());
}

#[test]
fn no_key_material_in_messages_log_records_or_metrics() {
    // SAFETY: a function with the callback's signature; the userdata is never used.
    let status = unsafe {
        kvtier::kvt_set_log_callback(
            Some(collect),
            std::ptr::null_mut(),
            kvtier::logs::LogLevel::Trace as i32,
        )
    };
    assert_eq!(status, Status::Ok);
    let dir = tempfile::tempdir().unwrap();
    let store = json!({"type": "local", "path": dir.path()});
    let ring = Ring::new("k3", &["k2", "k3"]);
    let tier = encrypted(&store, &ring.path);
    let _pool = pool(&tier, 9);
    assert!(run(&tier, JobKind::Store, 1, &[0, 1], &[70, 71]).succeeded());
    let mut object = oob_get(&store, &name(&tier, 71)).unwrap();
    object[100] ^= 0xff;
    oob_put(&store, &name(&tier, 71), object);
    let reader = encrypted(&store, &ring.path);
    let _into = pool(&reader, 10);
    let loaded = run(&reader, JobKind::Load, 2, &[2, 3], &[70, 71]);
    assert_eq!(
        loaded.key_status,
        [Status::Ok, Status::Undecryptable],
        "{}",
        loaded.message
    );
    let config_debug = format!("{:?}", reader.config());
    for text in [
        &loaded.message,
        &reader.metrics(),
        &tier.metrics(),
        &config_debug,
    ] {
        assert_no_key_material(text);
    }
    assert!(reader
        .metrics()
        .contains("kvtier_undecryptable_blocks_total 1"));
    drop((tier, reader));
    // SAFETY: NULL restores the default; `collect` is not called afterwards.
    unsafe { kvtier::kvt_set_log_callback(None, std::ptr::null_mut(), 0) };
    let records = RECORDS.lock().unwrap().clone();
    assert!(
        records.iter().any(|m| m.contains("does not open")),
        "no record of the failed load among {records:#?}"
    );
    for message in &records {
        assert_no_key_material(message);
    }
}
