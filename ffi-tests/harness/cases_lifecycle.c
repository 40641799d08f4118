/*
 * ffi-tests/harness/cases_lifecycle.c: drain, shutdown and free.
 *
 * A drain waits for the jobs in flight and leaves the tier usable; one that times out
 * cancels nothing. After kvt_tier_shutdown every call that would start work returns
 * SHUT_DOWN while results, counters and events can still be taken, and shutdown is
 * idempotent. Shutdown and free with hundreds of jobs in flight (one transfer at a time,
 * or sixteen with no grace) report every job exactly once, OK or CANCELLED. Once
 * shutdown or free has returned, the library no longer touches the pool (it is made
 * inaccessible meanwhile).
 */
#include "harness.h"

#include "cases.h"

#include <sys/mman.h>

/* ------------------------------------------------------------------------------------ */
/* Drain                                                                                */
/* ------------------------------------------------------------------------------------ */

/* Drain leaves the tier fully usable; drain with nothing in flight is OK at once. */
void test_after_drain(void)
{
    fixture f;
    uint8_t *keys = make_keys(2);
    uint64_t src[2] = {0, 1}, dst[2] = {3, 2}, id;
    double t0;

    if (!fixture_open(&f, "local", 4, 16384, "")) {
        goto out;
    }
    t0 = now_ms();
    CHECK_STATUS(kvt_tier_drain(f.tier, 0), KVT_STATUS_OK);
    CHECK_STATUS(kvt_tier_drain(f.tier, 60000), KVT_STATUS_OK);
    CHECK(now_ms() - t0 < 1000); /* nothing in flight: no waiting */

    CHECK_STATUS(kvt_tier_submit_store(f.tier, 1, src, keys, KEY_LEN, 2), KVT_STATUS_OK);
    CHECK_STATUS(kvt_tier_drain(f.tier, (uint64_t)scaled_ms(10000)), KVT_STATUS_OK);
    CHECK(kvt_tier_jobs_in_flight(f.tier) == 0);
    CHECK(fd_readable(kvt_tier_event_fd(f.tier), 0)); /* drained results stay queued */
    id = 1;
    wait_ok(&f, &id, 1, scaled_ms(1000));

    CHECK_STATUS(kvt_tier_submit_load(f.tier, 2, dst, keys, KEY_LEN, 2), KVT_STATUS_OK);
    CHECK_STATUS(kvt_tier_drain(f.tier, (uint64_t)scaled_ms(10000)), KVT_STATUS_OK);
    id = 2;
    if (wait_ok(&f, &id, 1, scaled_ms(1000))) {
        CHECK(memcmp(block(&f, 3), block(&f, 0), f.block_bytes) == 0);
        CHECK(memcmp(block(&f, 2), block(&f, 1), f.block_bytes) == 0);
    }
    CHECK_STATUS(kvt_tier_drain(f.tier, 0), KVT_STATUS_OK);
    CHECK_STATUS(kvt_tier_shutdown(f.tier), KVT_STATUS_OK);
out:
    free(keys);
    fixture_close(&f);
}

/* A drain that times out cancels nothing: the jobs still finish and report OK. */
void test_drain_timeout(void)
{
    enum { JOBS = 50, PER_JOB = 4 };
    fixture f;
    uint8_t *keys = make_keys(JOBS * PER_JOB);
    uint64_t job_ids[JOBS], bids[PER_JOB] = {0, 1, 2, 3};
    size_t i;
    kvt_status s;
    char msg[512];

    /* One transfer at a time: 200 writes of 64 KiB cannot finish before drain(0). */
    if (!fixture_open(&f, "local", PER_JOB, 64 * 1024, ",\"max_inflight_transfers\":1")) {
        goto out;
    }
    for (i = 0; i < JOBS; i++) {
        job_ids[i] = 300 + i;
        CHECK_STATUS(kvt_tier_submit_store(f.tier, job_ids[i], bids, keys + i * PER_JOB * KEY_LEN, KEY_LEN, PER_JOB),
                     KVT_STATUS_OK);
    }
    s = kvt_tier_drain(f.tier, 0);
    snprintf(msg, sizeof msg, "%s", kvt_last_error());
    if (kvt_tier_jobs_in_flight(f.tier) > 0) {
        CHECKF(s == KVT_STATUS_TIMEOUT, "drain(0) with jobs in flight returned %d (%s)", (int)s, kvt_status_str(s));
        CHECKF(msg[0] != '\0', "drain(0) timed out with an empty kvt_last_error()");
    } else {
        printf("    (all jobs finished before drain(0); TIMEOUT not observed)\n");
    }
    CHECK_STATUS(kvt_tier_drain(f.tier, (uint64_t)scaled_ms(30000)), KVT_STATUS_OK);
    CHECK(kvt_tier_jobs_in_flight(f.tier) == 0);
    wait_ok(&f, job_ids, JOBS, scaled_ms(1000));
out:
    free(keys);
    fixture_close(&f);
}

/* ------------------------------------------------------------------------------------ */
/* After shutdown                                                                       */
/* ------------------------------------------------------------------------------------ */

/* After kvt_tier_shutdown, calls return SHUT_DOWN; poll still works; idempotent. */
void test_after_shutdown(void)
{
    fixture f;
    uint8_t *keys = make_keys(1);
    uint8_t other_pool[64];
    uint64_t id0 = 0, ids[1] = {1};
    kvt_result buf[4];
    size_t n = 9;
    int fd;
    const char *location;

    if (!fixture_open(&f, "local", 2, 4096, "")) {
        goto out;
    }
    fd = kvt_tier_event_fd(f.tier);
    /* The location names the store's directory; the same pointer stays valid after shutdown. */
    location = kvt_tier_location(f.tier);
    CHECKF(location != NULL && strstr(location, "local directory") != NULL && strstr(location, f.dir) != NULL,
           "location %s", location ? location : "(null)");
    CHECK_STATUS(kvt_tier_submit_store(f.tier, 1, &id0, keys, KEY_LEN, 1), KVT_STATUS_OK);
    CHECK_STATUS(kvt_tier_shutdown(f.tier), KVT_STATUS_OK);
    CHECK(kvt_tier_location(f.tier) == location);
    CHECK(kvt_tier_jobs_in_flight(f.tier) == 0);
    CHECK_STATUS(kvt_tier_shutdown(f.tier), KVT_STATUS_OK); /* idempotent */
    CHECK_STATUS(kvt_tier_register_memory(f.tier, other_pool, 1, sizeof other_pool), KVT_STATUS_SHUT_DOWN);
    CHECK_STATUS(kvt_tier_drain(f.tier, 0), KVT_STATUS_SHUT_DOWN);
    CHECK_STATUS(kvt_tier_submit_store(f.tier, 2, &id0, keys, KEY_LEN, 1), KVT_STATUS_SHUT_DOWN);
    CHECK_STATUS(kvt_tier_submit_load(f.tier, 3, ids, keys, KEY_LEN, 1), KVT_STATUS_SHUT_DOWN);
    /* Even an invalid submission reports SHUT_DOWN or its own error, and queues a result. */
    CHECK(kvt_tier_submit_load(f.tier, 4, NULL, NULL, KEY_LEN, 1) != KVT_STATUS_OK);
    CHECK(kvt_tier_event_fd(f.tier) == fd); /* valid until kvt_tier_free */
    CHECK(fd_readable(fd, 0));
    /* The lookup side refuses work too; counters and events can still be collected. */
    {
        kvt_lookup_result verdict = KVT_LOOKUP_RESULT_HIT;
        kvt_stats stats;
        kvt_event events[2];
        size_t ne = 9;
        CHECK_STATUS(kvt_tier_lookup(f.tier, 1, keys, KEY_LEN, &verdict), KVT_STATUS_SHUT_DOWN);
        CHECK(verdict == KVT_LOOKUP_RESULT_HIT);
        CHECK_STATUS(kvt_tier_schedule_end(f.tier), KVT_STATUS_SHUT_DOWN);
        CHECK_STATUS(kvt_tier_request_finished(f.tier, 1), KVT_STATUS_SHUT_DOWN);
        CHECK_STATUS(kvt_tier_check_now(f.tier, keys, KEY_LEN, 1, 1000, &verdict), KVT_STATUS_SHUT_DOWN);
        CHECK(verdict == KVT_LOOKUP_RESULT_HIT);
        {
            const uint64_t req = 1;
            CHECK_STATUS(kvt_tier_lookup_batch(f.tier, &req, keys, KEY_LEN, 1, &verdict), KVT_STATUS_SHUT_DOWN);
            CHECK(verdict == KVT_LOOKUP_RESULT_HIT);
        }
        CHECK_STATUS(kvt_tier_pin(f.tier, keys, KEY_LEN, 1, NULL), KVT_STATUS_SHUT_DOWN);
        CHECK_STATUS(kvt_tier_unpin(f.tier, keys, KEY_LEN, 1), KVT_STATUS_SHUT_DOWN);
        CHECK_STATUS(kvt_tier_stats(f.tier, &stats, sizeof stats), KVT_STATUS_OK);
        CHECK_STATUS(kvt_tier_take_events(f.tier, events, 2, &ne), KVT_STATUS_OK);
        CHECK(ne == 0);
    }
    /* Job 1 finished (OK) or was cancelled; jobs 2-4 failed at submission. */
    CHECK_STATUS(kvt_tier_poll(f.tier, buf, 4, &n), KVT_STATUS_OK);
    CHECKF(n == 4, "%zu results", n);
    if (n == 4) {
        size_t i;
        for (i = 0; i < n; i++) {
            check_result_invariants(&buf[i], f.block_bytes);
            if (buf[i].job_id == 1) {
                CHECK(buf[i].status == KVT_STATUS_OK || buf[i].status == KVT_STATUS_CANCELLED);
            } else if (buf[i].job_id == 2 || buf[i].job_id == 3) {
                CHECK(buf[i].status == KVT_STATUS_SHUT_DOWN);
            } else {
                CHECK(buf[i].job_id == 4 && buf[i].status != KVT_STATUS_OK);
            }
        }
    }
    CHECK_STATUS(kvt_tier_poll(f.tier, buf, 4, &n), KVT_STATUS_OK);
    CHECK(n == 0);
    CHECK(!fd_readable(fd, 0));
out:
    free(keys);
    fixture_close(&f);
}

/* ------------------------------------------------------------------------------------ */
/* Shutdown and free with jobs in flight                                                */
/* ------------------------------------------------------------------------------------ */

enum { INFLIGHT_SOURCES = 64 };

/* Pre-stores INFLIGHT_SOURCES keys, then submits `jobs` jobs without waiting: even ones
 * store 1-4 source blocks under new keys, odd ones load one pre-stored key into their
 * own block. Returns the number of jobs submitted (all must be accepted). */
static size_t submit_burst(fixture *f, size_t jobs, uint8_t *src_keys, uint8_t *new_keys, uint64_t base_id)
{
    size_t i, accepted = 0;
    if (!store_first_blocks(f, 1, src_keys, INFLIGHT_SOURCES, scaled_ms(10000))) {
        return 0;
    }
    for (i = 0; i < jobs; i++) {
        kvt_status s;
        if (i % 2 == 0) {
            size_t k, nk = 1 + i % 4;
            uint64_t bids[4];
            for (k = 0; k < nk; k++) {
                bids[k] = (i + k) % INFLIGHT_SOURCES;
            }
            s = kvt_tier_submit_store(f->tier, base_id + i, bids, new_keys + 4 * i * KEY_LEN, KEY_LEN, nk);
        } else {
            uint64_t dest = INFLIGHT_SOURCES + i / 2;
            s = kvt_tier_submit_load(f->tier, base_id + i, &dest, src_keys + (i % INFLIGHT_SOURCES) * KEY_LEN,
                                     KEY_LEN, 1);
        }
        accepted += CHECK_STATUS(s, KVT_STATUS_OK);
    }
    return accepted;
}

/* kvt_tier_shutdown right after a burst: each job is reported exactly once, OK (a load
 * byte-exact) or CANCELLED, and nothing more arrives. */
static void shutdown_in_flight(const char *extra)
{
    const size_t jobs = g_small ? 60 : 400;
    const size_t bb = 16384;
    fixture f;
    uint8_t *src_keys = make_keys(INFLIGHT_SOURCES), *new_keys = make_keys(4 * jobs);
    uint8_t *sources = NULL;
    owned_result *res = (owned_result *)xmalloc((jobs + 4) * sizeof(owned_result));
    unsigned char *seen = (unsigned char *)xmalloc(jobs);
    size_t got = 0, i, ok = 0, cancelled = 0, other = 0, dup = 0, unknown = 0, missing = 0, bad_bytes = 0;
    const uint64_t base_id = 10000;
    double t0;

    memset(seen, 0, jobs);
    if (!fixture_open(&f, "local", INFLIGHT_SOURCES + jobs / 2 + 1, bb, extra)) {
        goto out;
    }
    if (submit_burst(&f, jobs, src_keys, new_keys, base_id) != jobs) {
        goto out;
    }
    t0 = now_ms();
    CHECK_STATUS(kvt_tier_shutdown(f.tier), KVT_STATUS_OK);
    printf("    kvt_tier_shutdown with %zu jobs submitted took %.1f ms\n", jobs, now_ms() - t0);
    CHECK(kvt_tier_jobs_in_flight(f.tier) == 0);

    /* The library no longer touches the pool: keep a copy of the sources, then release
     * the pool before the tier (valgrind would flag any later access). */
    sources = (uint8_t *)xmalloc(INFLIGHT_SOURCES * bb);
    memcpy(sources, f.pool, INFLIGHT_SOURCES * bb);

    got = collect(&f, jobs, scaled_ms(5000), 16, res, jobs + 4, NULL);
    CHECKF(got == jobs, "%zu results for %zu jobs", got, jobs);
    for (i = 0; i < got && i < jobs + 4; i++) {
        uint64_t id = res[i].job_id;
        size_t idx = (size_t)(id - base_id);
        if (id < base_id || idx >= jobs) {
            unknown++;
            continue;
        }
        if (seen[idx]++) {
            dup++;
        }
        if (res[i].status == KVT_STATUS_OK) {
            ok++;
            if (idx % 2 == 1 &&
                memcmp(block(&f, INFLIGHT_SOURCES + idx / 2), sources + (idx % INFLIGHT_SOURCES) * bb, bb) != 0) {
                bad_bytes++;
            }
        } else if (res[i].status == KVT_STATUS_CANCELLED) {
            cancelled++;
        } else {
            if (other++ < 3) {
                printf("    job %" PRIu64 ": status %d (%s): %s\n", id, (int)res[i].status,
                       kvt_status_str(res[i].status), res[i].message);
            }
        }
    }
    for (i = 0; i < jobs; i++) {
        missing += !seen[i];
    }
    printf("    %zu OK, %zu CANCELLED, %zu other\n", ok, cancelled, other);
    CHECKF(unknown == 0 && dup == 0 && missing == 0, "unknown %zu, duplicate %zu, missing %zu", unknown, dup,
           missing);
    CHECKF(other == 0, "%zu results neither OK nor CANCELLED", other);
    CHECKF(bad_bytes == 0, "%zu OK loads with wrong bytes", bad_bytes);
    free(f.pool);
    f.pool = NULL;
    {
        kvt_result buf[2];
        size_t n = 9;
        CHECK_STATUS(kvt_tier_poll(f.tier, buf, 2, &n), KVT_STATUS_OK);
        CHECK(n == 0);
    }
out:
    free_collected(res, got, jobs + 4);
    free(seen);
    free(sources);
    free(src_keys);
    free(new_keys);
    fixture_close(&f);
}

/* One transfer at a time, so that most of the burst has not started at shutdown. */
void test_shutdown_in_flight(void) { shutdown_in_flight(",\"max_inflight_transfers\":1"); }

/* No grace: transfers in progress are abandoned at once and reported CANCELLED too (not
 * as I/O errors of their abandoned blocking tasks). */
void test_shutdown_in_flight_no_grace(void)
{
    shutdown_in_flight(",\"max_inflight_transfers\":16,\"shutdown_timeout_ms\":0,\"runtime_threads\":4");
}

/* kvt_tier_free with a burst in flight, its results never polled: the tier and what it
 * holds are released all the same (the leak checks of ASan and valgrind see to it). */
void test_free_in_flight(void)
{
    const size_t jobs = g_small ? 60 : 400;
    fixture f;
    uint8_t *src_keys = make_keys(INFLIGHT_SOURCES), *new_keys = make_keys(4 * jobs);
    double t0;
    if (fixture_open(&f, "local", INFLIGHT_SOURCES + jobs / 2 + 1, 16384, ",\"max_inflight_transfers\":2")) {
        if (submit_burst(&f, jobs, src_keys, new_keys, 20000) == jobs) {
            printf("    %zu jobs in flight at kvt_tier_free\n", kvt_tier_jobs_in_flight(f.tier));
        }
        t0 = now_ms();
        kvt_tier_free(f.tier); /* results never polled: released with the tier */
        f.tier = NULL;
        printf("    kvt_tier_free took %.1f ms\n", now_ms() - t0);
    }
    fixture_close(&f);
    free(src_keys);
    free(new_keys);
}

/* ------------------------------------------------------------------------------------ */
/* The pool after shutdown and free                                                     */
/* ------------------------------------------------------------------------------------ */

/* After kvt_tier_shutdown returns, the library does not touch the pool: it is made
 * inaccessible (any access would fault) while the results, events and counters are
 * collected; after kvt_tier_free, while another tier runs. */
void test_pool_fenced(void)
{
    enum { SOURCES = 32, JOBS = 64 };
    const size_t bb = 16384, nb = SOURCES + JOBS;
    uint8_t *keys = make_keys(SOURCES + JOBS);
    int pass;

    for (pass = 0; pass < 2; pass++) {
        fixture f;
        size_t i, got, ok = 0, cancelled = 0;
        owned_result *res = (owned_result *)xmalloc((JOBS + 1) * sizeof(owned_result));
        uint8_t *pool = (uint8_t *)mmap(NULL, nb * bb, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        got = 0;
        if (!CHECK(pool != MAP_FAILED)) {
            free(res);
            break;
        }
        rng_fill(pool, nb * bb);
        if (!fixture_open(&f, "local", 0, 0, ",\"max_inflight_transfers\":2")) {
            goto next;
        }
        f.num_blocks = nb;
        f.block_bytes = bb;
        CHECK_STATUS(kvt_tier_register_memory(f.tier, pool, nb, bb), KVT_STATUS_OK);
        if (!store_first_blocks(&f, 1, keys, SOURCES, scaled_ms(10000))) {
            goto next;
        }
        for (i = 0; i < JOBS; i++) {
            uint64_t b = i % 2 ? SOURCES + i : i % SOURCES;
            const uint8_t *k = i % 2 ? keys + (i % SOURCES) * KEY_LEN : keys + (SOURCES + i) * KEY_LEN;
            CHECK_STATUS(submit_kind(f.tier, i % 2 ? KVT_JOB_KIND_LOAD : KVT_JOB_KIND_STORE, 100 + i, &b, k, KEY_LEN, 1),
                         KVT_STATUS_OK);
        }
        if (pass == 0) {
            kvt_stats stats;
            kvt_event events[4];
            size_t ne = 0;
            CHECK_STATUS(kvt_tier_shutdown(f.tier), KVT_STATUS_OK);
            CHECK(mprotect(pool, nb * bb, PROT_NONE) == 0);
            got = collect(&f, JOBS, scaled_ms(5000), 8, res, JOBS, NULL);
            CHECKF(got == JOBS, "%zu results for %d jobs", got, JOBS);
            for (i = 0; i < got; i++) {
                ok += res[i].status == KVT_STATUS_OK;
                cancelled += res[i].status == KVT_STATUS_CANCELLED;
            }
            CHECKF(ok + cancelled == got, "%zu OK, %zu CANCELLED of %zu", ok, cancelled, got);
            CHECK_STATUS(kvt_tier_stats(f.tier, &stats, sizeof stats), KVT_STATUS_OK);
            CHECK_STATUS(kvt_tier_take_events(f.tier, events, 4, &ne), KVT_STATUS_OK);
            kvt_tier_free(f.tier);
            f.tier = NULL;
        } else {
            kvt_tier_free(f.tier); /* results never polled */
            f.tier = NULL;
            CHECK(mprotect(pool, nb * bb, PROT_NONE) == 0);
            /* Another tier runs a round trip while the freed tier's pool is fenced. */
            {
                fixture g;
                uint64_t id = 1, zero = 0, one = 1;
                if (fixture_open(&g, "memory", 2, bb, "")) {
                    CHECK_STATUS(kvt_tier_submit_store(g.tier, id, &zero, keys, KEY_LEN, 1), KVT_STATUS_OK);
                    wait_ok(&g, &id, 1, scaled_ms(5000));
                    id = 2;
                    CHECK_STATUS(kvt_tier_submit_load(g.tier, id, &one, keys, KEY_LEN, 1), KVT_STATUS_OK);
                    wait_ok(&g, &id, 1, scaled_ms(5000));
                }
                fixture_close(&g);
            }
        }
    next:
        fixture_close(&f); /* f.pool is NULL: the mapping is this test's */
        munmap(pool, nb * bb);
        free_collected(res, got, JOBS);
    }
    free(keys);
}
