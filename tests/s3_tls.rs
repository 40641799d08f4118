//! The direct HTTP path over TLS, against real servers: moto_server in its own TLS mode
//! (reached through a pass-through relay that counts connections), and s3s-fs (which checks
//! SigV4 signatures) behind a TLS-terminating relay and the fault-injecting proxy. Loads
//! are byte-exact and the direct-path counters show which path carried them; connections
//! are reused; a 404 is a MISS or NotFound without a fallback; an object of the wrong
//! length fails its key; a body cut mid-way never yields wrong bytes; a server whose
//! certificate the configured CA did not sign never serves a load.

#[macro_use]
mod support;

use std::collections::HashSet;
use std::sync::{Arc, Mutex};

use kvtier_core::{JobKind, LookupResult, Status, Tier};
use serde_json::{json, Value};
use support::proxy::{Fault, Proxy};
use support::tls_relay::TlsRelay;
use support::*;

/// Large enough for many TLS records per body (and SO_RCVLOWAT to matter).
const BLOCK: usize = 640 * 1024 + 123;

fn tier(store: &Value) -> Tier {
    Tier::from_json(&tier_json(store.clone(), json!({})))
        .unwrap_or_else(|e| panic!("tier start failed: {e}"))
}

/// An HTTPS endpoint on a real server: `relay` is what the store talks to.
struct Https {
    store: Value,
    relay: TlsRelay,
    _tls: Arc<Tls>,
    /// s3s-fs only: the fault-injecting proxy between the TLS relay and the server.
    proxy: Option<Proxy>,
    /// Whether the server keeps connections alive between responses.
    keeps_alive: bool,
    _servers: Vec<Server>,
}

/// moto_server speaking TLS itself, a pass-through relay in front.
fn moto_https() -> Https {
    let tls = Arc::new(Tls::generate());
    let srv = Server::moto_tls(tls.clone());
    let bucket = srv.new_bucket();
    let relay = TlsRelay::passthrough(srv.port());
    let store = with(
        srv.store_json(&bucket),
        "endpoint_override",
        json!(relay.endpoint()),
    );
    Https {
        store,
        relay,
        _tls: tls,
        proxy: None,
        keeps_alive: false,
        _servers: vec![srv],
    }
}

/// s3s-fs (plain HTTP) behind the fault proxy, behind a TLS-terminating relay.
fn s3s_fs_https() -> Https {
    let tls = Arc::new(Tls::generate());
    let srv = Server::s3s_fs();
    let bucket = srv.new_bucket();
    let proxy = Proxy::start(srv.port());
    let relay = TlsRelay::terminating(proxy.port(), &tls.cert, &tls.key);
    let mut store = with(
        srv.store_json(&bucket),
        "endpoint_override",
        json!(relay.endpoint()),
    );
    store["scheme"] = json!("https");
    store["ca_bundle"] = json!(tls.ca.display().to_string());
    Https {
        store,
        relay,
        _tls: tls,
        proxy: Some(proxy),
        keeps_alive: true,
        _servers: vec![srv],
    }
}

fn load(tier: &Tier, job: u64, slots: &[u64], ids: &[u64]) -> kvtier_core::JobResult {
    tier.submit(JobKind::Load, job, slots, keys(ids)).unwrap();
    wait_all(tier, 1).remove(&job).unwrap()
}

/// Loads over TLS go on the direct path: byte-exact, one connection reused for sequential
/// loads and lookups, a missing key is NotFound / MISS and an object of the wrong length
/// fails its key, all without a fallback to the general client.
fn direct_tls_loads(h: &Https) {
    let tier = tier(&h.store);
    let mut pool = Pool::new(16, BLOCK);
    pool.fill_random(41);
    pool.register(&tier);
    tier.submit(JobKind::Store, 1, &[0, 1, 2, 3], keys(&[1, 2, 3, 4]))
        .unwrap();
    let r = wait_all(&tier, 1).remove(&1).unwrap();
    assert_eq!(r.status, Status::Ok, "{}", r.message);
    let before = tier.stats();

    // The first load and the first lookup (on the lookup lane's runtime) may each open a
    // connection; the next loads and lookups reuse them.
    let r = load(&tier, 2, &[8], &[1]);
    assert_eq!(r.status, Status::Ok, "{}", r.message);
    assert_eq!(resolve_lookup(&tier, 9, &key(4)), LookupResult::Hit);
    let connections = h.relay.accepted();
    for (i, (slot, id)) in [(9u64, 2u64), (10, 3), (11, 4), (12, 1)].iter().enumerate() {
        let r = load(&tier, 3 + i as u64, &[*slot], &[*id]);
        assert_eq!(r.status, Status::Ok, "{}", r.message);
    }
    for (slot, block) in [(8, 0), (9, 1), (10, 2), (11, 3), (12, 0)] {
        assert!(
            pool.block(slot) == pool.block(block),
            "slot {slot} differs from block {block}"
        );
    }
    for id in [1, 2, 3, 4] {
        assert_eq!(resolve_lookup(&tier, 9, &key(id)), LookupResult::Hit);
    }
    assert_eq!(resolve_lookup(&tier, 9, &key(77)), LookupResult::Miss);
    if h.keeps_alive {
        assert_eq!(
            h.relay.accepted(),
            connections,
            "sequential loads and lookups reuse the pooled TLS connection"
        );
    } else {
        // moto's server closes the connection after every response: one per request.
        assert_eq!(h.relay.accepted(), connections + 8);
    }

    // A missing key fails alone; its slot keeps what it held.
    let held = pool.block(13).to_vec();
    let r = load(&tier, 20, &[13, 14], &[88, 2]);
    assert_eq!(
        r.key_status,
        vec![Status::NotFound, Status::Ok],
        "{}",
        r.message
    );
    assert!(pool.block(13) == &held[..] && pool.block(14) == pool.block(1));

    // An object of another length fails its key.
    let name = tier.layout().object_name(&key(5)).unwrap();
    oob_put(&h.store, &name, random_bytes(BLOCK - 1, 5));
    let r = load(&tier, 21, &[15, 14], &[5, 3]);
    assert_eq!(
        r.key_status,
        vec![Status::LengthMismatch, Status::Ok],
        "{}",
        r.message
    );
    assert!(pool.block(14) == pool.block(2));

    let stats = tier.stats();
    assert_eq!(
        stats.direct_requests - before.direct_requests,
        5 + 5 + 2 + 2,
        "loads and lookups went direct: {stats:?}"
    );
    assert_eq!(stats.direct_fallbacks, 0, "{stats:?}");
}

/// After the endpoint starts presenting a certificate of another CA, the direct path loads
/// nothing: every key fails with the TLS error the general client reports (Status::Tls,
/// UnknownIssuer), its slot untouched, and each load was first tried (and refused) on
/// the direct path.
fn unverified_server_serves_nothing(h: &Https, switch_to_impostor: &dyn Fn(&Impostor)) {
    let tier = tier(&with(h.store.clone(), "max_retries", json!(0)));
    let mut pool = Pool::new(8, BLOCK);
    pool.fill_random(43);
    pool.register(&tier);
    tier.submit(JobKind::Store, 1, &[0, 1], keys(&[1, 2]))
        .unwrap();
    assert!(wait_all(&tier, 1)[&1].succeeded());
    let r = load(&tier, 2, &[4], &[1]);
    assert_eq!(r.status, Status::Ok, "{}", r.message);
    assert!(pool.block(4) == pool.block(0));

    let impostor = Tls::generate().signed_by_other_ca();
    switch_to_impostor(&impostor);
    h.relay.close_connections();
    pool.block_mut(5).fill(0xa5);
    pool.block_mut(6).fill(0xa5);
    let fallbacks = tier.stats().direct_fallbacks;
    let r = load(&tier, 3, &[5, 6], &[1, 2]);
    // A fallback may take a pooled connection of the general client (from the stores above)
    // that the relay has just closed, before the client has seen it close: with max_retries
    // 0 that load fails as Io, without reaching the server. Such a key is loaded once more,
    // on a new connection, where it must meet the certificate.
    let mut statuses = r.key_status.clone();
    let mut message = r.message.clone();
    let mut attempts = 2;
    for (i, (slot, id)) in [(5u64, 1u64), (6, 2)].into_iter().enumerate() {
        if statuses[i] == Status::Io {
            let again = load(&tier, 10 + id, &[slot], &[id]);
            statuses[i] = again.key_status[0];
            if i == 0 {
                message = again.message;
            }
            attempts += 1;
        }
    }
    assert_eq!(statuses, vec![Status::Tls, Status::Tls], "{message}");
    // The general client's own words for a certificate the trusted CAs did not sign.
    assert!(message.contains("UnknownIssuer"), "{message}");
    assert!(
        message.contains("store.ca_bundle"),
        "a TLS failure names the setting of trusted CAs: {message}"
    );
    assert!(
        pool.block(5).iter().all(|&b| b == 0xa5) && pool.block(6).iter().all(|&b| b == 0xa5),
        "a slot was written from an unverified server"
    );
    assert_eq!(
        tier.stats().direct_fallbacks - fallbacks,
        attempts,
        "{:?}",
        tier.stats()
    );
    drop(impostor);
}

#[test]
fn moto_tls_loads_on_the_direct_path() {
    direct_tls_loads(&moto_https());
}

#[test]
fn s3s_fs_tls_loads_on_the_direct_path() {
    direct_tls_loads(&s3s_fs_https());
}

#[test]
fn moto_tls_direct_path_refuses_an_unverified_server() {
    let h = moto_https();
    // The relay's upstream becomes a TLS server with a certificate of an unrelated CA.
    let impostors: Mutex<Vec<TlsRelay>> = Mutex::new(Vec::new());
    unverified_server_serves_nothing(&h, &|impostor: &Impostor| {
        let fake = TlsRelay::terminating(free_port(), &impostor.cert, &impostor.key);
        h.relay.set_upstream(fake.port());
        impostors.lock().unwrap().push(fake);
    });
}

#[test]
fn s3s_fs_tls_direct_path_refuses_an_unverified_server() {
    let h = s3s_fs_https();
    unverified_server_serves_nothing(&h, &|impostor: &Impostor| {
        h.relay.set_identity(&impostor.cert, &impostor.key);
    });
}

/// A body cut mid-way over TLS: the direct GET falls back and the general client's answer
/// loads byte-exact; when every answer is cut, the keys fail. Never wrong bytes.
#[test]
fn s3s_fs_tls_cut_bodies_fall_back_or_fail() {
    let h = s3s_fs_https();
    let proxy = h.proxy.as_ref().unwrap();
    let tier = tier(&h.store);
    let mut pool = Pool::new(12, BLOCK);
    pool.fill_random(47);
    pool.register(&tier);
    tier.submit(JobKind::Store, 1, &[0, 1, 2], keys(&[1, 2, 3]))
        .unwrap();
    assert!(wait_all(&tier, 1)[&1].succeeded());

    // The first GET of each object is cut after half its body.
    let seen = Arc::new(Mutex::new(HashSet::new()));
    let first = seen.clone();
    proxy.set_rule(move |r| {
        if r.method == "GET" && first.lock().unwrap().insert(r.path.clone()) {
            Fault::CutResponse
        } else {
            Fault::Pass
        }
    });
    let before = tier.stats();
    let r = load(&tier, 2, &[4, 5, 6], &[1, 2, 3]);
    assert_eq!(r.key_status, vec![Status::Ok; 3], "{}", r.message);
    for (slot, block) in [(4, 0), (5, 1), (6, 2)] {
        assert!(pool.block(slot) == pool.block(block), "slot {slot}");
    }
    assert_eq!(proxy.stats().faults("cut_response"), 3);
    let stats = tier.stats();
    assert_eq!(stats.direct_requests - before.direct_requests, 3);
    assert_eq!(
        stats.direct_fallbacks - before.direct_fallbacks,
        3,
        "{stats:?}"
    );

    // Every GET cut: the keys fail (with the general client's retries spent).
    proxy.set_rule(|r| {
        if r.method == "GET" {
            Fault::CutResponse
        } else {
            Fault::Pass
        }
    });
    let r = load(&tier, 3, &[7, 8], &[1, 2]);
    assert!(
        r.key_status.iter().all(|s| *s != Status::Ok),
        "{:?} {}",
        r.key_status,
        r.message
    );

    // Passing again: loads are whole once more.
    proxy.set_rule(|_| Fault::Pass);
    let r = load(&tier, 4, &[9, 10], &[3, 1]);
    assert_eq!(r.key_status, vec![Status::Ok; 2], "{}", r.message);
    assert!(pool.block(9) == pool.block(2) && pool.block(10) == pool.block(0));
}
