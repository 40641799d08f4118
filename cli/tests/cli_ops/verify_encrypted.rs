//! `kvtier verify` on an encrypted namespace: `--block-bytes` is the blocks' length, which
//! the encryption's overhead does not change (nothing good is called corrupt or deleted);
//! without the keyring it does not judge encrypted objects: it names them, exits non-zero
//! and deletes nothing; with the keyring a tampered object is reported.

use kvtier_core::key::KeyLayout;
use kvtier_core::{JobKind, Tier};
use serde_json::{json, Value};

use crate::backend::*;
use crate::support::cli::*;
use crate::support::*;

/// The blocks' length: two segments of the format, the second one short.
const PLAIN: usize = 100_000;

pub fn verify_judges_encrypted_objects_only_with_the_keyring(b: &Backend) {
    let ring_dir = tempfile::tempdir().unwrap();
    let ring = ring_dir.path().join("keyring.json");
    std::fs::write(
        &ring,
        r#"{"write": "v1", "keys": {"v1": "MDEyMzQ1Njc4OWFiY2RlZmdoaWprbG1ub3BxcnN0dXY="}}"#,
    )
    .unwrap();
    let mut with_keys: Value = serde_json::from_str(&b.config(NS_A)).unwrap();
    with_keys["encryption"] = json!({"keyring_file": ring});
    let with_keys = with_keys.to_string();
    let without_keys = b.config(NS_A);
    let tier = Tier::from_json(&with_keys).unwrap();
    let _pool = Pool::random_registered(&tier, 4, PLAIN, 5);
    assert!(run_job(&tier, JobKind::Store, 1, &[0, 1, 2, 3], &[1, 2, 3, 4]).succeeded());
    drop(tier);
    let layout = KeyLayout::new("kv", NS_A).unwrap();
    let names: Vec<String> = (1..=4)
        .map(|i| layout.object_name(&key(i)).unwrap())
        .collect();
    let all_there = |when: &str| {
        for name in &names {
            assert!(b.exists(name), "{name} was deleted ({when})");
        }
    };
    let plain = PLAIN.to_string();

    // With the keyring, --block-bytes is the blocks' length: every object is good.
    let exact = ["--block-bytes", plain.as_str(), "--delete-corrupt"];
    let report = json_run("verify", &with_keys, &exact, 0);
    assert_eq!(report["good"], 4, "{report}");
    assert_eq!(report["corrupt"], json!([]), "{report}");
    all_there("--block-bytes with the keyring");
    // Objects not read are judged by their listed length, which the overhead explains.
    let sampled = [&exact[..], &["--sample", "1"]].concat();
    let report = json_run("verify", &with_keys, &sampled, 0);
    assert_eq!(
        (&report["read"], &report["corrupt"]),
        (&json!(1), &json!([])),
        "{report}"
    );
    all_there("a sample with --block-bytes");

    // Without the keyring, encrypted objects are named, not judged, and nothing is deleted.
    for args in [&exact[..], &["--delete-corrupt"], &[]] {
        let report = json_run("verify", &without_keys, args, 1);
        assert_eq!(
            names_in(&report["encrypted"]),
            sorted(&names),
            "{args:?}: {report}"
        );
        assert_eq!(report["good"], 0, "{args:?}: {report}");
        assert_eq!(report["corrupt"], json!([]), "{args:?}: {report}");
        all_there("without the keyring");
    }
    let out = kvtier_with("verify", &without_keys, &exact);
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr(&out).contains("keyring"), "{}", stderr(&out));
    let lines = stdout(&out)
        .lines()
        .filter(|l| l.starts_with("ENCRYPTED"))
        .count();
    assert_eq!(lines, 4, "{}", stdout(&out));

    // A tampered object (rewritten, one byte of its body flipped) is bad with the keyring,
    // and kept: the keyring may merely lack its key.
    let mut tampered = oob_get(&b.store(), &names[1]).unwrap();
    tampered[70_000] ^= 0x01;
    oob_put(&b.store(), &names[1], tampered);
    let report = json_run("verify", &with_keys, &exact, 1);
    assert_eq!(
        names_in(&report["undecryptable"]),
        [names[1].clone()],
        "{report}"
    );
    assert_eq!(report["good"], 3, "{report}");
    assert_eq!(report["corrupt"], json!([]), "{report}");
    all_there("a tampered object");
}
