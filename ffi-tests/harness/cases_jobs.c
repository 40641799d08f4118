/*
 * ffi-tests/harness/cases_jobs.c: store and load jobs that carry data.
 *
 * Round trips on a local and a memory store (64 blocks of 64 KiB: half stored in four
 * jobs, overwritten, then loaded into the other half through a shuffled slot-to-key
 * mapping, byte-exact); 1000 jobs in flight at once (100 with KVT_HARNESS_SMALL), taken
 * by polls of capacity 7 woken by the event fd; loads that fail some of their keys: a key
 * never stored fails alone (NOT_FOUND) while the others load, an object stored with
 * another block size fails its key (LENGTH_MISMATCH).
 */
#include "harness.h"

#include "cases.h"

/* ------------------------------------------------------------------------------------ */
/* Round trips                                                                          */
/* ------------------------------------------------------------------------------------ */

/* Blocks 0..31, stored under keys 0..31, come back into blocks 32..63, shuffled. */
static void round_trip(const char *store)
{
    enum { BLOCKS = 64, HALF = 32, PER_JOB = 8, JOBS = HALF / PER_JOB };
    const size_t bb = 64 * 1024;
    fixture f;
    uint8_t *keys = NULL, *saved = NULL, *load_keys = NULL;
    uint64_t perm[HALF], ids[HALF], job_ids[JOBS];
    size_t i, j, mismatched = 0;
    const char *extra = strcmp(store, "memory") == 0 ? ",\"shutdown_timeout_ms\":500" : "";

    if (!fixture_open(&f, store, BLOCKS, bb, extra)) {
        fixture_close(&f);
        return;
    }
    keys = make_keys(HALF); /* key i names block i */
    saved = (uint8_t *)xmalloc(HALF * bb);
    memcpy(saved, f.pool, HALF * bb);

    /* Store blocks 0..31 under keys 0..31, in 4 jobs of 8 keys. */
    for (j = 0; j < JOBS; j++) {
        for (i = 0; i < PER_JOB; i++) {
            ids[i] = j * PER_JOB + i;
        }
        job_ids[j] = 100 + j;
        CHECK_STATUS(kvt_tier_submit_store(f.tier, job_ids[j], ids, keys + j * PER_JOB * KEY_LEN, KEY_LEN, PER_JOB),
                     KVT_STATUS_OK);
    }
    if (!wait_ok(&f, job_ids, JOBS, scaled_ms(2000))) {
        goto out;
    }
    CHECK(kvt_tier_jobs_in_flight(f.tier) == 0);

    /* The stores have been reported: the blocks are the caller's again. Overwrite them,
     * so that a store that kept pointing at the pool instead of a copy shows up. */
    rng_fill(f.pool, HALF * bb);

    /* Slot 32 + i receives key perm[i]: a shuffled, non-identity mapping. */
    for (i = 0; i < HALF; i++) {
        perm[i] = i;
    }
    for (i = HALF - 1; i > 0; i--) {
        size_t k = (size_t)(rng_next() % (i + 1));
        uint64_t t = perm[i];
        perm[i] = perm[k];
        perm[k] = t;
    }
    if (perm[0] == 0) { /* never identity at slot 32 */
        uint64_t t = perm[0];
        perm[0] = perm[1];
        perm[1] = t;
    }
    load_keys = (uint8_t *)xmalloc(HALF * KEY_LEN);
    for (i = 0; i < HALF; i++) {
        memcpy(load_keys + i * KEY_LEN, keys + perm[i] * KEY_LEN, KEY_LEN);
    }
    /* Load in 4 jobs; the block ids of a job are listed in reverse to mix things up. */
    for (j = 0; j < JOBS; j++) {
        uint8_t jk[PER_JOB * KEY_LEN];
        for (i = 0; i < PER_JOB; i++) {
            size_t slot = j * PER_JOB + (PER_JOB - 1 - i);
            ids[i] = HALF + slot;
            memcpy(jk + i * KEY_LEN, load_keys + slot * KEY_LEN, KEY_LEN);
        }
        job_ids[j] = 200 + j;
        CHECK_STATUS(kvt_tier_submit_load(f.tier, job_ids[j], ids, jk, KEY_LEN, PER_JOB), KVT_STATUS_OK);
    }
    if (!wait_ok(&f, job_ids, JOBS, scaled_ms(2000))) {
        goto out;
    }
    for (i = 0; i < HALF; i++) {
        if (memcmp(block(&f, HALF + i), saved + perm[i] * bb, bb) != 0) {
            mismatched++;
            if (mismatched <= 4) {
                printf("    slot %zu differs from original block %" PRIu64 "\n", HALF + i, perm[i]);
            }
        }
    }
    CHECKF(mismatched == 0, "%zu of %d loaded blocks differ from what was stored", mismatched, HALF);

out:
    shut_down_leftovers(&f); /* leave no job behind */
    free(keys);
    free(saved);
    free(load_keys);
    fixture_close(&f);
}

void test_roundtrip_local(void) { round_trip("local"); }
void test_roundtrip_memory(void) { round_trip("memory"); }

/* ------------------------------------------------------------------------------------ */
/* Many jobs in flight                                                                  */
/* ------------------------------------------------------------------------------------ */

/* Even jobs store 1-3 blocks, odd ones load one stored key each; all are submitted before
 * the first poll, and every result arrives exactly once. */
void test_many_jobs(void)
{
    const size_t jobs = g_small ? 100 : 1000;
    const size_t bb = 4096;
    const uint64_t sources = 16;              /* blocks 0..15: stored once up front */
    const uint64_t first_dest = sources;      /* one destination block per load job */
    const uint64_t blocks = sources + jobs / 2 + 1;
    const uint64_t base_id = 1u << 20, stride = 3;
    fixture f;
    uint8_t *src_keys = NULL, *job_keys = NULL;
    unsigned char *seen = NULL;
    size_t *load_src = NULL;
    owned_result *res = NULL;
    size_t i, got = 0, polls = 0, dup = 0, unknown = 0, missing = 0, bad = 0;
    int fd;
    double t0;

    if (!fixture_open(&f, "local", blocks, bb, "")) {
        fixture_close(&f);
        return;
    }
    src_keys = make_keys(sources);
    if (!store_first_blocks(&f, 7, src_keys, sources, scaled_ms(5000))) {
        goto out;
    }
    fd = kvt_tier_event_fd(f.tier);
    if (!CHECK(fd >= 0)) {
        goto out;
    }
    CHECK(!fd_readable(fd, 0));

    /* Submit everything first: even jobs store 1-3 source blocks under fresh keys, odd jobs
     * load one source key into their own destination block. */
    job_keys = make_keys(3 * jobs);
    load_src = (size_t *)xmalloc(jobs * sizeof(size_t));
    t0 = now_ms();
    for (i = 0; i < jobs; i++) {
        uint64_t id = base_id + stride * i;
        if (i % 2 == 0) {
            uint64_t ids[3];
            size_t k, nk = 1 + (i / 2) % 3;
            for (k = 0; k < nk; k++) {
                ids[k] = (i + k) % sources;
            }
            CHECK_STATUS(kvt_tier_submit_store(f.tier, id, ids, job_keys + 3 * i * KEY_LEN, KEY_LEN, nk),
                         KVT_STATUS_OK);
        } else {
            uint64_t dest = first_dest + i / 2;
            load_src[i] = (size_t)(rng_next() % sources);
            CHECK_STATUS(kvt_tier_submit_load(f.tier, id, &dest, src_keys + load_src[i] * KEY_LEN, KEY_LEN, 1),
                         KVT_STATUS_OK);
        }
    }
    printf("    submitted %zu jobs in %.1f ms; %zu in flight right after\n", jobs, now_ms() - t0,
           kvt_tier_jobs_in_flight(f.tier));

    /* Collect with a small capacity, waiting on the event fd. */
    res = (owned_result *)xmalloc((jobs + 8) * sizeof(owned_result));
    got = collect(&f, jobs, scaled_ms(60000), 7, res, jobs + 8, &polls);
    printf("    %zu results in %zu non-empty polls of capacity 7, %.1f ms after the first submit\n", got, polls,
           now_ms() - t0);
    CHECKF(got == jobs, "%zu results for %zu jobs", got, jobs);
    CHECKF(polls >= (jobs + 6) / 7, "%zu polls", polls);

    seen = (unsigned char *)xmalloc(jobs);
    memset(seen, 0, jobs);
    for (i = 0; i < got && i < jobs + 8; i++) {
        uint64_t id = res[i].job_id;
        size_t idx = (size_t)((id - base_id) / stride);
        if (id < base_id || (id - base_id) % stride != 0 || idx >= jobs) {
            unknown++;
            continue;
        }
        if (seen[idx]++) {
            dup++;
        }
        if (res[i].status != KVT_STATUS_OK ||
            res[i].kind != (idx % 2 == 0 ? KVT_JOB_KIND_STORE : KVT_JOB_KIND_LOAD) ||
            res[i].num_keys != (idx % 2 == 0 ? 1 + (idx / 2) % 3 : 1)) {
            if (bad++ < 3) {
                printf("    job %" PRIu64 ": status %d kind %d keys %zu: %s\n", id, (int)res[i].status,
                       (int)res[i].kind, res[i].num_keys, res[i].message);
            }
        }
    }
    for (i = 0; i < jobs; i++) {
        missing += !seen[i];
    }
    CHECKF(unknown == 0, "%zu results with unknown job ids", unknown);
    CHECKF(dup == 0, "%zu job ids reported more than once", dup);
    CHECKF(missing == 0, "%zu job ids never reported", missing);
    CHECKF(bad == 0, "%zu results with a wrong status, kind or key count", bad);
    CHECK(kvt_tier_jobs_in_flight(f.tier) == 0);
    CHECK(!fd_readable(fd, 0));

    /* Every load job brought back its source block. */
    bad = 0;
    for (i = 1; i < jobs; i += 2) {
        bad += memcmp(block(&f, first_dest + i / 2), block(&f, load_src[i]), bb) != 0;
    }
    CHECKF(bad == 0, "%zu loaded blocks differ from their source", bad);

out:
    free_collected(res, got, jobs + 8);
    free(seen);
    free(load_src);
    free(src_keys);
    free(job_keys);
    fixture_close(&f);
}

/* ------------------------------------------------------------------------------------ */
/* Loads that fail some keys                                                            */
/* ------------------------------------------------------------------------------------ */

/* One key of six was never stored: NOT_FOUND for it alone, the other five loaded. */
void test_partial_load(void)
{
    enum { N = 6, MISSING = 2 };
    const size_t bb = 8192;
    fixture f;
    uint8_t *keys = make_keys(N), stored_keys[(N - 1) * KEY_LEN];
    uint64_t store_ids[N - 1], load_ids[N], sid = 1, lid = 2;
    owned_result r;
    size_t i, k = 0;

    memset(&r, 0, sizeof r);
    if (!fixture_open(&f, "local", 2 * N, bb, "")) {
        goto out;
    }
    /* Store blocks 0..5 except block MISSING, whose key is never stored. */
    for (i = 0; i < N; i++) {
        if (i != MISSING) {
            store_ids[k] = i;
            memcpy(stored_keys + k * KEY_LEN, keys + i * KEY_LEN, KEY_LEN);
            k++;
        }
    }
    CHECK_STATUS(kvt_tier_submit_store(f.tier, sid, store_ids, stored_keys, KEY_LEN, N - 1), KVT_STATUS_OK);
    if (!wait_ok(&f, &sid, 1, scaled_ms(5000))) {
        goto out;
    }
    for (i = 0; i < N; i++) {
        load_ids[i] = N + i;
    }
    CHECK_STATUS(kvt_tier_submit_load(f.tier, lid, load_ids, keys, KEY_LEN, N), KVT_STATUS_OK);
    if (!CHECK(collect(&f, 1, scaled_ms(5000), 4, &r, 1, NULL) == 1)) {
        goto out;
    }
    CHECK(r.job_id == lid);
    CHECK(r.kind == KVT_JOB_KIND_LOAD);
    CHECKF(r.status == KVT_STATUS_NOT_FOUND, "status %d (%s)", (int)r.status, kvt_status_str(r.status));
    CHECK(r.num_keys == N);
    CHECK(r.num_failed_keys == 1);
    CHECKF(r.bytes == (uint64_t)(N - 1) * bb, "bytes %" PRIu64, r.bytes);
    CHECK(r.message[0] != '\0');
    for (i = 0; i < N && i < r.num_keys; i++) {
        if (i == MISSING) {
            CHECKF(r.key_status[i] == KVT_STATUS_NOT_FOUND, "key %zu: %d", i, (int)r.key_status[i]);
        } else {
            CHECKF(r.key_status[i] == KVT_STATUS_OK, "key %zu: %d", i, (int)r.key_status[i]);
            CHECKF(memcmp(block(&f, N + i), block(&f, i), bb) == 0, "block %zu loaded byte-exact", N + i);
        }
    }
out:
    free_results(&r, 1);
    free(keys);
    fixture_close(&f);
}

/* A stored object whose length differs from the block size fails only its key. */
void test_load_length_mismatch(void)
{
    fixture a, b, c;
    char json[1024];
    uint8_t *keys = make_keys(2);
    uint64_t ids[2] = {0, 1}, one = 1;
    owned_result r;
    int i;

    memset(&r, 0, sizeof r);
    memset(&b, 0, sizeof b);
    memset(&c, 0, sizeof c);
    if (!fixture_open(&a, "local", 2, 4096, "")) {
        goto out;
    }
    CHECK_STATUS(kvt_tier_submit_store(a.tier, 1, ids, keys, KEY_LEN, 2), KVT_STATUS_OK);
    if (!wait_ok(&a, &one, 1, scaled_ms(5000))) {
        goto out;
    }
    /* Two more tiers on the same directory, with larger and smaller blocks; each loads
     * key 0 (4096 bytes: wrong size) and a missing key. */
    for (i = 0; i < 2; i++) {
        fixture *t = i == 0 ? &b : &c;
        uint8_t lk[2 * KEY_LEN];
        snprintf(json, sizeof json, "{\"store\":{\"type\":\"local\",\"path\":\"%s/store\"}}", a.dir);
        if (!CHECK_STATUS(kvt_tier_new(json, &t->tier), KVT_STATUS_OK)) {
            goto out;
        }
        t->num_blocks = 2;
        t->block_bytes = i == 0 ? 8192 : 2048;
        t->pool = (uint8_t *)xmalloc(2 * t->block_bytes);
        memset(t->pool, 0x5a, 2 * t->block_bytes);
        CHECK_STATUS(kvt_tier_register_memory(t->tier, t->pool, 2, t->block_bytes), KVT_STATUS_OK);
        memcpy(lk, keys, KEY_LEN);
        make_key(lk + KEY_LEN, 0);
        CHECK_STATUS(kvt_tier_submit_load(t->tier, 9, ids, lk, KEY_LEN, 2), KVT_STATUS_OK);
        if (CHECK(collect(t, 1, scaled_ms(5000), 2, &r, 1, NULL) == 1)) {
            CHECKF(r.status == KVT_STATUS_LENGTH_MISMATCH, "block_bytes %zu: status %d (%s): %s", t->block_bytes,
                   (int)r.status, kvt_status_str(r.status), r.message);
            CHECKF(r.num_keys == 2 && r.key_status[0] == KVT_STATUS_LENGTH_MISMATCH, "block_bytes %zu: key 0 %d",
                   t->block_bytes, r.num_keys ? (int)r.key_status[0] : -1);
            CHECKF(r.num_keys == 2 && r.key_status[1] == KVT_STATUS_NOT_FOUND, "block_bytes %zu: key 1 %d",
                   t->block_bytes, r.num_keys > 1 ? (int)r.key_status[1] : -1);
            CHECK(r.num_failed_keys == 2 && r.bytes == 0);
        }
        free_results(&r, 1);
        memset(&r, 0, sizeof r);
    }
out:
    free(keys);
    b.dir[0] = c.dir[0] = '\0'; /* a owns the directory */
    fixture_close(&c);
    fixture_close(&b);
    fixture_close(&a);
}
