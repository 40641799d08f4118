/*
 * ffi-tests/harness/cases_observability.c: what a host reads about a tier.
 *
 * kvt_tier_stats (writes at most stats_size bytes, so older and newer headers both work;
 * counts keys and bytes of stores and loads); kvt_tier_metrics (Prometheus text, its
 * size query, its counters against kvt_tier_stats); kvt_set_log_callback (records up to
 * the level reach the host's function with its userdata; NULL restores the default).
 */
#include "harness.h"

#include "cases.h"

/* ------------------------------------------------------------------------------------ */
/* Counters and metrics                                                                 */
/* ------------------------------------------------------------------------------------ */

/* kvt_tier_stats writes at most stats_size bytes (a canary past a short size stays). */
void test_stats(void)
{
    union {
        kvt_stats stats;
        unsigned char bytes[sizeof(kvt_stats) + 64];
    } u;
    fixture f;
    uint8_t *keys = make_keys(2);
    uint64_t src[2] = {0, 1}, dst[2] = {2, 3}, id;
    size_t i, sizes[] = {0, 1, 8, sizeof(kvt_stats) - 1}, k;

    if (!fixture_open(&f, "memory", 4, 4096, "")) {
        goto out;
    }
    CHECK_STATUS(kvt_tier_stats(f.tier, NULL, sizeof u.stats), KVT_STATUS_NULL_ARGUMENT);
    for (k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
        memset(u.bytes, 0xab, sizeof u.bytes);
        CHECK_STATUS(kvt_tier_stats(f.tier, &u.stats, sizes[k]), KVT_STATUS_OK);
        for (i = 0; i < sizes[k]; i++) {
            CHECKF(u.bytes[i] == 0, "stats_size %zu: byte %zu is %d (all counters are 0)", sizes[k], i, u.bytes[i]);
        }
        for (i = sizes[k]; i < sizeof u.bytes; i++) {
            if (!CHECKF(u.bytes[i] == 0xab, "stats_size %zu: byte %zu past it was written", sizes[k], i)) {
                break;
            }
        }
    }
    id = 1;
    CHECK_STATUS(kvt_tier_submit_store(f.tier, id, src, keys, KEY_LEN, 2), KVT_STATUS_OK);
    wait_ok(&f, &id, 1, scaled_ms(5000));
    id = 2;
    CHECK_STATUS(kvt_tier_submit_load(f.tier, id, dst, keys, KEY_LEN, 2), KVT_STATUS_OK);
    wait_ok(&f, &id, 1, scaled_ms(5000));
    memset(u.bytes, 0xab, sizeof u.bytes);
    /* A larger stats_size (a newer header) gets this library's counters only. */
    CHECK_STATUS(kvt_tier_stats(f.tier, &u.stats, sizeof u.bytes), KVT_STATUS_OK);
    CHECK(u.stats.keys_stored == 2 && u.stats.keys_loaded == 2);
    CHECK(u.stats.bytes_stored == 2 * 4096 && u.stats.bytes_loaded == 2 * 4096);
    CHECK(u.stats.keys_failed == 0 && u.stats.corrupt_blocks == 0);
    for (i = sizeof u.stats; i < sizeof u.bytes; i++) {
        if (!CHECKF(u.bytes[i] == 0xab, "byte %zu past kvt_stats was written", i)) {
            break;
        }
    }
out:
    free(keys);
    fixture_close(&f);
}

/* kvt_tier_metrics: the size query, the text's counters against kvt_tier_stats, NULLs. */
void test_metrics(void)
{
    fixture f;
    uint8_t *keys = make_keys(2);
    uint64_t src[2] = {0, 1}, id = 1;
    size_t len = 0, needed;
    char *buf = NULL, line[128];
    kvt_stats stats;

    if (!fixture_open(&f, "memory", 4, 4096, "")) {
        goto out;
    }
    CHECK_STATUS(kvt_tier_submit_store(f.tier, id, src, keys, KEY_LEN, 2), KVT_STATUS_OK);
    wait_ok(&f, &id, 1, scaled_ms(5000));
    CHECK_STATUS(kvt_tier_metrics(f.tier, NULL, 0, &len), KVT_STATUS_INVALID_ARGUMENT);
    CHECK(len > 0);
    needed = len + 1;
    buf = (char *)malloc(needed);
    CHECK_STATUS(kvt_tier_metrics(f.tier, buf, len, &len), KVT_STATUS_INVALID_ARGUMENT); /* no room for the NUL */
    CHECK_STATUS(kvt_tier_metrics(f.tier, buf, needed, &len), KVT_STATUS_OK);
    CHECK(strlen(buf) == len);
    CHECK_STATUS(kvt_tier_stats(f.tier, &stats, sizeof stats), KVT_STATUS_OK);
    snprintf(line, sizeof line, "\nkvtier_keys_stored_total %llu\n", (unsigned long long)stats.keys_stored);
    CHECKF(stats.keys_stored == 2 && strstr(buf, line) != NULL, "no line \"%s\" in:\n%s", line + 1, buf);
    CHECK(strstr(buf, "# TYPE kvtier_job_seconds histogram\n") != NULL);
    CHECK(strstr(buf, "kvtier_job_seconds_count{kind=\"store\"} 1\n") != NULL);
    CHECK_STATUS(kvt_tier_metrics(NULL, buf, needed, &len), KVT_STATUS_NULL_ARGUMENT);
    CHECK_STATUS(kvt_tier_metrics(f.tier, buf, needed, NULL), KVT_STATUS_NULL_ARGUMENT);
    CHECK_STATUS(kvt_tier_metrics(f.tier, NULL, 8, &len), KVT_STATUS_NULL_ARGUMENT);
out:
    free(buf);
    free(keys);
    fixture_close(&f);
}

/* ------------------------------------------------------------------------------------ */
/* Log records                                                                          */
/* ------------------------------------------------------------------------------------ */

static struct {
    int calls, bad_userdata, above_max, ready;
} log_seen;

static void count_records(void *userdata, kvt_log_level level, const char *target, const char *message)
{
    log_seen.calls++;
    log_seen.bad_userdata += userdata != (void *)&log_seen;
    log_seen.above_max += level > KVT_LOG_LEVEL_INFO;
    log_seen.ready += strncmp(target, "kvtier", 6) == 0 && strstr(message, "tier ready") != NULL;
}

/* kvt_set_log_callback: records up to max_level reach the host's function with its
 * userdata; NULL restores the default; a bad level is refused. */
void test_log_callback(void)
{
    fixture f;

    memset(&log_seen, 0, sizeof log_seen);
    CHECK_STATUS(kvt_set_log_callback(count_records, &log_seen, KVT_LOG_LEVEL_INFO), KVT_STATUS_OK);
    if (fixture_open(&f, "memory", 4, 4096, "")) {
        fixture_close(&f);
    }
    CHECK_STATUS(kvt_set_log_callback(NULL, NULL, KVT_LOG_LEVEL_OFF), KVT_STATUS_OK);
    CHECKF(log_seen.ready == 1, "tier ready records: %d of %d", log_seen.ready, log_seen.calls);
    CHECK(log_seen.bad_userdata == 0 && log_seen.above_max == 0);
    /* After the reset the old callback is never called again. */
    log_seen.calls = 0;
    if (fixture_open(&f, "memory", 4, 4096, "")) {
        fixture_close(&f);
    }
    CHECK(log_seen.calls == 0);
    CHECK_STATUS(kvt_set_log_callback(count_records, NULL, 6), KVT_STATUS_INVALID_ARGUMENT);
    CHECK_STATUS(kvt_set_log_callback(count_records, NULL, -1), KVT_STATUS_INVALID_ARGUMENT);
}
