//! `kvtier ls` and `kvtier du`: each namespace and the total, as JSON and as text.

use std::time::Duration;

use serde_json::Value;

use crate::backend::*;
use crate::support::cli::*;
use crate::support::*;

pub fn ls_and_du_sum_each_namespace_and_the_total(b: &Backend) {
    let a = b.put_blocks(NS_A, &[1, 2, 3], BLOCK);
    b.put_blocks(NS_B, &[4, 5], 2 * BLOCK);
    // Outside the prefix, and the library's probe leftover: neither counts.
    oob_put(&b.store(), "other/x.bin", vec![1; 10]);
    oob_put(
        &b.store(),
        &format!("kv/{NS_A}/__kvtier_probe__/connectivity_test-conditional-put"),
        b"kvtier".to_vec(),
    );
    b.set_age(&a[0], Duration::from_secs(3 * 3600));
    let config = b.config(NS_A);
    let listing = json_run("ls", &config, &[], 0);
    assert_eq!(listing["prefix"], "kv");
    let namespaces = listing["namespaces"].as_array().unwrap();
    assert_eq!(namespaces.len(), 2, "{listing}");
    assert_eq!(namespaces[0]["namespace"], NS_A);
    assert_eq!(namespaces[0]["objects"], 3);
    assert_eq!(namespaces[0]["bytes"], 3 * BLOCK);
    assert_eq!(namespaces[1]["namespace"], NS_B);
    assert_eq!(namespaces[1]["objects"], 2);
    assert_eq!(namespaces[1]["bytes"], 4 * BLOCK);
    assert_eq!(listing["total"]["objects"], 5);
    assert_eq!(listing["total"]["bytes"], 7 * BLOCK);
    // The aged object is the oldest, hours before the newest.
    let time = |v: &Value| humantime::parse_rfc3339(v.as_str().unwrap()).unwrap();
    let (oldest, newest) = (
        time(&namespaces[0]["oldest"]),
        time(&namespaces[0]["newest"]),
    );
    let gap = newest.duration_since(oldest).unwrap();
    assert!(gap > Duration::from_secs(2 * 3600), "{listing}");
    assert_eq!(listing["total"]["oldest"], namespaces[0]["oldest"]);

    // The whole store: `kv` and `other` are its namespaces.
    let whole = json_run("ls", &config, &["--prefix", ""], 0);
    assert_eq!(
        each_str(&whole["namespaces"], "namespace"),
        ["kv", "other"],
        "{whole}"
    );
    assert_eq!(whole["total"]["objects"], 6);

    // du: the same numbers, as sizes; -b for exact bytes.
    let du = json_run("du", &config, &[], 0);
    assert_eq!(du["total"], listing["total"]);
    let out = kvtier_with("du", &config, &["-b"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    assert!(
        text.lines()
            .any(|l| l.trim_start().starts_with(&format!("{}  ", 7 * BLOCK))
                && l.ends_with("total under kv/")),
        "{text}"
    );
    let out = kvtier_with("ls", &config, &[]);
    let text = stdout(&out);
    assert!(text.starts_with("NAMESPACE"), "{text}");
    assert!(
        text.lines()
            .any(|l| l.starts_with("TOTAL") && l.contains(&(7 * BLOCK).to_string())),
        "{text}"
    );
}
