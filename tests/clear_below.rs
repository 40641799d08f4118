//! `kvt_tier_clear` deletes every block under the tier's prefix and namespace, at any
//! depth: with an empty prefix and namespace, every block of the bucket, in every
//! namespace; with a prefix and an empty namespace, every namespace under the prefix. It
//! never deletes what is not a block, and reports BlockRemoved for the blocks of its own
//! namespace. Through the C ABI, on the local store and on s3s-fs.

#[macro_use]
mod support;

use kvtier_core::{JobKind, Status};
use serde_json::{json, Value};
use support::c_tier::CTier;
use support::*;

const BLOCK: usize = 4096;
/// Blocks stored in each namespace.
const PER_NAMESPACE: u64 = 3;

/// (prefix, namespace) of the tiers that store blocks: the top level, a namespace at the
/// top, two namespaces under one prefix, one of them two segments deep.
const LAYOUTS: [(&str, &str); 4] = [("", ""), ("", "m_r0"), ("kv", "m_r1"), ("kv", "deep/er")];

/// Objects that are not blocks, at every depth: clear leaves them.
const NOT_BLOCKS: [&str; 5] = [
    "notes.txt",
    "m_r0/readme.bin",
    "kv/m_r1/abc/def_g0/abcdef.bin",
    "kv/deep/er/abc/de_g0/.kvtier-tmp-1-0",
    "kv/m_r1/__kvtier_probe__/abc/de_g0/abcdef.bin",
];

fn config(store: &Value, prefix: &str, namespace: &str) -> String {
    json!({"store": store, "prefix": prefix, "namespace": namespace, "enable_kv_events": true})
        .to_string()
}

/// The stored blocks' object names, by layout.
fn names(layout: (&str, &str)) -> Vec<String> {
    let layout = kvtier_core::key::KeyLayout::new(layout.0, layout.1).unwrap();
    (0..PER_NAMESPACE)
        .map(|i| layout.object_name(&key(i)).unwrap())
        .collect()
}

fn clear_reaches_every_namespace_below(store: &Value) {
    let tiers: Vec<CTier> = LAYOUTS
        .iter()
        .map(|(prefix, namespace)| CTier::new(&config(store, prefix, namespace)))
        .collect();
    let ids: Vec<u64> = (0..PER_NAMESPACE).collect();
    let keys: Vec<Vec<u8>> = ids.iter().map(|&i| key(i)).collect();
    for (n, tier) in tiers.iter().enumerate() {
        tier.register_pool(PER_NAMESPACE, BLOCK, n as u64);
        let (status, message) = tier.run(JobKind::Store, 1, &ids, &keys);
        assert_eq!(status, Status::Ok, "{message}");
        tier.take_kv_events();
    }
    for name in NOT_BLOCKS {
        oob_put(store, name, random_bytes(BLOCK, 9));
    }
    let present = |layout| {
        names(layout)
            .iter()
            .filter(|n| oob_get(store, n).is_some())
            .count()
    };
    for layout in LAYOUTS {
        assert_eq!(present(layout), PER_NAMESPACE as usize, "{layout:?}");
    }

    // A prefix with an empty namespace: every namespace under the prefix, nothing above.
    let under_kv = CTier::new(&config(store, "kv", ""));
    let (status, report) = under_kv.clear();
    assert_eq!(status, Status::Ok, "{}", c_tier::last_error());
    assert_eq!((report.objects, report.deleted), (6, 6), "{report:?}");
    assert_eq!(report.deleted_bytes, 6 * BLOCK as u64);
    for (layout, left) in LAYOUTS.into_iter().zip([3, 3, 0, 0]) {
        assert_eq!(present(layout), left, "{layout:?} after clearing kv/");
    }
    assert!(
        under_kv.take_kv_events().is_empty(),
        "no block of its own namespace was there: no BlockRemoved"
    );

    // The top level: every block of the bucket. Events for the tier's own blocks only.
    let top = &tiers[0];
    let (status, report) = top.clear();
    assert_eq!(status, Status::Ok, "{}", c_tier::last_error());
    assert_eq!((report.objects, report.deleted), (6, 6), "{report:?}");
    for layout in LAYOUTS {
        assert_eq!(present(layout), 0, "{layout:?} after clearing the bucket");
    }
    let removed: Vec<Vec<u8>> = top
        .take_kv_events()
        .into_iter()
        .inspect(|(removed, _)| assert!(removed, "only BlockRemoved events"))
        .flat_map(|(_, keys)| keys)
        .collect();
    let mut sorted = removed.clone();
    sorted.sort();
    let mut own = keys.clone();
    own.sort();
    assert_eq!(
        sorted, own,
        "one BlockRemoved per own block, none for other namespaces"
    );
    for name in NOT_BLOCKS {
        assert!(
            oob_get(store, name).is_some(),
            "{name} is not a block, and stays"
        );
    }
    // Cleared blocks are forgotten: a store uploads them again and they load.
    let (status, message) = top.run(JobKind::Store, 2, &ids, &keys);
    assert_eq!(status, Status::Ok, "{message}");
    assert_eq!(present(LAYOUTS[0]), PER_NAMESPACE as usize);
    let (status, message) = top.run(JobKind::Load, 3, &ids, &keys);
    assert_eq!(status, Status::Ok, "{message}");
}

#[test]
fn local_store() {
    let dir = tempfile::tempdir().unwrap();
    clear_reaches_every_namespace_below(&json!({"type": "local", "path": dir.path()}));
}

#[test]
fn s3s_fs() {
    let srv = Server::s3s_fs();
    let bucket = srv.new_bucket();
    clear_reaches_every_namespace_below(&srv.store_json(&bucket));
}
