/*
 * ffi-tests/harness/cases_lookups.c: lookups, KV events and clearing a namespace.
 *
 * kvt_tier_lookup answers RETRY until a scheduler step has ended, then HIT or MISS;
 * kvt_tier_check_now answers at once, in key order; successful store jobs (only they)
 * yield one BlockStored event each, after their result is polled; kvt_tier_clear deletes
 * every block of the namespace and nothing else, each deletion a BlockRemoved event.
 */
#include "harness.h"

#include "cases.h"

#include <poll.h>
#include <unistd.h>

/* ------------------------------------------------------------------------------------ */
/* Lookups and stored-block events                                                      */
/* ------------------------------------------------------------------------------------ */

/* Lookups answer RETRY until a step has ended, then HIT or MISS; successful store jobs
 * (only they) yield one BlockStored event each, holding the job's keys in order. */
void test_lookups_and_events(void)
{
    fixture f;
    uint8_t *keys = make_keys(3); /* 0 and 1 stored, 2 absent */
    uint64_t ids[2] = {0, 1}, bad = 99, id;
    kvt_lookup_result hit = KVT_LOOKUP_RESULT_RETRY, miss = KVT_LOOKUP_RESULT_RETRY, v;
    kvt_event events[4];
    size_t n = 9;
    double deadline;

    if (!fixture_open(&f, "memory", 2, 4096, ",\"enable_kv_events\":true,\"locality\":\"REMOTE\"")) {
        goto out;
    }
    id = 1;
    CHECK_STATUS(kvt_tier_submit_store(f.tier, id, ids, keys, KEY_LEN, 2), KVT_STATUS_OK);
    CHECK_STATUS(kvt_tier_take_events(f.tier, events, 4, &n), KVT_STATUS_OK);
    CHECK(n == 0); /* an event follows the polled result, not the I/O */
    wait_ok(&f, &id, 1, scaled_ms(5000));
    CHECK_STATUS(kvt_tier_submit_store(f.tier, 2, &bad, keys, KEY_LEN, 1), KVT_STATUS_INVALID_ARGUMENT);
    id = 3;
    CHECK_STATUS(kvt_tier_submit_load(f.tier, id, ids, keys, KEY_LEN, 1), KVT_STATUS_OK);
    CHECK(collect(&f, 2, scaled_ms(5000), 4, NULL, 0, NULL) == 2);

    n = 9;
    CHECK_STATUS(kvt_tier_take_events(f.tier, NULL, 4, &n), KVT_STATUS_NULL_ARGUMENT);
    CHECK(n == 0);
    CHECK_STATUS(kvt_tier_take_events(f.tier, events, 4, NULL), KVT_STATUS_NULL_ARGUMENT);
    n = 9;
    CHECK_STATUS(kvt_tier_take_events(f.tier, NULL, 0, &n), KVT_STATUS_OK);
    CHECK(n == 0);
    CHECK_STATUS(kvt_tier_take_events(f.tier, events, 4, &n), KVT_STATUS_OK);
    if (CHECKF(n == 1, "%zu events for one successful store", n)) {
        CHECK(events[0].job_id == 1 && events[0].num_keys == 2 && events[0].key_len == KEY_LEN);
        CHECK(memcmp(events[0].keys, keys, 2 * KEY_LEN) == 0);
        CHECK(events[0].medium != NULL && strcmp(events[0].medium, "STORAGE") == 0);
        CHECK(events[0].locality == KVT_LOCALITY_REMOTE);
    }
    CHECK_STATUS(kvt_tier_take_events(f.tier, events, 4, &n), KVT_STATUS_OK);
    CHECK(n == 0);

    CHECK_STATUS(kvt_tier_lookup(f.tier, 7, NULL, KEY_LEN, &v), KVT_STATUS_NULL_ARGUMENT);
    CHECK_STATUS(kvt_tier_lookup(f.tier, 7, keys, KEY_LEN, NULL), KVT_STATUS_NULL_ARGUMENT);
    CHECK_STATUS(kvt_tier_lookup(f.tier, 7, keys, KEY_LEN - 1, &v), KVT_STATUS_INVALID_ARGUMENT);
    /* One scheduler step after another until both are known (the answers arrive from the
     * lookup lane; there is nothing to wait on but the next step). */
    deadline = now_ms() + scaled_ms(10000);
    while ((hit == KVT_LOOKUP_RESULT_RETRY || miss == KVT_LOOKUP_RESULT_RETRY) && now_ms() < deadline) {
        CHECK_STATUS(kvt_tier_lookup(f.tier, 7, keys + KEY_LEN, KEY_LEN, &hit), KVT_STATUS_OK);
        CHECK_STATUS(kvt_tier_lookup(f.tier, 7, keys + 2 * KEY_LEN, KEY_LEN, &miss), KVT_STATUS_OK);
        CHECK_STATUS(kvt_tier_schedule_end(f.tier), KVT_STATUS_OK);
        poll(NULL, 0, 1);
    }
    CHECKF(hit == KVT_LOOKUP_RESULT_HIT, "stored key: %d", (int)hit);
    CHECKF(miss == KVT_LOOKUP_RESULT_MISS, "absent key: %d", (int)miss);
    /* The same verdicts in one batch call; nothing written on error. */
    {
        const uint64_t reqs[2] = {7, 7};
        kvt_lookup_result both[2] = {KVT_LOOKUP_RESULT_RETRY, KVT_LOOKUP_RESULT_RETRY};
        kvt_lookup_result untouched[2] = {KVT_LOOKUP_RESULT_RETRY, KVT_LOOKUP_RESULT_RETRY};
        CHECK_STATUS(kvt_tier_lookup_batch(f.tier, reqs, keys + KEY_LEN, KEY_LEN, 2, both), KVT_STATUS_OK);
        CHECKF(both[0] == KVT_LOOKUP_RESULT_HIT && both[1] == KVT_LOOKUP_RESULT_MISS,
               "lookup_batch verdicts %d %d, want HIT MISS", (int)both[0], (int)both[1]);
        CHECK_STATUS(kvt_tier_lookup_batch(f.tier, NULL, keys, KEY_LEN, 2, untouched), KVT_STATUS_NULL_ARGUMENT);
        CHECK_STATUS(kvt_tier_lookup_batch(f.tier, reqs, NULL, KEY_LEN, 2, untouched), KVT_STATUS_NULL_ARGUMENT);
        CHECK_STATUS(kvt_tier_lookup_batch(f.tier, reqs, keys, KEY_LEN, 2, NULL), KVT_STATUS_NULL_ARGUMENT);
        CHECK_STATUS(kvt_tier_lookup_batch(f.tier, reqs, keys, KEY_LEN - 1, 2, untouched), KVT_STATUS_INVALID_ARGUMENT);
        CHECK_STATUS(kvt_tier_lookup_batch(f.tier, reqs, keys, KEY_LEN, SIZE_MAX, untouched),
                     KVT_STATUS_INVALID_ARGUMENT);
        CHECK(untouched[0] == KVT_LOOKUP_RESULT_RETRY && untouched[1] == KVT_LOOKUP_RESULT_RETRY);
        CHECK_STATUS(kvt_tier_lookup_batch(f.tier, NULL, NULL, KEY_LEN, 0, NULL), KVT_STATUS_OK);
        CHECK_STATUS(kvt_tier_lookup_batch(NULL, reqs, keys, KEY_LEN, 1, both), KVT_STATUS_NULL_ARGUMENT);
    }
    /* Pins: argument checks (their effect on eviction is tested in Rust and C++). */
    {
        uint8_t held[2] = {7, 7};
        CHECK_STATUS(kvt_tier_pin(f.tier, keys, KEY_LEN, 2, held), KVT_STATUS_OK);
        CHECK(held[0] == 1 && held[1] == 1);
    }
    CHECK_STATUS(kvt_tier_unpin(f.tier, keys, KEY_LEN, 3), KVT_STATUS_OK); /* one never pinned */
    CHECK_STATUS(kvt_tier_pin(f.tier, NULL, KEY_LEN, 1, NULL), KVT_STATUS_NULL_ARGUMENT);
    CHECK_STATUS(kvt_tier_pin(f.tier, NULL, KEY_LEN, 0, NULL), KVT_STATUS_OK);
    CHECK_STATUS(kvt_tier_pin(f.tier, keys, KEY_LEN - 1, 1, NULL), KVT_STATUS_INVALID_ARGUMENT);
    CHECK_STATUS(kvt_tier_pin(f.tier, keys, KEY_LEN, SIZE_MAX, NULL), KVT_STATUS_INVALID_ARGUMENT);
    CHECK_STATUS(kvt_tier_unpin(f.tier, keys, SIZE_MAX, 1), KVT_STATUS_INVALID_ARGUMENT);
    CHECK_STATUS(kvt_tier_unpin(NULL, keys, KEY_LEN, 1), KVT_STATUS_NULL_ARGUMENT);
    CHECK_STATUS(kvt_tier_request_finished(f.tier, 7), KVT_STATUS_OK);
    CHECK_STATUS(kvt_tier_request_finished(f.tier, 12345), KVT_STATUS_OK); /* unknown: ignored */

    /* The blocking check: verdicts in key order, nothing written on error. */
    {
        kvt_lookup_result now[3] = {KVT_LOOKUP_RESULT_RETRY, KVT_LOOKUP_RESULT_RETRY, KVT_LOOKUP_RESULT_RETRY};
        kvt_lookup_result untouched[2] = {KVT_LOOKUP_RESULT_HIT, KVT_LOOKUP_RESULT_HIT};
        CHECK_STATUS(kvt_tier_check_now(f.tier, keys, KEY_LEN, 3, (uint64_t)scaled_ms(10000), now), KVT_STATUS_OK);
        CHECKF(now[0] == KVT_LOOKUP_RESULT_HIT && now[1] == KVT_LOOKUP_RESULT_HIT && now[2] == KVT_LOOKUP_RESULT_MISS,
               "check_now verdicts %d %d %d, want HIT HIT MISS", (int)now[0], (int)now[1], (int)now[2]);
        CHECK_STATUS(kvt_tier_check_now(f.tier, NULL, KEY_LEN, 2, 1000, untouched), KVT_STATUS_NULL_ARGUMENT);
        CHECK_STATUS(kvt_tier_check_now(f.tier, keys, KEY_LEN, 2, 1000, NULL), KVT_STATUS_NULL_ARGUMENT);
        CHECK_STATUS(kvt_tier_check_now(f.tier, keys, KEY_LEN - 1, 2, 1000, untouched), KVT_STATUS_INVALID_ARGUMENT);
        CHECK_STATUS(kvt_tier_check_now(f.tier, keys, 0, 2, 1000, untouched), KVT_STATUS_INVALID_ARGUMENT);
        CHECK_STATUS(kvt_tier_check_now(f.tier, keys, SIZE_MAX, 2, 1000, untouched), KVT_STATUS_INVALID_ARGUMENT);
        /* Huge counts are refused before `keys` is read (it holds three keys). */
        CHECK_STATUS(kvt_tier_check_now(f.tier, keys, KEY_LEN, KVT_MAX_KEYS_PER_JOB + 1, 1000, untouched),
                     KVT_STATUS_INVALID_ARGUMENT);
        CHECK_STATUS(kvt_tier_check_now(f.tier, keys, KEY_LEN, SIZE_MAX, 1000, untouched), KVT_STATUS_INVALID_ARGUMENT);
        CHECK(untouched[0] == KVT_LOOKUP_RESULT_HIT && untouched[1] == KVT_LOOKUP_RESULT_HIT);
        CHECK_STATUS(kvt_tier_check_now(f.tier, NULL, KEY_LEN, 0, 1000, NULL), KVT_STATUS_OK);
        CHECK_STATUS(kvt_tier_check_now(NULL, keys, KEY_LEN, 1, 1000, now), KVT_STATUS_NULL_ARGUMENT);
    }
out:
    free(keys);
    fixture_close(&f);
}

/* ------------------------------------------------------------------------------------ */
/* Clearing a namespace                                                                 */
/* ------------------------------------------------------------------------------------ */

/* kvt_tier_clear deletes every block of the namespace (and nothing else under it), each
 * a BlockRemoved event; it refuses NULL and calls after shutdown, zeroing the report. */
void test_clear(void)
{
    fixture f;
    uint8_t *keys = make_keys(3);
    uint64_t ids[3] = {0, 1, 2}, id = 1;
    kvt_eviction_report report;
    kvt_lookup_result now[3];
    kvt_kv_event events[8];
    size_t n = 0, i, removed = 0;
    char other[1200];
    FILE *fp;

    if (!fixture_open(&f, "local", 3, 4096, ",\"enable_kv_events\":true,\"prefix\":\"p\"")) {
        goto out;
    }
    CHECK_STATUS(kvt_tier_submit_store(f.tier, id, ids, keys, KEY_LEN, 3), KVT_STATUS_OK);
    wait_ok(&f, &id, 1, scaled_ms(5000));
    /* Not a block: clear leaves it alone. */
    snprintf(other, sizeof other, "%s/store/p/notes.txt", f.dir);
    fp = fopen(other, "w");
    if (CHECK(fp != NULL)) {
        fputs("not a block", fp);
        fclose(fp);
    }
    CHECK_STATUS(kvt_tier_clear(f.tier, NULL), KVT_STATUS_NULL_ARGUMENT);
    CHECK_STATUS(kvt_tier_clear(NULL, &report), KVT_STATUS_NULL_ARGUMENT);
    memset(&report, 0xff, sizeof report);
    CHECK_STATUS(kvt_tier_clear(f.tier, &report), KVT_STATUS_OK);
    CHECKF(report.objects == 3 && report.deleted == 3 && report.deleted_bytes == 3 * 4096,
           "report: %llu objects, %llu deleted, %llu bytes", (unsigned long long)report.objects,
           (unsigned long long)report.deleted, (unsigned long long)report.deleted_bytes);
    CHECK(access(other, F_OK) == 0);
    CHECK_STATUS(kvt_tier_check_now(f.tier, keys, KEY_LEN, 3, (uint64_t)scaled_ms(10000), now), KVT_STATUS_OK);
    CHECK(now[0] == KVT_LOOKUP_RESULT_MISS && now[1] == KVT_LOOKUP_RESULT_MISS && now[2] == KVT_LOOKUP_RESULT_MISS);
    CHECK_STATUS(kvt_tier_take_kv_events(f.tier, events, 8, &n), KVT_STATUS_OK);
    for (i = 0; i < n; i++) {
        removed += events[i].removed ? events[i].event.num_keys : 0;
    }
    CHECKF(removed == 3, "%zu keys removed in %zu events", removed, n);
    /* Again: nothing left to delete. */
    CHECK_STATUS(kvt_tier_clear(f.tier, &report), KVT_STATUS_OK);
    CHECK(report.objects == 0 && report.deleted == 0);
    CHECK_STATUS(kvt_tier_shutdown(f.tier), KVT_STATUS_OK);
    memset(&report, 0xff, sizeof report);
    CHECK_STATUS(kvt_tier_clear(f.tier, &report), KVT_STATUS_SHUT_DOWN);
    CHECK(report.objects == 0 && report.deleted == 0 && report.bytes == 0 && report.deleted_bytes == 0);
out:
    free(keys);
    fixture_close(&f);
}
