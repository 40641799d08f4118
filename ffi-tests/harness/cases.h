/*
 * ffi-tests/harness/cases.h: every case of the harness, by the file that holds it.
 *
 * main.c lists them in the table it runs; each case file includes this header too, so
 * that the compiler sees each definition against its declaration.
 */
#ifndef KVT_HARNESS_CASES_H
#define KVT_HARNESS_CASES_H

/* cases_basics.c: version, status strings, a NULL tier, kvt_last_error() */
void test_version(void);
void test_status_str(void);
void test_null_tier(void);
void test_last_error(void);

/* cases_config.c: configurations, stores that cannot be used, key lengths, namespaces */
void test_config_errors(void);
void test_local_unwritable(void);
void test_key_bytes_any(void);
void test_vllm_namespace(void);

/* cases_jobs.c: round trips, many jobs in flight, loads that fail some keys */
void test_roundtrip_local(void);
void test_roundtrip_memory(void);
void test_many_jobs(void);
void test_partial_load(void);
void test_load_length_mismatch(void);

/* cases_submit.c: refused submissions, one result each */
void test_submit_failures_yield_one_result(void);
void test_submit_bad_args(void);
void test_duplicate_job(void);
void test_block_busy(void);
void test_state_errors(void);
void test_null_arrays_huge_num_keys(void);
void test_huge_key_len(void);
void test_job_size_and_id_extremes(void);

/* cases_results.c: the event fd and kvt_tier_poll */
void test_event_fd(void);
void test_poll_args(void);

/* cases_lifecycle.c: drain, shutdown and free, with and without jobs in flight */
void test_after_drain(void);
void test_drain_timeout(void);
void test_after_shutdown(void);
void test_shutdown_in_flight(void);
void test_shutdown_in_flight_no_grace(void);
void test_free_in_flight(void);
void test_pool_fenced(void);

/* cases_threads.c: many threads at once */
void test_threads(void);

/* cases_fork.c: a tier across fork() */
void test_fork(void);

/* cases_observability.c: counters, metrics, log records */
void test_stats(void);
void test_metrics(void);
void test_log_callback(void);

/* cases_lookups.c: lookups, KV events, clearing a namespace */
void test_lookups_and_events(void);
void test_clear(void);

/* cases_ranges.c: regions and ranges */
void test_ranges(void);
void test_ranges_on_store(void);

/* cases_random.c: random call sequences against a model */
void test_random_sequences(void);

#endif /* KVT_HARNESS_CASES_H */
