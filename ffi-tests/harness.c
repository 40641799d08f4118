/*
 * ffi-tests/harness.c: conformance tests for the kvtier C ABI (include/kvtier.h).
 *
 * Strict C11 (plus POSIX: mkdtemp, nftw, poll, pthreads); also compiles as C++17
 * (run.sh builds it both ways). Links against libkvtier.so.0 (-lkvtier -pthread).
 *
 *   harness [NAME_SUBSTRING...]      run every case, or only the cases whose name
 *                                    contains one of the arguments
 *
 * Environment:
 *   KVT_HARNESS_SMALL=1              shrink the many-jobs case from 1000 to 100 jobs
 *                                    (for valgrind)
 *   KVT_HARNESS_TIMEOUT_SCALE=N      multiply every wait deadline by N (slow runners)
 *   KVT_HARNESS_SEED=N               seed of the block contents / key generator
 *   KVT_HARNESS_SKIP=a,b             cases not to run here, each reported as SKIPPED
 *                                    (scripts/test-aarch64.sh: fork under qemu-user)
 *   KVT_HARNESS_XFAIL=a,b            cases that fail because of a known library bug:
 *                                    reported as XFAIL instead of failing the run;
 *                                    if such a case passes it is reported as XPASS
 *                                    and counts as a failure (remove it from the list)
 *
 * The last line of output is exactly "N passed, M failed" (N, M = test cases); the exit
 * status is non-zero when M > 0.
 */
#ifndef _XOPEN_SOURCE
#define _XOPEN_SOURCE 700 /* mkdtemp, nftw, poll, clock_gettime */
#endif
#ifndef _DEFAULT_SOURCE
#define _DEFAULT_SOURCE /* MAP_ANONYMOUS */
#endif

#include "kvtier.h"

#include <errno.h>
#include <ftw.h>
#include <inttypes.h>
#include <math.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#if defined(__GNUC__)
#define KVT_PRINTF(fmt_index, first_arg) __attribute__((format(printf, fmt_index, first_arg)))
#else
#define KVT_PRINTF(fmt_index, first_arg)
#endif

/* ------------------------------------------------------------------------------------ */
/* Tiny test framework                                                                   */
/* ------------------------------------------------------------------------------------ */

static long g_checks;          /* assertions evaluated, whole run */
static long g_check_failures;  /* assertions failed, whole run */
static int g_case_failures;    /* assertions failed in the current case */

static int g_small;            /* KVT_HARNESS_SMALL */
static int g_timeout_scale = 1;
static uint64_t g_seed = 0x6b7674696572ULL;

static void report_failure(const char *file, int line, const char *what, const char *last_error)
{
    printf("    FAIL %s:%d: %s\n         kvt_last_error(): \"%s\"\n", file, line, what,
           last_error ? last_error : "(null)");
    fflush(stdout);
}

/* Every CHECK reads kvt_last_error() right after its expression, before any other kvt_
 * call, so the message printed for a failing call is that call's own. */
static int check_impl(int ok, const char *expr, const char *file, int line)
{
    g_checks++;
    if (!ok) {
        g_check_failures++;
        g_case_failures++;
        report_failure(file, line, expr, kvt_last_error());
    }
    return ok;
}

static int checkf_impl(int ok, const char *expr, const char *file, int line, const char *fmt, ...)
    KVT_PRINTF(5, 6);
static int checkf_impl(int ok, const char *expr, const char *file, int line, const char *fmt, ...)
{
    g_checks++;
    if (!ok) {
        char context[512];
        char what[1024];
        const char *last_error = kvt_last_error();
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(context, sizeof context, fmt, ap);
        va_end(ap);
        snprintf(what, sizeof what, "%s  [%s]", expr, context);
        g_check_failures++;
        g_case_failures++;
        report_failure(file, line, what, last_error);
    }
    return ok;
}

/* A call's status: must equal `want`; a failure must come with a non-empty
 * kvt_last_error(), a success with "" (as the header promises). */
static int check_status_impl(int got, int want, const char *expr, const char *file, int line)
{
    const char *last_error = kvt_last_error();
    int ok = got == want;
    char what[1024];
    g_checks++;
    if (ok && want != KVT_STATUS_OK && (last_error == NULL || last_error[0] == '\0')) {
        snprintf(what, sizeof what, "%s returned %d (%s) as expected, but kvt_last_error() is empty",
                 expr, got, kvt_status_str(got));
        ok = 0;
    } else if (ok && want == KVT_STATUS_OK && (last_error == NULL || last_error[0] != '\0')) {
        snprintf(what, sizeof what, "%s succeeded, but kvt_last_error() is not \"\" afterwards", expr);
        ok = 0;
    } else if (!ok) {
        snprintf(what, sizeof what, "%s returned %d (%s), want %d (%s)", expr, got, kvt_status_str(got), want,
                 kvt_status_str(want));
    }
    if (!ok) {
        g_check_failures++;
        g_case_failures++;
        report_failure(file, line, what, last_error);
    }
    return ok;
}

#define CHECK(cond) check_impl((cond) ? 1 : 0, #cond, __FILE__, __LINE__)
#define CHECKF(cond, ...) checkf_impl((cond) ? 1 : 0, #cond, __FILE__, __LINE__, __VA_ARGS__)
#define CHECK_STATUS(expr, want) check_status_impl((int)(expr), (int)(want), #expr, __FILE__, __LINE__)
/* Stop the current case when a precondition fails (the fixture is still cleaned up by
 * the caller of the case body). */
#define REQUIRE(cond)                                                                      \
    do {                                                                                   \
        if (!CHECK(cond))                                                                  \
            return;                                                                        \
    } while (0)

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

static int scaled_ms(int ms) { return ms * g_timeout_scale; }

/* xorshift64*: deterministic block contents and keys. */
static uint64_t g_rng;
static uint64_t rng_next(void)
{
    g_rng ^= g_rng >> 12;
    g_rng ^= g_rng << 25;
    g_rng ^= g_rng >> 27;
    return g_rng * 0x2545F4914F6CDD1DULL;
}

static void rng_fill(uint8_t *dst, size_t n)
{
    size_t i = 0;
    while (i < n) {
        uint64_t v = rng_next();
        size_t k;
        for (k = 0; k < 8 && i < n; k++, i++) {
            dst[i] = (uint8_t)(v >> (8 * k));
        }
    }
}

static void *xmalloc(size_t n)
{
    void *p = malloc(n ? n : 1);
    if (p == NULL) {
        fprintf(stderr, "out of memory (%zu bytes)\n", n);
        exit(2);
    }
    return p;
}

/* ------------------------------------------------------------------------------------ */
/* Keys, temp dirs, fixture                                                              */
/* ------------------------------------------------------------------------------------ */

enum { KEY_LEN = KVT_DEFAULT_KEY_BYTES, HASH_LEN = KVT_DEFAULT_KEY_BYTES - KVT_KEY_GROUP_BYTES };

/* A key: 32 random hash bytes followed by the group index, 4 bytes big-endian. */
static void make_key(uint8_t *key, uint32_t group)
{
    rng_fill(key, HASH_LEN);
    key[HASH_LEN + 0] = (uint8_t)(group >> 24);
    key[HASH_LEN + 1] = (uint8_t)(group >> 16);
    key[HASH_LEN + 2] = (uint8_t)(group >> 8);
    key[HASH_LEN + 3] = (uint8_t)group;
}

static uint8_t *make_keys(size_t n)
{
    uint8_t *keys = (uint8_t *)xmalloc(n * KEY_LEN);
    size_t i;
    for (i = 0; i < n; i++) {
        make_key(keys + i * KEY_LEN, (uint32_t)(i % 3));
    }
    return keys;
}

static int rm_entry(const char *path, const struct stat *sb, int type, struct FTW *ftw)
{
    (void)sb;
    (void)ftw;
    if (type == FTW_DP) {
        rmdir(path);
    } else {
        unlink(path);
    }
    return 0;
}

static void rm_rf(const char *dir)
{
    if (dir[0] != '\0') {
        nftw(dir, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
    }
}

static int make_temp_dir(char *out, size_t cap)
{
    const char *base = getenv("TMPDIR");
    if (base == NULL || base[0] == '\0') {
        base = "/tmp";
    }
    snprintf(out, cap, "%s/kvtier-harness-XXXXXX", base);
    if (mkdtemp(out) == NULL) {
        printf("    mkdtemp(%s): %s\n", out, strerror(errno));
        out[0] = '\0';
        return 0;
    }
    return 1;
}

typedef struct fixture {
    kvt_tier *tier;
    uint8_t *pool;
    uint64_t num_blocks;
    size_t block_bytes;
    char dir[512]; /* local store root ("" for a memory store); removed on close */
    char prefix[64]; /* the prefix of a KVT_HARNESS_STORE tier */
} fixture;

static uint8_t *block(const fixture *f, uint64_t id) { return f->pool + id * f->block_bytes; }

/* Opens a tier on a fresh store ("memory", "local", or "env": the JSON store section in
 * KVT_HARNESS_STORE, else a local store) with `extra` appended to the
 * top-level JSON object (e.g. ",\"max_inflight_transfers\":1"), and registers a pool of
 * random bytes unless num_blocks is 0. */
static int fixture_open(fixture *f, const char *store, uint64_t num_blocks, size_t block_bytes,
                        const char *extra)
{
    char json[1024];
    memset(f, 0, sizeof *f);
    if (strcmp(store, "env") == 0 && getenv("KVT_HARNESS_STORE") != NULL && *getenv("KVT_HARNESS_STORE")) {
        /* A store section from the environment (ffi-tests/on_s3_servers.py names a real S3
         * server there), under a prefix of this run's own. */
        snprintf(f->prefix, sizeof f->prefix, "harness-%ld-%" PRIu64, (long)getpid(), rng_next() % 1000000);
        snprintf(json, sizeof json, "{\"store\":%s,\"prefix\":\"%s\"%s}", getenv("KVT_HARNESS_STORE"),
                 f->prefix, extra ? extra : "");
    } else if (strcmp(store, "local") == 0 || strcmp(store, "env") == 0) {
        if (!CHECK(make_temp_dir(f->dir, sizeof f->dir))) {
            return 0;
        }
        snprintf(json, sizeof json, "{\"store\":{\"type\":\"local\",\"path\":\"%s/store\"}%s}", f->dir,
                 extra ? extra : "");
    } else {
        snprintf(json, sizeof json, "{\"store\":{\"type\":\"memory\"}%s}", extra ? extra : "");
    }
    if (!CHECK_STATUS(kvt_tier_new(json, &f->tier), KVT_STATUS_OK) || !CHECK(f->tier != NULL)) {
        printf("    config was: %s\n", json);
        f->tier = NULL;
        return 0;
    }
    f->num_blocks = num_blocks;
    f->block_bytes = block_bytes;
    if (num_blocks > 0) {
        f->pool = (uint8_t *)xmalloc((size_t)num_blocks * block_bytes);
        rng_fill(f->pool, (size_t)num_blocks * block_bytes);
        if (!CHECK_STATUS(kvt_tier_register_memory(f->tier, f->pool, num_blocks, block_bytes), KVT_STATUS_OK)) {
            return 0;
        }
    }
    return 1;
}

/* Frees the tier first (it may still use the pool until then), then the pool. */
static void fixture_close(fixture *f)
{
    kvt_tier_free(f->tier);
    f->tier = NULL;
    free(f->pool);
    f->pool = NULL;
    rm_rf(f->dir);
    f->dir[0] = '\0';
}

/* ------------------------------------------------------------------------------------ */
/* Results                                                                               */
/* ------------------------------------------------------------------------------------ */

/* A copy of one kvt_result (its arrays die at the next poll). */
typedef struct owned_result {
    uint64_t job_id;
    kvt_job_kind kind;
    kvt_status status;
    uint64_t bytes;
    double seconds;
    size_t num_keys;
    size_t num_failed_keys;
    kvt_status *key_status;
    char *message;
} owned_result;

static void free_results(owned_result *r, size_t n)
{
    size_t i;
    for (i = 0; i < n; i++) {
        free(r[i].key_status);
        free(r[i].message);
    }
}

/* Checks what every result must satisfy, whatever its job. */
static void check_result_invariants(const kvt_result *r, size_t block_bytes)
{
    size_t i, failed = 0;
    int first_bad = -1;
    uint64_t id = r->job_id;
    CHECKF(r->kind == KVT_JOB_KIND_STORE || r->kind == KVT_JOB_KIND_LOAD, "job %" PRIu64, id);
    CHECKF(r->message != NULL, "job %" PRIu64, id);
    CHECKF(r->num_keys == 0 || r->key_status != NULL, "job %" PRIu64, id);
    CHECKF(r->seconds >= 0.0 && isfinite(r->seconds), "job %" PRIu64 " seconds=%g", id, r->seconds);
    if (r->num_keys > 0 && r->key_status != NULL) {
        for (i = 0; i < r->num_keys; i++) {
            if (r->key_status[i] != KVT_STATUS_OK) {
                failed++;
                if (first_bad < 0) {
                    first_bad = (int)i;
                }
            }
        }
    }
    CHECKF(r->num_failed_keys == failed, "job %" PRIu64 ": num_failed_keys=%zu, non-OK key statuses=%zu", id,
           r->num_failed_keys, failed);
    if (first_bad >= 0) {
        CHECKF(r->status == r->key_status[first_bad], "job %" PRIu64 ": status %d but first failing key has %d",
               id, (int)r->status, (int)r->key_status[first_bad]);
    }
    if (r->status == KVT_STATUS_OK) {
        CHECKF(failed == 0, "job %" PRIu64, id);
        CHECKF(r->message != NULL && r->message[0] == '\0', "job %" PRIu64 " OK but message \"%s\"", id,
               r->message ? r->message : "(null)");
    } else {
        CHECKF(r->message != NULL && r->message[0] != '\0', "job %" PRIu64 " failed (%d) with an empty message",
               id, (int)r->status);
    }
    CHECKF(r->bytes == (uint64_t)(r->num_keys - failed) * block_bytes,
           "job %" PRIu64 ": bytes=%" PRIu64 ", keys=%zu, failed=%zu, block_bytes=%zu", id, r->bytes,
           r->num_keys, failed, block_bytes);
}

static void copy_result(owned_result *dst, const kvt_result *src)
{
    dst->job_id = src->job_id;
    dst->kind = src->kind;
    dst->status = src->status;
    dst->bytes = src->bytes;
    dst->seconds = src->seconds;
    dst->num_keys = src->num_keys;
    dst->num_failed_keys = src->num_failed_keys;
    dst->key_status = (kvt_status *)xmalloc(src->num_keys * sizeof(kvt_status));
    if (src->num_keys > 0 && src->key_status != NULL) {
        memcpy(dst->key_status, src->key_status, src->num_keys * sizeof(kvt_status));
    }
    dst->message = (char *)xmalloc(src->message ? strlen(src->message) + 1 : 1);
    strcpy(dst->message, src->message ? src->message : "");
}

static int fd_readable(int fd, int timeout_ms)
{
    struct pollfd p;
    int r;
    p.fd = fd;
    p.events = POLLIN;
    p.revents = 0;
    do {
        r = poll(&p, 1, timeout_ms);
    } while (r < 0 && errno == EINTR);
    return r > 0 && (p.revents & POLLIN) != 0;
}

/* Collects results until `want` have arrived or `timeout_ms` passes, `capacity` per
 * kvt_tier_poll call, sleeping in poll(2) on the tier's event fd between polls. Every
 * result is checked against the invariants and copied into out[0..out_cap). Returns the
 * number of results collected; *polls (if not NULL) receives the number of poll calls
 * that returned at least one result. */
static size_t collect(const fixture *f, size_t want, int timeout_ms, size_t capacity, owned_result *out,
                      size_t out_cap, size_t *polls)
{
    size_t got = 0, nonempty = 0;
    kvt_result *buf = (kvt_result *)xmalloc(capacity * sizeof(kvt_result));
    int fd = kvt_tier_event_fd(f->tier);
    double deadline = now_ms() + timeout_ms;
    CHECK(fd >= 0);
    while (got < want) {
        size_t n = 12345, i;
        double left = deadline - now_ms();
        if (left <= 0) {
            break;
        }
        if (fd >= 0) {
            fd_readable(fd, left > 100 ? 100 : (int)left + 1);
        }
        if (!CHECK_STATUS(kvt_tier_poll(f->tier, buf, capacity, &n), KVT_STATUS_OK)) {
            break;
        }
        CHECK(n <= capacity);
        if (n > 0) {
            nonempty++;
        }
        for (i = 0; i < n; i++) {
            check_result_invariants(&buf[i], f->block_bytes);
            if (got < out_cap) {
                copy_result(&out[got], &buf[i]);
            }
            got++;
        }
    }
    free(buf);
    if (polls) {
        *polls = nonempty;
    }
    if (got < want) {
        printf("    collect: %zu of %zu results after %d ms (%zu jobs in flight)\n", got, want, timeout_ms,
               kvt_tier_jobs_in_flight(f->tier));
    }
    return got;
}

/* Polls until nothing is queued, checking each result's invariants; returns how many. */
static size_t discard_results(const fixture *f)
{
    kvt_result buf[16];
    size_t total = 0, n = 0, i;
    do {
        if (!CHECK_STATUS(kvt_tier_poll(f->tier, buf, 16, &n), KVT_STATUS_OK)) {
            break;
        }
        for (i = 0; i < n; i++) {
            check_result_invariants(&buf[i], f->block_bytes);
        }
        total += n;
    } while (n > 0);
    return total;
}

/* Polls once, expecting exactly one result, for `job_id`, already queued (submission
 * failures are reported synchronously). */
static int expect_one_queued(const fixture *f, uint64_t job_id, owned_result *out)
{
    kvt_result buf[4];
    size_t n = 99;
    int fd = kvt_tier_event_fd(f->tier);
    CHECKF(fd >= 0 && fd_readable(fd, 0), "event fd readable while job %" PRIu64 "'s result waits", job_id);
    if (!CHECK_STATUS(kvt_tier_poll(f->tier, buf, 4, &n), KVT_STATUS_OK)) {
        return 0;
    }
    if (!CHECKF(n == 1, "job %" PRIu64 ": %zu results queued, want 1", job_id, n)) {
        return 0;
    }
    check_result_invariants(&buf[0], f->block_bytes);
    copy_result(out, &buf[0]);
    CHECKF(buf[0].job_id == job_id, "got job %" PRIu64 ", want %" PRIu64, buf[0].job_id, job_id);
    CHECKF(!fd_readable(fd, 0), "event fd not readable after the only result was polled (job %" PRIu64 ")",
           job_id);
    return buf[0].job_id == job_id;
}

/* Waits for the given job ids (each exactly once, nothing else), all expected OK. */
static int wait_ok(const fixture *f, const uint64_t *ids, size_t n, int timeout_ms)
{
    owned_result *res = (owned_result *)xmalloc(n * sizeof(owned_result));
    size_t got = collect(f, n, timeout_ms, 8, res, n, NULL);
    size_t i, j;
    int ok = CHECKF(got == n, "%zu of %zu results", got, n);
    for (i = 0; i < got && i < n; i++) {
        int known = 0;
        for (j = 0; j < n; j++) {
            known |= res[i].job_id == ids[j];
        }
        ok &= CHECKF(known, "unexpected job %" PRIu64, res[i].job_id);
        ok &= CHECKF(res[i].status == KVT_STATUS_OK, "job %" PRIu64 " status %d (%s): %s", res[i].job_id,
                     (int)res[i].status, kvt_status_str(res[i].status), res[i].message);
        for (j = 0; j < i; j++) {
            ok &= CHECKF(res[j].job_id != res[i].job_id, "job %" PRIu64 " reported twice", res[i].job_id);
        }
    }
    free_results(res, got < n ? got : n);
    free(res);
    return ok;
}

/* ------------------------------------------------------------------------------------ */
/* a. version, h. status strings                                                         */
/* ------------------------------------------------------------------------------------ */

static void test_version(void)
{
    const char *v = kvt_version();
    int major = -1, minor = -1, patch = -1;
    char expect[64];
    REQUIRE(v != NULL);
    CHECKF(strcmp(v, KVTIER_VERSION) == 0, "kvt_version() \"%s\", header \"%s\"", v, KVTIER_VERSION);
    CHECK(sscanf(v, "%d.%d.%d", &major, &minor, &patch) == 3);
    CHECK(major == KVTIER_VERSION_MAJOR);
    CHECK(minor == KVTIER_VERSION_MINOR);
    CHECK(patch == KVTIER_VERSION_PATCH);
    snprintf(expect, sizeof expect, "%d.%d.%d", KVTIER_VERSION_MAJOR, KVTIER_VERSION_MINOR, KVTIER_VERSION_PATCH);
    CHECK(strcmp(expect, KVTIER_VERSION) == 0);
    CHECK(kvt_version() == v); /* static storage */
}

static void test_status_str(void)
{
    static const int codes[] = {
        KVT_STATUS_OK,           KVT_STATUS_NULL_ARGUMENT,   KVT_STATUS_INVALID_ARGUMENT,
        KVT_STATUS_CONFIG,       KVT_STATUS_CONNECT,         KVT_STATUS_IO,
        KVT_STATUS_NOT_FOUND,    KVT_STATUS_STATE,           KVT_STATUS_PANIC,
        KVT_STATUS_DUPLICATE_JOB, KVT_STATUS_SHUT_DOWN,      KVT_STATUS_CANCELLED,
        KVT_STATUS_TIMEOUT,      KVT_STATUS_LENGTH_MISMATCH, KVT_STATUS_CORRUPT,
        KVT_STATUS_AUTH,         KVT_STATUS_PERMISSION_DENIED, KVT_STATUS_BUCKET_NOT_FOUND,
        KVT_STATUS_TLS,          KVT_STATUS_FORKED,          KVT_STATUS_BLOCK_BUSY,
        KVT_STATUS_UNDECRYPTABLE,
    };
    const size_t n = sizeof codes / sizeof codes[0];
    const char *unknown = kvt_status_str(-1);
    size_t i, j;
    CHECK(n == 22);
    for (i = 0; i < n; i++) {
        const char *s = kvt_status_str(codes[i]);
        CHECKF(codes[i] == (int)i, "code %d at position %zu: the ABI numbers are contiguous", codes[i], i);
        if (!CHECKF(s != NULL && s[0] != '\0', "kvt_status_str(%d)", codes[i])) {
            continue;
        }
        CHECKF(unknown == NULL || strcmp(s, unknown) != 0, "kvt_status_str(%d) = \"%s\"", codes[i], s);
        for (j = 0; j < i; j++) {
            CHECKF(strcmp(s, kvt_status_str(codes[j])) != 0, "codes %d and %d share \"%s\"", codes[i], codes[j], s);
        }
    }
    CHECK(strcmp(kvt_status_str(KVT_STATUS_OK), "ok") == 0);
    REQUIRE(unknown != NULL);
    CHECK(strcmp(unknown, "unknown status") == 0);
    CHECK(strcmp(kvt_status_str(22), "unknown status") == 0);
    CHECK(strcmp(kvt_status_str(1000000), "unknown status") == 0);
}

/* ------------------------------------------------------------------------------------ */
/* b. round trip                                                                         */
/* ------------------------------------------------------------------------------------ */

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
    if (kvt_tier_jobs_in_flight(f.tier) > 0) {
        /* Leave no job behind: shut down (cancelling what is stuck), then check and drop
         * the remaining results. */
        printf("    %zu jobs still in flight; shutting the tier down\n", kvt_tier_jobs_in_flight(f.tier));
        CHECK_STATUS(kvt_tier_shutdown(f.tier), KVT_STATUS_OK);
        CHECK(kvt_tier_jobs_in_flight(f.tier) == 0);
        discard_results(&f);
    }
    free(keys);
    free(saved);
    free(load_keys);
    fixture_close(&f);
}

static void test_roundtrip_local(void) { round_trip("local"); }
static void test_roundtrip_memory(void) { round_trip("memory"); }

/* ------------------------------------------------------------------------------------ */
/* c. many jobs in flight                                                                */
/* ------------------------------------------------------------------------------------ */

static void test_many_jobs(void)
{
    const size_t jobs = g_small ? 100 : 1000;
    const size_t bb = 4096;
    const uint64_t sources = 16;              /* blocks 0..15: stored once up front */
    const uint64_t first_dest = sources;      /* one destination block per load job */
    const uint64_t blocks = sources + jobs / 2 + 1;
    const uint64_t base_id = 1u << 20, stride = 3;
    fixture f;
    uint8_t *src_keys = NULL, *job_keys = NULL;
    uint64_t src_ids[16], setup_id = 7;
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
    for (i = 0; i < sources; i++) {
        src_ids[i] = i;
    }
    CHECK_STATUS(kvt_tier_submit_store(f.tier, setup_id, src_ids, src_keys, KEY_LEN, sources), KVT_STATUS_OK);
    if (!wait_ok(&f, &setup_id, 1, scaled_ms(5000))) {
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
    if (res) {
        free_results(res, got < jobs + 8 ? got : jobs + 8);
    }
    free(res);
    free(seen);
    free(load_src);
    free(src_keys);
    free(job_keys);
    fixture_close(&f);
}

/* ------------------------------------------------------------------------------------ */
/* d. partial load failure                                                               */
/* ------------------------------------------------------------------------------------ */

static void test_partial_load(void)
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

/* ------------------------------------------------------------------------------------ */
/* e./f. bad submissions                                                                 */
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

static kvt_status submit_kind(kvt_tier *t, kvt_job_kind kind, uint64_t id, const uint64_t *ids, const uint8_t *keys,
                              size_t key_len, size_t n)
{
    return kind == KVT_JOB_KIND_STORE ? kvt_tier_submit_store(t, id, ids, keys, key_len, n)
                                      : kvt_tier_submit_load(t, id, ids, keys, key_len, n);
}

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

/* e. Each bad submission yields exactly one failed result with its id, queued at once. */
static void test_submit_failures_yield_one_result(void)
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

/* f. Every bad submission returns its code with a message (store and load alike). */
static void test_submit_bad_args(void)
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

/* f. NULL tier to every function. */
static void test_null_tier(void)
{
    uint8_t pool[64], keys[KEY_LEN] = {0};
    uint64_t ids[1] = {0};
    kvt_result buf[2];
    size_t n = 77;

    CHECK_STATUS(kvt_tier_register_memory(NULL, pool, 1, sizeof pool), KVT_STATUS_NULL_ARGUMENT);
    CHECK_STATUS(kvt_tier_submit_store(NULL, 1, ids, keys, KEY_LEN, 1), KVT_STATUS_NULL_ARGUMENT);
    CHECK_STATUS(kvt_tier_submit_load(NULL, 1, ids, keys, KEY_LEN, 1), KVT_STATUS_NULL_ARGUMENT);
    CHECK_STATUS(kvt_tier_poll(NULL, buf, 2, &n), KVT_STATUS_NULL_ARGUMENT);
    CHECK(n == 0);
    n = 77;
    CHECK_STATUS(kvt_tier_poll(NULL, NULL, 0, &n), KVT_STATUS_NULL_ARGUMENT);
    CHECK(n == 0);
    CHECK_STATUS(kvt_tier_poll(NULL, buf, 2, NULL), KVT_STATUS_NULL_ARGUMENT);
    CHECK_STATUS(kvt_tier_drain(NULL, 0), KVT_STATUS_NULL_ARGUMENT);
    CHECK_STATUS(kvt_tier_shutdown(NULL), KVT_STATUS_NULL_ARGUMENT);
    CHECK(kvt_tier_event_fd(NULL) == -1);
    CHECK(kvt_last_error()[0] != '\0');
    CHECK(kvt_tier_jobs_in_flight(NULL) == 0);
    CHECK(kvt_last_error()[0] != '\0');
    CHECK(kvt_tier_location(NULL) == NULL);
    CHECK(kvt_last_error()[0] != '\0');
    kvt_tier_free(NULL); /* no-op */
    CHECK(kvt_last_error()[0] == '\0');
}

/* f. kvt_tier_new: NULL arguments and bad configurations. */
static void test_config_errors(void)
{
    static const struct {
        const char *json;
        const char *must_mention; /* NULL: any non-empty message */
    } bad[] = {
        {"", NULL},
        {"{", NULL},
        {"not json", NULL},
        {"[]", NULL},
        {"{}", "store"},
        {"{\"store\":{\"type\":\"memory\"},\"prefx\":\"a\"}", "prefx"},
        {"{\"store\":{\"type\":\"memory\"},\"bogus_key\":1}", "bogus_key"},
        {"{\"store\":{\"type\":\"memory\",\"colour\":1}}", "colour"},
        {"{\"store\":{\"type\":\"ftp\"}}", "ftp"},
        {"{\"store\":{\"type\":\"memory\"},\"runtime_threads\":0}", "runtime_threads"},
        {"{\"store\":{\"type\":\"memory\"},\"key_bytes\":3}", "key_bytes"},
        {"{\"store\":{\"type\":\"memory\"},\"prefix\":\"a|b\"}", "prefix"},
        {"{\"store\":{\"type\":\"memory\"},\"key_bytes\":\"36\"}", NULL},
        /* Malformed endpoints are configuration errors found before any request (with
         * explicit keys and with the credential chain). */
        {"{\"store\":{\"type\":\"s3\",\"bucket\":\"b\",\"endpoint_override\":\"http://[::1\","
         "\"access_key\":\"ak\",\"secret_key\":\"sk\"}}", "endpoint_override"},
        {"{\"store\":{\"type\":\"s3\",\"bucket\":\"b\",\"endpoint_override\":\"http://[::1\"}}",
         "endpoint_override"},
        {"{\"store\":{\"type\":\"s3\",\"bucket\":\"b\",\"endpoint_override\":\"http://127.0.0.1:99999\","
         "\"access_key\":\"ak\",\"secret_key\":\"sk\"}}", "endpoint_override"},
        {"{\"store\":{\"type\":\"s3\",\"bucket\":\"b\",\"endpoint_override\":\"ht!tp://x\","
         "\"access_key\":\"ak\",\"secret_key\":\"sk\"}}", "endpoint_override"},
        {"{\"store\":{\"type\":\"s3\",\"bucket\":\"b\",\"endpoint_override\":\"ftp://host:21\","
         "\"access_key\":\"ak\",\"secret_key\":\"sk\"}}", "endpoint_override"},
        {"{\"store\":{\"type\":\"s3\",\"bucket\":\"b\",\"endpoint_override\":\"host:port\","
         "\"access_key\":\"ak\",\"secret_key\":\"sk\"}}", "endpoint_override"},
        {"{\"store\":{\"type\":\"s3\",\"bucket\":\"b\",\"endpoint_override\":\"http://a b:9000\","
         "\"access_key\":\"ak\",\"secret_key\":\"sk\"}}", "endpoint_override"},
        {"{\"store\":{\"type\":\"s3\",\"bucket\":\"b\",\"endpoint_override\":\"http://:9000\","
         "\"access_key\":\"ak\",\"secret_key\":\"sk\"}}", "endpoint_override"},
    };
    size_t i;
    kvt_tier *t;
    uint8_t bad_utf8[] = {'{', '"', 0xff, 0xfe, '"', '}', 0};

    t = (kvt_tier *)&t; /* a non-NULL sentinel: must be reset to NULL */
    CHECK_STATUS(kvt_tier_new(NULL, &t), KVT_STATUS_NULL_ARGUMENT);
    CHECK(t == NULL);
    CHECK_STATUS(kvt_tier_new("{\"store\":{\"type\":\"memory\"}}", NULL), KVT_STATUS_NULL_ARGUMENT);
    CHECK_STATUS(kvt_tier_new(NULL, NULL), KVT_STATUS_NULL_ARGUMENT);
    for (i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        t = (kvt_tier *)&t;
        if (CHECKF(kvt_tier_new(bad[i].json, &t) == KVT_STATUS_CONFIG, "config '%s'", bad[i].json)) {
            const char *e = kvt_last_error();
            CHECKF(e[0] != '\0', "config '%s': empty message", bad[i].json);
            if (bad[i].must_mention) {
                CHECKF(strstr(e, bad[i].must_mention) != NULL, "config '%s': message \"%s\" does not name \"%s\"",
                       bad[i].json, e, bad[i].must_mention);
            }
        }
        CHECKF(t == NULL, "config '%s': *out_tier not reset to NULL", bad[i].json);
        if (t != NULL && t != (kvt_tier *)&t) {
            kvt_tier_free(t);
        }
    }
    t = (kvt_tier *)&t;
    CHECK_STATUS(kvt_tier_new((const char *)bad_utf8, &t), KVT_STATUS_CONFIG);
    CHECK(t == NULL);

    /* A good configuration afterwards works, and clears the last error. */
    CHECK_STATUS(kvt_tier_new("{\"store\":{\"type\":\"memory\"},\"key_bytes\":0,\"runtime_threads\":1,"
                              "\"max_inflight_transfers\":4,\"max_inflight_lookups\":4,"
                              "\"shutdown_timeout_ms\":100,\"prefix\":\"a/b\",\"namespace\":\"ns\"}",
                              &t),
                 KVT_STATUS_OK);
    CHECK(t != NULL);
    kvt_tier_free(t);
}

/* A local store that cannot take files fails at kvt_tier_new, naming the directory,
 * instead of failing every store job later. */
static void test_local_unwritable(void)
{
    char dir[512], json[1024];
    kvt_tier *t = (kvt_tier *)&t;
    kvt_status s;

    s = kvt_tier_new("{\"store\":{\"type\":\"local\",\"path\":\"/proc/1\"}}", &t);
    CHECKF(s == KVT_STATUS_CONFIG || s == KVT_STATUS_PERMISSION_DENIED, "/proc/1: returned %d (%s)", (int)s,
           kvt_status_str(s));
    CHECKF(strstr(kvt_last_error(), "/proc/1") != NULL && strstr(kvt_last_error(), "writable") != NULL,
           "message \"%s\"", kvt_last_error());
    CHECK(t == NULL);
    if (t != NULL && t != (kvt_tier *)&t) {
        kvt_tier_free(t);
    }
    /* A read-only directory (permissions do not bind root, so only as another user). */
    if (geteuid() != 0 && make_temp_dir(dir, sizeof dir)) {
        snprintf(json, sizeof json, "{\"store\":{\"type\":\"local\",\"path\":\"%s\"}}", dir);
        CHECK(chmod(dir, 0555) == 0);
        t = NULL;
        CHECK_STATUS(kvt_tier_new(json, &t), KVT_STATUS_PERMISSION_DENIED);
        CHECK(t == NULL);
        kvt_tier_free(t);
        chmod(dir, 0755);
        rm_rf(dir);
    }
}

/* f. Duplicate in-flight job id: DUPLICATE_JOB, and only one result for that id. */
static void test_duplicate_job(void)
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
static void test_block_busy(void)
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

/* f. Submit before register_memory; register twice; bad registrations. */
static void test_state_errors(void)
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

/* f. Drain leaves the tier fully usable; drain with nothing in flight is OK at once. */
static void test_after_drain(void)
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

/* f. A drain that times out cancels nothing: the jobs still finish and report OK. */
static void test_drain_timeout(void)
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

/* The event fd is readable exactly while results wait, also after a partial poll. */
static void test_event_fd(void)
{
    fixture f;
    kvt_result buf[4];
    size_t n = 0;
    uint64_t id0 = 0;
    uint8_t *keys = make_keys(1);
    int fd;
    if (!fixture_open(&f, "local", 1, 4096, "")) {
        goto out;
    }
    fd = kvt_tier_event_fd(f.tier);
    if (!CHECK(fd >= 0)) {
        goto out;
    }
    CHECK(kvt_tier_event_fd(f.tier) == fd); /* stable */
    CHECK(!fd_readable(fd, 0));
    /* Three results queued at once (submission failures), taken one, then two. */
    CHECK_STATUS(kvt_tier_submit_store(f.tier, 1, NULL, keys, KEY_LEN, 1), KVT_STATUS_NULL_ARGUMENT);
    CHECK_STATUS(kvt_tier_submit_store(f.tier, 2, &id0, keys, KEY_LEN, 0), KVT_STATUS_INVALID_ARGUMENT);
    CHECK_STATUS(kvt_tier_submit_load(f.tier, 3, &id0, keys, 5, 1), KVT_STATUS_INVALID_ARGUMENT);
    CHECK(fd_readable(fd, 0));
    CHECK_STATUS(kvt_tier_poll(f.tier, buf, 1, &n), KVT_STATUS_OK);
    CHECK(n == 1);
    CHECK(fd_readable(fd, 0));
    CHECK_STATUS(kvt_tier_poll(f.tier, buf, 4, &n), KVT_STATUS_OK);
    CHECK(n == 2);
    CHECK(!fd_readable(fd, 0));
    /* A real job: poll(2) wakes up when it completes. The library makes the fd readable
     * just before it queues the result (tier.rs: finish), so a poll right after the
     * wake-up may still find nothing; the fd then stays readable (level-triggered use is
     * safe; see the report about EPOLLET). */
    CHECK_STATUS(kvt_tier_submit_store(f.tier, 4, &id0, keys, KEY_LEN, 1), KVT_STATUS_OK);
    CHECK(fd_readable(fd, scaled_ms(5000)));
    {
        int early = 0;
        double deadline = now_ms() + scaled_ms(1000);
        n = 0;
        while (CHECK_STATUS(kvt_tier_poll(f.tier, buf, 4, &n), KVT_STATUS_OK) && n == 0 && now_ms() < deadline) {
            early++;
            CHECK(fd_readable(fd, 0)); /* still readable while the result is on its way */
        }
        if (early > 0) {
            printf("    note: event fd was readable %d poll(s) before the result could be taken\n", early);
        }
    }
    CHECK(n == 1 && buf[0].job_id == 4 && buf[0].status == KVT_STATUS_OK);
    CHECK(!fd_readable(fd, 0));
out:
    free(keys);
    fixture_close(&f);
}

/* A stored object whose length differs from the block size fails only its key. */
static void test_load_length_mismatch(void)
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

/* key_bytes 0 accepts any key length from 5 to 68 bytes (a 1..64-byte hash and the group);
 * others fail with a result. */
static void test_key_bytes_any(void)
{
    static const size_t lens[] = {5, 6, 7, 8, 20, 36, 68};
    fixture f;
    uint8_t keys[72]; /* room for the 69-byte key below */
    size_t i;
    owned_result r;
    if (!fixture_open(&f, "local", 2 * 7, 4096, ",\"key_bytes\":0")) {
        fixture_close(&f);
        return;
    }
    for (i = 0; i < sizeof lens / sizeof lens[0]; i++) {
        uint64_t src = i, dst = 7 + i, sid = 10 + i, lid = 20 + i;
        rng_fill(keys, sizeof keys);
        CHECK_STATUS(kvt_tier_submit_store(f.tier, sid, &src, keys, lens[i], 1), KVT_STATUS_OK);
        if (!wait_ok(&f, &sid, 1, scaled_ms(5000))) {
            continue;
        }
        CHECK_STATUS(kvt_tier_submit_load(f.tier, lid, &dst, keys, lens[i], 1), KVT_STATUS_OK);
        if (wait_ok(&f, &lid, 1, scaled_ms(5000))) {
            CHECKF(memcmp(block(&f, dst), block(&f, src), f.block_bytes) == 0, "key length %zu", lens[i]);
        }
    }
    for (i = 0; i < 2; i++) {
        uint64_t src = 0, id = 30 + i;
        size_t len = i == 0 ? 4 : 69;
        CHECKF(kvt_tier_submit_store(f.tier, id, &src, keys, len, 1) == KVT_STATUS_INVALID_ARGUMENT,
               "key length %zu", len);
        memset(&r, 0, sizeof r);
        if (expect_one_queued(&f, id, &r)) {
            CHECK(r.status == KVT_STATUS_INVALID_ARGUMENT);
        }
        free_results(&r, 1);
    }
    fixture_close(&f);
}

/* An absurd num_keys (with NULL arrays) is INVALID_ARGUMENT, with one result and no crash. */
static void test_null_arrays_huge_num_keys(void)
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
    if (kvt_tier_jobs_in_flight(f.tier) > 0) {
        printf("    %zu jobs still in flight; shutting the tier down\n", kvt_tier_jobs_in_flight(f.tier));
        CHECK_STATUS(kvt_tier_shutdown(f.tier), KVT_STATUS_OK);
        discard_results(&f);
    }
    fixture_close(&f);
}

/* Huge key lengths are INVALID_ARGUMENT with exactly one result; nothing is sized by
 * them (a copy or an allocation of key_len * num_keys bytes would crash or abort). */
static void test_huge_key_len(void)
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
static void test_job_size_and_id_extremes(void)
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

/* f. After kvt_tier_shutdown, calls return SHUT_DOWN; poll still works; idempotent. */
static void test_after_shutdown(void)
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

/* f. kvt_tier_poll argument checks; kvt_tier_free(NULL). */
static void test_poll_args(void)
{
    fixture f;
    kvt_result buf[2];
    size_t n;
    uint8_t keys[KEY_LEN] = {0};
    if (!fixture_open(&f, "memory", 2, 1024, "")) {
        fixture_close(&f);
        return;
    }
    CHECK_STATUS(kvt_tier_poll(f.tier, buf, 2, NULL), KVT_STATUS_NULL_ARGUMENT);
    CHECK(strstr(kvt_last_error(), "out_count") != NULL);
    n = 5;
    CHECK_STATUS(kvt_tier_poll(f.tier, NULL, 1, &n), KVT_STATUS_NULL_ARGUMENT);
    CHECK(n == 0);
    n = 5;
    CHECK_STATUS(kvt_tier_poll(f.tier, NULL, 0, &n), KVT_STATUS_OK);
    CHECK(n == 0);
    n = 5;
    CHECK_STATUS(kvt_tier_poll(f.tier, buf, 0, &n), KVT_STATUS_OK);
    CHECK(n == 0);
    /* A queued result is not lost by polls that fail or have capacity 0. */
    CHECK_STATUS(kvt_tier_submit_store(f.tier, 9, NULL, keys, KEY_LEN, 1), KVT_STATUS_NULL_ARGUMENT);
    CHECK_STATUS(kvt_tier_poll(f.tier, buf, 2, NULL), KVT_STATUS_NULL_ARGUMENT);
    CHECK_STATUS(kvt_tier_poll(f.tier, NULL, 2, &n), KVT_STATUS_NULL_ARGUMENT);
    CHECK_STATUS(kvt_tier_poll(f.tier, NULL, 0, &n), KVT_STATUS_OK);
    CHECK(n == 0);
    CHECK_STATUS(kvt_tier_poll(f.tier, buf, 2, &n), KVT_STATUS_OK);
    CHECK(n == 1 && buf[0].job_id == 9);
    kvt_tier_free(NULL);
    kvt_tier_free(NULL);
    fixture_close(&f);
}

/* f. kvt_last_error(): set by a failure, "" after any successful call. */
static void test_last_error(void)
{
    kvt_tier *t = NULL;
    CHECK_STATUS(kvt_tier_new("{\"store\":{\"type\":\"memory\"},\"zzz\":1}", &t), KVT_STATUS_CONFIG);
    CHECK(strstr(kvt_last_error(), "zzz") != NULL);
    CHECK(strstr(kvt_last_error(), "zzz") != NULL); /* reading it does not clear it */
    (void)kvt_version();
    (void)kvt_status_str(3);
    CHECK(strstr(kvt_last_error(), "zzz") != NULL); /* nor do the static-string functions */
    CHECK_STATUS(kvt_tier_new("{\"store\":{\"type\":\"memory\"}}", &t), KVT_STATUS_OK);
    CHECK(kvt_last_error()[0] == '\0');
    CHECK_STATUS(kvt_tier_drain(t, 0), KVT_STATUS_OK);
    CHECK_STATUS(kvt_tier_shutdown(NULL), KVT_STATUS_NULL_ARGUMENT);
    CHECK(kvt_tier_jobs_in_flight(t) == 0);
    CHECK(kvt_last_error()[0] == '\0');
    kvt_tier_free(t);
}

/* ------------------------------------------------------------------------------------ */
/* Threads: submit concurrently with poll; kvt_last_error() is per thread                */
/* ------------------------------------------------------------------------------------ */

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
static void test_threads(void)
{
    enum { THREADS = 8 };
    const size_t per_thread = g_small ? 15 : 75;
    const size_t total = THREADS * (per_thread + 1);
    fixture f;
    submitter subs[THREADS];
    pthread_t tids[THREADS], other;
    uint8_t *src_keys = make_keys(16);
    uint64_t ids16[16], setup = 1;
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
    for (i = 0; i < 16; i++) {
        ids16[i] = i;
    }
    CHECK_STATUS(kvt_tier_submit_store(f.tier, setup, ids16, src_keys, KEY_LEN, 16), KVT_STATUS_OK);
    if (!wait_ok(&f, &setup, 1, scaled_ms(5000))) {
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
    if (res) {
        free_results(res, got < total + 8 ? got : total + 8);
    }
    free(res);
    free(seen);
    for (i = 0; i < THREADS; i++) {
        free(subs[i].new_keys);
    }
    free(src_keys);
    fixture_close(&f);
    pthread_mutex_destroy(&probe.lock);
}

/* ------------------------------------------------------------------------------------ */
/* g. shutdown / free with jobs in flight                                                */
/* ------------------------------------------------------------------------------------ */

enum { INFLIGHT_SOURCES = 64 };

/* Pre-stores INFLIGHT_SOURCES keys, then submits `jobs` jobs without waiting: even ones
 * store 1-4 source blocks under new keys, odd ones load one pre-stored key into their
 * own block. Returns the number of jobs submitted (all must be accepted). */
static size_t submit_burst(fixture *f, size_t jobs, uint8_t *src_keys, uint8_t *new_keys, uint64_t base_id)
{
    uint64_t ids[INFLIGHT_SOURCES], setup = 1;
    size_t i, accepted = 0;
    for (i = 0; i < INFLIGHT_SOURCES; i++) {
        ids[i] = i;
    }
    CHECK_STATUS(kvt_tier_submit_store(f->tier, setup, ids, src_keys, KEY_LEN, INFLIGHT_SOURCES), KVT_STATUS_OK);
    if (!wait_ok(f, &setup, 1, scaled_ms(10000))) {
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
    free_results(res, got < jobs + 4 ? got : jobs + 4);
    free(res);
    free(seen);
    free(sources);
    free(src_keys);
    free(new_keys);
    fixture_close(&f);
}

/* One transfer at a time, so that most of the burst has not started at shutdown. */
static void test_shutdown_in_flight(void) { shutdown_in_flight(",\"max_inflight_transfers\":1"); }

/* No grace: transfers in progress are abandoned at once and reported CANCELLED too (not
 * as I/O errors of their abandoned blocking tasks). */
static void test_shutdown_in_flight_no_grace(void)
{
    shutdown_in_flight(",\"max_inflight_transfers\":16,\"shutdown_timeout_ms\":0,\"runtime_threads\":4");
}

static void test_free_in_flight(void)
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
/* Counters, namespace, the pool fenced after shutdown and free                          */
/* ------------------------------------------------------------------------------------ */

/* kvt_tier_stats writes at most stats_size bytes (a canary past a short size stays). */
static void test_stats(void)
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
static void test_metrics(void)
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
static void test_log_callback(void)
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

/* kvt_vllm_namespace: the size query, exact fits, NULLs and bad field sets. */
static void test_vllm_namespace(void)
{
    const char *fields = "{\"model_name\":\"org/model-1\",\"tokens_per_hash\":16,\"tp_size\":2}";
    char buf[128];
    size_t len = 0, needed, i;
    kvt_status s;

    CHECK_STATUS(kvt_vllm_namespace(fields, 3, NULL, 0, &len), KVT_STATUS_INVALID_ARGUMENT);
    needed = len;
    REQUIRE(needed > 0 && needed < sizeof buf - 1);
    memset(buf, 'x', sizeof buf);
    CHECK_STATUS(kvt_vllm_namespace(fields, 3, buf, needed, &len), KVT_STATUS_INVALID_ARGUMENT);
    CHECK(len == needed);
    CHECK(buf[0] == 'x'); /* nothing written when it does not fit */
    memset(buf, 'x', sizeof buf);
    CHECK_STATUS(kvt_vllm_namespace(fields, 3, buf, needed + 1, &len), KVT_STATUS_OK);
    CHECK(len == needed && buf[needed] == '\0' && strlen(buf) == needed);
    CHECK(buf[needed + 1] == 'x');
    CHECKF(strncmp(buf, "org_model-1_", 12) == 0 && strcmp(buf + needed - 3, "_r3") == 0, "namespace \"%s\"", buf);
    for (i = 12; i < 24 && i < needed; i++) {
        CHECKF(strchr("0123456789abcdef", buf[i]) != NULL, "namespace \"%s\": digest character %zu", buf, i);
    }
    CHECK_STATUS(kvt_vllm_namespace(NULL, 0, buf, sizeof buf, &len), KVT_STATUS_NULL_ARGUMENT);
    CHECK_STATUS(kvt_vllm_namespace(fields, 0, buf, sizeof buf, NULL), KVT_STATUS_NULL_ARGUMENT);
    CHECK_STATUS(kvt_vllm_namespace(fields, 0, NULL, 8, &len), KVT_STATUS_NULL_ARGUMENT);
    s = kvt_vllm_namespace("{not json", 0, buf, sizeof buf, &len);
    CHECKF(s == KVT_STATUS_INVALID_ARGUMENT, "not JSON: %d", (int)s);
    s = kvt_vllm_namespace("{\"tp_size\":1}", 0, buf, sizeof buf, &len);
    CHECKF(s == KVT_STATUS_INVALID_ARGUMENT && strstr(kvt_last_error(), "model_name") != NULL, "no model_name: %d %s",
           (int)s, kvt_last_error());
    s = kvt_vllm_namespace("[\"model_name\"]", 0, buf, sizeof buf, &len);
    CHECKF(s == KVT_STATUS_INVALID_ARGUMENT, "an array: %d", (int)s);
    s = kvt_vllm_namespace("{\"model_name\":\"\xff\"}", 0, buf, sizeof buf, &len);
    CHECKF(s == KVT_STATUS_INVALID_ARGUMENT, "not UTF-8: %d", (int)s);
}

/* Lookups answer RETRY until a step has ended, then HIT or MISS; successful store jobs
 * (only they) yield one BlockStored event each, holding the job's keys in order. */
static void test_lookups_and_events(void)
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

/* Pages of 2 ranges (K and V) and of 2 x 32 ranges (32 layers, K and V apart, one
 * allocation each) round-trip byte-exact through a second tier on the store of
 * KVT_HARNESS_STORE (ffi-tests/on_s3_servers.py runs this case on s3s-fs, moto and Ceph
 * RGW), else on a local store; a page stored from 64 ranges loads into a pool block as the
 * same object. */
enum { STORE_LAYERS = 32, STORE_PIECE = 2048, STORE_PAGES = 3 };

typedef struct {
    uint8_t *k[STORE_LAYERS], *v[STORE_LAYERS];
    uint64_t kr[STORE_LAYERS], vr[STORE_LAYERS];
} layer_pool;

static int layer_pool_open(layer_pool *lp, kvt_tier *tier, int random)
{
    int l, ok = 1;
    for (l = 0; l < STORE_LAYERS; l++) {
        lp->k[l] = (uint8_t *)xmalloc(STORE_PAGES * STORE_PIECE);
        lp->v[l] = (uint8_t *)xmalloc(STORE_PAGES * STORE_PIECE);
        if (random) {
            rng_fill(lp->k[l], STORE_PAGES * STORE_PIECE);
            rng_fill(lp->v[l], STORE_PAGES * STORE_PIECE);
        } else {
            memset(lp->k[l], 0, STORE_PAGES * STORE_PIECE);
            memset(lp->v[l], 0, STORE_PAGES * STORE_PIECE);
        }
        ok &= CHECK_STATUS(kvt_tier_add_region(tier, lp->k[l], STORE_PAGES * STORE_PIECE, &lp->kr[l]), KVT_STATUS_OK);
        ok &= CHECK_STATUS(kvt_tier_add_region(tier, lp->v[l], STORE_PAGES * STORE_PIECE, &lp->vr[l]), KVT_STATUS_OK);
    }
    return ok;
}

static void layer_pool_free(layer_pool *lp)
{
    int l;
    for (l = 0; l < STORE_LAYERS; l++) {
        free(lp->k[l]);
        free(lp->v[l]);
    }
}

/* The ranges of page p: K and V of layer 0 (layers = 1), or of every layer. */
static void layer_pool_page(const layer_pool *lp, size_t p, int layers, kvt_range *out)
{
    int l;
    for (l = 0; l < layers; l++) {
        out[2 * l].region = lp->kr[l];
        out[2 * l].offset = (uint64_t)p * STORE_PIECE;
        out[2 * l].len = STORE_PIECE;
        out[2 * l + 1].region = lp->vr[l];
        out[2 * l + 1].offset = (uint64_t)p * STORE_PIECE;
        out[2 * l + 1].len = STORE_PIECE;
    }
}

/* Page p of `a` equals page q of `b` over `layers` layers. */
static int layer_pool_same(const layer_pool *a, size_t p, const layer_pool *b, size_t q, int layers)
{
    int l, same = 1;
    for (l = 0; l < layers; l++) {
        same &= memcmp(a->k[l] + p * STORE_PIECE, b->k[l] + q * STORE_PIECE, STORE_PIECE) == 0;
        same &= memcmp(a->v[l] + p * STORE_PIECE, b->v[l] + q * STORE_PIECE, STORE_PIECE) == 0;
    }
    return same;
}

static void test_ranges_on_store(void)
{
    fixture w, r;
    layer_pool src, dst;
    uint8_t *keys = make_keys(2 * STORE_PAGES); /* 2-range pages, then 64-range pages */
    kvt_range ranges[STORE_PAGES * 2 * STORE_LAYERS];
    uint64_t jobs[2] = {1, 2}, ids[STORE_PAGES];
    const char *where = getenv("KVT_HARNESS_STORE");
    char json[1200];
    size_t p;
    int l, layers[2] = {1, STORE_LAYERS};

    memset(&src, 0, sizeof src);
    memset(&dst, 0, sizeof dst);
    memset(&r, 0, sizeof r);
    printf("    store: %s\n", where && *where ? where : "local");
    /* The writer; the reader below opens the same store and prefix. */
    if (!fixture_open(&w, "env", STORE_PAGES, 2 * STORE_LAYERS * STORE_PIECE, "")) {
        goto out;
    }
    if (!layer_pool_open(&src, w.tier, 1)) {
        goto out;
    }
    for (l = 0; l < 2; l++) {
        for (p = 0; p < STORE_PAGES; p++) {
            layer_pool_page(&src, p, layers[l], ranges + p * 2 * layers[l]);
        }
        CHECK_STATUS(kvt_tier_submit_store_ranges(w.tier, jobs[l], ranges, 2 * (size_t)layers[l],
                                                  keys + l * STORE_PAGES * KEY_LEN, KEY_LEN, STORE_PAGES),
                     KVT_STATUS_OK);
        w.block_bytes = 2 * (size_t)layers[l] * STORE_PIECE; /* the bytes of one key's object */
        if (!wait_ok(&w, &jobs[l], 1, scaled_ms(30000))) {
            goto out;
        }
    }

    /* The reader: the same store and prefix, its own memory. */
    if (w.dir[0]) {
        snprintf(json, sizeof json, "{\"store\":{\"type\":\"local\",\"path\":\"%s/store\"}}", w.dir);
    } else {
        snprintf(json, sizeof json, "{\"store\":%s,\"prefix\":\"%s\"}", where, w.prefix);
    }
    if (!CHECK_STATUS(kvt_tier_new(json, &r.tier), KVT_STATUS_OK)) {
        goto out;
    }
    r.num_blocks = STORE_PAGES;
    r.block_bytes = 2 * STORE_LAYERS * STORE_PIECE;
    r.pool = (uint8_t *)xmalloc(STORE_PAGES * r.block_bytes);
    memset(r.pool, 0, STORE_PAGES * r.block_bytes);
    CHECK_STATUS(kvt_tier_register_memory(r.tier, r.pool, STORE_PAGES, r.block_bytes), KVT_STATUS_OK);
    if (!layer_pool_open(&dst, r.tier, 0)) {
        goto out;
    }
    /* Page p's keys load into page STORE_PAGES-1-p. */
    for (l = 0; l < 2; l++) {
        for (p = 0; p < STORE_PAGES; p++) {
            layer_pool_page(&dst, STORE_PAGES - 1 - p, layers[l], ranges + p * 2 * layers[l]);
        }
        CHECK_STATUS(kvt_tier_submit_load_ranges(r.tier, jobs[l], ranges, 2 * (size_t)layers[l],
                                                 keys + l * STORE_PAGES * KEY_LEN, KEY_LEN, STORE_PAGES),
                     KVT_STATUS_OK);
        r.block_bytes = 2 * (size_t)layers[l] * STORE_PIECE;
        if (!wait_ok(&r, &jobs[l], 1, scaled_ms(30000))) {
            goto out;
        }
        for (p = 0; p < STORE_PAGES; p++) {
            CHECKF(layer_pool_same(&src, p, &dst, STORE_PAGES - 1 - p, layers[l]),
                   "page %zu of %d ranges differs after the round trip", p, 2 * layers[l]);
        }
    }
    /* The 64-range pages are the objects pool blocks of the same bytes give. */
    for (p = 0; p < STORE_PAGES; p++) {
        ids[p] = p;
    }
    jobs[0] = 3;
    r.block_bytes = 2 * STORE_LAYERS * STORE_PIECE;
    CHECK_STATUS(kvt_tier_submit_load(r.tier, 3, ids, keys + STORE_PAGES * KEY_LEN, KEY_LEN, STORE_PAGES),
                 KVT_STATUS_OK);
    if (wait_ok(&r, jobs, 1, scaled_ms(30000))) {
        for (p = 0; p < STORE_PAGES; p++) {
            int same = 1;
            for (l = 0; l < STORE_LAYERS; l++) {
                const uint8_t *at = r.pool + p * r.block_bytes + (size_t)l * 2 * STORE_PIECE;
                same &= memcmp(at, src.k[l] + p * STORE_PIECE, STORE_PIECE) == 0;
                same &= memcmp(at + STORE_PIECE, src.v[l] + p * STORE_PIECE, STORE_PIECE) == 0;
            }
            CHECKF(same, "page %zu loaded into a block differs from its 64 ranges", p);
        }
    }
out:
    fixture_close(&r);
    fixture_close(&w);
    layer_pool_free(&src);
    layer_pool_free(&dst);
    free(keys);
}

/* kvt_tier_clear deletes every block of the namespace (and nothing else under it), each
 * a BlockRemoved event; it refuses NULL and calls after shutdown, zeroing the report. */
static void test_clear(void)
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

/* After kvt_tier_shutdown returns, the library does not touch the pool: it is made
 * inaccessible (any access would fault) while the results, events and counters are
 * collected; after kvt_tier_free, while another tier runs. */
static void test_pool_fenced(void)
{
    enum { SOURCES = 32, JOBS = 64 };
    const size_t bb = 16384, nb = SOURCES + JOBS;
    uint8_t *keys = make_keys(SOURCES + JOBS);
    uint64_t ids[SOURCES], setup = 1;
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
        for (i = 0; i < SOURCES; i++) {
            ids[i] = i;
        }
        CHECK_STATUS(kvt_tier_submit_store(f.tier, setup, ids, keys, KEY_LEN, SOURCES), KVT_STATUS_OK);
        if (!wait_ok(&f, &setup, 1, scaled_ms(10000))) {
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
        free_results(res, got);
        free(res);
    }
    free(keys);
}

/* ------------------------------------------------------------------------------------ */
/* Random call sequences: a property test of the whole job API against a model           */
/* ------------------------------------------------------------------------------------ */

enum { SEQ_BLOCKS = 24, SEQ_BB = 512, SEQ_GUARD = 4096, SEQ_MAXK = 4, SEQ_KEYS = 512, SEQ_MAXJOBS = 1024 };

typedef struct seq_key {
    uint8_t key[KEY_LEN];
    int state;              /* 0 unused, 1 store pending, 2 stored (content below), 3 never stored */
    uint8_t content[SEQ_BB];
} seq_key;

typedef struct seq_job {
    uint64_t id;
    int load;
    kvt_status want;        /* the submit's status */
    int accepted;           /* holds its blocks until its result is polled */
    size_t nkeys;
    uint64_t blocks[SEQ_MAXK];
    int keys[SEQ_MAXK];     /* indices into the key table, -1 for none */
    int results;
} seq_job;

typedef struct seq_model {
    seq_key *keys;
    size_t nkeys;
    seq_job *jobs;
    size_t njobs;
    int readers[SEQ_BLOCKS], writer[SEQ_BLOCKS];
    int known[SEQ_BLOCKS];              /* expected[] holds the block's bytes */
    uint8_t expected[SEQ_BLOCKS][SEQ_BB];
    uint8_t *mem, *pool;                /* mem = guard + pool + guard */
    size_t bad;
    size_t stores, loads, busy, rejected, duplicates, loaded_keys_checked, absent_keys;
} seq_model;

static int seq_fresh_key(seq_model *m, int state)
{
    int k;
    if (m->nkeys >= SEQ_KEYS) {
        return -1;
    }
    k = (int)m->nkeys++;
    make_key(m->keys[k].key, (uint32_t)(k % 4));
    m->keys[k].state = state;
    return k;
}

static seq_job *seq_find(seq_model *m, uint64_t id)
{
    size_t i;
    for (i = 0; i < m->njobs; i++) {
        if (m->jobs[i].id == id && m->jobs[i].want != KVT_STATUS_DUPLICATE_JOB) {
            return &m->jobs[i];
        }
    }
    return NULL;
}

/* Checks one result against the model and releases the job's blocks. */
static void seq_result(seq_model *m, const kvt_result *r)
{
    seq_job *j = seq_find(m, r->job_id);
    size_t i;
    check_result_invariants(r, SEQ_BB);
    if (!CHECKF(j != NULL, "result for unknown job %" PRIu64, r->job_id)) {
        m->bad++;
        return;
    }
    if (!CHECKF(j->results++ == 0, "job %" PRIu64 " reported twice", j->id)) {
        m->bad++;
        return;
    }
    if (!j->accepted) {
        m->bad += !CHECKF(r->status == j->want, "job %" PRIu64 ": rejected with %d, result %d", j->id, (int)j->want,
                          (int)r->status);
        return;
    }
    m->bad += !CHECKF(r->num_keys == j->nkeys, "job %" PRIu64 ": %zu keys", j->id, r->num_keys);
    for (i = 0; i < j->nkeys && i < r->num_keys; i++) {
        uint64_t b = j->blocks[i];
        seq_key *k = &m->keys[j->keys[i]];
        if (!j->load) {
            m->bad += !CHECKF(r->key_status[i] == KVT_STATUS_OK, "store %" PRIu64 " key %zu: %d", j->id, i,
                              (int)r->key_status[i]);
            k->state = r->key_status[i] == KVT_STATUS_OK ? 2 : 3;
        } else if (k->state == 2) {
            m->bad += !CHECKF(r->key_status[i] == KVT_STATUS_OK, "load %" PRIu64 " key %zu: %d", j->id, i,
                              (int)r->key_status[i]);
            m->bad += !CHECKF(memcmp(m->pool + b * SEQ_BB, k->content, SEQ_BB) == 0,
                              "load %" PRIu64 ": block %" PRIu64 " does not hold key %d's bytes", j->id, b, j->keys[i]);
            memcpy(m->expected[b], k->content, SEQ_BB);
            m->known[b] = 1;
            m->loaded_keys_checked++;
        } else {
            m->bad += !CHECKF(r->key_status[i] == KVT_STATUS_NOT_FOUND, "load %" PRIu64 " of an absent key: %d",
                              j->id, (int)r->key_status[i]);
            m->known[b] = 0; /* a failed key's block content is unspecified */
            m->absent_keys++;
        }
    }
    /* Release the holds (stores may name a block twice: count each block once). */
    for (i = 0; i < j->nkeys; i++) {
        size_t e;
        int first = 1;
        for (e = 0; e < i; e++) {
            first &= j->blocks[e] != j->blocks[i];
        }
        if (!first) {
            continue;
        }
        if (j->load) {
            m->writer[j->blocks[i]] = 0;
        } else {
            m->readers[j->blocks[i]]--;
        }
    }
}

/* Blocks no load holds have their expected bytes; the guards are intact. */
static void seq_check_memory(seq_model *m)
{
    size_t b, i;
    for (b = 0; b < SEQ_BLOCKS; b++) {
        if (!m->writer[b] && m->known[b]) {
            m->bad += !CHECKF(memcmp(m->pool + b * SEQ_BB, m->expected[b], SEQ_BB) == 0,
                              "block %zu changed although no load held it", b);
        }
    }
    for (i = 0; i < SEQ_GUARD; i++) {
        if (m->mem[i] != 0xa5 || m->mem[SEQ_GUARD + SEQ_BLOCKS * SEQ_BB + i] != 0x5a) {
            m->bad += !CHECKF(0, "guard byte %zu around the pool changed", i);
            break;
        }
    }
}

static void seq_poll(seq_model *m, kvt_tier *t, size_t capacity)
{
    kvt_result buf[8];
    size_t n = 99, i;
    m->bad += !CHECK_STATUS(kvt_tier_poll(t, capacity ? buf : NULL, capacity, &n), KVT_STATUS_OK);
    m->bad += !CHECK(n <= capacity);
    for (i = 0; i < n && i < capacity; i++) {
        seq_result(m, &buf[i]);
    }
    seq_check_memory(m);
}

static void seq_submit(seq_model *m, kvt_tier *t, uint64_t *next_id)
{
    seq_job *j = &m->jobs[m->njobs];
    uint8_t keybuf[SEQ_MAXK * KEY_LEN];
    uint64_t blocks[SEQ_MAXK];
    size_t i, key_len = KEY_LEN, n;
    const uint8_t *keys = keybuf;
    const uint64_t *ids = blocks;
    int variant = (int)(rng_next() % 32);
    kvt_status got;

    memset(j, 0, sizeof *j);
    j->load = (int)(rng_next() % 2);
    j->nkeys = n = 1 + (size_t)(rng_next() % SEQ_MAXK);
    j->id = (*next_id)++;
    j->want = KVT_STATUS_OK;
    for (i = 0; i < n; i++) {
        j->keys[i] = -1;
    }
    if (variant == 0 && m->njobs > 0) { /* an id whose result is pending */
        size_t back = (size_t)(rng_next() % m->njobs);
        seq_job *old = &m->jobs[back];
        if (old->want != KVT_STATUS_DUPLICATE_JOB && old->results == 0) {
            j->id = old->id;
            (*next_id)--;
            j->want = KVT_STATUS_DUPLICATE_JOB;
        }
    }
    for (i = 0; i < n; i++) {
        int k;
        blocks[i] = rng_next() % SEQ_BLOCKS;
        if (j->load) {
            /* mostly a stored key, else one never stored */
            size_t tries;
            int want_state = rng_next() % 4 == 0 ? 3 : 2;
            k = -1;
            for (tries = 0; tries < 32 && m->nkeys > 0; tries++) {
                int c = (int)(rng_next() % m->nkeys);
                if (m->keys[c].state == want_state) {
                    k = c;
                    break;
                }
            }
            if (k < 0) {
                k = seq_fresh_key(m, 3);
            }
        } else {
            k = j->want == KVT_STATUS_DUPLICATE_JOB ? -1 : seq_fresh_key(m, 1);
        }
        if (k < 0) {
            make_key(keybuf + i * KEY_LEN, 0);
        } else {
            memcpy(keybuf + i * KEY_LEN, m->keys[k].key, KEY_LEN);
        }
        j->keys[i] = k;
    }
    if (j->load) { /* distinct blocks, unless the variant below wants a repeat */
        for (i = 0; i < n; i++) {
            blocks[i] = (blocks[0] + i * 5) % SEQ_BLOCKS;
        }
    }
    memcpy(j->blocks, blocks, sizeof blocks);
    if (j->want != KVT_STATUS_DUPLICATE_JOB) {
        switch (variant) {
        case 1: keys = NULL; j->want = KVT_STATUS_NULL_ARGUMENT; break;
        case 2: ids = NULL; j->want = KVT_STATUS_NULL_ARGUMENT; break;
        case 3: key_len = KEY_LEN - 1; j->want = KVT_STATUS_INVALID_ARGUMENT; break;
        case 4: key_len = SIZE_MAX - (size_t)(rng_next() % 64); j->want = KVT_STATUS_INVALID_ARGUMENT; break;
        case 5: blocks[n - 1] = SEQ_BLOCKS + rng_next() % 3; j->want = KVT_STATUS_INVALID_ARGUMENT; break;
        case 6: n = 0; j->want = KVT_STATUS_INVALID_ARGUMENT; break;
        case 7:
            if (j->load && n > 1) {
                blocks[1] = blocks[0];
                j->want = KVT_STATUS_INVALID_ARGUMENT;
            }
            break;
        default: break;
        }
    }
    if (j->want == KVT_STATUS_OK) { /* holds: a load needs its blocks alone */
        for (i = 0; i < n; i++) {
            uint64_t b = blocks[i];
            if (m->writer[b] || (j->load && m->readers[b] > 0)) {
                j->want = KVT_STATUS_BLOCK_BUSY;
            }
        }
    }
    if (j->want != KVT_STATUS_OK && j->want != KVT_STATUS_DUPLICATE_JOB) {
        for (i = 0; i < j->nkeys; i++) { /* the job's fresh keys are never stored */
            if (j->keys[i] >= 0 && m->keys[j->keys[i]].state == 1) {
                m->keys[j->keys[i]].state = 3;
            }
        }
    }
    got = submit_kind(t, j->load ? KVT_JOB_KIND_LOAD : KVT_JOB_KIND_STORE, j->id, ids, keys, key_len, n);
    m->bad += !CHECKF(got == j->want, "job %" PRIu64 " (%s, %zu keys, variant %d): returned %d (%s), want %d (%s): %s",
                      j->id, j->load ? "load" : "store", n, variant, (int)got, kvt_status_str(got), (int)j->want,
                      kvt_status_str(j->want), kvt_last_error());
    if (got != j->want) {
        j->want = got; /* follow the library, to keep checking the rest */
    }
    j->nkeys = n;
    j->accepted = j->want == KVT_STATUS_OK;
    m->stores += j->accepted && !j->load;
    m->loads += j->accepted && j->load;
    m->busy += j->want == KVT_STATUS_BLOCK_BUSY;
    m->duplicates += j->want == KVT_STATUS_DUPLICATE_JOB;
    m->rejected += !j->accepted && j->want != KVT_STATUS_BLOCK_BUSY && j->want != KVT_STATUS_DUPLICATE_JOB;
    if (j->accepted) {
        for (i = 0; i < n; i++) {
            uint64_t b = blocks[i];
            size_t e;
            int first = 1;
            for (e = 0; e < i; e++) {
                first &= blocks[e] != b;
            }
            if (j->load) {
                m->writer[b] = 1;
            } else {
                /* the key's bytes are the block's now: no load may write it meanwhile */
                memcpy(m->keys[j->keys[i]].content, m->pool + b * SEQ_BB, SEQ_BB);
                if (first) {
                    m->readers[b]++;
                }
            }
        }
    }
    m->njobs++;
}

static void test_random_sequences(void)
{
    const int sequences = g_small ? 4 : 24, steps = g_small ? 80 : 250;
    int seq;
    seq_model m;

    memset(&m, 0, sizeof m);
    m.keys = (seq_key *)xmalloc(SEQ_KEYS * sizeof(seq_key));
    m.jobs = (seq_job *)xmalloc(SEQ_MAXJOBS * sizeof(seq_job));
    m.mem = (uint8_t *)xmalloc(2 * SEQ_GUARD + SEQ_BLOCKS * SEQ_BB);
    for (seq = 0; seq < sequences && m.bad == 0; seq++) {
        kvt_tier *t = NULL;
        uint64_t next_id = 1;
        int step;
        size_t i, lost = 0;
        m.nkeys = m.njobs = 0;
        memset(m.readers, 0, sizeof m.readers);
        memset(m.writer, 0, sizeof m.writer);
        memset(m.mem, 0xa5, SEQ_GUARD);
        memset(m.mem + SEQ_GUARD + SEQ_BLOCKS * SEQ_BB, 0x5a, SEQ_GUARD);
        m.pool = m.mem + SEQ_GUARD;
        rng_fill(m.pool, SEQ_BLOCKS * SEQ_BB);
        for (i = 0; i < SEQ_BLOCKS; i++) {
            memcpy(m.expected[i], m.pool + i * SEQ_BB, SEQ_BB);
            m.known[i] = 1;
        }
        if (!CHECK_STATUS(kvt_tier_new("{\"store\":{\"type\":\"memory\"},\"max_inflight_transfers\":3}", &t),
                          KVT_STATUS_OK)) {
            break;
        }
        CHECK_STATUS(kvt_tier_register_memory(t, m.pool, SEQ_BLOCKS, SEQ_BB), KVT_STATUS_OK);
        for (step = 0; step < steps && m.njobs < SEQ_MAXJOBS && m.nkeys + SEQ_MAXK < SEQ_KEYS; step++) {
            int op = (int)(rng_next() % 10);
            if (op < 4) {
                seq_submit(&m, t, &next_id);
            } else if (op < 8) {
                seq_poll(&m, t, (size_t)(rng_next() % 6));
            } else if (op == 8) {
                kvt_lookup_result verdict;
                int k = m.nkeys ? (int)(rng_next() % m.nkeys) : -1;
                if (k >= 0) {
                    m.bad += !CHECK_STATUS(kvt_tier_lookup(t, rng_next() % 4, m.keys[k].key, KEY_LEN, &verdict),
                                           KVT_STATUS_OK);
                }
                m.bad += !CHECK_STATUS(kvt_tier_schedule_end(t), KVT_STATUS_OK);
                if (rng_next() % 3 == 0) {
                    m.bad += !CHECK_STATUS(kvt_tier_request_finished(t, rng_next() % 4), KVT_STATUS_OK);
                }
            } else {
                kvt_status d = kvt_tier_drain(t, 0);
                kvt_stats stats;
                m.bad += !CHECKF(d == KVT_STATUS_OK || d == KVT_STATUS_TIMEOUT, "drain(0): %d", (int)d);
                m.bad += !CHECK_STATUS(kvt_tier_stats(t, &stats, sizeof stats), KVT_STATUS_OK);
            }
        }
        m.bad += !CHECK_STATUS(kvt_tier_drain(t, (uint64_t)scaled_ms(10000)), KVT_STATUS_OK);
        seq_poll(&m, t, 8);
        for (i = 0; i < 2 * SEQ_MAXJOBS; i++) {
            size_t before = 0, j;
            for (j = 0; j < m.njobs; j++) {
                before += (size_t)m.jobs[j].results;
            }
            seq_poll(&m, t, 8);
            for (j = 0; j < m.njobs; j++) {
                before -= (size_t)m.jobs[j].results;
            }
            if (before == 0) {
                break; /* nothing more came */
            }
        }
        for (i = 0; i < m.njobs; i++) {
            const seq_job *j = &m.jobs[i];
            if (j->want == KVT_STATUS_DUPLICATE_JOB) {
                continue;
            }
            lost += j->results != 1;
        }
        m.bad += !CHECKF(lost == 0, "sequence %d: %zu jobs without exactly one result", seq, lost);
        kvt_tier_free(t);
        seq_check_memory(&m);
    }
    printf("    %d sequences: %zu stores, %zu loads (%zu keys checked byte for byte, %zu absent), %zu BLOCK_BUSY,"
           " %zu other rejections, %zu duplicate ids\n",
           seq, m.stores, m.loads, m.loaded_keys_checked, m.absent_keys, m.busy, m.rejected, m.duplicates);
    if (m.bad > 0) {
        printf("    (KVT_HARNESS_SEED=%" PRIu64 " reproduces the failing sequence)\n", g_seed);
    }
    free(m.mem);
    free(m.jobs);
    free(m.keys);
}

/* ------------------------------------------------------------------------------------ */
/* fork(): the child gets FORKED at once; the parent's tier is unaffected                */
/* ------------------------------------------------------------------------------------ */

/* Runs in the child: returns the number of failed expectations (printed). */
static int forked_child(const fixture *f, const uint8_t *keys)
{
    int bad = 0;
    uint64_t id0 = 0;
    kvt_result buf[2];
    kvt_stats stats;
    kvt_lookup_result verdict;
    size_t n = 7;
    kvt_tier *mine = NULL;
    uint8_t pool[4096];
#define CHILD_EXPECT(expr, want)                                                                   \
    do {                                                                                       \
        int got_ = (int)(expr);                                                                \
        if (got_ != (int)(want)) {                                                             \
            printf("    child: %s returned %d (%s), want %d: %s\n", #expr, got_, kvt_status_str(got_), \
                   (int)(want), kvt_last_error());                                             \
            bad++;                                                                             \
        }                                                                                      \
    } while (0)
    CHILD_EXPECT(kvt_tier_submit_store(f->tier, 50, &id0, keys, KEY_LEN, 1), KVT_STATUS_FORKED);
    if (strstr(kvt_last_error(), "fork") == NULL && strstr(kvt_last_error(), "process") == NULL) {
        printf("    child: message does not explain the fork: %s\n", kvt_last_error());
        bad++;
    }
    CHILD_EXPECT(kvt_tier_submit_load(f->tier, 51, &id0, keys, KEY_LEN, 1), KVT_STATUS_FORKED);
    CHILD_EXPECT(kvt_tier_poll(f->tier, buf, 2, &n), KVT_STATUS_FORKED);
    CHILD_EXPECT(n, 0);
    CHILD_EXPECT(kvt_tier_drain(f->tier, 1000), KVT_STATUS_FORKED);
    CHILD_EXPECT(kvt_tier_lookup(f->tier, 1, keys, KEY_LEN, &verdict), KVT_STATUS_FORKED);
    CHILD_EXPECT(kvt_tier_schedule_end(f->tier), KVT_STATUS_FORKED);
    CHILD_EXPECT(kvt_tier_request_finished(f->tier, 1), KVT_STATUS_FORKED);
    CHILD_EXPECT(kvt_tier_check_now(f->tier, keys, KEY_LEN, 1, 1000, &verdict), KVT_STATUS_FORKED);
    {
        kvt_eviction_report report;
        CHILD_EXPECT(kvt_tier_clear(f->tier, &report), KVT_STATUS_FORKED);
    }
    CHILD_EXPECT(kvt_tier_stats(f->tier, &stats, sizeof stats), KVT_STATUS_FORKED);
    CHILD_EXPECT(kvt_tier_take_events(f->tier, NULL, 0, &n), KVT_STATUS_FORKED);
    CHILD_EXPECT(kvt_tier_register_memory(f->tier, pool, 1, sizeof pool), KVT_STATUS_FORKED);
    {
        uint64_t region = 7;
        kvt_range range = {1, 0, 16};
        CHILD_EXPECT(kvt_tier_add_region(f->tier, pool, sizeof pool, &region), KVT_STATUS_FORKED);
        CHILD_EXPECT(region, 0);
        CHILD_EXPECT(kvt_tier_remove_region(f->tier, 1), KVT_STATUS_FORKED);
        CHILD_EXPECT(kvt_tier_submit_store_ranges(f->tier, 52, &range, 1, keys, KEY_LEN, 1), KVT_STATUS_FORKED);
        CHILD_EXPECT(kvt_tier_submit_load_ranges(f->tier, 53, &range, 1, keys, KEY_LEN, 1), KVT_STATUS_FORKED);
    }
    CHILD_EXPECT(kvt_tier_shutdown(f->tier), KVT_STATUS_FORKED);
    CHILD_EXPECT(kvt_tier_event_fd(f->tier), -1);
    CHILD_EXPECT(kvt_tier_jobs_in_flight(f->tier), 0);
    CHILD_EXPECT(kvt_tier_location(f->tier) == NULL, 1);
    kvt_tier_free(f->tier); /* returns without joining the parent's threads */
#if defined(__SANITIZE_ADDRESS__)
    /* Not under ASan: GCC 12's libasan does not hold its thread registry across fork(), so
     * a child forked while a parent thread starts or exits (the parent's tier is busy
     * here by design) can inherit that lock held, and the first thread the child starts
     * then waits forever. The plain, C++ and valgrind runs cover a child's own tier. */
    (void)mine;
    (void)pool;
#else
    /* The child can run a tier of its own. */
    CHILD_EXPECT(kvt_tier_new("{\"store\":{\"type\":\"memory\"}}", &mine), KVT_STATUS_OK);
    if (mine != NULL) {
        uint64_t one = 1;
        double deadline = now_ms() + scaled_ms(10000);
        memset(pool, 0x3c, sizeof pool);
        CHILD_EXPECT(kvt_tier_register_memory(mine, pool, 1, sizeof pool), KVT_STATUS_OK);
        CHILD_EXPECT(kvt_tier_submit_store(mine, one, &id0, keys, KEY_LEN, 1), KVT_STATUS_OK);
        n = 0;
        while (n == 0 && now_ms() < deadline) {
            fd_readable(kvt_tier_event_fd(mine), 100);
            CHILD_EXPECT(kvt_tier_poll(mine, buf, 2, &n), KVT_STATUS_OK);
        }
        CHILD_EXPECT(n, 1);
        if (n == 1) {
            CHILD_EXPECT(buf[0].status, KVT_STATUS_OK);
        }
        kvt_tier_free(mine);
    }
#endif
#undef CHILD_EXPECT
    return bad;
}

static void test_fork(void)
{
    fixture f;
    uint8_t *keys = make_keys(8);
    uint64_t ids[8] = {0, 1, 2, 3, 4, 5, 6, 7}, setup = 1, again = 2;
    pid_t pid;
    int wstatus = 0;

    if (!fixture_open(&f, "local", 8, 16384, "")) {
        goto out;
    }
    /* Jobs in flight and a result pending while the process forks. */
    CHECK_STATUS(kvt_tier_submit_store(f.tier, setup, ids, keys, KEY_LEN, 8), KVT_STATUS_OK);
    fflush(stdout);
    pid = fork();
    if (pid == 0) {
        int bad;
        alarm((unsigned)(30 * g_timeout_scale)); /* a hang in the child kills it: the parent sees SIGALRM */
        bad = forked_child(&f, keys);
        fflush(stdout);
        /* Leave through exec, as most forked children do: the parent's tier is not
         * reclaimed here by design, so a leak check at the child's own exit (valgrind)
         * would report the memory only the parent's threads referenced. */
        execl("/bin/sh", "sh", "-c", bad == 0 ? "exit 0" : "exit 1", (char *)NULL);
        _exit(bad == 0 ? 0 : 1);
    }
    if (!CHECK(pid > 0)) {
        goto out;
    }
    /* The parent's tier works on, during and after the child's calls. */
    wait_ok(&f, &setup, 1, scaled_ms(10000));
    /* The child's alarm bounds the wait: a hang there ends it with SIGALRM. */
    while (waitpid(pid, &wstatus, 0) < 0 && errno == EINTR) {
    }
    CHECKF(WIFEXITED(wstatus) && WEXITSTATUS(wstatus) == 0, "child: exited %d, status %d, signal %d",
           WIFEXITED(wstatus), WIFEXITED(wstatus) ? WEXITSTATUS(wstatus) : -1,
           WIFSIGNALED(wstatus) ? WTERMSIG(wstatus) : 0);
    CHECK_STATUS(kvt_tier_submit_load(f.tier, again, ids + 4, keys, KEY_LEN, 4), KVT_STATUS_OK);
    if (wait_ok(&f, &again, 1, scaled_ms(10000))) {
        CHECK(memcmp(block(&f, 4), block(&f, 0), 4 * f.block_bytes) == 0);
    }
out:
    free(keys);
    fixture_close(&f);
}

/* i. Regions and ranges: pages of K and V ranges in two regions round trip byte-exact and
 * are the objects pool blocks of the same bytes give; every bad region, range and count
 * is refused with the job's one result, before anything is read; a load holds its bytes
 * alone; a region is removed only when no job holds it; after shutdown, no new region. */
enum { RANGE_BYTES = 4096, RANGE_PAGES = 8 };

static kvt_status submit_ranges(const fixture *f, kvt_job_kind kind, uint64_t id, const kvt_range *ranges,
                                size_t per_key, const uint8_t *keys, size_t num_keys)
{
    return kind == KVT_JOB_KIND_STORE
               ? kvt_tier_submit_store_ranges(f->tier, id, ranges, per_key, keys, KEY_LEN, num_keys)
               : kvt_tier_submit_load_ranges(f->tier, id, ranges, per_key, keys, KEY_LEN, num_keys);
}

/* The page's K and V ranges. */
static void page_ranges(kvt_range *out, uint64_t k, uint64_t v, size_t page)
{
    out[0].region = k;
    out[0].offset = (uint64_t)page * RANGE_BYTES;
    out[0].len = RANGE_BYTES;
    out[1].region = v;
    out[1].offset = (uint64_t)page * RANGE_BYTES;
    out[1].len = RANGE_BYTES;
}

static void test_ranges(void)
{
    fixture f;
    uint8_t *kmem = (uint8_t *)xmalloc(RANGE_PAGES * RANGE_BYTES);
    uint8_t *vmem = (uint8_t *)xmalloc(RANGE_PAGES * RANGE_BYTES);
    uint8_t *keys = make_keys(4);
    kvt_range ranges[2 * RANGE_PAGES], bad[2];
    uint64_t rk = 0, rv = 0, out = 99, job = 1, ids[4] = {0, 1, 2, 3};
    size_t p, i;
    owned_result r;
    kvt_job_kind kinds[2] = {KVT_JOB_KIND_STORE, KVT_JOB_KIND_LOAD};

    rng_fill(kmem, RANGE_PAGES * RANGE_BYTES);
    rng_fill(vmem, RANGE_PAGES * RANGE_BYTES);
    if (!fixture_open(&f, "local", 8, 2 * RANGE_BYTES, "")) {
        goto out;
    }
    memset(f.pool, 0, 8 * 2 * RANGE_BYTES);
    /* Regions: NULL, empty and impossible ones are refused, with *out_region 0. */
    CHECK_STATUS(kvt_tier_add_region(NULL, kmem, 16, &out), KVT_STATUS_NULL_ARGUMENT);
    CHECK(out == 0);
    out = 99;
    CHECK_STATUS(kvt_tier_add_region(f.tier, NULL, 16, &out), KVT_STATUS_NULL_ARGUMENT);
    CHECK(out == 0);
    CHECK_STATUS(kvt_tier_add_region(f.tier, kmem, 16, NULL), KVT_STATUS_NULL_ARGUMENT);
    out = 99;
    CHECK_STATUS(kvt_tier_add_region(f.tier, kmem, 0, &out), KVT_STATUS_INVALID_ARGUMENT);
    CHECK(out == 0);
    CHECK_STATUS(kvt_tier_add_region(f.tier, kmem, SIZE_MAX, &out), KVT_STATUS_INVALID_ARGUMENT);
    CHECK(out == 0);
    CHECK_STATUS(kvt_tier_remove_region(NULL, 1), KVT_STATUS_NULL_ARGUMENT);
    CHECK_STATUS(kvt_tier_remove_region(f.tier, 12345), KVT_STATUS_INVALID_ARGUMENT);
    CHECK_STATUS(kvt_tier_submit_store_ranges(NULL, 1, ranges, 2, keys, KEY_LEN, 1), KVT_STATUS_NULL_ARGUMENT);
    CHECK_STATUS(kvt_tier_submit_load_ranges(NULL, 1, ranges, 2, keys, KEY_LEN, 1), KVT_STATUS_NULL_ARGUMENT);
    if (!CHECK_STATUS(kvt_tier_add_region(f.tier, kmem, RANGE_PAGES * RANGE_BYTES, &rk), KVT_STATUS_OK) ||
        !CHECK_STATUS(kvt_tier_add_region(f.tier, vmem, RANGE_PAGES * RANGE_BYTES, &rv), KVT_STATUS_OK)) {
        goto out;
    }
    CHECK(rk != 0 && rv != 0 && rk != rv);

    /* Pages 0..3 stored from ranges load into pool blocks and into pages 4..7. */
    for (p = 0; p < 4; p++) {
        page_ranges(ranges + 2 * p, rk, rv, p);
    }
    CHECK_STATUS(kvt_tier_submit_store_ranges(f.tier, job, ranges, 2, keys, KEY_LEN, 4), KVT_STATUS_OK);
    wait_ok(&f, &job, 1, scaled_ms(10000));
    job++;
    CHECK_STATUS(kvt_tier_submit_load(f.tier, job, ids, keys, KEY_LEN, 4), KVT_STATUS_OK);
    if (wait_ok(&f, &job, 1, scaled_ms(10000))) {
        for (p = 0; p < 4; p++) {
            CHECKF(memcmp(block(&f, p), kmem + p * RANGE_BYTES, RANGE_BYTES) == 0 &&
                       memcmp(block(&f, p) + RANGE_BYTES, vmem + p * RANGE_BYTES, RANGE_BYTES) == 0,
                   "page %zu loaded into a pool block", p);
        }
    }
    job++;
    for (p = 0; p < 4; p++) {
        page_ranges(ranges + 2 * p, rk, rv, 4 + p);
    }
    CHECK_STATUS(kvt_tier_submit_load_ranges(f.tier, job, ranges, 2, keys, KEY_LEN, 4), KVT_STATUS_OK);
    if (wait_ok(&f, &job, 1, scaled_ms(10000))) {
        CHECK(memcmp(kmem, kmem + 4 * RANGE_BYTES, 4 * RANGE_BYTES) == 0);
        CHECK(memcmp(vmem, vmem + 4 * RANGE_BYTES, 4 * RANGE_BYTES) == 0);
    }

    /* Bad arguments: the status, and the job's one result already queued. */
    for (i = 0; i < 2; i++) {
        struct {
            const char *what;
            kvt_range r0, r1;
            size_t per_key, num_keys;
            int null_ranges;
            kvt_status want;
        } cases[] = {
            {"NULL ranges", {0, 0, 0}, {0, 0, 0}, 2, 1, 1, KVT_STATUS_NULL_ARGUMENT},
            {"ranges_per_key 0", {rk, 0, 8}, {rv, 0, 8}, 0, 1, 0, KVT_STATUS_INVALID_ARGUMENT},
            {"ranges_per_key too large", {rk, 0, 8}, {rv, 0, 8}, KVT_MAX_RANGES_PER_KEY + 1, 1, 0,
             KVT_STATUS_INVALID_ARGUMENT},
            /* The product is checked before the (2-element) array is read: ASan and
             * valgrind would see a read past it. */
            {"too many ranges", {rk, 0, 8}, {rv, 0, 8}, KVT_MAX_RANGES_PER_KEY, 4096, 0,
             KVT_STATUS_INVALID_ARGUMENT},
            {"unknown region", {rk + rv + 100, 0, 8}, {rv, 0, 8}, 2, 1, 0, KVT_STATUS_INVALID_ARGUMENT},
            {"zero length", {rk, 0, 0}, {rv, 0, 8}, 2, 1, 0, KVT_STATUS_INVALID_ARGUMENT},
            {"past the region's end", {rk, RANGE_PAGES * RANGE_BYTES - 1, 2}, {rv, 0, 8}, 2, 1, 0,
             KVT_STATUS_INVALID_ARGUMENT},
            {"huge offset", {rk, UINT64_MAX, 2}, {rv, 0, 8}, 2, 1, 0, KVT_STATUS_INVALID_ARGUMENT},
            {"huge length", {rk, 8, UINT64_MAX}, {rv, 0, 8}, 2, 1, 0, KVT_STATUS_INVALID_ARGUMENT},
        };
        size_t c;
        for (c = 0; c < sizeof cases / sizeof cases[0]; c++) {
            kvt_status got;
            job++;
            bad[0] = cases[c].r0;
            bad[1] = cases[c].r1;
            got = submit_ranges(&f, kinds[i], job, cases[c].null_ranges ? NULL : bad, cases[c].per_key, keys,
                                cases[c].num_keys);
            CHECKF(got == cases[c].want, "%s: returned %d (%s): %s", cases[c].what, (int)got, kvt_status_str(got),
                   kvt_last_error());
            memset(&r, 0, sizeof r);
            if (expect_one_queued(&f, job, &r)) {
                CHECKF(r.status == cases[c].want && r.kind == kinds[i], "%s: result %d", cases[c].what,
                       (int)r.status);
                CHECKF(r.num_keys == cases[c].num_keys || cases[c].num_keys > KVT_MAX_KEYS_PER_JOB,
                       "%s: %zu keys", cases[c].what, r.num_keys);
            }
            free_results(&r, 1);
        }
    }

    /* A load of bytes a store holds is busy, and two keys of one load may not share bytes;
     * the region cannot be removed while the store's result waits. */
    page_ranges(ranges, rk, rv, 0);
    CHECK_STATUS(kvt_tier_submit_store_ranges(f.tier, 100, ranges, 2, keys, KEY_LEN, 1), KVT_STATUS_OK);
    bad[0].region = rv;
    bad[0].offset = RANGE_BYTES - 1;
    bad[0].len = 2;
    CHECK_STATUS(kvt_tier_submit_load_ranges(f.tier, 101, bad, 1, keys, KEY_LEN, 1), KVT_STATUS_BLOCK_BUSY);
    page_ranges(ranges + 2, rk, rv, 6);
    page_ranges(ranges + 4, rk, rv, 6);
    CHECK_STATUS(kvt_tier_submit_load_ranges(f.tier, 102, ranges + 2, 2, keys, KEY_LEN, 2),
                 KVT_STATUS_INVALID_ARGUMENT);
    CHECK_STATUS(kvt_tier_drain(f.tier, (uint64_t)scaled_ms(10000)), KVT_STATUS_OK);
    CHECK_STATUS(kvt_tier_remove_region(f.tier, rv), KVT_STATUS_BLOCK_BUSY);
    CHECK(strstr(kvt_last_error(), "poll") != NULL);
    CHECK(discard_results(&f) == 3);
    CHECK_STATUS(kvt_tier_remove_region(f.tier, rv), KVT_STATUS_OK);
    CHECK_STATUS(kvt_tier_remove_region(f.tier, rv), KVT_STATUS_INVALID_ARGUMENT);
    CHECK_STATUS(kvt_tier_submit_load_ranges(f.tier, 103, ranges, 2, keys, KEY_LEN, 1),
                 KVT_STATUS_INVALID_ARGUMENT);
    CHECK(discard_results(&f) == 1);

    /* After shutdown: no new region or job (its one result queued); removing works. */
    CHECK_STATUS(kvt_tier_shutdown(f.tier), KVT_STATUS_OK);
    out = 99;
    CHECK_STATUS(kvt_tier_add_region(f.tier, vmem, 16, &out), KVT_STATUS_SHUT_DOWN);
    CHECK(out == 0);
    CHECK_STATUS(kvt_tier_submit_store_ranges(f.tier, 104, ranges, 1, keys, KEY_LEN, 1), KVT_STATUS_SHUT_DOWN);
    memset(&r, 0, sizeof r);
    if (expect_one_queued(&f, 104, &r)) {
        CHECK(r.status == KVT_STATUS_SHUT_DOWN);
    }
    free_results(&r, 1);
    CHECK_STATUS(kvt_tier_remove_region(f.tier, rk), KVT_STATUS_OK);
out:
    fixture_close(&f);
    free(keys);
    free(kmem);
    free(vmem);
}

/* ------------------------------------------------------------------------------------ */
/* Runner                                                                                */
/* ------------------------------------------------------------------------------------ */

typedef struct test_case {
    const char *name;
    void (*fn)(void);
} test_case;

/* The cases, by the requirement they cover:
 *   a version                  h status_str
 *   b roundtrip_local, roundtrip_memory (64 x 64 KiB, shuffled slot <-> key mapping)
 *   c many_jobs_in_flight (1000 jobs, capacity-7 polls, event fd + poll(2)), threads
 *   d partial_load_missing_key, load_length_mismatch
 *   e submit_failures_yield_one_result
 *   f submit_bad_args, null_tier, config_errors, duplicate_job, state_errors,
 *     after_drain, drain_timeout, after_shutdown, poll_args, last_error, event_fd,
 *     key_bytes_any, null_arrays_huge_num_keys
 *   g shutdown_in_flight, free_in_flight */
static const test_case k_cases[] = {
    {"version", test_version},
    {"status_str", test_status_str},
    {"roundtrip_local", test_roundtrip_local},
    {"roundtrip_memory", test_roundtrip_memory},
    {"many_jobs_in_flight", test_many_jobs},
    {"partial_load_missing_key", test_partial_load},
    {"submit_failures_yield_one_result", test_submit_failures_yield_one_result},
    {"submit_bad_args", test_submit_bad_args},
    {"null_tier", test_null_tier},
    {"config_errors", test_config_errors},
    {"local_unwritable", test_local_unwritable},
    {"duplicate_job", test_duplicate_job},
    {"block_busy", test_block_busy},
    {"state_errors", test_state_errors},
    {"after_drain", test_after_drain},
    {"drain_timeout", test_drain_timeout},
    {"event_fd", test_event_fd},
    {"load_length_mismatch", test_load_length_mismatch},
    {"ranges", test_ranges},
    {"key_bytes_any", test_key_bytes_any},
    {"null_arrays_huge_num_keys", test_null_arrays_huge_num_keys},
    {"huge_key_len", test_huge_key_len},
    {"job_size_and_id_extremes", test_job_size_and_id_extremes},
    {"after_shutdown", test_after_shutdown},
    {"poll_args", test_poll_args},
    {"last_error", test_last_error},
    {"threads", test_threads},
    {"shutdown_in_flight", test_shutdown_in_flight},
    {"shutdown_in_flight_no_grace", test_shutdown_in_flight_no_grace},
    {"free_in_flight", test_free_in_flight},
    {"fork", test_fork},
    {"stats", test_stats},
    {"vllm_namespace", test_vllm_namespace},
    {"metrics", test_metrics},
    {"log_callback", test_log_callback},
    {"lookups_and_events", test_lookups_and_events},
    {"clear", test_clear},
    {"ranges_on_store", test_ranges_on_store},
    {"pool_fenced", test_pool_fenced},
    {"random_sequences", test_random_sequences},
};

static int in_list(const char *list, const char *name)
{
    size_t len = strlen(name);
    const char *p = list;
    while (p && *p) {
        const char *end = strchr(p, ',');
        size_t n = end ? (size_t)(end - p) : strlen(p);
        if (n == len && strncmp(p, name, len) == 0) {
            return 1;
        }
        p = end ? end + 1 : NULL;
    }
    return 0;
}

static int selected(const char *name, int argc, char **argv)
{
    int i;
    if (argc <= 1) {
        return 1;
    }
    for (i = 1; i < argc; i++) {
        if (strstr(name, argv[i]) != NULL) {
            return 1;
        }
    }
    return 0;
}

int main(int argc, char **argv)
{
    const char *xfail = getenv("KVT_HARNESS_XFAIL");
    const char *skip = getenv("KVT_HARNESS_SKIP");
    const char *env;
    size_t i;
    int passed = 0, failed = 0, xfailed = 0, skipped = 0;
    double t_all = now_ms();

    setvbuf(stdout, NULL, _IOLBF, 0);
    g_small = (env = getenv("KVT_HARNESS_SMALL")) != NULL && env[0] != '\0' && strcmp(env, "0") != 0;
    if ((env = getenv("KVT_HARNESS_TIMEOUT_SCALE")) != NULL && atoi(env) > 0) {
        g_timeout_scale = atoi(env);
    }
    if ((env = getenv("KVT_HARNESS_SEED")) != NULL && env[0] != '\0') {
        g_seed = strtoull(env, NULL, 0);
    }
    printf("kvtier C ABI harness (%s): library %s, header %s, seed %" PRIu64 "%s\n",
#ifdef __cplusplus
           "built as C++",
#else
           "built as C",
#endif
           kvt_version(), KVTIER_VERSION, g_seed, g_small ? ", small" : "");

    for (i = 0; i < sizeof k_cases / sizeof k_cases[0]; i++) {
        const test_case *c = &k_cases[i];
        int expected_failure = xfail != NULL && in_list(xfail, c->name);
        double t0;
        if (!selected(c->name, argc, argv)) {
            continue;
        }
        if (skip != NULL && in_list(skip, c->name)) {
            skipped++;
            printf("[ SKIPPED  ] %s (KVT_HARNESS_SKIP)\n", c->name);
            continue;
        }
        g_rng = g_seed ^ (0x9E3779B97F4A7C15ULL * (i + 1));
        if (g_rng == 0) {
            g_rng = 1;
        }
        g_case_failures = 0;
        printf("[ RUN      ] %s\n", c->name);
        t0 = now_ms();
        c->fn();
        if (g_case_failures == 0 && !expected_failure) {
            passed++;
            printf("[       OK ] %s (%.0f ms)\n", c->name, now_ms() - t0);
        } else if (g_case_failures == 0) {
            failed++;
            printf("[ XPASS    ] %s (%.0f ms): listed in KVT_HARNESS_XFAIL as a known library bug but passed;"
                   " remove it from the list\n",
                   c->name, now_ms() - t0);
        } else if (expected_failure) {
            xfailed++;
            printf("[ XFAIL    ] %s (%.0f ms): %d failed checks, tolerated as a known library bug"
                   " (KVT_HARNESS_XFAIL)\n",
                   c->name, now_ms() - t0, g_case_failures);
        } else {
            failed++;
            printf("[  FAILED  ] %s (%.0f ms): %d failed checks\n", c->name, now_ms() - t0, g_case_failures);
        }
    }
    if (passed + failed + xfailed + skipped == 0) {
        printf("no test case matches the arguments\n");
        return 2;
    }
    printf("%ld checks, %ld failed; %.1f s\n", g_checks, g_check_failures, (now_ms() - t_all) / 1e3);
    if (xfailed > 0) {
        printf("%d known-bug cases failed as expected (XFAIL, not counted below)\n", xfailed);
    }
    if (skipped > 0) {
        printf("%d cases skipped (KVT_HARNESS_SKIP, not counted below)\n", skipped);
    }
    printf("%d passed, %d failed\n", passed, failed);
    return failed == 0 && passed > 0 ? 0 : 1;
}
