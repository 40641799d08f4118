//! The operator subcommands (`probe`, `ls`, `du`, `gc`, `verify`) run as processes, the
//! built `kvtier` binary, against a local directory and against a real S3 server
//! (s3s-fs). Objects are written through the library as a store job writes them
//! (checksum recorded beside the bytes); ages are set on the files that hold them (the
//! local store's, and s3s-fs's own data root), so no test waits for time to pass.
//! Also `kvtier bench` on s3s-fs with a proxy in its environment.
//!
//! One file per subcommand under `cli/tests/cli_ops/`, plus the tests on each S3 server
//! (`servers`); this one lists the tests, named without the file that holds them.

#[macro_use]
#[path = "../../tests/support/mod.rs"]
mod support;

#[path = "cli_ops/backend.rs"]
mod backend;
#[path = "cli_ops/bench.rs"]
mod bench;
#[path = "cli_ops/gc.rs"]
mod gc;
#[path = "cli_ops/ls_du.rs"]
mod ls_du;
#[path = "cli_ops/probe.rs"]
mod probe;
#[path = "cli_ops/servers.rs"]
mod servers;
#[path = "cli_ops/verify.rs"]
mod verify;
#[path = "cli_ops/verify_encrypted.rs"]
mod verify_encrypted;

use backend::Backend;

/// A test for each backend: each named body (`fn(&Backend)`, `room::name`) on a fresh
/// local directory and on a fresh s3s-fs.
macro_rules! on_both_backends {
    ($($room:ident :: $name:ident),* $(,)?) => {
        mod local {
            $( #[test] fn $name() { super::$room::$name(&super::Backend::local()); } )*
        }
        mod s3s_fs {
            $( #[test] fn $name() { super::$room::$name(&super::Backend::s3s_fs()); } )*
        }
    };
}

on_both_backends!(
    probe::probe_passes_every_check_and_leaves_nothing_behind,
    ls_du::ls_and_du_sum_each_namespace_and_the_total,
    gc::gc_older_than_deletes_exactly_the_old_objects_and_dry_run_none,
    gc::gc_max_bytes_deletes_the_oldest_first_in_one_namespace_only,
    gc::gc_older_than_zero_empties_a_prefix_and_nothing_else,
    verify::verify_finds_the_corrupt_object_and_deletes_it_on_request,
    verify::verify_reports_a_wrong_length_and_samples,
    verify::verify_tells_undecryptable_objects_from_corrupt_ones,
    verify_encrypted::verify_judges_encrypted_objects_only_with_the_keyring,
);

tests_in!(
    probe: probe_of_a_missing_bucket_fails_with_the_fix,
    probe_of_an_unreachable_endpoint_fails,
    probe_verifies_tls_against_the_ca_bundle_and_says_how_to_fix_it,
    probe_without_a_store_is_a_usage_error,
);
tests_in!(bench: a_proxy_in_the_environment_carries_every_request);
tests_in!(
    gc: gc_deletes_temporary_files_of_writes_that_never_finished,
    gc_refuses_bad_limits,
);
