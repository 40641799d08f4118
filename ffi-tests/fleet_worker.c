/*
 * ffi-tests/fleet_worker.c: the C engine of the fleet soak (python/tests/test_fleet_soak.py).
 *
 *   cc -std=c11 -O2 -Iinclude ffi-tests/fleet_worker.c -Ltarget/release -lkvtier \
 *      -Wl,-rpath,$PWD/target/release -o fleet_worker
 *   fleet_worker NAME CONFIG_JSON KEY_SEED KEYS BATCH RNG_SEED
 *
 * An engine on the C ABI, beside vLLM engines on the same namespace: in rounds, it looks a
 * random batch of the KEYS keys up (kvt_tier_lookup until no key answers RETRY, one
 * kvt_tier_schedule_end per step), loads the HITs and checks every byte, and stores the
 * MISSes. Keys and bytes are those of python/tests/fleet_worker.py: key i is four
 * little-endian words mix((KEY_SEED << 32) ^ (4i + k)) and group 0; the block of a key is
 * the little-endian words mix(fnv1a64(key) + j); mix is splitmix64's finaliser.
 *
 * Every job's result is matched to its submission (exactly one result per job); every
 * key's status is counted; a status other than OK and NotFound is recorded with the job's
 * wall-clock times, for the test to judge against the store's outages.
 *
 * Output: lines "FLEET {json}" on stdout (ready, progress, wrong, final). Commands on
 * stdin: "final" ends the run; then every key this process stored is looked up in a new
 * request, the MISSes are stored again and listed (stored_after_miss), and the process
 * exits. End of stdin exits at once (status 3).
 */
#define _GNU_SOURCE
#include "kvtier.h"

#include <inttypes.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

enum { BLOCK = 4096, KEY = 36, MAX_KEYS = 1 << 16, MAX_BATCH = 256, MAX_UNEXPECTED = 200, NSTATUS = 64 };
/* Pause between two rounds, so that the worker leaves the machine's cores to the others. */
enum { ROUND_PAUSE_MS = 5 };

static const double DEADLINE_S = 60.0;

static uint64_t mix(uint64_t z)
{
    z += 0x9E3779B97F4A7C15ULL;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
}

static void key_of(uint8_t *key, uint32_t seed, uint64_t index)
{
    for (int k = 0; k < 4; k++) {
        uint64_t w = mix(((uint64_t)seed << 32) ^ (index * 4 + (uint64_t)k));
        for (int b = 0; b < 8; b++) {
            key[8 * k + b] = (uint8_t)(w >> (8 * b));
        }
    }
    memset(key + 32, 0, 4);
}

static void content_of(uint8_t *dst, const uint8_t *key)
{
    uint64_t seed = 0xCBF29CE484222325ULL;
    for (int i = 0; i < KEY; i++) {
        seed = (seed ^ key[i]) * 0x100000001B3ULL;
    }
    for (uint64_t j = 0; j < BLOCK / 8; j++) {
        uint64_t w = mix(seed + j);
        for (int b = 0; b < 8; b++) {
            dst[8 * j + (uint64_t)b] = (uint8_t)(w >> (8 * b));
        }
    }
}

static double now_mono(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

static double now_wall(void)
{
    struct timespec t;
    clock_gettime(CLOCK_REALTIME, &t);
    return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

/* -- state ------------------------------------------------------------------------------- */

static const char *NAME = "C";
static uint32_t KEY_SEED;
static uint64_t NKEYS, BATCH;
static uint8_t *KEYS;   /* NKEYS keys */
static uint8_t *POOL;   /* 2 * BATCH blocks: loads into [0, BATCH), stores from [BATCH, 2 BATCH) */
static uint8_t *EXPECT; /* one block of scratch */
static uint8_t *STORED; /* per key: stored OK by this process at least once */
static kvt_tier *TIER;

static struct {
    uint64_t rounds, loads, wrong, hits, misses, stores, jobs, duplicate_results, unknown_results;
    uint64_t statuses[NSTATUS], job_statuses[NSTATUS];
    int n_unexpected;
    struct {
        int status;
        int kind;
        double t0, t1;
        char message[600];
    } unexpected[MAX_UNEXPECTED];
} F;

static uint64_t NEXT_JOB = 1, NEXT_REQ = 1;

static void out(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fputs("FLEET ", stdout);
    vfprintf(stdout, fmt, ap);
    fputc('\n', stdout);
    fflush(stdout);
    va_end(ap);
}

static void die(const char *what)
{
    out("{\"event\": \"error\", \"name\": \"%s\", \"what\": \"%s\", \"error\": \"%s\"}", NAME, what, kvt_last_error());
    exit(2);
}

static void json_string(FILE *f, const char *s)
{
    fputc('"', f);
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\') {
            fprintf(f, "\\%c", c);
        } else if (c < 0x20) {
            fprintf(f, "\\u%04x", c);
        } else {
            fputc(c, f);
        }
    }
    fputc('"', f);
}

static uint64_t rng_state;
static uint64_t rng_next(void)
{
    rng_state += 0x9E3779B97F4A7C15ULL;
    return mix(rng_state);
}

/* -- jobs: submit one, wait for its one result -------------------------------------------- */

/* Runs one job over `n` keys (indices `idx`) in slots `slots` and waits for its result:
 * every result polled meanwhile must belong to it (one job in flight at a time). */
static void run_job(int kind, const uint64_t *idx, const uint64_t *slots, size_t n)
{
    uint8_t keys[MAX_BATCH * KEY];
    for (size_t i = 0; i < n; i++) {
        memcpy(keys + i * KEY, KEYS + idx[i] * KEY, KEY);
    }
    uint64_t job = NEXT_JOB++;
    double t0 = now_wall();
    F.jobs++;
    if (kind == KVT_JOB_KIND_STORE) {
        kvt_tier_submit_store(TIER, job, slots, keys, KEY, n); /* errors come as its result */
    } else {
        kvt_tier_submit_load(TIER, job, slots, keys, KEY, n);
    }
    struct pollfd pfd = {.fd = kvt_tier_event_fd(TIER), .events = POLLIN};
    double deadline = now_mono() + DEADLINE_S;
    for (int done = 0; !done;) {
        kvt_result res[8];
        size_t got = 0;
        if (kvt_tier_poll(TIER, res, 8, &got) != KVT_STATUS_OK) {
            die("kvt_tier_poll");
        }
        for (size_t r = 0; r < got; r++) {
            if (res[r].job_id != job) {
                if (res[r].job_id < job) {
                    F.duplicate_results++;
                } else {
                    F.unknown_results++;
                }
                continue;
            }
            if (done) {
                F.duplicate_results++;
                continue;
            }
            done = 1;
            double t1 = now_wall();
            F.job_statuses[(int)res[r].status < NSTATUS ? (int)res[r].status : NSTATUS - 1]++;
            for (size_t i = 0; i < n; i++) {
                int st = (res[r].num_keys == n && res[r].key_status) ? (int)res[r].key_status[i] : (int)res[r].status;
                F.statuses[st < NSTATUS ? st : NSTATUS - 1]++;
                if (st != KVT_STATUS_OK && st != KVT_STATUS_NOT_FOUND && F.n_unexpected < MAX_UNEXPECTED) {
                    F.unexpected[F.n_unexpected].status = st;
                    F.unexpected[F.n_unexpected].kind = kind;
                    F.unexpected[F.n_unexpected].t0 = t0;
                    F.unexpected[F.n_unexpected].t1 = t1;
                    const char *m = res[r].message ? res[r].message : "";
                    size_t ml = strlen(m);
                    if (ml < sizeof F.unexpected[0].message) {
                        snprintf(F.unexpected[F.n_unexpected].message, sizeof F.unexpected[0].message, "%s", m);
                    } else { /* the head names the key, the tail the cause */
                        snprintf(F.unexpected[F.n_unexpected].message, sizeof F.unexpected[0].message, "%.100s ... %s",
                                 m, m + ml - (sizeof F.unexpected[0].message - 110));
                    }
                    F.n_unexpected++;
                }
                if (st != KVT_STATUS_OK) {
                    continue;
                }
                if (kind == KVT_JOB_KIND_STORE) {
                    F.stores++;
                    STORED[idx[i]] = 1;
                } else {
                    F.loads++;
                    content_of(EXPECT, KEYS + idx[i] * KEY);
                    if (memcmp(POOL + slots[i] * BLOCK, EXPECT, BLOCK) != 0) {
                        F.wrong++;
                        out("{\"event\": \"wrong\", \"name\": \"%s\", \"key\": %" PRIu64 ", \"where\": \"C load\"}",
                            NAME, idx[i]);
                    }
                }
            }
        }
        if (!done) {
            if (now_mono() > deadline) {
                out("{\"event\": \"error\", \"name\": \"%s\", \"what\": \"job %" PRIu64 " never finished\"}", NAME,
                    job);
                exit(2);
            }
            poll(&pfd, 1, 100);
        }
    }
}

/* Looks keys `idx` up for a new request until none answers RETRY; HIT keys go to `hits`,
 * MISS keys to `misses`. Returns the request id (finish it with kvt_tier_request_finished). */
static uint64_t resolve(const uint64_t *idx, size_t n, uint64_t *hits, size_t *nh, uint64_t *misses, size_t *nm)
{
    uint64_t req = NEXT_REQ++;
    int verdict[MAX_BATCH];
    for (size_t i = 0; i < n; i++) {
        verdict[i] = KVT_LOOKUP_RESULT_RETRY;
    }
    double deadline = now_mono() + DEADLINE_S;
    for (;;) {
        size_t open = 0;
        for (size_t i = 0; i < n; i++) {
            if (verdict[i] == KVT_LOOKUP_RESULT_RETRY) {
                kvt_lookup_result v;
                if (kvt_tier_lookup(TIER, req, KEYS + idx[i] * KEY, KEY, &v) != KVT_STATUS_OK) {
                    die("kvt_tier_lookup");
                }
                verdict[i] = (int)v;
                open += v == KVT_LOOKUP_RESULT_RETRY;
            }
        }
        if (!open) {
            break;
        }
        if (now_mono() > deadline) {
            out("{\"event\": \"error\", \"name\": \"%s\", \"what\": \"lookups never resolved\"}", NAME);
            exit(2);
        }
        kvt_tier_schedule_end(TIER); /* the end of a scheduler step */
        poll(NULL, 0, 2);            /* the next step */
    }
    *nh = *nm = 0;
    for (size_t i = 0; i < n; i++) {
        if (verdict[i] == KVT_LOOKUP_RESULT_HIT) {
            hits[(*nh)++] = idx[i];
        } else {
            misses[(*nm)++] = idx[i];
        }
    }
    F.hits += *nh;
    F.misses += *nm;
    return req;
}

/* One request: lookups, loads of the HITs (checked), stores of the MISSes. */
static void one_request(const uint64_t *idx, size_t n, uint64_t *stored_after_miss, size_t *n_sam, uint64_t *final_hits,
                        size_t *n_fh)
{
    uint64_t hits[MAX_BATCH], misses[MAX_BATCH], slots[MAX_BATCH];
    size_t nh, nm;
    uint64_t req = resolve(idx, n, hits, &nh, misses, &nm);
    if (nh) {
        for (size_t i = 0; i < nh; i++) {
            slots[i] = i;
        }
        memset(POOL, 0, nh * BLOCK);
        run_job(KVT_JOB_KIND_LOAD, hits, slots, nh);
    }
    if (nm) {
        for (size_t i = 0; i < nm; i++) {
            slots[i] = BATCH + i;
            content_of(POOL + slots[i] * BLOCK, KEYS + misses[i] * KEY);
        }
        run_job(KVT_JOB_KIND_STORE, misses, slots, nm);
    }
    kvt_tier_request_finished(TIER, req);
    if (stored_after_miss) {
        for (size_t i = 0; i < nm; i++) {
            stored_after_miss[(*n_sam)++] = misses[i];
        }
        for (size_t i = 0; i < nh; i++) {
            final_hits[(*n_fh)++] = hits[i];
        }
    }
}

/* Returns 1 when "final" arrived on stdin; exits at end of stdin. */
static int final_requested(void)
{
    static char line[256];
    static size_t len;
    struct pollfd pfd = {.fd = 0, .events = POLLIN};
    while (poll(&pfd, 1, 0) > 0) {
        ssize_t got = read(0, line + len, sizeof line - 1 - len);
        if (got <= 0) {
            exit(3); /* the test is gone */
        }
        len += (size_t)got;
        line[len] = 0;
        if (strstr(line, "final")) {
            return 1;
        }
        if (len >= sizeof line - 1) {
            len = 0;
        }
    }
    return 0;
}

static void print_counts(const char *name, const uint64_t *counts)
{
    printf("\"%s\": {", name);
    const char *sep = "";
    for (int s = 0; s < NSTATUS; s++) {
        if (counts[s]) {
            printf("%s\"%d\": %" PRIu64, sep, s, counts[s]);
            sep = ", ";
        }
    }
    printf("}, ");
}

static void print_list(const char *name, const uint64_t *v, size_t n)
{
    printf("\"%s\": [", name);
    for (size_t i = 0; i < n; i++) {
        printf("%s%" PRIu64, i ? ", " : "", v[i]);
    }
    printf("], ");
}

static void progress(int force)
{
    static double last;
    double t = now_mono();
    if (force || t - last >= 0.5) {
        last = t;
        out("{\"event\": \"progress\", \"name\": \"%s\", \"rounds\": %" PRIu64 ", \"loads\": %" PRIu64
            ", \"wrong\": %" PRIu64 ", \"stores\": %" PRIu64 ", \"hits\": %" PRIu64 ", \"misses\": %" PRIu64 "}",
            NAME, F.rounds, F.loads, F.wrong, F.stores, F.hits, F.misses);
    }
}

int main(int argc, char **argv)
{
    if (argc != 7) {
        fprintf(stderr, "usage: %s NAME CONFIG_JSON KEY_SEED KEYS BATCH RNG_SEED\n", argv[0]);
        return 2;
    }
    NAME = argv[1];
    KEY_SEED = (uint32_t)strtoul(argv[3], NULL, 10);
    NKEYS = strtoull(argv[4], NULL, 10);
    BATCH = strtoull(argv[5], NULL, 10);
    rng_state = strtoull(argv[6], NULL, 10);
    if (NKEYS == 0 || NKEYS > MAX_KEYS || BATCH == 0 || BATCH > MAX_BATCH || BATCH > NKEYS) {
        fprintf(stderr, "bad KEYS or BATCH\n");
        return 2;
    }
    KEYS = malloc(NKEYS * KEY);
    STORED = calloc(NKEYS, 1);
    POOL = calloc(2 * BATCH, BLOCK);
    EXPECT = malloc(BLOCK);
    if (!KEYS || !STORED || !POOL || !EXPECT) {
        return 2;
    }
    for (uint64_t i = 0; i < NKEYS; i++) {
        key_of(KEYS + i * KEY, KEY_SEED, i);
    }
    if (kvt_tier_new(argv[2], &TIER) != KVT_STATUS_OK) {
        die("kvt_tier_new");
    }
    if (kvt_tier_register_memory(TIER, POOL, 2 * BATCH, BLOCK) != KVT_STATUS_OK) {
        die("kvt_tier_register_memory");
    }
    out("{\"event\": \"ready\", \"name\": \"%s\", \"pid\": %d}", NAME, (int)getpid());

    uint64_t idx[MAX_BATCH];
    while (!final_requested()) {
        /* BATCH distinct random keys */
        for (size_t n = 0; n < BATCH;) {
            uint64_t k = rng_next() % NKEYS;
            int dup = 0;
            for (size_t j = 0; j < n; j++) {
                dup |= idx[j] == k;
            }
            if (!dup) {
                idx[n++] = k;
            }
        }
        one_request(idx, BATCH, NULL, NULL, NULL, NULL);
        F.rounds++;
        progress(0);
        poll(NULL, 0, ROUND_PAUSE_MS); /* an engine's time between requests */
    }
    progress(1);

    /* The final check: every key this process stored, looked up in new requests; the
     * MISSes are stored again. */
    uint64_t *mine = malloc(NKEYS * sizeof *mine), *sam = malloc(NKEYS * sizeof *sam),
             *fh = malloc(NKEYS * sizeof *fh);
    size_t n_mine = 0, n_sam = 0, n_fh = 0;
    for (uint64_t i = 0; i < NKEYS; i++) {
        if (STORED[i]) {
            mine[n_mine++] = i;
        }
    }
    uint64_t failed_before = 0, failed_after = 0, stores_before = F.stores;
    for (int s = 1; s < NSTATUS; s++) {
        failed_before += F.statuses[s];
    }
    for (size_t j = 0; j < n_mine; j += BATCH) {
        size_t n = n_mine - j < BATCH ? n_mine - j : BATCH;
        one_request(mine + j, n, sam, &n_sam, fh, &n_fh);
    }
    for (int s = 1; s < NSTATUS; s++) {
        failed_after += F.statuses[s];
    }
    kvt_stats st;
    memset(&st, 0, sizeof st);
    kvt_tier_stats(TIER, &st, sizeof st);

    printf("FLEET {\"event\": \"final\", \"role\": \"c-engine\", \"name\": \"%s\", \"pid\": %d, ", NAME, (int)getpid());
    printf("\"rounds\": %" PRIu64 ", \"loads\": %" PRIu64 ", \"wrong\": %" PRIu64 ", \"hits\": %" PRIu64
           ", \"misses\": %" PRIu64 ", \"stores\": %" PRIu64 ", \"jobs_submitted\": %" PRIu64
           ", \"duplicate_results\": %" PRIu64 ", \"unknown_results\": %" PRIu64 ", ",
           F.rounds, F.loads, F.wrong, F.hits, F.misses, F.stores, F.jobs, F.duplicate_results, F.unknown_results);
    print_counts("status_codes", F.statuses);
    print_counts("job_status_codes", F.job_statuses);
    printf("\"unexpected\": [");
    for (int u = 0; u < F.n_unexpected; u++) {
        printf("%s{\"status\": %d, \"kind\": \"%s\", \"t0\": %.6f, \"t1\": %.6f, \"message\": ", u ? ", " : "",
               F.unexpected[u].status, F.unexpected[u].kind == KVT_JOB_KIND_STORE ? "store" : "load",
               F.unexpected[u].t0, F.unexpected[u].t1);
        json_string(stdout, F.unexpected[u].message);
        printf("}");
    }
    printf("], ");
    printf("\"final_keys\": %zu, ", n_mine);
    print_list("stored_after_miss", sam, n_sam);
    print_list("final_hits", fh, n_fh);
    printf("\"final_stores\": %" PRIu64 ", \"final_failed_keys\": %" PRIu64 ", \"library_jobs_without_result\": 0, ",
           F.stores - stores_before, failed_after - failed_before);
    printf("\"kvtier_stats\": {\"keys_stored\": %" PRIu64 ", \"keys_loaded\": %" PRIu64 ", \"keys_failed\": %" PRIu64
           ", \"existence_checks\": %" PRIu64 ", \"existence_check_errors\": %" PRIu64 ", \"dedup_known\": %" PRIu64
           ", \"dedup_joined\": %" PRIu64 ", \"dedup_already_stored\": %" PRIu64 ", \"retries\": %" PRIu64
           ", \"corrupt_blocks\": %" PRIu64 "}}\n",
           st.keys_stored, st.keys_loaded, st.keys_failed, st.existence_checks, st.existence_check_errors,
           st.dedup_known, st.dedup_joined, st.dedup_already_stored, st.retries, st.corrupt_blocks);
    fflush(stdout);
    kvt_tier_free(TIER);
    free(mine);
    free(sam);
    free(fh);
    free(KEYS);
    free(STORED);
    free(POOL);
    free(EXPECT);
    return 0;
}
