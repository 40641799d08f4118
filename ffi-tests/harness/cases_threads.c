/*
 * ffi-tests/harness/cases_threads.c: the tier used from many threads at once.
 *
 * Eight threads submit stores and loads (and one bad submission each) while the main
 * thread polls on the event fd and another thread looks keys up, ends scheduler steps
 * and reads the counters: every job is reported exactly once, the loads byte-exact, and
 * kvt_last_error() is per thread (another thread's failure does not replace one's own).
 */
#include "harness.h"

#include "cases.h"

#include <pthread.h>
#include <sched.h>

/* One submitting thread. */
typedef struct submitter {
    const fixture *f;
    const uint8_t *src_keys; /* 16 stored keys */
    uint8_t *new_keys;       /* jobs * 2 fresh keys */
    uint64_t base_id;
    size_t jobs;
    size_t rejected;         /* submits that did not return OK */
    int own_error_ok;        /* kvt_last_error() showed this thread's own failure */
} submitter;

static void *submitter_main(void *arg)
{
    submitter *s = (submitter *)arg;
    size_t i;
    uint64_t bad = s->f->num_blocks;
    kvt_status st;
    /* A failure of this thread, visible to this thread only. */
    st = kvt_tier_submit_store(s->f->tier, s->base_id + s->jobs, &bad, s->src_keys, KEY_LEN, 1);
    s->own_error_ok = st == KVT_STATUS_INVALID_ARGUMENT && strstr(kvt_last_error(), "out of range") != NULL;
    for (i = 0; i < s->jobs; i++) {
        uint64_t ids[2];
        ids[0] = i % 16;
        ids[1] = (i + 5) % 16;
        if (i % 3 == 2) { /* a load into this thread's own block */
            uint64_t dest = 16 + (s->base_id / 100000 - 1) * s->jobs + i;
            st = kvt_tier_submit_load(s->f->tier, s->base_id + i, &dest, s->src_keys + (i % 16) * KEY_LEN, KEY_LEN,
                                      1);
        } else {
            st = kvt_tier_submit_store(s->f->tier, s->base_id + i, ids, s->new_keys + 2 * i * KEY_LEN, KEY_LEN, 2);
        }
        s->rejected += st != KVT_STATUS_OK;
    }
    return NULL;
}

static void *set_other_error(void *arg)
{
    int *ok = (int *)arg;
    kvt_tier *t = NULL;
    *ok = kvt_tier_new("{\"store\":{\"type\":\"memory\"},\"thread_marker\":1}", &t) == KVT_STATUS_CONFIG &&
          strstr(kvt_last_error(), "thread_marker") != NULL;
    return NULL;
}

/* Looks keys up, ends steps and reads counters while the submitters run. */
typedef struct prober {
    const fixture *f;
    const uint8_t *keys; /* 16 stored keys */
    volatile int stop;   /* set by the main thread once every result is in */
    pthread_mutex_t lock;
    size_t rounds, failures;
} prober;

static int prober_stopped(prober *p)
{
    int stop;
    pthread_mutex_lock(&p->lock);
    stop = p->stop;
    pthread_mutex_unlock(&p->lock);
    return stop;
}

static void *prober_main(void *arg)
{
    prober *p = (prober *)arg;
    size_t k = 0;
    while (!prober_stopped(p)) {
        kvt_lookup_result verdict;
        kvt_stats stats;
        uint64_t req = 1 + k % 7;
        p->failures += kvt_tier_lookup(p->f->tier, req, p->keys + (k % 16) * KEY_LEN, KEY_LEN, &verdict) != KVT_STATUS_OK;
        p->failures += kvt_tier_schedule_end(p->f->tier) != KVT_STATUS_OK;
        p->failures += kvt_tier_stats(p->f->tier, &stats, sizeof stats) != KVT_STATUS_OK;
        (void)kvt_tier_jobs_in_flight(p->f->tier);
        if (k % 5 == 4) {
            p->failures += kvt_tier_request_finished(p->f->tier, req) != KVT_STATUS_OK;
        }
        k++;
        p->rounds++;
        sched_yield();
    }
    return NULL;
}

/* 8 threads submit while this thread polls on the event fd and another looks keys up. */
void test_threads(void)
{
    enum { THREADS = 8 };
    const size_t per_thread = g_small ? 15 : 75;
    const size_t total = THREADS * (per_thread + 1);
    fixture f;
    submitter subs[THREADS];
    pthread_t tids[THREADS], other;
    uint8_t *src_keys = make_keys(16);
    owned_result *res = NULL;
    unsigned char *seen = NULL;
    size_t i, got = 0, dup = 0, unknown = 0, failed_ok = 0, bad = 0;
    int started = 0, other_ok = 0, probe_started = 0;
    kvt_tier *t = NULL;
    prober probe;
    pthread_t probe_tid;

    memset(subs, 0, sizeof subs);
    memset(&probe, 0, sizeof probe);
    pthread_mutex_init(&probe.lock, NULL);
    /* kvt_last_error() is thread-local: another thread's failure does not replace ours. */
    CHECK_STATUS(kvt_tier_new("{\"store\":{\"type\":\"memory\"},\"main_marker\":1}", &t), KVT_STATUS_CONFIG);
    if (CHECK(pthread_create(&other, NULL, set_other_error, &other_ok) == 0)) {
        pthread_join(other, NULL);
        CHECK(other_ok);
        CHECKF(strstr(kvt_last_error(), "main_marker") != NULL, "main thread's error is now \"%s\"", kvt_last_error());
    }

    if (!fixture_open(&f, "local", 16 + THREADS * per_thread, 4096, "")) {
        goto out;
    }
    if (!store_first_blocks(&f, 1, src_keys, 16, scaled_ms(5000))) {
        goto out;
    }
    for (i = 0; i < THREADS; i++) {
        subs[i].f = &f;
        subs[i].src_keys = src_keys;
        subs[i].new_keys = make_keys(2 * per_thread);
        subs[i].base_id = 100000 * (i + 1);
        subs[i].jobs = per_thread;
    }
    probe.f = &f;
    probe.keys = src_keys;
    probe_started = CHECK(pthread_create(&probe_tid, NULL, prober_main, &probe) == 0);
    for (i = 0; i < THREADS; i++) {
        if (CHECK(pthread_create(&tids[i], NULL, submitter_main, &subs[i]) == 0)) {
            started++;
        }
    }
    /* Poll on this thread while the others submit. */
    res = (owned_result *)xmalloc((total + 8) * sizeof(owned_result));
    got = collect(&f, started == THREADS ? total : 0, scaled_ms(60000), 5, res, total + 8, NULL);
    for (i = 0; i < (size_t)started; i++) {
        pthread_join(tids[i], NULL);
        CHECKF(subs[i].rejected == 0, "thread %zu: %zu submits rejected", i, subs[i].rejected);
        CHECKF(subs[i].own_error_ok, "thread %zu did not see its own error", i);
    }
    if (probe_started) {
        pthread_mutex_lock(&probe.lock);
        probe.stop = 1;
        pthread_mutex_unlock(&probe.lock);
        pthread_join(probe_tid, NULL);
        CHECKF(probe.failures == 0, "%zu of %zu lookup/stats rounds had a failed call", probe.failures, probe.rounds);
        printf("    %zu lookup/stats rounds alongside the submitters\n", probe.rounds);
    }
    CHECKF(got == total, "%zu results for %zu jobs", got, total);
    seen = (unsigned char *)xmalloc(THREADS * (per_thread + 1));
    memset(seen, 0, THREADS * (per_thread + 1));
    for (i = 0; i < got && i < total + 8; i++) {
        uint64_t id = res[i].job_id, th = id / 100000 - 1, k = id % 100000;
        if (th >= THREADS || k > per_thread) {
            unknown++;
            continue;
        }
        if (seen[th * (per_thread + 1) + k]++) {
            dup++;
        }
        if (k == per_thread) {
            failed_ok += res[i].status == KVT_STATUS_INVALID_ARGUMENT;
        } else if (res[i].status != KVT_STATUS_OK) {
            bad++;
        }
    }
    CHECKF(unknown == 0 && dup == 0, "unknown %zu, duplicates %zu", unknown, dup);
    CHECKF(failed_ok == THREADS, "%zu of %d deliberate failures reported", failed_ok, THREADS);
    CHECKF(bad == 0, "%zu jobs failed", bad);
    /* Loads brought back their source blocks. */
    bad = 0;
    for (i = 0; i < (size_t)THREADS * per_thread; i++) {
        size_t j = i % per_thread;
        if (j % 3 == 2) {
            bad += memcmp(block(&f, 16 + i), block(&f, j % 16), f.block_bytes) != 0;
        }
    }
    CHECKF(bad == 0, "%zu loaded blocks differ", bad);
out:
    free_collected(res, got, total + 8);
    free(seen);
    for (i = 0; i < THREADS; i++) {
        free(subs[i].new_keys);
    }
    free(src_keys);
    fixture_close(&f);
    pthread_mutex_destroy(&probe.lock);
}
