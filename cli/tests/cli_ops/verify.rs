//! `kvtier verify`: an object corrupted in place (found, deleted on request), a wrong
//! length and samples, and encrypted objects it cannot decrypt told from corrupt ones.

use kvtier_core::key::KeyLayout;
use serde_json::Value;

use serde_json::json;

use crate::backend::*;
use crate::support::cli::*;
use crate::support::*;

pub fn verify_finds_the_corrupt_object_and_deletes_it_on_request(b: &Backend) {
    let names = b.put_blocks(NS_A, &[1, 2, 3, 4, 5, 6], BLOCK);
    let config = b.config(NS_A);
    let clean = json_run("verify", &config, &[], 0);
    assert_eq!(clean["read"], 6);
    assert_eq!(clean["good"], 6, "{clean}");
    assert_eq!(clean["without_checksum"], 0);

    corrupt(b, &names[2]);
    let found = json_run("verify", &config, &[], 1);
    assert_eq!(found["good"], 5, "{found}");
    assert_eq!(names_in(&found["corrupt"]), [names[2].clone()]);
    assert_eq!(found["corrupt"][0]["reason"], "checksum");
    assert_eq!(found["corrupt"][0]["deleted"], false);
    assert!(b.exists(&names[2]), "verify alone deleted");

    let out = kvtier_with("verify", &config, &[]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stdout(&out)
            .lines()
            .any(|l| l.starts_with("CORRUPT") && l.contains(&names[2])),
        "{}",
        stdout(&out)
    );

    let deleted = json_run("verify", &config, &["--delete"], 1);
    assert_eq!(deleted["corrupt"][0]["deleted"], true, "{deleted}");
    assert!(!b.exists(&names[2]), "the corrupt object stayed");
    for (i, name) in names.iter().enumerate() {
        if i != 2 {
            assert!(b.exists(name), "{name} was deleted");
        }
    }
    let after = json_run("verify", &config, &[], 0);
    assert_eq!(after["good"], 5, "{after}");
    assert_eq!(after["corrupt"], json!([]));
}

pub fn verify_reports_a_wrong_length_and_samples(b: &Backend) {
    let names = b.put_blocks(NS_A, &[1, 2, 3, 4, 5, 6, 7, 8], BLOCK);
    // One object shorter than the namespace's blocks, with a matching checksum.
    let short = b.put_blocks(NS_A, &[9], BLOCK / 2);
    let config = b.config(NS_A);
    let report = json_run("verify", &config, &[], 1);
    assert_eq!(report["namespaces"][0]["block_bytes"], BLOCK);
    assert_eq!(names_in(&report["corrupt"]), short);
    assert_eq!(report["corrupt"][0]["reason"], "length");
    assert_eq!(report["good"], 8);

    // A sample reads only N objects; lengths are still checked from the listing.
    let sample = json_run("verify", &config, &["--sample", "3"], 1);
    assert_eq!(sample["listed"], 9);
    assert_eq!(sample["read"], 3, "{sample}");
    assert_eq!(names_in(&sample["corrupt"]), short);

    // With the short object deleted, a sample of the clean namespace passes.
    let deleted = json_run("verify", &config, &["--delete"], 1);
    assert_eq!(deleted["corrupt"][0]["deleted"], true, "{deleted}");
    assert!(!b.exists(&short[0]));
    assert!(names.iter().all(|n| b.exists(n)));
    let clean = json_run("verify", &config, &["--sample", "2"], 0);
    assert_eq!(clean["read"], 2);
    assert_eq!(clean["corrupt"], json!([]));
}

/// Encrypted blocks: one corrupted at rest (its recorded checksum fails), one tampered
/// with and rewritten without a checksum, one overwritten with another block's object:
/// verify with the keyring reports the first as corrupt and the other two apart, as
/// undecryptable, and deletes only the corrupt one; without the keyring it judges none of
/// them.
pub fn verify_tells_undecryptable_objects_from_corrupt_ones(b: &Backend) {
    use kvtier_core::{JobKind, Tier};
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
    let block = 100_000;
    let tier = Tier::from_json(&with_keys).unwrap();
    let _pool = Pool::random_registered(&tier, 4, block, 11);
    assert!(run_job(&tier, JobKind::Store, 1, &[0, 1, 2, 3], &[1, 2, 3, 4]).succeeded());
    drop(tier);
    let layout = KeyLayout::new("kv", NS_A).unwrap();
    let names: Vec<String> = (1..=4)
        .map(|i| layout.object_name(&key(i)).unwrap())
        .collect();
    let clean = json_run("verify", &with_keys, &[], 0);
    assert_eq!(
        (clean["good"].as_u64(), clean["read"].as_u64()),
        (Some(4), Some(4)),
        "{clean}"
    );

    corrupt(b, &names[0]);
    let mut tampered = oob_get(&b.store(), &names[1]).unwrap();
    tampered[5000] ^= 0x01;
    oob_put(&b.store(), &names[1], tampered);
    oob_put(
        &b.store(),
        &names[2],
        oob_get(&b.store(), &names[3]).unwrap(),
    );

    let found = json_run("verify", &with_keys, &[], 1);
    assert_eq!(found["good"], 1, "{found}");
    assert_eq!(names_in(&found["corrupt"]), [names[0].clone()], "{found}");
    assert_eq!(
        names_in(&found["undecryptable"]),
        sorted(&names[1..3]),
        "{found}"
    );
    let out = kvtier_with("verify", &with_keys, &[]);
    let undecryptable_lines = stdout(&out)
        .lines()
        .filter(|l| l.starts_with("UNDECRYPTABLE") && l.contains("failed authentication"))
        .count();
    assert_eq!(undecryptable_lines, 2, "{}", stdout(&out));

    let deleted = json_run("verify", &with_keys, &["--delete"], 1);
    assert_eq!(deleted["corrupt"][0]["deleted"], true, "{deleted}");
    assert!(!b.exists(&names[0]));
    assert!(
        names[1..].iter().all(|n| b.exists(n)),
        "an undecryptable object was deleted"
    );

    // Without keys: encrypted objects are not judged (verify_encrypted.rs).
    let without_keys = json_run("verify", &b.config(NS_A), &[], 1);
    assert_eq!(without_keys["undecryptable"], json!([]), "{without_keys}");
    assert_eq!(names_in(&without_keys["encrypted"]), sorted(&names[1..]));
    assert_eq!(without_keys["read"], 3);
}
