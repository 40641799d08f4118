//! Rotating the encryption key of a fleet, as docs/integrity-and-encryption.md says to:
//! two engine processes on one namespace, each re-reading its own keyring file.
//!
//! 0. both write with k1 (ring {k1});
//! 1. the new key goes out as a read key: both on {k1 write, k2};
//! 2. the writers switch one by one: A on {k2 write, k1} stores, B still on step 1 loads
//!    A's new blocks; then B switches;
//! 3. k1 retires once no object needs it: `kvtier verify` with a ring without k1 lists
//!    those that still do, `kvtier gc --older-than` (older than the last switch) removes
//!    them, verify then passes, and both engines go to {k2}.
//!
//! Every load, in either process at every step, succeeds byte-exact.

#[macro_use]
#[path = "../../tests/support/mod.rs"]
mod support;

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant, SystemTime};

use base64::Engine as _;
use kvtier_core::key::KeyLayout;
use kvtier_core::{JobKind, Tier};
use serde_json::{json, Value};
use support::cli::json_run;
use support::*;

/// Set in a child process: the tier configuration of the engine it plays.
const ENGINE_CONFIG: &str = "KVTIER_ROTATION_ENGINE_CONFIG";
/// What starts an engine's answers in its output (the test harness prints too).
const ENGINE_SAYS: &str = "kvtier-rotation-engine: ";
/// Two segments of the format, the second short.
const BLOCK: usize = 80_000;
/// Keys a job stores or loads.
const PER_JOB: usize = 4;
const NAMESPACE: &str = "m_0123456789ab_r0";
/// How long an engine may take to take up a rewritten keyring (read every second).
const RING_BOUND: Duration = Duration::from_secs(60);

/// A block's content: a function of its key id, so any process checks any block.
fn content_of(id: u64) -> Vec<u8> {
    random_bytes(BLOCK, id.wrapping_mul(0x9e37_79b9) ^ 0x5eed)
}

fn ring_text(write: &str, ids: &[&str]) -> String {
    let keys: serde_json::Map<String, Value> = ids
        .iter()
        .map(|id| {
            let material = [id.as_bytes()[1]; 32];
            let encoded = base64::engine::general_purpose::STANDARD.encode(material);
            (id.to_string(), json!(encoded))
        })
        .collect();
    json!({"write": write, "keys": keys}).to_string()
}

/// Replaces a keyring file atomically (a reader never sees half a file).
fn write_ring(path: &Path, write: &str, ids: &[&str]) {
    let next = path.with_extension("next");
    std::fs::write(&next, ring_text(write, ids)).unwrap();
    std::fs::rename(&next, path).unwrap();
}

fn config(store: &Value, ring: &Path) -> String {
    json!({
        "store": store, "prefix": "kv", "namespace": NAMESPACE,
        "encryption": {"keyring_file": ring, "refresh_s": 1},
    })
    .to_string()
}

/// The library's log records in the engine process: how it knows its tier read a new
/// keyring.
static RECORDS: Mutex<Vec<String>> = Mutex::new(Vec::new());
static RECORDED: Condvar = Condvar::new();

struct Capture;

impl log::Log for Capture {
    fn enabled(&self, metadata: &log::Metadata<'_>) -> bool {
        metadata.level() <= log::Level::Info
    }
    fn log(&self, record: &log::Record<'_>) {
        if self.enabled(record.metadata()) {
            RECORDS.lock().unwrap().push(record.args().to_string());
            RECORDED.notify_all();
        }
    }
    fn flush(&self) {}
}

/// Waits, from record `from` on, for the tier's report of a keyring with `ids` writing
/// with `write`; the index after it, or an error.
fn wait_for_ring(from: usize, write: &str, ids: &[&str]) -> Result<usize, String> {
    let keys = format!("now has keys {ids:?}, writing with {write:?}");
    let deadline = Instant::now() + RING_BOUND;
    let mut records = RECORDS.lock().unwrap();
    loop {
        if let Some(at) = records[from..].iter().position(|r| r.contains(&keys)) {
            return Ok(from + at + 1);
        }
        let Some(left) = deadline.checked_duration_since(Instant::now()) else {
            return Err(format!(
                "no record {keys:?} within {RING_BOUND:?}: {records:?}"
            ));
        };
        records = RECORDED.wait_timeout(records, left).unwrap().0;
    }
}

/// The engine a child process plays, not a test: [`Engine::spawn`] runs this test binary
/// with `--ignored --exact rotation_engine` and its configuration in its environment. It
/// answers one line per command on its standard input: `store ID…` and `load ID…` (loads
/// checked byte-exact), and `ring WRITE ID,…` once its tier has read that keyring.
#[test]
#[ignore = "a child process's entry point, run by the rotation test itself"]
fn rotation_engine() {
    let Ok(config) = std::env::var(ENGINE_CONFIG) else {
        panic!("rotation_engine is the engine process of the key rotation test, not a test: it runs it with {ENGINE_CONFIG} set");
    };
    log::set_logger(&Capture).unwrap();
    log::set_max_level(log::LevelFilter::Info);
    let tier = Tier::from_json(&config).unwrap();
    let mut pool = Pool::new(PER_JOB as u64, BLOCK);
    pool.register(&tier);
    let mut consumed = 0;
    for (job, line) in std::io::stdin().lines().enumerate() {
        let line = line.unwrap();
        let words: Vec<&str> = line.split_whitespace().collect();
        let answer = match words[..] {
            ["ring", write, ids] => {
                let ids: Vec<&str> = ids.split(',').collect();
                match wait_for_ring(consumed, write, &ids) {
                    Ok(next) => {
                        consumed = next;
                        json!({"ok": true})
                    }
                    Err(why) => json!({"ok": false, "message": why}),
                }
            }
            [kind @ ("store" | "load"), ref ids @ ..] => {
                let ids: Vec<u64> = ids.iter().map(|i| i.parse().unwrap()).collect();
                let slots: Vec<u64> = (0..ids.len() as u64).collect();
                let kind = if kind == "store" {
                    JobKind::Store
                } else {
                    JobKind::Load
                };
                for (slot, &id) in ids.iter().enumerate() {
                    let bytes = match kind {
                        JobKind::Store => content_of(id),
                        JobKind::Load => vec![0; BLOCK],
                    };
                    pool.block_mut(slot as u64).copy_from_slice(&bytes);
                }
                let result = run_job(&tier, kind, job as u64 + 1, &slots, &ids);
                let exact = kind == JobKind::Store
                    || ids
                        .iter()
                        .enumerate()
                        .all(|(slot, &id)| pool.block(slot as u64) == content_of(id));
                json!({"ok": result.succeeded() && exact, "message": result.message, "exact": exact})
            }
            _ => json!({"ok": false, "message": format!("unknown command {line:?}")}),
        };
        println!("{ENGINE_SAYS}{answer}");
    }
    tier.shutdown();
    drop(pool);
}

/// An engine process with its own keyring file.
struct Engine {
    name: &'static str,
    ring: PathBuf,
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
}

impl Engine {
    fn spawn(name: &'static str, store: &Value, ring_dir: &Path) -> Engine {
        let ring = ring_dir.join(format!("{name}.json"));
        write_ring(&ring, "k1", &["k1"]);
        let mut child = Command::new(std::env::current_exe().unwrap())
            .args(["--ignored", "--exact", "rotation_engine", "--nocapture"])
            .args(["--test-threads", "1"])
            .env(ENGINE_CONFIG, config(store, &ring))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let stdin = child.stdin.take().unwrap();
        let stdout = BufReader::new(child.stdout.take().unwrap());
        Engine {
            name,
            ring,
            child,
            stdin,
            stdout,
        }
    }

    /// Sends `command` and returns the engine's answer, which must be a success.
    fn ask(&mut self, command: &str) -> Value {
        writeln!(self.stdin, "{command}").unwrap();
        let mut line = String::new();
        loop {
            line.clear();
            let n = self.stdout.read_line(&mut line).unwrap();
            assert!(n > 0, "{} ended early: {:?}", self.name, self.child.wait());
            if let Some((_, said)) = line.trim().split_once(ENGINE_SAYS) {
                let answer: Value = serde_json::from_str(said).unwrap();
                assert_eq!(answer["ok"], true, "{} {command}: {answer}", self.name);
                return answer;
            }
        }
    }

    fn store(&mut self, first: u64) {
        self.ask(&format!("store {}", ids(first)));
    }

    fn load(&mut self, first: u64) {
        self.ask(&format!("load {}", ids(first)));
    }

    /// Rewrites the engine's keyring and waits until its tier has read it.
    fn take_ring(&mut self, write: &str, ring_ids: &[&str]) {
        write_ring(&self.ring, write, ring_ids);
        self.ask(&format!("ring {write} {}", ring_ids.join(",")));
    }

    fn finish(mut self) {
        drop(self.stdin);
        assert!(self.child.wait().unwrap().success(), "{}", self.name);
    }
}

/// The key ids `first..first + PER_JOB`, as a command's words.
fn ids(first: u64) -> String {
    (first..first + PER_JOB as u64)
        .map(|i| i.to_string())
        .collect::<Vec<_>>()
        .join(" ")
}

/// The object names of the keys `first..first + PER_JOB`.
fn names(first: u64) -> Vec<String> {
    let layout = KeyLayout::new("kv", NAMESPACE).unwrap();
    (first..first + PER_JOB as u64)
        .map(|i| layout.object_name(&key(i)).unwrap())
        .collect()
}

/// The key id in an encrypted object's header (after the 8-byte magic, zero-padded).
fn sealed_with(dir: &Path, name: &str) -> String {
    let object = std::fs::read(dir.join(name)).unwrap();
    assert_eq!(&object[..8], b"KVTENC01", "{name} is encrypted");
    String::from_utf8(
        object[8..32]
            .iter()
            .copied()
            .take_while(|&b| b != 0)
            .collect(),
    )
    .unwrap()
}

#[test]
fn a_fleet_rotates_its_key_without_a_failed_load() {
    let dir = tempfile::tempdir().unwrap();
    let ring_dir = tempfile::tempdir().unwrap();
    let store = json!({"type": "local", "path": dir.path()});
    let mut a = Engine::spawn("A", &store, ring_dir.path());
    let mut b = Engine::spawn("B", &store, ring_dir.path());
    let keys_of = |first: u64| -> Vec<String> {
        names(first)
            .iter()
            .map(|n| sealed_with(dir.path(), n))
            .collect()
    };

    // 0. Both on {k1}.
    a.store(0);
    b.store(100);
    b.load(0);
    a.load(100);

    // 1. k2 goes out as a read key everywhere first; writers stay on k1.
    a.take_ring("k1", &["k1", "k2"]);
    b.take_ring("k1", &["k1", "k2"]);
    a.store(10);
    assert_eq!(keys_of(10), ["k1"; PER_JOB]);
    b.load(10);

    // 2. A switches to writing with k2; B, still on step 1, loads A's new blocks.
    a.take_ring("k2", &["k1", "k2"]);
    a.store(20);
    assert_eq!(keys_of(20), ["k2"; PER_JOB]);
    b.load(20);
    b.store(30);
    assert_eq!(keys_of(30), ["k1"; PER_JOB], "B still writes with k1");
    a.load(30);
    a.load(0);
    b.take_ring("k2", &["k1", "k2"]);

    // 3. Which objects still need k1: verify with a ring without it names them.
    let k2_only = ring_dir.path().join("k2-only.json");
    write_ring(&k2_only, "k2", &["k2"]);
    let operator = config(&store, &k2_only);
    let report = json_run("verify", &operator, &[], 1);
    let needing_k1: Vec<String> = [0, 10, 30, 100].into_iter().flat_map(names).collect();
    let undecryptable = report["undecryptable"].as_array().unwrap();
    let mut listed: Vec<String> = undecryptable
        .iter()
        .map(|o| o["name"].as_str().unwrap().to_string())
        .collect();
    listed.sort();
    let mut want = needing_k1.clone();
    want.sort();
    assert_eq!(listed, want, "{report}");
    assert!(
        undecryptable.iter().all(|o| o["detail"]
            .as_str()
            .unwrap()
            .contains("\"k1\" is not in the keyring")),
        "{report}"
    );
    // Everything written before the last writer switched is older than the switch: two
    // hours, as the files' times say (no test waits for time to pass).
    let two_hours_ago = SystemTime::now() - Duration::from_secs(2 * 3600);
    for name in [0, 10, 20, 30, 100].into_iter().flat_map(names) {
        let file = std::fs::File::options()
            .write(true)
            .open(dir.path().join(&name))
            .unwrap();
        file.set_modified(two_hours_ago).unwrap();
    }
    b.store(40);
    assert_eq!(keys_of(40), ["k2"; PER_JOB]);
    a.store(50);
    let gc = json_run("gc", &operator, &["--older-than", "1h"], 0);
    assert_eq!(gc["deleted_objects"], 5 * PER_JOB, "{gc}");
    let report = json_run("verify", &operator, &[], 0);
    assert_eq!(report["undecryptable"], json!([]), "{report}");
    assert_eq!(report["good"], 2 * PER_JOB, "{report}");

    // k1 retires: both on {k2}, and what remains loads in both.
    a.take_ring("k2", &["k2"]);
    b.take_ring("k2", &["k2"]);
    for engine in [&mut a, &mut b] {
        engine.load(40);
        engine.load(50);
    }
    a.finish();
    b.finish();
}
