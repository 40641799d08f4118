//! The engine through its Rust API, on the in-memory and local-directory stores.

mod support;

use std::collections::HashMap;
use std::time::Duration;

use kvtier_core::key::make_key;
use kvtier_core::{JobKind, JobResult, KeyBatch, Status, Tier};
use serde_json::json;
use support::Pool;

const BLOCK: usize = 16 * 1024;

fn key(i: u64) -> Vec<u8> {
    let mut hash = [0u8; 32];
    hash[..8].copy_from_slice(&i.to_be_bytes());
    hash[8..16].copy_from_slice(&(i.wrapping_mul(0x9e37_79b9_7f4a_7c15)).to_le_bytes());
    make_key(&hash, (i % 3) as u32)
}

fn keys(ids: &[u64]) -> KeyBatch {
    KeyBatch::from_keys(&ids.iter().map(|&i| key(i)).collect::<Vec<_>>()).unwrap()
}

fn wait_all(tier: &Tier, expected: usize) -> HashMap<u64, JobResult> {
    tier.drain(Duration::from_secs(60)).unwrap();
    let mut seen = HashMap::new();
    for r in tier.poll(usize::MAX) {
        assert!(seen.insert(r.job_id, r).is_none(), "job reported twice");
    }
    assert_eq!(seen.len(), expected);
    seen
}

fn memory_tier() -> Tier {
    Tier::from_json(r#"{"store":{"type":"memory"}}"#).unwrap()
}

fn local_tier(dir: &std::path::Path) -> Tier {
    local_tier_with(dir, json!({}))
}

/// A tier on a local directory, with the keys of `extra` added to its configuration.
fn local_tier_with(dir: &std::path::Path, extra: serde_json::Value) -> Tier {
    Tier::from_json(&support::tier_json(
        json!({"type": "local", "path": dir}),
        extra,
    ))
    .unwrap()
}

fn round_trip(tier: &Tier) {
    let mut pool = Pool::new(64, BLOCK);
    pool.fill_random(7);
    pool.register(tier);
    let stored: Vec<u64> = (0..32).collect();
    tier.submit(JobKind::Store, 1, &stored, keys(&stored))
        .unwrap();
    let r = wait_all(tier, 1).remove(&1).unwrap();
    assert_eq!(r.status, Status::Ok, "{}", r.message);
    assert_eq!(r.bytes, 32 * BLOCK as u64);
    // Load key i into slot 32 + (i * 7) % 32: a non-identity mapping.
    let slots: Vec<u64> = stored.iter().map(|i| 32 + (i * 7) % 32).collect();
    tier.submit(JobKind::Load, 2, &slots, keys(&stored))
        .unwrap();
    let r = wait_all(tier, 1).remove(&2).unwrap();
    assert_eq!(r.status, Status::Ok, "{}", r.message);
    assert!(r.key_status.iter().all(|s| s.is_ok()));
    for (i, slot) in stored.iter().zip(&slots) {
        assert!(
            pool.block(*i) == pool.block(*slot),
            "block {i} differs after loading into slot {slot}"
        );
    }
}

#[test]
fn round_trip_memory_store() {
    round_trip(&memory_tier());
}

#[test]
fn round_trip_local_store_uses_vllm_layout() {
    let dir = tempfile::tempdir().unwrap();
    let tier = local_tier(dir.path());
    round_trip(&tier);
    let name = tier.layout().object_name(&key(5)).unwrap();
    let file = dir.path().join(&name);
    assert!(name.starts_with("kv/m_0123456789ab_r0/"), "{name}");
    assert_eq!(std::fs::metadata(&file).unwrap().len(), BLOCK as u64);
}

#[test]
fn missing_key_fails_alone() {
    let tier = memory_tier();
    let mut pool = Pool::new(8, BLOCK);
    pool.fill_random(3);
    pool.register(&tier);
    tier.submit(JobKind::Store, 1, &[0, 1, 2], keys(&[10, 11, 12]))
        .unwrap();
    wait_all(&tier, 1);
    tier.submit(JobKind::Load, 2, &[4, 5, 6, 7], keys(&[10, 99, 11, 12]))
        .unwrap();
    let r = wait_all(&tier, 1).remove(&2).unwrap();
    assert_eq!(r.status, Status::NotFound);
    assert_eq!(
        r.key_status,
        vec![Status::Ok, Status::NotFound, Status::Ok, Status::Ok]
    );
    assert_eq!(r.bytes, 3 * BLOCK as u64);
    assert_eq!(r.successful_keys().count(), 3);
    assert!(
        pool.block(4) == pool.block(0)
            && pool.block(6) == pool.block(1)
            && pool.block(7) == pool.block(2)
    );
}

#[test]
fn object_of_another_length_fails_that_key() {
    let dir = tempfile::tempdir().unwrap();
    let tier = local_tier(dir.path());
    let mut pool = Pool::new(4, BLOCK);
    pool.fill_random(5);
    pool.register(&tier);
    tier.submit(JobKind::Store, 1, &[0, 1, 2], keys(&[1, 2, 3]))
        .unwrap();
    wait_all(&tier, 1);
    // Truncate one object, lengthen another, out of band.
    let short = dir.path().join(tier.layout().object_name(&key(1)).unwrap());
    std::fs::write(&short, vec![1u8; BLOCK - 1]).unwrap();
    let long = dir.path().join(tier.layout().object_name(&key(2)).unwrap());
    std::fs::write(&long, vec![1u8; BLOCK + 1]).unwrap();
    let empty_key = dir.path().join(tier.layout().object_name(&key(3)).unwrap());
    std::fs::write(&empty_key, b"").unwrap();
    tier.submit(JobKind::Load, 2, &[3, 1, 2], keys(&[1, 2, 3]))
        .unwrap();
    let r = wait_all(&tier, 1).remove(&2).unwrap();
    assert_eq!(
        r.key_status,
        vec![Status::LengthMismatch; 3],
        "{}",
        r.message
    );
    assert_eq!(r.bytes, 0);
}

#[test]
fn every_job_reported_exactly_once_across_many_polls() {
    let tier = memory_tier();
    let mut pool = Pool::new(128, BLOCK);
    pool.fill_random(11);
    pool.register(&tier);
    let n = 1000u64;
    for job in 0..n {
        let block = job % 128;
        tier.submit(JobKind::Store, job, &[block], keys(&[job]))
            .unwrap();
    }
    let mut seen = std::collections::HashSet::new();
    while seen.len() < n as usize {
        for r in tier.poll(7) {
            assert!(r.job_id < n, "unknown job id {}", r.job_id);
            assert!(seen.insert(r.job_id), "job {} reported twice", r.job_id);
            assert_eq!(r.status, Status::Ok);
        }
        std::thread::yield_now();
    }
    // Once no job runs, every result is queued: nothing further may come out.
    tier.drain(Duration::from_secs(30)).unwrap();
    assert!(tier.poll(100).is_empty());
    assert_eq!(tier.jobs_in_flight(), 0);
}

#[test]
fn submission_failures_surface_at_next_poll() {
    let tier = memory_tier();
    // Before registration.
    let e = tier
        .submit(JobKind::Store, 1, &[0], keys(&[1]))
        .unwrap_err();
    assert_eq!(e.status, Status::State);
    let mut pool = Pool::new(4, BLOCK);
    pool.register(&tier);
    let e = tier
        .submit(JobKind::Store, 2, &[4], keys(&[1]))
        .unwrap_err();
    assert_eq!(e.status, Status::InvalidArgument);
    assert!(e.message.contains("out of range"), "{}", e.message);
    let e = tier
        .submit(JobKind::Load, 3, &[], KeyBatch::new(&[], 36).unwrap())
        .unwrap_err();
    assert_eq!(e.status, Status::InvalidArgument);
    let e = tier
        .submit(
            JobKind::Load,
            4,
            &[0],
            KeyBatch::new(&[0u8; 20], 20).unwrap(),
        )
        .unwrap_err();
    assert!(e.message.contains("key_bytes"), "{}", e.message);
    let e = tier
        .submit(JobKind::Load, 5, &[0, 0], keys(&[1, 2]))
        .unwrap_err();
    assert!(e.message.contains("twice"), "{}", e.message);
    let e = tier
        .submit(JobKind::Load, 6, &[0, 1], keys(&[1]))
        .unwrap_err();
    assert_eq!(e.status, Status::InvalidArgument);
    let results = wait_all(&tier, 6);
    for id in 1..=6 {
        assert!(!results[&id].succeeded(), "job {id} should have failed");
        assert!(!results[&id].message.is_empty());
    }
    assert_eq!(results[&2].key_status, vec![Status::InvalidArgument]);
}

#[test]
fn duplicate_in_flight_job_id_is_refused_without_second_result() {
    let tier = memory_tier();
    let mut pool = Pool::new(4, BLOCK);
    pool.register(&tier);
    tier.submit(JobKind::Store, 9, &[0], keys(&[1])).unwrap();
    let e = tier
        .submit(JobKind::Store, 9, &[1], keys(&[2]))
        .unwrap_err();
    assert_eq!(e.status, Status::DuplicateJob);
    let results = wait_all(&tier, 1);
    assert!(results[&9].succeeded());
    // Once polled, the id may be reused.
    tier.submit(JobKind::Store, 9, &[1], keys(&[2])).unwrap();
    assert!(wait_all(&tier, 1)[&9].succeeded());
}

#[test]
fn shutdown_reports_every_job_and_refuses_new_ones() {
    let dir = tempfile::tempdir().unwrap();
    let tier = local_tier_with(dir.path(), json!({"max_inflight_transfers": 2}));
    let mut pool = Pool::new(64, BLOCK);
    pool.fill_random(1);
    pool.register(&tier);
    for job in 0..200u64 {
        tier.submit(JobKind::Store, job, &[job % 64], keys(&[job]))
            .unwrap();
    }
    tier.shutdown();
    let e = tier
        .submit(JobKind::Store, 500, &[0], keys(&[1]))
        .unwrap_err();
    assert_eq!(e.status, Status::ShutDown);
    let results: Vec<JobResult> = tier.poll(usize::MAX);
    assert_eq!(results.len(), 201);
    let mut ids: Vec<u64> = results.iter().map(|r| r.job_id).collect();
    ids.sort_unstable();
    ids.dedup();
    assert_eq!(ids.len(), 201);
    for r in &results {
        assert!(
            matches!(r.status, Status::Ok | Status::Cancelled | Status::ShutDown),
            "job {}: {:?}",
            r.job_id,
            r.status
        );
    }
    tier.shutdown();
    assert!(tier.poll(10).is_empty());
}

/// With no grace, shutdown right after a burst of submits stops the runtime while jobs
/// still wait in the dispatcher's queue for their tasks: each still yields one result.
#[test]
fn jobs_queued_for_their_tasks_at_shutdown_yield_one_result_each() {
    let dir = tempfile::tempdir().unwrap();
    let tier = local_tier_with(dir.path(), json!({"shutdown_timeout_ms": 0}));
    let mut pool = Pool::new(64, BLOCK);
    pool.register(&tier);
    for job in 0..500u64 {
        tier.submit(JobKind::Store, job, &[job % 64], keys(&[job]))
            .unwrap();
    }
    tier.shutdown();
    let results = tier.poll(usize::MAX);
    let mut ids: Vec<u64> = results.iter().map(|r| r.job_id).collect();
    ids.sort_unstable();
    assert_eq!(ids, (0..500).collect::<Vec<_>>());
    assert!(results
        .iter()
        .all(|r| matches!(r.status, Status::Ok | Status::Cancelled)));
    assert!(tier.poll(10).is_empty());
}

#[test]
fn ready_fd_is_readable_exactly_while_results_wait() {
    let tier = memory_tier();
    let mut pool = Pool::new(4, BLOCK);
    pool.register(&tier);
    let fd = tier.ready_fd();
    let readable = |timeout_ms: i32| {
        let mut p = libc_pollfd(fd);
        unsafe { poll(&mut p, 1, timeout_ms) == 1 }
    };
    assert!(!readable(0));
    tier.submit(JobKind::Store, 1, &[0], keys(&[1])).unwrap();
    tier.submit(JobKind::Store, 2, &[1], keys(&[2])).unwrap();
    assert!(readable(10_000));
    tier.drain(Duration::from_secs(10)).unwrap();
    assert_eq!(tier.poll(1).len(), 1);
    assert!(readable(0), "one result still waits");
    assert_eq!(tier.poll(1).len(), 1);
    assert!(!readable(0));
}

#[repr(C)]
struct PollFd {
    fd: i32,
    events: i16,
    revents: i16,
}
fn libc_pollfd(fd: i32) -> PollFd {
    PollFd {
        fd,
        events: 1,
        revents: 0,
    }
}
extern "C" {
    fn poll(fds: *mut PollFd, nfds: u64, timeout: i32) -> i32;
}

#[test]
fn bad_config_and_unreachable_store_are_clear_errors() {
    let e = Tier::from_json(r#"{"store":{"type":"memory"},"bogus":true}"#)
        .err()
        .unwrap();
    assert_eq!(e.status, Status::Config);
    assert!(e.message.contains("bogus"));
    let e = Tier::from_json(
        r#"{"store":{"type":"s3","bucket":"b","endpoint_override":"127.0.0.1:1","scheme":"http","access_key":"a","secret_key":"s3cr3t-value","max_retries":0,"connect_timeout_ms":500}}"#,
    )
    .err()
    .unwrap();
    assert_eq!(e.status, Status::Connect, "{}", e.message);
    assert!(e.message.contains("endpoint"), "{}", e.message);
    assert!(!e.message.contains("s3cr3t-value"));
}

#[test]
fn drain_times_out_cleanly_and_tier_stays_usable() {
    let tier = memory_tier();
    let mut pool = Pool::new(4, BLOCK);
    pool.register(&tier);
    tier.drain(Duration::from_millis(0)).unwrap();
    tier.submit(JobKind::Store, 1, &[0], keys(&[1])).unwrap();
    tier.drain(Duration::from_secs(10)).unwrap();
    tier.submit(JobKind::Load, 2, &[1], keys(&[1])).unwrap();
    let results = wait_all(&tier, 2);
    assert!(results[&2].succeeded());
}

/// Nice values of this process's threads named `name`, from /proc.
fn thread_nice_values(name: &str) -> Vec<i64> {
    let mut values = Vec::new();
    for task in std::fs::read_dir("/proc/self/task").unwrap().flatten() {
        let comm = std::fs::read_to_string(task.path().join("comm")).unwrap_or_default();
        if comm.trim() != name {
            continue;
        }
        let stat = std::fs::read_to_string(task.path().join("stat")).unwrap();
        // Fields after the parenthesised command: state is field 3, nice field 19.
        let after = &stat[stat.rfind(')').unwrap() + 2..];
        values.push(after.split(' ').nth(16).unwrap().parse().unwrap());
    }
    values
}

#[test]
fn transfer_threads_take_the_configured_nice_value() {
    let tier = Tier::from_json(
        r#"{"store":{"type":"memory"},"transfer_thread_nice":7,"runtime_threads":2}"#,
    )
    .unwrap();
    let mut pool = Pool::new(4, BLOCK);
    pool.register(&tier);
    tier.submit(JobKind::Store, 1, &[0], keys(&[1])).unwrap();
    assert!(wait_all(&tier, 1)[&1].succeeded());
    // Tiers of tests running alongside have transfer threads at 0; only this one's are at 7.
    // A worker names itself and sets its nice value when it starts, which on a loaded
    // machine may be after the job ran on the other one: wait for both to have started.
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        let niced = thread_nice_values("kvtier-io");
        if niced.iter().filter(|&&n| n == 7).count() >= 2 {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "two transfer threads at nice 7 expected: {niced:?}"
        );
        std::thread::yield_now();
    }
    tier.shutdown();
}

#[test]
fn a_job_holds_its_blocks_until_its_result_is_polled() {
    let tier = memory_tier();
    let mut pool = Pool::new(4, BLOCK);
    pool.fill_random(11);
    pool.register(&tier);
    // A store naming block 0 twice holds it once; another store may share it.
    tier.submit(JobKind::Store, 1, &[0, 0, 1], keys(&[1, 2, 3]))
        .unwrap();
    tier.submit(JobKind::Store, 2, &[0], keys(&[4])).unwrap();
    // A load needs its block alone, whether the holder is running or finished unpolled.
    let busy = tier.submit(JobKind::Load, 3, &[1], keys(&[1])).unwrap_err();
    assert_eq!(busy.status, Status::BlockBusy, "{busy:?}");
    assert!(
        busy.message.contains("block 1") && busy.message.contains("job 1"),
        "{}",
        busy.message
    );
    let results = wait_all(&tier, 3);
    assert_eq!(results[&3].status, Status::BlockBusy);
    assert_eq!(results[&3].key_status, vec![Status::BlockBusy]);
    // Polled: blocks 0 and 1 are free again, and a load now holds block 1 alone.
    tier.submit(JobKind::Load, 5, &[1], keys(&[4])).unwrap();
    assert_eq!(
        tier.submit(JobKind::Store, 6, &[1], keys(&[5]))
            .unwrap_err()
            .status,
        Status::BlockBusy
    );
    assert_eq!(
        tier.submit(JobKind::Load, 7, &[1], keys(&[5]))
            .unwrap_err()
            .status,
        Status::BlockBusy
    );
    tier.submit(JobKind::Store, 8, &[0], keys(&[6])).unwrap();
    let results = wait_all(&tier, 4);
    assert!(results[&5].succeeded() && results[&8].succeeded());
    assert_eq!(
        pool.block(1),
        pool.block(0),
        "block 1 holds key 4, stored from block 0"
    );
}
