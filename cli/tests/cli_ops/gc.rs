//! `kvtier gc`: by age (and as a dry run), leftover temporary files, by budget in one
//! namespace, a whole prefix, and the limits it refuses.

use std::time::Duration;

use serde_json::json;

use crate::backend::*;
use crate::support::cli::*;
use crate::support::*;

pub fn gc_older_than_deletes_exactly_the_old_objects_and_dry_run_none(b: &Backend) {
    let names = b.put_blocks(NS_A, &[1, 2, 3, 4, 5, 6, 7], BLOCK);
    let (old, new) = names.split_at(4);
    for name in old {
        b.set_age(name, Duration::from_secs(3 * 3600));
    }
    let config = b.config(NS_A);

    let dry = json_run("gc", &config, &["--older-than", "2h", "--dry-run"], 0);
    assert_eq!(dry["dry_run"], true);
    assert_eq!(dry["listed_objects"], 7);
    assert_eq!(dry["selected_objects"], 4, "{dry}");
    assert_eq!(dry["deleted_objects"], 0);
    assert_eq!(names_in(&dry["objects"]), sorted(old));
    assert!(dry["objects"]
        .as_array()
        .unwrap()
        .iter()
        .all(|o| o["reason"] == "age"));
    assert!(names.iter().all(|n| b.exists(n)), "a dry run deleted");

    let out = kvtier_with("gc", &config, &["--older-than", "2h", "--json"]);
    assert!(out.status.success(), "{}", stderr(&out));
    // Deleted in batches (s3s-fs takes DeleteObjects), not one by one after a refusal.
    assert!(!stderr(&out).contains("refused"), "{}", stderr(&out));
    let done = json_of(&out);
    assert_eq!(done["deleted_objects"], 4, "{done}");
    assert_eq!(done["deleted_bytes"], 4 * BLOCK);
    assert_eq!(done["remaining_objects"], 3);
    assert_eq!(done["failed"], json!([]));
    for name in old {
        assert!(!b.exists(name), "{name} was kept");
    }
    for name in new {
        assert!(b.exists(name), "{name} was deleted");
    }
    // Again: nothing left that old.
    let again = json_run("gc", &config, &["--older-than", "2h"], 0);
    assert_eq!(again["deleted_objects"], 0);
    assert_eq!(again["listed_objects"], 3);
}

/// A crash between a block's write and its rename leaves a temporary file beside the
/// blocks; gc deletes those an hour old (never a younger one, which may be a running
/// engine's write in progress) and no object that its limits keep.
pub fn gc_deletes_temporary_files_of_writes_that_never_finished() {
    let b = Backend::local();
    let names = b.put_blocks(NS_A, &[1, 2, 3], BLOCK);
    let shard = std::path::Path::new(&names[0]).parent().unwrap();
    let old = shard
        .join(".kvtier-tmp-7-18c2f3a1b2c3d4e5-0-0")
        .display()
        .to_string();
    let young = shard
        .join(".kvtier-tmp-7-18c2f3a1b2c3d4e5-0-1")
        .display()
        .to_string();
    for temp in [&old, &young] {
        std::fs::write(b.file(temp), vec![1u8; 100]).unwrap();
    }
    b.set_age(&old, Duration::from_secs(2 * 3600));
    b.set_age(&young, Duration::from_secs(10 * 60));
    let config = b.config(NS_A);

    let dry = json_run("gc", &config, &["--older-than", "7d", "--dry-run"], 0);
    assert_eq!(
        names_in(&dry["leftover_temporary_files"]),
        vec![old.clone()]
    );
    assert_eq!(dry["deleted_leftover_temporary_files"], 0);
    assert!(b.file(&old).exists(), "a dry run deleted");

    let done = json_run("gc", &config, &["--older-than", "7d"], 0);
    assert_eq!(done["deleted_objects"], 0, "{done}");
    assert_eq!(done["deleted_leftover_temporary_files"], 1, "{done}");
    assert_eq!(done["leftover_temporary_files"][0]["deleted"], true);
    assert!(!b.file(&old).exists(), "the old temporary file was kept");
    assert!(
        b.file(&young).exists(),
        "a temporary file under an hour old was deleted"
    );
    assert!(names.iter().all(|n| b.exists(n)), "a block was deleted");
    // Temporary files are never counted as the tier's objects.
    assert_eq!(done["listed_objects"], 3);
}

pub fn gc_max_bytes_deletes_the_oldest_first_in_one_namespace_only(b: &Backend) {
    let names = b.put_blocks(NS_A, &[1, 2, 3, 4, 5], BLOCK);
    // names[0] is the oldest (5 h), names[4] the newest (1 h).
    for (i, name) in names.iter().enumerate() {
        b.set_age(name, Duration::from_secs((5 - i as u64) * 3600));
    }
    let other = b.put_blocks(NS_B, &[6, 7], BLOCK);
    for name in &other {
        b.set_age(name, Duration::from_secs(10 * 3600));
    }
    // The configuration names NS_B; --namespace picks NS_A.
    let config = b.config(NS_B);
    let done = json_run(
        "gc",
        &config,
        &["--namespace", NS_A, "--max-bytes", &(2 * BLOCK).to_string()],
        0,
    );
    assert_eq!(done["scope"], format!("kv/{NS_A}"));
    assert_eq!(done["deleted_objects"], 3, "{done}");
    assert_eq!(done["remaining_bytes"], 2 * BLOCK);
    assert_eq!(each_str(&done["objects"], "reason"), ["budget"; 3]);
    // Oldest first, in the order they were listed for deletion.
    assert_eq!(
        each_str(&done["objects"], "name"),
        [&names[0], &names[1], &names[2]]
    );
    for name in &names[..3] {
        assert!(!b.exists(name), "{name} was kept");
    }
    for name in names[3..].iter().chain(&other) {
        assert!(b.exists(name), "{name} was deleted");
    }
    // "4K" is read as 4096 bytes: one block stays.
    let done = json_run(
        "gc",
        &config,
        &["--namespace", NS_A, "--max-bytes", "4K"],
        0,
    );
    assert_eq!(done["deleted_objects"], 1);
    assert!(!b.exists(&names[3]) && b.exists(&names[4]));
}

pub fn gc_older_than_zero_empties_a_prefix_and_nothing_else(b: &Backend) {
    let a = b.put_blocks(NS_A, &[1, 2], BLOCK);
    let bb = b.put_blocks(NS_B, &[3], BLOCK);
    oob_put(&b.store(), "other/x.bin", vec![1; 10]);
    let config = b.config(NS_A);
    // Without a limit, gc refuses to run.
    let out = kvtier_with("gc", &config, &["--prefix", "kv"]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(b.exists(&a[0]));

    let out = kvtier_with("gc", &config, &["--prefix", "kv", "--older-than", "0s"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        stdout(&out).starts_with("deleted 3 objects"),
        "{}",
        stdout(&out)
    );
    for name in a.iter().chain(&bb) {
        assert!(!b.exists(name), "{name} was kept");
    }
    assert!(b.exists("other/x.bin"), "gc went outside its prefix");
    let listing = json_run("ls", &config, &[], 0);
    assert_eq!(listing["total"]["objects"], 0, "{listing}");
}

pub fn gc_refuses_bad_limits() {
    let b = Backend::local();
    let config = b.config(NS_A);
    for (args, option) in [
        (&["--older-than", "7"][..], "--older-than"),
        (&["--max-bytes", "lots"], "--max-bytes"),
        (&["--before", "yesterday"], "--before"),
    ] {
        let out = kvtier_with("gc", &config, args);
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        assert!(stderr(&out).contains(option), "{args:?}: {}", stderr(&out));
    }
    // A configuration without prefix and namespace would mean the whole store.
    let bare = json!({"store": b.store()}).to_string();
    let out = kvtier_with("gc", &bare, &["--older-than", "0s"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("--prefix ''"), "{}", stderr(&out));
}
