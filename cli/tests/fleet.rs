//! One bucket, many engines: a tier's memory of what it stored yields to the store.
//!
//! The check, on the local store, s3s-fs and Ceph RGW, in every dedup mode the store
//! allows: tier A stores blocks; `kvtier gc` (its own process) deletes them; A's lookups
//! answer MISS (or, for an engine that does not ask first, the memory window passes); A is
//! asked to store the blocks again; a fresh tier then loads every one, byte-exact.

#[macro_use]
#[path = "../../tests/support/mod.rs"]
mod support;

use std::process::Command;
use std::time::{Duration, Instant};

use kvtier_core::{JobKind, LookupResult, Status, Tier};
use serde_json::{json, Value};
use support::cli::{json_run, kvtier_with, stderr};
use support::*;

const BLOCKS: u64 = 32;
const BLOCK: usize = 4096;
/// The memory window of the variant without lookups: short, so the test waits little.
const SHORT_TTL_MS: u64 = 1_500;

/// Stores or loads blocks `0..BLOCKS` as keys `first..first + BLOCKS` in one job and
/// returns its result.
fn run(tier: &Tier, kind: JobKind, job: u64, first: u64) -> kvtier_core::JobResult {
    let blocks: Vec<u64> = (0..BLOCKS).collect();
    let ids: Vec<u64> = (first..first + BLOCKS).collect();
    run_job(tier, kind, job, &blocks, &ids)
}

/// `kvtier gc --older-than 0s` on the tier's prefix, as an operator runs it: its own
/// process. Returns how many objects it deleted.
fn gc_everything(config: &str) -> u64 {
    let report = json_run("gc", config, &["--older-than", "0s"], 0);
    report["deleted_objects"]
        .as_u64()
        .unwrap_or_else(|| panic!("no deleted count in {report}"))
}

/// The five steps, on `store` with `dedup` (`None`: the default the probe picks).
fn store_again_after_an_outside_delete(store: Value, dedup: &str, ask_first: bool) {
    let ttl_ms = if ask_first { 60_000 } else { SHORT_TTL_MS };
    let config = tier_json(
        store.clone(),
        json!({"dedup": dedup, "known_keys_ttl_ms": ttl_ms, "enable_kv_events": true}),
    );
    let what = format!("dedup {dedup}, ask first {ask_first}");
    let a = match Tier::from_json(&config) {
        Ok(tier) => tier,
        Err(e) if dedup == "conditional" && e.status == Status::Config => {
            // A store without conditional PUT refuses the mode at start, by name.
            assert!(
                e.message.contains("conditional PUT"),
                "{what}: {}",
                e.message
            );
            return;
        }
        Err(e) => panic!("{what}: {}", e.message),
    };
    let pool = Pool::random_registered(&a, BLOCKS, BLOCK, 0x5eed);
    let expected = pool.mem.clone();

    // 1. A stores the blocks.
    let first = run(&a, JobKind::Store, 1, 0);
    assert!(first.succeeded(), "{what}: {}", first.message);
    let stored_at = Instant::now();
    let _ = a.take_events(usize::MAX);

    // 2. The operator deletes them, from another process.
    let gc_config = tier_json(store.clone(), json!({}));
    assert_eq!(gc_everything(&gc_config), BLOCKS, "{what}");

    // 3. A asks before it stores again (the store answers MISS, and A forgets); or it does
    //    not ask, and its memory window passes.
    if ask_first {
        for i in 0..BLOCKS {
            let request = 100 + i;
            assert_eq!(
                resolve_lookup(&a, request, &key(i)),
                LookupResult::Miss,
                "{what}: key {i} after gc"
            );
            a.request_finished(request);
        }
    } else {
        let window = Duration::from_millis(SHORT_TTL_MS);
        if let Some(rest) = window.checked_sub(stored_at.elapsed()) {
            // The property under test is time itself: memory older than the window is
            // not trusted.
            std::thread::sleep(rest + Duration::from_millis(50));
        }
    }

    // 4. A stores them again: every block is uploaded, none skipped from memory.
    let skipped_before = a.stats().dedup_known;
    let again = run(&a, JobKind::Store, 2, 0);
    assert!(again.succeeded(), "{what}: {}", again.message);
    assert_eq!(
        a.stats().dedup_known,
        skipped_before,
        "{what}: a store skipped a block the store no longer holds"
    );
    let events = a.take_events(usize::MAX);
    assert_eq!(events.len(), 1, "{what}: {events:?}");
    assert_eq!(events[0].keys.len(), BLOCKS as usize, "{what}");

    // 5. A fresh tier finds and loads every block, byte-exact.
    let fresh = Tier::from_json(&tier_json(store, json!({}))).unwrap();
    for i in 0..BLOCKS {
        assert_eq!(
            resolve_lookup(&fresh, 1_000 + i, &key(i)),
            LookupResult::Hit,
            "{what}: key {i} is missing from the store after A stored it again"
        );
    }
    let mut into = Pool::new(BLOCKS, BLOCK);
    into.register(&fresh);
    let loaded = run(&fresh, JobKind::Load, 3, 0);
    assert!(loaded.succeeded(), "{what}: {}", loaded.message);
    assert!(into.mem == expected, "{what}: loaded bytes differ");
    drop(into);
    drop(pool);
}

fn every_mode(store: impl Fn() -> Value) {
    for dedup in ["conditional", "skip_known", "off"] {
        for ask_first in [true, false] {
            store_again_after_an_outside_delete(store(), dedup, ask_first);
        }
    }
}

#[test]
fn local_store_heals_after_an_outside_delete() {
    let dirs: Vec<tempfile::TempDir> = (0..6).map(|_| tempfile::tempdir().unwrap()).collect();
    let next = std::sync::atomic::AtomicUsize::new(0);
    every_mode(|| {
        let dir = &dirs[next.fetch_add(1, std::sync::atomic::Ordering::Relaxed)];
        json!({"type": "local", "path": dir.path()})
    });
}

#[test]
fn s3s_fs_heals_after_an_outside_delete() {
    let server = Server::s3s_fs();
    every_mode(|| server.store_json(&server.new_bucket()));
}

#[test]
fn rgw_heals_after_an_outside_delete() {
    let server = Server::shared_rgw();
    every_mode(|| server.store_json(&server.new_bucket()));
}

// ------------------------------------------------------------------------------------
// Two engines with eviction on one namespace, and `kvtier gc` beside them: each its own
// process. Each tier lists the whole namespace, so their budgets do not add up or fight:
// the namespace ends at the budget, not at half of it, and what remains loads byte-exact.

/// Set in a child process: the tier configuration of the engine it plays.
const ENGINE_CONFIG: &str = "KVTIER_FLEET_ENGINE_CONFIG";
const ENGINE_SEED: &str = "KVTIER_FLEET_ENGINE_SEED";
const ENGINE_BLOCKS: &str = "KVTIER_FLEET_ENGINE_BLOCKS";
const EVICT_BLOCK: usize = 64 * 1024;
/// What starts an engine's own words in its output (the test harness prints on the same
/// lines).
const ENGINE_SAYS: &str = "kvtier-fleet-engine: ";
const BUDGET_BLOCKS: u64 = 40;

/// A block's content: a function of its key, so any process checks any block.
fn content_of(key: &[u8]) -> Vec<u8> {
    let seed = key.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
    });
    random_bytes(EVICT_BLOCK, seed)
}

/// The engine a child process plays, not a test: [`Engine::spawn`] runs this test binary
/// with `--ignored --exact engine_process` and the engine's configuration in its
/// environment. It stores `ENGINE_BLOCKS` keys of its seed, four per job, prints `stored`,
/// keeps its tier (and its eviction task) running until its standard input closes, then
/// prints its counters. Run without that environment (`cargo test -- --ignored`), it fails
/// and says what it is.
#[test]
#[ignore = "a child process's entry point, run by the fleet tests themselves"]
fn engine_process() {
    let (Ok(config), Ok(seed), Ok(blocks)) = (
        std::env::var(ENGINE_CONFIG),
        std::env::var(ENGINE_SEED),
        std::env::var(ENGINE_BLOCKS),
    ) else {
        panic!(
            "engine_process is the engine process of the eviction tests (*_evicting_engines_share_one_budget), \
             not a test: they run it with {ENGINE_CONFIG}, {ENGINE_SEED} and {ENGINE_BLOCKS} set"
        );
    };
    let (seed, blocks): (u64, u64) = (seed.parse().unwrap(), blocks.parse().unwrap());
    let tier = Tier::from_json(&config).unwrap();
    let mut pool = Pool::new(4, EVICT_BLOCK);
    pool.register(&tier);
    for job in 0..blocks / 4 {
        let ids: Vec<u64> = (0..4).map(|i| seed * 1_000_000 + job * 4 + i).collect();
        for (slot, &id) in ids.iter().enumerate() {
            pool.block_mut(slot as u64)
                .copy_from_slice(&content_of(&key(id)));
        }
        let result = run_job(&tier, JobKind::Store, job + 1, &[0, 1, 2, 3], &ids);
        assert!(result.succeeded(), "{}", result.message);
    }
    println!("{ENGINE_SAYS}stored");
    let _ = std::io::Read::read_to_end(&mut std::io::stdin(), &mut Vec::new());
    let stats = tier.stats();
    println!(
        "{ENGINE_SAYS}{}",
        json!({"evicted_blocks": stats.evicted_blocks, "keys_stored": stats.keys_stored})
    );
    tier.shutdown();
    drop(pool);
}

struct Engine {
    child: std::process::Child,
    stdout: std::io::BufReader<std::process::ChildStdout>,
}

impl Engine {
    fn spawn(config: &str, seed: u64, blocks: u64) -> Engine {
        let mut child = Command::new(std::env::current_exe().unwrap())
            .args([
                "--ignored",
                "--exact",
                "engine_process",
                "--nocapture",
                "--test-threads",
                "1",
            ])
            .env(ENGINE_CONFIG, config)
            .env(ENGINE_SEED, seed.to_string())
            .env(ENGINE_BLOCKS, blocks.to_string())
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let stdout = std::io::BufReader::new(child.stdout.take().unwrap());
        Engine { child, stdout }
    }

    /// The next words of the engine's own that `want` accepts.
    fn line(&mut self, want: impl Fn(&str) -> bool) -> String {
        let mut line = String::new();
        loop {
            line.clear();
            let n = std::io::BufRead::read_line(&mut self.stdout, &mut line).unwrap();
            assert!(
                n > 0,
                "the engine process ended early: {:?}",
                self.child.wait()
            );
            if let Some((_, said)) = line.trim().split_once(ENGINE_SAYS) {
                if want(said) {
                    return said.to_string();
                }
            }
        }
    }

    /// Closes its input, and returns its counters once it exited.
    fn finish(mut self) -> Value {
        drop(self.child.stdin.take());
        let report = self.line(|l| l.starts_with('{'));
        assert!(self.child.wait().unwrap().success());
        serde_json::from_str(&report).unwrap()
    }
}

/// The namespace's blocks (names and bytes), listed by a client of its own.
fn namespace_blocks(store: &Value, layout: &kvtier_core::key::KeyLayout) -> Vec<(String, u64)> {
    use futures::TryStreamExt;
    use object_store::ObjectStore;
    block_on(async {
        let s = oob_store(store);
        let prefix = object_store::path::Path::from(layout.base());
        let listed: Vec<object_store::ObjectMeta> =
            s.client().list(Some(&prefix)).try_collect().await.unwrap();
        listed
            .into_iter()
            .map(|m| (m.location.to_string(), m.size))
            .filter(|(name, _)| layout.key_of(name).is_some())
            .collect()
    })
}

fn evicting_engines_keep_the_namespace_at_its_budget(store: Value) {
    let budget = BUDGET_BLOCKS * EVICT_BLOCK as u64;
    let config = tier_json(
        store.clone(),
        json!({"eviction": {"max_bytes": budget, "interval_ms": 100}}),
    );
    let layout = Tier::from_json(&config).unwrap().layout().clone();
    // Two engines, each storing 2.5 budgets' worth.
    let mut engines = vec![
        Engine::spawn(&config, 1, 100),
        Engine::spawn(&config, 2, 100),
    ];
    for engine in &mut engines {
        engine.line(|l| l == "stored");
    }
    // The engines' eviction rounds bring the namespace to its budget: not below it.
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut blocks = namespace_blocks(&store, &layout);
    while blocks.iter().map(|b| b.1).sum::<u64>() > budget {
        assert!(
            Instant::now() < deadline,
            "over budget: {} blocks",
            blocks.len()
        );
        std::thread::sleep(Duration::from_millis(50));
        blocks = namespace_blocks(&store, &layout);
    }
    let at_budget = |blocks: &[(String, u64)], who: &str| {
        let bytes: u64 = blocks.iter().map(|b| b.1).sum();
        assert_eq!(
            bytes,
            budget,
            "{who}: the namespace holds {} blocks; the budget is {BUDGET_BLOCKS}",
            blocks.len()
        );
    };
    at_budget(&blocks, "after the engines' eviction");
    // An operator's gc with the same budget beside them, twice: nothing more goes.
    let gc_config = tier_json(store.clone(), json!({}));
    for _ in 0..2 {
        let out = kvtier_with("gc", &gc_config, &["--max-bytes", &budget.to_string()]);
        assert!(out.status.success(), "{}", stderr(&out));
    }
    let after_gc = namespace_blocks(&store, &layout);
    at_budget(&after_gc, "after gc");
    let names = |b: &[(String, u64)]| {
        let mut n: Vec<String> = b.iter().map(|x| x.0.clone()).collect();
        n.sort();
        n
    };
    assert_eq!(
        names(&after_gc),
        names(&blocks),
        "gc deleted within the budget"
    );
    let reports: Vec<Value> = engines.into_iter().map(Engine::finish).collect();
    let evicted: u64 = reports
        .iter()
        .map(|r| r["evicted_blocks"].as_u64().unwrap())
        .sum();
    assert!(evicted > 0, "neither engine evicted: {reports:?}");
    // What remains is the newest blocks, whole: a fresh tier loads each byte-exact.
    let fresh = Tier::from_json(&tier_json(store, json!({}))).unwrap();
    let mut pool = Pool::new(BUDGET_BLOCKS, EVICT_BLOCK);
    pool.register(&fresh);
    let remaining: Vec<Vec<u8>> = blocks
        .iter()
        .map(|(n, _)| layout.key_of(n).unwrap())
        .collect();
    let slots: Vec<u64> = (0..remaining.len() as u64).collect();
    fresh
        .submit(
            JobKind::Load,
            1,
            &slots,
            kvtier_core::KeyBatch::from_keys(&remaining).unwrap(),
        )
        .unwrap();
    let loaded = wait_all(&fresh, 1).remove(&1).unwrap();
    assert!(loaded.succeeded(), "{}", loaded.message);
    for (slot, key) in remaining.iter().enumerate() {
        assert!(
            pool.block(slot as u64) == content_of(key).as_slice(),
            "slot {slot}"
        );
    }
    eprintln!(
        "eviction beside eviction and gc: {} blocks remain of 200 stored (budget {BUDGET_BLOCKS}); evicted by the engines: {reports:?}",
        blocks.len()
    );
}

#[test]
fn local_store_evicting_engines_share_one_budget() {
    let dir = tempfile::tempdir().unwrap();
    evicting_engines_keep_the_namespace_at_its_budget(json!({"type": "local", "path": dir.path()}));
}

#[test]
fn s3s_fs_evicting_engines_share_one_budget() {
    let server = Server::s3s_fs();
    evicting_engines_keep_the_namespace_at_its_budget(server.store_json(&server.new_bucket()));
}
