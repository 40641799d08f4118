/*
 * ffi-tests/harness/fixture.c: the helpers every case uses around a tier.
 *
 * Keys (a random hash and a group index), temporary directories and their removal; the
 * fixture: a tier on a fresh memory, local or KVT_HARNESS_STORE store with a registered
 * pool of random blocks, closed tier first, and what cases do with it alike (store the
 * first blocks and wait, submit either kind of job, shut down what is left in flight);
 * and the results: copies that outlive the next poll, the invariants every result must
 * satisfy, and the ways to take them (collect on the event fd, wait_ok,
 * expect_one_queued, discard_results).
 */
#include "harness.h"

#include <errno.h>
#include <ftw.h>
#include <math.h>
#include <poll.h>
#include <sys/stat.h>
#include <unistd.h>

/* ------------------------------------------------------------------------------------ */
/* Keys, temporary directories, the fixture                                             */
/* ------------------------------------------------------------------------------------ */

/* A key: 32 random hash bytes followed by the group index, 4 bytes big-endian. */
void make_key(uint8_t *key, uint32_t group)
{
    rng_fill(key, HASH_LEN);
    key[HASH_LEN + 0] = (uint8_t)(group >> 24);
    key[HASH_LEN + 1] = (uint8_t)(group >> 16);
    key[HASH_LEN + 2] = (uint8_t)(group >> 8);
    key[HASH_LEN + 3] = (uint8_t)group;
}

uint8_t *make_keys(size_t n)
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

void rm_rf(const char *dir)
{
    if (dir[0] != '\0') {
        nftw(dir, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
    }
}

int make_temp_dir(char *out, size_t cap)
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

uint8_t *block(const fixture *f, uint64_t id) { return f->pool + id * f->block_bytes; }

/* Opens a tier on a fresh store ("memory", "local", or "env": the JSON store section in
 * KVT_HARNESS_STORE, else a local store) with `extra` appended to the
 * top-level JSON object (e.g. ",\"max_inflight_transfers\":1"), and registers a pool of
 * random bytes unless num_blocks is 0. */
int fixture_open(fixture *f, const char *store, uint64_t num_blocks, size_t block_bytes, const char *extra)
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
void fixture_close(fixture *f)
{
    kvt_tier_free(f->tier);
    f->tier = NULL;
    free(f->pool);
    f->pool = NULL;
    rm_rf(f->dir);
    f->dir[0] = '\0';
}

/* A case's way out when jobs are still in flight at its end: shut the tier down
 * (cancelling what is stuck), then check and drop the remaining results. */
void shut_down_leftovers(const fixture *f)
{
    if (kvt_tier_jobs_in_flight(f->tier) > 0) {
        printf("    %zu jobs still in flight; shutting the tier down\n", kvt_tier_jobs_in_flight(f->tier));
        CHECK_STATUS(kvt_tier_shutdown(f->tier), KVT_STATUS_OK);
        CHECK(kvt_tier_jobs_in_flight(f->tier) == 0);
        discard_results(f);
    }
}

/* Stores blocks 0..n-1 under keys[0..n) as one job, `job_id`, and waits for its result
 * (wait_ok): what cases that load stored keys, or store again, start from. */
int store_first_blocks(const fixture *f, uint64_t job_id, const uint8_t *keys, size_t n, int timeout_ms)
{
    uint64_t *ids = (uint64_t *)xmalloc(n * sizeof(uint64_t));
    size_t i;
    int ok;
    for (i = 0; i < n; i++) {
        ids[i] = i;
    }
    CHECK_STATUS(kvt_tier_submit_store(f->tier, job_id, ids, keys, KEY_LEN, n), KVT_STATUS_OK);
    ok = wait_ok(f, &job_id, 1, timeout_ms);
    free(ids);
    return ok;
}

/* Submits a store or a load job of `kind`. */
kvt_status submit_kind(kvt_tier *t, kvt_job_kind kind, uint64_t id, const uint64_t *ids, const uint8_t *keys,
                       size_t key_len, size_t n)
{
    return kind == KVT_JOB_KIND_STORE ? kvt_tier_submit_store(t, id, ids, keys, key_len, n)
                                      : kvt_tier_submit_load(t, id, ids, keys, key_len, n);
}

/* ------------------------------------------------------------------------------------ */
/* Results: copies, invariants, and the ways to wait for them                           */
/* ------------------------------------------------------------------------------------ */

void free_results(owned_result *r, size_t n)
{
    size_t i;
    for (i = 0; i < n; i++) {
        free(r[i].key_status);
        free(r[i].message);
    }
}

/* Frees what collect() copied into `res`, an array of `cap` it was given (of `got`
 * results collected, the first `cap` at most), then the array itself; NULL is a no-op. */
void free_collected(owned_result *res, size_t got, size_t cap)
{
    if (res) {
        free_results(res, got < cap ? got : cap);
    }
    free(res);
}

/* Checks what every result must satisfy, whatever its job. */
void check_result_invariants(const kvt_result *r, size_t block_bytes)
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

void copy_result(owned_result *dst, const kvt_result *src)
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

int fd_readable(int fd, int timeout_ms)
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
size_t collect(const fixture *f, size_t want, int timeout_ms, size_t capacity, owned_result *out,
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
size_t discard_results(const fixture *f)
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
int expect_one_queued(const fixture *f, uint64_t job_id, owned_result *out)
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
int wait_ok(const fixture *f, const uint64_t *ids, size_t n, int timeout_ms)
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
    free_collected(res, got, n);
    return ok;
}
