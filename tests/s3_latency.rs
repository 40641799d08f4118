//! kvtier at a remote store's latency: real S3 servers (s3s-fs, moto and Ceph RGW) behind
//! the project's shaping proxy (`support::shaper`), which adds a round trip to every
//! exchange and one more to every new connection, as the path to a remote store does.
//!
//! Behaviour, not timing: the tests assert what kvtier does on the link (how many requests
//! it keeps in flight at once, what each key answers), never how long it took, which a busy
//! machine would make flaky. The time is printed for the reader.

#[macro_use]
mod support;

use std::time::{Duration, Instant};

use kvtier_core::{JobKind, LookupResult, Tier};
use serde_json::json;
use support::shaper::{Link, Shaper};
use support::*;

const BLOCK: usize = 4096;
/// The existence batch of a scheduler step that needs many answers.
const BATCH: u64 = 256;
/// Long enough that requests sent one wave after another could not pass for one wave.
const ROUND_TRIP: Duration = Duration::from_millis(50);
/// The link large objects cross: a remote store's round trip and per-connection cap.
const LARGE_OBJECT_LINK: Link = Link {
    round_trip: Duration::from_millis(20),
    per_connection: Some(100_000_000),
    total: None,
};

/// A 256-key existence check through a link with a round trip sends all 256 requests at
/// once with the default configuration (so the batch costs about one round trip, plus one
/// for new connections, not one per wave), and answers each key as the store does.
fn an_existence_batch_is_in_flight_at_once(srv: &Server) {
    let bucket = srv.new_bucket();
    let store = srv.store_json(&bucket);
    // Every other key stored, straight to the server.
    let stored: Vec<u64> = (0..BATCH).step_by(2).collect();
    {
        let writer = Tier::from_json(&tier_json(store.clone(), json!({}))).unwrap();
        let mut pool = Pool::new(stored.len() as u64, BLOCK);
        pool.fill_random(11);
        pool.register(&writer);
        let per_job = 16;
        for (job, ids) in stored.chunks(per_job).enumerate() {
            let slots: Vec<u64> = (0..ids.len() as u64)
                .map(|s| (job * per_job) as u64 + s)
                .collect();
            writer
                .submit(JobKind::Store, job as u64, &slots, keys(ids))
                .unwrap();
        }
        let results = wait_all(&writer, stored.len().div_ceil(per_job));
        assert!(
            results.values().all(|r| r.succeeded()),
            "stores failed: {results:?}"
        );
    }

    let shaper = Shaper::start(
        srv.port(),
        Link {
            round_trip: ROUND_TRIP,
            ..Link::default()
        },
    );
    let through_link = with(store, "endpoint_override", json!(shaper.endpoint()));
    let reader = Tier::from_json(&tier_json(through_link, json!({}))).unwrap();
    shaper.reset_most_open();
    let open_before = shaper.traffic().open;
    // Nothing is answered until the whole batch is on the link (or a minute has passed):
    // on a busy machine the first answers would otherwise close or free connections before
    // the last checks went out, and the count below would depend on the machine's speed.
    shaper.hold_answers_until_open(BATCH, Duration::from_secs(60));

    let asked: Vec<Vec<u8>> = (0..BATCH).map(key).collect();
    let started = Instant::now();
    let verdicts = reader.check_now(&asked, Duration::from_secs(120)).unwrap();
    let took = started.elapsed();

    for (i, verdict) in verdicts.iter().enumerate() {
        let want = if i % 2 == 0 {
            LookupResult::Hit
        } else {
            LookupResult::Miss
        };
        assert_eq!(*verdict, want, "key {i}");
    }
    let traffic = shaper.traffic();
    eprintln!(
        "{}: {BATCH} existence checks at a {ROUND_TRIP:?} round trip took {took:?} ({:.1} round trips); \
         {} connections open at once at most ({open_before} before), {} accepted",
        srv.name(),
        took.as_secs_f64() / ROUND_TRIP.as_secs_f64(),
        traffic.most_open,
        traffic.accepted,
    );
    // All at once: each in-flight HEAD holds a connection of its own, so the batch had
    // every one of its requests on the link together only if this many were open.
    assert!(
        traffic.most_open >= BATCH,
        "at most {} connections were open at once for {BATCH} checks: the batch went out in waves",
        traffic.most_open
    );
}

/// A load of an object larger than `load_part_bytes` (8 MiB by default) reads its parts on
/// connections of their own, all at once, through a link that caps each connection:
/// a 32 MiB block comes down four connections, byte-exact; with parts turned off, one.
fn a_large_load_comes_down_several_connections(srv: &Server) {
    const LARGE: usize = 32 << 20;
    let bucket = srv.new_bucket();
    let store = srv.store_json(&bucket);
    let writer = Tier::from_json(&tier_json(store.clone(), json!({}))).unwrap();
    let mut pool = Pool::new(3, LARGE);
    pool.fill_random(23);
    pool.register(&writer);
    writer.submit(JobKind::Store, 1, &[0], keys(&[7])).unwrap();
    assert!(wait_all(&writer, 1)[&1].succeeded());

    let shaper = Shaper::start(srv.port(), LARGE_OBJECT_LINK);
    for (part_bytes, slot, connections) in [(None, 1, 4), (Some(0), 2, 1)] {
        let mut through_link = with(store.clone(), "endpoint_override", json!(shaper.endpoint()));
        if let Some(part_bytes) = part_bytes {
            through_link["load_part_bytes"] = json!(part_bytes);
        }
        let reader = Tier::from_json(&tier_json(through_link, json!({}))).unwrap();
        pool.register(&reader);
        shaper.reset_carried();
        let started = Instant::now();
        reader
            .submit(JobKind::Load, 2, &[slot], keys(&[7]))
            .unwrap();
        let r = wait_all(&reader, 1).remove(&2).unwrap();
        assert!(r.succeeded(), "{}", r.message);
        assert!(
            pool.block(slot) == pool.block(0),
            "slot {slot} holds other bytes"
        );
        let carried = shaper.connections_that_carried(1 << 20);
        eprintln!(
            "{}: a 32 MiB load with load_part_bytes {part_bytes:?} took {:?} on {carried} connections",
            srv.name(),
            started.elapsed()
        );
        assert_eq!(
            carried, connections,
            "connections that carried the load (load_part_bytes {part_bytes:?})"
        );
    }
}

/// A store of an object larger than `store_part_bytes` (16 MiB by default) sends its parts
/// as one multipart upload, all at once on connections of their own: a 32 MiB block goes
/// up two connections, four with 8 MiB parts, one with parts turned off. Either way the object loads byte-exact
/// with its checksum verified, and a conditional store of a key already there sends nothing.
fn a_large_store_goes_up_several_connections(srv: &Server) {
    const LARGE: usize = 32 << 20;
    let bucket = srv.new_bucket();
    let store = srv.store_json(&bucket);
    let mut pool = Pool::new(6, LARGE);
    pool.fill_random(29);
    let shaper = Shaper::start(srv.port(), LARGE_OBJECT_LINK);
    let through_link = |part_bytes: Option<u64>| {
        let mut through_link = with(store.clone(), "endpoint_override", json!(shaper.endpoint()));
        if let Some(part_bytes) = part_bytes {
            through_link["store_part_bytes"] = json!(part_bytes);
        }
        Tier::from_json(&tier_json(through_link, json!({}))).unwrap()
    };
    for (part_bytes, slot, connections) in [(None, 0, 2), (Some(8 << 20), 1, 4), (Some(0), 2, 1)] {
        let writer = through_link(part_bytes);
        pool.register(&writer);
        shaper.reset_carried();
        let started = Instant::now();
        writer
            .submit(JobKind::Store, 1, &[slot], keys(&[slot]))
            .unwrap();
        let r = wait_all(&writer, 1).remove(&1).unwrap();
        assert!(r.succeeded(), "{}", r.message);
        let sent = shaper.connections_that_sent(1 << 20);
        eprintln!(
            "{}: a 32 MiB store with store_part_bytes {part_bytes:?} took {:?} on {sent} connections",
            srv.name(),
            started.elapsed()
        );
        assert_eq!(
            sent, connections,
            "connections that carried the store (store_part_bytes {part_bytes:?})"
        );
    }

    // Straight from the server, checksums verified: both objects whole.
    let reader = Tier::from_json(&tier_json(store.clone(), json!({"checksums": true}))).unwrap();
    pool.register(&reader);
    reader.submit(JobKind::Load, 2, &[2], keys(&[0])).unwrap();
    reader.submit(JobKind::Load, 3, &[3], keys(&[1])).unwrap();
    let loaded = wait_all(&reader, 2);
    assert!(loaded.values().all(|r| r.succeeded()), "{loaded:?}");
    assert!(
        pool.block(2) == pool.block(0),
        "the store in parts read back other bytes"
    );
    assert!(
        pool.block(3) == pool.block(1),
        "the single PUT read back other bytes"
    );
    assert_eq!(reader.stats().corrupt_blocks, 0);
    // The checksum was recorded with the multipart upload, and is the block's.
    let name = reader.layout().object_name(&key(0)).unwrap();
    let check =
        block_on(oob_store(&store).check_object(&kvtier_core::store::object_path(&name))).unwrap();
    assert_eq!(check.bytes, LARGE as u64);
    assert_eq!(
        check.recorded,
        Some(check.computed),
        "the recorded checksum"
    );

    // The block is there: a conditional store of it asks, and sends nothing.
    let again = through_link(None);
    pool.register(&again);
    shaper.reset_carried();
    again.submit(JobKind::Store, 4, &[0], keys(&[0])).unwrap();
    let r = wait_all(&again, 1).remove(&4).unwrap();
    assert!(r.succeeded(), "{}", r.message);
    assert_eq!(
        shaper.connections_that_sent(1 << 20),
        0,
        "a stored block was sent again"
    );
    assert_eq!(again.stats().dedup_already_stored, 1);
}

/// The shaper itself: a byte takes half a round trip each way and a new connection's first
/// request one round trip more, and a paced connection moves no faster than its rate.
#[test]
fn the_shaper_delays_and_paces_what_crosses_it() {
    let server = Server::s3s_fs();
    let round_trip = Duration::from_millis(100);
    let shaper = Shaper::start(
        server.port(),
        Link {
            round_trip,
            per_connection: Some(1 << 20),
            total: None,
        },
    );
    let bucket = server.new_bucket();
    let store = with(
        server.store_json(&bucket),
        "endpoint_override",
        json!(shaper.endpoint()),
    );
    // A lower bound only: the link may not be faster than it says (never an upper bound,
    // which a busy machine could break).
    let tier = Tier::from_json(&tier_json(store, json!({}))).unwrap();
    let mut pool = Pool::new(2, 1 << 20);
    pool.fill_random(3);
    pool.register(&tier);
    let started = Instant::now();
    tier.submit(JobKind::Store, 1, &[0], keys(&[0])).unwrap();
    assert!(wait_all(&tier, 1)[&1].succeeded());
    let took = started.elapsed();
    // 1 MiB at 1 MiB/s plus a round trip: at least a second.
    assert!(
        took >= Duration::from_secs(1),
        "a 1 MiB store crossed a 1 MiB/s link in {took:?}"
    );
    tier.submit(JobKind::Load, 2, &[1], keys(&[0])).unwrap();
    assert!(wait_all(&tier, 1)[&2].succeeded());
    assert_eq!(
        pool.block(0),
        pool.block(1),
        "the block crossed the shaper unchanged"
    );
    let traffic = shaper.traffic();
    assert!(
        traffic.bytes_up >= 1 << 20 && traffic.bytes_down >= 1 << 20,
        "{traffic:?}"
    );
    assert!(traffic.accepted >= 1);
}

on_both_servers!(
    an_existence_batch_is_in_flight_at_once,
    a_large_load_comes_down_several_connections,
    a_large_store_goes_up_several_connections,
);
