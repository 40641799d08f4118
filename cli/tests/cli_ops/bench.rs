//! `kvtier bench` on s3s-fs with a proxy named only by its environment: every request
//! goes through the proxy, none on the direct path.

use std::process::Command;

use serde_json::{json, Value};

use crate::support::cli::*;
use crate::support::proxy::Proxy;
use crate::support::*;

/// `kvtier bench` on `config` (8 blocks of 64 KiB stored, loaded and verified), with
/// `env` added to its environment; its JSON report.
fn bench_report(config: &str, env: &[(&str, String)]) -> Value {
    let out = Command::new(kvtier_bin())
        .args(["bench", "--json", "--config", config, "--blocks", "8"])
        .args(["--block-size", "64K", "--workload", "store,load,verify"])
        .envs(env.iter().map(|(k, v)| (k, v)))
        .output()
        .expect("the kvtier binary runs");
    assert!(out.status.success(), "{}", stderr(&out));
    let report = json_of(&out);
    assert_eq!(report["verified_blocks"], 8, "{report}");
    report
}

pub fn a_proxy_in_the_environment_carries_every_request() {
    // The project's proxy in front of s3s-fs, named only by the environment: the network
    // of a host whose store is reachable through a proxy alone.
    let server = Server::s3s_fs();
    let proxy = Proxy::start(server.port());
    let config = json!({"store": server.store_json(&server.new_bucket())}).to_string();
    // Without it, the direct path carries the blocks, straight to the server.
    let report = bench_report(&config, &[]);
    assert!(
        report["direct_requests"].as_u64().unwrap() >= 16,
        "{report}"
    );
    assert_eq!(proxy.stats().requests, 0);
    // With it, every request goes through the proxy, none on the direct path.
    for variable in ["HTTP_PROXY", "all_proxy"] {
        let before = proxy.stats().requests;
        let report = bench_report(
            &config,
            &[(variable, format!("http://{}", proxy.endpoint()))],
        );
        assert_eq!(report["direct_requests"], 0, "{variable}: {report}");
        let through = proxy.stats().requests - before;
        assert!(
            through >= 16,
            "{variable}: {through} requests through the proxy"
        );
    }
}
