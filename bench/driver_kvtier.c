/*
 * bench/driver_kvtier.c: drives kvtier through its C ABI for one benchmark point and
 * prints one JSON line.
 *
 *   cc -O2 -std=c11 -Iinclude bench/driver_kvtier.c -Ltarget/release -lkvtier \
 *      -Wl,-rpath,$PWD/target/release -lm -o target/bench/driver_kvtier
 *   driver_kvtier --endpoint 127.0.0.1:9000 --bucket bench --op store \
 *      --block-size 2M --blocks 128 --concurrency 16
 *
 * Workloads (one block per job; `--concurrency` jobs in flight and the same number as
 * max_inflight_transfers):
 *   store   block i of a pre-faulted pool, filled with the deterministic data of block i,
 *           under key i. dedup is off, so every store really uploads.
 *   load    key i into block i of a pool pre-faulted with 0xA5, then every byte of every
 *           block is compared with the data of block i (outside the timed part).
 *   exists  `--repeat` batches of `--blocks` lookups: the first half are keys 0..n/2-1
 *           (present if a store of at least n/2 blocks ran before), the second half keys
 *           that are never stored. A batch = kvt_tier_lookup of every key (RETRY),
 *           kvt_tier_schedule_end, then lookups until every key has a verdict. Reports
 *           batch latency percentiles; verification = exactly the first half hit.
 *
 * Key i (36 bytes): four little-endian words mix((key_seed << 32) ^ (4i + k)), k = 0..3,
 * then group 0 (4 zero bytes). Data of block i: little-endian words
 * mix((data_seed << 56) | (i << 28) | j), j = 0.. (block_bytes / 8). mix = splitmix64's
 * finaliser. bench/clients.py computes the same keys, object names and bytes.
 *
 * CPU: getrusage(RUSAGE_SELF) user+sys over the timed part only (data generation and
 * verification are outside it). caller_us_per_block = CPU time of the calling thread
 * (CLOCK_THREAD_CPUTIME_ID) over the timed part, per block: submit + poll + waiting on the
 * event fd + this program's own bookkeeping, i.e. an upper bound of what a host pays.
 * api_us_per_block = wall time spent inside kvt_tier_submit_* and kvt_tier_poll per block
 * (CLOCK_MONOTONIC, vDSO): the micro-benchmark of the calls themselves.
 *
 * --keys-per-job K puts K blocks in one job (jobs in flight = concurrency / K).
 * --step-us N polls once every N µs (as an engine polls once per scheduler step) instead of
 * waking on the event fd for every result.
 * --op exists --background-load N: while the batches run, loads of N blocks (stored
 * before under --bg-key-seed) keep 16 transfers in flight, to measure existence latency
 * under a saturated transfer lane. Peak RSS is ru_maxrss of the whole
 * run (the pool included; pool_mib says how much of it is the pool).
 */
#define _GNU_SOURCE
#include "kvtier.h"
#include "bench.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#define KEY_BYTES 36

static uint64_t mix(uint64_t z)
{
    z += 0x9E3779B97F4A7C15ULL;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
}

static void make_key(uint8_t *key, uint32_t key_seed, uint64_t index)
{
    for (int k = 0; k < 4; k++) {
        uint64_t w = mix(((uint64_t)key_seed << 32) ^ (index * 4 + (uint64_t)k));
        memcpy(key + 8 * k, &w, 8); /* little-endian host */
    }
    memset(key + 32, 0, 4);
}

static void fill_block(uint8_t *dst, size_t bytes, uint32_t data_seed, uint64_t block)
{
    uint64_t *w = (uint64_t *)dst;
    uint64_t base = ((uint64_t)data_seed << 56) | (block << 28);
    for (size_t j = 0; j < bytes / 8; j++)
        w[j] = mix(base | j);
}

static int check_block(const uint8_t *src, size_t bytes, uint32_t data_seed, uint64_t block)
{
    const uint64_t *w = (const uint64_t *)src;
    uint64_t base = ((uint64_t)data_seed << 56) | (block << 28);
    for (size_t j = 0; j < bytes / 8; j++)
        if (w[j] != mix(base | j))
            return 0;
    return 1;
}

static long peak_rss_kib(void)
{
    struct rusage r;
    getrusage(RUSAGE_SELF, &r);
    return r.ru_maxrss;
}

/* CPU seconds (user+sys) a process has used so far, from /proc/PID/stat; 0 if unknown. */
static double proc_cpu_s(long pid)
{
    if (pid <= 0)
        return 0;
    char path[64], buf[1024];
    snprintf(path, sizeof path, "/proc/%ld/stat", pid);
    FILE *f = fopen(path, "r");
    if (!f)
        return 0;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    char *p = strrchr(buf, ')');
    if (!p)
        return 0;
    unsigned long long ut = 0, st = 0;
    /* after ") ": state(3) ppid pgrp session tty tpgid flags minflt cminflt majflt cmajflt utime(14) stime(15) */
    if (sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %llu %llu", &ut, &st) != 2)
        return 0;
    return (double)(ut + st) / (double)sysconf(_SC_CLK_TCK);
}

static void die(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "driver_kvtier: ");
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n");
    va_end(ap);
    exit(2);
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double pct(const double *sorted, size_t n, double p)
{
    if (n == 0)
        return 0;
    double rank = p / 100.0 * (double)(n - 1);
    size_t lo = (size_t)floor(rank), hi = (size_t)ceil(rank);
    return sorted[lo] + (sorted[hi] - sorted[lo]) * (rank - (double)lo);
}


/* Keeps up to `jobs_in_flight_max` jobs of `kpj` blocks in flight and collects results.
 * Job j moves blocks j*kpj .. under the same keys; when `cycle`, jobs go round the groups
 * of `kpj` blocks, skipping any group a job still in flight holds (a load needs its blocks
 * alone, and jobs finish out of order), and a job's id carries its group in its low bits. */
struct pump {
    kvt_tier *tier;
    int fd, load, cycle;
    long step_us; /* >0: poll once per "scheduler step" of this length instead of waiting on the fd */
    const uint8_t *keys;
    size_t blocks, kpj, jobs_in_flight_max, limit;
    size_t submitted, inflight, done, errors;
    double api_s; /* wall time inside kvt_tier_submit_* and kvt_tier_poll */
    double *lat, *t_submit;
    unsigned char *group_busy; /* cycle: per group of kpj blocks */
    size_t next_group;
    char first_error[512];
};

#define GROUP_BITS 20

static void pump_once(struct pump *x, int wait_ms)
{
    uint64_t ids[1024];
    uint8_t kbuf[1024 * KEY_BYTES];
    while (x->inflight < x->jobs_in_flight_max && x->submitted < x->limit) {
        uint64_t job = x->submitted;
        size_t first = (size_t)(job * x->kpj);
        if (x->cycle) {
            size_t groups = x->blocks / x->kpj, g = x->next_group, tried = 0;
            while (x->group_busy[g] && tried++ < groups)
                g = (g + 1) % groups;
            if (x->group_busy[g])
                break; /* every group is held: wait for a result */
            x->group_busy[g] = 1;
            x->next_group = (g + 1) % groups;
            first = g * x->kpj;
            job = ((uint64_t)x->submitted << GROUP_BITS) | g;
        }
        size_t n = x->kpj;
        if (!x->cycle && first + n > x->blocks)
            n = x->blocks - first;
        for (size_t k = 0; k < n; k++) {
            ids[k] = (first + k) % x->blocks;
            memcpy(kbuf + k * KEY_BYTES, x->keys + ids[k] * KEY_BYTES, KEY_BYTES);
        }
        double a0 = now_s();
        if (!x->cycle)
            x->t_submit[job] = a0;
        kvt_status st = x->load ? kvt_tier_submit_load(x->tier, job, ids, kbuf, KEY_BYTES, n)
                                : kvt_tier_submit_store(x->tier, job, ids, kbuf, KEY_BYTES, n);
        x->api_s += now_s() - a0;
        if (st != KVT_STATUS_OK && !*x->first_error)
            snprintf(x->first_error, sizeof x->first_error, "submit: %s", kvt_last_error());
        x->submitted++;
        x->inflight++;
    }
    if (x->inflight == 0)
        return;
    if (wait_ms && x->step_us > 0) {
        struct timespec ts = {x->step_us / 1000000, (x->step_us % 1000000) * 1000};
        nanosleep(&ts, NULL);
    } else if (wait_ms) {
        struct pollfd p = {.fd = x->fd, .events = POLLIN};
        poll(&p, 1, wait_ms);
    }
    kvt_result results[256];
    size_t got = 0;
    double a0 = now_s();
    if (kvt_tier_poll(x->tier, results, 256, &got) != KVT_STATUS_OK)
        die("poll: %s", kvt_last_error());
    double t = now_s();
    x->api_s += t - a0;
    for (size_t r = 0; r < got; r++) {
        uint64_t id = results[r].job_id;
        if (x->cycle)
            x->group_busy[id & ((1u << GROUP_BITS) - 1)] = 0;
        if (x->lat)
            x->lat[id] = t - x->t_submit[id];
        if (results[r].status != KVT_STATUS_OK) {
            x->errors++;
            if (!*x->first_error)
                snprintf(x->first_error, sizeof x->first_error, "%s: %s", kvt_status_str(results[r].status),
                         results[r].message);
        }
    }
    x->inflight -= got;
    x->done += got;
}

static const char *USAGE =
    "usage: driver_kvtier --op store|load|exists --endpoint HOST:PORT [--bucket bench]\n"
    "  [--block-size 2M] [--blocks 128] [--concurrency 16] [--repeat 5] [--prefix kvbench]\n"
    "  [--key-seed 1] [--data-seed 1] [--checksums on|off] [--runtime-threads 2]\n"
    "  [--access-key kvtier] [--secret-key kvtier-secret] [--region us-east-1] [--label TEXT]\n"
    "  [--server-pid PID (server CPU from /proc)] [--keys-per-job 1] [--step-us N]\n"
    "  [--background-load N [--bg-key-seed 1]]  (exists: load N stored blocks in a loop meanwhile)\n"
    "  [--config-extra '\"k\":v,...']   (or --store-json '{...}' to replace the store object)\n";

int main(int argc, char **argv)
{
    const char *op = NULL, *endpoint = NULL, *bucket = "bench", *prefix = "kvbench";
    const char *access_key = "kvtier", *secret_key = "kvtier-secret", *region = "us-east-1";
    const char *label = "", *extra = "", *store_json = NULL;
    size_t block_bytes = 2 << 20, blocks = 128, conc = 16, repeat = 5;
    unsigned key_seed = 1, data_seed = 1, runtime_threads = 2;
    int checksums = 1;
    long server_pid = 0;
    size_t kpj = 1, bg_blocks = 0;
    long step_us = 0;
    unsigned bg_key_seed = 1;

    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
#define ARG(name) (strcmp(a, name) == 0 && (v ? (i++, 1) : (die("%s needs a value", name), 0)))
        if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) { fputs(USAGE, stdout); return 0; }
        else if (ARG("--op")) op = v;
        else if (ARG("--endpoint")) endpoint = v;
        else if (ARG("--bucket")) bucket = v;
        else if (ARG("--prefix")) prefix = v;
        else if (ARG("--block-size")) { if (!(block_bytes = parse_size(v))) die("bad size %s", v); }
        else if (ARG("--blocks")) blocks = strtoull(v, NULL, 10);
        else if (ARG("--concurrency")) conc = strtoull(v, NULL, 10);
        else if (ARG("--repeat")) repeat = strtoull(v, NULL, 10);
        else if (ARG("--key-seed")) key_seed = (unsigned)strtoul(v, NULL, 10);
        else if (ARG("--data-seed")) data_seed = (unsigned)strtoul(v, NULL, 10);
        else if (ARG("--runtime-threads")) runtime_threads = (unsigned)strtoul(v, NULL, 10);
        else if (ARG("--checksums")) checksums = strcmp(v, "off") != 0 && strcmp(v, "0") != 0;
        else if (ARG("--access-key")) access_key = v;
        else if (ARG("--secret-key")) secret_key = v;
        else if (ARG("--region")) region = v;
        else if (ARG("--label")) label = v;
        else if (ARG("--config-extra")) extra = v;
        else if (ARG("--store-json")) store_json = v;
        else if (ARG("--server-pid")) server_pid = strtol(v, NULL, 10);
        else if (ARG("--keys-per-job")) kpj = strtoull(v, NULL, 10);
        else if (ARG("--step-us")) step_us = strtol(v, NULL, 10);
        else if (ARG("--background-load")) bg_blocks = strtoull(v, NULL, 10);
        else if (ARG("--bg-key-seed")) bg_key_seed = (unsigned)strtoul(v, NULL, 10);
        else die("unknown argument %s\n%s", a, USAGE);
#undef ARG
    }
    if (!op || (!endpoint && !store_json))
        die("--op and --endpoint are required\n%s", USAGE);
    int is_store = strcmp(op, "store") == 0, is_load = strcmp(op, "load") == 0,
        is_exists = strcmp(op, "exists") == 0;
    if (!is_store && !is_load && !is_exists)
        die("--op must be store, load or exists");
    if (kpj == 0 || kpj > 1024)
        die("--keys-per-job must be 1..1024");
    if (block_bytes == 0 || block_bytes % 8 || blocks == 0 || conc == 0 || data_seed > 255 || blocks >= (1u << 28))
        die("block size must be a positive multiple of 8, blocks and concurrency positive, data seed < 256");

    /* exists: --concurrency is the lookup lane's width; background loads use 16 transfers. */
    size_t lookups = conc;
    if (is_exists)
        conc = bg_blocks ? (bg_blocks < 16 ? bg_blocks : 16) : 16;
    char config[4096], store[1024];
    if (store_json)
        snprintf(store, sizeof store, "%s", store_json);
    else
        snprintf(store, sizeof store,
                 "{\"type\":\"s3\",\"bucket\":\"%s\",\"endpoint_override\":\"%s\",\"scheme\":\"http\","
                 "\"access_key\":\"%s\",\"secret_key\":\"%s\",\"region\":\"%s\"}",
                 bucket, endpoint, access_key, secret_key, region);
    snprintf(config, sizeof config,
             "{\"store\":%s,\"prefix\":\"%s\",\"max_inflight_transfers\":%zu,\"max_inflight_lookups\":%zu,"
             "\"runtime_threads\":%u,\"key_bytes\":%d,\"checksums\":%s,\"dedup\":\"off\"%s%s}",
             store, prefix, conc, is_exists ? lookups : (size_t)64, runtime_threads, KEY_BYTES,
             checksums ? "true" : "false", *extra ? "," : "", extra);

    size_t pool_blocks = is_exists ? (bg_blocks ? bg_blocks : 1) : blocks;
    size_t pool_bytes = pool_blocks * block_bytes;
    uint8_t *pool = mmap(NULL, pool_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (pool == MAP_FAILED)
        die("mmap %zu bytes: %s", pool_bytes, strerror(errno));
    /* Pre-fault (and for stores fill) the whole pool before anything is timed. */
    for (size_t b = 0; b < pool_blocks; b++) {
        if (is_store)
            fill_block(pool + b * block_bytes, block_bytes, data_seed, b);
        else
            memset(pool + b * block_bytes, 0xA5, block_bytes);
    }

    double setup0 = now_s();
    kvt_tier *tier = NULL;
    if (kvt_tier_new(config, &tier) != KVT_STATUS_OK)
        die("kvt_tier_new: %s", kvt_last_error());
    if (kvt_tier_register_memory(tier, pool, pool_blocks, block_bytes) != KVT_STATUS_OK)
        die("register: %s", kvt_last_error());
    double setup_s = now_s() - setup0;

    /* Keys of the transfer workload: 0..blocks-1 (or 0..bg_blocks-1 for the background
     * loads of an exists run). Keys of an exists batch: 0..n/2-1 and n/2 never-stored ones. */
    size_t xfer_blocks = is_exists ? bg_blocks : blocks;
    uint8_t *keys = malloc((xfer_blocks ? xfer_blocks : 1) * KEY_BYTES);
    for (size_t i = 0; i < xfer_blocks; i++)
        make_key(keys + i * KEY_BYTES, is_exists ? bg_key_seed : key_seed, i);
    uint8_t *probe_keys = malloc(blocks * KEY_BYTES);
    for (size_t i = 0; i < blocks; i++)
        make_key(probe_keys + i * KEY_BYTES, key_seed, i < blocks / 2 ? i : ((1ull << 31) | i));

    size_t njobs = is_exists ? 0 : (blocks + kpj - 1) / kpj;
    size_t nlat = is_exists ? repeat : njobs;
    double *lat = calloc(nlat ? nlat : 1, sizeof(double));
    struct pump x = {
        .tier = tier, .fd = kvt_tier_event_fd(tier), .load = !is_store, .keys = keys,
        .blocks = xfer_blocks, .kpj = kpj, .jobs_in_flight_max = (conc + kpj - 1) / kpj,
        .limit = is_exists ? SIZE_MAX : njobs, .lat = is_exists ? NULL : lat,
        .t_submit = calloc(is_exists ? 4096 : (njobs ? njobs : 1), sizeof(double)), .cycle = is_exists,
        .step_us = step_us,
        .group_busy = calloc(xfer_blocks / kpj + 1, 1),
    };
    if (bg_blocks && (bg_blocks < kpj || bg_blocks / kpj >= (1u << GROUP_BITS)))
        die("--background-load: between 1 and %u groups of --keys-per-job blocks", (1u << GROUP_BITS) - 1);
    size_t hits_ok = 1;
    char *first_error = x.first_error;

    double u0, s0, u1, s1;
    double srv0 = proc_cpu_s(server_pid);
    rusage_s(&u0, &s0);
    double caller0 = thread_cpu_s();
    double t0 = now_s();

    if (!is_exists) {
        while (x.done < njobs)
            pump_once(&x, 1000);
    } else {
        /* Background loads (if any) saturate the transfer lane while batches run. */
        if (bg_blocks) {
            pump_once(&x, 0);
            struct timespec ts = {0, 200 * 1000000L}; /* let the transfers ramp up */
            double until = now_s() + 0.2;
            while (now_s() < until)
                pump_once(&x, 10);
            (void)ts;
        }
        for (size_t rep = 0; rep < repeat; rep++) {
            uint64_t req = rep + 1;
            double b0 = now_s();
            kvt_lookup_result res;
            size_t hits = 0;
            for (size_t i = 0; i < blocks; i++)
                if (kvt_tier_lookup(tier, req, probe_keys + i * KEY_BYTES, KEY_BYTES, &res) != KVT_STATUS_OK)
                    die("lookup: %s", kvt_last_error());
            kvt_tier_schedule_end(tier);
            /* The answers of one batch arrive together: wait on the last key, then read all. */
            for (size_t i = blocks; i-- > 0;) {
                for (;;) {
                    kvt_tier_lookup(tier, req, probe_keys + i * KEY_BYTES, KEY_BYTES, &res);
                    if (res != KVT_LOOKUP_RESULT_RETRY)
                        break;
                    if (bg_blocks) {
                        pump_once(&x, 0);
                    }
                    struct timespec ts = {0, 20000};
                    nanosleep(&ts, NULL);
                }
                if (res == KVT_LOOKUP_RESULT_HIT) {
                    hits++;
                    if (i >= blocks / 2)
                        hits_ok = 0;
                } else if (i < blocks / 2) {
                    hits_ok = 0;
                }
            }
            lat[rep] = now_s() - b0;
            kvt_tier_request_finished(tier, req);
            if (hits != blocks / 2 && !*first_error)
                snprintf(first_error, sizeof x.first_error, "batch %zu: %zu hits of %zu keys, expected %zu", rep,
                         hits, blocks, blocks / 2);
            if (bg_blocks) { /* a short gap between batches, transfers continuing */
                double until = now_s() + 0.02;
                while (now_s() < until)
                    pump_once(&x, 5);
            }
        }
        /* Let the background transfers finish before the clock stops. */
        x.limit = x.submitted;
        while (x.done < x.submitted)
            pump_once(&x, 1000);
    }

    double wall = now_s() - t0;
    double caller_cpu = thread_cpu_s() - caller0;
    rusage_s(&u1, &s1);
    double server_cpu = proc_cpu_s(server_pid) - srv0;
    size_t errors = x.errors;
    size_t caller_calls_blocks = is_exists ? x.done * kpj : blocks;

    /* Verification (untimed). */
    int verified = 1;
    size_t bad_blocks = 0;
    if (is_load) {
        for (size_t b = 0; b < blocks; b++)
            if (!check_block(pool + b * block_bytes, block_bytes, data_seed, b))
                bad_blocks++;
        verified = bad_blocks == 0 && errors == 0;
    } else if (is_store) {
        verified = errors == 0;
    } else {
        verified = hits_ok && !*first_error;
    }
    double bg_bytes = is_exists ? (double)x.done * (double)kpj * (double)block_bytes : 0;

    struct kvt_stats stats;
    kvt_tier_stats(tier, &stats, sizeof stats);
    kvt_tier_free(tier);

    double user = u1 - u0, sys = s1 - s0, cpu = user + sys;
    double bytes = is_exists ? 0 : (double)blocks * (double)block_bytes;
    double gib = bytes / (1024.0 * 1024 * 1024);
    qsort(lat, nlat, sizeof(double), cmp_double);

    printf("{\"client\":\"kvtier\",\"label\":\"%s\",\"op\":\"%s\",\"block_bytes\":%zu,\"blocks\":%zu,"
           "\"concurrency\":%zu,\"keys_per_job\":%zu,\"step_us\":%ld,\"checksums\":%s,\"bytes\":%.0f,\"wall_s\":%.6f,\"mib_s\":%.3f,\"ops_s\":%.3f,"
           "\"lat_p50_ms\":%.4f,\"lat_p90_ms\":%.4f,\"lat_p99_ms\":%.4f,\"lat_max_ms\":%.4f,"
           "\"cpu_s\":%.4f,\"user_s\":%.4f,\"sys_s\":%.4f,\"cpu_s_per_gib\":%.4f,"
           "\"server_cpu_s\":%.4f,\"server_cpu_s_per_gib\":%.4f,\"caller_us_per_block\":%.3f,\"peak_rss_mib\":%.1f,\"pool_mib\":%.1f,\"setup_s\":%.4f,"
           "\"errors\":%zu,\"bad_blocks\":%zu,\"verified\":%s,\"existence_checks\":%" PRIu64 ","
           "\"corrupt_blocks\":%" PRIu64 ",\"background_mib_s\":%.3f,\"caller_cpu_s\":%.6f,\"api_us_per_block\":%.3f,"
           "\"version\":\"%s\",\"error\":\"",
           label, op, block_bytes, blocks, is_exists ? lookups : conc, kpj, step_us, checksums ? "true" : "false", bytes, wall,
           bytes / (1024.0 * 1024) / wall, (is_exists ? (double)(repeat * blocks) : (double)blocks) / wall,
           pct(lat, nlat, 50) * 1e3, pct(lat, nlat, 90) * 1e3, pct(lat, nlat, 99) * 1e3,
           nlat ? lat[nlat - 1] * 1e3 : 0, cpu, user, sys, gib > 0 ? cpu / gib : 0, server_cpu,
           gib > 0 ? server_cpu / gib : 0,
           caller_calls_blocks ? caller_cpu / (double)caller_calls_blocks * 1e6 : 0,
           peak_rss_kib() / 1024.0, pool_bytes / (1024.0 * 1024), setup_s, errors, bad_blocks,
           verified ? "true" : "false", stats.existence_checks, stats.corrupt_blocks,
           bg_bytes / (1024.0 * 1024) / wall, caller_cpu,
           caller_calls_blocks ? x.api_s / (double)caller_calls_blocks * 1e6 : 0, kvt_version());
    for (const char *c = first_error; *c; c++) {
        if (*c == '"' || *c == '\\')
            putchar('\\');
        putchar((unsigned char)*c < 0x20 ? ' ' : *c);
    }
    printf("\"}\n");
    munmap(pool, pool_bytes);
    return verified ? 0 : 1;
}
