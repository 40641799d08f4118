//! The `kvtier` command line, run as a process: subcommands, `bench` on the default local
//! store, option errors, `namespace` against the library, completions.

use std::path::Path;
use std::process::{Command, Output};

use serde_json::Value;

/// Runs the built `kvtier` with `args`, its temporary directory set to `tmp`.
fn kvtier_in(tmp: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_kvtier"))
        .args(args)
        .env("TMPDIR", tmp)
        .output()
        .expect("the kvtier binary runs")
}

fn kvtier(args: &[&str]) -> Output {
    let tmp = tempfile::tempdir().unwrap();
    kvtier_in(tmp.path(), args)
}

fn stdout(out: &Output) -> String {
    String::from_utf8(out.stdout.clone()).expect("stdout is UTF-8")
}

fn stderr(out: &Output) -> String {
    String::from_utf8(out.stderr.clone()).expect("stderr is UTF-8")
}

#[test]
fn help_lists_the_subcommands() {
    let out = kvtier(&["--help"]);
    assert!(out.status.success(), "--help failed: {}", stderr(&out));
    let help = stdout(&out);
    for sub in [
        "bench",
        "probe",
        "ls",
        "du",
        "gc",
        "verify",
        "namespace",
        "completions",
        "version",
    ] {
        assert!(
            help.lines().any(|l| l.trim_start().starts_with(sub)),
            "--help does not list {sub}:\n{help}"
        );
    }
}

#[test]
fn no_arguments_prints_help_and_fails() {
    let out = kvtier(&[]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("Usage: kvtier"), "{}", stderr(&out));
}

#[test]
fn version_flag_and_subcommand() {
    let expected = format!("kvtier {}\n", kvtier_core::VERSION);
    for args in [&["--version"][..], &["-V"], &["version"]] {
        let out = kvtier(args);
        assert!(out.status.success(), "{args:?}: {}", stderr(&out));
        assert_eq!(stdout(&out), expected, "{args:?}");
    }
}

#[test]
fn bench_help_lists_every_option() {
    let out = kvtier(&["bench", "--help"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let help = stdout(&out);
    for option in [
        "--blocks",
        "--block-size",
        "--keys-per-job",
        "--concurrency",
        "--workload",
        "--repeat",
        "--duration",
        "--key-sets",
        "--ranges-per-block",
        "--range-layout",
        "--no-checksums",
        "--config",
        "--config-file",
        "--json",
    ] {
        assert!(
            help.contains(option),
            "bench --help lacks {option}:\n{help}"
        );
    }
    assert!(help.contains("[default: 256]"), "{help}");
    assert!(help.contains("[default: 1M]"), "{help}");
    assert!(
        help.contains("[default: store,exists,load,verify]"),
        "{help}"
    );
}

#[test]
fn bench_json_on_the_default_local_store_verifies_every_block() {
    let tmp = tempfile::tempdir().unwrap();
    let out = kvtier_in(
        tmp.path(),
        &["bench", "--blocks", "8", "--block-size", "64K", "--json"],
    );
    assert!(out.status.success(), "bench failed: {}", stderr(&out));
    let report: Value = serde_json::from_str(stdout(&out).trim()).expect("one JSON object");
    assert_eq!(report["blocks"], 8);
    assert_eq!(report["block_bytes"], 64 * 1024);
    assert_eq!(report["keys_per_job"], 1);
    assert_eq!(report["concurrency"], 16);
    assert_eq!(report["repeat"], 1);
    assert_eq!(report["rounds"], 1);
    assert_eq!(report["checksums"], true);
    assert_eq!(report["verified_blocks"], 8);
    assert_eq!(report["corrupt_blocks"], 0);
    // The local store refuses a second create (rename without replace): conditional dedup;
    // one round of fresh keys skips none, and there is no direct HTTP path.
    assert_eq!(report["dedup_mode"], "conditional");
    assert_eq!(report["dedup_known"], 0);
    assert_eq!(report["dedup_already_stored"], 0);
    assert_eq!(report["direct_requests"], 0);
    assert_eq!(report["direct_fallbacks"], 0);
    let phases: Vec<&str> = report["phases"]
        .as_array()
        .expect("phases is an array")
        .iter()
        .map(|p| p["phase"].as_str().unwrap())
        .collect();
    assert_eq!(phases, ["store", "exists", "load"]);
    for phase in report["phases"].as_array().unwrap() {
        if phase["phase"] != "exists" {
            assert_eq!(phase["ops"], 8, "{phase}");
            assert_eq!(phase["bytes"], 8 * 64 * 1024, "{phase}");
        }
    }
    // The default store lives in the temporary directory and is removed afterwards.
    let left: Vec<_> = std::fs::read_dir(tmp.path()).unwrap().collect();
    assert!(left.is_empty(), "bench left {left:?} behind");
}

#[test]
fn bench_moves_blocks_as_ranges_in_either_layout() {
    for layout in ["layer-first", "adjacent"] {
        let tmp = tempfile::tempdir().unwrap();
        let out = kvtier_in(
            tmp.path(),
            &[
                "bench",
                "--blocks",
                "8",
                "--block-size",
                "64K",
                "--ranges-per-block",
                "16",
                "--range-layout",
                layout,
                "--workload",
                "store,load,verify",
                "--json",
            ],
        );
        assert!(out.status.success(), "bench failed: {}", stderr(&out));
        let report: Value = serde_json::from_str(stdout(&out).trim()).expect("one JSON object");
        assert_eq!(report["ranges_per_block"], 16);
        assert_eq!(report["range_layout"], layout);
        assert_eq!(report["verified_blocks"], 8, "{report}");
        for phase in report["phases"].as_array().unwrap() {
            assert_eq!(phase["bytes"], 8 * 64 * 1024, "{phase}");
        }
    }
    let out = kvtier(&["bench", "--blocks", "2", "--block-size", "64K", "--json"]);
    assert!(out.status.success(), "bench failed: {}", stderr(&out));
    let report: Value = serde_json::from_str(stdout(&out).trim()).expect("one JSON object");
    assert_eq!(report["range_layout"], "contiguous");
    let out = kvtier(&["bench", "--block-size", "64K", "--ranges-per-block", "3"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr(&out).contains("does not divide into 3 ranges"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn bench_text_table() {
    let out = kvtier(&[
        "bench",
        "--blocks",
        "4",
        "--block-size",
        "4096",
        "--keys-per-job",
        "2",
        "--workload",
        "store, load,verify",
        "--repeat",
        "2",
        "--no-checksums",
    ]);
    assert!(out.status.success(), "bench failed: {}", stderr(&out));
    let text = stdout(&out);
    assert!(
        text.starts_with(
            "kvtier bench: 4 blocks of 4 KiB x 2 round(s), 2 key(s) per job, 16 jobs in flight, checksums off\n"
        ),
        "{text}"
    );
    assert!(text.contains("\n  store "), "{text}");
    assert!(text.contains("\n  load "), "{text}");
    assert!(!text.contains("\n  exists "), "{text}");
    assert!(
        text.contains("verified: 8 of 8 blocks byte-exact after the round trip"),
        "{text}"
    );
    assert!(
        text.lines()
            .any(|l| l.starts_with("  dedup: ")
                && l.ends_with("direct path: 0 requests, 0 fallbacks")),
        "{text}"
    );
}

#[test]
fn bench_with_a_config_file() {
    let tmp = tempfile::tempdir().unwrap();
    let config = tmp.path().join("config.json");
    std::fs::write(&config, r#"{"store": {"type": "memory"}}"#).unwrap();
    let out = kvtier_in(
        tmp.path(),
        &[
            "bench",
            "--blocks",
            "4",
            "--block-size",
            "4K",
            "--json",
            "--config-file",
            config.to_str().unwrap(),
        ],
    );
    assert!(out.status.success(), "bench failed: {}", stderr(&out));
    let report: Value = serde_json::from_str(stdout(&out).trim()).unwrap();
    assert_eq!(report["verified_blocks"], 4);
}

/// Runs `kvtier bench` with `args`, expects a usage failure naming `option` on stderr and
/// nothing on stdout.
fn assert_bench_refuses(args: &[&str], option: &str) {
    let mut all = vec!["bench"];
    all.extend_from_slice(args);
    let out = kvtier(&all);
    assert!(!out.status.success(), "{args:?} succeeded");
    assert_eq!(out.status.code(), Some(2), "{args:?}");
    assert!(
        stderr(&out).contains(option),
        "{args:?}: error does not name {option}: {}",
        stderr(&out)
    );
    assert!(stdout(&out).is_empty(), "{args:?} printed {}", stdout(&out));
}

#[test]
fn bench_refuses_bad_options() {
    assert_bench_refuses(&["--blocks", "0"], "--blocks");
    assert_bench_refuses(&["--blocks", "many"], "--blocks");
    assert_bench_refuses(&["--block-size", "3Q"], "--block-size");
    assert_bench_refuses(&["--block-size", "0"], "--block-size");
    assert_bench_refuses(&["--keys-per-job", "0"], "--keys-per-job");
    assert_bench_refuses(&["--concurrency", "0"], "--concurrency");
    assert_bench_refuses(&["--repeat", "0"], "--repeat");
    assert_bench_refuses(&["--duration", "soon"], "--duration");
    assert_bench_refuses(&["--workload", "store,fetch"], "--workload");
    assert_bench_refuses(&["--workload", "load,store"], "--workload");
    assert_bench_refuses(&["--workload", "verify"], "--workload");
    assert_bench_refuses(&["--blocks"], "--blocks");
    assert_bench_refuses(&["--frobnicate"], "--frobnicate");
    assert_bench_refuses(&["--ranges-per-block", "0"], "--ranges-per-block");
    assert_bench_refuses(&["--range-layout", "diagonal"], "--range-layout");
    assert_bench_refuses(&["--config", "{}", "--config-file", "x.json"], "--config");
}

#[test]
fn bench_error_messages() {
    let out = kvtier(&["bench", "--workload", "store,fetch"]);
    assert!(
        stderr(&out).contains("unknown phase \"fetch\""),
        "{}",
        stderr(&out)
    );
    let out = kvtier(&["bench", "--workload", "load,store"]);
    assert!(
        stderr(&out).contains("phase load needs a store phase before it"),
        "{}",
        stderr(&out)
    );

    let out = kvtier(&["bench", "--config", "not json"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr(&out).starts_with("kvtier bench: --config is not JSON"),
        "{}",
        stderr(&out)
    );

    let tmp = tempfile::tempdir().unwrap();
    let missing = tmp.path().join("missing.json");
    let out = kvtier(&["bench", "--config-file", missing.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr(&out).starts_with(&format!("kvtier bench: {}: ", missing.display())),
        "{}",
        stderr(&out)
    );
}

#[test]
fn namespace_matches_the_library() {
    let doc: Value = serde_json::from_str(include_str!("../../tests/vectors/namespace.json"))
        .expect("vectors parse");
    let vectors = doc["vectors"].as_array().unwrap();
    assert!(!vectors.is_empty());
    let tmp = tempfile::tempdir().unwrap();
    for (i, v) in vectors.iter().enumerate() {
        let fields = &v["fields"];
        let rank = v["rank"].as_u64().unwrap() as u32;
        let expected = kvtier_core::namespace::vllm_namespace(fields, rank).unwrap();
        // The library agrees with Python; the command line must agree with the library.
        assert_eq!(expected, v["namespace"].as_str().unwrap());

        let text = fields.to_string();
        let rank_text = rank.to_string();
        let out = kvtier(&["namespace", "--fields", &text, "--rank", &rank_text]);
        assert!(out.status.success(), "{}", stderr(&out));
        assert_eq!(stdout(&out), format!("{expected}\n"));

        let path = tmp.path().join(format!("fields-{i}.json"));
        std::fs::write(&path, serde_json::to_string_pretty(fields).unwrap()).unwrap();
        let out = kvtier(&[
            "namespace",
            "--fields-file",
            path.to_str().unwrap(),
            "--rank",
            &rank_text,
            "--json",
        ]);
        assert!(out.status.success(), "{}", stderr(&out));
        let answer: Value = serde_json::from_str(stdout(&out).trim()).unwrap();
        assert_eq!(answer, serde_json::json!({ "namespace": expected }));
    }

    // The rank defaults to 0.
    let fields = serde_json::json!({"model_name": "org/model", "tp_size": 4});
    let out = kvtier(&["namespace", "--fields", &fields.to_string()]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(
        stdout(&out).trim_end(),
        kvtier_core::namespace::vllm_namespace(&fields, 0).unwrap()
    );
}

#[test]
fn namespace_refuses_bad_input() {
    let out = kvtier(&["namespace", "--fields", r#"{"tp_size": 1}"#]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr(&out).starts_with("kvtier namespace: ") && stderr(&out).contains("model_name"),
        "{}",
        stderr(&out)
    );

    let out = kvtier(&["namespace", "--fields", "{"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr(&out).contains("--fields is not JSON"),
        "{}",
        stderr(&out)
    );

    let out = kvtier(&["namespace"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("--fields"), "{}", stderr(&out));

    let out = kvtier(&["namespace", "--fields", "{}", "--fields-file", "f.json"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("--fields-file"), "{}", stderr(&out));

    let out = kvtier(&["namespace", "--fields", "{}", "--rank", "-1"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stdout(&out).is_empty());
}

#[test]
fn completions_for_bash_and_zsh() {
    for shell in ["bash", "zsh"] {
        let out = kvtier(&["completions", shell]);
        assert!(out.status.success(), "{shell}: {}", stderr(&out));
        let script = stdout(&out);
        assert!(script.contains("kvtier"), "{shell}: {script}");
        assert!(script.contains("--block-size"), "{shell}: {script}");
        assert!(script.contains("--fields-file"), "{shell}: {script}");
    }
    let out = kvtier(&["completions", "tcsh"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("tcsh"), "{}", stderr(&out));
}

#[test]
fn config_check_reads_the_keyring_as_a_tier_start_does() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("missing.json");
    let config = |encryption: Value| {
        serde_json::json!({"store": {"type": "memory"}, "encryption": encryption}).to_string()
    };
    // A keyring file that does not exist: refused as a configuration error, naming it.
    let out = kvtier(&[
        "config",
        "check",
        "--config",
        &config(serde_json::json!({"keyring_file": missing})),
    ]);
    assert_eq!(out.status.code(), Some(2), "{}", stdout(&out));
    assert!(
        stderr(&out).contains(&format!(
            "cannot read the keyring file {}",
            missing.display()
        )),
        "{}",
        stderr(&out)
    );
    // A key pasted where the variable's name belongs is not echoed.
    let key = "q83vEjRWeJCrze8SNFZ4kKvN7xI0VniQq83vEjRWeJA=";
    let out = kvtier(&[
        "config",
        "check",
        "--config",
        &config(serde_json::json!({"keyring_env": key})),
    ]);
    assert_eq!(out.status.code(), Some(2), "{}", stdout(&out));
    assert!(
        stderr(&out).contains("keyring_env") && !stderr(&out).contains(&key[..12]),
        "{}",
        stderr(&out)
    );
    // The keyring file written: ok.
    let ring = dir.path().join("keyring.json");
    std::fs::write(
        &ring,
        format!(r#"{{"write": "k1", "keys": {{"k1": "{key}"}}}}"#),
    )
    .unwrap();
    let out = kvtier(&[
        "config",
        "check",
        "--config",
        &config(serde_json::json!({"keyring_file": ring})),
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(stdout(&out).trim(), "ok");
}
