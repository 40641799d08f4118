/*
 * ffi-tests/harness/cases_submit.c: submissions the tier refuses.
 *
 * Every refused submission returns its status with a message and queues exactly one
 * failed result for its job id at once, whatever the reason: bad arguments (NULL arrays,
 * no keys, wrong key lengths, block ids out of range or twice in a load), a job id whose
 * result is still pending (DUPLICATE_JOB), blocks another job holds until its result is
 * polled (BLOCK_BUSY), no registered pool yet (STATE), a shut-down tier (SHUT_DOWN); and
 * nothing is sized by absurd counts or key lengths.
 */
#include "harness.h"

#include "cases.h"

/* ------------------------------------------------------------------------------------ */
/* Bad arguments: the status, a message, one result                                     */
/* ------------------------------------------------------------------------------------ */

typedef struct bad_submit {
    const char *what;
    kvt_job_kind kind;
    int null_ids, null_keys;
    size_t key_len;
    size_t num_keys;
    int bad_block; /* 0: valid ids; 1: id == num_blocks; 2: UINT64_MAX; 3: a block id twice */
    kvt_status want;
} bad_submit;

static const bad_submit k_bad_submits[] = {
    {"store: NULL block_ids", KVT_JOB_KIND_STORE, 1, 0, KEY_LEN, 2, 0, KVT_STATUS_NULL_ARGUMENT},
    {"store: NULL keys", KVT_JOB_KIND_STORE, 0, 1, KEY_LEN, 2, 0, KVT_STATUS_NULL_ARGUMENT},
    {"load: NULL block_ids", KVT_JOB_KIND_LOAD, 1, 0, KEY_LEN, 3, 0, KVT_STATUS_NULL_ARGUMENT},
    {"load: NULL keys", KVT_JOB_KIND_LOAD, 0, 1, KEY_LEN, 1, 0, KVT_STATUS_NULL_ARGUMENT},
    {"load: NULL both", KVT_JOB_KIND_LOAD, 1, 1, KEY_LEN, 2, 0, KVT_STATUS_NULL_ARGUMENT},
    {"store: zero keys", KVT_JOB_KIND_STORE, 0, 0, KEY_LEN, 0, 0, KVT_STATUS_INVALID_ARGUMENT},
    {"load: zero keys, NULL arrays", KVT_JOB_KIND_LOAD, 1, 1, KEY_LEN, 0, 0, KVT_STATUS_INVALID_ARGUMENT},
    {"store: key_len 35", KVT_JOB_KIND_STORE, 0, 0, KEY_LEN - 1, 2, 0, KVT_STATUS_INVALID_ARGUMENT},
    {"load: key_len 37", KVT_JOB_KIND_LOAD, 0, 0, KEY_LEN + 1, 2, 0, KVT_STATUS_INVALID_ARGUMENT},
    {"store: key_len 0", KVT_JOB_KIND_STORE, 0, 0, 0, 2, 0, KVT_STATUS_INVALID_ARGUMENT},
    {"store: block id == num_blocks", KVT_JOB_KIND_STORE, 0, 0, KEY_LEN, 3, 1, KVT_STATUS_INVALID_ARGUMENT},
    {"load: block id UINT64_MAX", KVT_JOB_KIND_LOAD, 0, 0, KEY_LEN, 2, 2, KVT_STATUS_INVALID_ARGUMENT},
    {"load: one block id twice", KVT_JOB_KIND_LOAD, 0, 0, KEY_LEN, 3, 3, KVT_STATUS_INVALID_ARGUMENT},
};
#define NUM_BAD_SUBMITS (sizeof k_bad_submits / sizeof k_bad_submits[0])

/* Submits bad input number `c` as job `id`; returns the status, and copies
 * kvt_last_error() into msg. */
static kvt_status submit_bad(const fixture *f, const bad_submit *c, uint64_t id, char *msg, size_t msg_cap)
{
    uint64_t ids[4] = {0, 1, 2, 3};
    uint8_t keys[4 * (KEY_LEN + 1)];
    kvt_status s;
    rng_fill(keys, sizeof keys);
    if (c->bad_block == 1) {
        ids[c->num_keys - 1] = f->num_blocks;
    } else if (c->bad_block == 2) {
        ids[0] = UINT64_MAX;
    } else if (c->bad_block == 3) {
        ids[c->num_keys - 1] = ids[0];
    }
    s = submit_kind(f->tier, c->kind, id, c->null_ids ? NULL : ids, c->null_keys ? NULL : keys, c->key_len,
                    c->num_keys);
    snprintf(msg, msg_cap, "%s", kvt_last_error());
    return s;
}

/* Each bad submission yields exactly one failed result with its id, queued at once. */
void test_submit_failures_yield_one_result(void)
{
    fixture f;
    size_t i;
    char msg[1024];
    uint64_t ids[2] = {0, 1};
    uint8_t keys[2 * KEY_LEN];
    owned_result r;

    rng_fill(keys, sizeof keys);
    if (!fixture_open(&f, "local", 8, 4096, "")) {
        fixture_close(&f);
        return;
    }
    for (i = 0; i < NUM_BAD_SUBMITS; i++) {
        const bad_submit *c = &k_bad_submits[i];
        uint64_t id = 5000 + i;
        size_t k;
        kvt_status s = submit_bad(&f, c, id, msg, sizeof msg);
        CHECKF(s == c->want, "%s: returned %d (%s), want %d", c->what, (int)s, kvt_status_str(s), (int)c->want);
        memset(&r, 0, sizeof r);
        if (!expect_one_queued(&f, id, &r)) {
            printf("    ... for case \"%s\"\n", c->what);
            free_results(&r, 1);
            continue;
        }
        CHECKF(r.kind == c->kind, "%s: kind %d", c->what, (int)r.kind);
        CHECKF(r.status == c->want, "%s: result status %d (%s)", c->what, (int)r.status, kvt_status_str(r.status));
        CHECKF(r.num_keys == c->num_keys, "%s: result has %zu keys, want %zu", c->what, r.num_keys, c->num_keys);
        CHECKF(r.num_failed_keys == c->num_keys, "%s: %zu failed keys", c->what, r.num_failed_keys);
        for (k = 0; k < r.num_keys; k++) {
            CHECKF(r.key_status[k] == c->want, "%s: key %zu status %d", c->what, k, (int)r.key_status[k]);
        }
        CHECKF(r.bytes == 0, "%s", c->what);
        CHECKF(r.message[0] != '\0', "%s: empty result message", c->what);
        free_results(&r, 1);
    }

    /* After shutdown: SHUT_DOWN, and the result is still queued. */
    CHECK_STATUS(kvt_tier_shutdown(f.tier), KVT_STATUS_OK);
    CHECK_STATUS(kvt_tier_submit_store(f.tier, 6000, ids, keys, KEY_LEN, 2), KVT_STATUS_SHUT_DOWN);
    memset(&r, 0, sizeof r);
    if (expect_one_queued(&f, 6000, &r)) {
        CHECK(r.status == KVT_STATUS_SHUT_DOWN && r.kind == KVT_JOB_KIND_STORE && r.num_keys == 2);
    }
    free_results(&r, 1);
    CHECK_STATUS(kvt_tier_submit_load(f.tier, 6001, ids, keys, KEY_LEN, 2), KVT_STATUS_SHUT_DOWN);
    memset(&r, 0, sizeof r);
    if (expect_one_queued(&f, 6001, &r)) {
        CHECK(r.status == KVT_STATUS_SHUT_DOWN && r.kind == KVT_JOB_KIND_LOAD && r.num_keys == 2);
    }
    free_results(&r, 1);
    fixture_close(&f);

    /* Before register_memory: STATE, and the result is queued. */
    if (!fixture_open(&f, "memory", 0, 0, "")) {
        fixture_close(&f);
        return;
    }
    CHECK_STATUS(kvt_tier_submit_store(f.tier, 7000, ids, keys, KEY_LEN, 2), KVT_STATUS_STATE);
    memset(&r, 0, sizeof r);
    if (expect_one_queued(&f, 7000, &r)) {
        CHECK(r.status == KVT_STATUS_STATE && r.num_keys == 2 && r.num_failed_keys == 2);
    }
    free_results(&r, 1);
    CHECK_STATUS(kvt_tier_submit_load(f.tier, 7001, ids, keys, KEY_LEN, 2), KVT_STATUS_STATE);
    memset(&r, 0, sizeof r);
    if (expect_one_queued(&f, 7001, &r)) {
        CHECK(r.status == KVT_STATUS_STATE && r.kind == KVT_JOB_KIND_LOAD);
    }
    free_results(&r, 1);
    fixture_close(&f);
}

/* Every bad submission returns its code with a message (store and load alike). */
void test_submit_bad_args(void)
{
    fixture f;
    size_t i;
    char msg[1024];
    if (!fixture_open(&f, "local", 8, 4096, "")) {
        fixture_close(&f);
        return;
    }
    for (i = 0; i < NUM_BAD_SUBMITS; i++) {
        const bad_submit *c = &k_bad_submits[i];
        bad_submit other = *c; /* the same input with the other job kind */
        size_t n = 0;
        kvt_result buf[4];
        kvt_status s = submit_bad(&f, c, 100 + i, msg, sizeof msg);
        CHECKF(s == c->want, "%s: returned %d (%s), want %d (%s)", c->what, (int)s, kvt_status_str(s), (int)c->want,
               kvt_status_str(c->want));
        CHECKF(msg[0] != '\0', "%s: empty kvt_last_error()", c->what);
        if (c->bad_block != 3) { /* a block id twice is only an error for loads */
            other.kind = c->kind == KVT_JOB_KIND_STORE ? KVT_JOB_KIND_LOAD : KVT_JOB_KIND_STORE;
            s = submit_bad(&f, &other, 200 + i, msg, sizeof msg);
            CHECKF(s == c->want, "%s (other kind): returned %d (%s)", c->what, (int)s, kvt_status_str(s));
            CHECKF(msg[0] != '\0', "%s (other kind): empty kvt_last_error()", c->what);
        }
        CHECK_STATUS(kvt_tier_poll(f.tier, buf, 4, &n), KVT_STATUS_OK);
        CHECKF(n == (c->bad_block != 3 ? 2u : 1u), "%s: %zu results", c->what, n);
    }
    /* Specific messages: the NULL argument is named. */
    {
        uint8_t keys[KEY_LEN] = {0};
        uint64_t id0 = 0;
        size_t n = 0;
        kvt_result buf[4];
        CHECK_STATUS(kvt_tier_submit_store(f.tier, 1, NULL, keys, KEY_LEN, 1), KVT_STATUS_NULL_ARGUMENT);
        CHECK(strstr(kvt_last_error(), "block_ids") != NULL);
        CHECK_STATUS(kvt_tier_submit_load(f.tier, 2, &id0, NULL, KEY_LEN, 1), KVT_STATUS_NULL_ARGUMENT);
        CHECK(strstr(kvt_last_error(), "keys") != NULL);
        CHECK_STATUS(kvt_tier_poll(f.tier, buf, 4, &n), KVT_STATUS_OK);
        CHECK(n == 2);
    }
    fixture_close(&f);
}

/* ------------------------------------------------------------------------------------ */
/* Refused by the state: pending ids, held blocks, no pool yet                          */
/* ------------------------------------------------------------------------------------ */

/* Duplicate in-flight job id: DUPLICATE_JOB, and only one result for that id. */
void test_duplicate_job(void)
{
    fixture f;
    uint8_t *keys = make_keys(4);
    uint64_t ids[2] = {0, 1}, dest[2] = {2, 3}, both[2] = {42, 43};
    owned_result res[4];
    size_t got, i, n42 = 0, n43 = 0;

    memset(res, 0, sizeof res);
    if (!fixture_open(&f, "local", 4, 4096, "")) {
        goto out;
    }
    CHECK_STATUS(kvt_tier_submit_store(f.tier, 42, ids, keys, KEY_LEN, 2), KVT_STATUS_OK);
    /* Whether job 42 is still running or already finished, it has a result pending. */
    CHECK_STATUS(kvt_tier_submit_store(f.tier, 42, ids, keys, KEY_LEN, 2), KVT_STATUS_DUPLICATE_JOB);
    CHECK_STATUS(kvt_tier_submit_load(f.tier, 42, dest, keys, KEY_LEN, 2), KVT_STATUS_DUPLICATE_JOB);
    CHECK_STATUS(kvt_tier_submit_load(f.tier, 42, NULL, NULL, KEY_LEN, 2), KVT_STATUS_DUPLICATE_JOB);
    /* A failed submission's pending result makes its id a duplicate too. */
    CHECK_STATUS(kvt_tier_submit_store(f.tier, 43, ids, keys, KEY_LEN, 0), KVT_STATUS_INVALID_ARGUMENT);
    CHECK_STATUS(kvt_tier_submit_store(f.tier, 43, ids, keys, KEY_LEN, 2), KVT_STATUS_DUPLICATE_JOB);
    CHECK_STATUS(kvt_tier_drain(f.tier, (uint64_t)scaled_ms(5000)), KVT_STATUS_OK);
    CHECK_STATUS(kvt_tier_submit_store(f.tier, 42, ids, keys, KEY_LEN, 2), KVT_STATUS_DUPLICATE_JOB);

    got = collect(&f, 2, scaled_ms(5000), 4, res, 4, NULL);
    CHECK(got == 2);
    /* Nothing else arrives. */
    {
        kvt_result buf[4];
        size_t n = 9;
        CHECK_STATUS(kvt_tier_poll(f.tier, buf, 4, &n), KVT_STATUS_OK);
        CHECK(n == 0);
    }
    for (i = 0; i < got && i < 4; i++) {
        if (res[i].job_id == 42) {
            n42++;
            CHECK(res[i].status == KVT_STATUS_OK && res[i].kind == KVT_JOB_KIND_STORE && res[i].num_keys == 2);
        } else if (res[i].job_id == 43) {
            n43++;
            CHECK(res[i].status == KVT_STATUS_INVALID_ARGUMENT && res[i].num_keys == 0);
        }
    }
    CHECK(n42 == 1);
    CHECK(n43 == 1);
    /* Once polled, the ids can be used again. */
    CHECK_STATUS(kvt_tier_submit_load(f.tier, 42, dest, keys, KEY_LEN, 2), KVT_STATUS_OK);
    CHECK_STATUS(kvt_tier_submit_store(f.tier, 43, ids, keys + 2 * KEY_LEN, KEY_LEN, 2), KVT_STATUS_OK);
    wait_ok(&f, both, 2, scaled_ms(5000));
out:
    free_results(res, 4);
    free(keys);
    fixture_close(&f);
}

/* A job holds its blocks until its result is polled: stores may share a block, a load
 * needs its block alone. A conflicting job is BLOCK_BUSY with its one result, whatever
 * the timing (the holder's result has not been polled yet). */
void test_block_busy(void)
{
    static const struct {
        uint64_t id;
        kvt_job_kind kind;
        uint64_t block;
        kvt_status want;
    } steps[] = {
        {2, KVT_JOB_KIND_LOAD, 1, KVT_STATUS_BLOCK_BUSY},  /* block 1 is read by store 1 */
        {3, KVT_JOB_KIND_STORE, 0, KVT_STATUS_OK},         /* stores share block 0 */
        {4, KVT_JOB_KIND_LOAD, 2, KVT_STATUS_OK},          /* block 2 is free */
        {5, KVT_JOB_KIND_STORE, 2, KVT_STATUS_BLOCK_BUSY}, /* block 2 is written by load 4 */
        {6, KVT_JOB_KIND_LOAD, 2, KVT_STATUS_BLOCK_BUSY},
        {7, KVT_JOB_KIND_LOAD, 0, KVT_STATUS_BLOCK_BUSY},  /* block 0 is read by stores 1 and 3 */
    };
    enum { STEPS = sizeof steps / sizeof steps[0] };
    fixture f;
    uint8_t *keys = make_keys(2);
    uint64_t both[2] = {0, 1}, one;
    owned_result res[STEPS + 1];
    size_t got = 0, i, j;

    memset(res, 0, sizeof res);
    if (!fixture_open(&f, "memory", 4, 4096, "")) {
        goto out;
    }
    CHECK_STATUS(kvt_tier_submit_store(f.tier, 1, both, keys, KEY_LEN, 2), KVT_STATUS_OK);
    for (i = 0; i < STEPS; i++) {
        /* Loads bring back key 0, stored by job 1 (if it has finished; else NOT_FOUND). */
        kvt_status s = submit_kind(f.tier, steps[i].kind, steps[i].id, &steps[i].block, keys, KEY_LEN, 1);
        CHECKF(s == steps[i].want, "job %" PRIu64 ": returned %d (%s), want %d: %s", steps[i].id, (int)s,
               kvt_status_str(s), (int)steps[i].want, kvt_last_error());
        if (s == KVT_STATUS_BLOCK_BUSY) {
            CHECKF(strstr(kvt_last_error(), "block") != NULL, "message \"%s\"", kvt_last_error());
        }
    }
    got = collect(&f, STEPS + 1, scaled_ms(10000), 4, res, STEPS + 1, NULL);
    CHECKF(got == STEPS + 1, "%zu results for %d jobs", got, STEPS + 1);
    for (i = 0; i < got; i++) {
        for (j = 0; j < STEPS; j++) {
            if (res[i].job_id == steps[j].id && steps[j].want == KVT_STATUS_BLOCK_BUSY) {
                CHECKF(res[i].status == KVT_STATUS_BLOCK_BUSY && res[i].num_keys == 1,
                       "job %" PRIu64 ": result status %d, %zu keys", res[i].job_id, (int)res[i].status,
                       res[i].num_keys);
            }
        }
    }
    /* Every result polled: the blocks are free again. */
    one = 8;
    CHECK_STATUS(kvt_tier_submit_load(f.tier, one, both + 1, keys + KEY_LEN, KEY_LEN, 1), KVT_STATUS_OK);
    wait_ok(&f, &one, 1, scaled_ms(10000));
out:
    free_results(res, got < STEPS + 1 ? got : STEPS + 1);
    free(keys);
    fixture_close(&f);
}

/* Submit before register_memory; register twice; bad registrations. */
void test_state_errors(void)
{
    fixture f;
    uint8_t keys[KEY_LEN] = {1, 2, 3};
    uint64_t id0 = 0;
    uint8_t *pool = (uint8_t *)xmalloc(4 * 1024);
    kvt_result buf[4];
    size_t n = 0;

    if (!fixture_open(&f, "memory", 0, 0, "")) {
        goto out;
    }
    CHECK_STATUS(kvt_tier_submit_store(f.tier, 1, &id0, keys, KEY_LEN, 1), KVT_STATUS_STATE);
    CHECK(strstr(kvt_last_error(), "regist") != NULL);
    CHECK_STATUS(kvt_tier_submit_load(f.tier, 2, &id0, keys, KEY_LEN, 1), KVT_STATUS_STATE);
    CHECK_STATUS(kvt_tier_register_memory(f.tier, NULL, 4, 1024), KVT_STATUS_NULL_ARGUMENT);
    CHECK_STATUS(kvt_tier_register_memory(f.tier, pool, 0, 1024), KVT_STATUS_INVALID_ARGUMENT);
    CHECK_STATUS(kvt_tier_register_memory(f.tier, pool, 4, 0), KVT_STATUS_INVALID_ARGUMENT);
    CHECK_STATUS(kvt_tier_register_memory(f.tier, pool, UINT64_MAX, 1024), KVT_STATUS_INVALID_ARGUMENT);
    /* Failed registrations did not count: the first good one succeeds, the second fails. */
    CHECK_STATUS(kvt_tier_register_memory(f.tier, pool, 4, 1024), KVT_STATUS_OK);
    CHECK_STATUS(kvt_tier_register_memory(f.tier, pool, 4, 1024), KVT_STATUS_STATE);
    CHECK_STATUS(kvt_tier_register_memory(f.tier, pool, 2, 512), KVT_STATUS_STATE);
    CHECK_STATUS(kvt_tier_poll(f.tier, buf, 4, &n), KVT_STATUS_OK);
    CHECK(n == 2);
    CHECK(kvt_tier_jobs_in_flight(f.tier) == 0);
out:
    fixture_close(&f); /* frees the tier before the pool below */
    free(pool);
}

/* ------------------------------------------------------------------------------------ */
/* Extreme counts, key lengths and job ids                                              */
/* ------------------------------------------------------------------------------------ */

/* An absurd num_keys (with NULL arrays) is INVALID_ARGUMENT, with one result and no crash. */
void test_null_arrays_huge_num_keys(void)
{
    fixture f;
    owned_result r;
    kvt_status s;
    memset(&r, 0, sizeof r);
    if (!fixture_open(&f, "memory", 1, 4096, ",\"shutdown_timeout_ms\":200")) {
        fixture_close(&f);
        return;
    }
    s = kvt_tier_submit_store(f.tier, 1, NULL, NULL, KEY_LEN, SIZE_MAX);
    CHECKF(s == KVT_STATUS_INVALID_ARGUMENT, "returned %d (%s)", (int)s, kvt_status_str(s));
    if (expect_one_queued(&f, 1, &r)) {
        CHECK(r.status == KVT_STATUS_INVALID_ARGUMENT);
        CHECK(r.num_keys == 0);
    }
    free_results(&r, 1);
    shut_down_leftovers(&f);
    fixture_close(&f);
}

/* Huge key lengths are INVALID_ARGUMENT with exactly one result; nothing is sized by
 * them (a copy or an allocation of key_len * num_keys bytes would crash or abort). */
void test_huge_key_len(void)
{
    static const size_t lens[] = {SIZE_MAX, SIZE_MAX - 15, SIZE_MAX / 2, (size_t)1 << 40, 69, 4, 0};
    fixture f;
    uint64_t ids[2] = {0, 1};
    uint8_t keys[2 * KEY_LEN];
    size_t i, n;
    int kind;
    uint64_t id = 1;
    owned_result r;
    kvt_lookup_result verdict = KVT_LOOKUP_RESULT_HIT;

    rng_fill(keys, sizeof keys);
    if (!fixture_open(&f, "memory", 2, 4096, ",\"key_bytes\":0")) {
        fixture_close(&f);
        return;
    }
    for (i = 0; i < sizeof lens / sizeof lens[0]; i++) {
        for (n = 1; n <= 2; n++) {
            for (kind = 0; kind < 2; kind++) {
                kvt_status s = submit_kind(f.tier, kind ? KVT_JOB_KIND_LOAD : KVT_JOB_KIND_STORE, id, ids, keys,
                                           lens[i], n);
                CHECKF(s == KVT_STATUS_INVALID_ARGUMENT, "key_len %zu, %zu keys, kind %d: returned %d (%s)", lens[i],
                       n, kind, (int)s, kvt_status_str(s));
                memset(&r, 0, sizeof r);
                if (expect_one_queued(&f, id, &r)) {
                    CHECKF(r.status == KVT_STATUS_INVALID_ARGUMENT, "key_len %zu: result status %d", lens[i],
                           (int)r.status);
                    CHECKF(r.num_keys == n, "key_len %zu: result has %zu keys, want %zu", lens[i], r.num_keys, n);
                }
                free_results(&r, 1);
                id++;
            }
        }
        CHECKF(kvt_tier_lookup(f.tier, 1, keys, lens[i], &verdict) == KVT_STATUS_INVALID_ARGUMENT,
               "lookup with key_len %zu", lens[i]);
        CHECK(verdict == KVT_LOOKUP_RESULT_HIT); /* not written on error */
    }
    CHECK(kvt_tier_jobs_in_flight(f.tier) == 0);
    fixture_close(&f);
}

/* KVT_MAX_KEYS_PER_JOB is the limit; job ids 0 and UINT64_MAX are ordinary ids. */
void test_job_size_and_id_extremes(void)
{
    fixture f;
    owned_result r;
    uint64_t ids[1] = {0}, extremes[2] = {0, UINT64_MAX};
    uint8_t *keys = make_keys(1);
    size_t i;

    memset(&r, 0, sizeof r);
    if (!fixture_open(&f, "memory", 1, 4096, "")) {
        goto out;
    }
    /* One past the limit: INVALID_ARGUMENT, even before the NULL arrays are looked at. */
    CHECK_STATUS(kvt_tier_submit_store(f.tier, 7, NULL, NULL, KEY_LEN, (size_t)KVT_MAX_KEYS_PER_JOB + 1),
                 KVT_STATUS_INVALID_ARGUMENT);
    if (expect_one_queued(&f, 7, &r)) {
        CHECK(r.status == KVT_STATUS_INVALID_ARGUMENT);
    }
    free_results(&r, 1);
    memset(&r, 0, sizeof r);
    /* At the limit, NULL arrays are the error, with one status per key. */
    CHECK_STATUS(kvt_tier_submit_load(f.tier, 8, NULL, NULL, KEY_LEN, KVT_MAX_KEYS_PER_JOB),
                 KVT_STATUS_NULL_ARGUMENT);
    if (expect_one_queued(&f, 8, &r)) {
        CHECK(r.status == KVT_STATUS_NULL_ARGUMENT && r.num_keys == KVT_MAX_KEYS_PER_JOB);
    }
    free_results(&r, 1);
    memset(&r, 0, sizeof r);
    for (i = 0; i < 2; i++) {
        CHECK_STATUS(kvt_tier_submit_store(f.tier, extremes[i], ids, keys, KEY_LEN, 1), KVT_STATUS_OK);
        CHECK_STATUS(kvt_tier_submit_store(f.tier, extremes[i], ids, keys, KEY_LEN, 1), KVT_STATUS_DUPLICATE_JOB);
        /* A pending id resubmitted with bad arguments is still only a duplicate. */
        CHECK_STATUS(kvt_tier_submit_store(f.tier, extremes[i], NULL, NULL, SIZE_MAX, 2), KVT_STATUS_DUPLICATE_JOB);
        wait_ok(&f, &extremes[i], 1, scaled_ms(5000));
    }
out:
    free(keys);
    fixture_close(&f);
}
