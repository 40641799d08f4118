//! Faults between kvtier and real S3 servers (s3s-fs, moto and Ceph RGW), injected by the
//! project's own proxy (`support::proxy`): dropped and reset connections, delays and
//! stalls, 500/503 answers, cut, short and corrupted bodies, a server ignoring Range, and
//! (on s3s-fs) the server killed mid-job and restarted, and conditional stores answered 412
//! after an attempt that may have stored the object.
//!
//! Every test counts: each job yields exactly one result (none lost, none twice), and no
//! key reports success with wrong bytes. Every test but the killed server, the 412
//! confirmations and the fault matrix runs on all three servers.
//!
//! One file per idea under `tests/s3_faults/`; this one lists the tests, named without the
//! file that holds them.

#[macro_use]
mod support;

#[path = "s3_faults/bodies.rs"]
mod bodies;
#[path = "s3_faults/common.rs"]
mod common;
#[path = "s3_faults/confirm.rs"]
mod confirm;
#[path = "s3_faults/fallbacks.rs"]
mod fallbacks;
#[path = "s3_faults/matrix.rs"]
mod matrix;
#[path = "s3_faults/puts.rs"]
mod puts;
#[path = "s3_faults/restart.rs"]
mod restart;
#[path = "s3_faults/retries.rs"]
mod retries;

use support::Server;

on_both_servers!(
    fallbacks::parts_of_a_large_load_fall_back_or_fail_alone,
    retries::one_percent_5xx_and_slowdown_all_jobs_succeed,
    retries::connection_resets_and_cut_bodies_are_retried,
    bodies::truncated_bodies_fail_their_key_and_never_succeed,
    retries::slow_server_times_out_without_hanging,
    retries::check_now_gives_up_at_its_timeout,
    fallbacks::direct_requests_fall_back_to_the_general_client,
    puts::interrupted_puts_are_retried_in_every_dedup_mode,
    puts::a_store_in_parts_survives_faults_or_fails_whole,
    bodies::in_transit_corruption_never_deletes,
    bodies::server_ignoring_range,
);

tests_in!(restart: server_killed_mid_job_then_restarted);
tests_in!(
    confirm: a_412_after_an_ambiguous_attempt_is_confirmed,
    a_412_over_other_bytes_after_an_ambiguous_attempt_overwrites
);
tests_in!(matrix: fault_matrix);
