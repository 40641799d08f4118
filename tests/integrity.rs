//! Checksums on by default, and write-once dedup, on the local and in-memory stores.

mod support;

use std::time::Duration;

use kvtier_core::key::make_key;
use kvtier_core::{JobKind, JobResult, KeyBatch, LookupResult, Status, Tier};

const BLOCK: usize = 8192;

fn key(i: u64) -> Vec<u8> {
    let mut hash = [0x3cu8; 32];
    hash[..8].copy_from_slice(&i.to_be_bytes());
    make_key(&hash, 1)
}

fn batch(ids: &[u64]) -> KeyBatch {
    KeyBatch::from_keys(&ids.iter().map(|&i| key(i)).collect::<Vec<_>>()).unwrap()
}

struct Setup {
    tier: Tier,
    mem: Vec<u8>,
}

fn setup(config: &str, blocks: u64, block: usize) -> Setup {
    let tier = Tier::from_json(config).unwrap();
    let mut mem: Vec<u8> = (0..blocks as usize * block)
        .map(|i| (i * 31 % 251) as u8)
        .collect();
    unsafe {
        tier.register_memory(mem.as_mut_ptr(), blocks, block)
            .unwrap()
    };
    Setup { tier, mem }
}

fn run(tier: &Tier, kind: JobKind, id: u64, blocks: &[u64], keys: &[u64]) -> JobResult {
    let _ = tier.submit(kind, id, blocks, batch(keys));
    tier.drain(Duration::from_secs(30)).unwrap();
    let mut r = tier.poll(usize::MAX);
    assert_eq!(r.len(), 1);
    r.pop().unwrap()
}

fn local_config(dir: &std::path::Path, extra: &str) -> String {
    format!(
        r#"{{"store":{{"type":"local","path":{:?}}},"namespace":"ns"{extra}}}"#,
        dir
    )
}

fn object_path(dir: &std::path::Path, tier: &Tier, k: u64) -> std::path::PathBuf {
    dir.join(tier.layout().object_name(&key(k)).unwrap())
}

#[test]
fn bit_flip_on_local_store_fails_only_that_key_and_lookup_turns_miss() {
    let dir = tempfile::tempdir().unwrap();
    let s = setup(&local_config(dir.path(), ""), 8, BLOCK);
    assert!(run(&s.tier, JobKind::Store, 1, &[0, 1, 2], &[1, 2, 3]).succeeded());
    // Flip one bit in place (keeps the file and its extended attribute).
    let path = object_path(dir.path(), &s.tier, 2);
    let mut bytes = std::fs::read(&path).unwrap();
    bytes[100] ^= 0x10;
    std::fs::OpenOptions::new()
        .write(true)
        .open(&path)
        .map(|f| {
            use std::os::unix::fs::FileExt;
            f.write_all_at(&bytes, 0).unwrap();
        })
        .unwrap();
    assert_eq!(
        support::resolve_lookup(&s.tier, 9, &key(2)),
        LookupResult::Hit,
        "corruption at rest is found by a load, not by a lookup"
    );
    let r = run(&s.tier, JobKind::Load, 2, &[4, 5, 6], &[1, 2, 3]);
    assert_eq!(
        r.key_status,
        vec![Status::Ok, Status::Corrupt, Status::Ok],
        "{}",
        r.message
    );
    assert_eq!(s.tier.stats().corrupt_blocks, 1);
    assert_eq!(&s.mem[4 * BLOCK..5 * BLOCK], &s.mem[0..BLOCK]);
    assert_eq!(s.tier.lookup(9, &key(2)).unwrap(), LookupResult::Miss);
    // A new request re-checks, and the store is not trusted as "known" any more.
    s.tier.request_finished(9);
    assert_eq!(s.tier.lookup(10, &key(2)).unwrap(), LookupResult::Retry);
}

#[test]
fn fail_and_delete_removes_the_corrupt_object_so_the_next_store_rewrites_it() {
    let dir = tempfile::tempdir().unwrap();
    let s = setup(
        &local_config(dir.path(), r#","on_corrupt":"fail_and_delete""#),
        4,
        BLOCK,
    );
    assert!(run(&s.tier, JobKind::Store, 1, &[0], &[7]).succeeded());
    let path = object_path(dir.path(), &s.tier, 7);
    let f = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
    std::os::unix::fs::FileExt::write_all_at(&f, &[0xff], 5).unwrap();
    assert_eq!(
        run(&s.tier, JobKind::Load, 2, &[1], &[7]).status,
        Status::Corrupt
    );
    assert!(!path.exists(), "corrupt object deleted");
    assert!(run(&s.tier, JobKind::Store, 3, &[0], &[7]).succeeded());
    assert!(path.exists(), "rewritten, not skipped as known");
    assert!(run(&s.tier, JobKind::Load, 4, &[2], &[7]).succeeded());
}

#[test]
fn objects_without_checksum_load_with_the_length_check_only() {
    // As written by vLLM's tier: raw bytes, no attribute.
    let dir = tempfile::tempdir().unwrap();
    let s = setup(&local_config(dir.path(), ""), 4, BLOCK);
    let path = object_path(dir.path(), &s.tier, 11);
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(&path, vec![0xabu8; BLOCK]).unwrap();
    assert!(run(&s.tier, JobKind::Load, 1, &[3], &[11]).succeeded());
    assert!(s.mem[3 * BLOCK..].iter().all(|&b| b == 0xab));
}

#[test]
fn tier_with_another_block_size_in_the_same_namespace_fails_by_length() {
    let dir = tempfile::tempdir().unwrap();
    let a = setup(&local_config(dir.path(), ""), 2, BLOCK);
    assert!(run(&a.tier, JobKind::Store, 1, &[0], &[5]).succeeded());
    let b = setup(&local_config(dir.path(), ""), 2, BLOCK * 2);
    assert_eq!(
        run(&b.tier, JobKind::Load, 1, &[1], &[5]).status,
        Status::LengthMismatch
    );
    let c = setup(&local_config(dir.path(), ""), 2, BLOCK / 2);
    assert_eq!(
        run(&c.tier, JobKind::Load, 1, &[1], &[5]).status,
        Status::LengthMismatch
    );
}

#[test]
fn tampered_object_in_memory_store_is_corrupt() {
    let s = setup(r#"{"store":{"type":"memory"}}"#, 4, BLOCK);
    assert!(run(&s.tier, JobKind::Store, 1, &[0, 1], &[1, 2]).succeeded());
    // Rewrite key 1's bytes but keep its recorded checksum, as a bad disk or bad copy would.
    let store = s.tier.store().client().clone();
    let name = object_store::path::Path::from(s.tier.layout().object_name(&key(1)).unwrap());
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    rt.block_on(async {
        use object_store::{ObjectStore, ObjectStoreExt};
        let got = store.get(&name).await.unwrap();
        let attributes = got.attributes.clone();
        let mut bytes = got.bytes().await.unwrap().to_vec();
        bytes[0] ^= 1;
        let opts = object_store::PutOptions {
            attributes,
            ..Default::default()
        };
        store.put_opts(&name, bytes.into(), opts).await.unwrap();
    });
    let r = run(&s.tier, JobKind::Load, 2, &[2, 3], &[1, 2]);
    assert_eq!(r.key_status, vec![Status::Corrupt, Status::Ok]);
}

#[test]
fn checksums_can_be_turned_off() {
    let dir = tempfile::tempdir().unwrap();
    let s = setup(&local_config(dir.path(), r#","checksums":false"#), 4, BLOCK);
    assert!(run(&s.tier, JobKind::Store, 1, &[0], &[1]).succeeded());
    let path = object_path(dir.path(), &s.tier, 1);
    let f = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
    std::os::unix::fs::FileExt::write_all_at(&f, &[0x00, 0x00], 0).unwrap();
    assert!(
        run(&s.tier, JobKind::Load, 2, &[1], &[1]).succeeded(),
        "no verification when off"
    );
}

#[test]
fn dedup_skips_known_keys_and_shares_concurrent_uploads() {
    let s = setup(
        r#"{"store":{"type":"memory"},"enable_kv_events":true}"#,
        8,
        BLOCK,
    );
    // One job storing the same key three times, plus two concurrent jobs of the same key.
    let _ = s
        .tier
        .submit(JobKind::Store, 1, &[0, 1, 2], batch(&[4, 4, 4]));
    let _ = s.tier.submit(JobKind::Store, 2, &[0], batch(&[4]));
    let _ = s.tier.submit(JobKind::Store, 3, &[0], batch(&[4]));
    s.tier.drain(Duration::from_secs(30)).unwrap();
    let results = s.tier.poll(10);
    assert_eq!(results.len(), 3);
    assert!(results.iter().all(|r| r.succeeded()));
    let st = s.tier.stats();
    assert_eq!(
        st.dedup_known + st.dedup_joined + st.dedup_already_stored,
        4,
        "{st:?}"
    );
    // A later store of the known key uploads nothing, and still yields its event.
    assert!(run(&s.tier, JobKind::Store, 4, &[5], &[4]).succeeded());
    assert_eq!(s.tier.stats().dedup_known, st.dedup_known + 1);
    assert_eq!(
        s.tier.take_events(10).len(),
        4,
        "deduplicated stores still emit BlockStored"
    );
}

#[test]
fn conditional_put_across_tier_instances_uploads_once() {
    let dir = tempfile::tempdir().unwrap();
    let a = setup(&local_config(dir.path(), ""), 2, BLOCK);
    let b = setup(&local_config(dir.path(), ""), 2, BLOCK);
    assert!(run(&a.tier, JobKind::Store, 1, &[0], &[8]).succeeded());
    let path = object_path(dir.path(), &a.tier, 8);
    // A rewrite would give the file a new modification time: start from one far in the past.
    let before = std::time::UNIX_EPOCH + Duration::from_secs(1_000_000);
    std::fs::File::options()
        .write(true)
        .open(&path)
        .unwrap()
        .set_modified(before)
        .unwrap();
    for job in 0..3 {
        assert!(run(&b.tier, JobKind::Store, job, &[1], &[8]).succeeded());
    }
    assert_eq!(
        b.tier.stats().dedup_already_stored,
        1,
        "412 from the store counts as stored"
    );
    assert_eq!(b.tier.stats().dedup_known, 2);
    assert_eq!(
        std::fs::metadata(&path).unwrap().modified().unwrap(),
        before,
        "never rewritten"
    );
}

#[test]
fn dedup_off_always_uploads_and_bad_mode_is_a_config_error() {
    let s = setup(r#"{"store":{"type":"memory"},"dedup":"off"}"#, 2, BLOCK);
    for job in 0..3 {
        assert!(run(&s.tier, JobKind::Store, job, &[0], &[1]).succeeded());
    }
    let st = s.tier.stats();
    assert_eq!(
        st.dedup_known + st.dedup_joined + st.dedup_already_stored,
        0
    );
    assert_eq!(st.keys_stored, 3);
    let e = Tier::from_json(r#"{"store":{"type":"memory"},"dedup":"sometimes"}"#)
        .err()
        .unwrap();
    assert_eq!(e.status, Status::Config);
    assert!(e.message.contains("sometimes"));
}
